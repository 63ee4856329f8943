// Verifies the scheduler (pure logic) and the attempt transition table.
#include "controller/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "controller/attempt_state.h"
#include "tests/common/sample_spec.h"

namespace gatehouse::controller {
namespace {

using ::testing::HasSubstr;
using ::gatehouse::testing::SampleSpec;
using ::gatehouse::testing::SampleSpecJson;

std::vector<QueuedAttempt> Queue(std::initializer_list<int64_t> ids) {
  std::vector<QueuedAttempt> q;
  for (int64_t id : ids) q.push_back({id, "cell-" + std::to_string(id), SampleSpecJson()});
  return q;
}

TEST(SchedulerTest, PlacesAttemptsFirstInFirstOut) {
  // Verifies the oldest queued attempt is placed first (one single-slot agent).
  auto placements = Schedule(Queue({7, 3, 9}), {{"a", 1, 0}});
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].attempt_id, 7);
  EXPECT_EQ(placements[0].cell_id, "cell-7");
  EXPECT_EQ(placements[0].agent_id, "a");
}

TEST(SchedulerTest, FillsFreeSlotsAndSpreadsLoad) {
  // Verifies agents get at most their free slots, the most free agent first.
  // a has 2 free of 3, b has 1 free of 1: 3 placements, the most free agent first.
  auto placements = Schedule(Queue({1, 2, 3, 4}), {{"a", 3, 1}, {"b", 1, 0}});
  ASSERT_EQ(placements.size(), 3u);
  EXPECT_EQ(placements[0].agent_id, "a");
  EXPECT_EQ(placements[1].agent_id, "a");  // a:1 free, b:1 free -> the earlier agent
  EXPECT_EQ(placements[2].agent_id, "b");
  EXPECT_EQ(placements[2].attempt_id, 3);
}

TEST(SchedulerTest, NoPlacementWithoutFreeSlotsOrAgents) {
  // Verifies nothing is placed without agents, free slots or queued attempts.
  EXPECT_TRUE(Schedule(Queue({1}), {}).empty());
  EXPECT_TRUE(Schedule(Queue({1}), {{"a", 2, 2}}).empty());
  EXPECT_TRUE(Schedule({}, {{"a", 2, 0}}).empty());
  // Slots <= 0 count as one.
  EXPECT_EQ(Schedule(Queue({1, 2}), {{"a", 0, 0}}).size(), 1u);
}

/// A queued CPU attempt of `submitter` on `repository` with `priority`.
QueuedAttempt Of(int64_t id, const std::string& submitter, int priority = 0,
                 const std::string& repository = "repo") {
  return {id, "cell-" + std::to_string(id), SampleSpecJson(), priority, submitter, repository};
}

TEST(SchedulerTest, HigherPriorityGoesFirst) {
  auto placements = Schedule({Of(1, "ci", 0), Of(2, "ci", 5), Of(3, "ci", -1)}, {{"a", 1, 0}});
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].attempt_id, 2);
  placements = Schedule({Of(1, "ci", 0), Of(2, "ci", 5), Of(3, "ci", -1)}, {{"a", 3, 0}});
  ASSERT_EQ(placements.size(), 3u);
  EXPECT_EQ(placements[1].attempt_id, 1);
  EXPECT_EQ(placements[2].attempt_id, 3);
}

TEST(SchedulerTest, SubmittersTakeTurnsWithinAPriority) {
  // alice queued three before bob's one: with two slots, one each.
  const std::vector<QueuedAttempt> queue = {Of(1, "alice"), Of(2, "alice"), Of(3, "alice"),
                                            Of(4, "bob")};
  auto placements = Schedule(queue, {{"a", 2, 0}});
  ASSERT_EQ(placements.size(), 2u);
  EXPECT_EQ(placements[0].attempt_id, 1);
  EXPECT_EQ(placements[1].attempt_id, 4);
  // Work already running counts: alice runs one, so bob goes first for the single slot.
  RunningLoad load;
  load.by_submitter["alice"] = 1;
  placements = Schedule(queue, {{"a", 2, 1}}, nullptr, {}, load);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].attempt_id, 4);
  // Within one submitter: first in, first out.
  placements = Schedule({Of(9, "alice"), Of(3, "alice")}, {{"a", 1, 0}});
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].attempt_id, 9);
}

TEST(SchedulerTest, PerRepositoryLimitHoldsBackOnlyThatRepository) {
  SchedulingPolicy policy;
  policy.max_running_per_repository = 1;
  RunningLoad load;
  load.by_repository["/repos/a"] = 1;
  std::vector<Waiting> waiting;
  auto placements = Schedule({Of(1, "ci", 0, "/repos/a"), Of(2, "ci", 0, "/repos/b"),
                              Of(3, "ci", 0, "/repos/b")},
                             {{"x", 4, 1}}, &waiting, policy, load);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].attempt_id, 2);  // b's second waits for b's first
  ASSERT_EQ(waiting.size(), 2u);
  EXPECT_EQ(waiting[0].reason,
            "repository /repos/a already runs 1 attempts, its limit (--max-running-per-repository)");
  EXPECT_THAT(waiting[1].reason, HasSubstr("repository /repos/b already runs 1"));
}

TEST(SchedulerTest, AGpuModelPinNeedsThatModel) {
  QueuedAttempt h200 = Of(1, "ci");
  CellSpec spec = SampleSpec();
  spec.runtime.device = "cuda";
  spec.runtime.gpu_model = "h200";
  h200.spec_json = CanonicalSpecJson(spec);
  AgentView a100{"a100-node", 4, 0, 2, 0};
  a100.gpu_models = {"NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"};
  AgentView h{"h200-node", 4, 0, 1, 0};
  h.gpu_models = {"NVIDIA H200"};
  auto placements = Schedule({h200}, {a100, h});
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].agent_id, "h200-node");
  spec.runtime.gpu_model = "H200";
  spec.topology.tp = 2;
  h200.spec_json = CanonicalSpecJson(spec);
  std::vector<Waiting> waiting;
  EXPECT_TRUE(Schedule({h200}, {a100, h}, &waiting).empty());
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_THAT(waiting[0].reason, HasSubstr("a100-node: 0 H200 GPUs (the cell pins H200, needs 2)"));
  EXPECT_THAT(waiting[0].reason, HasSubstr("h200-node: 1 H200 GPU (the cell pins H200, needs 2)"));
}

TEST(SchedulerTest, CpuCellsPreferCpuLaneAgents) {
  AgentView gpu{"gpu-node", 8, 0, 8, 0};
  gpu.lane = "gpu";
  AgentView cpu{"cpu-node", 1, 0};
  cpu.lane = "cpu";
  auto placements = Schedule({Of(1, "ci"), Of(2, "ci")}, {gpu, cpu});
  ASSERT_EQ(placements.size(), 2u);
  EXPECT_EQ(placements[0].agent_id, "cpu-node");
  EXPECT_EQ(placements[1].agent_id, "gpu-node");  // the CPU lane is full: overflow is fine
}

TEST(SchedulerTest, AWaitingReasonGroupsAgentsThatMisfitAlike) {
  // Five draining agents for one reason and one with a torch mismatch: one clause per reason,
  // at most three names each, so a reason stays short with a thousand agents.
  std::vector<AgentView> agents;
  for (int i = 0; i < 5; ++i) {
    AgentView a{"d" + std::to_string(i), 1, 0};
    a.drain_reason = "cleanup failed";
    agents.push_back(a);
  }
  agents.push_back({"old", 1, 0, 0, 0, "2.9.0"});
  std::vector<Waiting> waiting;
  QueuedAttempt attempt = Of(1, "ci");
  EXPECT_TRUE(Schedule({attempt}, agents, &waiting).empty());
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_EQ(waiting[0].reason,
            "d0, d1, d2 and 2 more: draining (cleanup failed); old: torch 2.9.0 (the cell pins "
            "2.11.0)");
}

TEST(SchedulerTest, ADrainingAgentTakesNothingAndQueuedCellsSayWhy) {
  AgentView draining{"a", 4, 0};
  draining.drain_reason = "cleanup after attempt 7: 1 leftover process: pid 42 (sleep)";
  std::vector<Waiting> waiting;
  EXPECT_TRUE(Schedule(Queue({1}), {draining}, &waiting).empty());
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_EQ(waiting[0].reason,
            "a: draining (cleanup after attempt 7: 1 leftover process: pid 42 (sleep))");
  // The healthy agent beside it takes the work.
  auto placements = Schedule(Queue({1, 2}), {draining, {"b", 1, 0}}, &waiting);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].agent_id, "b");
}

/// A queued attempt whose cell runs on `device` with topology tp and torch pin `torch`.
QueuedAttempt Cell(int64_t id, const std::string& device, int tp, const std::string& torch = "2.11.0") {
  CellSpec spec = SampleSpec();
  spec.runtime.torch = torch;
  spec.runtime.device = device;
  spec.topology.tp = tp;
  return {id, "cell-" + std::to_string(id), CanonicalSpecJson(spec)};
}

AgentView Gpu(const std::string& id, int gpus, int gpus_in_use = 0, int slots = 4,
              const std::string& torch = "2.11.0") {
  return {id, slots, 0, gpus, gpus_in_use, torch};
}

TEST(SchedulerTest, DemandComesFromTheSpec) {
  // Verifies the demand read from a frozen spec: device, ranks (tp x dp x pp) and the pin.
  const Demand d = DemandOfSpec(Cell(1, "cuda", 4).spec_json);
  EXPECT_TRUE(d.gpu);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.torch, "2.11.0");
  const Demand cpu = DemandOfSpec(Cell(1, "cpu", 2).spec_json);
  EXPECT_FALSE(cpu.gpu);
  EXPECT_EQ(cpu.world_size, 2);
  const Demand bad = DemandOfSpec("not json");
  EXPECT_FALSE(bad.gpu);
  EXPECT_EQ(bad.world_size, 1);
  EXPECT_THAT(bad.invalid, HasSubstr("spec is not valid JSON"));
}

TEST(SchedulerTest, ACellWhoseStoredSpecDoesNotParseWaitsSayingWhy) {
  // A spec stored before a limit existed (training.steps past kMaxTrainingSteps) is not
  // handed to an agent that would refuse it; its waiting reason names the field.
  nlohmann::json spec = nlohmann::json::parse(SampleSpecJson());
  spec["training"]["steps"] = 1000000000;
  const QueuedAttempt attempt{1, "cell-1", spec.dump()};
  std::vector<Waiting> waiting;
  EXPECT_TRUE(Schedule({attempt}, {{"a", 4, 0}}, &waiting).empty());
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_THAT(waiting[0].reason, HasSubstr("a: the cell's spec is invalid (field "
                                           "'training.steps': expected an integer from 2 to "
                                           "1000, got 1000000000)"));
}

TEST(SchedulerTest, CudaAttemptNeedsOneFreeGpuPerRank) {
  // Verifies a tp=2 CUDA attempt goes only to an agent with 2 free GPUs, and GPUs placed in
  // this round count: the second tp=2 attempt does not fit the same 3-GPU agent.
  std::vector<Waiting> waiting;
  auto placements = Schedule({Cell(1, "cuda", 2), Cell(2, "cuda", 2)},
                             {Gpu("one-gpu", 1), Gpu("three-gpus", 3, 0)}, &waiting);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].attempt_id, 1);
  EXPECT_EQ(placements[0].agent_id, "three-gpus");
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_EQ(waiting[0].attempt_id, 2);
  EXPECT_EQ(waiting[0].reason,
            "one-gpu: 1 of 1 GPUs free, needs 2; three-gpus: 1 of 3 GPUs free, needs 2");
}

TEST(SchedulerTest, GpusHeldByRunningAttemptsAreNotFree) {
  // Verifies GPUs in use by running attempts are not offered again.
  std::vector<Waiting> waiting;
  EXPECT_TRUE(Schedule({Cell(1, "cuda", 1)}, {Gpu("busy", 2, 2)}, &waiting).empty());
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_EQ(waiting[0].reason, "busy: 0 of 2 GPUs free, needs 1");
}

TEST(SchedulerTest, RuntimePinMustMatch) {
  // Verifies an agent whose torch differs from the pin is skipped (with the reason), and an
  // agent that reports no torch version is not matched against pins.
  std::vector<Waiting> waiting;
  auto placements = Schedule({Cell(1, "cpu", 1, "2.11.0")},
                             {Gpu("old", 0, 0, 4, "2.10.0"), Gpu("unknown", 0, 0, 1, "")}, &waiting);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].agent_id, "unknown");
  EXPECT_TRUE(Schedule({Cell(1, "cpu", 1, "2.11.0")}, {Gpu("old", 0, 0, 4, "2.10.0")}, &waiting).empty());
  EXPECT_EQ(waiting.back().reason, "old: torch 2.10.0 (the cell pins 2.11.0)");
}

TEST(SchedulerTest, CudaPinMustMatchTheAgentsCuda) {
  // Verifies a cell pinning runtime.cuda goes only to an agent reporting that CUDA version,
  // and that an agent reporting none is named as such; an unpinned cell takes any agent.
  CellSpec spec = SampleSpec();
  spec.runtime.cuda = "13.0";
  const QueuedAttempt pinned{1, "cell-1", CanonicalSpecJson(spec)};
  EXPECT_EQ(DemandOfSpec(pinned.spec_json).cuda, "13.0");
  AgentView cu12{"cu12", 1, 0, 0, 0, "2.11.0", "12.8"};
  AgentView none{"none", 1, 0, 0, 0, "2.11.0", ""};
  AgentView cu13{"cu13", 1, 0, 0, 0, "2.11.0", "13.0"};
  std::vector<Waiting> waiting;
  EXPECT_TRUE(Schedule({pinned}, {cu12, none}, &waiting).empty());
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_THAT(waiting[0].reason, HasSubstr("cu12: CUDA 12.8 (the cell pins 13.0)"));
  EXPECT_THAT(waiting[0].reason, HasSubstr("none: no CUDA reported (the cell pins 13.0)"));
  auto placed = Schedule({pinned}, {cu12, cu13});
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].agent_id, "cu13");
  EXPECT_EQ(Schedule({Cell(2, "cpu", 1)}, {cu12}).size(), 1u);
}

TEST(SchedulerTest, UnfitAttemptDoesNotHoldBackLaterOnes) {
  // Verifies a CUDA attempt no agent can take stays queued while a later CPU attempt runs;
  // CPU attempts of several ranks need no GPU.
  std::vector<Waiting> waiting;
  auto placements = Schedule({Cell(1, "cuda", 8), Cell(2, "cpu", 4)}, {Gpu("cpu-box", 0)}, &waiting);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].attempt_id, 2);
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_EQ(waiting[0].attempt_id, 1);
  EXPECT_EQ(waiting[0].reason, "cpu-box: 0 of 0 GPUs free, needs 8");
  waiting.clear();
  EXPECT_TRUE(Schedule({Cell(3, "cpu", 1)}, {}, &waiting).empty());
  EXPECT_EQ(waiting.at(0).reason, "no agent connected");
}

/// A demand of SampleSpec() with one process of `role` needing `host` bytes (x `count`).
Demand MemoryDemand(int64_t host, int count = 1, std::string role = std::string(kWorkerRankRole)) {
  Demand d = DemandOf(SampleSpec());
  d.memory.processes.push_back({std::move(role), count, host, 0, "formula"});
  return d;
}

/// A CPU agent with `slots` and a node of `memory` bytes.
AgentView MemoryAgent(const std::string& id, int64_t memory, int slots = 1) {
  AgentView a;
  a.agent_id = id;
  a.slots = slots;
  a.memory_bytes = memory;
  return a;
}

TEST(SchedulerMemoryTest, ACellNoAgentCanHoldWaitsNamingTheFigures) {
  // Verifies a 44 GB reference runner is kept off a 25 GB node, with both figures in the reason.
  std::vector<Waiting> waiting;
  auto placements = Schedule(Queue({1}), {MemoryDemand(44'000'000'000, 1, "reference runner")},
                             {MemoryAgent("cpu-1", 25'000'000'000, 2)}, &waiting);
  EXPECT_TRUE(placements.empty());
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_THAT(waiting[0].reason,
              HasSubstr("cpu-1: needs ~44.0 GB of host memory (reference runner ~44.0 GB), "
                        "the node has 25.0 GB (23.9 GB usable)"));
  // The same cell on a node that holds it is placed.
  EXPECT_EQ(Schedule(Queue({1}), {MemoryDemand(44'000'000'000)},
                     {MemoryAgent("cpu-1", 25'000'000'000), MemoryAgent("big", 128'000'000'000)})
                .at(0)
                .agent_id,
            "big");
}

TEST(SchedulerMemoryTest, AttemptsShareANodesMemoryNotJustItsSlots) {
  // Two 15 GB attempts on a 25 GB node with two slots: one runs, the other waits for memory.
  std::vector<Waiting> waiting;
  auto placements =
      Schedule(Queue({1, 2}), {MemoryDemand(15'000'000'000), MemoryDemand(15'000'000'000)},
               {MemoryAgent("cpu-1", 25'000'000'000, 2)}, &waiting);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].attempt_id, 1);
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_THAT(waiting[0].reason, HasSubstr("cpu-1: 8.9 GB of 25.0 GB memory free (its running "
                                           "attempts hold 15.0 GB), needs ~15.0 GB"));
  // What running attempts hold counts too (AgentView::memory_in_use), and a smaller one fits.
  AgentView busy = MemoryAgent("cpu-1", 25'000'000'000, 2);
  busy.running = 1;
  busy.memory_in_use = 15'000'000'000;
  EXPECT_TRUE(Schedule(Queue({3}), {MemoryDemand(15'000'000'000)}, {busy}).empty());
  EXPECT_EQ(Schedule(Queue({3}), {MemoryDemand(5'000'000'000)}, {busy}).size(), 1u);
}

TEST(SchedulerMemoryTest, ALargeCellWaitingForMemoryHoldsItsAgentAgainstLaterSmallOnes) {
  // cpu-1 (25 GB, 2 slots) runs a 15 GB attempt. The older 15 GB cell waits for that memory
  // and holds cpu-1, so the 5 GB cell behind it goes elsewhere or waits, saying why.
  AgentView busy = MemoryAgent("cpu-1", 25'000'000'000, 2);
  busy.running = 1;
  busy.memory_in_use = 15'000'000'000;
  const std::vector<Demand> big_then_small = {MemoryDemand(15'000'000'000),
                                              MemoryDemand(5'000'000'000)};
  std::vector<Waiting> waiting;
  EXPECT_TRUE(Schedule(Queue({1, 2}), big_then_small, {busy}, &waiting).empty());
  ASSERT_EQ(waiting.size(), 2u);
  EXPECT_THAT(waiting[0].reason, HasSubstr("memory free (its running attempts hold 15.0 GB)"));
  EXPECT_EQ(waiting[1].reason,
            "cpu-1: held for attempt 1, which waits for the memory its running attempts hold");
  // Another agent takes the small one.
  auto placements = Schedule(Queue({1, 2}), big_then_small,
                             {busy, MemoryAgent("cpu-2", 9'000'000'000)});
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].attempt_id, 2);
  EXPECT_EQ(placements[0].agent_id, "cpu-2");
  // The small one first (older) runs beside; a cell that could never fit holds nothing.
  EXPECT_EQ(Schedule(Queue({2, 1}), {MemoryDemand(5'000'000'000), MemoryDemand(15'000'000'000)},
                     {busy})
                .size(),
            1u);
  EXPECT_EQ(Schedule(Queue({1, 2}), {MemoryDemand(44'000'000'000), MemoryDemand(5'000'000'000)},
                     {busy})
                .size(),
            1u);
}

TEST(SchedulerMemoryTest, RanksAddUpAndUnknownsAreNotChecked) {
  // Four 7 GB ranks (28 GB) do not fit a 25 GB node though one would.
  EXPECT_TRUE(Schedule(Queue({1}), {MemoryDemand(7'000'000'000, 4)},
                       {MemoryAgent("cpu-1", 25'000'000'000)})
                  .empty());
  // An agent that reports no memory, or a cell without an estimate, is not held back.
  EXPECT_EQ(Schedule(Queue({1}), {MemoryDemand(7'000'000'000, 4)}, {MemoryAgent("old", 0)}).size(),
            1u);
  EXPECT_EQ(Schedule(Queue({1}), {DemandOf(SampleSpec())}, {MemoryAgent("cpu-1", 1)}).size(), 1u);
}

TEST(SchedulerMemoryTest, AGpuRankMustFitTheSmallestGpu) {
  Demand d = DemandOf(SampleSpec());
  d.gpu = true;
  d.memory.processes.push_back({std::string(kWorkerRankRole), 1, 4'000'000'000, 95'000'000'000, ""});
  AgentView h100 = MemoryAgent("h100", 2'000'000'000'000);
  h100.gpus = 8;
  h100.gpu_memory_bytes = 80'000'000'000;
  std::vector<Waiting> waiting;
  EXPECT_TRUE(Schedule(Queue({1}), {d}, {h100}, &waiting).empty());
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_THAT(waiting[0].reason, HasSubstr("needs ~95.0 GB of GPU memory per rank"));
  EXPECT_THAT(waiting[0].reason, HasSubstr("its GPUs have 80.0 GB"));
  AgentView h200 = h100;
  h200.agent_id = "h200";
  h200.gpu_memory_bytes = 141'000'000'000;
  EXPECT_EQ(Schedule(Queue({1}), {d}, {h100, h200}).at(0).agent_id, "h200");
}

TEST(AttemptStateTest, TransitionTableAllowsOnlyTheLifecycle) {
  // Verifies the transition table allows the lifecycle only and terminal states are final.
  using S = AttemptState;
  EXPECT_TRUE(IsAllowedTransition(S::kQueued, S::kLeased));
  EXPECT_TRUE(IsAllowedTransition(S::kLeased, S::kRunning));
  EXPECT_TRUE(IsAllowedTransition(S::kRunning, S::kPassed));
  EXPECT_TRUE(IsAllowedTransition(S::kRunning, S::kFailed));
  EXPECT_TRUE(IsAllowedTransition(S::kLeased, S::kError));
  EXPECT_FALSE(IsAllowedTransition(S::kQueued, S::kRunning));
  EXPECT_FALSE(IsAllowedTransition(S::kQueued, S::kPassed));
  // Agent loss, cancel and time limits end an attempt that an agent holds; only cancel ends a
  // queued one (nothing else can happen to an attempt no agent holds).
  for (S active : {S::kLeased, S::kRunning}) {
    for (S to : {S::kLost, S::kCancelled, S::kTimedOut}) EXPECT_TRUE(IsAllowedTransition(active, to));
  }
  EXPECT_TRUE(IsAllowedTransition(S::kQueued, S::kCancelled));
  EXPECT_FALSE(IsAllowedTransition(S::kQueued, S::kLost));
  EXPECT_FALSE(IsAllowedTransition(S::kQueued, S::kTimedOut));
  const std::vector<S> all = {S::kQueued, S::kLeased, S::kRunning, S::kPassed,   S::kFailed,
                              S::kError,  S::kLost,   S::kCancelled, S::kTimedOut};
  for (S terminal : {S::kPassed, S::kFailed, S::kError, S::kLost, S::kCancelled, S::kTimedOut}) {
    EXPECT_TRUE(IsTerminal(terminal));
    for (S to : all) EXPECT_FALSE(IsAllowedTransition(terminal, to));
  }
  for (S active : {S::kQueued, S::kLeased, S::kRunning}) EXPECT_FALSE(IsTerminal(active));
  Status s = CheckTransition(4, S::kPassed, S::kRunning);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "attempt 4: illegal transition passed -> running");
  for (S st : all) EXPECT_EQ(ParseAttemptState(AttemptStateName(st)), st);
  EXPECT_EQ(AttemptStateName(S::kTimedOut), "timed_out");
}

}  // namespace
}  // namespace gatehouse::controller
