// The parallel gate's pipeline-parallel check (worker_lib/src/parallel/pp_parity.cc) on the
// transformers-saved fixtures: pp=2 and pp=4 ranks, one thread each over a real gloo group on
// 127.0.0.1, the decoder layers cut into stages, the reference prompts (cut into 4
// microbatches) through a 1F1B schedule with point-to-point sends, two AdamW steps against the
// single-rank control on the whole batch.
//
// Mutations, each caught by a named figure: each microbatch's own token mean averaged over the
// microbatches (what gradient accumulation that averages per microbatch computes; the step-1
// loss), the raw token sum never divided (the global grad norm), and a tied embedding whose
// two stages step on their own halves of its gradient (the stages' copies drift apart).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <variant>

#include "common/mesh.h"
#include "tests/models/family_test_util.h"
#include "tests/models/parallel_ranks.h"
#include "worker_lib/src/gates_internal.h"
#include "worker_lib/src/parallel/parallel_internal.h"

namespace gatehouse {
namespace {

using ::testing::HasSubstr;
using worker::GateOutcome;

CellSpec::Topology Pp(int pp, int tp = 1) {
  CellSpec::Topology t;
  t.pp = pp;
  t.tp = tp;
  return t;
}

double Real(const GateOutcome& out, const std::string& name) { return test_util::RealFigure(out, name); }
int64_t Count(const GateOutcome& out, const std::string& name) { return test_util::CountFigure(out, name); }

const std::vector<std::string> kFigures = {
    "loss_step_1", "loss_step_1_rel_diff", "loss_step_2_rel_diff", "grad_norm_step_1",
    "grad_norm_step_1_rel_diff", "grad_norm_step_2_rel_diff", "grad_max_rel_diff",
    "grads_bit_equal", "grads_compared", "grad_nearest_bar_tensor", "grad_later_max_rel_diff",
    "stage_copies_max_abs_diff",
    "params_after_max_abs_diff", "params_owned_by_two_stages", "microbatches"};

/// Expects every rank to PASS and rank 0's figures within the bars.
void ExpectPpParity(const std::string& variant, const std::string& family, int pp,
                    const std::string& precision = "fp32", int tp = 1) {
  const std::string label = "pp=" + std::to_string(pp) + (tp > 1 ? " x tp=" + std::to_string(tp) : "");
  SCOPED_TRACE(variant + " " + label + " " + precision);
  const test_util::RankOutcomes run = test_util::RunParallelRanks(variant, family, Pp(pp, tp), precision);
  ASSERT_TRUE(test_util::EveryRankPassed(run));
  const GateOutcome& out = run.outcomes[0];
  test_util::PrintFigures(variant + " " + label + " " + precision, out, kFigures);
  EXPECT_EQ(Count(out, "microbatches"), 4);
  EXPECT_EQ(test_util::FigureText(out, "schedule"), "1F1B");
  EXPECT_EQ(Real(out, "stage_copies_max_abs_diff"), 0.0);
  const double loss_bar = precision == "bf16" ? 1e-2 : 1e-5;
  for (const char* step : {"1", "2"}) {
    EXPECT_LT(Real(out, std::string("loss_step_") + step + "_rel_diff"), loss_bar) << step;
    EXPECT_LT(Real(out, std::string("grad_norm_step_") + step + "_rel_diff"), loss_bar) << step;
  }
  EXPECT_LT(Real(out, "grad_nearest_bar_rel_diff"), Real(out, "grad_nearest_bar_bar"));
  if (tp > 1) {
    // tp fastest: stage 0 is ranks 0 and 1, activations go between ranks of equal TP rank.
    EXPECT_EQ(test_util::FigureText(out, "pp_groups"), "pp [0,2] [1,3]");
  } else if (Count(out, "params_owned_by_two_stages") == 0) {
    // Each stage runs the control's per-sequence arithmetic in the control's order: with no
    // parameter shared between stages every gradient is the control's, bit for bit.
    EXPECT_EQ(Count(out, "grads_bit_equal"), Count(out, "grads_compared"));
  }
  ASSERT_FALSE(out.figures.empty());
  EXPECT_EQ(out.figures[0].name, "loss_step_1_rel_diff");
}

// Verifies the stages in order compose to the whole forward: the logits of a model run as
// layers [0, 1) then [1, L) equal Forward's, on a dense and a MoE model.
TEST(ForwardStageTest, StagesComposeToTheWholeForward) {
  for (const auto& [variant, family] : {std::pair<std::string, std::string>{"llama-tiny-tied", "llama"},
                                        {"qwen3_moe-tiny-untied", "qwen3_moe"}}) {
    SCOPED_TRACE(variant);
    worker::GateContext ctx =
        test_util::FixtureContext(test_util::FixtureDir(variant), family, "fp32", "/tmp");
    for (const auto& g : test_util::GatesThrough("load")) {
      ASSERT_EQ(g.run(ctx).status, GateStatus::kPass) << g.phase;
    }
    ASSERT_TRUE(ctx.model->SupportsStages());
    torch::NoGradGuard no_grad;
    const torch::Tensor ids = torch::arange(3, 40, torch::kLong).unsqueeze(0);  // 37 tokens
    const torch::Tensor pos = worker::internal::Positions(0, ids.size(1), torch::kCPU);
    const torch::Tensor whole = ctx.model->Forward(ids, pos, nullptr);
    const int64_t layers = ctx.args->num_hidden_layers();
    const torch::Tensor hidden = ctx.model->ForwardStage(ids, pos, 0, 1);
    EXPECT_EQ(hidden.dim(), 3);
    const torch::Tensor staged = ctx.model->ForwardStage(hidden, pos, 1, layers);
    EXPECT_TRUE(torch::equal(staged, whole)) << (staged - whole).abs().max().item<double>();
    EXPECT_THROW(ctx.model->ForwardStage(ids, pos, 1, 0), c10::Error);
  }
}

// Verifies pp=2 against the control on a dense model (untied, and tied: the embedding owned by
// the first and the last stage, its gradient summed over them), a MoE model at pp=2 and pp=4
// (one layer per stage: two middle stages that only receive and send), and in bf16.
TEST(PipelineParallelTest, MatchesTheSingleRankControl) {
  ExpectPpParity("llama-tiny-untied", "llama", 2);
  ExpectPpParity("llama-tiny-tied", "llama", 2);
  ExpectPpParity("qwen3_moe-tiny-untied", "qwen3_moe", 2);
  ExpectPpParity("qwen3_moe-tiny-untied", "qwen3_moe", 4);
  ExpectPpParity("qwen3-tiny-untied", "qwen3", 2, "bf16");
}

/// Every rank's outcome of the pipeline check with `fault` on `variant` at pp=2.
test_util::RankOutcomes RunFault(worker::parallel::PpFault::Mode mode, const std::string& variant) {
  worker::parallel::PpFault fault;
  fault.mode = mode;
  test_util::RankOutcomes run = test_util::RunParallelRanks(
      variant, "llama", Pp(2), "fp32", nullptr, [&](worker::GateContext& ctx) {
        const Mesh mesh = *Mesh::Make(ctx.spec.topology.mesh_shape(), 64);
        return worker::parallel::PipelineParallelParity(ctx, mesh, GateOutcome{}, fault);
      });
  test_util::PrintFigures("mutation '" + fault.Name() + "' " + variant + " pp=2 fp32",
                          run.outcomes[0],
                          {"loss_step_1_rel_diff", "grad_norm_step_1", "grad_norm_step_1_control",
                           "grad_max_rel_diff", "stage_copies_max_abs_diff"});
  std::cout << "[parallel figures] reason: " << run.outcomes[0].reason << std::endl;
  return run;
}

// Verifies pp=2 x tp=2: each stage's layers sharded over its tp pair through the family's
// plan (dense, tied embedding over both stages, MoE), the gradients and parameters gathered
// over the tp group against the single-rank control.
TEST(PipelineParallelTest, WithTensorParallelismMatchesTheSingleRankControl) {
  ExpectPpParity("llama-tiny-untied", "llama", 2, "fp32", 2);
  ExpectPpParity("llama-tiny-tied", "llama", 2, "fp32", 2);
  ExpectPpParity("qwen3_moe-tiny-untied", "qwen3_moe", 2, "fp32", 2);
}

// Verifies each microbatch's own token mean, averaged over the microbatches, FAILs when the
// microbatches predict different numbers of tokens: the step-1 loss is not the global mean.
TEST(PipelineParallelTest, MicrobatchMeanIsCaught) {
  const test_util::RankOutcomes run =
      RunFault(worker::parallel::PpFault::Mode::kMicrobatchMean, "llama-tiny-untied");
  ASSERT_EQ(run.errors[0], "");
  EXPECT_EQ(run.outcomes[0].status, GateStatus::kFail);
  EXPECT_GT(Real(run.outcomes[0], "loss_step_1_rel_diff"), 1e-3);
  EXPECT_THAT(run.outcomes[0].reason, HasSubstr("step 1 loss"));
}

// Verifies the raw token sum (never divided by the global token count) FAILs: the gradients
// are that count times too large.
TEST(PipelineParallelTest, RawTokenSumIsCaught) {
  const test_util::RankOutcomes run =
      RunFault(worker::parallel::PpFault::Mode::kRawTokenSum, "llama-tiny-untied");
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_GT(Real(out, "grad_norm_step_1") / Real(out, "grad_norm_step_1_control"), 10.0);
  EXPECT_THAT(out.reason, HasSubstr("step 1 global grad norm"));
}

// Verifies a tied embedding whose stages each step on their own part of its gradient FAILs:
// the first and the last stage's copies differ after the steps.
TEST(PipelineParallelTest, TiedEmbeddingNotSyncedIsCaught) {
  const test_util::RankOutcomes run =
      RunFault(worker::parallel::PpFault::Mode::kTiedNotSynced, "llama-tiny-tied");
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_GT(Real(out, "stage_copies_max_abs_diff"), 0.0);
  EXPECT_THAT(out.reason, HasSubstr("copies of a shared parameter"));
}

// Verifies a first stage re-initialised before its last microbatch's backward (the gradients
// accumulated over the earlier microbatches lost) FAILs: the step-1 loss is the control's,
// only the gradients show it, the global grad norm first.
TEST(PipelineParallelTest, StageReinitIsCaught) {
  const test_util::RankOutcomes run =
      RunFault(worker::parallel::PpFault::Mode::kStageReinit, "llama-tiny-untied");
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_EQ(Real(out, "loss_step_1_rel_diff"), 0.0);
  EXPECT_GT(Real(out, "grad_norm_step_1_rel_diff"), 1e-3);
  EXPECT_THAT(out.reason, HasSubstr("step 1 global grad norm"));
}

// Verifies more stages than decoder layers (pp=3 on 2 layers) is BLOCKED naming the count.
TEST(PipelineParallelTest, BlockedWhereItCannotRun) {
  const test_util::RankOutcomes run = test_util::RunParallelRanks("llama-tiny-untied", "llama", Pp(3), "fp32");
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(run.errors[r], "") << r;
    EXPECT_EQ(run.outcomes[r].status, GateStatus::kBlocked) << r;
    EXPECT_THAT(run.outcomes[r].reason, HasSubstr("num_hidden_layers is 2")) << r;
  }
}

}  // namespace
}  // namespace gatehouse
