// Helpers shared by the controller tests: temporary directories, files, fixtures.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
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
/// "/nowhere" is unknown.
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
  int calls = 0;
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
