// Verifies the attempt lifecycle in the controller's domain service (issue 5): lease expiry
// after missed heartbeats, lost attempts and their retries, cancel, stale events, and the
// waiting reason a queued cell shows. Time is a fake clock: no test sleeps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/artifacts.h"
#include "common/sha256.h"
#include "controller/controller_core.h"
#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using testing::TempDir;
using namespace std::chrono_literals;

using testing::RecordingChannel;

class ControllerCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeCheckpoint(dir_.path());
    auto store = Store::Open((dir_.path() / "g.db").string(), [this] { return Now(); });
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    LeaseConfig lease;
    lease.heartbeat_interval = 5s;
    lease.missed_heartbeats = 3;
    lease.retry_limit = 2;
    core_ = std::make_unique<ControllerCore>(*store_, freezer_, lease, [this] { return Now(); });
  }

  std::chrono::system_clock::time_point Now() const {
    return std::chrono::system_clock::time_point(std::chrono::milliseconds(now_ms_.load()));
  }
  void Advance(std::chrono::milliseconds d) { now_ms_ += d.count(); }

  /// Registers and attaches agent `name` holding `held` (Register.running_attempt_ids).
  std::shared_ptr<RecordingChannel> Connect(const std::string& name, std::vector<int64_t> held = {},
                                            int slots = 1) {
    auto channel = std::make_shared<RecordingChannel>();
    AgentHello hello{name, "{}", slots};
    hello.held_attempts = std::move(held);
    EXPECT_TRUE(core_->RegisterAgent(hello).ok());
    EXPECT_TRUE(core_->AttachAgent(name, hello, channel).ok());
    return channel;
  }

  std::string Submit() {
    const std::string body = json{{"repository", "/repos/adapt"},
                                  {"branch", "main"},
                                  {"model_family", "llama"},
                                  {"checkpoint", (dir_.path() / "ckpt").string()},
                                  {"reference", (dir_.path() / "reference").string()}}
                                 .dump();
    auto outcome = core_->Submit(body, "ci");
    EXPECT_TRUE(outcome.ok()) << outcome.status().ToString();
    return outcome.ok() ? outcome->cell.cell.id : "";
  }

  CellDetail Cell(const std::string& id) {
    auto d = core_->GetCell(id);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? *d : CellDetail{};
  }

  std::atomic<int64_t> now_ms_{1'700'000'000'000};
  TempDir dir_;
  testing::FakeCommitResolver resolver_;
  DigestCache digests_;
  CellFreezer freezer_{SubmitContext{}, resolver_, digests_};
  std::unique_ptr<Store> store_;
  std::unique_ptr<ControllerCore> core_;
};

TEST_F(ControllerCoreTest, SilentAgentsAttemptIsLostAndRetriedElsewhere) {
  // Verifies an agent silent for more than 3 heartbeat intervals loses its running attempt
  // (lost, not failed, reason naming the agent), the cell gets attempt 2 (retry_of = 1) which
  // goes to the agent that still heartbeats, and the silent agent gets no new work.
  auto gone = Connect("gone");
  const std::string id = Submit();
  ASSERT_EQ(gone->AssignedIds().size(), 1u);
  const int64_t first = gone->AssignedIds()[0];
  ASSERT_TRUE(core_->RecordEvent("gone", first, 1, R"({"event":"phase_start","phase":"identity"})").ok());
  auto alive = Connect("alive");

  Advance(14s);  // within 3 x 5 s
  ASSERT_TRUE(core_->Heartbeat("alive").ok());
  EXPECT_EQ(core_->ExpireLeases(), 0);
  EXPECT_EQ(Cell(id).status, AttemptState::kRunning);

  Advance(2s);  // 16 s since "gone" was heard from
  ASSERT_TRUE(core_->Heartbeat("alive").ok());
  EXPECT_EQ(core_->ExpireLeases(), 1);
  const CellDetail d = Cell(id);
  ASSERT_EQ(d.attempts.size(), 2u);
  EXPECT_EQ(d.attempts[0].state, AttemptState::kLost);
  EXPECT_THAT(d.attempts[0].reason, HasSubstr("agent 'gone' unreachable: not heard from for 16.0 s"));
  EXPECT_EQ(d.attempts[1].retry_of, first);
  EXPECT_EQ(d.attempts[1].state, AttemptState::kLeased);
  EXPECT_EQ(d.attempts[1].agent_id, "alive");
  ASSERT_EQ(alive->AssignedIds().size(), 1u);
  EXPECT_EQ(alive->AssignedIds()[0], d.attempts[1].id);
  EXPECT_EQ(gone->AssignedIds().size(), 1u);
  EXPECT_EQ(core_->ExpireLeases(), 0) << "a lost attempt is lost once";
}

TEST_F(ControllerCoreTest, LateMessagesOfALostAttemptAreStaleNotApplied) {
  // Verifies that after the lease expired, the old agent's events are stored (resends stay
  // idempotent) but change nothing, and its AttemptEnd does not turn lost into passed.
  auto gone = Connect("gone");
  const std::string id = Submit();
  const int64_t first = gone->AssignedIds().at(0);
  Advance(16s);
  EXPECT_EQ(core_->ExpireLeases(), 1);
  ASSERT_TRUE(core_->RecordEvent("gone", first, 1, R"({"event":"phase_start","phase":"identity"})").ok());
  ASSERT_TRUE(core_->RecordEvent("gone", first, 2, R"({"event":"run_end","status":"PASS"})").ok());
  ASSERT_TRUE(core_->EndAttempt("gone", first, "finished", "", 0).ok());
  const CellDetail d = Cell(id);
  EXPECT_EQ(d.attempts[0].state, AttemptState::kLost);
  EXPECT_EQ(d.attempts[0].run_status, "");
  auto phases = store_->ListPhases(first);
  ASSERT_TRUE(phases.ok());
  EXPECT_TRUE(phases->empty()) << "a stale phase_start was applied";
}

TEST_F(ControllerCoreTest, RetriesStopAtTheLimit) {
  // Verifies a cell whose attempts keep getting lost is retried twice (attempts 2 and 3), and
  // the third loss leaves the cell lost with no attempt 4.
  const std::string id = Submit();
  for (int round = 0; round < 3; ++round) {
    auto agent = Connect("agent-" + std::to_string(round));
    ASSERT_EQ(agent->AssignedIds().size(), 1u) << "round " << round;
    Advance(16s);
    EXPECT_EQ(core_->ExpireLeases(), 1);
  }
  const CellDetail d = Cell(id);
  ASSERT_EQ(d.attempts.size(), 3u);
  for (const auto& a : d.attempts) EXPECT_EQ(a.state, AttemptState::kLost);
  EXPECT_EQ(d.status, AttemptState::kLost);
}

TEST_F(ControllerCoreTest, ReconnectWithinTheLeaseKeepsTheAttempt) {
  // Verifies a stream that drops and comes back within the lease keeps the attempt: the agent
  // goes on with its events and ends it; nothing is lost or retried.
  auto first_stream = Connect("flaky");
  const std::string id = Submit();
  const int64_t attempt = first_stream->AssignedIds().at(0);
  core_->DetachAgent("flaky", first_stream.get());
  Advance(10s);
  auto second_stream = Connect("flaky", {attempt});
  Advance(10s);  // 20 s after the assignment, 10 s after the reconnect
  EXPECT_EQ(core_->ExpireLeases(), 0);
  ASSERT_TRUE(core_->RecordEvent("flaky", attempt, 1, R"({"event":"run_end","status":"PASS"})").ok());
  ASSERT_TRUE(core_->EndAttempt("flaky", attempt, "finished", "", 0).ok());
  const CellDetail d = Cell(id);
  ASSERT_EQ(d.attempts.size(), 1u);
  EXPECT_EQ(d.status, AttemptState::kPassed);
  EXPECT_TRUE(second_stream->AssignedIds().empty());
}

TEST_F(ControllerCoreTest, AgentThatRegistersWithoutItsAttemptLosesIt) {
  // Verifies an agent that restarts (registers again not listing its attempt) loses that
  // attempt at once, and the retry goes to it; an agent that lists it keeps it. An agent
  // that still holds an attempt that was lost while it was away is told to cancel it.
  auto first = Connect("node");
  const std::string id = Submit();
  const int64_t attempt = first->AssignedIds().at(0);
  auto kept = Connect("node", {attempt});
  EXPECT_EQ(Cell(id).attempts.size(), 1u);
  EXPECT_TRUE(kept->cancels.empty());
  auto again = Connect("node");
  const CellDetail d = Cell(id);
  ASSERT_EQ(d.attempts.size(), 2u);
  EXPECT_EQ(d.attempts[0].state, AttemptState::kLost);
  EXPECT_THAT(d.attempts[0].reason, HasSubstr("registered again without attempt"));
  EXPECT_EQ(again->AssignedIds(), std::vector<int64_t>{d.attempts[1].id});

  auto stale = Connect("node", {attempt, d.attempts[1].id});
  ASSERT_EQ(stale->cancels.size(), 1u);
  EXPECT_EQ(stale->cancels[0].first, attempt);
  EXPECT_EQ(stale->cancels[0].second, "attempt already ended (lost) on the controller");
}

TEST_F(ControllerCoreTest, AgentThatComesBackFromSilenceGetsTheRetry) {
  // Verifies a single agent that was silent past its lease (its attempt lost, the retry
  // queued while no agent could take it) gets the retry as soon as it is heard from again.
  auto agent = Connect("solo");
  const std::string id = Submit();
  Advance(16s);
  EXPECT_EQ(core_->ExpireLeases(), 1);
  EXPECT_EQ(Cell(id).status, AttemptState::kQueued);
  ASSERT_TRUE(core_->Heartbeat("solo").ok());
  const CellDetail d = Cell(id);
  EXPECT_EQ(d.status, AttemptState::kLeased);
  EXPECT_EQ(agent->AssignedIds(), (std::vector<int64_t>{d.attempts[0].id, d.attempts[1].id}));
}

TEST_F(ControllerCoreTest, CancelMissedWhileAwayIsSentOnReconnect) {
  // Verifies a cancel requested while the agent's stream was down reaches the agent when it
  // registers again holding the attempt.
  auto agent = Connect("a");
  const std::string id = Submit();
  const int64_t attempt = agent->AssignedIds().at(0);
  core_->DetachAgent("a", agent.get());
  ASSERT_TRUE(core_->CancelCell(id, "stop").ok());
  auto back = Connect("a", {attempt});
  ASSERT_EQ(back->cancels.size(), 1u);
  EXPECT_EQ(back->cancels[0], std::make_pair(attempt, std::string("cancelled: stop")));
}

TEST_F(ControllerCoreTest, LeasesSurviveAControllerRestartWhileAgentsReconnect) {
  // Verifies a new ControllerCore over the same store (a restart) keeps a running attempt
  // while its agent may still reconnect (restart_grace, here 20 s), and expires it when the
  // agent stays away longer.
  Connect("a");
  const std::string id = Submit();
  LeaseConfig lease = core_->lease_config();
  lease.restart_grace = 20s;
  core_ = std::make_unique<ControllerCore>(*store_, freezer_, lease, [this] { return Now(); });
  Advance(19s);
  EXPECT_EQ(core_->ExpireLeases(), 0);
  EXPECT_EQ(Cell(id).status, AttemptState::kLeased);
  Advance(2s);
  EXPECT_EQ(core_->ExpireLeases(), 1);
  EXPECT_EQ(Cell(id).attempts.at(0).state, AttemptState::kLost);
}

TEST_F(ControllerCoreTest, CancelQueuedRunningAndEnded) {
  // Verifies cancel: a queued attempt ends cancelled at once; a running one is sent a Cancel
  // and ends cancelled when the agent reports the end (with the agent's reason); a second
  // cancel sends nothing more; an ended cell cannot be cancelled (FAILED_PRECONDITION).
  const std::string queued = Submit();
  auto cancelled = core_->CancelCell(queued, "wrong branch");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status().ToString();
  EXPECT_EQ(cancelled->status, AttemptState::kCancelled);
  EXPECT_EQ(cancelled->attempts[0].reason, "cancelled: wrong branch");

  auto agent = Connect("a");
  EXPECT_TRUE(agent->AssignedIds().empty()) << "a cancelled attempt was assigned";
  const std::string body = json{{"repository", "/repos/adapt"},
                                {"branch", "main"},
                                {"model_family", "llama"},
                                {"precision", "bf16"},
                                {"checkpoint", (dir_.path() / "ckpt").string()},
                                {"reference", (dir_.path() / "reference").string()}}
                               .dump();
  auto running = core_->Submit(body, "ci");
  ASSERT_TRUE(running.ok());
  const std::string id = running->cell.cell.id;
  const int64_t attempt = agent->AssignedIds().at(0);
  ASSERT_TRUE(core_->RecordEvent("a", attempt, 1, R"({"event":"phase_start","phase":"identity"})").ok());
  ASSERT_TRUE(core_->CancelCell(id, "").ok());
  ASSERT_TRUE(core_->CancelCell(id, "again").ok());
  ASSERT_EQ(agent->cancels.size(), 1u);
  EXPECT_EQ(agent->cancels[0], std::make_pair(attempt, std::string("cancelled: requested")));
  EXPECT_EQ(Cell(id).status, AttemptState::kRunning);
  ASSERT_TRUE(core_->EndAttempt("a", attempt, "error", "worker exited with code 143 (signal 15) before run_end (cancelled)", 143).ok());
  const CellDetail d = Cell(id);
  EXPECT_EQ(d.status, AttemptState::kCancelled);
  EXPECT_EQ(d.attempts[0].reason,
            "cancelled: requested; worker exited with code 143 (signal 15) before run_end (cancelled)");

  auto again = core_->CancelCell(id, "");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("already ended (cancelled)"));
  EXPECT_EQ(core_->CancelCell("nope", "").status().code(), StatusCode::kNotFound);
}

TEST_F(ControllerCoreTest, AnAttemptTheAgentReportsLostIsRetriedLikeAnExpiredLease) {
  // Verifies outcome "lost" (a Slurm node failure, protocols.md §3.5): the attempt ends lost
  // with the agent's reason and the cell gets its next attempt (retry_of), up to the retry
  // limit; with a cancel requested, the same end is a cancel, not a retry.
  auto agent = Connect("a");
  const std::string id = Submit();
  const int64_t first = agent->AssignedIds().at(0);
  ASSERT_TRUE(core_->RecordEvent("a", first, 1, R"({"event":"phase_start","phase":"identity"})").ok());
  ASSERT_TRUE(core_->EndAttempt("a", first, "lost", "slurm job 7 NODE_FAIL (NodeDown) on n1", 0).ok());
  CellDetail d = Cell(id);
  ASSERT_EQ(d.attempts.size(), 2u);
  EXPECT_EQ(d.attempts[0].state, AttemptState::kLost);
  EXPECT_EQ(d.attempts[0].reason, "slurm job 7 NODE_FAIL (NodeDown) on n1");
  EXPECT_EQ(d.attempts[1].retry_of, first);
  EXPECT_FALSE(IsTerminal(d.attempts[1].state));

  const int64_t second = d.attempts[1].id;
  ASSERT_TRUE(core_->CancelCell(id, "enough").ok());
  ASSERT_TRUE(core_->EndAttempt("a", second, "lost", "slurm job 8 CANCELLED", 0).ok());
  d = Cell(id);
  ASSERT_EQ(d.attempts.size(), 2u);
  EXPECT_EQ(d.status, AttemptState::kCancelled);
}

TEST_F(ControllerCoreTest, CancelledAttemptWhoseAgentIsLostIsNotRetried) {
  // Verifies a cancel recorded for an agent that then goes silent ends the attempt cancelled
  // at lease expiry, without a retry.
  auto agent = Connect("a");
  const std::string id = Submit();
  ASSERT_TRUE(core_->CancelCell(id, "stop").ok());
  Advance(16s);
  EXPECT_EQ(core_->ExpireLeases(), 1);
  const CellDetail d = Cell(id);
  ASSERT_EQ(d.attempts.size(), 1u);
  EXPECT_EQ(d.status, AttemptState::kCancelled);
  EXPECT_THAT(d.attempts[0].reason, HasSubstr("cancelled: stop; agent 'a' unreachable"));
}

TEST_F(ControllerCoreTest, TheRunsEndStatusDecidesTheAttemptsState) {
  // Verifies the agent's end maps the worker's run_end: PASS -> passed, FAIL -> failed (a
  // verdict, not retryable), BLOCKED -> blocked (an input from outside the adapter was
  // unusable: no verdict, retryable), UNKNOWN -> error (no verdict), and no run_end -> error.
  auto agent = Connect("a");
  const std::string id = Submit();
  struct Case {
    std::string run_status;
    AttemptState want;
    bool retryable;
  };
  const std::vector<Case> cases = {{"BLOCKED", AttemptState::kBlocked, true},
                                   {"UNKNOWN", AttemptState::kError, true},
                                   {"", AttemptState::kError, true},
                                   {"FAIL", AttemptState::kFailed, false}};
  for (const Case& c : cases) {
    const int64_t attempt = agent->AssignedIds().back();
    if (!c.run_status.empty()) {
      ASSERT_TRUE(core_->RecordEvent("a", attempt, 1,
                                     json{{"event", "run_end"}, {"status", c.run_status}}.dump())
                      .ok());
    }
    ASSERT_TRUE(core_->EndAttempt("a", attempt, "finished", "", 0).ok());
    const CellDetail d = Cell(id);
    EXPECT_EQ(d.status, c.want) << c.run_status;
    if (!c.run_status.empty()) {
      EXPECT_THAT(d.attempts.back().reason, HasSubstr("run_end status " + c.run_status));
    }
    auto retry = core_->RetryCell(id);
    EXPECT_EQ(retry.ok(), c.retryable) << c.run_status << ": " << retry.status().ToString();
  }
  EXPECT_EQ(agent->AssignedIds().size(), 4u) << "each retry placed once";
}

TEST_F(ControllerCoreTest, QueuedCellSaysWhyItWaits) {
  // Verifies a cell no agent can run carries the scheduler's reason, and a cell with no agent
  // at all says so.
  const std::string id = Submit();
  EXPECT_EQ(Cell(id).waiting_reason, "no agent connected");
  const std::string body = json{{"repository", "/repos/adapt"},
                                {"branch", "main"},
                                {"model_family", "llama"},
                                {"device", "cuda"},
                                {"topology", {{"tp", 2}}},
                                {"checkpoint", (dir_.path() / "ckpt").string()},
                                {"reference", (dir_.path() / "reference").string()}}
                               .dump();
  auto cuda = core_->Submit(body, "ci");
  ASSERT_TRUE(cuda.ok());
  Connect("cpu-box", {}, /*slots=*/2);  // takes the CPU cell; the CUDA one needs GPUs
  EXPECT_EQ(Cell(id).status, AttemptState::kLeased);
  EXPECT_EQ(Cell(id).waiting_reason, "");
  EXPECT_EQ(Cell(cuda->cell.cell.id).waiting_reason, "cpu-box: 0 of 0 GPUs free, needs 2");
}

// Controls before variants: a validation cell naming no reference waits for the reference
// cell of its checkpoint, which runs first, and gets its bundle as inputs.
class ReferenceCellTest : public ControllerCoreTest {
 protected:
  void SetUp() override {
    ControllerCoreTest::SetUp();
    auto blobs = BlobStore::Open(dir_.path() / "artifacts", BlobLimits{1 << 20});
    ASSERT_TRUE(blobs.ok()) << blobs.status().ToString();
    blobs_ = std::move(*blobs);
    core_->SetBlobStore(blobs_.get());
  }

  /// An agent that runs reference cells (transformers 5.24.0) and validation cells.
  std::shared_ptr<RecordingChannel> ConnectReferenceAgent(const std::string& name) {
    auto channel = std::make_shared<RecordingChannel>();
    AgentHello hello{name, "{}", 1};
    hello.transformers_version = "5.24.0";
    EXPECT_TRUE(core_->RegisterAgent(hello).ok());
    EXPECT_TRUE(core_->AttachAgent(name, hello, channel).ok());
    return channel;
  }

  /// A validation body naming no reference.
  std::string AutoBody(int max_new_tokens = 32) const {
    return json{{"repository", "/repos/adapt"},
                {"branch", "main"},
                {"model_family", "llama"},
                {"decode", {{"max_new_tokens", max_new_tokens}}},
                {"checkpoint", (dir_.path() / "ckpt").string()}}
        .dump();
  }

  /// Stores `bytes` as artifact `name` of `attempt` through the core, as PutArtifact does.
  Status Upload(const std::string& agent, int64_t attempt, const std::string& name,
                const std::string& bytes, std::string digest = "") {
    if (digest.empty()) digest = "sha256:" + Sha256Hex(bytes);
    GH_ASSIGN_OR_RETURN(auto writer, core_->BeginArtifact(agent, attempt, name, digest,
                                                          static_cast<int64_t>(bytes.size())));
    GH_RETURN_IF_ERROR(writer->Append(bytes));
    GH_RETURN_IF_ERROR(writer->Commit());
    return core_->RecordArtifact(agent, attempt, name, digest, static_cast<int64_t>(bytes.size()))
        .status();
  }

  /// Ends `attempt` of `agent` with run_end `status` (event number `seq`).
  void Finish(const std::string& agent, int64_t attempt, const std::string& status,
              int64_t seq = 1) {
    ASSERT_TRUE(core_->RecordEvent(agent, attempt, seq,
                                   json{{"event", "run_end"}, {"status", status}}.dump())
                    .ok());
    ASSERT_TRUE(core_->EndAttempt(agent, attempt, "finished", "", 0).ok());
  }

  /// One artifact retention pass; the count of blobs it expired (-1 on an error).
  int Expire() {
    auto n = core_->ExpireArtifacts();
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return n.ok() ? *n : -1;
  }

  std::unique_ptr<BlobStore> blobs_;
};

TEST_F(ReferenceCellTest, TheReferenceRunsFirstAndItsBundleGoesWithTheValidationCell) {
  // Verifies the reference cell is stored and placed first, the validation cell waits naming
  // it, an agent without transformers takes no reference cell, the validation cell is placed
  // once the reference passed, with the bundle's files as inputs, and a resubmit creates no
  // second reference cell.
  auto plain = Connect("plain");  // no transformers: no reference cells
  auto outcome = core_->Submit(AutoBody(), "ci");
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  const CellDetail validation = outcome->cell;
  const std::string ref_id = ParseCellSpecJson(validation.cell.spec_json)->reference.cell;
  ASSERT_EQ(ref_id.size(), 64u);
  EXPECT_THAT(Cell(ref_id).waiting_reason,
              HasSubstr("plain: runs no reference cells (no transformers reported) (the "
                        "reference cell pins 5.24.0)"));
  EXPECT_THAT(Cell(validation.cell.id).waiting_reason,
              HasSubstr("waiting for its reference cell " + ref_id.substr(0, 12) + " (queued)"));
  EXPECT_TRUE(plain->AssignedIds().empty());

  auto ref_agent = ConnectReferenceAgent("ref");
  ASSERT_EQ(ref_agent->AssignedIds().size(), 1u);
  const int64_t ref_attempt = ref_agent->AssignedIds()[0];
  EXPECT_EQ(ref_agent->sent[0].cell_id, ref_id);
  EXPECT_TRUE(ref_agent->sent[0].inputs.empty());
  // The reference cell's state as it is now, not as the pass that placed it saw it.
  EXPECT_THAT(Cell(validation.cell.id).waiting_reason,
              HasSubstr("waiting for its reference cell " + ref_id.substr(0, 12) + " (leased)"));
  ASSERT_TRUE(core_->RecordEvent("ref", ref_attempt, 1,
                                 R"({"event":"phase_start","phase":"reference"})").ok());
  EXPECT_THAT(Cell(validation.cell.id).waiting_reason,
              HasSubstr("waiting for its reference cell " + ref_id.substr(0, 12) + " (running)"));
  EXPECT_TRUE(plain->AssignedIds().empty());

  ASSERT_TRUE(Upload("ref", ref_attempt, "reference/reference.json", "{\"format\":1}").ok());
  ASSERT_TRUE(Upload("ref", ref_attempt, "reference/reference.safetensors", "tensors").ok());
  Finish("ref", ref_attempt, "PASS", /*seq=*/2);
  EXPECT_EQ(Cell(ref_id).status, AttemptState::kPassed);
  ASSERT_EQ(Cell(ref_id).artifacts.size(), 2u);

  ASSERT_EQ(plain->sent.size(), 1u);  // the validation cell, now placeable
  const AssignmentMessage& a = plain->sent[0];
  EXPECT_EQ(a.cell_id, validation.cell.id);
  ASSERT_EQ(a.inputs.size(), 2u);
  EXPECT_EQ(a.inputs[0].role, "reference");
  EXPECT_EQ(a.inputs[0].name, "reference.json");
  EXPECT_EQ(a.inputs[0].digest, "sha256:" + Sha256Hex("{\"format\":1}"));
  EXPECT_EQ(a.inputs[1].name, "reference.safetensors");
  EXPECT_EQ(a.inputs[1].size, 7);

  auto again = core_->Submit(AutoBody(), "ci");
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
  auto cells = core_->ListCells(100, 0);
  ASSERT_TRUE(cells.ok());
  EXPECT_EQ(cells->size(), 2u) << "one reference cell and one validation cell";
}

TEST_F(ReferenceCellTest, AReferenceThatFailsBlocksTheCellsWaitingForIt) {
  // Verifies a validation cell whose reference cell ended without PASS ends `blocked` without
  // running, its reason naming the reference cell and why it failed; a control that is not a
  // reference cell holds a variant back the same way.
  auto ref_agent = ConnectReferenceAgent("ref");
  auto outcome = core_->Submit(AutoBody(), "ci");
  ASSERT_TRUE(outcome.ok());
  const std::string id = outcome->cell.cell.id;
  const std::string ref_id = ParseCellSpecJson(outcome->cell.cell.spec_json)->reference.cell;
  const int64_t ref_attempt = ref_agent->AssignedIds().at(0);
  ASSERT_TRUE(core_->RecordEvent("ref", ref_attempt, 1,
                                 R"({"event":"phase_end","phase":"reference","status":"FAIL",)"
                                 R"("reason":"transformers cannot load the checkpoint: boom"})")
                  .ok());
  Finish("ref", ref_attempt, "FAIL", /*seq=*/2);
  const CellDetail d = Cell(id);
  EXPECT_EQ(d.status, AttemptState::kBlocked);
  EXPECT_THAT(d.attempts.back().reason, HasSubstr("blocked: its reference cell " + ref_id +
                                                  " ended failed (attempt 1)"));
  EXPECT_THAT(d.attempts.back().reason, HasSubstr("transformers cannot load the checkpoint"));
  EXPECT_EQ(ref_agent->sent.size(), 1u) << "the blocked cell is never assigned";

  // A variant naming a control: it waits while the control runs, runs once it passed.
  const std::string control_body =
      json{{"repository", "/repos/adapt"}, {"branch", "main"}, {"model_family", "llama"},
           {"checkpoint", (dir_.path() / "ckpt").string()},
           {"reference", (dir_.path() / "reference").string()}}
          .dump();
  auto control = core_->Submit(control_body, "ci");
  ASSERT_TRUE(control.ok());
  json variant_body = json::parse(control_body);
  variant_body["precision"] = "bf16";
  variant_body["control"] = control->cell.cell.id;
  auto variant = core_->Submit(variant_body.dump(), "ci");
  ASSERT_TRUE(variant.ok()) << variant.status().ToString();
  const int64_t control_attempt = ref_agent->AssignedIds().at(1);
  EXPECT_THAT(Cell(variant->cell.cell.id).waiting_reason,
              HasSubstr("waiting for its control " + control->cell.cell.id.substr(0, 12)));
  Finish("ref", control_attempt, "PASS");
  EXPECT_EQ(Cell(variant->cell.cell.id).status, AttemptState::kLeased);
  EXPECT_TRUE(ref_agent->sent.back().inputs.empty());

  variant_body["control"] = std::string(64, '0');
  auto unknown = core_->Submit(variant_body.dump(), "ci");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("field 'control': no cell"));
  variant_body.erase("control");
  variant_body["reference"] = {{"cell", control->cell.cell.id}};
  auto not_reference = core_->Submit(variant_body.dump(), "ci");
  EXPECT_THAT(not_reference.status().message(), HasSubstr("is not a reference cell"));
}

TEST_F(ReferenceCellTest, ARetryRunsAReferenceThatEndedInErrorAndTheCellBlockedBehindIt) {
  // Verifies RetryCell: a reference cell that ended `error` (an infrastructure failure, no
  // verdict) blocked its validation cell; retrying the validation cell queues attempt 2 of the
  // reference cell first (retry_of its attempt 1) and attempt 2 of the validation cell, which
  // waits for it and runs once it passed. A verdict (passed, failed), a cell still running, or
  // one waiting for a reference that FAILed is not retried (FAILED_PRECONDITION).
  auto ref_agent = ConnectReferenceAgent("ref");
  auto outcome = core_->Submit(AutoBody(), "ci");
  ASSERT_TRUE(outcome.ok());
  const std::string id = outcome->cell.cell.id;
  const std::string ref_id = ParseCellSpecJson(outcome->cell.cell.spec_json)->reference.cell;
  const int64_t ref_attempt = ref_agent->AssignedIds().at(0);
  auto running = core_->RetryCell(ref_id);
  EXPECT_EQ(running.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(running.status().message(), HasSubstr("is leased, not ended"));
  ASSERT_TRUE(core_->EndAttempt("ref", ref_attempt, "error", "reference runner: venv missing", 0).ok());
  ASSERT_EQ(Cell(ref_id).status, AttemptState::kError);
  ASSERT_EQ(Cell(id).status, AttemptState::kBlocked);

  auto retried = core_->RetryCell(id);
  ASSERT_TRUE(retried.ok()) << retried.status().ToString();
  const CellDetail ref = Cell(ref_id);
  ASSERT_EQ(ref.attempts.size(), 2u);
  EXPECT_EQ(ref.attempts[1].retry_of, ref_attempt);
  EXPECT_EQ(ref.status, AttemptState::kLeased);  // placed again at once
  ASSERT_EQ(retried->attempts.size(), 2u);
  EXPECT_EQ(retried->status, AttemptState::kQueued);
  EXPECT_THAT(retried->waiting_reason, HasSubstr("waiting for its reference cell"));
  const int64_t ref_retry = ref_agent->AssignedIds().at(1);
  ASSERT_TRUE(Upload("ref", ref_retry, "reference/reference.json", "{}").ok());
  ASSERT_TRUE(Upload("ref", ref_retry, "reference/reference.safetensors", "tensors").ok());
  Finish("ref", ref_retry, "PASS");
  EXPECT_EQ(Cell(id).status, AttemptState::kLeased);
  EXPECT_EQ(ref_agent->sent.back().attempt_id, Cell(id).attempts.back().id);
  Finish("ref", ref_agent->sent.back().attempt_id, "PASS");

  auto verdict = core_->RetryCell(id);
  EXPECT_EQ(verdict.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(verdict.status().message(), HasSubstr("has a verdict (passed, attempt 2)"));
  EXPECT_EQ(core_->RetryCell(std::string(64, 'f')).status().code(), StatusCode::kNotFound);

  // A reference that FAILed is a verdict on the checkpoint: the cell behind it stays blocked.
  auto other = core_->Submit(AutoBody(/*max_new_tokens=*/8), "ci");
  ASSERT_TRUE(other.ok());
  const std::string other_ref = ParseCellSpecJson(other->cell.cell.spec_json)->reference.cell;
  Finish("ref", Cell(other_ref).attempts.back().id, "FAIL");
  ASSERT_EQ(Cell(other->cell.cell.id).status, AttemptState::kBlocked);
  auto blocked = core_->RetryCell(other->cell.cell.id);
  EXPECT_EQ(blocked.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(blocked.status().message(), HasSubstr("which ended failed"));
  EXPECT_EQ(Cell(other->cell.cell.id).attempts.size(), 1u);

  // A refusal changes nothing: a cell whose reference cell ended `error` (retryable) and whose
  // control FAILed is refused, and its reference cell is not queued again either.
  json body = json::parse(AutoBody(/*max_new_tokens=*/4));
  body["control"] = other_ref;
  auto both = core_->Submit(body.dump(), "ci");
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  const std::string both_ref = ParseCellSpecJson(both->cell.cell.spec_json)->reference.cell;
  ASSERT_TRUE(core_->EndAttempt("ref", Cell(both_ref).attempts.back().id, "error", "oom", 0).ok());
  ASSERT_EQ(Cell(both->cell.cell.id).status, AttemptState::kBlocked);
  auto refused = core_->RetryCell(both->cell.cell.id);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Cell(both_ref).attempts.size(), 1u);
  EXPECT_EQ(Cell(both->cell.cell.id).attempts.size(), 1u);
}

TEST_F(ReferenceCellTest, ArtifactsAreCheckedBeforeTheyAreStored) {
  // Verifies an upload is refused whole when its bytes are not the announced digest or size,
  // when it is over the size limit, under a bad name, or from an agent the attempt is not
  // leased to; a resend of the same file is a no-op, another file under the same name is
  // refused; only recorded blobs are served.
  auto ref_agent = ConnectReferenceAgent("ref");
  ASSERT_TRUE(core_->Submit(AutoBody(), "ci").ok());
  const int64_t attempt = ref_agent->AssignedIds().at(0);
  const std::string wrong = "sha256:" + Sha256Hex("other bytes");
  Status s = Upload("ref", attempt, "reference/reference.json", "bytes", wrong);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("has digest sha256:" + Sha256Hex("bytes")));
  EXPECT_EQ(core_->ArtifactPath(wrong).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(core_->BeginArtifact("ref", attempt, "reference/reference.safetensors", wrong, 2 << 20)
                .status()
                .code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(core_->BeginArtifact("ref", attempt, "reference/extra.bin", wrong, 1).status().code(),
            StatusCode::kInvalidArgument)
      << "a reference cell stores its bundle's two files only";
  EXPECT_EQ(core_->BeginArtifact("ref", attempt, "../etc/passwd", wrong, 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->BeginArtifact("ref", attempt, "a//b", wrong, 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->BeginArtifact("other", attempt, "reference/reference.json", wrong, 1)
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  auto writer = core_->BeginArtifact("ref", attempt, "reference/reference.json",
                                     "sha256:" + Sha256Hex("ab"), 2);
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ((*writer)->Append("abc").code(), StatusCode::kInvalidArgument);

  ASSERT_TRUE(Upload("ref", attempt, "reference/reference.json", "bytes").ok());
  auto resend = core_->RecordArtifact("ref", attempt, "reference/reference.json",
                                      "sha256:" + Sha256Hex("bytes"), 5);
  ASSERT_TRUE(resend.ok());
  EXPECT_FALSE(*resend);
  EXPECT_EQ(Upload("ref", attempt, "reference/reference.json", "changed").code(),
            StatusCode::kAlreadyExists);
  auto path = core_->ArtifactPath("sha256:" + Sha256Hex("bytes"));
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  std::ifstream in(*path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "bytes");
  EXPECT_EQ(core_->ArtifactPath("sha256:zz").status().code(), StatusCode::kInvalidArgument);

  // A validation cell stores its plot data only (common/artifacts.h), within the size cap; an
  // ended attempt stores nothing more.
  auto plain = Connect("plain");
  const std::string validation = Submit();
  const int64_t v_attempt = plain->AssignedIds().at(0);
  EXPECT_EQ(core_->BeginArtifact("plain", v_attempt, "reference/reference.json", wrong, 1)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->BeginArtifact("plain", v_attempt, "inference/other.json", wrong, 1)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->BeginArtifact("plain", v_attempt, "inference/kl_by_position.json", wrong,
                                 kValidationArtifactMaxBytes + 1)
                .status()
                .code(),
            StatusCode::kResourceExhausted);
  ASSERT_TRUE(Upload("plain", v_attempt, "inference/kl_by_position.json", "{\"prompts\": []}").ok());
  Finish("ref", attempt, "PASS");
  EXPECT_EQ(core_->BeginArtifact("ref", attempt, "reference/reference.safetensors",
                                 "sha256:" + Sha256Hex("t"), 1)
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  (void)validation;
}

TEST_F(ReferenceCellTest, AnUnusedBundleIsRemovedAndMadeAgainWhenACellNeedsIt) {
  // Verifies artifact retention (--artifact-retention-days): a bundle is kept while used
  // (stored, handed to a cell, fetched), removed once unused for the retention time (the rows
  // stay, naming when), a fetch then says why it is gone, and a new cell needing it runs the
  // reference cell again (attempt 2, retry_of the passed attempt 1) and gets the bundle it
  // stores. A blob that an attempt still going stored is never removed.
  core_->SetArtifactRetention(24h);
  auto agent = ConnectReferenceAgent("ref");
  auto first = core_->Submit(AutoBody(), "ci");
  ASSERT_TRUE(first.ok());
  const std::string ref_id = ParseCellSpecJson(first->cell.cell.spec_json)->reference.cell;
  const int64_t ref1 = agent->AssignedIds().at(0);
  const std::string json_digest = "sha256:" + Sha256Hex("{\"format\":1}");
  ASSERT_TRUE(Upload("ref", ref1, "reference/reference.json", "{\"format\":1}").ok());
  ASSERT_TRUE(Upload("ref", ref1, "reference/reference.safetensors", "tensors").ok());
  Advance(25h);  // stored long ago, but its attempt is still going
  ASSERT_TRUE(core_->Heartbeat("ref").ok());
  EXPECT_EQ(Expire(), 0);
  Finish("ref", ref1, "PASS");
  ASSERT_EQ(agent->sent.size(), 2u);  // the validation cell, handed the bundle now
  Finish("ref", agent->sent[1].attempt_id, "PASS");

  Advance(23h);
  ASSERT_TRUE(core_->Heartbeat("ref").ok());
  EXPECT_EQ(Expire(), 0) << "used 23 h ago";
  ASSERT_TRUE(core_->ArtifactPath(json_digest).ok());  // a fetch is a use
  Advance(23h);
  ASSERT_TRUE(core_->Heartbeat("ref").ok());
  EXPECT_EQ(Expire(), 1) << "the safetensors file, unused 46 h";
  Advance(2h);
  ASSERT_TRUE(core_->Heartbeat("ref").ok());
  EXPECT_EQ(Expire(), 1) << "the json, unused 25 h";
  EXPECT_EQ(blobs_->Path(json_digest).status().code(), StatusCode::kNotFound) << "file removed";
  auto gone = core_->ArtifactPath(json_digest);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("removed at"));
  EXPECT_THAT(gone.status().message(), HasSubstr("by artifact retention"));
  const CellDetail ref = Cell(ref_id);
  ASSERT_EQ(ref.artifacts.size(), 2u) << "the record of what attempt 1 stored stays";
  EXPECT_FALSE(ref.artifacts[0].expired_at.empty());
  EXPECT_EQ(Expire(), 0) << "expired once";

  // A new cell on the same reference: the reference cell runs again first.
  json body = json::parse(AutoBody());
  body["precision"] = "bf16";
  auto second = core_->Submit(body.dump(), "ci");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_EQ(ParseCellSpecJson(second->cell.cell.spec_json)->reference.cell, ref_id);
  ASSERT_EQ(agent->sent.size(), 3u);
  EXPECT_EQ(agent->sent[2].cell_id, ref_id);
  const CellDetail again = Cell(ref_id);
  ASSERT_EQ(again.attempts.size(), 2u);
  EXPECT_EQ(again.attempts[1].retry_of, ref1);
  EXPECT_EQ(again.attempts[1].state, AttemptState::kLeased);
  EXPECT_THAT(Cell(second->cell.cell.id).waiting_reason,
              HasSubstr("it makes its bundle again (artifact retention removed attempt 1's)"));
  const int64_t ref2 = agent->sent[2].attempt_id;
  ASSERT_TRUE(Upload("ref", ref2, "reference/reference.json", "{\"format\":1}").ok());
  ASSERT_TRUE(Upload("ref", ref2, "reference/reference.safetensors", "tensors").ok());
  EXPECT_TRUE(core_->ArtifactPath(json_digest).ok()) << "the same bytes are stored again";
  Finish("ref", ref2, "PASS");
  ASSERT_EQ(agent->sent.size(), 4u);
  const AssignmentMessage& a = agent->sent[3];
  EXPECT_EQ(a.cell_id, second->cell.cell.id);
  ASSERT_EQ(a.inputs.size(), 2u);
  EXPECT_EQ(a.inputs[0].digest, json_digest);
}

TEST_F(ReferenceCellTest, OverTheCapTheLeastRecentlyUsedBundleGoesFirst) {
  // Verifies --artifact-max-total-bytes: while the stored blobs hold more bytes than the cap,
  // the least recently used are removed first and only until the store is under it; a blob
  // used within the last hour is never removed by the cap, even over it.
  core_->SetArtifactRetention(std::chrono::hours(0), /*max_total_bytes=*/150);
  auto agent = ConnectReferenceAgent("ref");
  std::vector<std::string> refs;
  for (int tokens : {32, 8}) {
    auto v = core_->Submit(AutoBody(tokens), "ci");
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    refs.push_back(ParseCellSpecJson(v->cell.cell.spec_json)->reference.cell);
    const int64_t ref_attempt = agent->sent.back().attempt_id;
    const std::string tag = std::to_string(tokens);
    ASSERT_TRUE(Upload("ref", ref_attempt, "reference/reference.json",
                       "json-" + tag + std::string(10 - 5 - tag.size(), '.'))
                    .ok());
    ASSERT_TRUE(
        Upload("ref", ref_attempt, "reference/reference.safetensors", tag + std::string(98, 'x'))
            .ok());
    Finish("ref", ref_attempt, "PASS");
    Finish("ref", agent->sent.back().attempt_id, "PASS");  // its validation cell
    Advance(10min);
    ASSERT_TRUE(core_->Heartbeat("ref").ok());
  }
  EXPECT_EQ(Expire(), 0) << "219 bytes over a cap of 150, but all used within the hour";
  Advance(2h);
  ASSERT_TRUE(core_->Heartbeat("ref").ok());
  EXPECT_EQ(Expire(), 2) << "the first bundle's two blobs (110 bytes): 109 left, under 150";
  for (const ArtifactRecord& a : Cell(refs[0]).artifacts) EXPECT_FALSE(a.expired_at.empty()) << a.name;
  for (const ArtifactRecord& a : Cell(refs[1]).artifacts) EXPECT_TRUE(a.expired_at.empty()) << a.name;
  EXPECT_EQ(Expire(), 0) << "under the cap now";
}

TEST_F(ReferenceCellTest, ABlobRemovedWhileItWasUploadedAgainIsUploadedOnceMore) {
  // Verifies the race between retention and an upload of bytes already stored: the upload's
  // commit keeps the file it finds, retention then removes it (no record of the new attempt
  // yet), and recording the artifact is UNAVAILABLE (the agent uploads again) rather than a
  // record of a file that is gone.
  core_->SetArtifactRetention(24h);
  auto agent = ConnectReferenceAgent("ref");
  auto first = core_->Submit(AutoBody(32), "ci");
  ASSERT_TRUE(first.ok());
  const int64_t a32 = agent->AssignedIds().at(0);
  ASSERT_TRUE(Upload("ref", a32, "reference/reference.json", "same").ok());
  Finish("ref", a32, "PASS");  // half a bundle: its validation cell is blocked
  auto second = core_->Submit(AutoBody(8), "ci");
  ASSERT_TRUE(second.ok());
  const int64_t a8 = agent->sent.back().attempt_id;
  const std::string digest = "sha256:" + Sha256Hex("same");
  auto writer = core_->BeginArtifact("ref", a8, "reference/reference.json", digest, 4);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  ASSERT_TRUE((*writer)->Append("same").ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  Advance(25h);
  ASSERT_TRUE(core_->Heartbeat("ref").ok());
  EXPECT_EQ(Expire(), 1);
  auto recorded = core_->RecordArtifact("ref", a8, "reference/reference.json", digest, 4);
  EXPECT_EQ(recorded.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(recorded.status().message(), HasSubstr("upload it again"));
  ASSERT_TRUE(Upload("ref", a8, "reference/reference.json", "same").ok());
  EXPECT_TRUE(core_->ArtifactPath(digest).ok());
}

TEST_F(ReferenceCellTest, OnlyTheCellsOwnReferenceBringsItsBundle) {
  // Verifies a cell whose control is another reference cell waits for both but gets only its
  // own reference cell's files as inputs, and that a reference cell that stored half a bundle
  // blocks the cells waiting for it.
  auto ref_agent = ConnectReferenceAgent("ref");
  auto first = core_->Submit(AutoBody(32), "ci");
  ASSERT_TRUE(first.ok());
  const std::string ref32 = ParseCellSpecJson(first->cell.cell.spec_json)->reference.cell;
  const int64_t a32 = ref_agent->AssignedIds().at(0);
  ASSERT_TRUE(Upload("ref", a32, "reference/reference.json", "json32").ok());
  ASSERT_TRUE(Upload("ref", a32, "reference/reference.safetensors", "tensors32").ok());
  Finish("ref", a32, "PASS");
  ASSERT_EQ(ref_agent->sent.size(), 2u);  // then the first validation cell
  Finish("ref", ref_agent->sent[1].attempt_id, "PASS");

  // A reference cell for 8 new tokens that stores only reference.json.
  auto half = core_->Submit(AutoBody(8), "ci");
  ASSERT_TRUE(half.ok());
  const std::string ref8 = ParseCellSpecJson(half->cell.cell.spec_json)->reference.cell;
  const int64_t a8 = ref_agent->sent.at(2).attempt_id;
  ASSERT_EQ(ref_agent->sent[2].cell_id, ref8);
  ASSERT_TRUE(Upload("ref", a8, "reference/reference.json", "json8").ok());
  Finish("ref", a8, "PASS");
  EXPECT_EQ(Cell(half->cell.cell.id).status, AttemptState::kBlocked);
  EXPECT_THAT(Cell(half->cell.cell.id).attempts.back().reason,
              HasSubstr("did not store a whole reference bundle"));

  json body = json::parse(AutoBody(32));
  body["reference"] = {{"cell", ref32}};
  body["control"] = ref8;
  body["precision"] = "bf16";
  auto variant = core_->Submit(body.dump(), "ci");
  ASSERT_TRUE(variant.ok()) << variant.status().ToString();
  ASSERT_EQ(ref_agent->sent.size(), 4u);
  const AssignmentMessage& a = ref_agent->sent[3];
  EXPECT_EQ(a.cell_id, variant->cell.cell.id);
  ASSERT_EQ(a.inputs.size(), 2u);
  for (const InputArtifact& in : a.inputs) {
    EXPECT_TRUE(in.digest == "sha256:" + Sha256Hex("json32") ||
                in.digest == "sha256:" + Sha256Hex("tensors32"))
        << in.name << " " << in.digest;
  }
}

}  // namespace
}  // namespace gatehouse::controller

namespace gatehouse::controller {
namespace {

// Time limits (TimeLimits, --queued-timeout-s / --attempt-timeout-s / --phase-timeout-s).
class TimeLimitTest : public ControllerCoreTest {
 protected:
  void UseLimits(std::chrono::seconds queued, std::chrono::seconds attempt,
                 std::chrono::seconds phase) {
    LeaseConfig lease;
    lease.heartbeat_interval = 5s;
    TimeLimits limits{queued, attempt, phase};
    core_ = std::make_unique<ControllerCore>(*store_, freezer_, lease, [this] { return Now(); },
                                             limits);
  }
  // Advances `total` in heartbeat steps, so `agent` never looks silent.
  void AdvanceAlive(const std::string& agent, std::chrono::seconds total) {
    for (auto t = 0s; t < total; t += 4s) {
      Advance(std::min<std::chrono::milliseconds>(4s, total - t));
      ASSERT_TRUE(core_->Heartbeat(agent).ok());
    }
  }
};

TEST_F(TimeLimitTest, AnAttemptQueuedTooLongTimesOutWithItsWaitingReason) {
  UseLimits(60s, 0s, 0s);
  const std::string id = Submit();
  Advance(59s);
  EXPECT_EQ(core_->EnforceTimeLimits(), 0);
  EXPECT_EQ(Cell(id).status, AttemptState::kQueued);
  Advance(2s);
  EXPECT_EQ(core_->EnforceTimeLimits(), 1);
  const CellDetail d = Cell(id);
  ASSERT_EQ(d.attempts.size(), 1u);
  EXPECT_EQ(d.status, AttemptState::kTimedOut);
  EXPECT_THAT(d.attempts[0].reason, HasSubstr("timed out: queued since"));
  EXPECT_THAT(d.attempts[0].reason, HasSubstr("limit of 60 s (--queued-timeout-s)"));
  EXPECT_EQ(core_->EnforceTimeLimits(), 0) << "timed out once";
  auto late = Connect("late");
  EXPECT_TRUE(late->AssignedIds().empty()) << "a timed-out attempt is never leased";
}

TEST_F(TimeLimitTest, AnAttemptOverItsLimitIsStoppedAndEndsTimedOutWithoutRetry) {
  UseLimits(0s, 100s, 0s);
  auto agent = Connect("a");
  const std::string id = Submit();
  ASSERT_EQ(agent->AssignedIds().size(), 1u);
  const int64_t attempt = agent->AssignedIds()[0];
  ASSERT_TRUE(core_->RecordEvent("a", attempt, 1, R"({"event":"phase_start","phase":"identity"})").ok());
  AdvanceAlive("a", 99s);
  EXPECT_EQ(core_->EnforceTimeLimits(), 0);
  AdvanceAlive("a", 2s);
  EXPECT_EQ(core_->EnforceTimeLimits(), 1);
  ASSERT_EQ(agent->cancels.size(), 1u);
  EXPECT_EQ(agent->cancels[0].first, attempt);
  EXPECT_THAT(agent->cancels[0].second, HasSubstr("over the attempt limit of 100 s"));
  EXPECT_EQ(core_->EnforceTimeLimits(), 0) << "one stop request per attempt";
  EXPECT_EQ(agent->cancels.size(), 1u);
  // The agent stops the worker group and reports the end: timed_out, not cancelled or error.
  ASSERT_TRUE(core_->EndAttempt("a", attempt, "error", "stopped: worker killed", 137).ok());
  const CellDetail d = Cell(id);
  ASSERT_EQ(d.attempts.size(), 1u) << "a timeout is not retried";
  EXPECT_EQ(d.status, AttemptState::kTimedOut);
  EXPECT_THAT(d.attempts[0].reason, HasSubstr("attempt limit"));
  EXPECT_THAT(d.attempts[0].reason, HasSubstr("worker killed"));
}

TEST_F(TimeLimitTest, APhaseOverItsLimitStopsTheAttemptFinishedPhasesDoNotCount) {
  UseLimits(0s, 0s, 30s);
  auto agent = Connect("a");
  const std::string id = Submit();
  const int64_t attempt = agent->AssignedIds().at(0);
  ASSERT_TRUE(core_->RecordEvent("a", attempt, 1, R"({"event":"phase_start","phase":"identity"})").ok());
  AdvanceAlive("a", 20s);
  ASSERT_TRUE(core_->RecordEvent("a", attempt, 2,
      R"({"event":"phase_end","phase":"identity","status":"PASS","duration_ms":20000})").ok());
  ASSERT_TRUE(core_->RecordEvent("a", attempt, 3, R"({"event":"phase_start","phase":"training"})").ok());
  AdvanceAlive("a", 25s);  // 45 s into the attempt, 25 s into training
  EXPECT_EQ(core_->EnforceTimeLimits(), 0);
  AdvanceAlive("a", 6s);
  EXPECT_EQ(core_->EnforceTimeLimits(), 1);
  ASSERT_EQ(agent->cancels.size(), 1u);
  EXPECT_THAT(agent->cancels[0].second, HasSubstr("phase 'training'"));
  EXPECT_THAT(agent->cancels[0].second, HasSubstr("phase limit of 30 s"));
  ASSERT_TRUE(core_->EndAttempt("a", attempt, "error", "stopped", 143).ok());
  EXPECT_EQ(Cell(id).status, AttemptState::kTimedOut);
}

TEST_F(TimeLimitTest, AStoppedAttemptWhoseAgentIsLostEndsTimedOut) {
  UseLimits(0s, 10s, 0s);
  auto agent = Connect("a");
  const std::string id = Submit();
  AdvanceAlive("a", 11s);
  EXPECT_EQ(core_->EnforceTimeLimits(), 1);
  Advance(16s);  // the agent goes silent before it reports the end
  EXPECT_EQ(core_->ExpireLeases(), 1);
  const CellDetail d = Cell(id);
  ASSERT_EQ(d.attempts.size(), 1u) << "neither lost nor retried";
  EXPECT_EQ(d.status, AttemptState::kTimedOut);
  EXPECT_THAT(d.attempts[0].reason, HasSubstr("timed out"));
  EXPECT_THAT(d.attempts[0].reason, HasSubstr("unreachable"));
}

TEST_F(TimeLimitTest, ACancelAfterATimeoutKeepsTheTimeout) {
  UseLimits(0s, 10s, 0s);
  auto agent = Connect("a");
  const std::string id = Submit();
  const int64_t attempt = agent->AssignedIds().at(0);
  AdvanceAlive("a", 11s);
  ASSERT_EQ(core_->EnforceTimeLimits(), 1);
  ASSERT_TRUE(core_->CancelCell(id, "impatient").ok());
  ASSERT_TRUE(core_->EndAttempt("a", attempt, "error", "stopped", 143).ok());
  EXPECT_EQ(Cell(id).status, AttemptState::kTimedOut) << "the first stop request decides";
}

}  // namespace
}  // namespace gatehouse::controller

namespace gatehouse::controller {
namespace {

TEST_F(ControllerCoreTest, ADrainingAgentGetsWorkOnlyOnceItsCleanupIsClean) {
  auto agent = Connect("a");
  ASSERT_TRUE(core_->Heartbeat("a", "cleanup after attempt 3: port 29500 still in use").ok());
  const std::string id = Submit();
  EXPECT_TRUE(agent->AssignedIds().empty());
  EXPECT_THAT(Cell(id).waiting_reason, HasSubstr("a: draining (cleanup after attempt 3"));
  ASSERT_TRUE(core_->Heartbeat("a", "").ok());  // a clean recheck: scheduling runs at once
  EXPECT_EQ(agent->AssignedIds().size(), 1u);
  EXPECT_EQ(Cell(id).status, AttemptState::kLeased);
}

TEST_F(ControllerCoreTest, AnAgentThatRegistersDrainingGetsNoWork) {
  auto channel = std::make_shared<RecordingChannel>();
  AgentHello hello{"a", "{}", 1};
  hello.drain_reason = "cleanup after attempt 9: GPU 0: 4096 MiB used, baseline 0 MiB";
  ASSERT_TRUE(core_->RegisterAgent(hello).ok());
  ASSERT_TRUE(core_->AttachAgent("a", hello, channel).ok());
  Submit();
  EXPECT_TRUE(channel->AssignedIds().empty());
}

}  // namespace
}  // namespace gatehouse::controller

namespace gatehouse::controller {
namespace {

// Verifies the name check is repeated at attach: two instances that both registered before
// either attached (a race between their streams) cannot both attach; the second is refused
// with ALREADY_EXISTS and work keeps going to the first.
// Verifies leases run on the monotonic clock, not the wall clock: a wall-clock step of an hour
// (NTP, an operator) expires nothing, while 16 s on the lease clock (3 missed 5 s heartbeats)
// loses the attempt.
TEST_F(ControllerCoreTest, LeasesRunOnTheMonotonicClockNotTheWallClock) {
  std::atomic<int64_t> mono_ms{5'000};
  LeaseConfig lease = core_->lease_config();
  core_ = std::make_unique<ControllerCore>(
      *store_, freezer_, lease, [this] { return Now(); }, TimeLimits{}, SchedulingPolicy{},
      [&mono_ms] {
        return std::chrono::steady_clock::time_point(std::chrono::milliseconds(mono_ms.load()));
      });
  auto agent = Connect("steady");
  const std::string id = Submit();
  ASSERT_EQ(agent->AssignedIds().size(), 1u);
  Advance(1h);  // the wall clock jumps
  EXPECT_EQ(core_->ExpireLeases(), 0);
  EXPECT_EQ(Cell(id).attempts.at(0).state, AttemptState::kLeased);
  mono_ms += 16'000;
  EXPECT_EQ(core_->ExpireLeases(), 1);
  EXPECT_EQ(Cell(id).attempts.at(0).state, AttemptState::kLost);
}

TEST_F(ControllerCoreTest, TwoInstancesThatBothRegisteredCannotBothAttach) {
  AgentHello one{"b", "{}", 1};
  one.instance_id = "one";
  AgentHello two{"b", "{}", 1};
  two.instance_id = "two";
  ASSERT_TRUE(core_->RegisterAgent(one).ok());
  ASSERT_TRUE(core_->RegisterAgent(two).ok());  // "one" is not attached yet
  auto first = std::make_shared<RecordingChannel>();
  ASSERT_TRUE(core_->AttachAgent("b", one, first).ok());
  auto second = std::make_shared<RecordingChannel>();
  const Status refused = core_->AttachAgent("b", two, second);
  EXPECT_EQ(refused.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(refused.message(), HasSubstr("agent 'b' is already connected"));
  Submit();
  EXPECT_EQ(first->AssignedIds().size(), 1u);
  EXPECT_TRUE(second->AssignedIds().empty());
}

TEST_F(ControllerCoreTest, ASecondAgentWithTheSameNameCannotTakeOverTheFirstOnesLeases) {
  // Instance "one" of agent "a" holds an attempt; instance "two" registering as "a" is refused
  // while "one" is heard from, so the attempt stays leased to "one". The same instance
  // reconnecting is fine, and once "one" is silent a new instance may take the name.
  AgentHello one{"a", "{}", 1};
  one.instance_id = "one";
  ASSERT_TRUE(core_->RegisterAgent(one).ok());
  auto channel = std::make_shared<RecordingChannel>();
  ASSERT_TRUE(core_->AttachAgent("a", one, channel).ok());
  const std::string id = Submit();
  ASSERT_EQ(channel->AssignedIds().size(), 1u);
  const int64_t attempt = channel->AssignedIds()[0];

  AgentHello two{"a", "{}", 1};
  two.instance_id = "two";
  auto refused = core_->RegisterAgent(two);
  ASSERT_EQ(refused.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(refused.status().message(), HasSubstr("agent 'a' is already connected"));
  EXPECT_EQ(Cell(id).attempts.at(0).state, AttemptState::kLeased);
  EXPECT_TRUE(core_->RegisterAgent(one).ok()) << "the same instance reconnecting";

  // A Register that names no instance cannot take the name either.
  AgentHello anonymous{"a", "{}", 1};
  EXPECT_EQ(core_->RegisterAgent(anonymous).status().code(), StatusCode::kAlreadyExists);

  Advance(16s);  // "one" goes silent (3 x 5 s)
  ASSERT_TRUE(core_->RegisterAgent(two).ok());
  ASSERT_TRUE(core_->AttachAgent("a", two, std::make_shared<RecordingChannel>()).ok());  // holds nothing
  const CellDetail d = Cell(id);
  EXPECT_EQ(d.attempts.at(0).id, attempt);
  EXPECT_EQ(d.attempts.at(0).state, AttemptState::kLost) << "the new instance does not hold it";
}

// Verifies the background work: once started, the passes Submit asks for run on the scheduler
// thread and place a burst of 8 submits on one agent with 8 slots; starting or stopping it
// twice is harmless, and once stopped Schedule() places on the caller's thread again (before
// Submit returns).
TEST_F(ControllerCoreTest, TheSchedulerThreadPlacesWhatSubmitsQueue) {
  auto agent = Connect("threaded", {}, /*slots=*/8);
  core_->StartBackgroundWork();
  core_->StartBackgroundWork();  // idempotent
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    const std::string body = json{{"repository", "/repos/adapt"},
                                  {"branch", "main"},
                                  {"model_family", "llama"},
                                  {"checkpoint", (dir_.path() / "ckpt").string()},
                                  {"reference", (dir_.path() / "reference").string()},
                                  {"env", {{"RUN", std::to_string(i)}}}}
                                 .dump();
    auto outcome = core_->Submit(body, "ci");
    ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
    ids.push_back(outcome->cell.cell.id);
  }
  for (int i = 0; i < 500 && agent->AssignedIds().size() < 8; ++i) {
    std::this_thread::sleep_for(10ms);  // the thread's passes, bounded at 5 s
  }
  EXPECT_EQ(agent->AssignedIds().size(), 8u);
  for (const std::string& id : ids) EXPECT_EQ(Cell(id).status, AttemptState::kLeased) << id;
  {
    std::lock_guard lock(agent->mu);
    for (const std::thread::id sender : agent->sender_threads) {
      EXPECT_NE(sender, std::this_thread::get_id()) << "a pass ran on the submitting thread";
    }
  }
  core_->StopBackgroundWork();
  core_->StopBackgroundWork();
  auto late = Connect("late");
  const std::string id = Submit();  // no thread: placed before Submit returns
  EXPECT_EQ(late->AssignedIds().size(), 1u);
  EXPECT_EQ(late->sender_threads.at(0), std::this_thread::get_id());
  EXPECT_EQ(Cell(id).status, AttemptState::kLeased);
}

}  // namespace
}  // namespace gatehouse::controller
