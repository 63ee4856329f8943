// Helpers shared by the controller tests: temporary directories, files, fixtures.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "controller/commit_resolver.h"
#include "tests/common/temp_dir.h"

namespace gatehouse::controller::testing {

using gatehouse::test_util::TempDir;

inline void WriteFile(const std::filesystem::path& p, const std::string& content) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << content;
}

/// A checkpoint directory <root>/ckpt (config.json + weights) and <root>/reference.
inline void MakeCheckpoint(const std::filesystem::path& root) {
  WriteFile(root / "ckpt" / "config.json", R"({"model_type":"llama"})");
  WriteFile(root / "ckpt" / "model.safetensors", "weights");
  WriteFile(root / "reference" / "reference.json", R"({"format":"gatehouse-reference/1"})");
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

}  // namespace gatehouse::controller::testing
