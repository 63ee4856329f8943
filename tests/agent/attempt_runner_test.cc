// Tests of a whole attempt without gRPC: a git repository holding a tiny CMake plugin project and
// a recipe, checked out, built and handed to a fake worker, all reported to a recording sink.
#include "agent/attempt_runner.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "agent_test_util.h"
#include "fake_attempt_sink.h"
#include "tests/common/sample_spec.h"

namespace gatehouse::agent {
namespace {

using nlohmann::json;
using testing::CommitFiles;
using testing::GitInit;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

constexpr const char* kRecipe = R"({
  "recipe_version": 1,
  "build": {"system": "cmake", "source_dir": "plugin", "target": "tiny_plugin",
            "cmake_args": ["-DCMAKE_BUILD_TYPE=Release"]},
  "plugins": ["libtiny_plugin.so"]
})";

class AttemptRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_ = tmp_.path() / "origin";
    GitInit(repo_);
    good_ = CommitFiles(repo_,
                        {{"gatehouse.recipe.json", kRecipe},
                         {"plugin/CMakeLists.txt",
                          "cmake_minimum_required(VERSION 3.25)\nproject(tiny LANGUAGES CXX)\n"
                          "add_library(tiny_plugin SHARED plugin.cc)\n"},
                         {"plugin/plugin.cc", "extern \"C\" int tiny_plugin() { return 1; }\n"}},
                        "tiny plugin");
    std::filesystem::create_directories(tmp_.path() / "sdk");
    const auto worker = tmp_.path() / "fake-worker.sh";
    WriteFile(worker,
              "#!/bin/sh\n"
              "echo '{\"event\":\"phase_start\",\"phase\":\"identity\",\"ts_ms\":1}'\n"
              "echo \"worker saw $2\" >&2\n"
              "echo '{\"event\":\"run_end\",\"status\":\"PASS\",\"ts_ms\":2}'\n",
              true);
    config_.work_dir = tmp_.path() / "work";
    config_.sdk_dir = tmp_.path() / "sdk";
    config_.worker = worker;
    config_.agent_name = "test-agent";
  }

  AttemptAssignment Assignment(int64_t id, const std::string& commit) {
    CellSpec spec = gatehouse::testing::SampleSpec();
    spec.repository = repo_.string();
    spec.commit = commit;
    return {id, "cell-" + std::to_string(id), CanonicalSpecJson(spec)};
  }

  TempDir tmp_;
  std::filesystem::path repo_;
  std::string good_;
  RunnerConfig config_;
  FakeAttemptSink sink_;
};

// Verifies the whole lifecycle: build log streamed, worker events relayed with seq 1..n, run.json
// records the verified checkout, and exactly one "finished" end comes last.
TEST_F(AttemptRunnerTest, RunsCheckoutBuildAndWorker) {
  AttemptRunner runner(config_);
  runner.Run(Assignment(11, good_), sink_);

  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].outcome, "finished") << sink_.ends[0].reason;
  EXPECT_EQ(sink_.ends[0].attempt_id, 11);
  EXPECT_EQ(sink_.ends[0].seq, 3);
  ASSERT_EQ(sink_.events.size(), 2u);
  EXPECT_EQ(sink_.events[1].seq, 2);
  EXPECT_NE(sink_.LogText("build").find("+ cmake --build"), std::string::npos);
  const auto attempt_dir = config_.work_dir / "attempts" / "11";
  EXPECT_EQ(sink_.LogText("worker"), "worker saw " + (attempt_dir / "run.json").string() + "\n");

  const json run = json::parse(ReadFile(attempt_dir / "run.json"));
  EXPECT_EQ(run["attempt"]["checkout"]["head"], good_);
  EXPECT_EQ(run["attempt"]["checkout"]["clean"], true);
  EXPECT_EQ(run["attempt"]["agent"], "test-agent");
  EXPECT_EQ(run["repository"], repo_.string());
}

// Verifies that a commit the repository lacks ends the attempt with "checkout failed" naming it.
TEST_F(AttemptRunnerTest, CheckoutFailureEndsInError) {
  AttemptRunner runner(config_);
  const std::string unknown = "fedcba9876543210fedcba9876543210fedcba98";
  runner.Run(Assignment(12, unknown), sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].outcome, "error");
  EXPECT_EQ(sink_.ends[0].reason.rfind("checkout failed: ", 0), 0u) << sink_.ends[0].reason;
  EXPECT_NE(sink_.ends[0].reason.find(unknown), std::string::npos);
  EXPECT_TRUE(sink_.events.empty());
}

// Verifies that a commit without a recipe ends with "gatehouse.recipe.json not found at <sha>".
TEST_F(AttemptRunnerTest, MissingRecipeEndsInError) {
  testing::Git(repo_, {"rm", "-q", "gatehouse.recipe.json"});
  testing::Git(repo_, {"commit", "-q", "-m", "drop recipe"});
  const std::string no_recipe = testing::Git(repo_, {"rev-parse", "HEAD"});
  AttemptRunner runner(config_);
  runner.Run(Assignment(13, no_recipe), sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].reason, "gatehouse.recipe.json not found at " + no_recipe);
}

// Verifies that a commit that does not compile ends with "build failed" and its log streamed.
TEST_F(AttemptRunnerTest, BuildFailureEndsInError) {
  const std::string broken = CommitFiles(repo_, {{"plugin/plugin.cc", "this is not C++\n"}}, "break");
  AttemptRunner runner(config_);
  runner.Run(Assignment(14, broken), sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].outcome, "error");
  EXPECT_EQ(sink_.ends[0].reason.rfind("build failed: ", 0), 0u) << sink_.ends[0].reason;
  EXPECT_NE(sink_.LogText("build").find("plugin.cc"), std::string::npos);
  EXPECT_TRUE(sink_.events.empty());
}

// Verifies that a spec the agent cannot read (a member missing, not JSON, a bad topology, an
// env value that is not a string) ends in error naming the field, before any checkout or rank.
TEST_F(AttemptRunnerTest, InvalidSpecEndsInError) {
  AttemptRunner runner(config_);
  runner.Run({15, "cell", R"({"spec_version":1})"}, sink_);
  runner.Run({16, "cell", "not json"}, sink_);
  json spec = json::parse(Assignment(17, good_).spec_json);
  spec["topology"]["tp"] = 0;
  runner.Run({17, "cell", spec.dump()}, sink_);
  spec = json::parse(Assignment(18, good_).spec_json);
  spec["env"] = {{"N", 3}};
  runner.Run({18, "cell", spec.dump()}, sink_);
  ASSERT_EQ(sink_.ends.size(), 4u);
  EXPECT_EQ(sink_.ends[0].reason, "invalid spec: missing field 'repository'");
  EXPECT_EQ(sink_.ends[1].reason.rfind("invalid spec: spec is not valid JSON: ", 0), 0u)
      << sink_.ends[1].reason;
  EXPECT_EQ(sink_.ends[2].reason,
            "invalid spec: field 'topology.tp': expected an integer from 1 to 64, got 0");
  EXPECT_EQ(sink_.ends[3].reason.rfind("invalid spec: field 'env.N': expected a string", 0), 0u)
      << sink_.ends[3].reason;
  EXPECT_FALSE(std::filesystem::exists(config_.work_dir / "attempts" / "17"));
  EXPECT_TRUE(sink_.events.empty());
}

}  // namespace
}  // namespace gatehouse::agent
