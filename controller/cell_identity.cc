#include "controller/cell_identity.h"

#include <cstdio>
#include <filesystem>
#include <iterator>

#include "common/recipe.h"
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

// A unit of bytes (powers of 1000) and how `bytes` reads in it: "1.2" (whole bytes: "12").
struct ByteUnit {
  double scale = 1;
  const char* name = "B";

  std::string Amount(int64_t bytes) const {
    char text[32];
    std::snprintf(text, sizeof(text), scale == 1 ? "%.0f" : "%.1f",
                  static_cast<double>(bytes) / scale);
    return text;
  }
};

// The unit `total` bytes read best in: "2.0 GB", "314.6 MB", "5 B".
ByteUnit UnitFor(int64_t total) {
  static constexpr const char* kNames[] = {"B", "KB", "MB", "GB", "TB"};
  ByteUnit unit;
  for (size_t i = 1; i < std::size(kNames) && static_cast<double>(total) >= unit.scale * 1000;
       ++i) {
    unit = ByteUnit{unit.scale * 1000, kNames[i]};
  }
  return unit;
}

// "digesting checkpoint '/data/x': 1.2 of 2.0 GB hashed (3 of 5 files)".
std::string DescribeDigesting(std::string_view what, const std::string& path,
                              const DigestProgress& p) {
  const std::string out = "digesting " + std::string(what) + " '" + path + "': ";
  const std::string files =
      std::to_string(p.files_total) + (p.files_total == 1 ? " file" : " files");
  const ByteUnit unit = UnitFor(p.bytes_total);
  const std::string total = unit.Amount(p.bytes_total) + " " + unit.name;
  if (p.queued) {
    return out + "queued behind another directory (" + total + " in " + files + " to hash)";
  }
  return out + unit.Amount(p.bytes_hashed) + " of " + total + " hashed (" +
         std::to_string(p.files_hashed) + " of " + files + ")";
}

// A directory whose digest goes into the spec.
struct DirectoryToDigest {
  std::string_view what;  // "checkpoint", "reference"
  const std::string& path;
  std::string& digest;  // set when known
};

// Sets each directory's digest. Without `wait`, one still being computed is left empty and
// described in the answer (every directory is looked up, so all their jobs start now).
Result<std::optional<DigestPending>> DigestDirectories(DigestCache& cache,
                                                       const std::vector<DirectoryToDigest>& dirs,
                                                       bool wait) {
  std::optional<DigestPending> pending;
  for (const DirectoryToDigest& d : dirs) {
    const std::string context = std::string(d.what) + " '" + d.path + "'";
    if (wait) {
      Result<std::string> digest = cache.Digest(d.path);
      if (!digest.ok()) return digest.status().WithContext(context);
      d.digest = std::move(*digest);
      continue;
    }
    Result<DigestLookup> found = cache.Lookup(d.path);
    if (!found.ok()) return found.status().WithContext(context);
    if (found->ready()) {
      d.digest = std::move(found->digest);
      continue;
    }
    if (!pending) pending.emplace();
    pending->reason += (pending->reason.empty() ? "" : "; ") +
                       DescribeDigesting(d.what, d.path, found->progress);
    pending->bytes_hashed += found->progress.bytes_hashed;
    pending->bytes_total += found->progress.bytes_total;
  }
  return pending;
}

}  // namespace

std::string CellIdOf(const CellSpec& spec) { return Sha256Hex(CanonicalSpecJson(spec)); }

CellFreezer::CellFreezer(SubmitContext config, CommitResolver& resolver, DigestCache& digests)
    : config_(std::move(config)), resolver_(resolver), digests_(digests) {}

Result<FreezeOutcome> CellFreezer::Freeze(std::string_view body) {
  return FreezeBody(body, /*wait=*/false);
}

Status CellFreezer::CheckRecipeAt(const CellSpec& spec) {
  GH_ASSIGN_OR_RETURN(std::optional<std::string> text,
                      resolver_.ReadFileAt(spec.repository, spec.commit, std::string(kRecipeFileName)));
  if (!text) return Status::Ok();
  Result<Recipe> recipe = ParseRecipe(*text);
  if (!recipe.ok()) {
    return Status::InvalidArgument("repository '" + spec.repository + "' at " + spec.commit +
                                   ": " + recipe.status().message());
  }
  return CheckServes(*recipe, spec.model_family, spec.commit);
}

Result<FrozenCell> CellFreezer::FreezeAndWait(std::string_view body) {
  GH_ASSIGN_OR_RETURN(FreezeOutcome outcome, FreezeBody(body, /*wait=*/true));
  return std::get<FrozenCell>(std::move(outcome));
}

Result<FreezeOutcome> CellFreezer::FreezeBody(std::string_view body, bool wait) {
  GH_ASSIGN_OR_RETURN(SubmitRequest r, ParseSubmitBody(body, config_));
  CellSpec& spec = r.spec;
  // Cheap filesystem checks before the git fetch, and everything before the digests.
  GH_RETURN_IF_ERROR(CheckCheckpoint(spec.checkpoint.path));
  if (spec.IsReference()) {
    GH_RETURN_IF_ERROR(CheckTokenizerFor(spec.prompts, spec.checkpoint.path, "prompts"));
    GH_ASSIGN_OR_RETURN(
        std::optional<DigestPending> pending,
        DigestDirectories(digests_, {{"checkpoint", spec.checkpoint.path, spec.checkpoint.digest}},
                          wait));
    if (pending) {
      pending->spec = std::move(spec);
      return FreezeOutcome(std::move(*pending));
    }
    FrozenCell cell = MakeFrozen(std::move(spec), "", r.priority);
    // Labels for lists and the dashboard (never hashed): what it is and what it runs on.
    cell.model_family = "reference";
    cell.repository = cell.spec.checkpoint.path;
    return FreezeOutcome(std::move(cell));
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
  GH_RETURN_IF_ERROR(CheckRecipeAt(spec));
  std::vector<DirectoryToDigest> dirs = {
      {"checkpoint", spec.checkpoint.path, spec.checkpoint.digest}};
  if (!spec.reference.path.empty()) {
    dirs.push_back({"reference", spec.reference.path, spec.reference.digest});
  }
  GH_ASSIGN_OR_RETURN(std::optional<DigestPending> pending,
                      DigestDirectories(digests_, dirs, wait));
  if (pending) {
    pending->spec = std::move(spec);
    return FreezeOutcome(std::move(*pending));
  }
  std::shared_ptr<FrozenCell> reference;
  if (r.auto_reference) {
    reference = std::make_shared<FrozenCell>(
        MakeFrozen(ReferenceCellFor(spec, r.reference_prompts, config_), "", r.priority));
    reference->model_family = "reference";
    reference->repository = reference->spec.checkpoint.path;
    spec.reference.cell = reference->id;
  }
  // Readiness counts the default branch when no branch is designated; a resolver that cannot
  // tell leaves it unknown (every branch counts), which is no reason to refuse the cell.
  Result<std::string> default_branch = resolver_.DefaultBranch(spec.repository);
  FrozenCell cell = MakeFrozen(std::move(spec), r.branch, r.priority);
  if (default_branch.ok()) cell.default_branch = std::move(*default_branch);
  cell.reference_cell = std::move(reference);
  return FreezeOutcome(std::move(cell));
}

}  // namespace gatehouse::controller
