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

#include "gatehouse/worker/envelope.h"


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

/// Which logits are compared: a prompt's forward, or KV-cached decode steps.
enum class LogitKind { kPrompt, kDecodeSteps };

/// How far two runs' logits are apart: max abs diff (logits), mean per-token KL (nats), top-1
/// agreement (percent). Spreads of independent causes add (+=): max abs and KL add, and so do
/// top-1 disagreements.
struct LogitSpread {
  double max_abs_diff = 0;
  double kl_mean = 0;
  double top1_percent = 100;
  LogitSpread& operator+=(const LogitSpread& o);
};

/// The spread of an envelope's logits (envelope.h).
LogitSpread SpreadOf(const LogitEnvelope& envelope);

/// Upstream's own spread between the two sites of `site` for logits of `kind`: zero where both
/// ran the same device kind, dtype and CPU kernels; elsewhere the measured floors of the table
/// in docs/bars.md (infinite max abs across device kinds: not measured).
LogitSpread SiteSpread(const ComparisonSite& site, LogitKind kind);

/// Bars at the margins over `spread`: kFloorMargin x max abs, kFloorMargin^2 x KL,
/// kTop1DisagreementMargin x top-1 disagreement; `basis` kept.
LogitBars MarginsOver(const LogitSpread& spread, std::string basis);

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


/// `same_reductions` false: our computation sums over other lengths than upstream's although
/// the math is the same (decode past a sliding window: upstream's sliding KV cache holds only
/// the window's keys, ours masks the rest), so even the same kernels are not bit-exact; such a
/// site gets the bars of another CPU kernel family.
/// With `envelope` (the bundle's, this precision's, for logits of `kind`): the margins over the
/// envelope plus the site's spread (SiteSpread); PASS then means correct, and equality is a
/// claim of its own (a gate's "claim" figure). `same_reductions` is not read then: the decode
/// gate adds upstream's own cached-vs-forced spread past a sliding window itself.
LogitBars LogitBarsFor(const ComparisonSite& site, LogitKind kind = LogitKind::kPrompt,
                       bool same_reductions = true, const LogitEnvelope* envelope = nullptr);

/// Bars for KV-cached decode-step logits against upstream's decode logits. Upstream's own
/// decode differs between its dynamic and its static (preallocated, masked) KV cache in fp32 by
/// rounding (`floor_max_abs_diff`, `floor_kl_mean`, measured on the bundle; 0 in bf16). Ours is
/// another cache layout of the same math, so on a bit-exact site it is held to kFloorMargin
/// times that spread (equality where the spread is 0); elsewhere to the site's bars plus it.
LogitBars DecodeStepBars(const LogitBars& site_bars, double floor_max_abs_diff,
                         double floor_kl_mean);

/// Decode-step bars from the bundle's envelope: the margins over the site's spread, the
/// envelope's decode steps, upstream's own spread between its dynamic and static KV caches
/// (`floor_max_abs_diff`, `floor_kl_mean`) and `extra` (the decode gate's: upstream's own
/// cached-vs-forced spread, past a sliding window).
LogitBars EnvelopeDecodeStepBars(const ComparisonSite& site, const LogitEnvelope& envelope,
                                 double floor_max_abs_diff, double floor_kl_mean,
                                 const LogitSpread& extra = LogitSpread{});

/// Training bars for `site`. On a bit-exact site: kFloorMargin times upstream's own spread
/// between its implementations of the same math (`floor_grad_norm_rel`, `floor_loss_rel`, the
/// largest per-step value; 0 for dense models, so equality); elsewhere the measured cross-site
/// bars or, unmeasured, the tensor-parallel gate's.
TrainingBars TrainingBarsFor(const ComparisonSite& site, double floor_grad_norm_rel,
                             double floor_loss_rel);

/// Training bars from the bundle's envelope (this precision's) for a cell of `steps` steps:
/// kFloorMargin x (the envelope's spread + upstream's implementation floor + the site's
/// training spread, zero on the same kernels). Each relative figure's spread is at least
/// kRoundingFloor (one fp32 rounding, 2^-23): a zero measured on a figure the variations move
/// elsewhere (a step's loss, computed in fp32 from logits that moved) is rounding luck, not a
/// bar a correct implementation can be held to.
TrainingBars TrainingBarsFor(const ComparisonSite& site, double floor_grad_norm_rel,
                             double floor_loss_rel, const TrainingEnvelope& envelope,
                             int64_t steps);

/// One fp32 rounding, relative (2^-23): the least spread a relative training figure gets.
inline constexpr double kRoundingFloor = 1.0 / 8388608.0;

/// The claim a comparison supports: "bit-exact" (equal to upstream), "correct, not bit-exact"
/// (inside its bars), or "outside the bars".
std::string ClaimOf(bool within_bars, bool equal);

/// A top-1 flip between two tokens whose log-probabilities lie within this many nats of each
/// other is a near-tie, which any rounding can flip (the decode gate's allowance where it has
/// no max-abs bar, and the packing gate's).
inline constexpr double kNearTieGapNats = 0.1;

/// The log-prob gap within which a top-1 flip against upstream is a near-tie under `bars`:
/// twice the max-abs bar (a logit difference the bar allows moves the two tokens that far
/// apart), or kNearTieGapNats where there is no max-abs bar; 0 on a bit-exact site. Such flips
/// are reported, and not counted against the top-1 bar or a greedy continuation.
double NearTieGap(const LogitBars& bars);

/// Bars for the packing gate (PackingGate): the same model's packed forward against its
/// forward of each sequence alone, and the packed training step against the unpacked batch's.
/// Both sides are ours on the same kernels; only the order of sums may differ (the masked
/// columns of the packed row, matrix products over more rows). A sequence passes when its
/// logits are bit-equal to its own forward, or its per-token KL stays <= kl_max (nats) and
/// its top-1 agrees on every token (top1_percent) except near-ties: tokens where the forward
/// alone ranks its top-1 and the packed top-1 within near_tie_nats of log-probability, or in
/// bf16 within two steps of bf16 at the top logit (any rounding flips those; a random bf16
/// model has a few in 300 tokens, trained SmolLM2-135M 6 in 228 with gaps up to 0.125 nats,
/// one bf16 step at logits of 16 to 32). The loss within
/// loss_rel, and each parameter's gradient within grad_rel, as ||packed - unpacked|| /
/// ||unpacked|| (relative, L2).
struct PackingBars {
  double kl_max = 0;
  double top1_percent = 100;
  double near_tie_nats = kNearTieGapNats;
  /// bf16: a flip within this many steps of the dtype at the top logit is a near-tie too
  /// (0 for fp32); a step there is 2^(exponent - mantissa_bits) (bf16: 7 stored bits).
  double near_tie_ulps = 0;
  int mantissa_bits = 23;
  double loss_rel = 0;
  double grad_rel = 0;
  std::string basis;
};

/// Without an envelope (`envelope` null: the bundle's is version 1, or it has none): fp32:
/// KL <= 1e-9 per token, top-1 100 %, loss within 1e-6 and gradients within 1e-4 relative;
/// bf16: top-1 100 % (KL not barred, max abs diff reported), loss within 1e-2 and gradients
/// within 0.25 relative; near-ties (0.1 nats, the decode gate's; in bf16 also two bf16 steps
/// at the top logit) apart in both (docs/bars.md, "Packed batches").
/// With the bundle's packing envelope (this precision's): KL max <= kFloorMargin^2 x the
/// envelope's (at least KlRoundingFloor), loss and each gradient within kFloorMargin x the
/// envelope's relative spread (at least RoundingFloorOf); top-1 and near-ties as above.
PackingBars PackingBarsFor(std::string_view precision, const PackingEnvelope* envelope = nullptr);

/// One rounding of the precision's dtype, relative: 2^-23 (fp32), 2^-8 (bf16). The least
/// relative spread a bar of packed against unpacked is built on: upstream's packed and
/// unpacked runs can be equal by luck on the probe prompts (a tiny bf16 model's often are)
/// where another implementation's sums of another order round one step apart.
double RoundingFloorOf(std::string_view precision);

/// The KL between two distributions whose logits (|z| up to 16) differ by one rounding of the
/// precision's dtype: 0.5 x (16 x RoundingFloorOf)^2; fp32 1.8e-12, bf16 2.0e-3 nats.
double KlRoundingFloor(std::string_view precision);

/// Bars for the logprob_parity gate (LogprobParityGate): the log-probability the decode path
/// gave each token it sampled against the one a train-mode forward over the same sequence
/// gives it, as an RL trainer compares its rollout's log-probs with its policy's. Both sides
/// are ours; `mean_abs` bars the mean over every sampled token of |log p_train - log p_rollout|
/// and `max_abs` the largest (nats; infinity: no max bar, `basis` says why). The k3 KL
/// estimator is a figure beside them.
struct LogprobBars {
  double mean_abs = 0;
  double max_abs = std::numeric_limits<double>::infinity();
  std::string basis;
};

/// One fp32 rounding of a log-probability of magnitude up to 16 (2^-20 nats): the least
/// log-prob spread a bar is built on.
inline constexpr double kLogprobRoundingFloor = 1.0 / 1048576.0;

/// Without an envelope: fp32 mean abs diff <= 1e-5 nats; bf16 <= 1e-2 nats, the level above
/// which RL frameworks treat a rollout/training gap as a precision problem; no max bar
/// (docs/bars.md, "Rollout vs training log-probs"). With the bundle's log-prob envelope
/// (this precision's): mean and max within kFloorMargin x the envelope's (each at least
/// kLogprobRoundingFloor): upstream's own decode-vs-forward gap and its variations'.
LogprobBars LogprobBarsFor(std::string_view precision, const LogprobEnvelope* envelope = nullptr);

}  // namespace gatehouse::worker
