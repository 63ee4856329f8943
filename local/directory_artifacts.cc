#include "local/directory_artifacts.h"

#include "common/sha256.h"

namespace gatehouse::local {

namespace fs = std::filesystem;

fs::path DirectoryArtifacts::BlobPath(const std::string& digest) const {
  return root_ / "sha256" / (digest.rfind("sha256:", 0) == 0 ? digest.substr(7) : digest);
}

Status DirectoryArtifacts::Put(int64_t /*attempt_id*/, const std::string& name,
                               const fs::path& path) {
  Result<std::string> hex = Sha256FileHex(path);
  if (!hex.ok()) return Status::NotFound("artifact '" + name + "': " + hex.status().message());
  std::error_code ec;
  const int64_t size = static_cast<int64_t>(fs::file_size(path, ec));
  if (ec) return Status::NotFound("artifact '" + name + "': " + ec.message());
  const std::string digest = "sha256:" + *hex;
  const fs::path blob = BlobPath(digest);
  if (!fs::is_regular_file(blob, ec) || fs::file_size(blob, ec) != static_cast<uintmax_t>(size)) {
    fs::create_directories(blob.parent_path(), ec);
    fs::path partial = blob;
    partial += ".partial";
    fs::copy_file(path, partial, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(partial, blob, ec);
    if (ec) return Status::Internal("artifact '" + name + "': cannot store it: " + ec.message());
  }
  constexpr std::string_view kReference = "reference/";
  agent::InputFile file;
  const bool reference = name.rfind(kReference, 0) == 0;
  file.role = reference ? "reference" : "";
  file.name = reference ? name.substr(kReference.size()) : name;
  file.digest = digest;
  file.size = size;
  stored_.push_back(std::move(file));
  return Status::Ok();
}

Status DirectoryArtifacts::Get(const std::string& digest, int64_t size, const fs::path& dest) {
  const fs::path blob = BlobPath(digest);
  std::error_code ec;
  if (!fs::is_regular_file(blob, ec)) return Status::NotFound("no blob " + digest + " stored");
  Result<std::string> hex = Sha256FileHex(blob);
  if (!hex.ok() || "sha256:" + *hex != digest ||
      fs::file_size(blob, ec) != static_cast<uintmax_t>(size)) {
    return Status::DataLoss("blob " + blob.string() + " is not " + std::to_string(size) +
                            " bytes with digest " + digest);
  }
  fs::path partial = dest;
  partial += ".partial";
  fs::copy_file(blob, partial, fs::copy_options::overwrite_existing, ec);
  if (!ec) fs::rename(partial, dest, ec);
  if (ec) return Status::Internal("cannot write " + dest.string() + ": " + ec.message());
  return Status::Ok();
}

}  // namespace gatehouse::local
