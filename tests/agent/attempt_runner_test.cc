// Tests of a whole attempt without gRPC: a git repository holding a tiny CMake plugin project and
// a recipe, checked out, built and handed to a fake worker, all reported to a recording sink.
#include "agent/attempt_runner.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include <nlohmann/json.hpp>

#include "agent_test_util.h"
#include "fake_attempt_sink.h"
#include "common/sha256.h"
#include "tests/common/sample_spec.h"

namespace gatehouse::agent {
namespace {

using ::testing::HasSubstr;

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
  EXPECT_EQ(sink_.ends[0].reason, "invalid spec: missing field 'checkpoint'");
  EXPECT_EQ(sink_.ends[1].reason.rfind("invalid spec: spec is not valid JSON: ", 0), 0u)
      << sink_.ends[1].reason;
  EXPECT_EQ(sink_.ends[2].reason,
            "invalid spec: field 'topology.tp': expected an integer from 1 to 64, got 0");
  EXPECT_EQ(sink_.ends[3].reason.rfind("invalid spec: field 'env.N': expected a string", 0), 0u)
      << sink_.ends[3].reason;
  EXPECT_FALSE(std::filesystem::exists(config_.work_dir / "attempts" / "17"));
  EXPECT_TRUE(sink_.events.empty());
}

// An artifact store in a directory: Put copies the file under its name (recording it), Get
// copies a blob put there before (by digest), or writes `tamper` instead when set.
class DirArtifacts : public ArtifactChannel {
 public:
  explicit DirArtifacts(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::filesystem::create_directories(dir_);
  }
  Status Put(int64_t attempt_id, const std::string& name,
             const std::filesystem::path& path) override {
    puts.push_back(std::to_string(attempt_id) + ":" + name);
    const std::string bytes = ReadFile(path);
    WriteFile(dir_ / ("sha256:" + Sha256Hex(bytes)), bytes);
    return Status::Ok();
  }
  Status Get(const std::string& digest, int64_t size, const std::filesystem::path& dest) override {
    ++gets;
    const std::string bytes = tamper.empty() ? ReadFile(dir_ / digest) : tamper;
    if ("sha256:" + Sha256Hex(bytes) != digest || static_cast<int64_t>(bytes.size()) != size) {
      return Status::DataLoss("received bytes with another digest than " + digest);
    }
    WriteFile(dest, bytes);
    return Status::Ok();
  }
  std::vector<std::string> puts;
  int gets = 0;
  std::string tamper;

 private:
  std::filesystem::path dir_;
};

// A reference runner stand-in: writes its events and the two bundle files into --out.
constexpr const char* kFakeReferenceRunner =
    "#!/bin/sh\n"
    "# args: --run-spec FILE --out DIR\n"
    "mkdir -p \"$4\" && echo '{\"format\":\"gatehouse-reference/2\"}' > \"$4/reference.json\"\n"
    "printf tensors > \"$4/reference.safetensors\"\n"
    "echo '{\"event\":\"phase_end\",\"phase\":\"reference\",\"status\":\"PASS\",\"reason\":\"\"}'\n"
    "echo '{\"event\":\"run_end\",\"status\":\"PASS\"}'\n";

// Verifies a reference cell runs the reference runner (no checkout, no build) with the run
// spec and the attempt's bundle directory, then stores both bundle files as the attempt's
// artifacts before the end; and that a validation cell naming that reference cell gets the
// files fetched into its attempt directory and run.json pointing at them with their digest.
TEST_F(AttemptRunnerTest, AReferenceCellStoresItsBundleAndAValidationCellFetchesIt) {
  WriteFile(tmp_.path() / "fake-reference.sh", kFakeReferenceRunner, true);
  config_.reference_python = "/bin/sh";
  config_.reference_script = tmp_.path() / "fake-reference.sh";
  DirArtifacts artifacts(tmp_.path() / "blobs");
  AttemptRunner runner(config_);
  runner.SetArtifactChannel(&artifacts);
  CellSpec reference = ReferenceCellFor(gatehouse::testing::SampleSpec(), {}, SubmitContext{});
  runner.Run({21, "ref", CanonicalSpecJson(reference), {}}, sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].outcome, "finished") << sink_.ends[0].reason;
  EXPECT_EQ(artifacts.puts, (std::vector<std::string>{"21:reference/reference.json",
                                                      "21:reference/reference.safetensors"}));
  EXPECT_EQ(sink_.LogText("build"), "") << "a reference cell builds nothing";
  const json run = json::parse(ReadFile(config_.work_dir / "attempts" / "21" / "run.json"));
  EXPECT_EQ(run["kind"], "reference");

  CellSpec validation = gatehouse::testing::SampleSpec();
  validation.repository = repo_.string();
  validation.commit = good_;
  validation.reference = {};
  validation.reference.cell = std::string(64, 'a');
  const std::string json_bytes = "{\"format\":\"gatehouse-reference/2\"}\n";
  std::vector<InputFile> inputs = {
      {"reference", "reference.json", "sha256:" + Sha256Hex(json_bytes),
       static_cast<int64_t>(json_bytes.size())},
      {"reference", "reference.safetensors", "sha256:" + Sha256Hex("tensors"), 7}};
  FakeAttemptSink second;  // one sink per attempt
  runner.Run({22, "validation", CanonicalSpecJson(validation), inputs}, second);
  ASSERT_EQ(second.ends.size(), 1u);
  EXPECT_EQ(second.ends[0].outcome, "finished") << second.ends[0].reason;
  const auto bundle = config_.work_dir / "attempts" / "22" / "reference";
  EXPECT_EQ(ReadFile(bundle / "reference.safetensors"), "tensors");
  const json run2 = json::parse(ReadFile(config_.work_dir / "attempts" / "22" / "run.json"));
  EXPECT_EQ(run2["reference"]["cell"], std::string(64, 'a'));
  EXPECT_EQ(run2["reference"]["path"], bundle.string());
  EXPECT_EQ(run2["reference"]["digest"], *DirectoryDigest(bundle));
  EXPECT_EQ(artifacts.gets, 2);

  // The node's cache: a second attempt with the same inputs fetches nothing.
  FakeAttemptSink third;
  runner.Run({23, "validation", CanonicalSpecJson(validation), inputs}, third);
  EXPECT_EQ(artifacts.gets, 2);
  ASSERT_EQ(third.ends.size(), 1u);
  EXPECT_EQ(third.ends[0].outcome, "finished") << third.ends[0].reason;

  // A cached file changed on disk is not used: it is fetched again.
  WriteFile(config_.work_dir / "artifacts" / "sha256" / Sha256Hex("tensors"), "tampered");
  FakeAttemptSink fourth;
  runner.Run({24, "validation", CanonicalSpecJson(validation), inputs}, fourth);
  EXPECT_EQ(artifacts.gets, 3);
  EXPECT_EQ(ReadFile(config_.work_dir / "attempts" / "24" / "reference" / "reference.safetensors"),
            "tensors");
  EXPECT_EQ(fourth.ends.at(0).outcome, "finished") << fourth.ends[0].reason;
}

// Verifies a reference runner that leaves half a bundle ends the attempt in error with nothing
// stored: the runner writes the bundle whole or not at all.
TEST_F(AttemptRunnerTest, HalfABundleIsNotStored) {
  WriteFile(tmp_.path() / "half.sh",
            "#!/bin/sh\nmkdir -p \"$4\" && echo '{}' > \"$4/reference.json\"\n"
            "echo '{\"event\":\"run_end\",\"status\":\"PASS\"}'\n",
            true);
  config_.reference_python = "/bin/sh";
  config_.reference_script = tmp_.path() / "half.sh";
  DirArtifacts artifacts(tmp_.path() / "blobs");
  AttemptRunner runner(config_);
  runner.SetArtifactChannel(&artifacts);
  CellSpec reference = ReferenceCellFor(gatehouse::testing::SampleSpec(), {}, SubmitContext{});
  runner.Run({41, "ref", CanonicalSpecJson(reference), {}}, sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].outcome, "error");
  EXPECT_NE(sink_.ends[0].reason.find("has no reference.safetensors"), std::string::npos)
      << sink_.ends[0].reason;
  EXPECT_TRUE(artifacts.puts.empty());
}

// Verifies bytes that do not match the announced digest end the attempt BLOCKED at identity,
// naming the file and the reference cell, with no checkout and no worker run.
TEST_F(AttemptRunnerTest, AReferenceFileThatDoesNotMatchItsDigestBlocks) {
  DirArtifacts artifacts(tmp_.path() / "blobs");
  artifacts.tamper = "not the bundle";
  AttemptRunner runner(config_);
  runner.SetArtifactChannel(&artifacts);
  CellSpec validation = gatehouse::testing::SampleSpec();
  validation.repository = repo_.string();
  validation.commit = good_;
  validation.reference = {};
  validation.reference.cell = std::string(64, 'b');
  runner.Run({31, "validation", CanonicalSpecJson(validation),
              {{"reference", "reference.json", "sha256:" + Sha256Hex("x"), 1}}},
             sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].outcome, "finished");
  ASSERT_FALSE(sink_.events.empty());
  const json identity = json::parse(sink_.events[0].json);
  EXPECT_EQ(identity["phase"], "identity");
  EXPECT_EQ(identity["status"], "BLOCKED");
  const std::string reason = identity["reason"];
  EXPECT_NE(reason.find("reference cell " + std::string(64, 'b')), std::string::npos) << reason;
  EXPECT_NE(reason.find("'reference.json'"), std::string::npos) << reason;
  EXPECT_NE(reason.find("another digest"), std::string::npos) << reason;
  EXPECT_EQ(json::parse(sink_.events.back().json)["status"], "BLOCKED");
  EXPECT_EQ(sink_.LogText("build"), "") << "nothing is checked out or built";
}


// Verifies an attempt's own cgroup (RunnerConfig::cgroup, agent/cgroup.h) end to end: the
// build and the worker run in it, the worker is told it (GATEHOUSE_CGROUP, the identity gate's
// `cgroup` figure), a worker that allocates past the memory limit is OOM-killed and the end
// reason says the limit was reached, and the cgroup is gone afterwards. SKIPPED where no cgroup
// is delegated here.
TEST_F(AttemptRunnerTest, AnAttemptRunsInItsOwnCgroupAndAnOomKillIsNamed) {
  CgroupConfig cgroup;
  cgroup.memory_limit_bytes = 256 << 20;
  cgroup = PrepareCgroups(cgroup);
  if (cgroup.version == 0) GTEST_SKIP() << "no cgroup delegated here: " << cgroup.none_reason;
  const auto worker = tmp_.path() / "hungry-worker.sh";
  WriteFile(worker,
            "#!/bin/sh\n"
            "echo '{\"event\":\"phase_start\",\"phase\":\"identity\",\"ts_ms\":1}'\n"
            "echo \"GATEHOUSE_CGROUP=$GATEHOUSE_CGROUP\" >&2\n"
            "cat /proc/self/cgroup >&2\n"
            "exec python3 -c \"b = b'x' * (1 << 30)\"\n",
            true);
  config_.worker = worker;
  config_.cgroup = &cgroup;
  AttemptRunner runner(config_);
  runner.Run(Assignment(41, good_), sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  const std::string name = "gatehouse-a41-p" + std::to_string(::getpid());
  EXPECT_EQ(sink_.ends[0].outcome, "error");
  // The worker's phase and last stderr lines (its /proc/self/cgroup), then the cgroup's word.
  const std::string& reason = sink_.ends[0].reason;
  EXPECT_EQ(reason.rfind("worker exited with code 137 (signal 9) before run_end in phase "
                         "identity; its last stderr lines: ",
                         0),
            0u)
      << reason;
  const std::string oom =
      "; the attempt's cgroup reached its memory limit (256 MiB): the kernel killed 1 process";
  EXPECT_TRUE(reason.size() > oom.size() &&
              reason.compare(reason.size() - oom.size(), oom.size(), oom) == 0)
      << reason;
  const std::string log = sink_.LogText("worker");
  EXPECT_NE(log.find("GATEHOUSE_CGROUP=cgroup v" + std::to_string(cgroup.version) + " " +
                     (cgroup.parent / name).string()),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("memory limit 256 MiB (no swap)"), std::string::npos) << log;
  EXPECT_NE(log.find(name + "\n"), std::string::npos) << "the worker runs in it: " << log;
  EXPECT_NE(sink_.LogText("build").find("+ cmake --build"), std::string::npos)
      << "the build ran (in the cgroup: it could not have otherwise)";
  EXPECT_FALSE(std::filesystem::exists(cgroup.parent / name)) << "removed after the attempt";
}

// Verifies that without an operator's limit the attempt's cgroup is held to the controller's
// estimate plus a margin (MemoryLimitFor) once the build is done: a worker that takes more is
// OOM-killed, the end names the limit and the estimate it came from and carries the limit for
// the controller's calibration, and a process of the node outside the attempt is untouched.
// SKIPPED where no cgroup is delegated here.
TEST_F(AttemptRunnerTest, WithoutAnOperatorLimitTheEstimatePlusAMarginHoldsTheAttempt) {
  CgroupConfig cgroup;  // no --attempt-memory-limit
  cgroup = PrepareCgroups(cgroup);
  if (cgroup.version == 0) GTEST_SKIP() << "no cgroup delegated here: " << cgroup.none_reason;
  const auto worker = tmp_.path() / "greedy-worker.sh";
  WriteFile(worker,
            "#!/bin/sh\n"
            "echo '{\"event\":\"phase_start\",\"phase\":\"load\",\"ts_ms\":1}'\n"
            "echo \"GATEHOUSE_CGROUP=$GATEHOUSE_CGROUP\" >&2\n"
            "exec python3 -c \"b = b'x' * (2 << 30)\"\n",
            true);
  config_.worker = worker;
  config_.cgroup = &cgroup;
  // A neighbour on the node, outside any attempt.
  const pid_t neighbour = ::fork();
  ASSERT_GE(neighbour, 0);
  if (neighbour == 0) {
    ::execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  AttemptAssignment assignment = Assignment(43, good_);
  assignment.memory_estimate_bytes = 64 << 20;
  assignment.memory_estimate = "worker rank ~67 MB";
  EXPECT_EQ(MemoryLimitFor(assignment.memory_estimate_bytes), (64 << 20) + (int64_t{1} << 30));
  // The 1B fp32 worker of docs/real-size.md: 22.82 GB + 25% would pass its 25.3 GB node, so the
  // limit stops at the node less 1 GiB; never below the estimate itself.
  EXPECT_EQ(MemoryLimitFor(22'820'000'000, 25'300'000'000), 25'300'000'000 - (int64_t{1} << 30));
  EXPECT_EQ(MemoryLimitFor(22'820'000'000), 22'820'000'000 + 22'820'000'000 / 4);
  EXPECT_EQ(MemoryLimitFor(24'800'000'000, 25'300'000'000), 24'800'000'000);
  AttemptRunner runner(config_);
  runner.Run(assignment, sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].outcome, "error");
  EXPECT_THAT(sink_.ends[0].reason,
              HasSubstr("the attempt's cgroup reached its memory limit (1.1 GiB: the "
                        "controller's estimate 64 MiB, worker rank ~67 MB, plus a margin): the "
                        "kernel killed 1 process"));
  EXPECT_EQ(sink_.ends[0].oom_limit_bytes, (64 << 20) + (int64_t{1} << 30));
  EXPECT_THAT(sink_.LogText("worker"), HasSubstr("memory limit 1.1 GiB (the controller's estimate"));
  EXPECT_NE(sink_.LogText("build").find("+ cmake --build"), std::string::npos)
      << "the build ran before the limit";
  EXPECT_EQ(::kill(neighbour, 0), 0) << "the neighbour outside the attempt still runs";
  ::kill(neighbour, SIGKILL);
  ::waitpid(neighbour, nullptr, 0);
  // With an operator's limit the estimate changes nothing.
  CgroupConfig operator_limit;
  operator_limit.memory_limit_bytes = int64_t{3} << 30;
  operator_limit = PrepareCgroups(operator_limit);
  config_.cgroup = &operator_limit;
  FakeAttemptSink second;
  AttemptRunner(config_).Run(Assignment(44, good_), second);
  ASSERT_EQ(second.ends.size(), 1u);
  EXPECT_THAT(second.LogText("worker"), HasSubstr("memory limit 3 GiB"));
}

// A worker that passes identity, starts config and dies there with a Python traceback whose last
// line carries an address that differs from run to run; with `flaky_mark`, only while that file
// does not exist (it creates it), and otherwise finishes.
std::string CrashingWorker(const std::filesystem::path& flaky_mark = {}) {
  const std::string crash =
      "echo '{\"event\":\"phase_start\",\"phase\":\"identity\",\"ts_ms\":1}'\n"
      "echo '{\"event\":\"phase_end\",\"phase\":\"identity\",\"status\":\"PASS\","
      "\"reason\":\"\",\"classification\":\"\",\"duration_ms\":1,\"ts_ms\":2}'\n"
      "echo '{\"event\":\"phase_start\",\"phase\":\"config\",\"ts_ms\":3}'\n"
      "echo 'Traceback (most recent call last):' >&2\n"
      "echo \"ValueError: rope_scaling.factor unsupported at 0x7f$$\" >&2\n"
      "exit 1\n";
  if (flaky_mark.empty()) return "#!/bin/sh\n" + crash;
  return "#!/bin/sh\nif [ ! -e " + flaky_mark.string() + " ]; then\ntouch " +
         flaky_mark.string() + "\n" + crash +
         "fi\necho '{\"event\":\"run_end\",\"status\":\"PASS\",\"ts_ms\":4}'\n";
}

// Verifies a worker that crashes inside a phase is rerun on the same inputs up to that phase
// (its run.json in <attempt>/rerun, its output on "rerun.*" streams, its events not relayed),
// and the same crash again ends the attempt "finished" with that phase FAIL adapter_contract
// naming the crash, every later phase SKIPPED and run_end FAIL, in one event sequence.
TEST_F(AttemptRunnerTest, TheSameCrashTwiceIsTheAdaptersFail) {
  config_.worker = tmp_.path() / "crashing-worker.sh";
  WriteFile(config_.worker, CrashingWorker(), true);
  AttemptRunner runner(config_);
  runner.Run(Assignment(51, good_), sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].outcome, "finished") << sink_.ends[0].reason;
  EXPECT_EQ(sink_.ends[0].exit_code, 1);
  ASSERT_EQ(sink_.events.size(), 3u + 1 + (kPhases.size() - 2) + 1);
  for (size_t i = 0; i < sink_.events.size(); ++i) EXPECT_EQ(sink_.events[i].seq, int64_t(i) + 1);
  EXPECT_EQ(sink_.ends[0].seq, int64_t(sink_.events.size()) + 1);
  const json fail = json::parse(sink_.events[3].json);
  EXPECT_EQ(fail["event"], "phase_end");
  EXPECT_EQ(fail["phase"], "config");
  EXPECT_EQ(fail["status"], "FAIL");
  EXPECT_EQ(fail["classification"], "adapter_contract");
  const std::string reason = fail["reason"];
  EXPECT_EQ(reason.rfind("the worker exited with code 1 in phase config, and again when the agent "
                         "reran phases up to config on the same inputs",
                         0),
            0u)
      << reason;
  EXPECT_NE(reason.find("last stderr lines: Traceback (most recent call last): | ValueError: "
                        "rope_scaling.factor unsupported at 0x7f"),
            std::string::npos)
      << reason;
  const json construct = json::parse(sink_.events[4].json);
  EXPECT_EQ(construct["phase"], "construct");
  EXPECT_EQ(construct["status"], "SKIPPED");
  EXPECT_EQ(construct["reason"], "skipped: earlier phase config ended FAIL");
  const json performance = json::parse(sink_.events[sink_.events.size() - 2].json);
  EXPECT_EQ(performance["phase"], "performance");
  EXPECT_EQ(performance["reason"], "not requested");
  EXPECT_EQ(json::parse(sink_.events.back().json)["status"], "FAIL");
  const auto dir = config_.work_dir / "attempts" / "51";
  EXPECT_EQ(json::parse(ReadFile(dir / "run.json"))["phases"].size(), kDefaultPhases.size());
  EXPECT_EQ(json::parse(ReadFile(dir / "rerun" / "run.json"))["phases"],
            json::array({"identity", "config"}));
  EXPECT_NE(sink_.LogText("rerun.worker").find("ValueError"), std::string::npos);
  EXPECT_EQ(sink_.LogText("rerun.worker-stdout"), "");
}

// Verifies a crash that the rerun does not repeat stays an error (a retry may clear it), its
// reason saying so; and a crash between phases or by SIGKILL (from outside: the OOM killer, an
// operator) is not rerun at all.
TEST_F(AttemptRunnerTest, ACrashNotRepeatedOrFromOutsideStaysAnError) {
  config_.worker = tmp_.path() / "flaky-worker.sh";
  WriteFile(config_.worker, CrashingWorker(tmp_.path() / "crashed-once"), true);
  {
    AttemptRunner runner(config_);
    runner.Run(Assignment(52, good_), sink_);
    ASSERT_EQ(sink_.ends.size(), 1u);
    EXPECT_EQ(sink_.ends[0].outcome, "error");
    const std::string& reason = sink_.ends[0].reason;
    EXPECT_EQ(reason.rfind("worker exited with code 1 before run_end in phase config; its last "
                           "stderr lines: Traceback",
                           0),
              0u)
        << reason;
    const std::string rerun = "; a rerun of the phases up to config on the same inputs did not crash";
    EXPECT_EQ(reason.substr(reason.size() - std::min(reason.size(), rerun.size())), rerun) << reason;
    EXPECT_EQ(sink_.events.size(), 3u) << "the rerun's events are not the attempt's";
  }
  for (const char* body : {"echo 'died before any phase' >&2\nexit 1\n",
                           "echo '{\"event\":\"phase_start\",\"phase\":\"identity\",\"ts_ms\":1}'\n"
                           "kill -9 $$\n"}) {
    FakeAttemptSink sink;
    config_.worker = tmp_.path() / "outside-worker.sh";
    WriteFile(config_.worker, std::string("#!/bin/sh\n") + body, true);
    AttemptRunner runner(config_);
    runner.Run(Assignment(53, good_), sink);
    ASSERT_EQ(sink.ends.size(), 1u);
    EXPECT_EQ(sink.ends[0].outcome, "error");
    EXPECT_EQ(sink.ends[0].reason.find("rerun"), std::string::npos) << sink.ends[0].reason;
    EXPECT_FALSE(std::filesystem::exists(config_.work_dir / "attempts" / "53" / "rerun"));
    EXPECT_EQ(sink.LogText("rerun.worker"), "");
  }
}

// Verifies an agent without a cgroup tells its ranks so, with the reason.
TEST_F(AttemptRunnerTest, WithoutACgroupTheWorkerIsToldWhy) {
  CgroupConfig none;
  none.none_reason = "gatehouse-agent --cgroup none";
  const auto worker = tmp_.path() / "telling-worker.sh";
  WriteFile(worker,
            "#!/bin/sh\n"
            "echo \"GATEHOUSE_CGROUP=$GATEHOUSE_CGROUP\" >&2\n"
            "echo '{\"event\":\"run_end\",\"status\":\"PASS\",\"ts_ms\":2}'\n",
            true);
  config_.worker = worker;
  config_.cgroup = &none;
  AttemptRunner runner(config_);
  runner.Run(Assignment(42, good_), sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].outcome, "finished") << sink_.ends[0].reason;
  EXPECT_EQ(sink_.LogText("worker"), "GATEHOUSE_CGROUP=none: gatehouse-agent --cgroup none\n");
}

// Verifies the build's figures reach the worker (GATEHOUSE_BUILD, which the identity gate
// records), and that a sandboxed build compiles through <build dir>/source, a link relative to
// the checkout in the work dir the sandbox hides (the checkout and build dir are bound back at
// the same paths). The sandboxed half is SKIPPED where bwrap cannot make its namespaces here.
TEST_F(AttemptRunnerTest, TheBuildsFiguresReachTheWorkerAlsoFromASandboxedBuild) {
  const auto worker = tmp_.path() / "build-worker.sh";
  WriteFile(worker,
            "#!/bin/sh\n"
            "echo \"GATEHOUSE_BUILD=$GATEHOUSE_BUILD\" >&2\n"
            "echo '{\"event\":\"run_end\",\"status\":\"PASS\",\"ts_ms\":2}'\n",
            true);
  config_.worker = worker;
  const std::regex figures("GATEHOUSE_BUILD=duration_ms=[0-9]+ compilations=1 cache_hits=[01]\n");
  AttemptRunner(config_).Run(Assignment(51, good_), sink_);
  ASSERT_EQ(sink_.ends.size(), 1u);
  EXPECT_EQ(sink_.ends[0].outcome, "finished") << sink_.ends[0].reason;
  EXPECT_TRUE(std::regex_match(sink_.LogText("worker"), figures)) << sink_.LogText("worker");
  const std::string key = RepoKey(repo_.string());
  const auto build_dir = config_.work_dir / "build" / key;
  EXPECT_EQ(std::filesystem::read_symlink(build_dir / "source"),
            std::filesystem::path("../../repos") / key / "plugin");

  SandboxConfig sandbox;
  sandbox.work_dir = config_.work_dir;
  auto version = ProbeSandbox(sandbox);
  if (!version.ok()) GTEST_SKIP() << "no sandbox here: " << version.status().message();
  sandbox.version = *version;
  config_.sandbox = &sandbox;
  const std::string changed = CommitFiles(
      repo_, {{"plugin/plugin.cc", "extern \"C\" int tiny_plugin() { return 2; }\n"}}, "two");
  FakeAttemptSink sandboxed;
  AttemptRunner(config_).Run(Assignment(52, changed), sandboxed);
  ASSERT_EQ(sandboxed.ends.size(), 1u);
  EXPECT_EQ(sandboxed.ends[0].outcome, "finished")
      << sandboxed.ends[0].reason << "\n" << sandboxed.LogText("build");
  EXPECT_TRUE(std::regex_match(sandboxed.LogText("worker"), figures))
      << sandboxed.LogText("worker") << sandboxed.LogText("build");
}

}  // namespace
}  // namespace gatehouse::agent
