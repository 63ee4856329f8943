// The controller's background loops (controller/loops.h): a coalescing loop serves a burst of
// requests with few passes, on its own thread, and runs inline when not started; a periodic
// loop runs its task every interval until stopped. Bounded in time (at most about 2 s).
#include "controller/loops.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace gatehouse::controller {
namespace {

using namespace std::chrono_literals;

TEST(CoalescingLoopTest, ABurstOfRequestsCostsFewPassesOnTheLoopsThread) {
  std::atomic<int> passes{0};
  std::atomic<bool> on_caller{false};
  const auto caller = std::this_thread::get_id();
  CoalescingLoop loop(
      [&] {
        if (std::this_thread::get_id() == caller) on_caller = true;
        ++passes;
        std::this_thread::sleep_for(20ms);
      },
      50ms);
  loop.Request();  // not started: inline
  EXPECT_EQ(passes.load(), 1);
  EXPECT_TRUE(on_caller.load());
  on_caller = false;
  loop.Start();
  loop.Start();  // idempotent
  for (int i = 0; i < 200; ++i) loop.Request();
  for (int i = 0; i < 200 && passes.load() < 2; ++i) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(150ms);  // room for every pass the burst may cause
  EXPECT_GE(passes.load(), 2);
  EXPECT_LE(passes.load(), 3) << "200 requests within one interval: one or two passes";
  EXPECT_FALSE(on_caller.load());
  loop.Stop();
  loop.Stop();  // idempotent
  const int before = passes.load();
  loop.Request();  // stopped: inline again
  EXPECT_EQ(passes.load(), before + 1);
  EXPECT_TRUE(on_caller.load());
}

TEST(PeriodicLoopTest, RunsEveryIntervalUntilStopped) {
  std::atomic<int> runs{0};
  PeriodicLoop loop([&] { ++runs; }, 20ms);
  std::this_thread::sleep_for(60ms);
  EXPECT_EQ(runs.load(), 0) << "nothing runs before Start";
  loop.Start();
  for (int i = 0; i < 200 && runs.load() < 3; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_GE(runs.load(), 3);
  loop.Stop();
  const int stopped_at = runs.load();
  std::this_thread::sleep_for(60ms);
  EXPECT_EQ(runs.load(), stopped_at) << "nothing runs after Stop";
}

}  // namespace
}  // namespace gatehouse::controller
