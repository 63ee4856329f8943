#include "controller/digest_cache.h"

#include <utility>

namespace gatehouse::controller {
namespace {

namespace fs = std::filesystem;

// Wall-clock time in ns since the epoch: what file times are measured in.
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One key per directory however it is spelled ("/data/x/", "/data/./x").
std::string KeyOf(const fs::path& dir) {
  fs::path p = dir.lexically_normal();
  if (!p.has_filename() && p != p.root_path()) p = p.parent_path();
  return p.string();
}

}  // namespace

DigestCache::DigestCache(Options options) : options_(std::move(options)) {}

DigestCache::~DigestCache() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<std::string> DigestCache::KnownDigests(const std::vector<ListedFile>& files) {
  std::vector<std::string> known(files.size());
  std::vector<size_t> unknown;
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < files.size(); ++i) {
      auto it = files_.find(files[i].path.string());
      if (it != files_.end() && it->second.settled && it->second.stamp == files[i].stamp) {
        known[i] = it->second.sha256_hex;
      } else {
        unknown.push_back(i);
      }
    }
  }
  if (options_.book == nullptr) return known;
  for (size_t i : unknown) {
    std::optional<std::string> hex = options_.book->Find(files[i].path.string(), files[i].stamp);
    if (!hex) continue;
    known[i] = *hex;
    std::lock_guard lock(mu_);
    files_[files[i].path.string()] = KnownFile{files[i].stamp, *hex, true};
  }
  return known;
}

Result<FileDigest> DigestCache::HashAndRemember(const ListedFile& file,
                                                const std::function<bool(int64_t)>& on_block,
                                                bool settle) {
  // Stamped again now: a queued job's listing may be old, and the digest must be of the bytes
  // its stamp names.
  GH_ASSIGN_OR_RETURN(FileStamp before, StampOf(file.path));
  int64_t read_at = NowNs();
  const int64_t settle_ns = std::chrono::nanoseconds(options_.settle).count();
  // A file written moments ago is read once it has settled (an mtime in the future, a clock
  // apart, is not waited for: its digest is just not reused).
  while (settle && before.mtime_ns <= read_at && read_at < before.mtime_ns + settle_ns) {
    std::unique_lock lock(mu_);
    if (work_cv_.wait_for(lock, std::chrono::nanoseconds(before.mtime_ns + settle_ns - read_at),
                          [this] { return stop_; })) {
      return Status::Unavailable("hashing '" + file.path.string() + "' stopped");
    }
    lock.unlock();
    GH_ASSIGN_OR_RETURN(before, StampOf(file.path));
    read_at = NowNs();
  }
  GH_ASSIGN_OR_RETURN(std::string hex, HashFile(file.path, options_.block_bytes, on_block));
  GH_ASSIGN_OR_RETURN(FileStamp after, StampOf(file.path));
  if (after != before) {
    return Status::FailedPrecondition("file '" + file.path.string() +
                                      "' changed while it was read (is it still being written?)");
  }
  const bool settled = read_at >= before.mtime_ns + settle_ns;
  {
    std::lock_guard lock(mu_);
    files_[file.path.string()] = KnownFile{before, hex, settled};
    ++computations_;
  }
  if (settled && options_.book != nullptr) options_.book->Record(file.path.string(), before, hex);
  return FileDigest{file.rel, before.size, std::move(hex)};
}

Result<std::string> DigestCache::DigestHere(const std::vector<ListedFile>& files,
                                            std::vector<std::string> known) {
  std::vector<FileDigest> digests;
  digests.reserve(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    if (!known[i].empty()) {
      digests.push_back(FileDigest{files[i].rel, files[i].stamp.size, std::move(known[i])});
      continue;
    }
    GH_ASSIGN_OR_RETURN(FileDigest d, HashAndRemember(files[i], nullptr, /*settle=*/false));
    digests.push_back(std::move(d));
  }
  return DirectoryDigestOf(std::move(digests));
}

Result<DigestLookup> DigestCache::Lookup(const fs::path& dir) {
  const std::string key = KeyOf(dir);
  // Under mu_: the error of the directory's last job (told once), or its running job's progress.
  // Asked before listing and again before starting a job: meanwhile a job may have ended, or
  // another lookup started one.
  auto job_state = [&]() -> std::optional<Result<DigestLookup>> {
    if (auto f = failures_.find(key); f != failures_.end()) {
      Status failed = std::move(f->second);
      failures_.erase(f);
      return Result<DigestLookup>(std::move(failed));
    }
    if (auto j = jobs_.find(key); j != jobs_.end()) {
      return Result<DigestLookup>(DigestLookup{"", j->second->progress});
    }
    return std::nullopt;
  };
  {
    std::lock_guard lock(mu_);
    if (auto state = job_state()) return std::move(*state);
  }
  GH_ASSIGN_OR_RETURN(std::vector<ListedFile> files, ListDirectoryFiles(dir));
  std::vector<std::string> known = KnownDigests(files);
  auto job = std::make_shared<Job>();
  job->key = key;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!known[i].empty()) continue;
    job->files.push_back(files[i]);
    job->progress.bytes_total += files[i].stamp.size;
  }
  if (job->files.empty() || job->progress.bytes_total <= options_.inline_bytes) {
    GH_ASSIGN_OR_RETURN(std::string digest, DigestHere(files, std::move(known)));
    return DigestLookup{std::move(digest), {}};
  }
  job->progress.files_total = static_cast<int>(job->files.size());
  std::lock_guard lock(mu_);
  if (auto state = job_state()) return std::move(*state);
  job->progress.queued = running_ || !queue_.empty();
  jobs_[key] = job;
  queue_.push_back(job);
  if (!thread_.joinable()) thread_ = std::thread([this] { RunJobs(); });
  work_cv_.notify_one();
  return DigestLookup{"", job->progress};
}

Result<std::string> DigestCache::Digest(const fs::path& dir) {
  const std::string key = KeyOf(dir);
  {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return jobs_.count(key) == 0; });
    failures_.erase(key);  // what failed is hashed again below, and says why itself
  }
  GH_ASSIGN_OR_RETURN(std::vector<ListedFile> files, ListDirectoryFiles(dir));
  std::vector<std::string> known = KnownDigests(files);
  return DigestHere(files, std::move(known));
}

void DigestCache::RunJobs() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = queue_.front();
      queue_.pop_front();
      job->progress.queued = false;
      running_ = true;
    }
    Status status;
    for (const ListedFile& file : job->files) {
      if (!KnownDigests({file}).front().empty()) {  // hashed meanwhile (by Digest, say)
        std::lock_guard lock(mu_);
        job->progress.bytes_hashed += file.stamp.size;
        ++job->progress.files_hashed;
        continue;
      }
      // Progress after each block; the destructor's stop takes effect here.
      auto on_block = [&](int64_t bytes) {
        {
          std::lock_guard lock(mu_);
          job->progress.bytes_hashed += bytes;
          if (stop_) return false;
        }
        if (options_.before_block) options_.before_block(file.path);
        return true;
      };
      if (options_.before_block) options_.before_block(file.path);
      Result<FileDigest> digest = HashAndRemember(file, on_block, /*settle=*/true);
      if (!digest.ok()) {
        status = digest.status();
        break;
      }
      std::lock_guard lock(mu_);
      ++job->progress.files_hashed;
    }
    std::lock_guard lock(mu_);
    jobs_.erase(job->key);
    running_ = false;
    if (stop_) return;
    if (!status.ok()) failures_[job->key] = std::move(status);
    done_cv_.notify_all();
  }
}

int DigestCache::computations() const {
  std::lock_guard lock(mu_);
  return computations_;
}

}  // namespace gatehouse::controller
