// The parallel gate's expert-parallel check (worker_lib/src/parallel/dp_parity.cc with ep > 1)
// on the transformers-saved qwen3_moe fixture (8 experts, top-2, MoE every second layer): the
// experts of each MoE layer split over the EP ranks (borrowed from dp_shard, etp = tp), tokens
// dispatched to the rank that holds their expert and combined back all-to-all, one thread per
// rank over a real gloo group on 127.0.0.1, two AdamW steps against the single-rank control.
//
// Mutations, each caught by a named figure: expert gradients all-reduced over the
// data-parallel group like the dense ones (summing different experts), the sharded grad
// norm's expert part averaged over ep, tp-replicated tensors counted tp times in the sharded
// grad norm, and tokens per expert read from one rank without the sum over the ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "common/mesh.h"
#include "tests/models/family_test_util.h"
#include "tests/models/parallel_ranks.h"
#include "worker_lib/src/parallel/parallel_internal.h"

namespace gatehouse {
namespace {

using ::testing::HasSubstr;
using worker::GateOutcome;
using Mode = worker::parallel::DpReduction::Mode;

constexpr const char* kMoe = "qwen3_moe-tiny-untied";

/// dp_shard ranks with ep of them sharing the experts, tp inside each (etp = tp).
CellSpec::Topology Ep(int ep, int dp_shard, int tp = 1, int dp = 1) {
  CellSpec::Topology t;
  t.ep = ep;
  t.dp_shard = dp_shard;
  t.tp = tp;
  t.etp = tp;
  t.dp = dp;
  return t;
}

std::string Label(const CellSpec::Topology& t) { return test_util::MeshLabel(t); }

double Real(const GateOutcome& out, const std::string& name) { return test_util::RealFigure(out, name); }
int64_t Count(const GateOutcome& out, const std::string& name) { return test_util::CountFigure(out, name); }

const std::vector<std::string> kShown = {
    "loss_step_1_rel_diff", "loss_step_2_rel_diff", "grad_norm_step_1", "grad_norm_step_1_rel_diff",
    "grad_norm_sharded_step_1_rel_diff", "grad_norm_step_2_rel_diff", "grad_max_rel_diff",
    "grad_order_floor_max_rel", "grads_bit_equal", "grads_compared", "grad_nearest_bar_tensor",
    "grad_later_max_rel_diff", "replica_max_abs_diff", "params_after_max_abs_diff",
    "expert_tokens_step1", "expert_tokens_max_abs_diff", "optimizer_state_elements_rank0",
    "optimizer_state_elements_unsharded", "save_tensors", "save_tensors_bit_equal", "expert_routings_flipped",
    "expert_routings_near_ties_control", "ep_groups"};

/// Expects every rank to PASS with the experts' tokens, losses and norms equal to the
/// control's within the bars.
void ExpectEpParity(const CellSpec::Topology& topology, const std::string& precision = "fp32") {
  SCOPED_TRACE(Label(topology) + " " + precision);
  const test_util::RankOutcomes run = test_util::RunParallelRanks(kMoe, "qwen3_moe", topology, precision);
  ASSERT_TRUE(test_util::EveryRankPassed(run));
  const GateOutcome& out = run.outcomes[0];
  test_util::PrintFigures(std::string(kMoe) + " " + Label(topology) + " " + precision, out, kShown);
  // Every routing of the batch counted once over the ranks, as on the control.
  EXPECT_GT(Count(out, "expert_tokens_step1"), 0);
  EXPECT_EQ(Count(out, "expert_tokens_step1"), Count(out, "expert_tokens_step1_control"));
  EXPECT_EQ(Count(out, "expert_tokens_max_abs_diff"), 0);
  const double loss_bar = precision == "bf16" ? 1e-2 : 1e-5;
  for (const char* step : {"1", "2"}) {
    EXPECT_LT(Real(out, std::string("loss_step_") + step + "_rel_diff"), loss_bar) << step;
    EXPECT_LT(Real(out, std::string("grad_norm_step_") + step + "_rel_diff"), loss_bar) << step;
    EXPECT_LT(Real(out, std::string("grad_norm_sharded_step_") + step + "_rel_diff"), loss_bar) << step;
  }
  EXPECT_LT(Real(out, "grad_nearest_bar_rel_diff"), Real(out, "grad_nearest_bar_bar"));
  EXPECT_EQ(Real(out, "replica_max_abs_diff"), 0.0);
  // The save gathered from the ranks' experts and shards is the control's, bit for bit.
  EXPECT_GT(Count(out, "save_tensors"), 0);
  EXPECT_EQ(Count(out, "save_tensors_bit_equal"), Count(out, "save_tensors"));
  // Each rank holds the optimizer state of its own experts only.
  EXPECT_LT(Count(out, "optimizer_state_elements_rank0"),
            Count(out, "optimizer_state_elements_unsharded"));
  EXPECT_THAT(test_util::FigureText(out, "replicated_by"), HasSubstr("experts split over the EP group"));
  if (topology.tp > 1 && topology.dp_shard == 2) {
    // tp fastest: ranks of equal TP rank share the experts.
    EXPECT_EQ(test_util::FigureText(out, "ep_groups"), "ep [0,2] [1,3]");
  }
}

// Verifies ep=2 (over dp_shard=2) and ep=4 against the control: each rank two (or four) of
// the eight experts, every gradient gathered back equal within the measured bars.
TEST(ExpertParallelTest, MatchesTheSingleRankControl) {
  ExpectEpParity(Ep(2, 2));
  ExpectEpParity(Ep(4, 4));
}

// Verifies ep=2 with tp=2 inside (etp = tp: every expert's intermediate features split over
// the tp group, the dispatch over ranks of equal TP rank), ep=2 over dp_shard=4 (two ranks
// hold the same experts: their gradients summed over that pair) and HSDP with ep, in fp32,
// and ep=2 in bf16.
TEST(ExpertParallelTest, CombinedLayoutsMatchTheSingleRankControl) {
  ExpectEpParity(Ep(2, 2, 2));
  ExpectEpParity(Ep(2, 4));
  ExpectEpParity(Ep(2, 2, 1, 2));
  ExpectEpParity(Ep(2, 2), "bf16");
}

// Verifies bf16 layouts whose routing rounding may flip (tp inside the replicas: the hidden
// states differ from the control's by an ulp here and there) PASS: any flipped routing is one
// the control decided by a near tie, and step 1 is then judged by its loss and grad norm.
TEST(ExpertParallelTest, Bf16RoutingFlipsAtNearTiesAreRounding) {
  for (const CellSpec::Topology& t : {Ep(2, 2, 2), Ep(4, 4)}) {
    const test_util::RankOutcomes run = test_util::RunParallelRanks(kMoe, "qwen3_moe", t, "bf16");
    ASSERT_EQ(run.errors[0], "");
    const GateOutcome& out = run.outcomes[0];
    test_util::PrintFigures(std::string(kMoe) + " " + Label(t) + " bf16", out, kShown);
    EXPECT_EQ(out.status, GateStatus::kPass) << out.reason;
    EXPECT_LE(Count(out, "expert_routings_flipped"), Count(out, "expert_routings_near_ties_control"));
    if (t.tp > 1) {
      // On this fixture tp moves 9 of the control's 17 near ties to the other expert.
      EXPECT_GT(Count(out, "expert_routings_flipped"), 0);
      EXPECT_THAT(test_util::FigureText(out, "grads_judged"), HasSubstr("flipped"));
      EXPECT_THAT(test_util::FigureText(out, "grads_agree"), HasSubstr("not judged"));
    }
  }
}

/// Every rank's outcome of the data-parallel check with `mode` instead of the gate's.
test_util::RankOutcomes RunMutated(Mode mode, const CellSpec::Topology& topology,
                                   const std::string& variant = kMoe,
                                   const std::string& family = "qwen3_moe") {
  worker::parallel::DpReduction reduction;
  reduction.mode = mode;
  test_util::RankOutcomes run = test_util::RunParallelRanks(
      variant, family, topology, "fp32", nullptr, [&](worker::GateContext& ctx) {
        const Mesh mesh = *Mesh::Make(ctx.spec.topology.mesh_shape(), 64);
        return worker::parallel::DataParallelParity(ctx, mesh, GateOutcome{}, reduction);
      });
  test_util::PrintFigures("mutation '" + reduction.Name() + "' " + variant + " " + Label(topology) + " fp32",
                          run.outcomes[0],
                          {"grad_norm_step_1_rel_diff", "grad_norm_sharded_step_1",
                           "grad_norm_sharded_step_1_rel_diff", "grad_max_rel_diff",
                           "grad_nearest_bar_tensor", "grad_nearest_bar_rel_diff",
                           "expert_tokens_max_abs_diff", "loss_step_1_rel_diff",
                           "save_tensors_bit_equal", "save_tensors"});
  std::cout << "[parallel figures] reason: " << run.outcomes[0].reason << std::endl;
  return run;
}

// Verifies expert gradients all-reduced over the data-parallel group like the dense ones
// FAIL: each rank's experts get the other rank's (different) experts' gradients added.
TEST(ExpertParallelTest, ExpertGradientsReducedOverDpAreCaught) {
  const test_util::RankOutcomes run = RunMutated(Mode::kExpertsOverDp, Ep(2, 2));
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_THAT(test_util::FigureText(out, "grad_nearest_bar_tensor"), HasSubstr("experts"));
  EXPECT_GT(Real(out, "grad_nearest_bar_rel_diff"), Real(out, "grad_nearest_bar_bar"));
  EXPECT_THAT(test_util::FigureText(out, "grads_agree"), HasSubstr("above its bar"));
  // Named as the checkpoint names it too: the stacked experts' first and last keys.
  EXPECT_THAT(test_util::FigureText(out, "grad_nearest_bar_checkpoint_key"),
              HasSubstr("mlp.experts.0."));
  EXPECT_THAT(test_util::FigureText(out, "grad_nearest_bar_checkpoint_key"),
              HasSubstr("(8 experts stacked)"));
  EXPECT_THAT(out.reason, HasSubstr("(checkpoint model.layers."));
}

// Verifies a sharded grad norm whose expert part is averaged over the EP ranks, not summed,
// FAILs on grad_norm_sharded (the gathered norm stays right: only the clipping norm is off).
TEST(ExpertParallelTest, ExpertNormAveragedIsCaught) {
  const test_util::RankOutcomes run = RunMutated(Mode::kEpNormAveraged, Ep(2, 2));
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_LT(Real(out, "grad_norm_step_1_rel_diff"), 1e-5);
  EXPECT_GT(Real(out, "grad_norm_sharded_step_1_rel_diff"), 1e-3);
  EXPECT_THAT(out.reason, HasSubstr("grad norm from the ranks' shards"));
}

// Verifies a sharded grad norm counting the tp-replicated tensors (norms, a replicated
// router) once per TP rank FAILs on grad_norm_sharded, on a dense model under dp=2 x tp=2.
TEST(ExpertParallelTest, ReplicatedCountedTpTimesIsCaught) {
  CellSpec::Topology t;
  t.dp = 2;
  t.tp = 2;
  const test_util::RankOutcomes run = RunMutated(Mode::kReplicatedCountedTp, t, "llama-tiny-untied", "llama");
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_GT(Real(out, "grad_norm_sharded_step_1_rel_diff"), 1e-6);
  EXPECT_THAT(out.reason, HasSubstr("grad norm from the ranks' shards"));
}

// Verifies tokens per expert taken from one rank, not summed over the data-parallel ranks
// (an aux/balance count not all-reduced), FAIL on expert_tokens.
TEST(ExpertParallelTest, ExpertCountsNotReducedAreCaught) {
  const test_util::RankOutcomes run = RunMutated(Mode::kExpertCountsNotReduced, Ep(2, 2));
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_GT(Count(out, "expert_tokens_max_abs_diff"), 0);
  EXPECT_THAT(out.reason, HasSubstr("tokens routed per expert"));
}

// Verifies each EP rank clipping with the norm of its own experts (the expert part of the
// sharded grad norm not summed over the EP group: per-group clipping) FAILs on
// grad_norm_sharded; the gathered norm stays right.
TEST(ExpertParallelTest, PerGroupClippingNormIsCaught) {
  const test_util::RankOutcomes run = RunMutated(Mode::kEpNormLocal, Ep(2, 2));
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_LT(Real(out, "grad_norm_step_1_rel_diff"), 1e-5);
  EXPECT_GT(Real(out, "grad_norm_sharded_step_1_rel_diff"), 1e-3);
  EXPECT_THAT(out.reason, HasSubstr("grad norm from the ranks' shards"));
}

// Verifies experts at the wrong offset (each EP rank holding the next rank's experts, so the
// tokens dispatched to expert e run through another expert's weights) FAIL before any step:
// the save gathered from the ranks names the experts' keys that differ, and the loss follows.
TEST(ExpertParallelTest, ExpertsAtTheWrongOffsetAreCaught) {
  const test_util::RankOutcomes run = RunMutated(Mode::kExpertOffsetShifted, Ep(2, 2));
  ASSERT_EQ(run.errors[0], "");
  const GateOutcome& out = run.outcomes[0];
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_LT(Count(out, "save_tensors_bit_equal"), Count(out, "save_tensors"));
  EXPECT_GT(Real(out, "loss_step_1_rel_diff"), 1e-4);
  // The first words name the save and an expert's checkpoint key.
  EXPECT_THAT(out.reason.substr(0, 300), HasSubstr("the save gathered from the ranks"));
  EXPECT_THAT(out.reason.substr(0, 300), HasSubstr("mlp.experts."));
}

// Verifies the layouts the check has no plan for, or that do not fit the checkpoint, BLOCK
// with the reason: ep on a dense model, ep not dividing the experts, ep borrowing tp ranks
// (etp = 1 with tp = 2).
TEST(ExpertParallelTest, BlockedWhereItCannotRun) {
  {
    const test_util::RankOutcomes run = test_util::RunParallelRanks("llama-tiny-untied", "llama", Ep(2, 2), "fp32");
    EXPECT_EQ(run.outcomes[0].status, GateStatus::kBlocked);
    EXPECT_THAT(run.outcomes[0].reason, HasSubstr("has no experts"));
  }
  {
    CellSpec::Topology t = Ep(3, 3);
    const test_util::RankOutcomes run = test_util::RunParallelRanks(kMoe, "qwen3_moe", t, "fp32");
    EXPECT_EQ(run.outcomes[0].status, GateStatus::kBlocked);
    EXPECT_THAT(run.outcomes[0].reason, HasSubstr("does not divide the model's 8 experts"));
  }
  {
    CellSpec::Topology t = Ep(2, 2, 2);
    t.etp = 1;
    const test_util::RankOutcomes run = test_util::RunParallelRanks(kMoe, "qwen3_moe", t, "fp32");
    EXPECT_EQ(run.outcomes[0].status, GateStatus::kBlocked);
    EXPECT_THAT(run.outcomes[0].reason, HasSubstr("etp=1"));
  }
}

}  // namespace
}  // namespace gatehouse
