// Helpers shared by the controller tests: temporary directories, files, fixtures.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "controller/commit_resolver.h"
#include "controller/controller_core.h"
#include "tests/common/temp_dir.h"

namespace gatehouse::controller::testing {

using gatehouse::test_util::TempDir;

inline void WriteFile(const std::filesystem::path& p, const std::string& content) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << content;
}

/// A file of `bytes` bytes of a repeating pattern (not sparse: real blocks to read).
inline void WriteBigFile(const std::filesystem::path& p, int64_t bytes) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  std::string block(1 << 16, '\0');
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i * 31 % 251);
  for (int64_t left = bytes; left > 0; left -= static_cast<int64_t>(block.size())) {
    out.write(block.data(), static_cast<std::streamsize>(std::min<int64_t>(left, block.size())));
  }
}

/// Sets the mtime of `path` (a file, or every file under a directory) an hour back, as if
/// written long before: a DigestCache reuses digests of settled files only.
inline void Backdate(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const auto then = fs::file_time_type::clock::now() - std::chrono::hours(1);
  if (!fs::is_directory(path)) {
    fs::last_write_time(path, then);
    return;
  }
  for (const auto& entry : fs::recursive_directory_iterator(path)) {
    if (entry.is_regular_file() && !entry.is_symlink()) fs::last_write_time(entry.path(), then);
  }
}

/// Holds a DigestCache's hashing thread at its before_block hook (Options::before_block =
/// [&gate](auto&) { gate.Pass(); }), so a test sees a job pending at a known block. The thread
/// passes the hook once before each file and once after each block it hashed. Open() before the
/// cache is destroyed.
class HashingGate {
 public:
  /// On the hashing thread: counts the arrival, waits until a pass is allowed.
  void Pass() {
    std::unique_lock lock(mu_);
    ++arrivals_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_ || allowed_ > 0; });
    if (!open_) --allowed_;
  }
  /// Lets `n` more arrivals through.
  void Allow(int n) {
    std::lock_guard lock(mu_);
    allowed_ += n;
    cv_.notify_all();
  }
  /// Lets every arrival through from now on.
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  /// Waits (at most 30 s) until the hook was reached `n` times in all; false on timeout.
  bool WaitForArrivals(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return arrivals_ >= n; });
  }
  int arrivals() {
    std::lock_guard lock(mu_);
    return arrivals_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int arrivals_ = 0;
  int allowed_ = 0;
  bool open_ = false;
};

/// A stored cell row for store-level tests: `id`, a stand-in spec, /repos/adapt at 'a' x 40,
/// branch main, family llama, submitter ci.
inline CellRecord MakeCellRecord(const std::string& id) {
  CellRecord c;
  c.id = id;
  c.spec_json = R"({"id":")" + id + R"("})";
  c.repository = "/repos/adapt";
  c.commit_sha = std::string(40, 'a');
  c.branch = "main";
  c.model_family = "llama";
  c.submitter = "ci";
  return c;
}

/// A checkpoint directory <root>/ckpt (config.json + weights) and <root>/reference.
inline void MakeCheckpoint(const std::filesystem::path& root) {
  WriteFile(root / "ckpt" / "config.json", R"({"model_type":"llama"})");
  WriteFile(root / "ckpt" / "model.safetensors", "weights");
  WriteFile(root / "reference" / "reference.json", R"({"format":"gatehouse-reference/2"})");
  WriteFile(root / "reference" / "reference.safetensors", "reference");
}

/// Resolves every branch to a fixed SHA; "missing" is an unknown branch; a repository named
/// "/nowhere" is unknown; every repository's default branch is `default_branch`.
class FakeCommitResolver : public CommitResolver {
 public:
  static constexpr char kSha[] = "0123456789abcdef0123456789abcdef01234567";

  Result<std::string> ResolveBranch(const std::string& repository,
                                    const std::string& branch) override {
    if (repository == "/nowhere") return Status::NotFound("repository '/nowhere': absent");
    if (branch == "missing") {
      return Status::NotFound("branch 'missing' not found in '" + repository + "'");
    }
    ++calls;
    return branch == "other" ? std::string(40, 'b') : std::string(kSha);
  }
  Result<std::string> ResolveCommit(const std::string& repository,
                                    const std::string& commit) override {
    if (repository == "/nowhere") return Status::NotFound("repository '/nowhere': absent");
    ++calls;
    return commit;
  }
  /// `files` by path, the same at every commit; a path not in it is no file.
  Result<std::optional<std::string>> ReadFileAt(const std::string&, const std::string&,
                                                const std::string& path) override {
    std::lock_guard lock(files_mu);
    if (auto it = files.find(path); it != files.end()) return std::optional(it->second);
    return std::optional<std::string>();
  }
  /// `default_branch` for every repository; NOT_FOUND when it is empty (a resolver that
  /// cannot tell).
  Result<std::string> DefaultBranch(const std::string& repository) override {
    std::lock_guard lock(files_mu);
    if (default_branch.empty()) return Status::NotFound("no default branch of " + repository);
    return default_branch;
  }
  int calls = 0;
  std::mutex files_mu;  // guards files and default_branch
  std::map<std::string, std::string> files;
  std::string default_branch = "main";
};

/// An agent's outbound stream that records what the controller sends instead of sending it.
class RecordingChannel : public AgentChannel {
 public:
  bool SendAssignment(const AssignmentMessage& a) override {
    std::lock_guard lock(mu);
    sent.push_back(a);
    sender_threads.push_back(std::this_thread::get_id());
    return true;
  }
  bool SendCancel(int64_t attempt_id, const std::string& reason) override {
    std::lock_guard lock(mu);
    cancels.emplace_back(attempt_id, reason);
    return true;
  }
  /// The attempt ids assigned so far, in order.
  std::vector<int64_t> AssignedIds() {
    std::lock_guard lock(mu);
    std::vector<int64_t> ids;
    for (const auto& a : sent) ids.push_back(a.attempt_id);
    return ids;
  }
  std::mutex mu;
  std::vector<AssignmentMessage> sent;
  std::vector<std::thread::id> sender_threads;  // the thread of each SendAssignment
  std::vector<std::pair<int64_t, std::string>> cancels;
};

}  // namespace gatehouse::controller::testing
