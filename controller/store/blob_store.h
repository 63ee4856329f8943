// The controller's content-addressed blob store (docs/protocols.md §7): artifact files named by
// the SHA-256 of their bytes, under <dir>/sha256/<first 2 hex>/<hex>. A blob is written once,
// to a temporary file that only becomes the blob when its size and digest are the ones
// announced, so a reader never sees a partial or wrong blob. No SQLite: the store records which
// attempt named which blob.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "common/sha256.h"
#include "common/status.h"

namespace gatehouse::controller {

/// Limits of the blob store (controller flags).
struct BlobLimits {
  /// Bytes of one blob (--artifact-max-bytes).
  int64_t max_blob_bytes = int64_t{16} << 30;
};

/// True for "sha256:" followed by 64 lower-case hex digits.
bool IsBlobDigest(std::string_view digest);

/// An artifact's name within its attempt: a relative path of 1 to 256 bytes of
/// [A-Za-z0-9._-] segments separated by '/', no empty, "." or ".." segment. INVALID_ARGUMENT
/// naming the name otherwise.
Status CheckArtifactName(std::string_view name);

class BlobStore {
 public:
  /// One blob being written. Append the bytes in order, then Commit; destroying it before a
  /// successful Commit removes the temporary file.
  class Writer {
   public:
    ~Writer();
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;
    /// Appends bytes. INVALID_ARGUMENT past the announced size; INTERNAL on a write error.
    Status Append(std::string_view bytes);
    /// Verifies the size and digest and moves the file into place (a blob already there is
    /// kept: same digest, same bytes). DATA_LOSS naming both digests or sizes on a mismatch.
    Status Commit();

   private:
    friend class BlobStore;
    Writer(std::filesystem::path tmp, std::filesystem::path final_path, std::string digest,
           int64_t size, std::FILE* file);
    std::filesystem::path tmp_, final_;
    std::string digest_;
    int64_t size_ = 0, written_ = 0;
    std::FILE* file_ = nullptr;
    Sha256 sha_;
    bool committed_ = false;
  };

  /// Opens (creating) the store at `dir`, removing temporary files of uploads a crash cut
  /// short. One process per store. INTERNAL when it cannot be created.
  static Result<std::unique_ptr<BlobStore>> Open(const std::filesystem::path& dir,
                                                 BlobLimits limits = {});

  /// Starts writing blob `digest` ("sha256:<hex>") of `size` bytes. INVALID_ARGUMENT for a
  /// malformed digest or a negative size; RESOURCE_EXHAUSTED over max_blob_bytes.
  Result<std::unique_ptr<Writer>> Begin(const std::string& digest, int64_t size);

  /// The file of blob `digest`. NOT_FOUND when it is not stored.
  Result<std::filesystem::path> Path(const std::string& digest) const;

  /// Removes blob `digest`'s file (retention); a blob not stored is no error. INVALID_ARGUMENT
  /// for a malformed digest; INTERNAL when the file cannot be removed.
  Status Remove(const std::string& digest);

  const BlobLimits& limits() const { return limits_; }

 private:
  BlobStore(std::filesystem::path dir, BlobLimits limits);
  std::filesystem::path PathOf(const std::string& digest) const;
  std::filesystem::path dir_;
  BlobLimits limits_;
};

}  // namespace gatehouse::controller
