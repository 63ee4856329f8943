#include "controller/cell_identity.h"

#include <filesystem>

#include "common/sha256.h"

namespace gatehouse::controller {
namespace {

namespace fs = std::filesystem;

Status CheckDirectory(const std::string& what, const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return Status::NotFound(what + " '" + path + "': no such directory");
  }
  return Status::Ok();
}

// The checkpoint directory with a config.json in it.
Status CheckCheckpoint(const std::string& path) {
  GH_RETURN_IF_ERROR(CheckDirectory("checkpoint", path));
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(path) / "config.json", ec)) {
    return Status::NotFound("checkpoint '" + path + "': no config.json in it");
  }
  return Status::Ok();
}

// Text prompts are tokenized by the checkpoint's own tokenizer: one of the files
// AutoTokenizer reads must be there.
Status CheckTokenizerFor(const std::vector<Prompt>& prompts, const std::string& checkpoint,
                         std::string_view field) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].text.empty()) continue;
    std::error_code ec;
    for (const char* file : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"}) {
      if (fs::is_regular_file(fs::path(checkpoint) / file, ec)) return Status::Ok();
    }
    return Status::InvalidArgument(
        "field '" + std::string(field) + "[" + std::to_string(i) +
        "]': a text prompt needs the checkpoint's tokenizer, and checkpoint '" + checkpoint +
        "' has none (no tokenizer.json, tokenizer_config.json or tokenizer.model); give token "
        "ids instead");
  }
  return Status::Ok();
}

// A frozen cell of `spec` with its labels.
FrozenCell MakeFrozen(CellSpec spec, const std::string& branch, int priority) {
  FrozenCell cell;
  cell.spec_json = CanonicalSpecJson(spec);
  cell.id = Sha256Hex(cell.spec_json);
  cell.repository = spec.repository;
  cell.commit = spec.commit;
  cell.branch = branch;
  cell.model_family = spec.model_family;
  cell.priority = priority;
  cell.spec = std::move(spec);
  return cell;
}

}  // namespace

std::string CellIdOf(const CellSpec& spec) { return Sha256Hex(CanonicalSpecJson(spec)); }

CellFreezer::CellFreezer(SubmitContext config, CommitResolver& resolver, DigestCache& digests)
    : config_(std::move(config)), resolver_(resolver), digests_(digests) {}

Result<FrozenCell> CellFreezer::Freeze(std::string_view body) {
  GH_ASSIGN_OR_RETURN(SubmitRequest r, ParseSubmitBody(body, config_));
  CellSpec& spec = r.spec;
  // Cheap filesystem checks before the git fetch.
  GH_RETURN_IF_ERROR(CheckCheckpoint(spec.checkpoint.path));
  if (spec.IsReference()) {
    GH_RETURN_IF_ERROR(CheckTokenizerFor(spec.prompts, spec.checkpoint.path, "prompts"));
    GH_ASSIGN_OR_RETURN(spec.checkpoint.digest, digests_.Digest(spec.checkpoint.path));
    FrozenCell cell = MakeFrozen(std::move(spec), "", r.priority);
    // Labels for lists and the dashboard (never hashed): what it is and what it runs on.
    cell.model_family = "reference";
    cell.repository = cell.spec.checkpoint.path;
    return cell;
  }
  GH_RETURN_IF_ERROR(CheckTokenizerFor(r.reference_prompts, spec.checkpoint.path, "prompts"));
  std::error_code ec;
  if (!spec.reference.path.empty()) {
    GH_RETURN_IF_ERROR(CheckDirectory("reference", spec.reference.path));
    for (const char* file : {"reference.json", "reference.safetensors"}) {
      if (!fs::is_regular_file(fs::path(spec.reference.path) / file, ec)) {
        return Status::NotFound("reference '" + spec.reference.path + "': no " + file +
                                " in it (not a reference bundle: protocols.md §6)");
      }
    }
  }
  if (!spec.commit.empty()) {
    GH_ASSIGN_OR_RETURN(spec.commit, resolver_.ResolveCommit(spec.repository, spec.commit));
  } else {
    GH_ASSIGN_OR_RETURN(spec.commit, resolver_.ResolveBranch(spec.repository, r.branch));
  }
  GH_ASSIGN_OR_RETURN(spec.checkpoint.digest, digests_.Digest(spec.checkpoint.path));
  if (!spec.reference.path.empty()) {
    GH_ASSIGN_OR_RETURN(spec.reference.digest, digests_.Digest(spec.reference.path));
  }
  std::shared_ptr<FrozenCell> reference;
  if (r.auto_reference) {
    reference = std::make_shared<FrozenCell>(
        MakeFrozen(ReferenceCellFor(spec, r.reference_prompts, config_), "", r.priority));
    reference->model_family = "reference";
    reference->repository = reference->spec.checkpoint.path;
    spec.reference.cell = reference->id;
  }
  FrozenCell cell = MakeFrozen(std::move(spec), r.branch, r.priority);
  cell.reference_cell = std::move(reference);
  return cell;
}

}  // namespace gatehouse::controller
