// Tests of the gRPC transport against a fake controller (a real in-process gRPC server):
// registration, heartbeats, an assignment round trip, reconnect with re-registration, stop.
#include "agent/agent_client.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "agent_test_util.h"
#include "gatehouse/agent/v1/agent.grpc.pb.h"

namespace gatehouse::agent {
namespace {

namespace pb = ::gatehouse::agent::v1;
using testing::TempDir;

// Answers Register with Registered, then sends the configured assignments and records what the
// agent sends. With `drop_first_stream`, the first stream is closed right after Registered.
class FakeController final : public pb::AgentService::Service {
 public:
  grpc::Status Connect(grpc::ServerContext*,
                       grpc::ServerReaderWriter<pb::ControllerMessage, pb::AgentMessage>* stream)
      override {
    pb::AgentMessage message;
    if (!stream->Read(&message) || !message.has_register_()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected Register first");
    }
    int number = 0;
    {
      std::lock_guard lock(mu_);
      registers_.push_back(message.register_());
      number = static_cast<int>(registers_.size());
      cv_.notify_all();
    }
    pb::ControllerMessage reply;
    reply.mutable_registered()->set_agent_id("agent-" + std::to_string(number));
    reply.mutable_registered()->set_heartbeat_interval_ms(50);
    stream->Write(reply);
    if (number == 1 && drop_first_stream) return grpc::Status::OK;
    if (number == 1) {
      for (const pb::Assignment& assignment : assignments) {
        pb::ControllerMessage offer;
        *offer.mutable_assignment() = assignment;
        stream->Write(offer);
      }
    }
    while (stream->Read(&message)) {
      {
        std::lock_guard lock(mu_);
        received_.push_back(message);
        stream_of_.push_back(number);
        cv_.notify_all();
      }
      if (message.has_end()) {
        // The first stream drops right after an end, unacknowledged (with drop_after_end);
        // later ones acknowledge it when ack_ends is set.
        if (number == 1 && drop_after_end) return grpc::Status::OK;
        if (ack_ends) {
          pb::ControllerMessage ack;
          ack.mutable_end_ack()->set_attempt_id(message.end().attempt_id());
          stream->Write(ack);
          if (number == 2 && drop_after_end) return grpc::Status::OK;
        }
      }
    }
    return grpc::Status::OK;
  }

  /// The stream number (1, 2, ...) each received message came on. Call inside WaitFor.
  const std::vector<int>& stream_of() const { return stream_of_; }

  /// Waits up to 20 s for `done(registers, received)` to hold.
  template <typename Pred>
  bool WaitFor(Pred done) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return done(registers_, received_); });
  }

  std::vector<pb::Assignment> assignments;  // offered on the first stream only
  bool drop_first_stream = false;
  bool drop_after_end = false;
  bool ack_ends = false;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pb::Register> registers_;
  std::vector<pb::AgentMessage> received_;
  std::vector<int> stream_of_;
};

/// An assignment whose spec is invalid, so the agent ends it at once without a build.
pb::Assignment InvalidSpecAssignment(int64_t attempt_id) {
  pb::Assignment assignment;
  assignment.set_attempt_id(attempt_id);
  assignment.set_cell_id("cell");
  assignment.set_spec_json(R"({"spec_version":1})");
  return assignment;
}

int Count(const std::vector<pb::AgentMessage>& messages, pb::AgentMessage::MsgCase kind) {
  int n = 0;
  for (const auto& m : messages) n += m.msg_case() == kind ? 1 : 0;
  return n;
}

class AgentClientTest : public ::testing::Test {
 protected:
  void StartServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&controller_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  void StartAgent(const std::string& address) {
    RunnerConfig runner_config;
    runner_config.work_dir = tmp_.path() / "work";
    runner_config.sdk_dir = tmp_.path();
    runner_config.worker = tmp_.path() / "no-worker";
    runner_config.agent_name = "test-agent";
    runner_config.cleanup = cleanup_;
    runner_ = std::make_unique<AttemptRunner>(runner_config);
    AgentClientConfig config;
    config.controller = address;
    config.agent_name = "test-agent";
    config.capabilities.cpu_cores = 2;
    config.capabilities.labels["lane"] = "cpu";
    config.capabilities.torch_version = "2.11.0";
    config.initial_backoff = std::chrono::milliseconds(20);
    config.drain_recheck = std::chrono::milliseconds(100);
    client_ = std::make_unique<AgentClient>(config, *runner_);
    client_->OnRegistered([this](const std::string& id) {
      std::lock_guard lock(ids_mu_);
      registered_ids_.push_back(id);
    });
    agent_thread_ = std::thread([this] { run_status_ = client_->Run(); });
  }

  void TearDown() override {
    if (client_) client_->Stop();
    if (agent_thread_.joinable()) agent_thread_.join();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  std::string Address() const { return "127.0.0.1:" + std::to_string(port_); }

  TempDir tmp_;
  FakeController controller_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  const CleanupChecker* cleanup_ = nullptr;  // set before StartAgent to check cleanups
  std::unique_ptr<AttemptRunner> runner_;
  std::unique_ptr<AgentClient> client_;
  std::thread agent_thread_;
  Status run_status_ = Status::Internal("not returned");
  std::mutex ids_mu_;
  std::vector<std::string> registered_ids_;
};

// Verifies Register carries name and capabilities, heartbeats flow with increasing seq, and an
// assignment comes back as an AttemptEnd (here: an invalid spec, so no build is needed).
TEST_F(AgentClientTest, RegistersHeartbeatsAndEndsAssignedAttempt) {
  controller_.assignments = {InvalidSpecAssignment(41)};
  StartServer();
  StartAgent(Address());

  ASSERT_TRUE(controller_.WaitFor([](const auto&, const auto& received) {
    return Count(received, pb::AgentMessage::kEnd) == 1 &&
           Count(received, pb::AgentMessage::kHeartbeat) >= 2;
  }));
  client_->Stop();
  agent_thread_.join();
  EXPECT_TRUE(run_status_.ok()) << run_status_.ToString();

  controller_.WaitFor([&](const auto& registers, const auto& received) {
    EXPECT_EQ(registers.size(), 1u);
    EXPECT_EQ(registers[0].agent_name(), "test-agent");
    EXPECT_EQ(registers[0].capabilities().cpu_cores(), 2);
    EXPECT_EQ(registers[0].capabilities().labels().at("lane"), "cpu");
    EXPECT_EQ(registers[0].capabilities().torch_version(), "2.11.0");
    int64_t last_heartbeat = 0;
    for (const auto& m : received) {
      if (m.has_heartbeat()) {
        EXPECT_EQ(m.heartbeat().seq(), last_heartbeat + 1);
        last_heartbeat = m.heartbeat().seq();
      }
      if (m.has_end()) {
        EXPECT_EQ(m.end().attempt_id(), 41);
        EXPECT_EQ(m.end().seq(), 1);
        EXPECT_EQ(m.end().outcome(), "error");
        EXPECT_EQ(m.end().reason().rfind("invalid spec: ", 0), 0u) << m.end().reason();
      }
    }
    return true;
  });
  std::lock_guard lock(ids_mu_);
  EXPECT_EQ(registered_ids_, (std::vector<std::string>{"agent-1"}));
}

// Verifies that when the controller closes the stream the agent reconnects and registers again.
TEST_F(AgentClientTest, ReconnectsAndRegistersAgain) {
  controller_.drop_first_stream = true;
  StartServer();
  StartAgent(Address());
  ASSERT_TRUE(controller_.WaitFor([](const auto& registers, const auto& received) {
    return registers.size() >= 2 && Count(received, pb::AgentMessage::kHeartbeat) >= 1;
  }));
  std::lock_guard lock(ids_mu_);
  ASSERT_GE(registered_ids_.size(), 2u);
  EXPECT_EQ(registered_ids_[0], "agent-1");
  EXPECT_EQ(registered_ids_[1], "agent-2");
}

// Verifies the resend buffer with an attempt whose only message is its end: an end the
// controller did not acknowledge is resent after the next registration (which lists the
// attempt as held); once acknowledged it is forgotten: the third registration lists nothing
// and nothing is resent. (The order of a longer replay is covered end to end by
// tests/e2e/fault_test.cc: no gap in any event sequence or log stream after a controller kill.)
TEST_F(AgentClientTest, UnacknowledgedMessagesAreResentAfterReconnect) {
  controller_.assignments = {InvalidSpecAssignment(41)};
  controller_.drop_after_end = true;
  controller_.ack_ends = true;
  StartServer();
  StartAgent(Address());
  ASSERT_TRUE(controller_.WaitFor([](const auto& registers, const auto&) { return registers.size() >= 3; }));
  ASSERT_TRUE(controller_.WaitFor([&](const auto& registers, const auto& received) {
    // Stream 1: the end, unacknowledged. Stream 2: Register lists 41, the end comes again,
    // is acknowledged. Stream 3: nothing held, nothing resent.
    std::vector<int> ends_per_stream(4, 0);
    for (size_t i = 0; i < received.size(); ++i) {
      if (received[i].has_end()) ++ends_per_stream.at(static_cast<size_t>(controller_.stream_of()[i]));
    }
    EXPECT_EQ(ends_per_stream[1], 1);
    EXPECT_EQ(ends_per_stream[2], 1);
    EXPECT_EQ(ends_per_stream[3], 0);
    EXPECT_EQ(std::vector<int64_t>(registers[1].running_attempt_ids().begin(),
                                   registers[1].running_attempt_ids().end()),
              std::vector<int64_t>{41});
    EXPECT_EQ(registers[2].running_attempt_ids_size(), 0);
    return true;
  }));
}

// Verifies draining: an attempt that leaves a process in its directory makes the agent say it
// drains before it sends the end (so the controller never schedules onto it in between), the
// cleanup report is a log chunk of stream "cleanup", and once the process is gone a recheck
// clears the drain on the next heartbeat.
TEST_F(AgentClientTest, AFailedCleanupDrainsTheAgentUntilARecheckIsClean) {
  CleanupChecker checker(nullptr);
  ASSERT_TRUE(checker.TakeBaseline().ok());
  cleanup_ = &checker;
  std::filesystem::create_directories(tmp_.path() / "work" / "attempts" / "41");
  testing::Leftover left(tmp_.path() / "work" / "attempts" / "41");
  // 42 arrives with 41 and waits behind it: the draining agent ends it without running it.
  controller_.assignments = {InvalidSpecAssignment(41), InvalidSpecAssignment(42)};
  StartServer();
  StartAgent(Address());
  ASSERT_TRUE(controller_.WaitFor([](const auto&, const auto& received) {
    return Count(received, pb::AgentMessage::kEnd) == 2;
  }));
  controller_.WaitFor([&](const auto&, const auto& received) {
    for (const auto& m : received) {
      if (m.has_end() && m.end().attempt_id() == 42) {
        EXPECT_EQ(m.end().outcome(), "error");
        EXPECT_EQ(m.end().reason().rfind("not run: this agent drains (cleanup after attempt 41", 0), 0u)
            << m.end().reason();
      }
    }
    return true;
  });
  controller_.WaitFor([&](const auto&, const auto& received) {
    size_t drain_at = received.size(), end_at = received.size(), report_at = received.size();
    for (size_t i = 0; i < received.size(); ++i) {
      const auto& m = received[i];
      if (m.has_heartbeat() && !m.heartbeat().drain_reason().empty() && drain_at == received.size()) {
        drain_at = i;
        EXPECT_NE(m.heartbeat().drain_reason().find("cleanup after attempt 41: 1 leftover process"),
                  std::string::npos)
            << m.heartbeat().drain_reason();
      }
      if (m.has_log() && m.log().stream() == "cleanup") {
        report_at = i;
        EXPECT_NE(m.log().data().find("\"healthy\":false"), std::string::npos);
      }
      if (m.has_end() && m.end().attempt_id() == 41) end_at = i;
    }
    EXPECT_LT(report_at, end_at);
    EXPECT_LT(drain_at, end_at) << "the drain must reach the controller before the end";
    return true;
  });
  left.End();
  ASSERT_TRUE(controller_.WaitFor([](const auto&, const auto& received) {
    bool drained = false;
    for (const auto& m : received) {
      if (!m.has_heartbeat()) continue;
      if (!m.heartbeat().drain_reason().empty()) drained = true;
      else if (drained) return true;  // a clean heartbeat after the drain
    }
    return false;
  }));
}

// Verifies that Stop() ends Run() promptly while no controller is reachable (backoff loop).
TEST_F(AgentClientTest, StopEndsRunWhileControllerIsDown) {
  StartAgent("127.0.0.1:1");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  client_->Stop();
  agent_thread_.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_TRUE(run_status_.ok());
}

}  // namespace
}  // namespace gatehouse::agent
