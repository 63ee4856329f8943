// SHA-256 digests (OpenSSL EVP) of bytes, files and directory trees.
#pragma once

#include <filesystem>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace gatehouse {

/// Incremental SHA-256. Not thread-safe; one instance per stream of bytes.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(std::string_view bytes);
  /// Lower-case hex of the digest (64 characters). Call once.
  std::string FinalHex();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Lower-case hex SHA-256 of `bytes`.
std::string Sha256Hex(std::string_view bytes);

/// Sees the bytes of each file as DirectoryDigest hashes them, so a reader that needs the same
/// bytes (the worker's finiteness scan of safetensors files) takes them from the one read.
/// Calls come in order: BeginFile, Bytes for each block in file order, EndFile (not called when
/// the read failed).
class DigestObserver {
 public:
  virtual ~DigestObserver() = default;
  /// `relative` is the name the digest lists the file under (generic form); `size` in bytes.
  virtual void BeginFile(const std::filesystem::path& relative, uint64_t size) = 0;
  virtual void Bytes(std::string_view block) = 0;
  virtual void EndFile() = 0;
};

/// Lower-case hex SHA-256 of a file's contents, read in 1 MiB blocks.
/// Errors: NOT_FOUND if the file cannot be opened, DATA_LOSS on a read error.
Result<std::string> Sha256FileHex(const std::filesystem::path& path);

/// Digest of a directory's regular files (recursive; symlinked directories are not entered; a
/// symlinked file counts under its own name with its target's bytes): SHA-256 over the
/// lines "<relative path>\t<size in bytes>\t<sha256 of contents>\n" in byte order of the paths.
/// Returns "sha256:<hex>". Errors: NOT_FOUND when `dir` is not a directory, or it holds no file.
/// `observer`, when given, sees every file's bytes as they are hashed.
Result<std::string> DirectoryDigest(const std::filesystem::path& dir,
                                    DigestObserver* observer = nullptr);

}  // namespace gatehouse
