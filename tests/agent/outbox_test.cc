// The agent's outbox (agent/outbox.h): kept in order until acknowledged, replayed whole after
// a reconnect (stopping at a broken stream), log chunks over the budget written but not kept.
#include "agent/outbox.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gatehouse::agent {
namespace {

// A stream that records what is written and fails once `broken` is set.
struct FakeStream {
  std::vector<std::string> written;
  bool broken = false;
  Outbox::Write Writer() {
    return [this](const std::string& bytes) {
      if (broken) return false;
      written.push_back(bytes);
      return true;
    };
  }
};

TEST(OutboxTest, KeepsInOrderUntilAcknowledgedAndReplaysWhole) {
  Outbox outbox(1 << 20);
  FakeStream first;
  EXPECT_TRUE(outbox.Send(1, "a1", false, first.Writer()));
  EXPECT_TRUE(outbox.Send(2, "b1", false, first.Writer()));
  first.broken = true;
  EXPECT_TRUE(outbox.Send(1, "a2", false, first.Writer())) << "kept though the write failed";
  EXPECT_EQ(first.written, (std::vector<std::string>{"a1", "b1"}));
  EXPECT_EQ(outbox.Attempts(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(outbox.bytes(), 6u);

  FakeStream second;
  bool attached = false;
  EXPECT_EQ(outbox.Replay([&] { attached = true; }, second.Writer()), 3u);
  EXPECT_TRUE(attached);
  EXPECT_EQ(second.written, (std::vector<std::string>{"a1", "b1", "a2"}));

  outbox.Acknowledge(1);
  EXPECT_EQ(outbox.Attempts(), (std::vector<int64_t>{2}));
  EXPECT_EQ(outbox.bytes(), 2u);
  FakeStream third;
  EXPECT_EQ(outbox.Replay([] {}, third.Writer()), 1u);
  EXPECT_EQ(third.written, (std::vector<std::string>{"b1"}));
}

TEST(OutboxTest, AReplayStopsAtABrokenStream) {
  Outbox outbox(1 << 20);
  FakeStream stream;
  stream.broken = true;
  for (const char* m : {"1", "2", "3"}) outbox.Send(7, m, false, stream.Writer());
  int writes = 0;
  EXPECT_EQ(outbox.Replay([] {}, [&](const std::string&) { return ++writes < 2; }), 1u);
  EXPECT_EQ(writes, 2) << "the second write failed: nothing after it is tried";
  EXPECT_EQ(outbox.Attempts(), (std::vector<int64_t>{7})) << "all still kept";
}

TEST(OutboxTest, DroppableMessagesOverTheBudgetAreWrittenButNotKept) {
  Outbox outbox(10);
  FakeStream stream;
  EXPECT_TRUE(outbox.Send(1, "log-12345", true, stream.Writer()));   // 9 bytes: kept
  EXPECT_FALSE(outbox.Send(1, "log-67890", true, stream.Writer()));  // 18 > 10: not kept
  EXPECT_TRUE(outbox.Send(1, "end-of-attempt", false, stream.Writer()))
      << "an end is always kept";
  EXPECT_EQ(stream.written.size(), 3u) << "every message was written once";
  FakeStream again;
  outbox.Replay([] {}, again.Writer());
  EXPECT_EQ(again.written, (std::vector<std::string>{"log-12345", "end-of-attempt"}));
}

}  // namespace
}  // namespace gatehouse::agent
