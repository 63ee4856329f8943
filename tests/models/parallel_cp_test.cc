// The parallel gate's context-parallel check (worker_lib/src/parallel/cp_batch.cc, run by the
// data-parallel check when cp > 1) on the transformers-saved fixtures: each data-parallel
// share packed into one row (cu_seqlens, positions restarting per sequence) and its columns
// split over the cp ranks, attention over the whole packing through Ulysses' all-to-all, one
// thread per rank over a real gloo group on 127.0.0.1, two AdamW steps against the
// single-rank control.
//
// Mutation, caught by named figures: each cp rank numbering its columns' positions from its
// own first column (a sequence begun on an earlier rank restarts at 0), the bug of context
// parallelism over packed batches without global position ids.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "common/mesh.h"
#include "tests/models/family_test_util.h"
#include "tests/models/parallel_ranks.h"
#include "worker_lib/src/parallel/dp_run.h"
#include "worker_lib/src/parallel/parallel_internal.h"

namespace gatehouse {
namespace {

using ::testing::HasSubstr;
using worker::GateOutcome;
using Mode = worker::parallel::DpReduction::Mode;

CellSpec::Topology Cp(int cp, int dp = 1, int tp = 1, int dp_shard = 1) {
  CellSpec::Topology t;
  t.cp = cp;
  t.dp = dp;
  t.tp = tp;
  t.dp_shard = dp_shard;
  return t;
}

std::string Label(const CellSpec::Topology& t) { return test_util::MeshLabel(t); }

double Real(const GateOutcome& out, const std::string& name) { return test_util::RealFigure(out, name); }
int64_t Count(const GateOutcome& out, const std::string& name) { return test_util::CountFigure(out, name); }

const std::vector<std::string> kShown = {
    "cp_logits_kl_mean", "cp_logits_max_abs_diff", "cp_logits_top1_percent", "cp_tokens_trimmed",
    "loss_step_1_rel_diff", "loss_step_2_rel_diff", "grad_norm_step_1_rel_diff",
    "grad_norm_step_2_rel_diff", "grad_max_rel_diff", "grad_order_floor_max_rel",
    "grad_nearest_bar_tensor", "grad_later_max_rel_diff", "replica_max_abs_diff",
    "params_after_max_abs_diff", "expert_tokens_max_abs_diff", "optimizer_state_elements_rank0",
    "optimizer_state_elements_unsharded", "save_tensors_bit_equal", "global_batch_tokens",
    "cp_groups", "ep_groups"};

/// Expects every rank to PASS with the packed logits, losses and norms equal to the
/// control's within the bars.
void ExpectCpParity(const std::string& variant, const std::string& family,
                    const CellSpec::Topology& topology, const std::string& precision = "fp32",
                    GateOutcome* rank0 = nullptr) {
  SCOPED_TRACE(variant + " " + Label(topology) + " " + precision);
  const test_util::RankOutcomes run = test_util::RunParallelRanks(variant, family, topology, precision);
  ASSERT_TRUE(test_util::EveryRankPassed(run));
  const GateOutcome& out = run.outcomes[0];
  test_util::PrintFigures(variant + " " + Label(topology) + " " + precision, out, kShown);
  // Share 0's logits under cp are the single-rank packed forward's.
  EXPECT_GT(Count(out, "cp_logits_tokens"), 0);
  EXPECT_LT(Real(out, "cp_logits_kl_mean"), precision == "bf16" ? 1e-3 : 1e-6);
  const double loss_bar = precision == "bf16" ? 1e-2 : 1e-5;
  for (const char* step : {"1", "2"}) {
    EXPECT_LT(Real(out, std::string("loss_step_") + step + "_rel_diff"), loss_bar) << step;
    EXPECT_LT(Real(out, std::string("grad_norm_step_") + step + "_rel_diff"), loss_bar) << step;
  }
  EXPECT_LT(Real(out, "grad_nearest_bar_rel_diff"), Real(out, "grad_nearest_bar_bar"));
  EXPECT_EQ(Real(out, "replica_max_abs_diff"), 0.0);
  // The optimizer state is sharded over dp_shard x cp.
  EXPECT_LT(Count(out, "optimizer_state_elements_rank0"),
            Count(out, "optimizer_state_elements_unsharded"));
  EXPECT_THAT(test_util::FigureText(out, "replicated_by"), HasSubstr("Ulysses"));
  EXPECT_THAT(test_util::FigureText(out, "grad_nearest_bar_checkpoint_key"), HasSubstr("model.layers."));
  if (rank0 != nullptr) *rank0 = out;
}

// Verifies cp=2 and cp=4 (the packing's columns over 2 and 4 ranks; at cp=4 the two KV heads
// repeated to the four query heads before the exchange) against the single-rank control.
TEST(ContextParallelTest, MatchesTheSingleRankControl) {
  ExpectCpParity("llama-tiny-untied", "llama", Cp(2));
  ExpectCpParity("llama-tiny-untied", "llama", Cp(4));
}

// Verifies cp with the other dimensions: dp=2 x cp=2 (two packings, each over its cp pair),
// cp=2 x tp=2 (each tp rank's heads split again over cp), a MoE model (every routing counted
// once over the cp ranks), sliding-window layers (gemma2) and bf16.
TEST(ContextParallelTest, CombinedLayoutsMatchTheSingleRankControl) {
  ExpectCpParity("llama-tiny-untied", "llama", Cp(2, 2));
  ExpectCpParity("llama-tiny-tied", "llama", Cp(2, 1, 2));
  ExpectCpParity("qwen3_moe-tiny-untied", "qwen3_moe", Cp(2));
  ExpectCpParity("gemma2-tiny-untied", "gemma2", Cp(2));
  ExpectCpParity("qwen3-tiny-untied", "qwen3", Cp(2), "bf16");
}

// Verifies positions restarted at each cp rank's first column (no global position ids over
// the packing) FAIL: share 0's logits differ from the single-rank packed forward
// (cp_logits_kl_mean) and so does the loss.
TEST(ContextParallelTest, LocalPositionsAreCaught) {
  worker::parallel::DpReduction reduction;
  reduction.mode = Mode::kCpLocalPositions;
  const test_util::RankOutcomes run = test_util::RunParallelRanks(
      "llama-tiny-untied", "llama", Cp(2), "fp32", nullptr, [&](worker::GateContext& ctx) {
        const Mesh mesh = *Mesh::Make(ctx.spec.topology.mesh_shape(), 64);
        return worker::parallel::DataParallelParity(ctx, mesh, GateOutcome{}, reduction);
      });
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  test_util::PrintFigures("mutation '" + reduction.Name() + "' llama-tiny-untied cp=2 fp32", out,
                          {"cp_logits_kl_mean", "cp_logits_top1_percent", "loss_step_1_rel_diff",
                           "grad_nearest_bar_tensor", "grad_nearest_bar_rel_diff"});
  std::cout << "[parallel figures] reason: " << out.reason << std::endl;
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_GT(Real(out, "cp_logits_kl_mean"), 1e-6);
  EXPECT_GT(Real(out, "loss_step_1_rel_diff"), 1e-5);
  EXPECT_THAT(out.reason, HasSubstr("under cp=2"));
}

// Verifies the batch is cut until each share's packing divides by cp: the longest sequence
// shortened by the excess; with one share, a sequence too short to give it up left out whole
// (three 2-token prompts at cp=2 keep two); a share that cannot be cut is named.
TEST(ContextParallelTest, TheBatchIsCutToAMultipleOfCp) {
  const auto ids = [](int64_t n) { return torch::arange(n, torch::kLong); };
  std::string why;
  std::vector<torch::Tensor> batch = {ids(5), ids(9)};  // 4 + 8 columns
  EXPECT_EQ(worker::parallel::TrimForContextParallel(batch, 1, 5, why), 2);
  EXPECT_EQ(batch[1].size(0), 7);  // the longest gave up 2: 10 columns
  batch = {ids(2), ids(2), ids(2)};  // 3 columns
  EXPECT_EQ(worker::parallel::TrimForContextParallel(batch, 1, 2, why), 2);
  EXPECT_EQ(batch.size(), 2u);
  batch = {ids(2), ids(5), ids(2), ids(6)};  // share 0: 1 + 1 columns, share 1: 4 + 5
  EXPECT_EQ(worker::parallel::TrimForContextParallel(batch, 2, 2, why), 1);
  batch = {ids(3), ids(2), ids(3), ids(2), ids(3), ids(2)};  // share 1: 3 columns of 1 each
  EXPECT_EQ(worker::parallel::TrimForContextParallel(batch, 2, 2, why), -1);
  EXPECT_THAT(why, HasSubstr("data-parallel share 1 packs 3 columns in 3 sequence(s)"));
}

// Verifies a layout the check cannot run BLOCKs with the reason: cp not dividing the query
// heads (3 ranks, 4 heads).
TEST(ContextParallelTest, BlockedWhereItCannotRun) {
  {
    const test_util::RankOutcomes run = test_util::RunParallelRanks("llama-tiny-untied", "llama", Cp(3), "fp32");
    EXPECT_EQ(run.outcomes[0].status, GateStatus::kBlocked);
    EXPECT_THAT(run.outcomes[0].reason, HasSubstr("does not divide the 4 query heads"));
  }
}

// Verifies cp with expert parallelism borrowing the cp ranks (torchtitan's ep over dp_shard x
// cp): each MoE layer's experts split over the EP group, every cp rank dispatching its own
// columns' tokens; ep=2 over cp=2, and ep=4 over dp_shard=2 x cp=2.
TEST(ContextParallelTest, WithExpertParallelismMatchesTheSingleRankControl) {
  for (const CellSpec::Topology& base : {Cp(2), Cp(2, 1, 1, 2)}) {
    CellSpec::Topology t = base;
    t.ep = static_cast<int>(t.cp * t.dp_shard);
    t.etp = 1;  // = tp
    GateOutcome out;
    ExpectCpParity("qwen3_moe-tiny-untied", "qwen3_moe", t, "fp32", &out);
    // Every routing counted once, the save gathered over the EP group the control's.
    EXPECT_EQ(Count(out, "expert_tokens_max_abs_diff"), 0);
    EXPECT_EQ(Count(out, "save_tensors_bit_equal"), Count(out, "save_tensors"));
    EXPECT_THAT(test_util::FigureText(out, "replicated_by"), HasSubstr("experts split over the EP group"));
  }
}

}  // namespace
}  // namespace gatehouse
