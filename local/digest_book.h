// File digests that outlive a `gatehouse run`, so the next run of the same checkpoint lists its
// files instead of reading 1 to 70 GB again (the controller keeps them in its store).
#pragma once

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "controller/digest_cache.h"

namespace gatehouse::local {

/// A FileDigestBook in a JSON-lines file (one {"path", "size", "mtime_ns", "ctime_ns", "inode",
/// "device", "sha256"} per line; a later line for a path wins). Unreadable lines are skipped:
/// the worst a damaged book costs is a rehash. Thread-safe.
class DigestBookFile : public controller::FileDigestBook {
 public:
  /// Reads `file` when it exists.
  explicit DigestBookFile(std::filesystem::path file);

  std::optional<std::string> Find(const std::string& path,
                                  const controller::FileStamp& stamp) override;
  /// Appends a line (best effort).
  void Record(const std::string& path, const controller::FileStamp& stamp,
              const std::string& sha256_hex) override;

 private:
  std::filesystem::path file_;
  std::mutex mu_;
  std::map<std::string, std::pair<controller::FileStamp, std::string>> known_;
};

}  // namespace gatehouse::local
