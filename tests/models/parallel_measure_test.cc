// The parallel gate's measure-only mode (GateContext::parallel_measure_only, the worker's
// --parallel-measure-only; tools/bench/parallel_layouts.py): each layout trains the gate's
// steps with no single-rank control and nothing compared, and the gate ends SKIPPED (never
// PASS) with each rank's step times, the global losses and what the rank holds. On the
// transformers-saved fixtures, one thread per rank over a real gloo group on 127.0.0.1.
//
// What must hold: the losses are the layout's (equal to the whole model trained alone, at
// world size 1, within the reduction-order spread), the sharded layouts hold less per rank
// (tp: parameters; dp_shard: optimizer state; pp: the stage's parameters), and the model the
// earlier phases loaded is released before the layout starts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/mesh.h"
#include "tests/models/family_test_util.h"
#include "tests/models/parallel_ranks.h"

namespace gatehouse {
namespace {

using ::testing::HasSubstr;
using worker::GateOutcome;

double Real(const GateOutcome& out, const std::string& name) { return test_util::RealFigure(out, name); }
int64_t Count(const GateOutcome& out, const std::string& name) { return test_util::CountFigure(out, name); }

CellSpec::Topology Layout(int dp, int dp_shard, int tp, int pp) {
  CellSpec::Topology t;
  t.dp = dp;
  t.dp_shard = dp_shard;
  t.tp = tp;
  t.pp = pp;
  return t;
}

/// Every rank of `topology` measured only; expects each SKIPPED with the measured figures and
/// returns the outcomes.
std::vector<GateOutcome> Measure(const CellSpec::Topology& topology) {
  const std::string label = test_util::MeshLabel(topology) + (topology.pp > 1 ? " pp" : "");
  SCOPED_TRACE(label.empty() ? "world size 1" : label);
  const test_util::RankOutcomes run = test_util::RunParallelRanks(
      "llama-tiny-untied", "llama", topology, "fp32", nullptr, [](worker::GateContext& ctx) {
        ctx.parallel_measure_only = true;
        GateOutcome out = worker::ParallelGate(ctx);
        // Released before the layout started: no check may use the loaded model.
        EXPECT_EQ(ctx.model, nullptr);
        return out;
      });
  for (size_t r = 0; r < run.outcomes.size(); ++r) {
    EXPECT_EQ(run.errors[r], "");
    EXPECT_EQ(run.early[r], "");
    const GateOutcome& out = run.outcomes[r];
    EXPECT_EQ(out.status, GateStatus::kSkipped) << "rank " << r << ": " << out.reason;
    EXPECT_THAT(out.reason, HasSubstr("measured only"));
    EXPECT_THAT(out.reason, HasSubstr("nothing was compared"));
    EXPECT_GT(Real(out, "measured_step_1_ms"), 0);
    EXPECT_GT(Real(out, "measured_step_2_ms"), 0);
    EXPECT_NE(out.Find("rss_layout_start_bytes"), nullptr);
    // Nothing of a comparison is claimed.
    EXPECT_EQ(out.Find("loss_step_1_rel_diff"), nullptr);
    EXPECT_EQ(out.Find("grads_agree"), nullptr);
  }
  return run.outcomes;
}

// Verifies the control's own cost is measured (world size 1: the whole model trained alone)
// and that each layout trains the same global batch (its losses equal the control's within
// the reduction-order spread) while holding what the layout shards less of per rank.
TEST(MeasureOnlyTest, LayoutsTrainTheSameBatchAndHoldLess) {
  const GateOutcome control = Measure(Layout(1, 1, 1, 1))[0];
  const double loss1 = Real(control, "loss_step_1"), loss2 = Real(control, "loss_step_2");
  const int64_t params = Count(control, "parameter_elements_held");
  const int64_t state = Count(control, "optimizer_state_elements");
  EXPECT_EQ(state, 2 * params);  // AdamW: exp_avg and exp_avg_sq of every parameter
  auto same_losses = [&](const GateOutcome& out) {
    EXPECT_NEAR(Real(out, "loss_step_1"), loss1, 1e-6 * loss1);
    EXPECT_NEAR(Real(out, "loss_step_2"), loss2, 1e-5 * loss2);
  };
  {
    SCOPED_TRACE("dp=2: every rank the whole model and its optimizer state");
    for (const GateOutcome& out : Measure(Layout(2, 1, 1, 1))) {
      same_losses(out);
      EXPECT_EQ(Count(out, "parameter_elements_held"), params);
      EXPECT_EQ(Count(out, "optimizer_state_elements"), state);
    }
  }
  {
    SCOPED_TRACE("dp_shard=2: the optimizer state sharded");
    for (const GateOutcome& out : Measure(Layout(1, 2, 1, 1))) {
      same_losses(out);
      EXPECT_LT(Count(out, "optimizer_state_elements"), state * 6 / 10);
    }
  }
  {
    SCOPED_TRACE("tp=2: parameters and optimizer state sharded");
    for (const GateOutcome& out : Measure(Layout(1, 1, 2, 1))) {
      same_losses(out);
      EXPECT_LT(Count(out, "parameter_elements_held"), params * 8 / 10);
      EXPECT_EQ(Count(out, "optimizer_state_elements"), 2 * Count(out, "parameter_elements_held"));
    }
  }
  {
    // The pipeline check cuts the batch into 4 microbatches (the 300-token prompt in two: one
    // predicted token fewer than the control's batch): its losses are the gate's own pp=2 run's.
    SCOPED_TRACE("pp=2: each stage steps its own layers");
    const test_util::RankOutcomes gate =
        test_util::RunParallelRanks("llama-tiny-untied", "llama", Layout(1, 1, 1, 2), "fp32");
    ASSERT_TRUE(test_util::EveryRankPassed(gate));
    for (const GateOutcome& out : Measure(Layout(1, 1, 1, 2))) {
      EXPECT_EQ(Real(out, "loss_step_1"), Real(gate.outcomes[0], "loss_step_1"));
      EXPECT_EQ(Real(out, "loss_step_2"), Real(gate.outcomes[0], "loss_step_2"));
      EXPECT_LT(Count(out, "stage_param_elements"), params * 8 / 10);
      EXPECT_EQ(Count(out, "optimizer_state_elements"), 2 * Count(out, "stage_param_elements"));
    }
  }
}

}  // namespace
}  // namespace gatehouse
