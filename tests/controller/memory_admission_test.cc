// Verifies memory admission through the controller's domain service (issue 38): a cell whose
// estimate fits no agent that ever registered is refused at submit naming the figures, one
// that fits only an agent not connected waits with the memory reason, the assignment carries
// the estimate, and an OOM kill at the limit raises the next attempt's estimate.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "controller/controller_core.h"
#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace std::chrono_literals;
using testing::RecordingChannel;
using testing::TempDir;

class MemoryAdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 8 MB of bf16 weights: 4 M parameters; a worker rank's formula is about 1.1 GB.
    testing::WriteFile(dir_.path() / "ckpt" / "config.json",
                       R"({"model_type":"llama","torch_dtype":"bfloat16"})");
    testing::WriteBigFile(dir_.path() / "ckpt" / "model.safetensors", 8'000'000);
    testing::WriteFile(dir_.path() / "reference" / "reference.json", "{}");
    testing::WriteFile(dir_.path() / "reference" / "reference.safetensors", "r");
    auto store = Store::Open((dir_.path() / "g.db").string(), [this] { return Now(); });
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    LeaseConfig lease;
    core_ = std::make_unique<ControllerCore>(*store_, freezer_, lease, [this] { return Now(); });
  }

  std::chrono::system_clock::time_point Now() const {
    return std::chrono::system_clock::time_point(1'700'000'000'000ms);
  }

  /// An agent whose node has `memory` bytes: registered (known to admission) and, with
  /// `attach`, connected (schedulable).
  std::shared_ptr<RecordingChannel> Agent(const std::string& name, int64_t memory, bool attach) {
    AgentHello hello{name, json{{"memory_bytes", std::to_string(memory)}}.dump(), 1};
    hello.memory_bytes = memory;
    EXPECT_TRUE(core_->RegisterAgent(hello).ok());
    if (!attach) return nullptr;
    auto channel = std::make_shared<RecordingChannel>();
    EXPECT_TRUE(core_->AttachAgent(name, hello, channel).ok());
    return channel;
  }

  Result<SubmitOutcome> Submit() {
    return core_->Submit(json{{"repository", "/repos/adapt"},
                              {"branch", "main"},
                              {"model_family", "llama"},
                              {"checkpoint", (dir_.path() / "ckpt").string()},
                              {"reference", (dir_.path() / "reference").string()}}
                             .dump(),
                         "ci");
  }

  TempDir dir_;
  testing::FakeCommitResolver resolver_;
  DigestCache digests_;
  CellFreezer freezer_{SubmitContext{}, resolver_, digests_};
  std::unique_ptr<Store> store_;
  std::unique_ptr<ControllerCore> core_;
};

TEST_F(MemoryAdmissionTest, ACellNoAgentCouldEverHoldIsRefusedAtSubmit) {
  Agent("small", 1'500'000'000, /*attach=*/false);
  auto refused = Submit();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the cell fits no agent that ever registered (1 known; the largest, "
                        "small: needs ~1.1 GB of host memory (worker rank ~1.1 GB), the node "
                        "has 1.5 GB (426 MB usable))"));
  auto cells = core_->ListCells(10, 0);
  ASSERT_TRUE(cells.ok());
  EXPECT_TRUE(cells->empty()) << "a refused cell is not stored";
}

TEST_F(MemoryAdmissionTest, ACellThatFitsOnlyAnAgentNotConnectedWaitsNamingTheFigures) {
  Agent("big", 25'000'000'000, /*attach=*/false);  // could hold it: admitted
  auto small = Agent("small", 1'500'000'000, /*attach=*/true);
  auto outcome = Submit();
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  const std::string id = outcome->cell.cell.id;
  auto cell = core_->GetCell(id);
  ASSERT_TRUE(cell.ok());
  EXPECT_EQ(cell->status, AttemptState::kQueued);
  EXPECT_THAT(cell->waiting_reason,
              HasSubstr("small: needs ~1.1 GB of host memory (worker rank ~1.1 GB), the node "
                        "has 1.5 GB (426 MB usable)"));
  EXPECT_TRUE(small->AssignedIds().empty());
  // The cell shows what it is held to, and how that was reached.
  ASSERT_EQ(cell->memory_estimate.processes.size(), 1u);
  EXPECT_EQ(cell->memory_estimate.processes[0].basis, "formula");
  EXPECT_EQ(cell->memory_estimate.Describe(), "worker rank ~1.1 GB");
  // The agent that holds it connects: placed, with the estimate in the assignment.
  auto big = Agent("big", 25'000'000'000, /*attach=*/true);
  ASSERT_EQ(big->AssignedIds().size(), 1u);
  EXPECT_GT(big->sent[0].memory_estimate_bytes, 1'000'000'000);
  EXPECT_LT(big->sent[0].memory_estimate_bytes, 1'200'000'000);
  EXPECT_THAT(big->sent[0].memory_estimate, HasSubstr("worker rank ~1.1 GB"));
}

TEST_F(MemoryAdmissionTest, AnOomKillAtTheLimitRaisesTheRetrysEstimate) {
  auto big = Agent("big", 25'000'000'000, /*attach=*/true);
  auto outcome = Submit();
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  ASSERT_EQ(big->AssignedIds().size(), 1u);
  const int64_t first = big->AssignedIds()[0];
  const int64_t estimate = big->sent[0].memory_estimate_bytes;
  ASSERT_TRUE(core_->RecordEvent("big", first, 1, R"({"event":"phase_start","phase":"identity"})")
                  .ok());
  const int64_t limit = estimate + (int64_t{1} << 30);
  ASSERT_TRUE(core_->EndAttempt("big", first, "error",
                                "the attempt's cgroup reached its memory limit", 137, limit)
                  .ok());
  auto retried = core_->RetryCell(outcome->cell.cell.id);
  ASSERT_TRUE(retried.ok()) << retried.status().ToString();
  ASSERT_EQ(big->AssignedIds().size(), 2u);
  // The same processes on the same input: the limit it was killed at, plus 10%.
  EXPECT_EQ(big->sent[1].memory_estimate_bytes, std::llround(static_cast<double>(limit) * 1.1));
  auto peaks = store_->ListMemoryPeaks(10);
  ASSERT_TRUE(peaks.ok());
  ASSERT_EQ(peaks->size(), 1u);
  EXPECT_EQ((*peaks)[0].attempt_id, first);
  EXPECT_EQ((*peaks)[0].peak_bytes, limit);
  EXPECT_EQ((*peaks)[0].estimate_bytes, estimate);
}

TEST_F(MemoryAdmissionTest, AFinishedAttemptsPeakFigureCalibrates) {
  auto big = Agent("big", 25'000'000'000, /*attach=*/true);
  auto outcome = Submit();
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  const int64_t first = big->AssignedIds().at(0);
  ASSERT_TRUE(core_->RecordEvent("big", first, 1,
                                 R"({"event":"phase_start","phase":"load"})").ok());
  ASSERT_TRUE(core_->RecordEvent("big", first, 2,
                                 json{{"event", "figure"}, {"phase", "load"},
                                      {"name", "peak_rss_bytes"}, {"value", 700'000'000},
                                      {"unit", "bytes"}}.dump())
                  .ok());
  ASSERT_TRUE(core_->RecordEvent("big", first, 3,
                                 json{{"event", "run_end"}, {"status", "PASS"}}.dump()).ok());
  ASSERT_TRUE(core_->EndAttempt("big", first, "finished", "", 0).ok());
  auto peaks = store_->ListMemoryPeaks(10);
  ASSERT_TRUE(peaks.ok());
  ASSERT_EQ(peaks->size(), 1u);
  EXPECT_EQ((*peaks)[0].peak_bytes, 700'000'000);
  EXPECT_EQ((*peaks)[0].role, "worker rank");
}

}  // namespace
}  // namespace gatehouse::controller
