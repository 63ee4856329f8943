// gatehouse-worker end to end: the executable with the fake plugin over a fixture.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gates_fixture.h"

namespace gatehouse::worker {
namespace {

using testing::Fixture;
using ::testing::HasSubstr;

struct WorkerRun {
  int exit_code = -1;
  std::vector<nlohmann::json> events;  // stdout, one object per line
  std::string stdout_text, stderr_text;
};

/// Runs the worker binary with `args`, stdout and stderr captured in files under `dir`.
WorkerRun RunWorker(const std::filesystem::path& dir, const std::string& args) {
  const auto out = dir / "worker.stdout", err = dir / "worker.stderr";
  const std::string cmd = std::string(GATEHOUSE_WORKER_BIN) + " " + args + " > " + out.string() +
                          " 2> " + err.string();
  const int rc = std::system(cmd.c_str());
  WorkerRun run;
  run.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::stringstream o, e;
  o << std::ifstream(out).rdbuf();
  e << std::ifstream(err).rdbuf();
  run.stdout_text = o.str();
  run.stderr_text = e.str();
  std::istringstream lines(run.stdout_text);
  for (std::string line; std::getline(lines, line);) {
    run.events.push_back(nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
  }
  return run;
}

std::string WriteRunJson(const Fixture& fx, const nlohmann::json& spec) {
  const auto path = fx.dir.path() / "run.json";
  std::ofstream(path) << spec.dump(2);
  return path.string();
}

// Verifies a full run through the executable: exit 0, only JSON event lines on stdout, every
// requested gate PASS, run_end PASS last.
TEST(WorkerCliTest, FakePluginRunPasses) {
  Fixture fx;
  fx.Write();
  const std::string run_json = WriteRunJson(fx, fx.SpecJson());
  WorkerRun run = RunWorker(fx.dir.path(), "--run-spec " + run_json + " --plugin " + GATEHOUSE_FAKE_PLUGIN);
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  ASSERT_FALSE(run.events.empty());
  for (const auto& e : run.events) {
    ASSERT_TRUE(e.is_object() && e.contains("event")) << run.stdout_text;
  }
  EXPECT_EQ(run.events.back()["event"], "run_end");
  EXPECT_EQ(run.events.back()["status"], "PASS") << run.stdout_text;
  EXPECT_THAT(run.stderr_text, HasSubstr("phase identity"));
}

// Verifies --print-runtime prints one JSON object with the runtime the agent reports: the
// torch this worker runs and the CUDA stack its LibTorch carries (the CI wheel is a CUDA 13
// build; no GPU is needed to read the versions).
TEST(WorkerCliTest, PrintRuntime) {
  Fixture fx;
  WorkerRun run = RunWorker(fx.dir.path(), "--print-runtime");
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  ASSERT_EQ(run.events.size(), 1u) << run.stdout_text;
  const nlohmann::json& r = run.events[0];
  EXPECT_EQ(r.at("torch"), StripLocalVersion(TORCH_VERSION));
  for (const char* key : {"torch_headers", "cuda", "cudnn", "nccl", "cuda_driver"}) {
    EXPECT_TRUE(r.at(key).is_string()) << key;
  }
  EXPECT_TRUE(r.at("cuda_available").is_boolean());
  EXPECT_TRUE(r.at("nccl_groups").is_boolean());
  const RuntimeInfo probed = ProbeRuntime();
  EXPECT_EQ(r.at("cuda"), probed.cuda_version);
  EXPECT_EQ(r.at("nccl"), probed.nccl_version);
  if (!probed.cuda_version.empty()) {
    EXPECT_THAT(probed.cuda_version, ::testing::MatchesRegex("[0-9]+\\.[0-9]+"));
  }
  WorkerRun both = RunWorker(fx.dir.path(), "--print-runtime --run-spec " + WriteRunJson(fx, fx.SpecJson()));
  EXPECT_EQ(both.exit_code, 2);
}

// Verifies a plugin that fails to load: identity still runs, config FAILs naming the plugin,
// the rest is SKIPPED, exit 0.
TEST(WorkerCliTest, BrokenPluginFailsConfig) {
  Fixture fx;
  fx.Write();
  const std::string run_json = WriteRunJson(fx, fx.SpecJson());
  WorkerRun run = RunWorker(fx.dir.path(), "--run-spec " + run_json + " --plugin /nonexistent/libx.so");
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  std::vector<nlohmann::json> ends;
  for (const auto& e : run.events) {
    if (e["event"] == "phase_end") ends.push_back(e);
  }
  ASSERT_GE(ends.size(), 3u);
  EXPECT_EQ(ends[0]["status"], "PASS");
  EXPECT_EQ(ends[1]["status"], "FAIL");
  EXPECT_EQ(ends[1]["classification"], "adapter_contract");
  EXPECT_THAT(ends[1]["reason"].get<std::string>(),
              HasSubstr("plugin /nonexistent/libx.so failed to load"));
  EXPECT_EQ(ends[2]["reason"], "skipped: earlier phase config ended FAIL");
  EXPECT_EQ(run.events.back()["status"], "FAIL");
}

// Verifies a bad run spec exits 2 with the member named on stderr and nothing on stdout.
// Verifies --check-reference summarises a valid bundle and names the fault of a broken one.
TEST(WorkerCliTest, CheckReference) {
  Fixture fx;
  fx.Write();
  WorkerRun valid = RunWorker(fx.dir.path(), "--check-reference " + fx.reference_dir.string());
  ASSERT_EQ(valid.exit_code, 0) << valid.stderr_text;
  const auto summary = nlohmann::json::parse(valid.stdout_text);
  EXPECT_EQ(summary["format"], "gatehouse-reference/2");
  EXPECT_EQ(summary["prompt_lengths"].size(), 3u);
  EXPECT_EQ(summary["vocab_size"], 32);
  EXPECT_EQ(summary["max_new_tokens"], 6);
  std::filesystem::remove(fx.reference_dir / "reference.safetensors");
  WorkerRun broken = RunWorker(fx.dir.path(), "--check-reference " + fx.reference_dir.string());
  EXPECT_EQ(broken.exit_code, 2);
  EXPECT_THAT(broken.stderr_text, HasSubstr("reference.safetensors"));
  EXPECT_TRUE(broken.stdout_text.empty());
}

/// The worker refused its input before any event: exit 2, nothing on stdout, `why` in stderr.
void ExpectRefused(const WorkerRun& run, const std::string& why) {
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.stdout_text, "");
  EXPECT_THAT(run.stderr_text, HasSubstr(why));
}

TEST(WorkerCliTest, BadRunSpecExits2) {
  Fixture fx;
  nlohmann::json spec = fx.SpecJson();
  spec["training"].erase("lr");
  const std::string run_json = WriteRunJson(fx, spec);
  ExpectRefused(RunWorker(fx.dir.path(), "--run-spec " + run_json), "training.lr");
}

// Verifies --parallel-measure-only refuses a run spec that requests a phase after parallel
// (the parallel gate releases the loaded model before it measures): exit 2, naming the phase,
// before any event.
TEST(WorkerCliTest, MeasureOnlyRefusesPhasesAfterParallel) {
  Fixture fx;
  fx.Write();
  nlohmann::json spec = fx.SpecJson();
  spec["phases"] = {"config", "construct", "load", "parallel", "performance"};
  const std::string run_json = WriteRunJson(fx, spec);
  ExpectRefused(RunWorker(fx.dir.path(), "--run-spec " + run_json + " --plugin " +
                                              GATEHOUSE_FAKE_PLUGIN + " --parallel-measure-only"),
                "phase performance runs after parallel");
}

// Verifies --python-path takes an existing directory only: a flag written after it by mistake
// is refused (exit 2, naming the option), not put on sys.path while the flag goes unused.
TEST(WorkerCliTest, PythonPathMustBeADirectory) {
  Fixture fx;
  fx.Write();
  const std::string run_json = WriteRunJson(fx, fx.SpecJson());
  ExpectRefused(RunWorker(fx.dir.path(), "--run-spec " + run_json +
                                              " --python-path --parallel-measure-only"),
                "--python-path");
}

// Verifies a missing --run-spec exits 2.
TEST(WorkerCliTest, MissingArgumentExits2) {
  Fixture fx;
  WorkerRun run = RunWorker(fx.dir.path(), "--plugin x.so");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.stdout_text, "");
}

}  // namespace
}  // namespace gatehouse::worker
