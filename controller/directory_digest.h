// Directory digests (common/sha256.h DirectoryDigest, docs/protocols.md §2) built from the
// digests of the directory's files, so a file whose content is already known is not read again
// (controller/digest_cache.h keeps them). Domain logic: files and OpenSSL only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace gatehouse::controller {

/// What names a file's content without reading it: stat(2) of the file (through a symlink, of
/// its target). Equal stamps are taken as equal bytes; a rewrite changes the mtime or, when the
/// writer sets the mtime back (`touch -r`), the status-change time, which no user can set.
struct FileStamp {
  int64_t size = 0;      // bytes
  int64_t mtime_ns = 0;  // modification time, ns since the epoch
  int64_t ctime_ns = 0;  // status-change time, ns since the epoch
  uint64_t inode = 0;
  uint64_t device = 0;

  bool operator==(const FileStamp&) const = default;
};

/// stat(2) of `path`. Errors: NOT_FOUND naming the path and the system's reason.
Result<FileStamp> StampOf(const std::filesystem::path& path);

/// A regular file of a directory as DirectoryDigest counts it.
struct ListedFile {
  std::string rel;             // path relative to the directory, '/'-separated
  std::filesystem::path path;  // the directory / rel
  FileStamp stamp;
};

/// The regular files under `dir` as DirectoryDigest counts them (recursive; symlinked
/// directories are not entered; a symlinked file under its own name, stamped as its target), in
/// byte order of `rel`. Reads no file. Errors as DirectoryDigest: NOT_FOUND when `dir` is not a
/// directory or holds no file; DATA_LOSS when it cannot be listed; NOT_FOUND naming a file that
/// went away while listed.
Result<std::vector<ListedFile>> ListDirectoryFiles(const std::filesystem::path& dir);

/// One file's line of a directory digest.
struct FileDigest {
  std::string rel;         // as ListedFile::rel
  int64_t size = 0;        // bytes
  std::string sha256_hex;  // lower-case hex SHA-256 of the bytes
};

/// "sha256:<hex>": SHA-256 over "<rel>\t<size>\t<sha256_hex>\n" per file in byte order of
/// `rel`, the bytes DirectoryDigest hashes, so on a directory's files it equals
/// DirectoryDigest of the directory (tests/controller/digest_cache_test.cc checks both agree).
std::string DirectoryDigestOf(std::vector<FileDigest> files);

/// Lower-case hex SHA-256 of the file at `path`, read in blocks of `block_bytes`.
/// `on_block(bytes)` runs after each block is hashed; returning false stops the read
/// (UNAVAILABLE "stopped"). Errors name the file: NOT_FOUND when it cannot be opened,
/// DATA_LOSS on a read error.
Result<std::string> HashFile(const std::filesystem::path& path, size_t block_bytes,
                             const std::function<bool(int64_t bytes)>& on_block);

}  // namespace gatehouse::controller
