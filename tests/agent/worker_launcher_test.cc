// Tests of the worker launch and of the relay of its output (docs/protocols.md §3, §4), with
// fake workers written as small shell scripts and a recording sink.
#include "agent/worker_launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent_test_util.h"
#include "fake_attempt_sink.h"
#include "tests/common/sample_spec.h"

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
    launch.spec = gatehouse::testing::SampleSpec();
    launch.spec.env = {{"GH_TEST_VAR", "hello world; $(not expanded)"}};
    launch.checkout = {"abc", true, tmp_.path() / "checkout"};
    launch.plugins = {tmp_.path() / "build" / "libone.so", tmp_.path() / "build" / "libtwo.so"};
    launch.worker = worker;
    launch.agent_name = "agent-under-test";
    return launch;
  }

  // A launch of attempt 7 with topology {"tp": tp} whose every rank runs the script `body`.
  WorkerLaunch MakeGroupLaunch(int tp, const std::string& body) {
    WorkerLaunch launch = MakeLaunch(body);
    launch.spec.topology.tp = tp;
    return launch;
  }

  // The pid a fake worker wrote to `pid.<rank>` in the attempt dir (0 when none).
  static pid_t RankPid(const WorkerLaunch& launch, int rank) {
    const std::string text = ReadFile(launch.attempt_dir / ("pid." + std::to_string(rank)));
    return text.empty() ? 0 : static_cast<pid_t>(std::stol(text));
  }

  // Expects rank `rank`'s process (its pid file) to be gone: kill(pid, 0) fails with ESRCH.
  static void ExpectGone(const WorkerLaunch& launch, int rank) {
    const pid_t pid = RankPid(launch, rank);
    ASSERT_GT(pid, 0) << "rank " << rank << " wrote no pid";
    errno = 0;
    EXPECT_EQ(::kill(pid, 0), -1) << "rank " << rank << " (pid " << pid << ") is still alive";
    EXPECT_EQ(errno, ESRCH) << "rank " << rank;
  }

  // Runs a tp-rank group whose ranks report their environment, write one stderr line, one text
  // line and two events each, and checks everything arrives on the right stream.
  void ExpectGroupRelay(int tp) {
    WorkerLaunch launch = MakeGroupLaunch(tp, R"(
printf '%s|%s|%s|%s|%s|%s|%s\n' "$RANK" "$WORLD_SIZE" "$LOCAL_RANK" "$LOCAL_WORLD_SIZE" \
  "$MASTER_ADDR" "$MASTER_PORT" "$GH_TEST_VAR" > "env.$RANK.txt"
echo "{\"event\":\"phase_start\",\"phase\":\"identity\",\"rank\":$RANK}"
echo "stderr of rank $RANK" >&2
echo "text of rank $RANK"
echo "{\"event\":\"run_end\",\"status\":\"PASS\",\"rank\":$RANK}"
)");
    // The spec's own values for rank variables lose to the agent's.
    launch.spec.env["RANK"] = "99";
    launch.spec.env["MASTER_PORT"] = "1";
    const AttemptEndReport end = RunWorker(launch, sink_);
    EXPECT_EQ(end.outcome, "finished") << end.reason;
    EXPECT_EQ(end.exit_code, 0);
    EXPECT_EQ(end.seq, 2 * tp + 1);

    ASSERT_EQ(sink_.events.size(), static_cast<size_t>(2 * tp));
    std::set<std::string> jsons;
    std::map<int, std::vector<std::string>> per_rank;  // rank -> its events in seq order
    for (size_t i = 0; i < sink_.events.size(); ++i) {
      EXPECT_EQ(sink_.events[i].seq, static_cast<int64_t>(i + 1));
      jsons.insert(sink_.events[i].json);
      const json e = json::parse(sink_.events[i].json);
      per_rank[e["rank"].get<int>()].push_back(e["event"].get<std::string>());
    }
    EXPECT_EQ(jsons.size(), static_cast<size_t>(2 * tp)) << "an event was relayed twice";

    std::set<std::string> ports;
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      // Relayed verbatim, in each rank's own order.
      EXPECT_TRUE(jsons.contains(R"({"event":"run_end","status":"PASS","rank":)" +
                                 std::to_string(r) + "}"));
      EXPECT_EQ(per_rank[r], (std::vector<std::string>{"phase_start", "run_end"}));
      EXPECT_EQ(sink_.LogText(RankLogStream("worker", r)),
                "stderr of rank " + std::to_string(r) + "\n");
      EXPECT_EQ(sink_.LogText(RankLogStream("worker-stdout", r)),
                "text of rank " + std::to_string(r) + "\n");
      std::string env = ReadFile(launch.attempt_dir / ("env." + std::to_string(r) + ".txt"));
      const std::string rank = std::to_string(r);
      const std::string n = std::to_string(tp);
      const std::string prefix = rank + "|" + n + "|" + rank + "|" + n + "|127.0.0.1|";
      ASSERT_EQ(env.substr(0, prefix.size()), prefix) << env;
      env.erase(0, prefix.size());
      const std::string port = env.substr(0, env.find('|'));
      EXPECT_EQ(env.substr(port.size()), "|hello world; $(not expanded)\n");
      ports.insert(port);
      EXPECT_GE(std::stoi(port), 1024);
      EXPECT_LE(std::stoi(port), 65535);
    }
    EXPECT_EQ(ports.size(), 1u) << "ranks saw different MASTER_PORTs";
    EXPECT_EQ(sink_.LogText("worker.rank" + std::to_string(tp)), "");
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
  EXPECT_EQ(run["commit"], launch.spec.commit);
  json cell = run;
  cell.erase("attempt");
  EXPECT_EQ(ParseCellSpec(cell).value(), launch.spec);  // the spec, unchanged
  EXPECT_EQ(run["attempt"]["id"], 7);
  EXPECT_EQ(run["attempt"]["dir"], dir.string());
  EXPECT_EQ(run["attempt"]["checkout"]["head"], "abc");
  EXPECT_EQ(run["attempt"]["checkout"]["clean"], true);
  EXPECT_EQ(run["attempt"]["checkout"]["path"], (tmp_.path() / "checkout").string());
  EXPECT_EQ(run["attempt"]["agent"], "agent-under-test");
}

// A worker body that records the CUDA_VISIBLE_DEVICES each rank sees in visible.<rank>.txt.
constexpr const char* kRecordVisibleDevices = R"(
printf '%s\n' "${CUDA_VISIBLE_DEVICES-unset}" > visible.$RANK.txt
echo '{"event":"run_end","status":"PASS","ts_ms":3}'
)";

// Verifies the GPUs each rank sees on an agent with four GPUs: a cuda cell at tp=2 gets the
// first two (over a CUDA_VISIBLE_DEVICES in the spec's env), a CPU cell none; a cuda cell
// needing more GPUs than the agent has ends in error naming both counts, before any rank starts.
TEST_F(WorkerLauncherTest, CudaCellSeesOneGpuPerRank) {
  const std::string body = kRecordVisibleDevices;
  WorkerLaunch launch = MakeGroupLaunch(2, body);
  launch.gpu_indices = {0, 1, 2, 3};
  launch.spec.runtime.device = "cuda";
  launch.spec.env["CUDA_VISIBLE_DEVICES"] = "3";
  ASSERT_EQ(RunWorker(launch, sink_).outcome, "finished");
  EXPECT_EQ(ReadFile(launch.attempt_dir / "visible.0.txt"), "0,1\n");
  EXPECT_EQ(ReadFile(launch.attempt_dir / "visible.1.txt"), "0,1\n");

  launch.spec.runtime.device = "cpu";
  ASSERT_EQ(RunWorker(launch, sink_).outcome, "finished");
  EXPECT_EQ(ReadFile(launch.attempt_dir / "visible.0.txt"), "\n");

  WorkerLaunch no_gpus = MakeLaunch(body);
  ASSERT_EQ(RunWorker(no_gpus, sink_).outcome, "finished");
  EXPECT_EQ(ReadFile(no_gpus.attempt_dir / "visible.0.txt"), "unset\n");

  WorkerLaunch too_big = MakeGroupLaunch(4, body);
  too_big.gpu_indices = {5, 6};
  too_big.spec.runtime.device = "cuda";
  too_big.attempt_dir = tmp_.path() / "attempts" / "8";
  const AttemptEndReport end = RunWorker(too_big, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason, "the cell needs 4 GPUs (one per rank) but this agent has 2");
  EXPECT_FALSE(std::filesystem::exists(too_big.attempt_dir / "visible.0.txt"));
}

// Verifies a cell pinning runtime.gpu_model on a node that mixes models sees only GPUs of that
// model (case-insensitive substring, as the scheduler matches), and that a pin the node cannot
// meet ends in error before any rank starts.
TEST_F(WorkerLauncherTest, APinnedGpuModelGetsOnlyGpusOfThatModel) {
  const std::string body = kRecordVisibleDevices;
  WorkerLaunch launch = MakeGroupLaunch(2, body);
  launch.gpu_indices = {0, 1, 2, 3};
  launch.gpu_models = {"NVIDIA A100-SXM4-80GB", "NVIDIA H200", "NVIDIA A100-SXM4-80GB",
                       "NVIDIA H200"};
  launch.spec.runtime.device = "cuda";
  launch.spec.runtime.gpu_model = "h200";
  ASSERT_EQ(RunWorker(launch, sink_).outcome, "finished");
  EXPECT_EQ(ReadFile(launch.attempt_dir / "visible.0.txt"), "1,3\n");
  EXPECT_EQ(ReadFile(launch.attempt_dir / "visible.1.txt"), "1,3\n");

  launch.spec.runtime.gpu_model = "B200";
  launch.attempt_dir = tmp_.path() / "attempts" / "9";
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason, "the cell needs 2 B200 GPUs (one per rank) but this agent has 0");
}

// Verifies that a worker exiting without run_end ends the attempt in error naming its code and
// the phase it had started.
TEST_F(WorkerLauncherTest, ExitWithoutRunEndIsErrorNamingCode) {
  const WorkerLaunch launch = MakeLaunch(R"(
echo '{"event":"phase_start","phase":"identity","ts_ms":1}'
exit 3
)");
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason, "worker exited with code 3 before run_end in phase identity");
  EXPECT_EQ(end.exit_code, 3);
  EXPECT_EQ(end.seq, 2);
  EXPECT_EQ(sink_.events.size(), 1u);
}

// Verifies that a worker dying of its own error says where and why: the phase it was in and the
// last lines of its standard error (a Python traceback's, the error line last), not only its
// exit code; the phases it ended are not blamed.
TEST_F(WorkerLauncherTest, ACrashNamesItsPhaseAndItsLastStderrLines) {
  const WorkerLaunch launch = MakeLaunch(R"(
echo '{"event":"phase_start","phase":"config","ts_ms":1}'
echo '{"event":"phase_end","phase":"config","status":"PASS","ts_ms":2}'
echo '{"event":"phase_start","phase":"tensor_parallel","ts_ms":3}'
echo 'loading shards' >&2
for i in 1 2 3 4 5 6 7 8; do echo "noise $i" >&2; done
printf 'Traceback (most recent call last):
  File "model.py", line 3, in forward

' >&2
printf 'RuntimeError: [enforce fail at gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. 512 vs 384
' >&2
exit 1
)");
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason,
            "worker exited with code 1 before run_end in phase tensor_parallel; its last stderr "
            "lines: noise 6 | noise 7 | noise 8 | Traceback (most recent call last): | "
            "File \"model.py\", line 3, in forward | RuntimeError: [enforce fail at "
            "gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. 512 vs 384");
}

// Verifies that in a group the dying rank's cause is the one reported, with its phase, while the
// ranks stopped after it are only named.
TEST_F(WorkerLauncherTest, ARankCrashNamesThatRanksPhaseAndLastStderrLines) {
  const WorkerLaunch launch = MakeGroupLaunch(2, R"(
echo $$ > "pid.$RANK"
echo "rank $RANK starting" >&2
if [ "$RANK" = 1 ]; then
  echo '{"event":"phase_start","phase":"tensor_parallel","rank":1}'
  i=0
  while [ ! -s pid.0 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
  echo "terminate called after throwing an instance of 'gloo::EnforceNotMet'" >&2
  printf '  what():  op.preamble.length <= op.nbytes. 512 vs 384' >&2
  kill -6 $$
fi
exec sleep 30
)");
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason,
            "rank 1 of 2 exited with code 134 (signal 6) before run_end in phase tensor_parallel; "
            "rank 0 stopped; rank 1's last stderr lines: rank 1 starting | terminate called "
            "after throwing an instance of 'gloo::EnforceNotMet' | what():  "
            "op.preamble.length <= op.nbytes. 512 vs 384");
  EXPECT_EQ(end.exit_code, 134);
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

// Verifies a tp=2 group: torchrun variables and one MASTER_PORT for every rank, the spec's env
// kept but losing to the rank variables, one event sequence, per-rank streams, outcome finished.
TEST_F(WorkerLauncherTest, TensorParallelTwoRanksRelayEveryRank) { ExpectGroupRelay(2); }

// Verifies the same with tp=4.
TEST_F(WorkerLauncherTest, TensorParallelFourRanksRelayEveryRank) { ExpectGroupRelay(4); }

// Verifies the issue's requirement: a rank crash ends the attempt naming the rank. Rank 2 of 4
// is killed by SIGKILL while the others sleep for 30 s: RunWorker returns at once, the reason
// names rank 2 and signal 9 (the stopped ranks are not blamed), and no other rank is left.
TEST_F(WorkerLauncherTest, RankCrashEndsTheAttemptNamingTheRank) {
  const WorkerLaunch launch = MakeGroupLaunch(4, R"(
echo $$ > "pid.$RANK"
if [ "$RANK" = 2 ]; then
  echo '{"event":"phase_start","phase":"identity","rank":2}'
  i=0
  while { [ ! -s pid.0 ] || [ ! -s pid.1 ] || [ ! -s pid.3 ]; } && [ $i -lt 100 ]; do
    sleep 0.05; i=$((i+1))
  done
  kill -9 $$
fi
exec sleep 30
)");
  const auto start = std::chrono::steady_clock::now();
  const AttemptEndReport end =
      RunWorker(launch, sink_, CancelToken{nullptr, std::chrono::seconds(5)});
  const auto elapsed = std::chrono::steady_clock::now() - start;

  EXPECT_LT(elapsed, std::chrono::seconds(8));
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason,
            "rank 2 of 4 exited with code 137 (signal 9) before run_end in phase identity; "
            "ranks 0, 1, 3 stopped");
  EXPECT_EQ(end.exit_code, 137);
  EXPECT_EQ(end.seq, 2);
  ASSERT_EQ(sink_.events.size(), 1u);
  EXPECT_EQ(sink_.events[0].json, R"({"event":"phase_start","phase":"identity","rank":2})");
  for (int r = 0; r < 4; ++r) ExpectGone(launch, r);
}

// Verifies that a rank exiting 0 without run_end, while the others keep running, ends the group
// naming that rank.
TEST_F(WorkerLauncherTest, RankExitingWithoutRunEndStopsTheGroup) {
  const WorkerLaunch launch = MakeGroupLaunch(2, R"(
echo $$ > "pid.$RANK"
if [ "$RANK" = 1 ]; then
  i=0
  while [ ! -s pid.0 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
  exit 0
fi
exec sleep 30
)");
  const auto start = std::chrono::steady_clock::now();
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason, "rank 1 of 2 exited with code 0 before run_end; rank 0 stopped");
  EXPECT_EQ(end.exit_code, 0);
  ExpectGone(launch, 0);
  ExpectGone(launch, 1);
}

// Verifies that a rank that ignores SIGTERM is killed with SIGKILL after the token's grace.
TEST_F(WorkerLauncherTest, StoppedRankIgnoringSigtermIsKilled) {
  const WorkerLaunch launch = MakeGroupLaunch(2, R"(
if [ "$RANK" = 1 ]; then
  i=0
  while [ ! -s pid.0 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
  exit 3
fi
trap '' TERM
echo $$ > pid.0
while :; do sleep 0.1; done
)");
  const auto start = std::chrono::steady_clock::now();
  const AttemptEndReport end =
      RunWorker(launch, sink_, CancelToken{nullptr, std::chrono::milliseconds(300)});
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, std::chrono::milliseconds(300));
  EXPECT_LT(elapsed, std::chrono::seconds(8));
  EXPECT_EQ(end.reason, "rank 1 of 2 exited with code 3 before run_end; rank 0 stopped");
  ExpectGone(launch, 0);
}

// Verifies that an external cancel stops every rank and says so.
TEST_F(WorkerLauncherTest, CancelStopsEveryRank) {
  const WorkerLaunch launch = MakeGroupLaunch(3, R"(
echo $$ > "pid.$RANK"
exec sleep 30
)");
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    for (int i = 0; i < 200; ++i) {
      if (RankPid(launch, 0) > 0 && RankPid(launch, 1) > 0 && RankPid(launch, 2) > 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    cancel = true;
  });
  const auto start = std::chrono::steady_clock::now();
  const AttemptEndReport end =
      RunWorker(launch, sink_, CancelToken{&cancel, std::chrono::seconds(5)});
  canceller.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason, "ranks 0, 1, 2 of 3 stopped before run_end (cancelled)");
  for (int r = 0; r < 3; ++r) ExpectGone(launch, r);
}

// Verifies that ranks disagreeing on the run_end status (or exiting non-zero after it) still
// finish, with a note on rank 0's stream "worker".
TEST_F(WorkerLauncherTest, RunEndStatusDisagreementIsNotedOnWorkerStream) {
  const WorkerLaunch launch = MakeGroupLaunch(2, R"(
if [ "$RANK" = 0 ]; then
  echo '{"event":"run_end","status":"PASS"}'
  printf 'rank 0 log without newline' >&2
  touch done.0
  exit 0
fi
echo '{"event":"run_end","status":"FAIL","rank":1}'
i=0
while [ ! -f done.0 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
exit 5
)");
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "finished") << end.reason;
  EXPECT_EQ(end.seq, 3);
  EXPECT_EQ(sink_.LogText("worker"),
            "rank 0 log without newline\n"
            "gatehouse-agent: rank 1 of 2 ended with run_end status 'FAIL', rank 0 with 'PASS'; "
            "rank 0's events are the evidence\n"
            "gatehouse-agent: rank 1 of 2 exited with code 5 after run_end\n");
}

// Verifies that a group whose worker cannot start names a rank.
TEST_F(WorkerLauncherTest, GroupWithMissingWorkerNamesARank) {
  WorkerLaunch launch = MakeGroupLaunch(2, "exit 0\n");
  launch.worker = tmp_.path() / "no-such-worker";
  const AttemptEndReport end = RunWorker(launch, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason.rfind("cannot start rank ", 0), 0u) << end.reason;
  EXPECT_NE(end.reason.find(" of 2: "), std::string::npos) << end.reason;
}

// Verifies the rank variables: exactly RANK/WORLD_SIZE/LOCAL_RANK for one rank, torchrun's set
// for more, after (and so winning over) the spec's env; and the per-rank stream names.
TEST(WorkerEnvironmentTest, RankVariables) {
  CellSpec spec = gatehouse::testing::SampleSpec();
  spec.env = {{"A", "x"}, {"RANK", "7"}};
  using Env = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(WorkerEnvironment(spec),
            (Env{{"A", "x"},
                 {"RANK", "7"},
                 {"RANK", "0"},
                 {"WORLD_SIZE", "1"},
                 {"LOCAL_RANK", "0"}}));
  EXPECT_EQ(WorkerEnvironment(spec, 1, 2, 29500),
            (Env{{"A", "x"},
                 {"RANK", "7"},
                 {"RANK", "1"},
                 {"WORLD_SIZE", "2"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(RankLogStream("worker", 0), "worker");
  EXPECT_EQ(RankLogStream("worker", 3), "worker.rank3");
  EXPECT_EQ(RankLogStream("worker-stdout", 1), "worker-stdout.rank1");
}

// Verifies the free-port helper returns a port in 1..65535 that can be bound on 127.0.0.1.
TEST(FindFreePortTest, PortCanBeBound) {
  const auto port = FindFreePort();
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  EXPECT_GE(*port, 1);
  EXPECT_LE(*port, 65535);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  EXPECT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  ::close(fd);
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

// Verifies the phase a worker is in: set by phase_start, cleared by its phase_end.
TEST(WorkerStdoutRelayTest, TracksThePhaseInProgress) {
  FakeAttemptSink sink;
  WorkerStdoutRelay relay(sink, 9);
  EXPECT_EQ(relay.current_phase(), "");
  relay.Feed("{\"event\":\"phase_start\",\"phase\":\"load\"}\n");
  EXPECT_EQ(relay.current_phase(), "load");
  relay.Feed("{\"event\":\"phase_end\",\"phase\":\"load\",\"status\":\"PASS\"}\n");
  EXPECT_EQ(relay.current_phase(), "");
}

// Verifies what TailLines keeps: the last kMaxLines non-blank lines, surrounding blanks and CR
// removed, the unfinished last line included, a long line cut to its end.
TEST(TailLinesTest, KeepsTheLastLinesAndTheEndOfALongOne) {
  TailLines tail;
  EXPECT_EQ(tail.Summary(), "");
  tail.Feed("one\r\n\n   \ntwo  \nthr");
  tail.Feed("ee\nfour\nfive\nsix\nseven\nunfinished");
  EXPECT_EQ(tail.Summary(), "three | four | five | six | seven | unfinished");
  tail.Feed("\n" + std::string(1000, 'x') + "END\n");
  EXPECT_EQ(tail.Summary(), "four | five | six | seven | unfinished | ..." +
                                std::string(TailLines::kMaxLineBytes - 3, 'x') + "END");
  // An endless line without a newline keeps its end too.
  TailLines endless;
  for (int i = 0; i < 100; ++i) endless.Feed(std::string(100, 'y'));
  endless.Feed("Z");
  const std::string s = endless.Summary();
  EXPECT_EQ(s.size(), TailLines::kMaxLineBytes + 3);
  EXPECT_EQ(s.back(), 'Z');
}

}  // namespace
}  // namespace gatehouse::agent
