// Verifies the cleanup check (cleanup evidence, issue 5): processes left working in an
// attempt's directory, ports still in use, GPU memory above the idle baseline; and the runner
// recording the report on the "cleanup" stream before the end, draining on a failed check
// until a recheck is clean.
#include "agent/cleanup.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "agent/attempt_runner.h"
#include "agent/capabilities.h"
#include "agent_test_util.h"
#include "tests/agent/fake_attempt_sink.h"

namespace gatehouse::agent {
namespace {

using testing::Leftover;
using testing::TempDir;

TEST(CleanupTest, FindsProcessesWorkingInTheAttemptDirectory) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "attempts" / "7" / "sub");
  EXPECT_TRUE(ProcessesUnder(dir.path() / "attempts" / "7").empty());
  Leftover left(dir.path() / "attempts" / "7" / "sub");
  const auto found = ProcessesUnder(dir.path() / "attempts" / "7");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0], "pid " + std::to_string(left.pid()) + " (sleep)");
  EXPECT_TRUE(ProcessesUnder(dir.path() / "attempts" / "8").empty());
  left.End();
  EXPECT_TRUE(ProcessesUnder(dir.path() / "attempts" / "7").empty());
}

TEST(CleanupTest, APortWithAListenerIsBusy) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  EXPECT_FALSE(PortFree(port));
  ::close(fd);
  EXPECT_TRUE(PortFree(port));
}

TEST(CleanupTest, GpuMemoryIsComparedWithTheIdleBaseline) {
  std::map<int, int64_t> used = {{0, 100}, {1, 50}};
  CleanupChecker checker([&]() -> Result<std::map<int, int64_t>> { return used; }, 512);
  ASSERT_TRUE(checker.TakeBaseline().ok());
  TempDir dir;
  used = {{0, 600}, {1, 50}};  // within 512 MiB of the baseline
  EXPECT_TRUE(checker.Check(dir.path(), {}).healthy());
  used = {{0, 2148}, {1, 50}};
  const CleanupReport report = checker.Check(dir.path(), {});
  EXPECT_FALSE(report.healthy());
  EXPECT_EQ(report.Summary(), "GPU 0: 2148 MiB used, baseline 100 MiB (tolerance 512)");
  EXPECT_EQ(report.ToJson()["gpus"][0]["used_mib"], 2148);
}

TEST(CleanupTest, WithoutGpusTheReportSaysWhyMemoryWasNotCompared) {
  CleanupChecker checker([]() -> Result<std::map<int, int64_t>> { return std::map<int, int64_t>{}; });
  ASSERT_TRUE(checker.TakeBaseline().ok());
  TempDir dir;
  const CleanupReport report = checker.Check(dir.path(), {});
  EXPECT_TRUE(report.healthy());
  EXPECT_EQ(report.gpu_note, "no GPUs");
  EXPECT_EQ(report.Summary(), "clean");
}

// On a machine with an NVIDIA GPU (skipped elsewhere): a process that still holds 2 GiB of GPU
// memory after an attempt (a leaked worker rank, say) fails the check against the real
// nvidia-smi baseline, and once it is gone a recheck is clean again.
TEST(CleanupTest, MemoryHeldOnARealGpuFailsTheCheckUntilFreed) {
  const Result<std::map<int, int64_t>> now = ProbeGpuMemoryUsedMiB();
  if (!now.ok()) GTEST_SKIP() << "nvidia-smi failed: " << now.status().ToString();
  if (now->empty()) GTEST_SKIP() << "no GPU: nvidia-smi is not installed or lists no GPU";
  CleanupChecker checker(ProbeGpuMemoryUsedMiB, 512);
  ASSERT_TRUE(checker.TakeBaseline().ok());
  TempDir dir;
  const std::filesystem::path ready = dir.path() / "ready";
  const char* python = std::getenv("GATEHOUSE_TEST_PYTHON");
  if (python == nullptr) python = GATEHOUSE_PYTHON;
  const std::string script =
      "import pathlib, sys, time, torch\n"
      "x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')\n"
      "torch.cuda.synchronize()\n"
      "pathlib.Path(sys.argv[1]).write_text('ok')\n"
      "time.sleep(120)\n";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(python, python, "-c", script.c_str(), ready.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  for (int i = 0; i < 600 && !std::filesystem::exists(ready); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(std::filesystem::exists(ready)) << python << " did not allocate on the GPU in 60 s";
  const CleanupReport held = checker.Check(dir.path(), {});
  EXPECT_FALSE(held.healthy()) << held.ToJson().dump();
  EXPECT_NE(held.Summary().find("GPU 0: "), std::string::npos) << held.Summary();
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  bool healthy = false;
  for (int i = 0; i < 100 && !healthy; ++i) {  // the driver frees the memory soon after exit
    healthy = checker.Check(dir.path(), {}).healthy();
    if (!healthy) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(healthy) << checker.Check(dir.path(), {}).Summary();
}

TEST(CleanupTest, TheRunnerRecordsTheReportAndDrainsUntilARecheckIsClean) {
  TempDir dir;
  CleanupChecker checker(nullptr);
  ASSERT_TRUE(checker.TakeBaseline().ok());
  RunnerConfig config;
  config.work_dir = dir.path();
  config.cleanup = &checker;
  AttemptRunner runner(config);

  // A clean attempt (it fails fast on its spec; nothing is left behind).
  FakeAttemptSink clean_sink;
  runner.Run({41, "cell", "not json"}, clean_sink);
  EXPECT_TRUE(runner.healthy());
  EXPECT_NE(clean_sink.LogText("cleanup").find("\"healthy\":true"), std::string::npos);

  // An attempt whose directory still has a process working in it.
  std::filesystem::create_directories(dir.path() / "attempts" / "42");
  Leftover left(dir.path() / "attempts" / "42");
  FakeAttemptSink sink;
  runner.Run({42, "cell", "not json"}, sink);
  ASSERT_EQ(sink.ends.size(), 1u);
  const std::string report = sink.LogText("cleanup");
  EXPECT_NE(report.find("\"healthy\":false"), std::string::npos) << report;
  EXPECT_NE(report.find("pid " + std::to_string(left.pid())), std::string::npos) << report;
  EXPECT_FALSE(runner.healthy());
  EXPECT_NE(runner.drain_reason().find("cleanup after attempt 42: 1 leftover process"),
            std::string::npos)
      << runner.drain_reason();
  EXPECT_FALSE(runner.Recheck());
  left.End();
  EXPECT_TRUE(runner.Recheck());
  EXPECT_TRUE(runner.drain_reason().empty());
}

}  // namespace
}  // namespace gatehouse::agent
