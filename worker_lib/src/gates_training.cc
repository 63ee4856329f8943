// The training gate: forward and backward on the probe prompts, upstream's AdamW op for op,
// losses, the trainable set, step-1 gradient norms and sums per checkpoint key, and the weights
// that must change, against upstream's trace in the bundle (docs/architecture.md "Phases,
// statuses and blame"; bars: bars.h, docs/bars.md).
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "gatehouse/worker/adamw.h"
#include "gatehouse/worker/bars.h"
#include "gatehouse/worker/gates.h"
#include "figure_pair.h"
#include "gates_internal.h"

namespace gatehouse::worker {

using internal::EnvelopeFigure;
using internal::JoinFew;
using internal::Num;
using internal::NumVs;
using internal::NowMsSteady;
using internal::Positions;
using internal::SiteOf;
using internal::SyncDevice;

// --- training ------------------------------------------------------------------------------

namespace {

/// |ours - upstream| / |upstream| (absolute difference when upstream is 0).
double RelDiff(double ours, double upstream) {
  const double d = std::abs(ours - upstream);
  return upstream != 0 ? d / std::abs(upstream) : d;
}

/// The texts of `items` ordered by their figure, largest first (ties keep their order), joined
/// as JoinFew does: the worst offender leads a FAIL reason whatever its key's name.
std::string WorstFirst(std::vector<std::pair<double, std::string>> items) {
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> texts;
  for (auto& [figure, text] : items) texts.push_back(std::move(text));
  return JoinFew(texts, 6);
}

/// A cheap fingerprint of a tensor's values (sum and sum of squares in float64, and the
/// element at the middle): equal before and after the steps means the parameter did not change.
std::array<double, 3> Fingerprint(const torch::Tensor& t) {
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = t.detach().reshape({-1});
  const internal::Float64Stats s = internal::StatsOf(flat);
  return {s.sum, s.sum_sq,
          flat.numel() ? flat[flat.numel() / 2].to(torch::kDouble).item<double>() : 0.0};
}

}  // namespace

GateOutcome TrainingGate(GateContext& ctx) {
  GateOutcome out;
  if (!internal::RequireLoadedModel(ctx, out) || !internal::RequireReference(ctx, out)) return out;
  const bool by_code = ctx.family->MapsWeightsByCode();
  if (!ctx.adapter && !by_code) return out.Unknown("no state-dict adapter from phase load");
  std::vector<torch::Tensor> usable;  // int64 [T] ids of the prompts with 2 or more tokens
  for (const auto& p : ctx.reference->prompts) {
    if (p.input_ids.size(0) >= 2) usable.push_back(p.input_ids);
  }
  if (usable.empty()) return out.Unknown("no reference prompt has 2 or more tokens to train on");
  const internal::ReferenceThreads threads(ctx, *ctx.reference);
  const TrainingReference reference = ctx.reference->training;  // a copy: the bundle goes next
  const TrainingTrace& trace = reference.For(ctx.spec.precision);
  const ComparisonSite site = SiteOf(ctx, *ctx.reference);
  const Envelopes envelopes = ctx.reference->envelope;  // a copy too
  const Envelope* envelope = envelopes.For(ctx.spec.precision);
  // This gate needs the ids and the trace only. The bundle's logits (prompts x vocabulary
  // floats per precision: 0.65 GB at Qwen2.5-0.5B's 151936 words) go before the gradients and
  // the optimizer's state are made; a later gate that needs them reads the bundle again
  // (RequireReference). docs/gate-facts.md "Loading at real sizes".
  ctx.reference.reset();
  double floor_loss_rel = 0;
  for (double l : trace.floor_loss_rel) floor_loss_rel = std::max(floor_loss_rel, l);
  const TrainingBars bars =
      envelope ? TrainingBarsFor(site, trace.floor_grad_norm_rel, floor_loss_rel,
                                 envelope->training, ctx.spec.training.steps)
               : TrainingBarsFor(site, trace.floor_grad_norm_rel, floor_loss_rel);
  out.Real("upstream_floor_grad_norm_rel", trace.floor_grad_norm_rel, "ratio");
  out.Real("upstream_floor_loss_rel", floor_loss_rel, "ratio");
  out.Text("site", site.Describe());
  EnvelopeFigure(out, envelope);
  if (envelope) {
    const TrainingEnvelope& e = envelope->training;
    out.Real("envelope_grad_norm_rel", e.grad_norm_rel, "ratio");
    out.Real("envelope_grad_sum_rel", e.grad_sum_rel, "ratio");
    out.Real("envelope_loss_rel", e.LossRelThrough(ctx.spec.training.steps), "ratio");
    out.Text("envelope_widest", "gradient norms " + e.grad_norm_rel_from + ", sums " +
                                    e.grad_sum_rel_from);
  }
  out.Text("bars", bars.basis);
  bool equal = true;  // every compared figure equal to upstream's: the bit-exact claim
  out.Text("reference_optimizer", reference.optimizer);

  CausalLM& model = *ctx.model;
  torch::manual_seed(static_cast<uint64_t>(ctx.spec.training.seed));
  const std::vector<ParamGroup> groups = UniqueParameters(model);
  // The trainable set by checkpoint key, through the adapter's inverse mapping (the names
  // upstream's trace uses).
  const HfTensors hf = internal::HfNamesOf(ctx, groups);
  if (!hf.ok()) {
    return out.Fail(FailureClass::kAdapterContract, "parameters without a checkpoint key: " + hf.Problems());
  }
  std::unordered_map<std::string, size_t> group_of;
  for (size_t i = 0; i < groups.size(); ++i) {
    for (const auto& n : groups[i].names) group_of.emplace(n, i);
  }
  // HF key -> (group, slice along dim 0 or -1).
  std::map<std::string, std::pair<size_t, int64_t>> key_slot;
  for (const auto& [key, internal_name] : hf.hf_to_internal) {
    const auto bracket = internal_name.find('[');
    const std::string param = internal_name.substr(0, bracket);
    const int64_t slice =
        bracket == std::string::npos ? -1 : std::stoll(internal_name.substr(bracket + 1));
    key_slot.emplace(key, std::pair{group_of.at(param), slice});
  }
  std::set<std::string> ours_trainable;
  for (const auto& [key, slot] : key_slot) {
    if (groups[slot.first].tensor.requires_grad()) ours_trainable.insert(key);
  }
  const std::set<std::string> upstream_trainable(trace.trainable.begin(), trace.trainable.end());
  std::vector<std::string> set_problems;
  for (const auto& key : upstream_trainable) {
    if (ours_trainable.count(key)) continue;
    set_problems.push_back(key + (key_slot.count(key) ? " (frozen by the adapter)"
                                                      : " (no parameter of the adapter)"));
  }
  for (const auto& key : ours_trainable) {
    if (!upstream_trainable.count(key)) set_problems.push_back(key + " (upstream does not train it)");
  }
  out.Count("trainable_keys", static_cast<int64_t>(ours_trainable.size()));
  out.Count("upstream_trainable_keys", static_cast<int64_t>(upstream_trainable.size()));
  if (!set_problems.empty()) {
    return out.Fail(FailureClass::kAdapterContract,
                    std::to_string(set_problems.size()) +
                        " parameter(s) differ from the set upstream trains: " +
                        JoinFew(set_problems, 10));
  }

  std::vector<const ParamGroup*> trainable;
  std::vector<torch::Tensor> params;
  for (const auto& g : groups) {
    if (!g.tensor.requires_grad()) continue;
    trainable.push_back(&g);
    params.push_back(g.tensor);
  }
  // Per checkpoint key, its weight (or that weight's gradient): a slice of its parameter
  // through the name table, or what the family's ToHf makes of the parameter when it maps
  // weights by code (a Python-lane adapter may fuse, e.g. gate and up projections in one w13).
  auto tensors_by_key = [&](bool grads) {
    std::map<std::string, torch::Tensor> by_key;
    if (!by_code) {
      for (const auto& [key, slot] : key_slot) {
        const torch::Tensor t = grads ? groups[slot.first].tensor.grad() : groups[slot.first].tensor;
        if (t.defined()) by_key.emplace(key, slot.second >= 0 ? t.select(0, slot.second) : t);
      }
      return by_key;
    }
    for (const auto& g : groups) {
      const torch::Tensor t = grads ? g.tensor.grad() : g.tensor;
      if (!t.defined()) continue;
      Result<NamedTensors> named = ctx.family->ToHf(*ctx.args, {{g.names[0], t.detach()}});
      if (!named.ok()) continue;  // HfNamesOf above failed the gate on it already
      for (auto& [key, v] : *named) by_key.emplace(key, v);
    }
    return by_key;
  };
  // A parameter that load adopted from the checkpoint's mapping is still the file's pages, and
  // the first step writes every trainable one: one sequential copy into private memory now
  // costs less than a copy-on-write fault per page then (10 us a page where measured:
  // docs/gate-facts.md "Loading at real sizes"), and the file's pages leave the resident set.
  if (ctx.load_report) {
    torch::NoGradGuard no_grad;
    const double copy_start = NowMsSteady();
    int64_t copied = 0;
    for (const std::string& key : ctx.load_report->adopted_keys) {
      auto it = key_slot.find(key);
      if (it == key_slot.end() || it->second.second >= 0) continue;
      const torch::Tensor& param = groups[it->second.first].tensor;
      if (!param.requires_grad()) continue;
      param.set_data(param.clone());
      copied += static_cast<int64_t>(param.nbytes());
      if (ctx.checkpoint) ctx.checkpoint->Release(key);
    }
    out.Bytes("adopted_bytes_copied", copied);
    out.Real("adopted_copy_ms", NowMsSteady() - copy_start, "ms");
  }
  internal::ReturnFreedMemory();  // the bundle's logits, mostly tensors below glibc's threshold
  const double fingerprint_start = NowMsSteady();
  std::map<std::string, std::array<double, 3>> before;
  for (const auto& [key, t] : tensors_by_key(false)) before[key] = Fingerprint(t);
  double fingerprint_ms = NowMsSteady() - fingerprint_start;  // with the one after the steps
  out.Count("trainable_tensors", static_cast<int64_t>(trainable.size()));
  if (trainable.empty()) return out.Fail(FailureClass::kAdapterContract, "no trainable parameter");
  // Upstream's AdamW, op for op (adamw.h): the trace's later losses depend on its rounding.
  UpstreamAdamW::Options adamw;
  adamw.lr = ctx.spec.training.lr;
  UpstreamAdamW optimizer(params, adamw);
  model.train();
  // On every way out: eval mode again, and the gradients freed (the optimizer's state goes with
  // it), so the phases after this one hold the model's bytes only.
  struct EvalOnExit {
    CausalLM& m;
    UpstreamAdamW& optimizer;
    ~EvalOnExit() {
      m.eval();
      optimizer.ZeroGrad();
    }
  } eval_on_exit{model, optimizer};

  const bool same_lr = ctx.spec.training.lr == reference.lr;
  std::vector<std::string> failed;
  double step_ms_sum = 0;
  for (int64_t step = 1; step <= ctx.spec.training.steps; ++step) {
    const torch::Tensor& prompt_ids = usable[static_cast<size_t>(step - 1) % usable.size()];
    const int64_t t = prompt_ids.size(0);
    const torch::Tensor ids = prompt_ids.to(ctx.device);
    const torch::Tensor inputs = ids.slice(0, 0, t - 1).unsqueeze(0);  // [1, T-1]
    const torch::Tensor labels = ids.slice(0, 1, t);                    // [T-1]
    SyncDevice(ctx.device);
    const double t0 = NowMsSteady();
    optimizer.ZeroGrad();
    const torch::Tensor logits =
        model.Forward(inputs, Positions(0, t - 1, ctx.device), nullptr).to(torch::kFloat);
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), labels);
    loss.backward();
    SyncDevice(ctx.device);
    // Each step's parts, timed apart (tools/bench/real_size.py sets them beside transformers'
    // steps): forward and backward, the gradient checks (every gradient's float64 statistics,
    // at step 1 each checkpoint key's float64 norm and sum against upstream's), the optimizer.
    const double checks_start = NowMsSteady();

    const std::string k = std::to_string(step);
    out.Real("step_" + k + "_forward_backward_ms", checks_start - t0, "ms");
    const double loss_value = loss.item<double>();
    out.Real("loss_step_" + k, loss_value, "nats");
    std::vector<std::string> bad;
    double norm_sq = 0;
    {
      torch::NoGradGuard no_grad;
      for (const ParamGroup* g : trainable) {
        const torch::Tensor grad = g->tensor.grad();
        if (!grad.defined()) {
          bad.push_back(g->names[0] + " (no gradient)");
          continue;
        }
        const internal::Float64Stats gs = internal::StatsOf(grad);
        if (!gs.finite) {
          bad.push_back(g->names[0] + " (non-finite gradient)");
        } else if (!gs.any_nonzero) {
          bad.push_back(g->names[0] + " (all-zero gradient)");
        }
        norm_sq += gs.sum_sq;
      }
    }
    out.Real("grad_norm_step_" + k, std::sqrt(norm_sq), "l2_norm");
    if (!std::isfinite(loss_value)) {
      return out.Fail(FailureClass::kAdapterContract,
                      "step " + k + ": loss is " + Num(loss_value));
    }
    if (!bad.empty()) {
      return out.Fail(FailureClass::kAdapterContract,
                      "step " + k + ": " + std::to_string(bad.size()) + " of " +
                          std::to_string(trainable.size()) +
                          " trainable parameters lack a finite nonzero gradient: " +
                          JoinFew(bad, 10));
    }
    // Against upstream: the loss of step 1 always (a forward); later steps when the trace holds
    // them and the cell's lr is the trace's (they depend on the optimizer's updates).
    if (step <= reference.steps && (step == 1 || same_lr)) {
      const double want = trace.losses[static_cast<size_t>(step - 1)];
      const double rel = RelDiff(loss_value, want);
      const double bar = step == 1 ? bars.first_loss_rel : bars.loss_rel;
      out.Real("upstream_loss_step_" + k, want, "nats");
      out.Real("loss_rel_diff_step_" + k, rel, "ratio");
      equal &= rel == 0;
      if (!(rel <= bar)) {
        failed.push_back("step " + k + " loss " + NumVs(loss_value, want, " vs upstream ") +
                         " (relative difference " + Num(rel) + " > bar " + Num(bar) + ")");
      }
    }
    if (step == 1) {
      // Per checkpoint key: the L2 norm of its gradient, and the sum of its elements (the sign
      // of a gradient is invisible to its norm), against upstream's. The sum's bar is the
      // norm's, scaled by the largest the sum can be: sqrt(numel) x the norm.
      torch::NoGradGuard no_grad;
      double worst = 0, worst_sum = 0;
      std::string worst_key;
      // Keys past the bar with their relative difference, listed worst first.
      std::vector<std::pair<double, std::string>> off, off_sum;
      for (const auto& [key, grad] : tensors_by_key(true)) {
        auto want = trace.grad_norms.find(key);
        if (want == trace.grad_norms.end()) continue;  // not trainable: the set check says so
        // Upstream's own ops on the whole float64 tensor (t.to(float64).norm() and .sum()):
        // the bar is 0 on the same CPU kernels, and a sum taken slice by slice rounds
        // differently. At step 1 no optimizer state exists yet, so this one float64 copy of a
        // key's gradient is not the gate's peak.
        const torch::Tensor g = grad.to(torch::kDouble);
        const double norm = g.norm().item<double>();
        const double rel = RelDiff(norm, want->second);
        if (rel > worst || worst_key.empty()) {
          worst = rel;
          worst_key = key;
        }
        if (!(rel <= bars.grad_norm_rel)) {
          off.emplace_back(rel, key + " " + NumVs(norm, want->second) + " (relative " + Num(rel) + ")");
        }
        auto want_sum = trace.grad_sums.find(key);
        if (want_sum == trace.grad_sums.end()) continue;
        const double sum = g.sum().item<double>();
        const double scale = std::sqrt(static_cast<double>(g.numel())) * want->second;
        const double sum_rel = scale > 0 ? std::abs(sum - want_sum->second) / scale
                                         : std::abs(sum - want_sum->second);
        worst_sum = std::max(worst_sum, sum_rel);
        if (!(sum_rel <= bars.grad_norm_rel)) {
          off_sum.emplace_back(sum_rel, key + " " + NumVs(sum, want_sum->second) + " (" +
                                            Num(sum_rel) + " of sqrt(numel) x norm)");
        }
      }
      equal &= worst == 0 && worst_sum == 0;
      out.Real("grad_norm_max_rel_diff", worst, "ratio");
      out.Text("grad_norm_worst_key", worst_key);
      out.Real("grad_sum_max_rel_diff", worst_sum, "ratio");
      out.Real("bar_grad_norm_rel", bars.grad_norm_rel, "ratio");
      // The counts are taken before WorstFirst consumes the lists.
      if (const size_t n = off.size(); n > 0) {
        failed.push_back(std::to_string(n) +
                         " step-1 gradient norm(s) differ from upstream's beyond the relative bar " +
                         Num(bars.grad_norm_rel) + ", worst first: " + WorstFirst(std::move(off)));
      }
      if (const size_t n = off_sum.size(); n > 0) {
        failed.push_back(std::to_string(n) +
                         " step-1 gradient sum(s) differ from upstream's beyond the bar " +
                         Num(bars.grad_norm_rel) + " x sqrt(numel) x norm, worst first: " +
                         WorstFirst(std::move(off_sum)));
      }
    }
    const double optimizer_start = NowMsSteady();
    out.Real("step_" + k + "_checks_ms", optimizer_start - checks_start, "ms");
    optimizer.Step();
    SyncDevice(ctx.device);
    out.Real("step_" + k + "_optimizer_ms", NowMsSteady() - optimizer_start, "ms");
    // The step's temporaries (step 1's float64 norms, the adopted parameters' file copies)
    // leave holes in malloc's heap that the next step's gradients do not fill: returned, the
    // cell's peak is 0.2 GB lower at Qwen2.5-0.5B (docs/real-size.md).
    internal::ReturnFreedMemory();
    SyncDevice(ctx.device);
    step_ms_sum += NowMsSteady() - t0;
  }
  out.Real("bar_loss_rel", bars.loss_rel, "ratio");
  out.Real("bar_first_loss_rel", bars.first_loss_rel, "ratio");
  if (!same_lr) {
    out.Text("losses_compared", "step 1 only: the cell's lr " + Num(ctx.spec.training.lr) +
                                    " is not the trace's " + Num(reference.lr));
  } else if (ctx.spec.training.steps > reference.steps) {
    out.Text("losses_compared", "steps 1.." + std::to_string(reference.steps) +
                                    ": upstream's trace holds no more");
  }
  // Every weight upstream's steps changed by this step count must have changed here too (in
  // bf16 an update below half an ulp rounds away, upstream's too: those are not required).
  std::vector<std::string> unchanged;
  int64_t required = 0;
  const double fingerprint_after_start = NowMsSteady();
  const std::map<std::string, torch::Tensor> after = tensors_by_key(false);
  for (const auto& [key, slot] : key_slot) {
    auto first = trace.first_changed_step.find(key);
    if (first == trace.first_changed_step.end() || first->second < 1 ||
        first->second > ctx.spec.training.steps) {
      continue;
    }
    ++required;
    auto now = after.find(key);
    if (now == after.end() || Fingerprint(now->second) == before[key]) unchanged.push_back(key);
  }
  fingerprint_ms += NowMsSteady() - fingerprint_after_start;
  out.Real("fingerprint_ms", fingerprint_ms, "ms");
  out.Count("weights_required_to_change", required);
  out.Count("weights_unchanged", static_cast<int64_t>(unchanged.size()));
  if (!unchanged.empty()) {
    failed.push_back(std::to_string(unchanged.size()) +
                     " weight(s) upstream's steps changed are unchanged after ours: " +
                     JoinFew(unchanged, 10));
  }
  out.Real("step_ms", step_ms_sum / static_cast<double>(ctx.spec.training.steps), "ms");
  internal::PutClaim(out, failed.empty(), equal && failed.empty());
  if (!failed.empty()) {
    return out.Fail(FailureClass::kAdapterContract,
                    JoinFew(failed) + " (" + site.Describe() + "; " + bars.basis + ")");
  }
  return out;
}

}  // namespace gatehouse::worker
