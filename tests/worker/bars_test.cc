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
