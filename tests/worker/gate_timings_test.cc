// The decode, packing, logprob_parity and training gates time their parts as figures
// (tools/bench/real_size.py sets them beside transformers' same work, phase_accounting.py):
// each part is reported, is positive where the work ran, and the parts together fit inside the
// gate's own wall time (a part timed twice, or a timer left running across another part,
// would exceed it).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "gatehouse/worker/gates.h"
#include "gates_fixture.h"

namespace gatehouse::worker {
namespace {

using testing::Fixture;
using testing::RunThrough;

double Ms(const GateOutcome& out, const std::string& name) {
  const Figure* f = out.Find(name);
  if (f == nullptr) {
    ADD_FAILURE() << "no figure " << name;
    return -1;
  }
  const auto* v = std::get_if<double>(&f->value);
  EXPECT_NE(v, nullptr) << name << " is not a real";
  EXPECT_EQ(f->unit, "ms") << name;
  return v ? *v : -1;
}

// Runs `gate` on ctx, timed from outside; checks every part is positive and their sum is
// within the outside wall time.
template <typename Gate>
GateOutcome ExpectParts(GateContext& ctx, Gate gate, const std::vector<std::string>& parts) {
  const auto start = std::chrono::steady_clock::now();
  GateOutcome out = gate(ctx);
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(GateStatusName(out.status), GateStatusName(GateStatus::kPass)) << out.reason;
  double sum = 0;
  for (const std::string& name : parts) {
    const double ms = Ms(out, name);
    EXPECT_GT(ms, 0.0) << name;
    sum += ms;
  }
  EXPECT_LE(sum, wall_ms) << "the parts add up to more than the gate's wall time";
  return out;
}

TEST(GateTimingsTest, DecodeTimesItsForcedDecodeComparisonsAndGreedyDecode) {
  Fixture fx;
  fx.Write();
  GateContext ctx = fx.Context();
  ASSERT_EQ(RunThrough(ctx, "inference").status, GateStatus::kPass);
  ctx.reference.reset();  // so the gate reads the bundle itself, and times it
  ExpectParts(ctx, DecodeGate,
              {"reference_read_ms", "forced_decode_ms", "comparison_ms", "greedy_decode_ms"});
}

TEST(GateTimingsTest, PackingTimesItsForwardsComparisonsAndSteps) {
  Fixture fx;
  fx.Write();
  GateContext ctx = fx.Context();
  ASSERT_EQ(RunThrough(ctx, "inference").status, GateStatus::kPass);
  ExpectParts(ctx, PackingGate,
              {"packed_forward_ms", "alone_forwards_ms", "logit_comparison_ms", "unpacked_step_ms",
               "packed_step_ms", "gradient_comparison_ms"});
}

TEST(GateTimingsTest, LogprobParityTimesItsRolloutForcedDecodeAndTrainingForward) {
  Fixture fx;
  fx.Write();
  GateContext ctx = fx.Context();
  ASSERT_EQ(RunThrough(ctx, "inference").status, GateStatus::kPass);
  ExpectParts(ctx, LogprobParityGate, {"rollout_ms", "forced_decode_ms", "training_forward_ms"});
}

TEST(GateTimingsTest, TrainingTimesEachStepsPartsAndTheFingerprints) {
  Fixture fx;
  fx.Write();
  GateContext ctx = fx.Context();
  ASSERT_EQ(RunThrough(ctx, "inference").status, GateStatus::kPass);
  GateOutcome out = ExpectParts(
      ctx, TrainingGate,
      {"fingerprint_ms", "step_1_forward_backward_ms", "step_1_checks_ms", "step_1_optimizer_ms",
       "step_2_forward_backward_ms", "step_2_checks_ms", "step_2_optimizer_ms"});
  EXPECT_EQ(out.Find("step_3_forward_backward_ms"), nullptr);  // the fixture trains two steps
}

}  // namespace
}  // namespace gatehouse::worker
