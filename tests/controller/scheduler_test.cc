// Verifies the scheduler (pure logic) and the attempt transition table.
#include "controller/scheduler.h"

#include <gtest/gtest.h>

#include "controller/attempt_state.h"

namespace gatehouse::controller {
namespace {

std::vector<QueuedAttempt> Queue(std::initializer_list<int64_t> ids) {
  std::vector<QueuedAttempt> q;
  for (int64_t id : ids) q.push_back({id, "cell-" + std::to_string(id)});
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
  for (S terminal : {S::kPassed, S::kFailed, S::kError}) {
    EXPECT_TRUE(IsTerminal(terminal));
    for (S to : {S::kQueued, S::kLeased, S::kRunning, S::kPassed, S::kFailed, S::kError}) {
      EXPECT_FALSE(IsAllowedTransition(terminal, to));
    }
  }
  Status s = CheckTransition(4, S::kPassed, S::kRunning);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "attempt 4: illegal transition passed -> running");
  for (S st : {S::kQueued, S::kLeased, S::kRunning, S::kPassed, S::kFailed, S::kError}) {
    EXPECT_EQ(ParseAttemptState(AttemptStateName(st)), st);
  }
}

}  // namespace
}  // namespace gatehouse::controller
