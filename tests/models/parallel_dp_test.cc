// The parallel gate's data-parallel check (worker_lib/src/parallel/dp_parity.cc) on the
// transformers-saved fixtures: dp=2, dp=3 and dp=2 x tp=2 ranks, one thread each over a real
// gloo group on 127.0.0.1 (and its dp and tp sub-groups), two AdamW steps on the reference
// prompts split over the replicas, against the single-rank control on the whole batch. The fixtures' three prompts (7, 33 and 300 tokens)
// split unevenly (rank 0 of dp=2 predicts 305 tokens, rank 1 32), which is what makes a
// per-rank token mean differ from the global one.
//
// Mutations of the reduction, each caught by a named figure: gradients averaged over the
// ranks instead of summed (global grad norm, step 1), each rank's own token mean averaged
// (DDP's default loss; the step-1 loss), no all-reduce at all (replicas drift apart), and under
// dp x tp the gradients summed over every rank instead of the dp group (the global grad norm).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <variant>

#include "common/mesh.h"
#include "tests/models/family_test_util.h"
#include "tests/models/parallel_ranks.h"
#include "worker_lib/src/parallel/dp_run.h"
#include "worker_lib/src/parallel/parallel_internal.h"

namespace gatehouse {
namespace {

using ::testing::HasSubstr;
using worker::GateOutcome;

CellSpec::Topology Dp(int dp, int tp = 1, int dp_shard = 1) {
  CellSpec::Topology t;
  t.dp = dp;
  t.tp = tp;
  t.dp_shard = dp_shard;
  return t;
}

CellSpec::Topology Fsdp(int dp_shard, int dp = 1, int tp = 1) { return Dp(dp, tp, dp_shard); }

std::string Label(const CellSpec::Topology& t) { return test_util::MeshLabel(t); }

double Real(const GateOutcome& out, const std::string& name) { return test_util::RealFigure(out, name); }
int64_t Count(const GateOutcome& out, const std::string& name) { return test_util::CountFigure(out, name); }

/// Expects every rank to PASS, replicas bit-equal and rank 0's figures within the bars.
void ExpectDpParity(const std::string& variant, const std::string& family,
                    const CellSpec::Topology& topology, const std::string& precision = "fp32") {
  const int dp = static_cast<int>(topology.dp * topology.dp_shard);
  SCOPED_TRACE(variant + " " + Label(topology) + " " + precision);
  const test_util::RankOutcomes run = test_util::RunParallelRanks(variant, family, topology, precision);
  ASSERT_TRUE(test_util::EveryRankPassed(run));
  const GateOutcome& out = run.outcomes[0];
  test_util::PrintFigures(variant + " " + Label(topology) + " " + precision, out,
                          {"loss_step_1", "loss_step_1_rel_diff", "loss_step_2_rel_diff",
                           "grad_norm_step_1", "grad_norm_step_1_rel_diff",
                           "grad_norm_step_2_rel_diff", "grad_max_rel_diff",
                           "grad_order_floor_max_rel", "grads_bit_equal", "grads_compared",
                           "grads_step1_bit_equal_to_grouping", "replica_max_abs_diff",
                           "params_after_max_abs_diff", "grad_nearest_bar_tensor",
                           "grad_later_max_rel_diff", "grad_later_max_rel_diff_tensor",
                           "optimizer_state_elements_rank0", "optimizer_state_elements_unsharded"});
  EXPECT_THAT(test_util::FigureText(out, "mesh"),
              HasSubstr("dp_replicate=" + std::to_string(topology.dp) +
                        " dp_shard=" + std::to_string(topology.dp_shard)));
  // The fixtures' 3 prompts, the longest cut in two for each rank beyond 3.
  EXPECT_EQ(Count(out, "global_batch_sequences"), std::max(dp, 3));
  EXPECT_EQ(Count(out, "global_batch_splits"), std::max(dp, 3) - 3);
  // Under dp_shard each rank holds the optimizer state of its slices only.
  const int64_t state = Count(out, "optimizer_state_elements_rank0");
  const int64_t unsharded = Count(out, "optimizer_state_elements_unsharded");
  if (topology.dp_shard > 1) {
    EXPECT_LT(state, unsharded);
    EXPECT_GE(state, unsharded / topology.dp_shard);
  } else {
    EXPECT_EQ(state, unsharded);
  }
  EXPECT_EQ(Real(out, "replica_max_abs_diff"), 0.0);
  // The save gathered from the ranks (tp shards) is the control's, bit for bit.
  EXPECT_GT(Count(out, "save_tensors"), 0);
  EXPECT_EQ(Count(out, "save_tensors_bit_equal"), Count(out, "save_tensors"));
  // The judged figures lead (a report shows the first few).
  ASSERT_FALSE(out.figures.empty());
  EXPECT_EQ(out.figures[0].name, "loss_step_1_rel_diff");
  const double loss_bar = precision == "bf16" ? 1e-2 : 1e-5;
  for (const char* step : {"1", "2"}) {
    EXPECT_GT(Real(out, std::string("loss_step_") + step), 0.0);
    EXPECT_LT(Real(out, std::string("loss_step_") + step + "_rel_diff"), loss_bar) << step;
    EXPECT_LT(Real(out, std::string("grad_norm_step_") + step + "_rel_diff"), loss_bar) << step;
  }
  EXPECT_LT(Real(out, "grad_nearest_bar_rel_diff"), Real(out, "grad_nearest_bar_bar"));
  if (topology.tp > 1 && dp == 2) {
    // Ranks are laid out tp fastest: the replicas are {0,1} and {2,3}, each a tp group.
    EXPECT_EQ(test_util::FigureText(out, "tp_groups"), "tp [0,1] [2,3]");
    EXPECT_EQ(test_util::FigureText(out, "dp_groups"),
              std::string(topology.dp > 1 ? "dp_replicate" : "dp_shard") + " [0,2] [1,3]");
  } else if (dp == 2) {
    // Two shares add the same way whatever the order: the reduced gradients are the control's
    // computed in the ranks' grouping, bit for bit.
    EXPECT_EQ(Count(out, "grads_step1_bit_equal_to_grouping"), Count(out, "grads_compared"));
  }
}

// Verifies dp=2 against the control on a dense model (tied and untied), a MoE model, and in
// bf16; dp=3 (one prompt per rank, a ring of three on gloo).
TEST(DataParallelTest, MatchesTheSingleRankControl) {
  ExpectDpParity("llama-tiny-untied", "llama", Dp(2));
  ExpectDpParity("llama-tiny-tied", "llama", Dp(2));
  ExpectDpParity("qwen3_moe-tiny-untied", "qwen3_moe", Dp(2));
  ExpectDpParity("qwen3-tiny-untied", "qwen3", Dp(2), "bf16");
  ExpectDpParity("llama-tiny-untied", "llama", Dp(3));
}

// Verifies dp_shard (FSDP's layout: each rank steps the optimizer state of its dim-0 slices,
// gathered after each step) against the control: dp_shard=2 on a dense and a MoE model (the
// MoE experts' stacked tensors sliced along the expert dimension), dp_shard=3 (rows that do
// not divide: the last slice shorter), HSDP (dp=2 x dp_shard=2: reduced over the shard group,
// then across replicas, the 300-token prompt cut in two for the fourth rank) and
// dp_shard=2 x tp=2.
TEST(DataParallelTest, ShardedOptimizerStateMatchesTheControl) {
  ExpectDpParity("llama-tiny-untied", "llama", Fsdp(2));
  ExpectDpParity("qwen3_moe-tiny-untied", "qwen3_moe", Fsdp(2));
  ExpectDpParity("llama-tiny-tied", "llama", Fsdp(3));
  ExpectDpParity("llama-tiny-untied", "llama", Fsdp(2, 2));
  ExpectDpParity("llama-tiny-tied", "llama", Fsdp(2, 1, 2));
}

// Verifies dp=2 x tp=2 against the control: each replica sharded over its own tp group (a
// sub-group of the world), gradients summed over the dp group, on a dense model with tied
// embeddings (vocabulary-parallel, shared with lm_head) and a MoE model.
TEST(DataParallelTest, TensorParallelReplicasMatchTheControl) {
  ExpectDpParity("llama-tiny-tied", "llama", Dp(2, 2));
  ExpectDpParity("qwen3_moe-tiny-untied", "qwen3_moe", Dp(2, 2));
}

/// Every rank's outcome of the data-parallel check with `reduction` instead of the gate's.
test_util::RankOutcomes RunMutated(worker::parallel::DpReduction::Mode mode,
                                   const CellSpec::Topology& topology = Dp(2)) {
  worker::parallel::DpReduction reduction;
  reduction.mode = mode;
  test_util::RankOutcomes run = test_util::RunParallelRanks(
      "llama-tiny-untied", "llama", topology, "fp32", nullptr, [&](worker::GateContext& ctx) {
        const Mesh mesh = *Mesh::Make(ctx.spec.topology.mesh_shape(), 64);
        return worker::parallel::DataParallelParity(ctx, mesh, GateOutcome{}, reduction);
      });
  test_util::PrintFigures("mutation '" + reduction.Name() + "' llama-tiny-untied " +
                              Label(topology) + " fp32",
                          run.outcomes[0],
                          {"loss_step_1_rel_diff", "grad_norm_step_1", "grad_norm_step_1_control",
                           "grad_max_rel_diff", "replica_max_abs_diff"});
  std::cout << "[parallel figures] reason: " << run.outcomes[0].reason << std::endl;
  return run;
}

// Verifies gradients averaged over the ranks (the loss already divided by the global token
// count) FAIL: the global grad norm is half the control's.
TEST(DataParallelTest, AveragedGradientsAreCaught) {
  const test_util::RankOutcomes run = RunMutated(worker::parallel::DpReduction::Mode::kAverage);
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_NEAR(Real(out, "grad_norm_step_1") / Real(out, "grad_norm_step_1_control"), 0.5, 1e-6);
  EXPECT_THAT(out.reason, HasSubstr("step 1 global grad norm"));
  // The verdict says what a norm of 1/dp means.
  EXPECT_THAT(test_util::FigureText(out, "grad_norm_hint"), HasSubstr("averaged over the 2 data-parallel ranks"));
}

// Verifies each rank's own token mean, averaged over the ranks (DDP's default), FAILs when the
// ranks predict different numbers of tokens: the step-1 loss is not the global mean.
TEST(DataParallelTest, PerRankTokenMeanIsCaught) {
  const test_util::RankOutcomes run = RunMutated(worker::parallel::DpReduction::Mode::kLocalMean);
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_GT(Real(out, "loss_step_1_rel_diff"), 1e-3);
  EXPECT_THAT(out.reason, HasSubstr("step 1 loss"));
}

// Verifies ranks that step on their own gradients (no all-reduce) FAIL: the replicas differ.
TEST(DataParallelTest, MissingAllReduceIsCaught) {
  const test_util::RankOutcomes run = RunMutated(worker::parallel::DpReduction::Mode::kNone);
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_GT(Real(out, "replica_max_abs_diff"), 0.0);
  EXPECT_THAT(out.reason, HasSubstr("replicas differ"));
}

// Verifies gradients all-reduced in bf16 where fp32 was asked (FSDP2's reduce_dtype not
// applied) FAIL in an fp32 cell: the reduced gradients carry bf16's rounding, far above the
// reduction-order floor; the loss of step 1 is still the control's.
TEST(DataParallelTest, Bf16ReductionIsCaught) {
  const test_util::RankOutcomes run = RunMutated(worker::parallel::DpReduction::Mode::kBf16Reduction);
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_EQ(Real(out, "loss_step_1_rel_diff"), 0.0);
  EXPECT_GT(Real(out, "grad_nearest_bar_rel_diff"), Real(out, "grad_nearest_bar_bar"));
  EXPECT_THAT(out.reason, HasSubstr("step 1 gradient"));
}

// Verifies gradients summed over the whole world under dp x tp (the default group where the
// dp group was meant: each tp shard's gradient added to the other shard's) FAIL on the
// global grad norm.
TEST(DataParallelTest, ReductionOverTheWholeWorldIsCaught) {
  const test_util::RankOutcomes run =
      RunMutated(worker::parallel::DpReduction::Mode::kWholeWorld, Dp(2, 2));
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_GT(Real(out, "grad_norm_step_1_rel_diff"), 0.1);
  EXPECT_THAT(out.reason, HasSubstr("step 1 global grad norm"));
}

/// A family that delegates to a real one but says it shards a loaded model by code, as the
/// Python lane does.
class ShardsByCode : public test_util::DelegatingFamily {
 public:
  using DelegatingFamily::DelegatingFamily;
  bool ShardsLoadedModel() const override { return true; }
};

// Verifies HSDP whose gradients are summed over the shard group only, never across the
// replicas, FAILs: each replica steps on half the batch (the global grad norm, the replicas).
TEST(DataParallelTest, MissingReplicaAllReduceIsCaught) {
  const test_util::RankOutcomes run =
      RunMutated(worker::parallel::DpReduction::Mode::kShardGroupOnly, Fsdp(2, 2));
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_GT(Real(out, "grad_norm_step_1_rel_diff"), 1e-3);
  EXPECT_GT(Real(out, "replica_max_abs_diff"), 0.0);
  EXPECT_THAT(out.reason, HasSubstr("replicas differ"));
}

/// A prompt of `n` tokens (ids 0 .. n-1), the only part GlobalBatch reads.
worker::ReferencePrompt PromptOf(int64_t n) {
  worker::ReferencePrompt p;
  p.input_ids = torch::arange(n, torch::kLong);
  return p;
}

// Verifies the global batch: prompts under 2 tokens left out, the longest cut in two (first
// ceil(T/2) tokens, then the rest) until every rank has a sequence, and no cut that would leave
// a part under 2 tokens.
TEST(GlobalBatchTest, CutsTheLongestUntilEveryRankHasOne) {
  const std::vector<worker::ReferencePrompt> prompts = {PromptOf(7), PromptOf(1), PromptOf(33), PromptOf(300)};
  int64_t splits = -1;
  std::vector<torch::Tensor> two = worker::parallel::GlobalBatch(prompts, 2, splits);
  ASSERT_EQ(two.size(), 3u);
  EXPECT_EQ(splits, 0);
  std::vector<torch::Tensor> five = worker::parallel::GlobalBatch(prompts, 5, splits);
  std::vector<int64_t> lengths;
  for (const torch::Tensor& s : five) lengths.push_back(s.size(0));
  EXPECT_EQ(lengths, (std::vector<int64_t>{7, 33, 75, 75, 150}));
  EXPECT_EQ(splits, 2);
  // 300 was cut at 150, then its first part (the first of two equal ones) at 75.
  EXPECT_EQ(five[2][0].item<int64_t>(), 0);
  EXPECT_EQ(five[3][0].item<int64_t>(), 75);
  EXPECT_EQ(five[4][0].item<int64_t>(), 150);
  const std::vector<worker::ReferencePrompt> short_ones = {PromptOf(3), PromptOf(2)};
  EXPECT_EQ(worker::parallel::GlobalBatch(short_ones, 4, splits).size(), 2u);
  EXPECT_EQ(splits, 0);
}

/// A family that delegates to a real one but says it maps weights by code and gives no
/// parallelize (a Python-lane SPEC without one).
class MapsByCodeWithoutParallelize : public test_util::DelegatingFamily {
 public:
  using DelegatingFamily::DelegatingFamily;
  bool MapsWeightsByCode() const override { return true; }
};

// Verifies dp x tp for a family that maps weights by code and gives no parallelize is BLOCKED
// saying why, and that a family whose ShardLoaded fails (here: the delegate shards no loaded
// model) FAILs on every rank with every rank's reason.
TEST(DataParallelTest, BlockedWhereItCannotRun) {
  const MapsByCodeWithoutParallelize no_parallelize(test_util::FamilyByName("llama"));
  const test_util::RankOutcomes blocked =
      test_util::RunParallelRanks("llama-tiny-untied", "llama", Dp(2, 2), "fp32", &no_parallelize);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(blocked.errors[r], "") << r;
    EXPECT_EQ(blocked.outcomes[r].status, GateStatus::kBlocked) << r;
    EXPECT_THAT(blocked.outcomes[r].reason, HasSubstr("gives no parallelize")) << r;
  }
  const ShardsByCode by_code(test_util::FamilyByName("llama"));
  const test_util::RankOutcomes failed =
      test_util::RunParallelRanks("llama-tiny-untied", "llama", Dp(2, 2), "fp32", &by_code);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(failed.errors[r], "") << r;
    EXPECT_EQ(failed.outcomes[r].status, GateStatus::kFail) << r;
    EXPECT_THAT(failed.outcomes[r].reason, HasSubstr("parallelize (tp=2) failed: rank 0: "));
    EXPECT_THAT(failed.outcomes[r].reason, HasSubstr("rank 3: model family 'llama' does not shard"));
  }
}

}  // namespace
}  // namespace gatehouse
