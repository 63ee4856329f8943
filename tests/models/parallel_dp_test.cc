// The parallel gate's data-parallel check (worker_lib/src/parallel/dp_parity.cc) on the
// transformers-saved fixtures: dp=2 and dp=3 ranks, one thread each over a real gloo group on
// 127.0.0.1, two AdamW steps on the reference prompts split over the ranks, against the
// single-rank control on the whole batch. The fixtures' three prompts (7, 33 and 300 tokens)
// split unevenly (rank 0 of dp=2 predicts 305 tokens, rank 1 32), which is what makes a
// per-rank token mean differ from the global one.
//
// Mutations of the reduction, each caught by a named figure: gradients averaged over the
// ranks instead of summed (global grad norm, step 1), each rank's own token mean averaged
// (DDP's default loss; the step-1 loss), no all-reduce at all (replicas drift apart).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <variant>

#include "tests/models/family_test_util.h"
#include "tests/models/parallel_ranks.h"
#include "worker_lib/src/parallel/parallel_internal.h"

namespace gatehouse {
namespace {

using ::testing::HasSubstr;
using worker::GateOutcome;

CellSpec::Topology Dp(int dp) {
  CellSpec::Topology t;
  t.dp = dp;
  return t;
}

double Real(const GateOutcome& out, const std::string& name) {
  const worker::Figure* f = out.Find(name);
  EXPECT_NE(f, nullptr) << name;
  return f != nullptr && std::holds_alternative<double>(f->value) ? std::get<double>(f->value) : -1.0;
}

int64_t Count(const GateOutcome& out, const std::string& name) {
  const worker::Figure* f = out.Find(name);
  EXPECT_NE(f, nullptr) << name;
  return f != nullptr && std::holds_alternative<int64_t>(f->value) ? std::get<int64_t>(f->value) : -1;
}

/// Expects every rank to PASS, replicas bit-equal and rank 0's figures within the bars.
void ExpectDpParity(const std::string& variant, const std::string& family, int dp,
                    const std::string& precision = "fp32") {
  SCOPED_TRACE(variant + " dp=" + std::to_string(dp) + " " + precision);
  const test_util::RankOutcomes run = test_util::RunParallelRanks(variant, family, Dp(dp), precision);
  for (int r = 0; r < dp; ++r) {
    ASSERT_EQ(run.errors[r], "") << "rank " << r;
    ASSERT_EQ(run.early[r], "") << "rank " << r;
    EXPECT_EQ(run.outcomes[r].status, GateStatus::kPass) << "rank " << r << ": " << run.outcomes[r].reason;
  }
  const GateOutcome& out = run.outcomes[0];
  test_util::PrintFigures(variant + " dp=" + std::to_string(dp) + " " + precision, out,
                          {"loss_step_1", "loss_step_1_rel_diff", "loss_step_2_rel_diff",
                           "grad_norm_step_1", "grad_norm_step_1_rel_diff",
                           "grad_norm_step_2_rel_diff", "grad_max_rel_diff",
                           "grad_order_floor_max_rel", "grads_bit_equal", "grads_compared",
                           "grads_step1_bit_equal_to_grouping", "replica_max_abs_diff",
                           "params_after_max_abs_diff"});
  EXPECT_THAT(test_util::FigureText(out, "mesh"), HasSubstr("dp_replicate=" + std::to_string(dp)));
  EXPECT_EQ(Count(out, "global_batch_prompts"), 3);
  EXPECT_EQ(Real(out, "replica_max_abs_diff"), 0.0);
  const double loss_bar = precision == "bf16" ? 1e-2 : 1e-5;
  for (const char* step : {"1", "2"}) {
    EXPECT_GT(Real(out, std::string("loss_step_") + step), 0.0);
    EXPECT_LT(Real(out, std::string("loss_step_") + step + "_rel_diff"), loss_bar) << step;
    EXPECT_LT(Real(out, std::string("grad_norm_step_") + step + "_rel_diff"), loss_bar) << step;
  }
  EXPECT_LT(Real(out, "grad_nearest_bar_rel_diff"), Real(out, "grad_nearest_bar_bar"));
  if (dp == 2) {
    // Two shares add the same way whatever the order: the reduced gradients are the control's
    // computed in the ranks' grouping, bit for bit.
    EXPECT_EQ(Count(out, "grads_step1_bit_equal_to_grouping"), Count(out, "grads_compared") / 2);
  }
}

// Verifies dp=2 against the control on a dense model (tied and untied), a MoE model, and in
// bf16; dp=3 (one prompt per rank, a ring of three on gloo).
TEST(DataParallelTest, MatchesTheSingleRankControl) {
  ExpectDpParity("llama-tiny-untied", "llama", 2);
  ExpectDpParity("llama-tiny-tied", "llama", 2);
  ExpectDpParity("qwen3_moe-tiny-untied", "qwen3_moe", 2);
  ExpectDpParity("qwen3-tiny-untied", "qwen3", 2, "bf16");
  ExpectDpParity("llama-tiny-untied", "llama", 3);
}

/// Every rank's outcome of the data-parallel check with `reduction` instead of the gate's.
test_util::RankOutcomes RunMutated(worker::parallel::DpReduction::Mode mode) {
  worker::parallel::DpReduction reduction;
  reduction.mode = mode;
  test_util::RankOutcomes run = test_util::RunParallelRanks(
      "llama-tiny-untied", "llama", Dp(2), "fp32", nullptr, [&](worker::GateContext& ctx) {
        return worker::parallel::DataParallelParity(ctx, 2, GateOutcome{}, reduction);
      });
  test_util::PrintFigures("mutation '" + reduction.Name() + "' llama-tiny-untied dp=2 fp32",
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

// Verifies a dp degree above the global batch (3 prompts, dp=4) is BLOCKED with the count,
// and a mesh combining dp with tp is BLOCKED naming the combination.
TEST(DataParallelTest, BlockedWhereItCannotRun) {
  const test_util::RankOutcomes four = test_util::RunParallelRanks("llama-tiny-untied", "llama", Dp(4), "fp32");
  ASSERT_EQ(four.errors[0], "");
  EXPECT_EQ(four.outcomes[0].status, GateStatus::kBlocked);
  EXPECT_THAT(four.outcomes[0].reason, HasSubstr("3 prompt(s) of 2 tokens or more; dp=4"));
  CellSpec::Topology both = Dp(2);
  both.tp = 2;
  const test_util::RankOutcomes combined = test_util::RunParallelRanks("llama-tiny-untied", "llama", both, "fp32");
  ASSERT_EQ(combined.errors[0], "");
  EXPECT_EQ(combined.outcomes[0].status, GateStatus::kBlocked);
  EXPECT_THAT(combined.outcomes[0].reason, HasSubstr("dp x tp"));
}

}  // namespace
}  // namespace gatehouse
