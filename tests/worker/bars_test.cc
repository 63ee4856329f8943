// The bars table (bars.h, docs/bars.md): which bars a site gets, and how the decode and
// training bars derive from upstream's own spread.
#include "gatehouse/worker/bars.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

namespace gatehouse::worker {
namespace {

using ::testing::HasSubstr;

ComparisonSite Site(std::string precision, std::string ref_device, std::string run_device,
                    std::string ref_cpu, std::string run_cpu, int64_t ref_threads = 2,
                    int64_t run_threads = 2) {
  ComparisonSite s{std::move(precision), std::move(ref_device), std::move(run_device),
                   std::move(ref_cpu), std::move(run_cpu)};
  s.reference_threads = ref_threads;
  s.run_threads = run_threads;
  return s;
}

// Verifies the same device kind and CPU kernels give equality in both precisions, and that a
// bundle without its CPU kernel family never counts as the same kernels.
TEST(BarsTest, SameCpuKernelsAreBitExact) {
  for (const char* precision : {"fp32", "bf16"}) {
    const LogitBars b = LogitBarsFor(Site(precision, "cpu", "cpu", "AVX512", "AVX512"));
    EXPECT_TRUE(b.exact);
    EXPECT_EQ(b.max_abs_diff, 0.0);
    EXPECT_EQ(b.kl_mean, 0.0);
    EXPECT_EQ(b.top1_percent, 100.0);
    EXPECT_THAT(b.basis, HasSubstr("bit-exact"));
  }
  const LogitBars unknown = LogitBarsFor(Site("fp32", "cpu", "cpu", "", "AVX512"));
  EXPECT_FALSE(unknown.exact);
  EXPECT_GT(unknown.max_abs_diff, 0.0);
}

// Verifies the thread count is part of the site: reductions are split by thread, so another
// count (or an unknown one) is not bit-exact.
TEST(BarsTest, AnotherThreadCountIsNotBitExact) {
  EXPECT_FALSE(LogitBarsFor(Site("fp32", "cpu", "cpu", "AVX512", "AVX512", 1, 2)).exact);
  EXPECT_FALSE(LogitBarsFor(Site("fp32", "cpu", "cpu", "AVX512", "AVX512", 0, 2)).exact);
  EXPECT_FALSE(TrainingBarsFor(Site("bf16", "cpu", "cpu", "AVX512", "AVX512", 4, 2), 0, 0)
                   .grad_norm_rel == 0);
}

// Verifies another CPU kernel family gets the margins over upstream's measured spread, decode
// steps their own (looser) floor, and that bf16 bars are looser than fp32's.
TEST(BarsTest, OtherCpuKernelsGetMarginsOverTheFloor) {
  const LogitBars fp32 = LogitBarsFor(Site("fp32", "cpu", "cpu", "AVX512", "AVX2"));
  EXPECT_FALSE(fp32.exact);
  EXPECT_DOUBLE_EQ(fp32.max_abs_diff, kFloorMargin * 1.17e-5);
  EXPECT_DOUBLE_EQ(fp32.kl_mean, kFloorMargin * kFloorMargin * 3.5e-13);
  EXPECT_EQ(fp32.top1_percent, 100.0);
  const LogitBars bf16 = LogitBarsFor(Site("bf16", "cpu", "cpu", "AVX512", "AVX2"));
  EXPECT_DOUBLE_EQ(bf16.top1_percent, 100 - kTop1DisagreementMargin * (100 - 99.11));
  const LogitBars steps =
      LogitBarsFor(Site("bf16", "cpu", "cpu", "AVX512", "AVX2"), LogitKind::kDecodeSteps);
  EXPECT_GT(steps.max_abs_diff, bf16.max_abs_diff);
  EXPECT_GT(bf16.kl_mean, fp32.kl_mean);
  EXPECT_THAT(fp32.basis, HasSubstr("CPU kernel families"));
}

// Verifies a GPU on either side gets KL and top-1 bars but no max-abs bar (not measured).
TEST(BarsTest, AcrossDevicesThereIsNoMaxAbsBar) {
  for (const auto& site : {Site("bf16", "cpu", "cuda", "AVX512", "AVX512"),
                           Site("bf16", "cuda", "cpu", "", "AVX512")}) {
    const LogitBars b = LogitBarsFor(site);
    EXPECT_TRUE(std::isinf(b.max_abs_diff));
    EXPECT_DOUBLE_EQ(b.kl_mean, kFloorMargin * kFloorMargin * 3.8e-5);
    EXPECT_THAT(b.basis, HasSubstr("no max-abs bar"));
  }
}

// Verifies decode-step bars: on a bit-exact site, margins over upstream's own KV-cache spread
// (equality when it is 0); elsewhere the site's bars plus that spread.
TEST(BarsTest, DecodeStepsAddUpstreamsCacheSpread) {
  const LogitBars exact = LogitBarsFor(Site("fp32", "cpu", "cpu", "AVX512", "AVX512"));
  const LogitBars widened = DecodeStepBars(exact, 2e-6, 1e-14);
  EXPECT_FALSE(widened.exact);
  EXPECT_DOUBLE_EQ(widened.max_abs_diff, kFloorMargin * 2e-6);
  EXPECT_DOUBLE_EQ(widened.kl_mean, kFloorMargin * kFloorMargin * 1e-14);
  EXPECT_THAT(widened.basis, HasSubstr("dynamic and static KV caches"));
  const LogitBars same = DecodeStepBars(exact, 0, 0);
  EXPECT_TRUE(same.exact);
  EXPECT_EQ(same.max_abs_diff, 0.0);
  const LogitBars other = LogitBarsFor(Site("fp32", "cpu", "cpu", "AVX512", "AVX2"),
                                       LogitKind::kDecodeSteps);
  EXPECT_DOUBLE_EQ(DecodeStepBars(other, 1e-6, 0).max_abs_diff, other.max_abs_diff + 1e-6);
}

// Verifies training bars: equality on a bit-exact site for a dense model, margins over
// upstream's implementation spread where it has one (MoE), the cross-kernel floor elsewhere.
TEST(BarsTest, TrainingBarsFollowTheFloor) {
  const ComparisonSite same = Site("bf16", "cpu", "cpu", "AVX512", "AVX512");
  const TrainingBars dense = TrainingBarsFor(same, 0, 0);
  EXPECT_EQ(dense.grad_norm_rel, 0.0);
  EXPECT_EQ(dense.loss_rel, 0.0);
  EXPECT_EQ(dense.first_loss_rel, 0.0);
  const TrainingBars moe = TrainingBarsFor(same, 1e-3, 2e-3);
  EXPECT_DOUBLE_EQ(moe.grad_norm_rel, kFloorMargin * 1e-3);
  EXPECT_DOUBLE_EQ(moe.loss_rel, kFloorMargin * 2e-3);
  EXPECT_EQ(moe.first_loss_rel, 0.0);
  const TrainingBars other = TrainingBarsFor(Site("fp32", "cpu", "cpu", "AVX512", "AVX2"), 0, 0);
  EXPECT_DOUBLE_EQ(other.grad_norm_rel, kFloorMargin * 3.2e-6);
  EXPECT_GT(other.first_loss_rel, 0.0);
}

LogitEnvelope Env(double max_abs, double kl, double top1) {
  LogitEnvelope e;
  e.max_abs_diff = max_abs;
  e.kl_mean = kl;
  e.top1_percent = top1;
  return e;
}

// Verifies logits with an envelope: on the same kernels the margins over the envelope alone
// (never equality, so a correct adapter in another op order passes); elsewhere over the
// envelope plus the site's measured spread, top-1 disagreements added.
TEST(BarsTest, EnvelopeBarsAreMarginsOverItPlusTheSite) {
  const LogitEnvelope env = Env(3e-6, 1e-13, 100);
  const LogitBars same =
      LogitBarsFor(Site("fp32", "cpu", "cpu", "AVX512", "AVX512"), LogitKind::kPrompt, true, &env);
  EXPECT_FALSE(same.exact);
  EXPECT_DOUBLE_EQ(same.max_abs_diff, kFloorMargin * 3e-6);
  EXPECT_DOUBLE_EQ(same.kl_mean, kFloorMargin * kFloorMargin * 1e-13);
  EXPECT_EQ(same.top1_percent, 100.0);
  EXPECT_THAT(same.basis, HasSubstr("envelope of correct implementations"));
  const LogitBars other =
      LogitBarsFor(Site("fp32", "cpu", "cpu", "AVX512", "AVX2"), LogitKind::kPrompt, true, &env);
  EXPECT_DOUBLE_EQ(other.max_abs_diff, kFloorMargin * (3e-6 + 1.17e-5));
  EXPECT_THAT(other.basis, HasSubstr("CPU kernel families"));
  const LogitEnvelope bf16_env = Env(0.08, 6e-5, 98.0);
  const LogitBars bf16 = LogitBarsFor(Site("bf16", "cpu", "cpu", "AVX512", "AVX2"),
                                      LogitKind::kPrompt, true, &bf16_env);
  EXPECT_DOUBLE_EQ(bf16.top1_percent, 100 - kTop1DisagreementMargin * ((100 - 98.0) + (100 - 99.11)));
  const LogitBars gpu = LogitBarsFor(Site("fp32", "cpu", "cuda", "AVX512", "AVX512"),
                                     LogitKind::kPrompt, true, &env);
  EXPECT_TRUE(std::isinf(gpu.max_abs_diff));
}

// Verifies decode-step bars with an envelope add, before the margins, upstream's KV-cache
// spread and the gate's extra spread (upstream's cached-vs-forced one past a sliding window).
TEST(BarsTest, EnvelopeDecodeStepsAddCacheAndExtraSpreads) {
  const LogitEnvelope env = Env(2e-6, 1e-13, 100);
  const ComparisonSite same = Site("fp32", "cpu", "cpu", "AVX512", "AVX512");
  const LogitBars plain = EnvelopeDecodeStepBars(same, env, 1e-6, 1e-14);
  EXPECT_DOUBLE_EQ(plain.max_abs_diff, kFloorMargin * 3e-6);
  EXPECT_DOUBLE_EQ(plain.kl_mean, kFloorMargin * kFloorMargin * (1e-13 + 1e-14));
  const LogitBars window = EnvelopeDecodeStepBars(same, env, 1e-6, 1e-14, LogitSpread{4e-6, 0, 99});
  EXPECT_DOUBLE_EQ(window.max_abs_diff, kFloorMargin * 7e-6);
  EXPECT_DOUBLE_EQ(window.top1_percent, 100 - kTop1DisagreementMargin * 1);
  EXPECT_THAT(window.basis, HasSubstr("KV caches"));
}

// Verifies training bars with an envelope: margins over it (gradient norm or sum, whichever is
// wider; the largest loss spread through the cell's steps), never below one fp32 rounding, with
// upstream's MoE floor and the site's spread added.
TEST(BarsTest, EnvelopeTrainingBars) {
  TrainingEnvelope env;
  env.first_loss_rel = 0;  // a forward whose loss the variations left equal: rounding luck
  env.loss_rel = {0, 1.6e-7, 0, 4e-7};
  TrainingEnvelope flat = env;
  flat.loss_rel = {0, 0};
  env.grad_norm_rel = 4.7e-7;
  env.grad_sum_rel = 2e-7;
  const ComparisonSite same = Site("fp32", "cpu", "cpu", "AVX512", "AVX512");
  const TrainingBars two = TrainingBarsFor(same, 0, 0, env, 2);
  EXPECT_DOUBLE_EQ(two.first_loss_rel, kFloorMargin * kRoundingFloor);
  EXPECT_DOUBLE_EQ(two.loss_rel, kFloorMargin * 1.6e-7);  // steps 1..2 only
  EXPECT_DOUBLE_EQ(two.grad_norm_rel, kFloorMargin * 4.7e-7);
  EXPECT_DOUBLE_EQ(TrainingBarsFor(same, 0, 0, flat, 2).loss_rel, kFloorMargin * kRoundingFloor);
  const TrainingBars four = TrainingBarsFor(same, 0, 0, env, 4);
  EXPECT_DOUBLE_EQ(four.loss_rel, kFloorMargin * 4e-7);
  const TrainingBars beyond = TrainingBarsFor(same, 0, 0, env, 9);
  EXPECT_DOUBLE_EQ(beyond.loss_rel, kFloorMargin * 4e-7);
  const TrainingBars moe = TrainingBarsFor(same, 1e-6, 2e-6, env, 2);
  EXPECT_DOUBLE_EQ(moe.grad_norm_rel, kFloorMargin * (4.7e-7 + 1e-6));
  EXPECT_THAT(moe.basis, HasSubstr("its own implementations"));
  const TrainingBars other = TrainingBarsFor(Site("fp32", "cpu", "cpu", "AVX512", "AVX2"), 0, 0, env, 2);
  EXPECT_DOUBLE_EQ(other.grad_norm_rel, kFloorMargin * (4.7e-7 + 3.2e-6));
}

// Verifies the near-tie gap follows the max-abs bar: twice it (0 on a bit-exact site), or the
// fixed allowance where there is no max-abs bar.
TEST(BarsTest, NearTieGapFollowsTheMaxAbsBar) {
  const LogitEnvelope env = Env(3e-6, 1e-13, 100);
  const ComparisonSite same = Site("fp32", "cpu", "cpu", "AVX512", "AVX512");
  EXPECT_EQ(NearTieGap(LogitBarsFor(same)), 0.0);
  EXPECT_DOUBLE_EQ(NearTieGap(LogitBarsFor(same, LogitKind::kPrompt, true, &env)),
                   2 * kFloorMargin * 3e-6);
  EXPECT_EQ(NearTieGap(LogitBarsFor(Site("bf16", "cpu", "cuda", "AVX512", "AVX512"))),
            kNearTieGapNats);
}

// Verifies the packing and logprob_parity bars: margins over their envelopes, each figure
// floored at one rounding where upstream measured none, and the fixed bars (no max log-prob
// bar) without an envelope.
TEST(BarsTest, PackingAndLogprobBarsFromTheirEnvelopes) {
  PackingEnvelope pe;
  pe.kl_max = 2e-12;
  pe.loss_rel = 0;  // upstream's packed and unpacked losses equal: floored
  pe.grad_rel = 3e-6;
  const PackingBars p = PackingBarsFor("fp32", &pe);
  EXPECT_DOUBLE_EQ(p.kl_max, kFloorMargin * kFloorMargin * 2e-12);
  EXPECT_DOUBLE_EQ(p.loss_rel, kFloorMargin * kRoundingFloor);
  EXPECT_DOUBLE_EQ(RoundingFloorOf("bf16"), 1.0 / 256);
  EXPECT_NEAR(KlRoundingFloor("fp32"), 1.82e-12, 1e-14);
  EXPECT_NEAR(KlRoundingFloor("bf16"), 1.95e-3, 1e-5);
  EXPECT_DOUBLE_EQ(p.grad_rel, kFloorMargin * 3e-6);
  EXPECT_EQ(p.near_tie_ulps, 0);
  const PackingBars pb = PackingBarsFor("bf16", &pe);
  EXPECT_EQ(pb.near_tie_ulps, 2);
  EXPECT_EQ(pb.mantissa_bits, 7);
  EXPECT_DOUBLE_EQ(pb.grad_rel, kFloorMargin / 256);  // 3e-6 is below one bf16 rounding
  EXPECT_TRUE(std::isfinite(pb.kl_max));  // bf16 KL barred once upstream's spread is known
  EXPECT_TRUE(std::isinf(PackingBarsFor("bf16").kl_max));
  EXPECT_EQ(PackingBarsFor("fp32").grad_rel, 1e-4);

  LogprobEnvelope le;
  le.mean_abs_diff = 0;
  le.max_abs_diff = 2e-5;
  const LogprobBars l = LogprobBarsFor("fp32", &le);
  EXPECT_DOUBLE_EQ(l.mean_abs, kFloorMargin * kLogprobRoundingFloor);
  EXPECT_DOUBLE_EQ(l.max_abs, kFloorMargin * 2e-5);
  const LogprobBars fixed = LogprobBarsFor("bf16");
  EXPECT_EQ(fixed.mean_abs, 1e-2);
  EXPECT_TRUE(std::isinf(fixed.max_abs));
  EXPECT_NE(fixed.basis.find("no max bar"), std::string::npos);
}

// Verifies the claims: equality is bit-exact whatever the bars, inside them correct.
TEST(BarsTest, Claims) {
  EXPECT_EQ(ClaimOf(true, true), "bit-exact");
  EXPECT_EQ(ClaimOf(true, false), "correct, not bit-exact");
  EXPECT_EQ(ClaimOf(false, false), "outside the bars");
}

// Verifies the site's description names both sides and the CPU kernel families.
TEST(BarsTest, SiteDescription) {
  EXPECT_EQ(Site("bf16", "cpu", "cuda", "AVX512", "AVX2", 2, 0).Describe(),
            "cuda bf16 vs upstream cpu/AVX512x2");
  EXPECT_EQ(Site("fp32", "cpu", "cpu", "", "AVX2", 0, 4).Describe(),
            "cpu/AVX2x4 fp32 vs upstream cpu/unknown");
  EXPECT_FALSE(CpuCapability().empty());
}

}  // namespace
}  // namespace gatehouse::worker
