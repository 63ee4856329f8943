// Tests of RunProcess: argv passed verbatim (no shell), exit codes and signals, merged output,
// cancellation of a whole process group.
#include "agent/process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "agent_test_util.h"

namespace gatehouse::agent {
namespace {

using testing::TempDir;
using testing::WriteFile;

struct Captured {
  std::string out;
  std::string err;
  Result<ProcessExit> exit = Status::Internal("not run");
};

Captured Capture(const ProcessSpec& spec, CancelToken cancel = {}) {
  Captured c;
  c.exit = RunProcess(
      spec, [&](std::string_view b) { c.out.append(b); }, [&](std::string_view b) { c.err.append(b); },
      cancel);
  return c;
}

// Verifies that arguments with shell metacharacters reach the program unchanged.
TEST(ProcessTest, GoneProcessIsAPidThatNoLongerRuns) {
  // Verifies what marks a crashed agent's leftovers: a pid that has exited, never this process,
  // a live one (init) or text that is not a positive number.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(GoneProcess(std::to_string(child)), child);
  EXPECT_EQ(GoneProcess(std::to_string(::getpid())), std::nullopt);
  EXPECT_EQ(GoneProcess("1"), std::nullopt);
  for (const char* bad : {"", "0", "-5", "12x", "x12", "99999999999999"}) {
    EXPECT_EQ(GoneProcess(bad), std::nullopt) << bad;
  }
}

TEST(ProcessTest, ArgumentsAreNotInterpretedByAShell) {
  ProcessSpec spec;
  spec.exe = "printf";
  spec.args = {"%s|", "a b", "$(echo hi)", "; rm -rf /", "*"};
  const Captured c = Capture(spec);
  ASSERT_TRUE(c.exit.ok()) << c.exit.status().ToString();
  EXPECT_TRUE(c.exit->ok());
  EXPECT_EQ(c.out, "a b|$(echo hi)|; rm -rf /|*|");
}

// Verifies exit codes, separate stderr, the environment and the working directory.
TEST(ProcessTest, ReportsExitCodeEnvAndCwd) {
  TempDir dir;
  WriteFile(dir.path() / "s.sh",
            "#!/bin/sh\necho \"$GH_X $(pwd)\"\necho oops >&2\nexit 5\n", true);
  ProcessSpec spec;
  spec.exe = dir.path() / "s.sh";
  spec.cwd = dir.path();
  spec.env = {{"GH_X", "value"}};
  const Captured c = Capture(spec);
  ASSERT_TRUE(c.exit.ok());
  EXPECT_EQ(c.exit->exit_code, 5);
  EXPECT_EQ(c.exit->signal, 0);
  EXPECT_EQ(c.exit->Describe(), "exited with code 5");
  EXPECT_EQ(c.out, "value " + dir.path().string() + "\n");
  EXPECT_EQ(c.err, "oops\n");
}

// Verifies that merge_stderr delivers both streams, in order, through the stdout handler.
TEST(ProcessTest, MergedStderrKeepsOrder) {
  TempDir dir;
  WriteFile(dir.path() / "s.sh", "#!/bin/sh\necho one\necho two >&2\necho three\n", true);
  ProcessSpec spec;
  spec.exe = dir.path() / "s.sh";
  spec.merge_stderr = true;
  const Captured c = Capture(spec);
  ASSERT_TRUE(c.exit.ok());
  EXPECT_EQ(c.out, "one\ntwo\nthree\n");
  EXPECT_EQ(c.err, "");
}

// Verifies that a missing program is NOT_FOUND rather than a crash or a hang.
TEST(ProcessTest, MissingProgramIsNotFound) {
  ProcessSpec spec;
  spec.exe = "/nonexistent/gatehouse-no-such-program";
  EXPECT_EQ(Capture(spec).exit.status().code(), StatusCode::kNotFound);
  spec.exe = "gatehouse-no-such-program-in-path";
  EXPECT_EQ(Capture(spec).exit.status().code(), StatusCode::kNotFound);
}

// Verifies that an exec failure in the child (a file without execute permission) comes back as
// UNAVAILABLE naming the program, through Boost's exec-error pipe that the child keeps open.
TEST(ProcessTest, ExecFailureIsUnavailable) {
  TempDir dir;
  WriteFile(dir.path() / "not-executable", "#!/bin/sh\nexit 0\n", /*executable=*/false);
  ProcessSpec spec;
  spec.exe = dir.path() / "not-executable";
  const Captured c = Capture(spec);
  ASSERT_FALSE(c.exit.ok());
  EXPECT_EQ(c.exit.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.exit.status().message().find("not-executable"), std::string::npos)
      << c.exit.status().message();
}

// Verifies RunForOutput: standard output when the program exits 0; UNAVAILABLE naming the
// program, its exit and its standard error otherwise.
TEST(ProcessTest, RunForOutputReturnsStdoutOrTheFailure) {
  ProcessSpec ok;
  ok.exe = "/bin/sh";
  ok.args = {"-c", "echo out; echo noise >&2"};
  auto out = RunForOutput(ok);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "out\n");
  ProcessSpec bad = ok;
  bad.args = {"-c", "echo partial; echo 'no such job' >&2; exit 3"};
  auto failed = RunForOutput(bad);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(failed.status().message(), "sh exited with code 3: no such job");
}

// Verifies that cancelling sends SIGTERM to the child's whole group (a grandchild too), and that
// the call returns promptly with the signal recorded.
TEST(ProcessTest, CancelTerminatesProcessGroup) {
  TempDir dir;
  WriteFile(dir.path() / "s.sh", "#!/bin/sh\nsleep 30 &\necho started\nwait\n", true);
  ProcessSpec spec;
  spec.exe = dir.path() / "s.sh";
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel = true;
  });
  const auto start = std::chrono::steady_clock::now();
  const Captured c = Capture(spec, CancelToken{&cancel, std::chrono::milliseconds(2000)});
  canceller.join();
  ASSERT_TRUE(c.exit.ok()) << c.exit.status().ToString();
  EXPECT_EQ(c.exit->signal, SIGTERM);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// Verifies that a child can be cancelled even when the agent blocks SIGTERM in its own threads
// (as gatehouse-agent does for its signal thread): the child starts with an empty signal mask.
TEST(ProcessTest, ChildDoesNotInheritBlockedSignals) {
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigset_t old;
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &old), 0);

  ProcessSpec spec;
  spec.exe = "sleep";
  spec.args = {"30"};
  std::atomic<bool> cancel{true};
  const auto start = std::chrono::steady_clock::now();
  const Captured c = Capture(spec, CancelToken{&cancel, std::chrono::milliseconds(20000)});
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(c.exit.ok()) << c.exit.status().ToString();
  EXPECT_EQ(c.exit->signal, SIGTERM);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(ProcessTest, LeftoverProcessesHoldingTheOutputAreKilledAfterTheLogFlushTimeout) {
  // The child exits at once but leaves a background process holding its stdout: RunProcess
  // returns after log_flush_timeout (not after the leftover's 30 s), says the output was cut,
  // and what was written before is kept.
  TempDir dir;
  WriteFile(dir.path() / "leave.sh", "#!/bin/sh\necho before\nsleep 30 &\nexit 0\n", true);
  ProcessSpec spec;
  spec.exe = dir.path() / "leave.sh";
  spec.log_flush_timeout = std::chrono::milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  const Captured c = Capture(spec);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(c.exit.ok()) << c.exit.status().ToString();
  EXPECT_TRUE(c.exit->output_cut);
  EXPECT_EQ(c.exit->exit_code, 0);
  EXPECT_EQ(c.out, "before\n");
  EXPECT_GE(took, std::chrono::milliseconds(300));
  EXPECT_LT(took, std::chrono::seconds(10));
  // A child without leftovers is not cut.
  ProcessSpec quick;
  quick.exe = "true";
  const Captured q = Capture(quick);
  ASSERT_TRUE(q.exit.ok());
  EXPECT_FALSE(q.exit->output_cut);
}

}  // namespace
}  // namespace gatehouse::agent
