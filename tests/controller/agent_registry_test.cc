// The agent registry (controller/agent_registry.h): names held by live instances, silence and
// the restart grace on a fake monotonic clock, drain state, the heartbeat-write throttle, and
// what the scheduler is shown.
#include "controller/agent_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing::RecordingChannel;

class AgentRegistryTest : public ::testing::Test {
 protected:
  AgentRegistryTest() : registry_(Lease(), [this] { return now_; }) {}

  static LeaseConfig Lease() {
    LeaseConfig lease;
    lease.heartbeat_interval = 1000ms;
    lease.missed_heartbeats = 3;  // silent after 3 s
    lease.restart_grace = 10s;    // an agent not yet heard from: 10 s from the start
    return lease;
  }
  static AgentHello Hello(const std::string& name, const std::string& instance = "i1") {
    AgentHello hello;
    hello.name = name;
    hello.instance_id = instance;
    hello.slots = 2;
    hello.gpus = 1;
    return hello;
  }

  std::chrono::steady_clock::time_point now_ = std::chrono::steady_clock::time_point(100s);
  AgentRegistry registry_;
};

TEST_F(AgentRegistryTest, ALiveInstanceKeepsItsNameUntilItGoesSilent) {
  auto channel = std::make_shared<RecordingChannel>();
  ASSERT_TRUE(registry_.Attach("a", Hello("a", "first"), channel).ok());
  const Status taken = registry_.Attach("a", Hello("a", "second"), channel);
  EXPECT_EQ(taken.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(taken.message(), HasSubstr("agent 'a' is already connected"));
  EXPECT_EQ(registry_.CheckName(Hello("a", "second")).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(registry_.CheckName(Hello("a", "first")).ok()) << "the same instance reconnects";
  now_ += 4s;  // silent
  EXPECT_TRUE(registry_.Attach("a", Hello("a", "second"), channel).ok());
}

TEST_F(AgentRegistryTest, SilenceStartsAfterTheLeaseTimeoutAndTheRestartGrace) {
  // Not heard from since the start: silent only after the grace (10 s), not one lease (3 s).
  now_ += 9s;
  EXPECT_FALSE(registry_.SilentFor("never").has_value());
  now_ += 2s;
  ASSERT_TRUE(registry_.SilentFor("never").has_value());
  EXPECT_EQ(*registry_.SilentFor("never"), 4s) << "11 s after a start counted as 7 s";

  ASSERT_TRUE(registry_.Attach("a", Hello("a"), std::make_shared<RecordingChannel>()).ok());
  now_ += 3s;
  EXPECT_FALSE(registry_.SilentFor("a").has_value()) << "exactly the timeout is not over it";
  now_ += 1ms;
  EXPECT_TRUE(registry_.SilentFor("a").has_value());
  EXPECT_TRUE(registry_.SchedulableViews().empty()) << "a silent agent takes no new work";
  EXPECT_TRUE(registry_.Touch("a")) << "heard from again: it takes work again";
  EXPECT_FALSE(registry_.Touch("a"));
  ASSERT_EQ(registry_.SchedulableViews().size(), 1u);
  EXPECT_FALSE(registry_.Touch("unattached")) << "only attached agents resume";
}

TEST_F(AgentRegistryTest, ViewsLivenessDrainAndDetach) {
  auto first = std::make_shared<RecordingChannel>();
  auto second = std::make_shared<RecordingChannel>();
  AgentHello b = Hello("b");
  b.torch_version = "2.11.0";
  b.lane = "gpu";
  b.gpu_models = {"NVIDIA H200"};
  ASSERT_TRUE(registry_.Attach("b", b, first).ok());
  ASSERT_TRUE(registry_.Attach("a", Hello("a"), first).ok());
  const std::vector<AgentView> views = registry_.SchedulableViews();
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[0].agent_id, "a") << "sorted by id";
  EXPECT_EQ(views[1].slots, 2);
  EXPECT_EQ(views[1].gpus, 1);
  EXPECT_EQ(views[1].torch_version, "2.11.0");
  EXPECT_EQ(views[1].lane, "gpu");
  EXPECT_EQ(views[1].gpu_models, b.gpu_models);

  EXPECT_FALSE(registry_.SetDrainReason("b", "cleanup failed")) << "draining is no resume";
  EXPECT_EQ(registry_.SchedulableViews()[1].drain_reason, "cleanup failed");
  EXPECT_EQ(registry_.Liveness("b").drain_reason, "cleanup failed");
  EXPECT_TRUE(registry_.SetDrainReason("b", "")) << "draining ended: it takes work again";
  EXPECT_FALSE(registry_.SetDrainReason("b", ""));

  now_ += 2s;
  const AgentLiveness live = registry_.Liveness("b");
  EXPECT_TRUE(live.attached);
  EXPECT_EQ(live.slots, 2);
  EXPECT_FALSE(live.silent);
  EXPECT_EQ(live.heard_ago, std::optional<std::chrono::steady_clock::duration>(2s));
  EXPECT_FALSE(registry_.Liveness("stranger").heard_ago.has_value());

  ASSERT_TRUE(registry_.Attach("b", b, second).ok());  // a new stream replaces the old
  EXPECT_FALSE(registry_.Detach("b", first.get())) << "the old stream ending changes nothing";
  EXPECT_EQ(registry_.Channel("b"), second);
  EXPECT_TRUE(registry_.Detach("b", second.get()));
  EXPECT_EQ(registry_.Channel("b"), nullptr);
  EXPECT_FALSE(registry_.Liveness("b").attached);
}

TEST_F(AgentRegistryTest, TheStoredHeartbeatIsWrittenAtMostEvery30Seconds) {
  EXPECT_TRUE(registry_.HeartbeatWriteDue("a"));
  now_ += 29s;
  EXPECT_FALSE(registry_.HeartbeatWriteDue("a"));
  EXPECT_TRUE(registry_.HeartbeatWriteDue("b")) << "per agent";
  now_ += 1s;
  EXPECT_TRUE(registry_.HeartbeatWriteDue("a"));
}

}  // namespace
}  // namespace gatehouse::controller
