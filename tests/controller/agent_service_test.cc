// Verifies the agent gRPC stream in-process: Register -> Registered, an Assignment pushed when
// a cell is submitted, events/logs/end applied (resends ignored), disconnect recorded, and a
// stream that does not start with Register refused.
#include "controller/agent_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <iterator>
#include <optional>
#include <utility>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "gatehouse/agent/v1/agent.grpc.pb.h"
#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

namespace pb = gatehouse::agent::v1;
using nlohmann::json;

/// Threads of this process now (/proc/self/task).
long ThreadCount() {
  return std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                       std::filesystem::directory_iterator());
}

class AgentServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeCheckpoint(dir_.path());
    auto store = Store::Open((dir_.path() / "g.db").string(), SystemClock());
    ASSERT_TRUE(store.ok());
    store_ = std::move(*store);
    core_ = std::make_unique<ControllerCore>(*store_, freezer_);
    auto server = AgentRpcServer::Start("127.0.0.1:0", *core_);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    stub_ = pb::AgentService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  }

  using ClientStream = grpc::ClientReaderWriter<pb::AgentMessage, pb::ControllerMessage>;

  /// Submits the fixture's cell (a distinct one per `seed`, as training.seed); its id.
  std::string Submit(std::optional<int> seed = std::nullopt) {
    json body = {{"repository", "/repos/adapt"},
                 {"branch", "main"},
                 {"model_family", "llama"},
                 {"checkpoint", (dir_.path() / "ckpt").string()},
                 {"reference", (dir_.path() / "reference").string()}};
    if (seed) body["training"] = {{"seed", *seed}};
    auto outcome = core_->Submit(body.dump(), "test");
    EXPECT_TRUE(outcome.ok()) << outcome.status().ToString();
    return outcome.ok() ? outcome->cell.cell.id : "";
  }

  /// Opens a stream on `ctx` and registers as `name` (holding `held`); fails the test unless
  /// Registered comes back.
  std::unique_ptr<ClientStream> Register(grpc::ClientContext& ctx, const std::string& name,
                                         const std::vector<int64_t>& held = {}) {
    auto stream = stub_->Connect(&ctx);
    pb::AgentMessage reg;
    reg.mutable_register_()->set_agent_name(name);
    for (int64_t id : held) reg.mutable_register_()->add_running_attempt_ids(id);
    EXPECT_TRUE(stream->Write(reg)) << name;
    pb::ControllerMessage in;
    EXPECT_TRUE(stream->Read(&in) && in.has_registered()) << name;
    return stream;
  }

  /// Half-closes `stream` and reads until the controller ends the call: the number of
  /// messages still read, and the call's status.
  static std::pair<int, grpc::Status> Close(ClientStream& stream) {
    EXPECT_TRUE(stream.WritesDone());
    int unread = 0;
    for (pb::ControllerMessage in; stream.Read(&in);) ++unread;
    return {unread, stream.Finish()};
  }

  static pb::AgentMessage Event(int64_t attempt, int64_t seq, const std::string& line) {
    pb::AgentMessage m;
    m.mutable_event()->set_attempt_id(attempt);
    m.mutable_event()->set_seq(seq);
    m.mutable_event()->set_json(line);
    return m;
  }

  testing::TempDir dir_;
  testing::FakeCommitResolver resolver_;
  DigestCache digests_;
  CellFreezer freezer_{SubmitContext{}, resolver_, digests_};
  std::unique_ptr<Store> store_;
  std::unique_ptr<ControllerCore> core_;
  std::unique_ptr<AgentRpcServer> server_;
  std::unique_ptr<pb::AgentService::Stub> stub_;
};

TEST_F(AgentServiceTest, AnAgentRegistersRunsAnAttemptAndEndsIt) {
  // Verifies register, assignment, events (resend ignored), logs, end -> passed, disconnect.
  grpc::ClientContext ctx;
  auto stream = stub_->Connect(&ctx);
  pb::AgentMessage reg;
  reg.mutable_register_()->set_agent_name("cpu-1");
  reg.mutable_register_()->mutable_capabilities()->set_slots(2);
  (*reg.mutable_register_()->mutable_capabilities()->mutable_labels())["lane"] = "cpu";
  ASSERT_TRUE(stream->Write(reg));
  pb::ControllerMessage in;
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_TRUE(in.has_registered());
  EXPECT_EQ(in.registered().agent_id(), "cpu-1");
  EXPECT_EQ(in.registered().heartbeat_interval_ms(), 5000);

  const std::string cell_id = Submit();
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_TRUE(in.has_assignment());
  EXPECT_EQ(in.assignment().cell_id(), cell_id);
  EXPECT_EQ(in.assignment().branch(), "main");
  EXPECT_EQ(json::parse(in.assignment().spec_json())["model_family"], "llama");
  const int64_t attempt = in.assignment().attempt_id();

  pb::AgentMessage hb;
  hb.mutable_heartbeat()->set_seq(1);
  ASSERT_TRUE(stream->Write(hb));
  ASSERT_TRUE(stream->Write(Event(attempt, 1, R"({"event":"phase_start","phase":"identity"})")));
  ASSERT_TRUE(stream->Write(
      Event(attempt, 2,
            R"({"event":"figure","phase":"identity","name":"sha","value":"x","unit":"text"})")));
  ASSERT_TRUE(stream->Write(
      Event(attempt, 2,
            R"({"event":"figure","phase":"identity","name":"sha","value":"x","unit":"text"})")));
  ASSERT_TRUE(stream->Write(Event(
      attempt, 3,
      R"({"event":"phase_end","phase":"identity","status":"PASS","reason":"","classification":"","duration_ms":1})")));
  ASSERT_TRUE(stream->Write(Event(attempt, 4, R"({"event":"run_end","status":"PASS"})")));
  pb::AgentMessage log;
  log.mutable_log()->set_attempt_id(attempt);
  log.mutable_log()->set_stream("worker");
  log.mutable_log()->set_offset(0);
  log.mutable_log()->set_data("hello\n");
  ASSERT_TRUE(stream->Write(log));
  ASSERT_TRUE(stream->Write(log));  // resend
  pb::AgentMessage end;
  end.mutable_end()->set_attempt_id(attempt);
  end.mutable_end()->set_seq(5);
  end.mutable_end()->set_outcome("finished");
  ASSERT_TRUE(stream->Write(end));
  ASSERT_TRUE(stream->WritesDone());
  // The stored end is acknowledged, so the agent may forget the attempt's messages.
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_TRUE(in.has_end_ack()) << in.DebugString();
  EXPECT_EQ(in.end_ack().attempt_id(), attempt);
  EXPECT_FALSE(stream->Read(&in));
  EXPECT_TRUE(stream->Finish().ok());

  auto detail = core_->GetCell(cell_id);
  ASSERT_TRUE(detail.ok());
  EXPECT_EQ(detail->status, AttemptState::kPassed);
  EXPECT_EQ(detail->attempts.at(0).agent_id, "cpu-1");
  ASSERT_EQ(detail->phases.size(), 1u);
  EXPECT_EQ(detail->phases[0].status, "PASS");
  EXPECT_EQ(detail->phases[0].figures.size(), 1u);
  EXPECT_EQ(*core_->ReadLog(cell_id, "worker", std::nullopt), "hello\n");
  auto agent = store_->GetAgent("cpu-1");
  ASSERT_TRUE(agent.ok());
  EXPECT_EQ(agent->state, "disconnected");
  EXPECT_NE(agent->capabilities_json.find("\"lane\""), std::string::npos);
}

TEST_F(AgentServiceTest, AnErrorOutcomeEndsTheAttemptInErrorWithTheReason) {
  // Verifies a waiting attempt is assigned on register and an "error" end keeps the reason.
  const std::string cell_id = Submit();  // queued before any agent exists
  grpc::ClientContext ctx;
  auto stream = Register(ctx, "cpu-2");
  pb::ControllerMessage in;
  ASSERT_TRUE(stream->Read(&in) && in.has_assignment());
  pb::AgentMessage end;
  end.mutable_end()->set_attempt_id(in.assignment().attempt_id());
  end.mutable_end()->set_outcome("error");
  end.mutable_end()->set_reason("build failed: cmake exited 1");
  ASSERT_TRUE(stream->Write(end));
  ASSERT_TRUE(stream->WritesDone());
  ASSERT_TRUE(stream->Read(&in) && in.has_end_ack());
  EXPECT_FALSE(stream->Read(&in));
  EXPECT_TRUE(stream->Finish().ok());
  auto detail = *core_->GetCell(cell_id);
  EXPECT_EQ(detail.status, AttemptState::kError);
  EXPECT_EQ(detail.attempts.at(0).reason, "build failed: cmake exited 1");
}

TEST_F(AgentServiceTest, RegisteringWithoutALeasedAttemptLosesIt) {
  // Verifies Register's running_attempt_ids reconcile the leases: the attempt leased to
  // "cpu-4" survives a re-registration that lists it and is lost (and retried, and assigned
  // again on this stream) when a re-registration does not.
  const std::string cell_id = Submit();
  grpc::ClientContext ctx1;
  auto first = Register(ctx1, "cpu-4");
  pb::ControllerMessage in;
  ASSERT_TRUE(first->Read(&in) && in.has_assignment());
  const int64_t attempt = in.assignment().attempt_id();
  auto [first_unread, first_status] = Close(*first);
  EXPECT_EQ(first_unread, 0);
  EXPECT_TRUE(first_status.ok());

  grpc::ClientContext ctx2;
  auto kept = Register(ctx2, "cpu-4", {attempt});
  EXPECT_EQ(core_->GetCell(cell_id)->attempts.size(), 1u);
  auto [kept_unread, kept_status] = Close(*kept);
  EXPECT_EQ(kept_unread, 0);
  EXPECT_TRUE(kept_status.ok());

  grpc::ClientContext ctx3;
  auto restarted = Register(ctx3, "cpu-4");
  ASSERT_TRUE(restarted->Read(&in) && in.has_assignment());
  EXPECT_NE(in.assignment().attempt_id(), attempt);
  const CellDetail d = *core_->GetCell(cell_id);
  ASSERT_EQ(d.attempts.size(), 2u);
  EXPECT_EQ(d.attempts[0].state, AttemptState::kLost);
  EXPECT_EQ(d.attempts[1].id, in.assignment().attempt_id());
  ctx3.TryCancel();
}

TEST_F(AgentServiceTest, AStreamMustStartWithRegister) {
  // Verifies a stream whose first message is not Register is refused with INVALID_ARGUMENT.
  grpc::ClientContext ctx;
  auto stream = stub_->Connect(&ctx);
  pb::AgentMessage hb;
  hb.mutable_heartbeat()->set_seq(1);
  ASSERT_TRUE(stream->Write(hb));
  ASSERT_TRUE(stream->WritesDone());
  pb::ControllerMessage in;
  EXPECT_FALSE(stream->Read(&in));
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("Register"), std::string::npos);
}

TEST_F(AgentServiceTest, ShutdownEndsOpenStreams) {
  // Verifies Shutdown returns promptly with an agent connected and marks it disconnected.
  grpc::ClientContext ctx;
  auto stream = Register(ctx, "cpu-3");
  pb::ControllerMessage in;
  const auto start = std::chrono::steady_clock::now();
  server_->Shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE(stream->Read(&in));
  EXPECT_EQ(store_->GetAgent("cpu-3")->state, "disconnected");
}

TEST_F(AgentServiceTest, OpenStreamsDoNotEachHoldAServerThread) {
  // Verifies the service is a callback reactor: 64 registered, idle agents (client calls made
  // from this one thread) add a bounded number of threads, not one per stream as a
  // synchronous service does (which adds 64 here).
  constexpr int kAgents = 64;
  grpc::ClientContext warm_ctx;  // gRPC starts its own threads lazily: count after one call
  auto warm = Register(warm_ctx, "warm");
  const long before = ThreadCount();
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<ClientStream>> streams;
  for (int i = 0; i < kAgents; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(Register(*contexts.back(), "idle-" + std::to_string(i)));
  }
  const long during = ThreadCount();
  EXPECT_LT(during - before, kAgents / 4) << before << " threads before, " << during << " with "
                                          << kAgents << " streams open";
  EXPECT_EQ(core_->ListAgents()->size(), static_cast<size_t>(kAgents + 1));
  streams.push_back(std::move(warm));
  for (auto& stream : streams) {
    auto [unread, status] = Close(*stream);
    EXPECT_EQ(unread, 0);
    EXPECT_TRUE(status.ok());
  }
}

TEST_F(AgentServiceTest, AgentsDroppingWhileAssignmentsAreQueuedLoseNothing) {
  // Verifies stream teardown racing assignments: agents register and drop (a cancel, or a
  // close with messages still unread) while another thread submits cells, so assignments are
  // queued on streams that are ending. Bounded: 12 rounds of 6 agents, at most 300 cells. Then
  // every cell still has its one attempt, queued or leased (nothing lost, none twice), and a
  // new agent registers.
  std::atomic<bool> stop{false};
  std::atomic<int> submitted{0};
  std::thread submitter([&] {
    for (int seed = 0; !stop && seed < 300; ++seed) {
      if (!Submit(seed).empty()) ++submitted;
    }
  });
  for (int round = 0; round < 12; ++round) {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<std::unique_ptr<ClientStream>> streams;
    for (int i = 0; i < 6; ++i) {
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      streams.push_back(Register(*contexts.back(),
                                 "churn-" + std::to_string(round) + "-" + std::to_string(i)));
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      if (i % 2 == 0) {
        contexts[i]->TryCancel();
      } else {
        streams[i]->WritesDone();
      }
      pb::ControllerMessage in;
      while (streams[i]->Read(&in)) {
      }
      streams[i]->Finish();
    }
  }
  stop = true;
  submitter.join();

  auto queued = store_->ListQueuedAttempts(/*with_specs=*/false);
  auto active = store_->ListActiveAttempts();
  ASSERT_TRUE(queued.ok() && active.ok());
  std::set<std::string> cells;
  for (const auto& q : *queued) EXPECT_TRUE(cells.insert(q.cell_id).second) << q.cell_id;
  for (const auto& a : *active) {
    EXPECT_TRUE(cells.insert(a.cell_id).second) << a.cell_id;
    EXPECT_EQ(a.agent_id.rfind("churn-", 0), 0u) << a.agent_id;
  }
  EXPECT_EQ(cells.size(), static_cast<size_t>(submitted.load()));
  EXPECT_GT(active->size(), 0u);  // some assignments did race the teardown

  grpc::ClientContext ctx;
  auto stream = Register(ctx, "after-churn");  // the queued cells may be assigned to it
  EXPECT_TRUE(Close(*stream).second.ok());
}

}  // namespace
}  // namespace gatehouse::controller
