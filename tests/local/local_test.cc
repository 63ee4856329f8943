// The parts of `gatehouse run` (local/) that need no worker. They need the git CLI.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent/checkout.h"
#include "controller/attempt_ending.h"
#include "local/digest_book.h"
#include "local/directory_artifacts.h"
#include "local/evidence_recorder.h"
#include "local/local_run.h"
#include "local/run_command.h"
#include "cli/verdict.h"
#include "local/tree_resolver.h"

namespace gatehouse::local {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::trunc) << text;
}

std::string Read(const fs::path& file) {
  std::stringstream s;
  s << std::ifstream(file).rdbuf();
  return s.str();
}

class LocalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("gatehouse-local-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void Git(const fs::path& dir, const std::string& args) {
    const std::string cmd = "git -C '" + dir.string() +
                            "' -c user.email=t@e -c user.name=t " + args + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }

  /// A repository with one commit on `main` (a recipe and a source) and origin `url`.
  fs::path Repository(const std::string& url = "https://example.org/team/adapter.git") {
    const fs::path repo = root_ / "adapter";
    Write(repo / "gatehouse.recipe.json",
          R"({"recipe_version": 1, "families": ["olmo2"], "build": {"system": "cmake",
              "source_dir": ".", "target": "olmo2"}, "plugins": ["libolmo2.so"]})");
    Write(repo / "olmo2" / "olmo2.cc", "// olmo2\n");
    Git(repo, "init -q -b main");
    Git(repo, "add -A");
    Git(repo, "commit -q -m init");
    if (!url.empty()) Git(repo, "remote add origin " + url);
    return repo;
  }

  fs::path root_;
};

TEST_F(LocalTest, AWorkingTreeNamesItsHeadBranchOriginAndChanges) {
  const fs::path repo = Repository();
  auto clean = agent::InspectWorkingTree(repo / "olmo2");  // from a directory inside it
  ASSERT_TRUE(clean.ok()) << clean.status().message();
  EXPECT_EQ(clean->checkout.path, repo);
  EXPECT_EQ(clean->checkout.head.size(), 40u);
  EXPECT_TRUE(clean->checkout.clean);
  EXPECT_EQ(clean->branch, "main");
  EXPECT_EQ(clean->origin_url, "https://example.org/team/adapter.git");
  EXPECT_EQ(DescribeLocalRun(*clean), "local, unfrozen; tree clean");

  Write(repo / "olmo2" / "olmo2.cc", "// olmo2, edited\n");
  Write(repo / "notes" / "new.txt", "untracked\n");
  Write(repo / ".gitignore", "build/\n");
  Write(repo / "build" / "ignored.o", "x");
  auto dirty = agent::InspectWorkingTree(repo);
  ASSERT_TRUE(dirty.ok());
  EXPECT_FALSE(dirty->checkout.clean);
  EXPECT_EQ(dirty->changed,
            (std::vector<std::string>{".gitignore", "notes/new.txt", "olmo2/olmo2.cc"}));
  EXPECT_EQ(dirty->checkout.head, clean->checkout.head);
  EXPECT_EQ(DescribeLocalRun(*dirty),
            "local, unfrozen; tree has 3 changed files: .gitignore, notes/new.txt, olmo2/olmo2.cc");

  Git(repo, "checkout -q --detach");
  EXPECT_EQ(agent::InspectWorkingTree(repo)->branch, "");
  auto outside = agent::InspectWorkingTree(root_);
  EXPECT_EQ(outside.status().code(), StatusCode::kNotFound) << outside.status().message();
}

TEST_F(LocalTest, ManyChangesAreCountedBeyondTheEightNamed) {
  agent::WorkingTree tree;
  for (int i = 0; i < 10; ++i) tree.changed.push_back("f" + std::to_string(i));
  const std::string text = DescribeLocalRun(tree);
  EXPECT_NE(text.find("10 changed files: f0, f1"), std::string::npos) << text;
  EXPECT_NE(text.find("f7 and 2 more"), std::string::npos) << text;
  EXPECT_EQ(text.find("f8"), std::string::npos) << text;
}

TEST_F(LocalTest, TheResolverIsTheCheckedOutCommitAndReadsTheTreeAsItIs) {
  TreeResolver resolver(root_, std::string(40, 'a'), "main");
  EXPECT_EQ(*resolver.ResolveBranch("any", "main"), std::string(40, 'a'));
  auto other = resolver.ResolveBranch("any", "feature");
  EXPECT_EQ(other.status().code(), StatusCode::kNotFound);
  EXPECT_NE(other.status().message().find("'main' checked out"), std::string::npos);
  EXPECT_EQ(resolver.ResolveCommit("any", std::string(40, 'b')).status().code(),
            StatusCode::kNotFound);
  Write(root_ / "gatehouse.recipe.json", "uncommitted");
  EXPECT_EQ(**resolver.ReadFileAt("any", "", "gatehouse.recipe.json"), "uncommitted");
  EXPECT_FALSE(resolver.ReadFileAt("any", "", "missing.json")->has_value());
  EXPECT_EQ(resolver.ReadFileAt("any", "", "../etc/passwd").status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(LocalTest, ArtifactsAreStoredByDigestAndCheckedWhenRead) {
  DirectoryArtifacts store(root_ / "artifacts");
  Write(root_ / "bundle" / "reference.json", "{}");
  ASSERT_TRUE(store.Put(1, "reference/reference.json", root_ / "bundle" / "reference.json").ok());
  ASSERT_TRUE(store.Put(1, "inference/kl_by_position.json", root_ / "bundle" / "reference.json").ok());
  ASSERT_EQ(store.stored().size(), 2u);
  const agent::InputFile& f = store.stored()[0];
  EXPECT_EQ(f.role, "reference");
  EXPECT_EQ(f.name, "reference.json");
  EXPECT_EQ(f.size, 2);
  EXPECT_EQ(store.stored()[1].role, "");
  EXPECT_TRUE(fs::exists(store.BlobPath(f.digest)));
  ASSERT_TRUE(store.Get(f.digest, f.size, root_ / "copy.json").ok());
  EXPECT_EQ(Read(root_ / "copy.json"), "{}");
  Write(store.BlobPath(f.digest), "[]");  // the same size, other bytes
  EXPECT_EQ(store.Get(f.digest, f.size, root_ / "copy2.json").code(), StatusCode::kDataLoss);
  EXPECT_EQ(store.Get("sha256:" + std::string(64, '0'), 1, root_ / "x").code(),
            StatusCode::kNotFound);
}

TEST_F(LocalTest, FileDigestsOutliveTheRunAndAreKeptByStamp) {
  controller::FileStamp stamp{10, 1, 2, 3, 4};
  {
    DigestBookFile book(root_ / "book.jsonl");
    book.Record("/ckpt/model.safetensors", stamp, std::string(64, 'c'));
  }
  std::ofstream(root_ / "book.jsonl", std::ios::app) << "not json\n";
  DigestBookFile again(root_ / "book.jsonl");
  EXPECT_EQ(again.Find("/ckpt/model.safetensors", stamp), std::string(64, 'c'));
  controller::FileStamp touched = stamp;
  touched.mtime_ns = 5;
  EXPECT_FALSE(again.Find("/ckpt/model.safetensors", touched).has_value());
}

TEST_F(LocalTest, TheRecorderKeepsTheEvidenceAsTheControllerDoesAndPrintsPhaseLines) {
  std::ostringstream progress;
  const std::string id(64, 'e');
  EvidenceRecorder recorder(id, root_ / "run", progress);
  const char* events[] = {
      R"({"event":"phase_start","phase":"load"})",
      R"({"event":"figure","phase":"load","name":"keys_used","value":21,"unit":"count"})",
      R"({"event":"phase_end","phase":"load","status":"PASS","reason":"","classification":"","duration_ms":1500})",
      R"({"event":"phase_end","phase":"identity","status":"PASS","reason":"","classification":"","duration_ms":2})",
      R"({"event":"phase_end","phase":"inference","status":"FAIL","reason":"KL 0.9 > 1e-9","classification":"adapter_contract","duration_ms":10})",
      R"({"event":"figure","phase":"inference","name":"kl","value":0.5,"unit":"nats","rank":1})",
      R"({"event":"run_end","status":"FAIL"})",
      R"(not json)"};
  for (int i = 0; i < 8; ++i) recorder.Event(1, i + 1, events[i]);
  recorder.Log(1, "worker", 0, "hello\n");
  recorder.End({1, 9, "finished", "", 1});
  const auto phases = recorder.Phases();
  ASSERT_EQ(phases.size(), 3u);
  EXPECT_EQ(phases[0].phase, "identity");  // kPhases order, not arrival order
  EXPECT_EQ(phases[1].phase, "load");
  ASSERT_EQ(phases[1].figures.size(), 1u);
  EXPECT_EQ(phases[1].figures[0].value_json, "21");
  EXPECT_TRUE(phases[2].figures.empty());  // rank 1's figure is not the evidence
  EXPECT_EQ(recorder.run_status(), "FAIL");
  EXPECT_EQ(recorder.bad_events(), 1);
  EXPECT_NE(progress.str().find("eeeeeeeeeeee load PASS 1.500 s\n"), std::string::npos)
      << progress.str();
  EXPECT_NE(progress.str().find("eeeeeeeeeeee inference FAIL 0.010 s: KL 0.9 > 1e-9"),
            std::string::npos);
  EXPECT_EQ(Read(root_ / "run" / "logs" / "worker.log"), "hello\n");
  EXPECT_NE(Read(root_ / "run" / "events.jsonl").find("not json"), std::string::npos);

  const controller::AttemptEnding ending =
      controller::EndingOf("finished", "", 1, recorder.run_status(), phases);
  EXPECT_EQ(ending.state, controller::AttemptState::kFailed);
  EXPECT_EQ(ending.reason, "run_end status FAIL; phase 'inference' FAIL: KL 0.9 > 1e-9");
}

TEST_F(LocalTest, TheEndingIsTheControllers) {
  using controller::AttemptState;
  using controller::EndingOf;
  EXPECT_EQ(EndingOf("finished", "", 0, "PASS", {}).state, AttemptState::kPassed);
  EXPECT_EQ(EndingOf("finished", "", 0, "BLOCKED", {}).state, AttemptState::kBlocked);
  EXPECT_EQ(EndingOf("finished", "", 0, "UNKNOWN", {}).state, AttemptState::kError);
  const auto no_run_end = EndingOf("finished", "", 3, "", {});
  EXPECT_EQ(no_run_end.state, AttemptState::kError);
  EXPECT_EQ(no_run_end.reason, "the worker finished without a run_end event (exit code 3)");
  EXPECT_EQ(EndingOf("error", "build failed: x", 0, "", {}).reason, "build failed: x");
  EXPECT_EQ(EndingOf("odd", "", 2, "", {}).reason,
            "unknown outcome 'odd': the agent reported an error (exit code 2)");
}

TEST_F(LocalTest, TheTreeGivesRepositoryAndCommitAndABadBodyStopsBeforeAnythingRuns) {
  const fs::path repo = Repository();
  LocalRunOptions o;
  std::ostringstream progress;
  o.progress = &progress;
  o.tree = repo;
  o.work_dir = root_ / "work";
  o.body = {{"model_family", "olmo2"}, {"checkpoint", (root_ / "ckpt").string()},
            {"commit", std::string(40, 'a')}};
  auto named = RunLocally(o);
  EXPECT_EQ(named.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(named.status().message(),
            "field 'commit': a local run takes it from the working tree");

  // The controller's freezer judges the body: an undeclared family, named with the recipe.
  Write(root_ / "ckpt" / "config.json", R"({"model_type": "olmo2"})");
  Write(root_ / "ckpt" / "model.safetensors", "x");
  o.body = {{"model_family", "olmo-2"}, {"checkpoint", (root_ / "ckpt").string()}};
  auto undeclared = RunLocally(o);
  EXPECT_EQ(undeclared.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(undeclared.status().message().find("field 'model_family' = \"olmo-2\""),
            std::string::npos)
      << undeclared.status().message();
  EXPECT_FALSE(fs::exists(root_ / "work" / "attempts" / "1"));
}

// Verifies `gatehouse run --body` names why the body was not read: a file that does not open
// (with the system's reason), and one that is not a JSON object; both exit 2 before anything
// runs.
TEST_F(LocalTest, ABodyFileThatDoesNotReadSaysWhy) {
  RunCommand run;
  nlohmann::json submit_body;
  run.body_file = (root_ / "missing.json").string();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ExecuteRun(run, submit_body), cli::kExitUsage);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("missing.json: cannot open the file (No such file or directory)"), std::string::npos) << err;
  Write(root_ / "list.json", "[1, 2]");
  run.body_file = (root_ / "list.json").string();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ExecuteRun(run, submit_body), cli::kExitUsage);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("list.json: not a JSON object"), std::string::npos) << err;
}

}  // namespace
}  // namespace gatehouse::local
