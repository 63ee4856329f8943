// The numerical gates against upstream's logits: inference (logits vs reference) and decode
// (KV-cached decode: step logits and greedy ids); training is gates_training.cc.
// docs/architecture.md "Phases, statuses and blame"; the bars are bars.h's (docs/bars.md);
// reductions from docs/gate-facts.md "Comparing logits".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include "gatehouse/worker/bars.h"
#include "gatehouse/worker/detokenizer.h"
#include "common/sha256.h"
#include "gatehouse/worker/gates.h"
#include "common/artifacts.h"
#include "gates_internal.h"

namespace gatehouse::worker {

using internal::JoinFew;
using internal::Num;
using internal::NowMsSteady;
using internal::Positions;
using internal::SyncDevice;
using internal::ShapeString;
using internal::EnvelopeFigure;
using internal::SiteOf;

namespace {

// Where the bars allow our logits to differ from upstream's, one moved near-tie changes the rest
// of a greedy continuation (qwen3-tiny bf16 on an H200 matched 81/96 tokens of its CPU bf16
// bundle, diverging at one position). A prompt may diverge once where our log-probabilities of
// our token and the reference's token differ by at most twice the decode-step max-abs bar (a
// flip the allowed logit difference can cause), or by kNearTieGapNats where there is no max-abs
// bar; later tokens of that prompt are not compared (vLLM's model tests treat greedy divergence
// the same way: check_logprobs_close). The step logits are compared along upstream's tokens
// whatever the ids do. kNearTieGapNats: bars.h.

std::string IdsString(const torch::Tensor& ids) {
  const torch::Tensor c = ids.to(torch::kLong).cpu().contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  std::string s = "[";
  for (int64_t i = 0; i < c.numel(); ++i) s += (i ? ", " : "") + std::to_string(p[i]);
  return s + "]";
}

int64_t DistinctTokens(const torch::Tensor& ids) {
  return std::get<0>(at::_unique(ids.to(torch::kLong).cpu())).numel();
}

/// The bars as figures ("<prefix>bar_max_abs_diff", ...), and how many of `cmp`'s top-1 flips
/// they count as near-ties.
void BarFigures(GateOutcome& out, const std::string& prefix, const LogitBars& bars,
                const LogitComparison& cmp) {
  out.Count(prefix + "top1_near_tie_flips", cmp.near_tie_flips(NearTieGap(bars)));
  out.Real(prefix + "bar_max_abs_diff", bars.max_abs_diff, "logits");
  out.Real(prefix + "bar_kl_mean", bars.kl_mean, "nats");
  out.Real(prefix + "bar_top1_agreement", bars.top1_percent, "percent");
}

/// The envelope's figures the bars came from ("<prefix>envelope_max_abs_diff", ... and the
/// variation each came from).
void EnvelopeLogitFigures(GateOutcome& out, const std::string& prefix, const LogitEnvelope& e) {
  out.Real(prefix + "envelope_max_abs_diff", e.max_abs_diff, "logits");
  out.Real(prefix + "envelope_kl_mean", e.kl_mean, "nats");
  out.Real(prefix + "envelope_top1_agreement", e.top1_percent, "percent");
  out.Text(prefix + "envelope_widest", "max abs " + e.max_abs_diff_from + ", KL " +
                                           e.kl_mean_from + ", top-1 " + e.top1_percent_from);
}

/// The comparison's figures ("<prefix>kl_mean", ...).
void ComparisonFigures(GateOutcome& out, const std::string& prefix, const LogitComparison& cmp) {
  out.Real(prefix + "max_abs_diff", cmp.max_abs_diff(), "logits");
  out.Real(prefix + "kl_mean", cmp.kl_mean(), "nats");
  out.Real(prefix + "kl_max", cmp.kl_max(), "nats");
  out.Real(prefix + "top1_agreement", cmp.top1_agreement_percent(), "percent");
  out.Real(prefix + "mean_abs_diff", cmp.mean_abs_diff(), "logits");
}

/// What of `cmp` misses `bars`, each naming the figure, its value and the bar; empty when all
/// pass (NaN never passes).
std::vector<std::string> Misses(const LogitComparison& cmp, const LogitBars& bars,
                                const std::string& what) {
  std::vector<std::string> out;
  if (!(cmp.max_abs_diff() <= bars.max_abs_diff)) {
    out.push_back(what + "max_abs_diff " + Num(cmp.max_abs_diff()) + " logits exceeds the bar " +
                  Num(bars.max_abs_diff));
  }
  if (!(cmp.kl_mean() <= bars.kl_mean)) {
    out.push_back(what + "kl_mean " + Num(cmp.kl_mean()) + " nats exceeds the bar " +
                  Num(bars.kl_mean));
  }
  const double gap = NearTieGap(bars);
  if (!(cmp.top1_agreement_percent(gap) >= bars.top1_percent)) {
    out.push_back(what + "top1_agreement " + Num(cmp.top1_agreement_percent(gap)) +
                  "% apart from near-ties (" + std::to_string(cmp.near_tie_flips(gap)) +
                  " flip(s) within " + Num(gap) + " nats) is below the bar " +
                  Num(bars.top1_percent) + "%");
  }
  return out;
}

}  // namespace

namespace internal {

bool RequireReference(GateContext& ctx, GateOutcome& out) {
  if (ctx.reference) return true;
  const double read_start = NowMsSteady();
  Result<ReferenceBundle> ref = LoadReference(ctx.spec.reference.path);
  // Read (mapped, every tensor checked) by the first gate that needs it and again after a gate
  // released it: part of this gate's time.
  out.Real("reference_read_ms", NowMsSteady() - read_start, "ms");
  if (!ref.ok()) {
    // The bundle is an outside input: a missing or inconsistent one keeps the gate from
    // running (BLOCKED, naming the tensor or field), it says nothing about the adapter.
    out.Blocked("reference bundle " + ctx.spec.reference.path + ": " + ref.status().ToString());
    return false;
  }
  // A bundle made from another model (its reference.json "model_type", upstream's
  // config.model_type, differs from the checkpoint's) would make every numerical gate FAIL
  // and blame the adapter for a mismatched pair of inputs. The checkpoint's config.json is the
  // one load already read.
  auto made_from = ref->meta.find("model_type");
  if (ctx.checkpoint && made_from != ref->meta.end() && made_from->is_string()) {
    const nlohmann::json& config = ctx.checkpoint->config();
    auto own = config.find("model_type");
    if (own != config.end() && own->is_string() && *own != *made_from) {
      out.Blocked("reference bundle " + ctx.spec.reference.path + " was made from a " +
                  made_from->get<std::string>() + " checkpoint but checkpoint " +
                  ctx.spec.checkpoint.path + " is " + own->get<std::string>() +
                  " (config.json model_type): the cell pairs two models");
      return false;
    }
  }
  ctx.reference.emplace(std::move(ref).value());
  return true;
}

Result<Artifact> WriteJsonArtifact(const std::filesystem::path& attempt_dir, const std::string& rel,
                                   const std::string& name, const nlohmann::json& value) {
  namespace fs = std::filesystem;
  const fs::path file = attempt_dir / rel;
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  if (ec) return Status::Internal("cannot create " + file.parent_path().string() + ": " + ec.message());
  {
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    f << value.dump();
    if (!f.flush()) return Status::Internal("cannot write " + file.string());
  }
  return ArtifactOf(attempt_dir, rel, name);
}

Result<Artifact> ArtifactOf(const std::filesystem::path& attempt_dir, const std::string& rel,
                            const std::string& name) {
  const std::filesystem::path file = attempt_dir / rel;
  GH_ASSIGN_OR_RETURN(std::string digest, Sha256FileHex(file));
  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(file, ec);
  if (ec) return Status::Internal("cannot stat " + file.string() + ": " + ec.message());
  return Artifact{name, rel, bytes, digest};
}

}  // namespace internal

// --- inference -----------------------------------------------------------------------------

GateOutcome InferenceGate(GateContext& ctx) {
  GateOutcome out;
  if (!internal::RequireLoadedModel(ctx, out) || !internal::RequireReference(ctx, out)) return out;
  CausalLM& model = *ctx.model;
  const ReferenceBundle& ref = *ctx.reference;
  const internal::ReferenceThreads threads(ctx, ref);
  model.eval();
  torch::NoGradGuard no_grad;
  // The verdict compares like with like: a bf16 cell against upstream's own bf16 run (bf16
  // rounding alone moves a random model's top-1 on near-ties). The fp32 comparison of a bf16
  // cell is reported beside it.
  const bool bf16 = ctx.spec.precision == "bf16";
  LogitComparison cmp, vs_fp32;
  // Per prompt, KL along the position: a RoPE or sliding-window bug shows as a rise past a
  // position that the mean hides. Kept as an artifact for the dashboard's plot.
  nlohmann::json kl_by_position = nlohmann::json::array();
  double forward_ms = 0, comparison_ms = 0;  // the gate's two costs, timed apart
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    const ReferencePrompt& p = ref.prompts[i];
    const int64_t t = p.input_ids.size(0);
    const torch::Tensor tokens = p.input_ids.unsqueeze(0).to(ctx.device);
    SyncDevice(ctx.device);
    const double forward_start = NowMsSteady();
    const torch::Tensor logits = model.Forward(tokens, Positions(0, t, ctx.device), nullptr);
    SyncDevice(ctx.device);
    forward_ms += NowMsSteady() - forward_start;
    if (logits.dim() != 3 || logits.size(0) != 1 || logits.size(1) != t ||
        logits.size(2) != ref.vocab_size) {
      return out.Fail(FailureClass::kAdapterContract,
                      "prompt " + std::to_string(i) + ": Forward returned logits " +
                          ShapeString(logits.sizes()) + ", expected [1, " + std::to_string(t) +
                          ", " + std::to_string(ref.vocab_size) + "] (reference vocabulary)");
    }
    const double comparison_start = NowMsSteady();
    const torch::Tensor ours = logits[0].to(torch::kFloat);
    const torch::Tensor kl = cmp.Add(p.For(ctx.spec.precision).logits, ours);
    if (bf16) vs_fp32.Add(p.fp32.logits, ours);
    kl_by_position.push_back({{"prompt", i}, {"kl", internal::DoublesOf(kl)}});
    comparison_ms += NowMsSteady() - comparison_start;
  }
  out.Real("forward_ms", forward_ms, "ms");
  out.Real("comparison_ms", comparison_ms, "ms");
  const ComparisonSite site = SiteOf(ctx, ref);
  const Envelope* envelope = ref.envelope.For(ctx.spec.precision);
  const LogitBars bars = LogitBarsFor(site, LogitKind::kPrompt, /*same_reductions=*/true,
                                      envelope ? &envelope->prompt : nullptr);
  out.Text("reference", bf16 ? "transformers bf16 forward (same precision)"
                             : "transformers fp32 forward");
  out.Text("site", site.Describe());
  EnvelopeFigure(out, envelope);
  if (envelope) EnvelopeLogitFigures(out, "", envelope->prompt);
  ComparisonFigures(out, "", cmp);
  if (bf16) {
    out.Real("kl_mean_vs_fp32", vs_fp32.kl_mean(), "nats");
    out.Real("top1_agreement_vs_fp32", vs_fp32.top1_agreement_percent(), "percent");
    out.Real("max_abs_diff_vs_fp32", vs_fp32.max_abs_diff(), "logits");
  }
  out.Count("tokens_compared", cmp.tokens());
  out.Count("prompts", static_cast<int64_t>(ref.prompts.size()));
  if (!ctx.spec.attempt.dir.empty()) {
    // Plot data, not evidence the verdict rests on: a failed write is named, never a FAIL.
    Result<Artifact> a = internal::WriteJsonArtifact(
        ctx.spec.attempt.dir, std::string(kInferenceKlArtifact), "kl_by_position",
        {{"unit", "nats"}, {"reference", bf16 ? "bf16" : "fp32"}, {"prompts", kl_by_position}});
    if (a.ok()) out.artifacts.push_back(*a);
    else out.Text("kl_by_position", "not written: " + a.status().ToString());
  }
  BarFigures(out, "", bars, cmp);
  out.Text("bars", bars.basis);
  const std::vector<std::string> missed = Misses(cmp, bars, "");
  internal::PutClaim(out, missed.empty(), cmp.max_abs_diff() == 0);
  if (!missed.empty()) {
    return out.Fail(FailureClass::kAdapterContract,
                    JoinFew(missed) + " (" + site.Describe() + "; " + bars.basis + ")");
  }
  return out;
}

// --- decode --------------------------------------------------------------------------------

torch::Tensor GreedyDecode(CausalLM& model, const torch::Tensor& prompt, int64_t max_new_tokens,
                           torch::Device device, double* ms_per_token) {
  torch::NoGradGuard no_grad;
  model.eval();
  const int64_t t = prompt.size(0);
  std::unique_ptr<KVCache> cache = model.NewKVCache(1, t + max_new_tokens);
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(max_new_tokens));
  torch::Tensor logits =
      model.Forward(prompt.unsqueeze(0).to(device), Positions(0, t, device), cache.get());
  torch::Tensor next = logits.select(0, 0).select(0, -1).argmax();
  ids.push_back(next.item<int64_t>());
  SyncDevice(device);
  const double t0 = NowMsSteady();
  for (int64_t step = 1; step < max_new_tokens; ++step) {
    logits = model.Forward(next.view({1, 1}).to(device), Positions(t + step - 1, 1, device),
                           cache.get());
    next = logits.select(0, 0).select(0, -1).argmax();
    ids.push_back(next.item<int64_t>());
  }
  SyncDevice(device);
  if (ms_per_token != nullptr) {
    *ms_per_token = max_new_tokens > 1 ? (NowMsSteady() - t0) / double(max_new_tokens - 1) : 0.0;
  }
  return torch::tensor(ids, torch::kLong);
}

torch::Tensor ForcedDecodeLogits(CausalLM& model, const torch::Tensor& prompt,
                                 const torch::Tensor& forced, torch::Device device) {
  torch::NoGradGuard no_grad;
  model.eval();
  const int64_t t = prompt.size(0), n = forced.size(0);
  std::unique_ptr<KVCache> cache = model.NewKVCache(1, t + n);
  const torch::Tensor tokens = forced.to(torch::kLong).to(device);
  std::vector<torch::Tensor> rows;
  rows.reserve(static_cast<size_t>(n));
  torch::Tensor logits =
      model.Forward(prompt.unsqueeze(0).to(device), Positions(0, t, device), cache.get());
  rows.push_back(logits.select(0, 0).select(0, -1).to(torch::kFloat).cpu());
  for (int64_t step = 1; step < n; ++step) {
    logits = model.Forward(tokens.slice(0, step - 1, step).view({1, 1}),
                           Positions(t + step - 1, 1, device), cache.get());
    rows.push_back(logits.select(0, 0).select(0, -1).to(torch::kFloat).cpu());
  }
  return torch::stack(rows);
}

namespace {

/// True when config.json asks for dynamic NTK RoPE (rope_parameters or the older
/// rope_scaling, key rope_type or type), whose scaling depends on the sequence's length.
bool RopeIsDynamic(const nlohmann::json& config) {
  for (const char* field : {"rope_parameters", "rope_scaling"}) {
    auto it = config.find(field);
    if (it == config.end() || !it->is_object()) continue;
    for (const char* key : {"rope_type", "type"}) {
      auto t = it->find(key);
      if (t != it->end() && t->is_string() && t->get<std::string>() == "dynamic") return true;
    }
  }
  return false;
}

}  // namespace

GateOutcome DecodeGate(GateContext& ctx) {
  GateOutcome out;
  if (!internal::RequireLoadedModel(ctx, out) || !internal::RequireReference(ctx, out)) return out;
  const ReferenceBundle& ref = *ctx.reference;
  const internal::ReferenceThreads threads(ctx, ref);
  const int64_t n = ctx.spec.decode.max_new_tokens;
  const std::string& precision = ctx.spec.precision;
  // Like with like, as the inference gate: a bf16 cell decodes against upstream's bf16 run.
  out.Text("reference", precision == "bf16" ? "transformers bf16 decode (same precision)"
                                            : "transformers fp32 decode");
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    const int64_t have = ref.prompts[i].For(precision).greedy_ids.size(0);
    if (have < n) {
      // The bundle and the cell's decode length are both outside inputs that do not fit: the
      // gate cannot run, and it says nothing about the adapter.
      return out.Blocked("reference bundle " + ctx.spec.reference.path + ": prompt " +
                         std::to_string(i) + " has " + std::to_string(have) +
                         " greedy ids; the cell decodes " + std::to_string(n) +
                         " (decode.max_new_tokens): submit with at most " +
                         std::to_string(have) + " or make a bundle that decodes " +
                         std::to_string(n));
    }
  }
  const ComparisonSite site = SiteOf(ctx, ref);
  const DecodeFloor& floor = ref.DecodeFloorFor(precision);
  // Past a sliding window upstream's cache holds only the window's keys: its decode sums run
  // over other lengths than ours, so bit-exactness is not expected there (bars.h).
  const int64_t window = ctx.args ? ctx.args->min_sliding_window() : 0;
  bool past_window = false;
  for (const ReferencePrompt& p : ref.prompts) {
    past_window |= window > 0 && p.input_ids.size(0) + n - 1 > window;
  }
  if (past_window) out.Count("sliding_window_min", window);
  out.Text("site", site.Describe());
  out.Real("upstream_cache_floor_max_abs_diff", floor.max_abs_diff, "logits");
  // Text: ours through the checkpoint's tokenizer.json when there is one we can read, and the
  // prompt and upstream continuation when refgen stored them (reference.json "prompts"[i]).
  Result<Detokenizer> detok =
      Detokenizer::Open(std::filesystem::path(ctx.spec.checkpoint.path) / "tokenizer.json");
  out.Text("detokenizer", detok.ok() ? "tokenizer.json (ByteLevel, " +
                                           std::to_string(detok->size()) + " tokens)"
                                     : "no text shown: " + detok.status().message());
  auto prompt_meta = [&ref](size_t i, const char* key) -> std::optional<std::string> {
    auto prompts = ref.meta.find("prompts");
    if (prompts == ref.meta.end() || !prompts->is_array() || i >= prompts->size() ||
        !(*prompts)[i].is_object()) {
      return std::nullopt;
    }
    auto it = (*prompts)[i].find(key);
    if (it == (*prompts)[i].end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };

  // 1. Step logits along upstream's tokens (a decode-path bug shows here even when the argmax
  //    holds, e.g. on a continuation that repeats a token).
  // upstream_self: KL(continuation || decode); upstream_self_reverse: KL(decode || continuation),
  // the direction of a comparison against upstream's decode.
  LogitComparison vs_decode, vs_continuation, upstream_self, upstream_self_reverse;
  int64_t distinct_min = std::numeric_limits<int64_t>::max();
  // The gate's costs, timed apart (tools/bench/real_size.py sets them beside transformers' same
  // work): the forced decodes, their comparisons, the free greedy decodes.
  double forced_ms = 0, comparison_ms = 0;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    const ReferencePrompt& p = ref.prompts[i];
    const ReferenceRun& run = p.For(precision);
    const torch::Tensor forced = run.greedy_ids.slice(0, 0, n);
    const double forced_start = NowMsSteady();
    const torch::Tensor steps = ForcedDecodeLogits(*ctx.model, p.input_ids, forced, ctx.device);
    forced_ms += NowMsSteady() - forced_start;
    if (steps.dim() != 2 || steps.size(1) != ref.vocab_size) {
      return out.Fail(FailureClass::kAdapterContract,
                      "prompt " + std::to_string(i) + ": decode steps returned logits " +
                          ShapeString(steps.sizes()) + ", expected [" + std::to_string(n) + ", " +
                          std::to_string(ref.vocab_size) + "]");
    }
    const double comparison_start = NowMsSteady();
    vs_decode.Add(run.decode_logits.slice(0, 0, n), steps);
    vs_continuation.Add(run.continuation_logits.slice(0, 0, n), steps);
    upstream_self.Add(run.continuation_logits.slice(0, 0, n), run.decode_logits.slice(0, 0, n));
    upstream_self_reverse.Add(run.decode_logits.slice(0, 0, n),
                              run.continuation_logits.slice(0, 0, n));
    comparison_ms += NowMsSteady() - comparison_start;
    const int64_t distinct = DistinctTokens(forced);
    distinct_min = std::min(distinct_min, distinct);
    out.Count("reference_distinct_tokens_prompt_" + std::to_string(i), distinct);
  }
  // Upstream's own cached decode differs from its teacher-forced forward (other matmul shapes):
  // ours is held to the site's bars against the path it computes the same way, and to those
  // bars plus that spread against the other. A KV-cached decode's like is upstream's decode; a
  // model that recomputes the sequence at every step (CachesKeysAndValues false: the Python
  // lane) computes a teacher-forced forward, whose like is upstream's continuation.
  const bool cached = ctx.model->CachesKeysAndValues();
  // With the bundle's envelope: margins over its decode steps, upstream's own KV-cache spread
  // and, for a KV-cached decode past a sliding window, upstream's own cached-vs-forced spread
  // (upstream's decode slides its cache, its teacher-forced continuation masks as ours does).
  // Without one: the site's bars, past the window those of another CPU kernel family.
  const Envelope* envelope = ref.envelope.For(precision);
  LogitSpread past_window_spread;
  if (past_window && cached) {
    past_window_spread = LogitSpread{upstream_self_reverse.max_abs_diff(),
                                     upstream_self_reverse.kl_mean(),
                                     upstream_self_reverse.top1_agreement_percent()};
  }
  const LogitBars bars =
      envelope ? EnvelopeDecodeStepBars(site, envelope->decode_steps, floor.max_abs_diff,
                                        floor.kl_mean, past_window_spread)
               : DecodeStepBars(LogitBarsFor(site, LogitKind::kDecodeSteps,
                                             /*same_reductions=*/!past_window),
                                floor.max_abs_diff, floor.kl_mean);
  EnvelopeFigure(out, envelope);
  if (envelope) EnvelopeLogitFigures(out, "steps_", envelope->decode_steps);
  out.Text("decode_path", cached ? "KV cache"
                                 : "whole sequence recomputed at each step (no KV cache): held "
                                   "to upstream's teacher-forced continuation");
  auto widen = [&bars](const LogitComparison& spread) {
    LogitBars w = bars;
    w.max_abs_diff += spread.max_abs_diff();
    w.kl_mean += spread.kl_mean();
    w.top1_percent = std::min(bars.top1_percent, spread.top1_agreement_percent());
    return w;
  };
  // Dynamic NTK RoPE rescales by the sequence's current length: a model that recomputes the
  // sequence at each step uses the step's length, upstream's one-pass continuation the final
  // one, and the bundle holds no no-cache decode of upstream's. Its decode steps are then held
  // to upstream's continuation with upstream's own cached-vs-forced spread added too.
  const bool length_dependent_rope = !cached && ctx.checkpoint && RopeIsDynamic(ctx.checkpoint->config());
  if (length_dependent_rope) {
    out.Text("length_dependent_rope", "dynamic NTK: each recomputed step rescales RoPE by its "
                                      "own length; continuation bars widened by upstream's spread");
  }
  const LogitBars steps_bars = cached ? bars : widen(upstream_self_reverse);
  const LogitBars continuation_bars =
      cached || length_dependent_rope ? widen(upstream_self) : bars;
  ComparisonFigures(out, "steps_", vs_decode);
  BarFigures(out, "steps_", steps_bars, vs_decode);
  ComparisonFigures(out, "continuation_", vs_continuation);
  BarFigures(out, "continuation_", continuation_bars, vs_continuation);
  out.Real("upstream_cached_vs_forced_max_abs_diff", upstream_self.max_abs_diff(), "logits");
  out.Count("steps_compared", vs_decode.tokens());
  out.Count("reference_distinct_tokens_min", distinct_min);
  out.Text("bars", bars.basis);

  // 2. Free greedy decode: ids and text.
  const double tie_gap = NearTieGap(steps_bars);
  int64_t matched = 0, total = 0, texts_compared = 0, texts_equal = 0, tie_divergences = 0;
  double ms_sum = 0, greedy_ms = 0;
  std::string first_mismatch;
  std::vector<std::string> ties;
  bool mismatch_counts = false;  // a mismatch that is not an accepted near-tie divergence
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    const ReferencePrompt& p = ref.prompts[i];
    double ms = 0;
    const double greedy_start = NowMsSteady();
    const torch::Tensor ours = GreedyDecode(*ctx.model, p.input_ids, n, ctx.device, &ms);
    greedy_ms += NowMsSteady() - greedy_start;
    ms_sum += ms;
    const torch::Tensor want = p.For(precision).greedy_ids.slice(0, 0, n);
    const torch::Tensor eq = ours == want;
    matched += eq.sum().item<int64_t>();
    total += n;
    if (!eq.all().item<bool>()) {
      const int64_t j = (~eq).nonzero()[0][0].item<int64_t>();
      const std::string where = "prompt " + std::to_string(i) + " position " + std::to_string(j) +
                                ": ours " + std::to_string(ours[j].item<int64_t>()) + " vs ref " +
                                std::to_string(want[j].item<int64_t>());
      bool tie = false;
      if (tie_gap > 0) {
        // Our log-probabilities at the diverging step, the prompt and our tokens before it fed
        // whole (no cache).
        torch::NoGradGuard no_grad;
        const torch::Tensor seq = torch::cat({p.input_ids.to(torch::kLong).cpu(), ours.slice(0, 0, j)});
        const torch::Tensor logits = ctx.model->Forward(seq.unsqueeze(0).to(ctx.device),
                                                        Positions(0, seq.size(0), ctx.device), nullptr);
        const torch::Tensor logp = torch::log_softmax(logits[0][-1].to(torch::kDouble), -1).cpu();
        const double gap = std::abs(logp[ours[j].item<int64_t>()].item<double>() -
                                    logp[want[j].item<int64_t>()].item<double>());
        tie = gap <= tie_gap;
        ties.push_back(where + ", log-prob gap " + Num(gap) + " nats" +
                       (tie ? " (near-tie)" : " (not a near-tie)"));
        tie_divergences += tie;
      }
      if (!tie) mismatch_counts = true;
      if (first_mismatch.empty()) first_mismatch = where;
    }
    const std::string suffix = "_prompt_" + std::to_string(i);
    if (i == 0) {
      out.Text("generated_ids" + suffix, IdsString(ours));
      out.Text("reference_ids" + suffix, IdsString(want));
    }
    if (auto text = prompt_meta(i, "text")) out.Text("input_text" + suffix, *text);
    // greedy_text is the fp32 continuation's text.
    const auto ref_text = precision == "bf16" ? std::nullopt : prompt_meta(i, "greedy_text");
    if (ref_text) out.Text("reference_text" + suffix, *ref_text);
    if (detok.ok()) {
      const torch::Tensor c = ours.contiguous();
      const std::string text =
          detok->Decode(std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + n));
      out.Text("generated_text" + suffix, text);
      if (ref_text && n == p.fp32.greedy_ids.size(0)) {
        ++texts_compared;
        texts_equal += text == *ref_text;
      }
    }
  }
  if (texts_compared > 0) {
    // Equal ids with different text would be a detokenizer defect, not the adapter's.
    out.Text("text_vs_reference", std::to_string(texts_equal) + "/" +
                                      std::to_string(texts_compared) + " continuations equal");
  }
  out.Count("tokens_matched", matched);
  out.Count("tokens_total", total);
  out.Text("first_mismatch", first_mismatch.empty() ? "none" : first_mismatch);
  out.Real("ms_per_token", ms_sum / static_cast<double>(ref.prompts.size()), "ms");
  out.Real("forced_decode_ms", forced_ms, "ms");
  out.Real("comparison_ms", comparison_ms, "ms");
  out.Real("greedy_decode_ms", greedy_ms, "ms");
  if (tie_gap > 0) {
    out.Real("near_tie_gap_bar", tie_gap, "nats");
    out.Count("near_tie_divergences", tie_divergences);
    out.Text("divergences", ties.empty() ? "none" : JoinFew(ties));
  }

  std::vector<std::string> failed;
  if (matched != total && mismatch_counts) {
    failed.push_back("greedy decode matched " + std::to_string(matched) + "/" +
                     std::to_string(total) + " reference tokens; first mismatch at " +
                     first_mismatch + (ties.empty() ? "" : "; divergences: " + JoinFew(ties)));
  }
  for (auto& m : Misses(vs_decode, steps_bars, "decode-step logits vs upstream's decode: ")) {
    failed.push_back(std::move(m));
  }
  for (auto& m : Misses(vs_continuation, continuation_bars,
                        "decode-step logits vs upstream's teacher-forced continuation: ")) {
    failed.push_back(std::move(m));
  }
  const LogitComparison& like = cached ? vs_decode : vs_continuation;
  internal::PutClaim(out, failed.empty(), like.max_abs_diff() == 0 && matched == total);
  if (!failed.empty()) {
    return out.Fail(FailureClass::kAdapterContract,
                    JoinFew(failed) + " (" + site.Describe() + "; " + bars.basis + ")");
  }
  return out;
}

}  // namespace gatehouse::worker
