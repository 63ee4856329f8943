// The packing gate: the probe prompts packed into one row (cu_seqlens, positions restarting at
// each sequence, as RL and SFT trainers pack them) against the same model's forward of each
// prompt alone, and the packed training step's loss and gradients against the unpacked
// batch's. docs/gate-facts.md "Packed batches".
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "gatehouse/worker/bars.h"
#include "gatehouse/worker/gates.h"
#include "gates_internal.h"

namespace gatehouse::worker {

using internal::JoinFew;
using internal::NowMsSteady;
using internal::Pack;
using internal::Packed;
using internal::Num;
using internal::Positions;
using internal::ShapeString;

namespace {

void ZeroGradients(const std::vector<torch::Tensor>& params) {
  for (const torch::Tensor& p : params) {
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  }
}

}  // namespace

GateOutcome PackingGate(GateContext& ctx) {
  GateOutcome out;
  if (!internal::RequireLoadedModel(ctx, out) || !internal::RequireReference(ctx, out)) return out;
  CausalLM& model = *ctx.model;
  const ReferenceBundle& ref = *ctx.reference;
  const internal::ReferenceThreads threads(ctx, ref);
  if (!model.SupportsPacked()) {
    return out.Fail(FailureClass::kAdapterContract,
                    "the model has no packed forward (SupportsPacked is false): a trainer that "
                    "packs sequences with cu_seqlens cannot run it");
  }
  // A copy of the packing envelope (internal::SelfComparisonEnvelope): the bundle is released
  // before the training step, and its figures are written after it.
  std::optional<PackingEnvelope> packing_envelope;
  if (const Envelope* e = internal::SelfComparisonEnvelope(ctx, ref); e != nullptr && e->packing) {
    packing_envelope = *e->packing;
  }
  const PackingBars bars =
      PackingBarsFor(ctx.spec.precision, packing_envelope ? &*packing_envelope : nullptr);
  std::vector<torch::Tensor> prompts;
  for (const ReferencePrompt& p : ref.prompts) prompts.push_back(p.input_ids);
  out.Count("sequences", static_cast<int64_t>(prompts.size()));

  // --- logits: packed against each prompt alone ------------------------------------------
  std::vector<std::string> misses;
  {
    model.eval();
    torch::NoGradGuard no_grad;
    const Packed packed = Pack(prompts, ctx.device);
    out.Count("packed_tokens", packed.bounds.back());
    const double start = NowMsSteady();
    const torch::Tensor logits =
        model.ForwardPacked(packed.tokens, packed.positions, packed.cu_seqlens);
    // Each timer is read after the device has finished (the figures are parts of the phase's
    // time, tools/bench/phase_accounting.py; on CUDA the kernels are asynchronous).
    internal::SyncDevice(ctx.device);
    out.Real("packed_forward_ms", NowMsSteady() - start, "ms");
    if (logits.dim() != 3 || logits.size(0) != 1 || logits.size(1) != packed.bounds.back() ||
        logits.size(2) != ref.vocab_size) {
      return out.Fail(FailureClass::kAdapterContract,
                      "ForwardPacked returned logits " + ShapeString(logits.sizes()) +
                          ", expected [1, " + std::to_string(packed.bounds.back()) + ", " +
                          std::to_string(ref.vocab_size) + "]");
    }
    LogitComparison cmp;
    int64_t bit_equal = 0, near_ties = 0;
    double flip_gap_max = 0;  // the largest log-prob gap (alone) of a flipped top-1, nats
    std::vector<std::string> differing;
    double alone_ms = 0;  // the forwards of each prompt alone; the rest of the loop compares
    const double compare_start = NowMsSteady();
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t t = prompts[i].size(0);
      const double alone_start = NowMsSteady();
      const torch::Tensor alone =
          model.Forward(prompts[i].unsqueeze(0).to(ctx.device), Positions(0, t, ctx.device),
                        nullptr)[0];
      internal::SyncDevice(ctx.device);
      alone_ms += NowMsSteady() - alone_start;
      const torch::Tensor in_pack = logits[0].slice(0, packed.bounds[i], packed.bounds[i + 1]);
      const bool equal = torch::equal(alone, in_pack);
      if (equal) {
        ++bit_equal;
      } else {
        differing.push_back(std::to_string(i));
      }
      const torch::Tensor alone_f = alone.to(torch::kCPU, torch::kFloat);
      const torch::Tensor in_pack_f = in_pack.to(torch::kCPU, torch::kFloat);
      LogitComparison one;
      one.Add(alone_f, in_pack_f);
      cmp.Add(alone_f, in_pack_f);
      // A top-1 that differs where the forward alone ranks the two tokens within
      // bars.near_tie_nats of each other is a near-tie (any rounding flips it), counted apart.
      const torch::Tensor top_alone = alone_f.argmax(-1), top_packed = in_pack_f.argmax(-1);
      const torch::Tensor flipped = top_alone.ne(top_packed).nonzero().view({-1});
      int64_t hard = 0;
      if (flipped.numel() > 0) {
        const torch::Tensor logp =
            torch::log_softmax(alone_f.index_select(0, flipped).to(torch::kDouble), -1);
        const torch::Tensor gap = logp.gather(1, top_alone.index_select(0, flipped).unsqueeze(1)) -
                                  logp.gather(1, top_packed.index_select(0, flipped).unsqueeze(1));
        // The tie threshold per flipped token: near_tie_nats, or near_tie_ulps steps of the
        // model dtype at the forward alone's top logit, whichever is larger (a bf16 logit near
        // 20 moves in steps of 0.125).
        torch::Tensor threshold = torch::full({flipped.numel(), 1}, bars.near_tie_nats,
                                              torch::kDouble);
        if (bars.near_tie_ulps > 0) {
          const torch::Tensor top = alone_f.index_select(0, flipped).abs().amax(-1);
          for (int64_t k = 0; k < flipped.numel(); ++k) {
            int exponent = 0;
            std::frexp(top[k].item<double>(), &exponent);  // top = f * 2^exponent, f in [0.5, 1)
            const double ulp = std::ldexp(1.0, exponent - 1 - bars.mantissa_bits);
            threshold[k][0] = std::max(bars.near_tie_nats, bars.near_tie_ulps * ulp);
          }
        }
        const int64_t ties = gap.le(threshold).sum().item<int64_t>();
        flip_gap_max = std::max(flip_gap_max, gap.max().item<double>());
        near_ties += ties;
        hard = flipped.numel() - ties;
      }
      const bool kl_ok = one.kl_max() <= bars.kl_max;
      if (!(kl_ok && hard == 0) && !equal) {
        misses.push_back("sequence " + std::to_string(i) + " (" + std::to_string(t) +
                         " tokens, columns " + std::to_string(packed.bounds[i]) + ".." +
                         std::to_string(packed.bounds[i + 1]) + "): max abs diff " +
                         Num(one.max_abs_diff()) + ", KL max " + Num(one.kl_max()) +
                         " nats, KL mean " + Num(one.kl_mean()) +
                         " nats, top-1 " + Num(one.top1_agreement_percent()) + " % (" +
                         std::to_string(hard) + " token(s) apart from near-ties) against its "
                         "own forward");
      }
    }
    out.Real("alone_forwards_ms", alone_ms, "ms");
    out.Real("logit_comparison_ms", NowMsSteady() - compare_start - alone_ms, "ms");
    out.Count("sequences_bit_equal", bit_equal);
    out.Real("max_abs_diff", cmp.max_abs_diff(), "logits");
    out.Real("kl_max", cmp.kl_max(), "nats");
    out.Real("kl_mean", cmp.kl_mean(), "nats");
    out.Real("top1_agreement", cmp.top1_agreement_percent(), "percent");
    out.Count("top1_near_ties", near_ties);
    out.Real("top1_flip_gap_max", flip_gap_max, "nats");
    if (!differing.empty()) out.Text("sequences_not_bit_equal", JoinFew(differing));
  }

  // --- training: the packed step's loss and gradients against the unpacked batch's --------
  // As the training gate: each sequence predicts its own tokens 1..T-1 from 0..T-2 (next-token
  // cross-entropy); the loss is the mean over every predicted token of every sequence.
  std::vector<torch::Tensor> inputs, labels;
  int64_t predicted = 0;
  for (const torch::Tensor& p : prompts) {
    if (p.size(0) < 2) continue;
    inputs.push_back(p.slice(0, 0, p.size(0) - 1));
    labels.push_back(p.slice(0, 1, p.size(0)));
    predicted += p.size(0) - 1;
  }
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (const ParamGroup& g : UniqueParameters(model)) {  // tied weights once
    if (!g.tensor.requires_grad()) continue;
    params.push_back(g.tensor);
    names.push_back(g.names[0]);
  }
  if (inputs.empty() || params.empty()) {
    out.Text("training", inputs.empty() ? "no prompt of two or more tokens to train on"
                                        : "no trainable parameter");
  } else {
    model.train();
    struct EvalOnExit {
      CausalLM& m;
      const std::vector<torch::Tensor>& params;
      ~EvalOnExit() {
        m.eval();
        ZeroGradients(params);
      }
    } eval_on_exit{model, params};
    // Only the ids are needed from here: the bundle's logits (0.65 GB at Qwen2.5-0.5B) go
    // before the gradients are made; a later gate reads the bundle again (RequireReference).
    ctx.reference.reset();
    internal::ReturnFreedMemory();
    ZeroGradients(params);

    // The unpacked batch first: each sequence alone, its summed loss over its predicted tokens
    // divided by the batch's count, the gradients accumulated.
    const double unpacked_start = NowMsSteady();
    double unpacked_loss = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int64_t t = inputs[i].size(0);
      const torch::Tensor l =
          model.Forward(inputs[i].unsqueeze(0).to(ctx.device), Positions(0, t, ctx.device),
                        nullptr)[0]
              .to(torch::kFloat);
      const torch::Tensor loss =
          torch::nn::functional::cross_entropy(
              l, labels[i].to(ctx.device),
              torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
          static_cast<double>(predicted);
      loss.backward();
      unpacked_loss += loss.item<double>();
    }
    out.Real("unpacked_step_ms", NowMsSteady() - unpacked_start, "ms");
    const double norms_start = NowMsSteady();
    std::vector<double> unpacked_norm(params.size(), 0.0);
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad().defined()) {
        unpacked_norm[i] = std::sqrt(internal::StatsOf(params[i].grad()).sum_sq);
      }
    }
    const double norms_ms = NowMsSteady() - norms_start;

    // The packed step, its loss backpropagated negated: each gradient becomes unpacked -
    // packed in place (negation is exact in floating point, so -packed is the packed
    // gradient's bits with the sign flipped), and no second set of gradients is held.
    const double start = NowMsSteady();
    const Packed packed = Pack(inputs, ctx.device);
    const torch::Tensor packed_logits =
        model.ForwardPacked(packed.tokens, packed.positions, packed.cu_seqlens)[0]
            .to(torch::kFloat);
    const torch::Tensor packed_loss =
        torch::nn::functional::cross_entropy(packed_logits, torch::cat(labels).to(ctx.device));
    (-packed_loss).backward();
    internal::SyncDevice(ctx.device);
    out.Real("packed_step_ms", NowMsSteady() - start, "ms");
    const double packed_loss_value = packed_loss.item<double>();
    const double loss_rel =
        std::abs(packed_loss_value - unpacked_loss) / std::max(std::abs(unpacked_loss), 1e-30);
    out.Real("loss_packed", packed_loss_value, "nats");
    out.Real("loss_unpacked", unpacked_loss, "nats");
    out.Real("loss_rel_diff", loss_rel, "ratio");
    if (!(loss_rel <= bars.loss_rel)) {
      misses.push_back("training loss packed " + Num(packed_loss_value) + " vs unpacked " +
                       Num(unpacked_loss) + " (relative diff " + Num(loss_rel) + ")");
    }
    // Per parameter: ||unpacked - packed|| / ||unpacked||, in float64 by slices.
    torch::NoGradGuard no_grad;
    const double grad_compare_start = NowMsSteady();
    double worst = 0;
    std::string worst_name;
    std::vector<std::string> grad_misses;
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& g = params[i].grad();
      const double diff = g.defined() ? std::sqrt(internal::StatsOf(g).sum_sq) : 0.0;
      const double norm = unpacked_norm[i];
      const double rel = norm > 0 ? diff / norm : (diff == 0 ? 0.0 : INFINITY);
      if (!(rel <= worst)) {
        worst = rel;
        worst_name = names[i];
      }
      if (!(rel <= bars.grad_rel)) {
        grad_misses.push_back(names[i] + " (relative diff " + Num(rel) + ")");
      }
    }
    // Both passes over the gradients in float64: the unpacked norms, then the differences'.
    out.Real("gradient_comparison_ms", norms_ms + NowMsSteady() - grad_compare_start, "ms");
    out.Real("grad_rel_diff_max", worst, "ratio");
    if (!worst_name.empty()) out.Text("grad_rel_diff_max_parameter", worst_name);
    out.Count("parameters_compared", static_cast<int64_t>(params.size()));
    if (!grad_misses.empty()) {
      misses.push_back(std::to_string(grad_misses.size()) +
                       " parameter gradient(s) differ packed vs unpacked: " +
                       JoinFew(grad_misses));
    }
  }
  out.Real("bar_kl_max", bars.kl_max, "nats");
  out.Real("bar_top1_agreement", bars.top1_percent, "percent");
  out.Real("bar_near_tie", bars.near_tie_nats, "nats");
  out.Real("bar_loss_rel", bars.loss_rel, "ratio");
  out.Real("bar_grad_rel", bars.grad_rel, "ratio");
  if (packing_envelope) {
    out.Real("envelope_kl_max", packing_envelope->kl_max, "nats");
    out.Real("envelope_loss_rel", packing_envelope->loss_rel, "ratio");
    out.Real("envelope_grad_rel", packing_envelope->grad_rel, "ratio");
  }
  out.Text("bars", bars.basis);
  if (!misses.empty()) {
    return out.Fail(FailureClass::kAdapterContract,
                    "packed forward differs from the unpacked one: " + JoinFew(misses) + " (" +
                        bars.basis + ")");
  }
  return out;
}

}  // namespace gatehouse::worker
