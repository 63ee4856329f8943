#include "controller/digest_cache.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/sha256.h"

namespace gatehouse::controller {
namespace {

namespace fs = std::filesystem;

// "<rel>\t<size>\t<mtime ns>\t<ctime ns>\t<inode>\n" per regular file, in path order. The
// status-change time cannot be set back by a user (unlike mtime, `touch -r`), so a rewrite of
// a file with the same size and mtime still changes the fingerprint. Empty on any error, which
// disables caching for that call.
std::string Fingerprint(const fs::path& dir) {
  std::error_code ec;
  std::vector<std::string> lines;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    struct stat st {};
    if (::stat(it->path().c_str(), &st) != 0) return {};
    auto ns = [](const timespec& t) {
      return std::to_string(static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec);
    };
    lines.push_back(it->path().lexically_relative(dir).generic_string() + "\t" +
                    std::to_string(st.st_size) + "\t" + ns(st.st_mtim) + "\t" + ns(st.st_ctim) +
                    "\t" + std::to_string(st.st_ino) + "\n");
  }
  if (ec) return {};
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const auto& l : lines) out += l;
  return out;
}

}  // namespace

Result<std::string> DigestCache::Digest(const fs::path& dir) {
  const std::string key = dir.lexically_normal().string();
  const std::string fingerprint = Fingerprint(dir);
  if (!fingerprint.empty()) {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.fingerprint == fingerprint) return it->second.digest;
  }
  Result<std::string> digest = DirectoryDigest(dir);
  std::lock_guard lock(mu_);
  ++computations_;
  if (digest.ok() && !fingerprint.empty()) entries_[key] = Entry{fingerprint, *digest};
  return digest;
}

int DigestCache::computations() const {
  std::lock_guard lock(mu_);
  return computations_;
}

}  // namespace gatehouse::controller
