// Directory digests (common/sha256.h DirectoryDigest) from per-file digests kept in memory (and,
// with a FileDigestBook, in the store), computed on a thread of the cache so that a submit
// never waits for a 70 GB checkpoint to be read (docs/protocols.md §1, 202 "resolving").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "controller/directory_digest.h"

namespace gatehouse::controller {

/// Where file digests outlive the process (the controller's store, table file_digests), so a
/// restart does not read every checkpoint again. Thread-safe implementations only.
class FileDigestBook {
 public:
  virtual ~FileDigestBook() = default;
  /// The lower-case hex SHA-256 recorded for the file at `path` with exactly `stamp`; nullopt
  /// when none is (or the book cannot be read).
  virtual std::optional<std::string> Find(const std::string& path, const FileStamp& stamp) = 0;
  /// Records the digest of the file at `path` with `stamp`, replacing what `path` had. Best
  /// effort: a failure only costs a rehash after a restart.
  virtual void Record(const std::string& path, const FileStamp& stamp,
                      const std::string& sha256_hex) = 0;
};

/// How far the digest of a directory has come: the bytes and files that had to be hashed
/// (files whose digest was known are not counted).
struct DigestProgress {
  int64_t bytes_hashed = 0;
  int64_t bytes_total = 0;
  int files_hashed = 0;
  int files_total = 0;
  bool queued = false;  // waiting for the cache's thread to finish another directory first
};

/// Lookup's answer: the digest, or while it is computed (digest empty) how far it is.
struct DigestLookup {
  std::string digest;  // "sha256:<hex>"; empty while pending
  DigestProgress progress;

  bool ready() const { return !digest.empty(); }
};

/// Digests of directories from the digests of their files. A file's digest is kept by its path
/// and FileStamp (size, mtime and ctime in ns, inode, device), so a directory whose files did
/// not change is only listed, and one where a shard changed reads that shard only. A file is
/// hashed once per content: by a lookup's background job, or on the caller's thread when little
/// is left to hash. A digest read within Options::settle of the file's mtime is not reused: a
/// write in the same timestamp tick would leave the stamp as it was (git's "racy clean"); a
/// background job waits for the file to settle before reading it.
///
/// Threading: thread-safe. Background jobs run one at a time, in order, on one thread the cache
/// owns (started with the first job); the destructor stops it between two blocks and joins it.
/// Lookup never waits for hashing beyond Options::inline_bytes; Digest does.
class DigestCache {
 public:
  struct Options {
    /// Lookup hashes on the caller's thread when at most this many bytes are left to hash (a
    /// small checkpoint answers at once: 16 MiB is tens of ms); 0: always in the background.
    int64_t inline_bytes = int64_t{16} << 20;
    /// Bytes read at a time; the progress moves by one block.
    size_t block_bytes = size_t{1} << 20;
    /// Longer than any file system's timestamp granularity (FAT: 2 s): a file whose mtime is
    /// closer than this to the time it is read is hashed again next time.
    std::chrono::milliseconds settle{2000};
    /// Digests that outlive the process (not owned; must outlive the cache); null: memory only.
    FileDigestBook* book = nullptr;
    /// Test hook: runs on the background thread, with the file, before it reads a file and
    /// after each block it hashed (so before every read); it may block to hold the job.
    std::function<void(const std::filesystem::path& file)> before_block;
  };

  DigestCache() : DigestCache(Options{}) {}
  explicit DigestCache(Options options);
  ~DigestCache();
  DigestCache(const DigestCache&) = delete;
  DigestCache& operator=(const DigestCache&) = delete;

  /// The digest of `dir` now, without waiting for hashing: ready when every file's digest is
  /// known for its current stamp (or what is left fits Options::inline_bytes and was hashed
  /// here); else pending with the progress of the background job that computes it, started by
  /// the first lookup (later lookups of the directory join it). Errors: as ListDirectoryFiles
  /// (NOT_FOUND for a missing or empty directory); the error of the directory's last background
  /// job, once (an unreadable file, named: NOT_FOUND / DATA_LOSS; FAILED_PRECONDITION for a file
  /// that changed while it was read), after which a lookup starts a new job.
  Result<DigestLookup> Lookup(const std::filesystem::path& dir);

  /// "sha256:<hex>" of `dir`, waiting for its background job if one runs, then hashing what is
  /// left on the caller's thread. Errors as Lookup.
  Result<std::string> Digest(const std::filesystem::path& dir);

  /// Files hashed so far, by any path (for tests).
  int computations() const;

 private:
  struct KnownFile {
    FileStamp stamp;
    std::string sha256_hex;
    bool settled = false;  // read at least Options::settle after its mtime: reusable
  };
  struct Job {
    std::string key;
    std::vector<ListedFile> files;  // to hash
    DigestProgress progress;
  };

  // The digests of `files` known for their stamps (from memory, else the book, which fills
  // memory), in order; an empty string for each unknown.
  std::vector<std::string> KnownDigests(const std::vector<ListedFile>& files);
  // Hashes `file`, checks it did not change meanwhile, remembers its digest. `on_block` as
  // HashFile's; with `settle` (the background thread) first waits until the file has settled.
  Result<FileDigest> HashAndRemember(const ListedFile& file,
                                     const std::function<bool(int64_t)>& on_block, bool settle);
  // Known digests of `files`, the unknown ones hashed here.
  Result<std::string> DigestHere(const std::vector<ListedFile>& files,
                                 std::vector<std::string> known);
  void RunJobs();  // the background thread

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // a job was queued, or stop_ (also: settling, stop_)
  std::condition_variable done_cv_;  // a job ended
  std::map<std::string, KnownFile> files_;           // by file path
  std::map<std::string, std::shared_ptr<Job>> jobs_;  // by directory: queued or running
  std::deque<std::shared_ptr<Job>> queue_;            // not started yet, in order
  std::map<std::string, Status> failures_;            // by directory: told to the next lookup
  int computations_ = 0;
  bool running_ = false;  // the thread is on a job
  bool stop_ = false;
  std::thread thread_;  // started with the first job
};

}  // namespace gatehouse::controller
