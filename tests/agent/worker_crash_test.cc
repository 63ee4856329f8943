// What the agent makes of a crashed rank (agent/worker_crash.h): which crashes are rerun, when two
// are the same, the rerun's phases, and the events that close the evidence.
#include "agent/worker_crash.h"

#include <csignal>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/phases.h"
#include "tests/common/sample_spec.h"

namespace gatehouse::agent {
namespace {

using nlohmann::json;

WorkerCrash Crash() {
  WorkerCrash c;
  c.rank = 1;
  c.world_size = 2;
  c.phase = "parallel";
  c.evidence_phase = "parallel";
  c.exit_code = 134;
  c.signal = SIGABRT;
  c.tail = "terminate called after throwing an instance of 'gloo::EnforceNotMet' | what(): "
           "op.preamble.length <= op.nbytes. 512 vs 384";
  c.last_line = "what(): op.preamble.length <= op.nbytes. 512 vs 384 at 0x7ffd1234";
  return c;
}

// Verifies only a rank that died by its own hand inside a phase (rank 0 inside one too) is rerun.
TEST(WorkerCrashTest, WorthARerunOnlyFromInsideAPhaseByItsOwnHand) {
  EXPECT_TRUE(WorthARerun(Crash(), /*oom_killed=*/false));
  EXPECT_FALSE(WorthARerun(Crash(), /*oom_killed=*/true));
  for (int outside : {SIGKILL, SIGTERM}) {
    WorkerCrash c = Crash();
    c.signal = outside;
    EXPECT_FALSE(WorthARerun(c, false)) << outside;
  }
  WorkerCrash between = Crash();
  between.phase.clear();
  EXPECT_FALSE(WorthARerun(between, false));
  WorkerCrash rank0_between = Crash();
  rank0_between.evidence_phase.clear();
  EXPECT_FALSE(WorthARerun(rank0_between, false));
  WorkerCrash exited = Crash();
  exited.signal = 0;
  exited.exit_code = 1;
  EXPECT_TRUE(WorthARerun(exited, false));
}

// Verifies two crashes are the same up to the addresses in the last line, and differ by rank,
// phase, exit, signal or the line's words.
TEST(WorkerCrashTest, SameCrashSetsAddressesAside) {
  WorkerCrash again = Crash();
  again.last_line = "what(): op.preamble.length <= op.nbytes. 512 vs 384 at 0x55aa";
  again.tail = "another tail";
  EXPECT_TRUE(SameCrash(Crash(), again));
  WorkerCrash other = Crash();
  other.last_line = "what(): op.preamble.length <= op.nbytes. 256 vs 384 at 0x7ffd1234";
  EXPECT_FALSE(SameCrash(Crash(), other));
  other = Crash();
  other.rank = 0;
  EXPECT_FALSE(SameCrash(Crash(), other));
  other = Crash();
  other.phase = "load";
  EXPECT_FALSE(SameCrash(Crash(), other));
  other = Crash();
  other.exit_code = 1;
  EXPECT_FALSE(SameCrash(Crash(), other));
  other = Crash();
  other.signal = SIGSEGV;
  EXPECT_FALSE(SameCrash(Crash(), other));
}

// Verifies the rerun keeps the requested phases up to the crashing one, in order.
TEST(WorkerCrashTest, RerunSpecCutsThePhasesAfterTheCrash) {
  CellSpec spec = testing::SampleSpec();
  spec.phases = {"identity", "config", "construct", "load", "inference", "parallel"};
  WorkerCrash c = Crash();
  c.phase = "load";
  EXPECT_EQ(RerunSpec(spec, c).phases,
            (std::vector<std::string>{"identity", "config", "construct", "load"}));
  EXPECT_EQ(RerunSpec(spec, Crash()).phases, spec.phases);
  EXPECT_EQ(RerunSpec(spec, c).model_family, spec.model_family);
}

// Verifies the closing events: the evidence phase FAIL adapter_contract naming rank, phase, exit
// and tail; each later phase of kPhases SKIPPED (requested or not); run_end FAIL.
TEST(WorkerCrashTest, CrashFailEventsCloseTheEvidence) {
  CellSpec spec = testing::SampleSpec();  // the default phases: all but performance
  WorkerCrash c = Crash();
  c.phase = "load";  // rank 1 died in load while rank 0 waited in parallel
  const std::vector<std::string> events = CrashFailEvents(c, spec, 42);
  const size_t parallel = *PhaseIndex("parallel");
  ASSERT_EQ(events.size(), 1 + (kPhases.size() - parallel - 1) + 1);
  const json fail = json::parse(events[0]);
  EXPECT_EQ(fail, (json{{"event", "phase_end"},
                        {"phase", "parallel"},
                        {"status", "FAIL"},
                        {"reason",
                         "rank 1 of 2 exited with code 134 (signal 6) in phase load, and again "
                         "when the agent reran phases up to load on the same inputs: a crash in "
                         "the adapter's code path; last stderr lines: " + c.tail},
                        {"classification", "adapter_contract"},
                        {"duration_ms", 0},
                        {"ts_ms", 42}}));
  EXPECT_EQ(json::parse(events[1])["phase"], "cuda_graph");
  EXPECT_EQ(json::parse(events[1])["reason"], "skipped: earlier phase parallel ended FAIL");
  EXPECT_EQ(json::parse(events[2])["phase"], "performance");
  EXPECT_EQ(json::parse(events[2])["reason"], "not requested");
  EXPECT_EQ(json::parse(events.back()), (json{{"event", "run_end"}, {"status", "FAIL"}, {"ts_ms", 42}}));
}

}  // namespace
}  // namespace gatehouse::agent
