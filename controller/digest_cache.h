// Directory digests (common/sha256.h DirectoryDigest) cached in memory.
#pragma once

#include <filesystem>
#include <map>
#include <mutex>
#include <string>

#include "common/status.h"

namespace gatehouse::controller {

/// Caches DirectoryDigest by directory path. An entry is reused only while the directory's
/// fingerprint (every regular file's relative path, size and mtime) is unchanged, so a
/// rewritten file is hashed again. Listing the files is cheap next to hashing them.
///
/// Threading: thread-safe. Two threads may hash the same directory at once (no waiting on a
/// lock during hashing); the last result wins.
class DigestCache {
 public:
  /// "sha256:<hex>". Errors as DirectoryDigest (NOT_FOUND for a missing or empty directory).
  Result<std::string> Digest(const std::filesystem::path& dir);

  /// Number of DirectoryDigest computations so far (for tests).
  int computations() const;

 private:
  struct Entry {
    std::string fingerprint;
    std::string digest;
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
  int computations_ = 0;
};

}  // namespace gatehouse::controller
