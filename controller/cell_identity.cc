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

}  // namespace

std::string CellIdOf(const CellSpec& spec) { return Sha256Hex(CanonicalSpecJson(spec)); }

CellFreezer::CellFreezer(SubmitContext config, CommitResolver& resolver, DigestCache& digests)
    : config_(std::move(config)), resolver_(resolver), digests_(digests) {}

Result<FrozenCell> CellFreezer::Freeze(std::string_view body) {
  GH_ASSIGN_OR_RETURN(SubmitRequest r, ParseSubmitBody(body, config_));
  CellSpec& spec = r.spec;

  // Cheap filesystem checks before the git fetch.
  GH_RETURN_IF_ERROR(CheckDirectory("checkpoint", spec.checkpoint.path));
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(spec.checkpoint.path) / "config.json", ec)) {
    return Status::NotFound("checkpoint '" + spec.checkpoint.path + "': no config.json in it");
  }
  GH_RETURN_IF_ERROR(CheckDirectory("reference", spec.reference.path));
  for (const char* file : {"reference.json", "reference.safetensors"}) {
    if (!fs::is_regular_file(fs::path(spec.reference.path) / file, ec)) {
      return Status::NotFound("reference '" + spec.reference.path + "': no " + file +
                              " in it (not a reference bundle made by tools/refgen)");
    }
  }

  if (!spec.commit.empty()) {
    GH_ASSIGN_OR_RETURN(spec.commit, resolver_.ResolveCommit(spec.repository, spec.commit));
  } else {
    GH_ASSIGN_OR_RETURN(spec.commit, resolver_.ResolveBranch(spec.repository, r.branch));
  }
  GH_ASSIGN_OR_RETURN(spec.checkpoint.digest, digests_.Digest(spec.checkpoint.path));
  GH_ASSIGN_OR_RETURN(spec.reference.digest, digests_.Digest(spec.reference.path));

  FrozenCell cell;
  cell.spec_json = CanonicalSpecJson(spec);
  cell.id = Sha256Hex(cell.spec_json);
  cell.repository = spec.repository;
  cell.commit = spec.commit;
  cell.branch = r.branch;
  cell.model_family = spec.model_family;
  cell.priority = r.priority;
  cell.spec = std::move(spec);
  return cell;
}

}  // namespace gatehouse::controller
