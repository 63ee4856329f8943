// The envelope of correct implementations: upstream's own spread, on the bundle's checkpoint and
// prompts, under the choices a correct adapter may make (attention backend, RoPE formulation,
// fused projections, RMSNorm formulation, thread count), measured by
// tools/refgen/envelope.py and stored in reference.json "envelope" (docs/protocols.md §6).
// The gates hold an adapter to margins over it (bars.h, docs/bars.md): inside them is
// "correct"; equal to upstream is "bit-exact", a claim of its own.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gatehouse::worker {

/// How far logits moved under the variations: the worst value of each figure and the
/// variation it came from. Units: logits, nats (mean per-token KL), percent.
struct LogitEnvelope {
  double max_abs_diff = 0;
  double kl_mean = 0;
  double top1_percent = 100;
  std::string max_abs_diff_from, kl_mean_from, top1_percent_from;
};

/// How far upstream's training trace moved under the variations: relative loss difference per
/// step, and at step 1 the worst relative gradient-norm and gradient-sum difference of a
/// parameter (the sum scaled by sqrt(numel) x the norm, as the training gate scales it).
struct TrainingEnvelope {
  double first_loss_rel = 0;
  std::vector<double> loss_rel;  // per step, from step 1
  double grad_norm_rel = 0;
  double grad_sum_rel = 0;
  std::string grad_norm_rel_from, grad_sum_rel_from;
  /// The largest loss_rel over steps 1..steps (all of them when steps exceeds the trace).
  double LossRelThrough(int64_t steps) const;
};

/// How far upstream's rollout log-probs (KV-cached decode) moved from its training log-probs
/// (teacher-forced forward) on its own paths and across the variations, in nats: per decode
/// row the expected |difference| of a token drawn at temperature 1, averaged over rows
/// (mean_abs_diff), and the largest over every token of the vocabulary (max_abs_diff).
/// Envelope version 2 and later.
struct LogprobEnvelope {
  double mean_abs_diff = 0;
  double max_abs_diff = 0;
  std::string mean_abs_diff_from, max_abs_diff_from;
};

/// Upstream's packed forward and training step against its own unpacked ones, on its own run
/// and under the variations, as the packing gate bars them: the largest per-token KL (nats),
/// the relative loss difference and the largest relative L2 difference of a parameter's
/// gradient (ratios). Envelope version 2 and later (the bundle holds its other figures too).
struct PackingEnvelope {
  double kl_max = 0;
  double loss_rel = 0;
  double grad_rel = 0;
  std::string kl_max_from, loss_rel_from, grad_rel_from;
};

/// One precision's envelope (reference.json "envelope"."fp32" / ."bf16").
struct Envelope {
  LogitEnvelope prompt;        // the probe prompts' logits
  LogitEnvelope decode_steps;  // KV-cached decode steps along upstream's greedy tokens
  TrainingEnvelope training;
  std::optional<LogprobEnvelope> logprobs;  // absent in version 1 envelopes
  std::optional<PackingEnvelope> packing;   // absent in version 1 envelopes
  std::vector<std::string> variations;  // what was run ("attention=sdpa", ...)
  /// "<n> variations of upstream (attention=sdpa, rope=complex, ...)", for bases and figures.
  std::string Describe() const;
};

/// Both precisions' envelopes, or nothing when the bundle holds none (made before envelopes,
/// or by hand): the gates then keep the site's own bars and say so.
struct Envelopes {
  std::optional<Envelope> fp32, bf16;
  const Envelope* For(std::string_view precision) const {
    const auto& e = precision == "bf16" ? bf16 : fp32;
    return e ? &*e : nullptr;
  }
};

/// reference.json "envelope" of `meta` (absent: empty Envelopes). Every figure must be a
/// number >= 0 (top-1 in [0, 100]); training.loss_rel a list of numbers; "logprobs" and
/// "packing" are read when present (version 2), with the same rules.
/// Errors: INVALID_ARGUMENT naming `where`, the field and its value.
Result<Envelopes> ParseEnvelope(const nlohmann::json& meta, const std::string& where);

}  // namespace gatehouse::worker
