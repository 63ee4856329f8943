// The bars a comparison with upstream must meet, chosen by where its two sides ran
// (docs/bars.md holds the table, its measurements and their sources).
//
// Where our kernels reproduce upstream's bit for bit (same device kind, same dtype and, on the
// CPU, the same kernel family: torch's CPU capability), the bar is that: logits equal to the
// last bit, training losses and gradient norms equal. Elsewhere the bar is derived from
// upstream's own spread between the two sites, measured with transformers itself
// (tools/gpu/upstream_floor.py), times a stated margin. A site whose floor was never measured
// gets the loosest measured bars and says so in its basis.
#pragma once

#include <limits>
#include <string>


namespace gatehouse::worker {

/// Where the two sides of a comparison ran.
struct ComparisonSite {
  std::string precision;         // "fp32" | "bf16"
  std::string reference_device;  // where upstream ran (bundle "device"): "cpu" | "cuda"
  std::string run_device;        // where we run: "cpu" | "cuda"
  std::string reference_cpu;     // bundle "cpu_capability" ("AVX512", ...; "" unknown)
  std::string run_cpu;           // this worker's CPU capability (CpuCapability())
  /// Intra-op threads of each side on the CPU (bundle "num_threads"; 0 unknown): reductions are
  /// split by thread, so equality needs the same count (the gates run with the bundle's).
  int64_t reference_threads = 0;
  int64_t run_threads = 0;

  /// "cpu/AVX512x2 fp32 vs upstream cpu/AVX512x2" (x: threads), for figures and reasons.
  std::string Describe() const;
};

/// torch's CPU kernel family in this process ("AVX512", "AVX2", "DEFAULT"; at::get_cpu_capability).
std::string CpuCapability();

/// Bars for logits compared with upstream's: a comparison passes when max_abs_diff <=
/// max_abs_diff, kl_mean <= kl_mean and top1 >= top1_percent. Units: logits, nats, percent.
struct LogitBars {
  double max_abs_diff = std::numeric_limits<double>::infinity();  // infinity: no bar
  double kl_mean = 0;
  double top1_percent = 100;
  bool exact = false;  // bit-exact site: every bar is equality
  std::string basis;   // why these bars, with the measurement they come from
};

/// Bars for a training trace compared with upstream's (TrainingGate): loss per step and the
/// L2 norm of each parameter's step-1 gradient, as |ours - upstream| / max(|upstream|, tiny).
struct TrainingBars {
  double loss_rel = 0;       // steps after the first (they depend on the optimizer)
  double first_loss_rel = 0;  // step 1 (a forward only)
  double grad_norm_rel = 0;
  std::string basis;
};

/// Margin over upstream's own measured spread where a bar is derived from it: max abs and
/// relative differences get kFloorMargin times upstream's, KL (second order in the logits) its
/// square, and top-1 disagreement kTop1DisagreementMargin times upstream's.
inline constexpr double kFloorMargin = 4.0;
inline constexpr double kTop1DisagreementMargin = 2.0;

/// Which logits are compared: a prompt's forward, or KV-cached decode steps.
enum class LogitKind { kPrompt, kDecodeSteps };

/// `same_reductions` false: our computation sums over other lengths than upstream's although
/// the math is the same (decode past a sliding window: upstream's sliding KV cache holds only
/// the window's keys, ours masks the rest), so even the same kernels are not bit-exact; such a
/// site gets the bars of another CPU kernel family.
LogitBars LogitBarsFor(const ComparisonSite& site, LogitKind kind = LogitKind::kPrompt,
                       bool same_reductions = true);

/// Bars for KV-cached decode-step logits against upstream's decode logits. Upstream's own
/// decode differs between its dynamic and its static (preallocated, masked) KV cache in fp32 by
/// rounding (`floor_max_abs_diff`, `floor_kl_mean`, measured on the bundle; 0 in bf16). Ours is
/// another cache layout of the same math, so on a bit-exact site it is held to kFloorMargin
/// times that spread (equality where the spread is 0); elsewhere to the site's bars plus it.
LogitBars DecodeStepBars(const LogitBars& site_bars, double floor_max_abs_diff,
                         double floor_kl_mean);

/// Training bars for `site`. On a bit-exact site: kFloorMargin times upstream's own spread
/// between its implementations of the same math (`floor_grad_norm_rel`, `floor_loss_rel`, the
/// largest per-step value; 0 for dense models, so equality); elsewhere the measured cross-site
/// bars or, unmeasured, the tensor-parallel gate's.
TrainingBars TrainingBarsFor(const ComparisonSite& site, double floor_grad_norm_rel,
                             double floor_loss_rel);

}  // namespace gatehouse::worker
