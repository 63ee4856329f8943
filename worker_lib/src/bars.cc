// The bars table (docs/bars.md is the same table with its measurements and their sources).
#include "gatehouse/worker/bars.h"

#include "figure_format.h"

#include <ATen/Version.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace gatehouse::worker {
namespace {

/// Upstream's own spread between two sites, measured with transformers itself
/// (tools/gpu/upstream_floor.py); the worst figure over the fixtures it ran on.
struct Floor {
  double max_abs_diff;  // logits; infinity: not measured
  double kl_mean;       // nats
  double top1_percent;
};

// transformers with ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2,
// ONEDNN_MAX_CPU_ISA=AVX2 against its AVX512 bundles, all 69 tools/refgen fixtures, 2026-12-01
// (docs/bars.md "Another CPU kernel family").
constexpr Floor kCpuKernelsFp32Prompt{1.17e-5, 3.5e-13, 100};
constexpr Floor kCpuKernelsFp32Steps{1.33e-5, 4.7e-13, 100};
constexpr Floor kCpuKernelsBf16Prompt{0.18, 2.2e-5, 99.11};
constexpr Floor kCpuKernelsBf16Steps{1.02, 3.6e-4, 97.91};
constexpr double kCpuKernelsFp32GradRel = 3.2e-6, kCpuKernelsFp32LossRel = 1.3e-6;
constexpr double kCpuKernelsBf16GradRel = 6.8e-3, kCpuKernelsBf16LossRel = 3.4e-3;

// transformers on an H200 against its CPU bundles, the nine tiny fixtures, 2026-11-30
// (docs/gpu-check.md): prompt logits only; max abs and decode steps not measured there.
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Floor kCudaFp32Prompt{kInf, 4e-13, 100};
constexpr Floor kCudaBf16Prompt{kInf, 3.8e-5, 98.24};

bool SameCpuKernels(const ComparisonSite& s) {
  return s.reference_device == "cpu" && s.run_device == "cpu" && !s.reference_cpu.empty() &&
         s.reference_cpu == s.run_cpu && s.reference_threads > 0 &&
         s.reference_threads == s.run_threads;
}

LogitBars FromFloor(const Floor& f, std::string basis) {
  LogitBars b;
  b.max_abs_diff = kFloorMargin * f.max_abs_diff;
  b.kl_mean = kFloorMargin * kFloorMargin * f.kl_mean;
  b.top1_percent = 100.0 - kTop1DisagreementMargin * (100.0 - f.top1_percent);
  b.basis = std::move(basis);
  return b;
}

const Floor& CpuKernelsFloor(bool bf16, LogitKind kind) {
  const bool steps = kind == LogitKind::kDecodeSteps;
  return bf16 ? (steps ? kCpuKernelsBf16Steps : kCpuKernelsBf16Prompt)
              : (steps ? kCpuKernelsFp32Steps : kCpuKernelsFp32Prompt);
}

/// The envelope bars' basis: what the envelope measured, and the site part where there is one.
std::string EnvelopeBasis(const ComparisonSite& s, LogitKind kind) {
  std::string basis = "margins over the bundle's envelope of correct implementations (upstream "
                      "run with other attention backends, RoPE formulations, fused projections, "
                      "norm kernels and thread counts on this checkpoint";
  basis += kind == LogitKind::kDecodeSteps ? ", its KV-cached decode steps)" : ")";
  if (SameCpuKernels(s)) return basis + ", same device kind, dtype and CPU kernels as upstream's run";
  if (s.reference_device == "cpu" && s.run_device == "cpu") {
    return basis + " plus upstream's own spread between CPU kernel families (docs/bars.md)";
  }
  return basis + " plus upstream's own spread between CPU and CUDA (H200, docs/bars.md; no "
                 "max-abs bar there until that floor is measured)";
}

}  // namespace

LogitSpread& LogitSpread::operator+=(const LogitSpread& o) {
  max_abs_diff += o.max_abs_diff;
  kl_mean += o.kl_mean;
  top1_percent = std::max(0.0, 100.0 - ((100.0 - top1_percent) + (100.0 - o.top1_percent)));
  return *this;
}

LogitSpread SpreadOf(const LogitEnvelope& e) {
  return LogitSpread{e.max_abs_diff, e.kl_mean, e.top1_percent};
}

LogitSpread SiteSpread(const ComparisonSite& s, LogitKind kind) {
  if (SameCpuKernels(s)) return LogitSpread{};
  const bool bf16 = s.precision == "bf16";
  const Floor& f = s.reference_device == "cpu" && s.run_device == "cpu"
                       ? CpuKernelsFloor(bf16, kind)
                       : (bf16 ? kCudaBf16Prompt : kCudaFp32Prompt);
  return LogitSpread{f.max_abs_diff, f.kl_mean, f.top1_percent};
}

LogitBars MarginsOver(const LogitSpread& spread, std::string basis) {
  LogitBars b = FromFloor(Floor{spread.max_abs_diff, spread.kl_mean, spread.top1_percent},
                          std::move(basis));
  return b;
}

double NearTieGap(const LogitBars& bars) {
  return std::isinf(bars.max_abs_diff) ? kNearTieGapNats : 2 * bars.max_abs_diff;
}

std::string ClaimOf(bool within_bars, bool equal) {
  if (equal) return "bit-exact";
  return within_bars ? "correct, not bit-exact" : "outside the bars";
}

std::string CpuCapability() { return at::get_cpu_capability(); }

std::string ComparisonSite::Describe() const {
  auto where = [](const std::string& device, const std::string& cpu, int64_t threads) {
    if (device != "cpu") return device;
    return device + "/" + (cpu.empty() ? std::string("unknown") : cpu) +
           (threads > 0 ? "x" + std::to_string(threads) : std::string());
  };
  return where(run_device, run_cpu, run_threads) + " " + precision + " vs upstream " +
         where(reference_device, reference_cpu, reference_threads);
}

LogitBars LogitBarsFor(const ComparisonSite& s, LogitKind kind, bool same_reductions,
                       const LogitEnvelope* envelope) {
  const bool bf16 = s.precision == "bf16";
  const bool steps = kind == LogitKind::kDecodeSteps;
  if (envelope != nullptr) {
    LogitSpread spread = SiteSpread(s, kind);
    spread += SpreadOf(*envelope);
    return MarginsOver(spread, EnvelopeBasis(s, kind));
  }
  if (SameCpuKernels(s) && !same_reductions) {
    const Floor& f = CpuKernelsFloor(bf16, kind);
    return FromFloor(f, "same CPU kernels as upstream's run, but sums of other lengths (past a "
                        "sliding window upstream's KV cache keeps only the window's keys, ours "
                        "masks the rest): margins over upstream's own spread between CPU kernel "
                        "families (docs/bars.md)");
  }
  if (SameCpuKernels(s)) {
    // Every fixture of every family, both precisions: our prompt logits equal transformers' to
    // the last bit on the same CPU kernels (tests/models/families_test.cc asserts it). Decode
    // steps: DecodeStepBars widens this by upstream's own KV-cache spread.
    LogitBars b;
    b.exact = true;
    b.max_abs_diff = 0;
    b.kl_mean = 0;
    b.top1_percent = 100;
    b.basis = "bit-exact: same device kind, dtype and CPU kernels as upstream's run";
    return b;
  }
  if (s.reference_device == "cpu" && s.run_device == "cpu") {
    const Floor& f = CpuKernelsFloor(bf16, kind);
    return FromFloor(f, "another CPU kernel family or thread count than upstream's run (or an "
                        "unknown one): margins over upstream's own spread between CPU kernel "
                        "families (docs/bars.md)");
  }
  LogitBars b = FromFloor(bf16 ? kCudaBf16Prompt : kCudaFp32Prompt,
                          "across device kinds: margins over upstream's own spread between CPU "
                          "and CUDA (H200, docs/bars.md); no max-abs bar until that floor is "
                          "measured");
  if (steps) b.basis += "; decode steps held to the prompt logits' bars (not measured apart)";
  return b;
}

LogitBars DecodeStepBars(const LogitBars& site_bars, double floor_max_abs_diff,
                         double floor_kl_mean) {
  LogitBars b = site_bars;
  if (site_bars.exact) {
    b.max_abs_diff = kFloorMargin * floor_max_abs_diff;
    b.kl_mean = kFloorMargin * kFloorMargin * floor_kl_mean;
    b.exact = floor_max_abs_diff == 0;
    b.basis = b.exact ? site_bars.basis + "; upstream's dynamic and static KV caches agree exactly"
                      : "same kernels as upstream; margins over upstream's own spread between "
                        "its dynamic and static KV caches";
    return b;
  }
  b.max_abs_diff += floor_max_abs_diff;
  b.kl_mean += floor_kl_mean;
  b.basis += "; plus upstream's own spread between its KV caches";
  return b;
}

LogitBars EnvelopeDecodeStepBars(const ComparisonSite& s, const LogitEnvelope& envelope,
                                 double floor_max_abs_diff, double floor_kl_mean,
                                 const LogitSpread& extra) {
  LogitSpread spread = SiteSpread(s, LogitKind::kDecodeSteps);
  spread += SpreadOf(envelope);
  spread += LogitSpread{floor_max_abs_diff, floor_kl_mean, 100};
  spread += extra;
  return MarginsOver(spread, EnvelopeBasis(s, LogitKind::kDecodeSteps) +
                                 "; plus upstream's own spread between its KV caches");
}

TrainingBars TrainingBarsFor(const ComparisonSite& s, double floor_grad_norm_rel,
                             double floor_loss_rel) {
  TrainingBars b;
  const bool bf16 = s.precision == "bf16";
  if (SameCpuKernels(s)) {
    // Forward exact, our backward the same ops, AdamW upstream's op for op (adamw.h): losses
    // and gradient norms equal upstream's; where upstream's own implementations of the same
    // math disagree (MoE experts), margins over their spread.
    b.first_loss_rel = 0;
    b.loss_rel = kFloorMargin * floor_loss_rel;
    b.grad_norm_rel = kFloorMargin * floor_grad_norm_rel;
    b.basis = floor_grad_norm_rel == 0 && floor_loss_rel == 0
                  ? "bit-exact: same device kind, dtype and CPU kernels as upstream's run"
                  : "same kernels as upstream; margins over upstream's own spread between its "
                    "implementations of the same math";
    return b;
  }
  const double grad = bf16 ? kCpuKernelsBf16GradRel : kCpuKernelsFp32GradRel;
  const double loss = bf16 ? kCpuKernelsBf16LossRel : kCpuKernelsFp32LossRel;
  b.first_loss_rel = kFloorMargin * loss;
  b.loss_rel = kFloorMargin * std::max(loss, floor_loss_rel);
  b.grad_norm_rel = kFloorMargin * std::max(grad, floor_grad_norm_rel);
  b.basis = s.reference_device == "cpu" && s.run_device == "cpu"
                ? "another CPU kernel family: margins over upstream's own training spread "
                  "between CPU kernel families (docs/bars.md)"
                : "across device kinds: upstream's training spread there is not measured; the "
                  "CPU kernel-family margins (docs/bars.md)";
  return b;
}

TrainingBars TrainingBarsFor(const ComparisonSite& s, double floor_grad_norm_rel,
                             double floor_loss_rel, const TrainingEnvelope& envelope,
                             int64_t steps) {
  TrainingBars b;
  const bool bf16 = s.precision == "bf16";
  double site_grad = 0, site_loss = 0;
  if (!SameCpuKernels(s)) {
    site_grad = bf16 ? kCpuKernelsBf16GradRel : kCpuKernelsFp32GradRel;
    site_loss = bf16 ? kCpuKernelsBf16LossRel : kCpuKernelsFp32LossRel;
  }
  auto spread = [](double measured) { return std::max(measured, kRoundingFloor); };
  b.first_loss_rel = kFloorMargin * (spread(envelope.first_loss_rel) + site_loss);
  b.loss_rel = kFloorMargin * (spread(envelope.LossRelThrough(steps)) + floor_loss_rel + site_loss);
  b.grad_norm_rel = kFloorMargin * (spread(std::max(envelope.grad_norm_rel, envelope.grad_sum_rel)) +
                                    floor_grad_norm_rel + site_grad);
  b.basis = "margins over the bundle's envelope of correct implementations (upstream's training "
            "trace with other attention backends, RoPE formulations, fused projections, norm "
            "kernels and thread counts on this checkpoint";
  b.basis += floor_grad_norm_rel > 0 || floor_loss_rel > 0
                 ? ", plus its spread between its own implementations of the same math)"
                 : ")";
  if (!SameCpuKernels(s)) {
    b.basis += s.reference_device == "cpu" && s.run_device == "cpu"
                   ? " plus upstream's training spread between CPU kernel families (docs/bars.md)"
                   : " plus the CPU kernel-family training spread (across device kinds not "
                     "measured yet; docs/bars.md)";
  }
  return b;
}

double RoundingFloorOf(std::string_view precision) {
  return precision == "bf16" ? 1.0 / 256.0 : kRoundingFloor;
}

double KlRoundingFloor(std::string_view precision) {
  const double step = 16.0 * RoundingFloorOf(precision);
  return 0.5 * step * step;
}

PackingBars PackingBarsFor(std::string_view precision, const PackingEnvelope* envelope) {
  PackingBars b;
  const bool bf16 = precision == "bf16";
  b.top1_percent = 100;
  if (bf16) {
    b.near_tie_ulps = 2;
    b.mantissa_bits = 7;
  }
  if (envelope != nullptr) {
    const PackingEnvelope& e = *envelope;
    b.kl_max = kFloorMargin * kFloorMargin * std::max(e.kl_max, KlRoundingFloor(precision));
    b.loss_rel = kFloorMargin * std::max(e.loss_rel, RoundingFloorOf(precision));
    b.grad_rel = kFloorMargin * std::max(e.grad_rel, RoundingFloorOf(precision));
    b.basis = std::string(precision) + ", packed vs alone on the same kernels, margins over "
              "upstream's own packed-vs-unpacked spread (the envelope: KL max " +
              internal::Num(e.kl_max) + " from " + e.kl_max_from + ", loss " +
              internal::Num(e.loss_rel) + " from " + e.loss_rel_from + ", gradient " +
              internal::Num(e.grad_rel) + " relative from " + e.grad_rel_from +
              "): KL max <= " + internal::Num(b.kl_max) + " per token, loss within " +
              internal::Num(b.loss_rel) + " and each gradient within " +
              internal::Num(b.grad_rel) + " relative, top-1 100 % apart from near-ties";
    return b;
  }
  if (bf16) {
    b.kl_max = std::numeric_limits<double>::infinity();
    b.loss_rel = 1e-2;
    b.grad_rel = 0.25;
    b.basis = "bf16, packed vs alone on the same kernels: top-1 100 % apart from near-ties "
              "(0.1 nats, or two bf16 steps at the top logit), loss within 1e-2 and each "
              "gradient within 0.25 relative (bf16 rounds sums of another order apart: 0.11 "
              "measured on trained SmolLM2-135M); the bundle has no packing envelope";
    return b;
  }
  b.kl_max = 1e-9;
  b.loss_rel = 1e-6;
  b.grad_rel = 1e-4;
  b.basis = "fp32, packed vs alone on the same kernels: bit-equal or KL <= 1e-9 per token and "
            "top-1 100 % apart from near-ties (0.1 nats), loss within 1e-6 and each gradient "
            "within 1e-4 relative; the bundle has no packing envelope";
  return b;
}

LogprobBars LogprobBarsFor(std::string_view precision, const LogprobEnvelope* envelope) {
  LogprobBars b;
  if (envelope != nullptr) {
    const LogprobEnvelope& e = *envelope;
    b.mean_abs = kFloorMargin * std::max(e.mean_abs_diff, kLogprobRoundingFloor);
    b.max_abs = kFloorMargin * std::max(e.max_abs_diff, kLogprobRoundingFloor);
    b.basis = std::string(precision) + ", rollout vs training forward on the same weights, "
              "margins over upstream's own decode-vs-forward log-prob gap and its variations' "
              "(the envelope: mean " + internal::Num(e.mean_abs_diff) + " nats from " +
              e.mean_abs_diff_from + ", max " + internal::Num(e.max_abs_diff) + " from " +
              e.max_abs_diff_from + "): mean abs diff <= " + internal::Num(b.mean_abs) +
              " and max <= " + internal::Num(b.max_abs) + " nats over the sampled tokens";
    return b;
  }
  if (precision == "bf16") {
    b.mean_abs = 1e-2;
    b.basis = "bf16, rollout vs training forward on the same weights: mean abs log-prob diff "
              "<= 1e-2 nats over the sampled tokens (above it RL frameworks call the gap a "
              "precision problem); no max bar: the bundle has no log-prob envelope";
    return b;
  }
  b.mean_abs = 1e-5;
  b.basis = "fp32, rollout vs training forward on the same weights: mean abs log-prob diff "
            "<= 1e-5 nats over the sampled tokens; no max bar: the bundle has no log-prob "
            "envelope";
  return b;
}

}  // namespace gatehouse::worker
