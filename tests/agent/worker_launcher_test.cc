// Tests of the worker launch and of the relay of its output (docs/protocols.md §3, §4), with
// fake workers written as small shell scripts and a recording sink.
#include "agent/worker_launcher.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "agent_test_util.h"
#include "fake_attempt_sink.h"

namespace gatehouse::agent {
namespace {

using nlohmann::json;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

class WorkerLauncherTest : public ::testing::Test {
 protected:
  // A launch of attempt 7 whose worker is the script `body`.
  WorkerLaunch MakeLaunch(const std::string& body) {
    const auto worker = tmp_.path() / "fake-worker.sh";
    WriteFile(worker, "#!/bin/sh\n" + body, /*executable=*/true);
    WorkerLaunch launch;
    launch.attempt_id = 7;
    launch.attempt_dir = tmp_.path() / "attempts" / "7";
    launch.spec = json{{"spec_version", 1},
                       {"commit", "abc"},
                       {"env", {{"GH_TEST_VAR", "hello world; $(not expanded)"}}}};
    launch.checkout = {"abc", true, tmp_.path() / "checkout"};
    launch.plugins = {tmp_.path() / "build" / "libone.so", tmp_.path() / "build" / "libtwo.so"};
    launch.worker = worker;
    launch.agent_name = "agent-under-test";
    return launch;
  }

  TempDir tmp_;
  FakeAttemptSink sink_;
};

// Verifies the relay: JSON events get seq 1..n, a non-JSON line goes to "worker-stdout", stderr
// bytes arrive on "worker" at the right offsets, and a run_end makes the outcome "finished".
TEST_F(WorkerLauncherTest, RelaysEventsTextAndStderr) {
  const WorkerLaunch launch = MakeLaunch(R"(
echo '{"event":"phase_start","phase":"identity","ts_ms":1}'
echo 'free text, not an event'
printf 'first stderr line\n' >&2
echo '{"event":"phase_end","phase":"identity","status":"PASS","ts_ms":2}'
printf 'second stderr line\n' >&2
echo '{"event":"run_end","status":"PASS","ts_ms":3}'
exit 0
)");
  const AttemptEndReport end = RunWorker(launch, sink_);

  ASSERT_EQ(sink_.events.size(), 3u);
  for (size_t i = 0; i < sink_.events.size(); ++i) {
    EXPECT_EQ(sink_.events[i].attempt_id, 7);
    EXPECT_EQ(sink_.events[i].seq, static_cast<int64_t>(i + 1));
  }
  EXPECT_EQ(sink_.events[0].json, R"({"event":"phase_start","phase":"identity","ts_ms":1})");
  EXPECT_EQ(sink_.events[2].json, R"({"event":"run_end","status":"PASS","ts_ms":3})");
  EXPECT_EQ(sink_.LogText("worker-stdout"), "free text, not an event\n");
  EXPECT_EQ(sink_.chunks["worker-stdout"].front().offset, 0);
  EXPECT_EQ(sink_.LogText("worker"), "first stderr line\nsecond stderr line\n");
  EXPECT_EQ(sink_.chunks["worker"].front().offset, 0);

  EXPECT_EQ(end.attempt_id, 7);
  EXPECT_EQ(end.outcome, "finished");
  EXPECT_EQ(end.exit_code, 0);
  EXPECT_EQ(end.seq, 4);
  EXPECT_TRUE(end.reason.empty());
}

// Verifies many stderr chunks arrive in order with contiguous byte offsets (the fake sink checks
// every offset) and nothing is lost.
TEST_F(WorkerLauncherTest, LargeStderrKeepsOffsets) {
  const WorkerLaunch launch = MakeLaunch(R"(
i=0
while [ $i -lt 3000 ]; do echo "stderr line $i of the worker log" >&2; i=$((i+1)); done
echo '{"event":"run_end","status":"PASS","ts_ms":3}'
)");
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "finished");
  std::string expected;
  for (int i = 0; i < 3000; ++i) expected += "stderr line " + std::to_string(i) + " of the worker log\n";
  EXPECT_EQ(sink_.LogText("worker"), expected);
}

// Verifies run.json (spec + attempt member), the argv, the cwd and the environment the worker
// is started with; no shell touches the env values.
TEST_F(WorkerLauncherTest, WritesRunSpecAndPassesArgsEnvAndCwd) {
  const WorkerLaunch launch = MakeLaunch(R"(
printf '%s\n' "$@" > args.txt
printf '%s|%s|%s|%s\n' "$GH_TEST_VAR" "$RANK" "$WORLD_SIZE" "$LOCAL_RANK" > env.txt
echo '{"event":"run_end","status":"PASS","ts_ms":3}'
)");
  const AttemptEndReport end = RunWorker(launch, sink_);
  ASSERT_EQ(end.outcome, "finished") << end.reason;

  const auto dir = launch.attempt_dir;
  EXPECT_EQ(ReadFile(dir / "args.txt"), "--run-spec\n" + (dir / "run.json").string() +
                                            "\n--plugin\n" + launch.plugins[0].string() +
                                            "\n--plugin\n" + launch.plugins[1].string() + "\n");
  EXPECT_EQ(ReadFile(dir / "env.txt"), "hello world; $(not expanded)|0|1|0\n");

  const json run = json::parse(ReadFile(dir / "run.json"));
  EXPECT_EQ(run["spec_version"], 1);
  EXPECT_EQ(run["commit"], "abc");
  EXPECT_EQ(run["attempt"]["id"], 7);
  EXPECT_EQ(run["attempt"]["dir"], dir.string());
  EXPECT_EQ(run["attempt"]["checkout"]["head"], "abc");
  EXPECT_EQ(run["attempt"]["checkout"]["clean"], true);
  EXPECT_EQ(run["attempt"]["checkout"]["path"], (tmp_.path() / "checkout").string());
  EXPECT_EQ(run["attempt"]["agent"], "agent-under-test");
}

// Verifies that a worker exiting without run_end ends the attempt in error naming its code.
TEST_F(WorkerLauncherTest, ExitWithoutRunEndIsErrorNamingCode) {
  const WorkerLaunch launch = MakeLaunch(R"(
echo '{"event":"phase_start","phase":"identity","ts_ms":1}'
exit 3
)");
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason, "worker exited with code 3 before run_end");
  EXPECT_EQ(end.exit_code, 3);
  EXPECT_EQ(end.seq, 2);
  EXPECT_EQ(sink_.events.size(), 1u);
}

// Verifies that a worker killed by a signal is reported with the signal number.
TEST_F(WorkerLauncherTest, KilledWorkerNamesSignal) {
  const WorkerLaunch launch = MakeLaunch("kill -9 $$\n");
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason, "worker exited with code 137 (signal 9) before run_end");
}

// Verifies that a worker binary that does not exist ends the attempt in error, not a crash.
TEST_F(WorkerLauncherTest, MissingWorkerIsError) {
  WorkerLaunch launch = MakeLaunch("exit 0\n");
  launch.worker = tmp_.path() / "no-such-worker";
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_NE(end.reason.find("cannot start worker"), std::string::npos) << end.reason;
}

// Verifies that a spec env value that is not a string is refused before anything runs.
TEST_F(WorkerLauncherTest, NonStringEnvIsInvalidSpec) {
  WorkerLaunch launch = MakeLaunch("exit 0\n");
  launch.spec["env"] = {{"N", 3}};
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_NE(end.reason.find("env.N"), std::string::npos) << end.reason;
}

// Verifies line splitting across arbitrary chunk boundaries, CRLF, a final line without newline,
// and that JSON that is not an object with "event" stays text.
TEST(WorkerStdoutRelayTest, SplitsLinesAcrossChunks) {
  FakeAttemptSink sink;
  WorkerStdoutRelay relay(sink, 9);
  const std::string stream =
      "{\"event\":\"a\"}\n[1,2]\n{\"no_event\":1}\r\n{\"event\":\"run_end\",\"status\":\"PASS\"}\r\n"
      "not json\n\n{\"event\":\"tail\"}";
  for (size_t i = 0; i < stream.size(); i += 5) relay.Feed(std::string_view(stream).substr(i, 5));
  relay.Finish();

  ASSERT_EQ(sink.events.size(), 3u);
  EXPECT_EQ(sink.events[0].json, R"({"event":"a"})");
  EXPECT_EQ(sink.events[1].json, R"({"event":"run_end","status":"PASS"})");
  EXPECT_EQ(sink.events[2].json, R"({"event":"tail"})");
  EXPECT_EQ(sink.events[2].seq, 3);
  EXPECT_TRUE(relay.saw_run_end());
  EXPECT_EQ(relay.events_sent(), 3);
  EXPECT_EQ(sink.LogText("worker-stdout"), "[1,2]\n{\"no_event\":1}\r\nnot json\n\n");
}

}  // namespace
}  // namespace gatehouse::agent
