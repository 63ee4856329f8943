#include "controller/store/blob_store.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <system_error>
#include <unistd.h>

namespace gatehouse::controller {

namespace fs = std::filesystem;

bool IsBlobDigest(std::string_view digest) {
  constexpr std::string_view kPrefix = "sha256:";
  if (digest.size() != kPrefix.size() + 64 || digest.substr(0, kPrefix.size()) != kPrefix) {
    return false;
  }
  return std::all_of(digest.begin() + kPrefix.size(), digest.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Status CheckArtifactName(std::string_view name) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("artifact name '" + std::string(name.substr(0, 300)) + "': " + why);
  };
  if (name.empty() || name.size() > 256) return bad("expected 1 to 256 bytes");
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view seg = name.substr(start, end - start);
    if (seg.empty() || seg == "." || seg == "..") return bad("empty, '.' or '..' path segment");
    for (char c : seg) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
        return bad("only letters, digits, '.', '_', '-' and '/' separators");
      }
    }
    start = end + 1;
  }
  return Status::Ok();
}

BlobStore::Writer::Writer(fs::path tmp, fs::path final_path, std::string digest, int64_t size,
                          std::FILE* file)
    : tmp_(std::move(tmp)), final_(std::move(final_path)), digest_(std::move(digest)),
      size_(size), file_(file) {}

BlobStore::Writer::~Writer() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) {
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
}

Status BlobStore::Writer::Append(std::string_view bytes) {
  if (committed_ || file_ == nullptr) return Status::FailedPrecondition("blob writer closed");
  if (written_ + static_cast<int64_t>(bytes.size()) > size_) {
    return Status::InvalidArgument("blob " + digest_ + ": more than the announced " +
                                   std::to_string(size_) + " bytes");
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    return Status::Internal("blob " + digest_ + ": write to " + tmp_.string() + " failed");
  }
  sha_.Update(bytes);
  written_ += static_cast<int64_t>(bytes.size());
  return Status::Ok();
}

Status BlobStore::Writer::Commit() {
  if (committed_ || file_ == nullptr) return Status::FailedPrecondition("blob writer closed");
  const bool flushed = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  std::fclose(file_);
  file_ = nullptr;
  if (!flushed) return Status::Internal("blob " + digest_ + ": cannot flush " + tmp_.string());
  if (written_ != size_) {
    return Status::DataLoss("blob " + digest_ + ": received " + std::to_string(written_) +
                            " bytes, announced " + std::to_string(size_));
  }
  const std::string actual = "sha256:" + sha_.FinalHex();
  if (actual != digest_) {
    return Status::DataLoss("blob announced as " + digest_ + " has digest " + actual);
  }
  std::error_code ec;
  fs::rename(tmp_, final_, ec);
  if (ec) return Status::Internal("blob " + digest_ + ": cannot move into place: " + ec.message());
  committed_ = true;
  return Status::Ok();
}

BlobStore::BlobStore(fs::path dir, BlobLimits limits) : dir_(std::move(dir)), limits_(limits) {}

Result<std::unique_ptr<BlobStore>> BlobStore::Open(const fs::path& dir, BlobLimits limits) {
  std::error_code ec;
  fs::create_directories(dir / "sha256", ec);
  if (ec) return Status::Internal("artifact store " + dir.string() + ": " + ec.message());
  // Uploads cut short by a crash left their temporary files here: no blob refers to them.
  fs::remove_all(dir / "tmp", ec);
  fs::create_directories(dir / "tmp", ec);
  if (ec) return Status::Internal("artifact store " + dir.string() + ": " + ec.message());
  return std::unique_ptr<BlobStore>(new BlobStore(dir, limits));
}

fs::path BlobStore::PathOf(const std::string& digest) const {
  const std::string hex = digest.substr(7);
  return dir_ / "sha256" / hex.substr(0, 2) / hex;
}

Result<std::unique_ptr<BlobStore::Writer>> BlobStore::Begin(const std::string& digest,
                                                            int64_t size) {
  if (!IsBlobDigest(digest)) {
    return Status::InvalidArgument("artifact digest '" + digest.substr(0, 80) +
                                   "': expected sha256:<64 lower-case hex>");
  }
  if (size < 0) return Status::InvalidArgument("artifact size " + std::to_string(size) + " < 0");
  if (size > limits_.max_blob_bytes) {
    return Status::ResourceExhausted("artifact " + digest + " of " + std::to_string(size) +
                                     " bytes is over the limit of " +
                                     std::to_string(limits_.max_blob_bytes) +
                                     " bytes (--artifact-max-bytes)");
  }
  const fs::path final_path = PathOf(digest);
  std::error_code ec;
  fs::create_directories(final_path.parent_path(), ec);
  if (ec) return Status::Internal("artifact store: " + ec.message());
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = dir_ / "tmp" /
                       (digest.substr(7, 16) + "." + std::to_string(::getpid()) + "." +
                        std::to_string(counter.fetch_add(1)));
  std::FILE* file = std::fopen(tmp.c_str(), "wb");
  if (file == nullptr) return Status::Internal("artifact store: cannot create " + tmp.string());
  return std::unique_ptr<Writer>(new Writer(tmp, final_path, digest, size, file));
}

Result<fs::path> BlobStore::Path(const std::string& digest) const {
  if (!IsBlobDigest(digest)) {
    return Status::InvalidArgument("artifact digest '" + digest.substr(0, 80) +
                                   "': expected sha256:<64 lower-case hex>");
  }
  const fs::path p = PathOf(digest);
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return Status::NotFound("artifact " + digest + " is not stored");
  return p;
}

Status BlobStore::Remove(const std::string& digest) {
  if (!IsBlobDigest(digest)) {
    return Status::InvalidArgument("artifact digest '" + digest.substr(0, 80) +
                                   "': expected sha256:<64 lower-case hex>");
  }
  std::error_code ec;
  fs::remove(PathOf(digest), ec);
  if (ec) return Status::Internal("removing artifact " + digest + ": " + ec.message());
  return Status::Ok();
}

}  // namespace gatehouse::controller
