#include "decoder/model.h"
#include "decoder/model_parts.h"

#include "decoder/parallelize.h"

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>

namespace gatehouse::models {
namespace {

using nlohmann::json;

// Training a tied model without vocabulary-sized temporaries. Upstream's backward makes three
// [V, hidden] tensors for the shared weight: the lm_head's gradient, the embedding's dense
// gradient (zeros, then each id's row added: embedding_dense_backward), and their sum, which
// autograd then keeps as the gradient: 1.1 GB beyond the gradient itself at Qwen2.5-0.5B's
// 151936 words in fp32, at the end of every backward, when every other gradient exists too.
// TiedHead and TiedEmbeddingLookup make the same forward and compute every element of the
// gradient as upstream does (a + e, each addend by upstream's own kernel in its order):
// TiedHead's backward puts the lm_head's gradient in a slot shared with the lookup, and the
// lookup's backward adds its rows to it in place (only the rows the ids touched; an untouched
// element stays a, where upstream's a + 0.0 differs only for a == -0.0, in the sign of a zero)
// and returns it as the weight's one gradient.

/// logits = linear(hidden, weight): hidden [..., hidden_size], weight [V, hidden_size].
/// Backward returns upstream's input gradient and leaves the weight's in `slot`.
struct TiedHead : public torch::autograd::Function<TiedHead> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& slot) {
    ctx->save_for_backward({hidden, weight});
    ctx->saved_data["slot"] = slot;
    return torch::linear(hidden, weight);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& hidden = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor grad = grads[0].reshape({-1, weight.size(0)});  // [N, V]
    const torch::Tensor h = hidden.reshape({-1, weight.size(1)});          // [N, hidden]
    // linear(hidden, W) is matmul(hidden, W.t()), folded to mm(h, W.t()); upstream's
    // MmBackward0 then gives grad.mm(W) for h and, W.t() being column-major,
    // grad.t().mm(h) (transposed twice) for W: the same calls here.
    torch::Tensor slot = ctx->saved_data["slot"].toTensor();
    slot.set_(grad.t().mm(h));
    return {grad.mm(weight).view(hidden.sizes()), torch::Tensor(), torch::Tensor()};
  }
};

/// torch.nn.functional.embedding(tokens, weight): tokens int64 [...] -> [..., hidden_size].
/// Backward adds each touched row's sum (embedding_dense_backward over the unique ids: the
/// same kernel and order as upstream's) into the lm_head's gradient that TiedHead left in
/// `slot`, in place, and returns it; with an empty slot it returns upstream's dense gradient.
struct TiedEmbeddingLookup : public torch::autograd::Function<TiedEmbeddingLookup> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& weight,
                               const torch::Tensor& tokens, int64_t padding_idx,
                               const torch::Tensor& slot) {
    ctx->save_for_backward({tokens});
    ctx->saved_data["rows"] = weight.size(0);
    ctx->saved_data["padding_idx"] = padding_idx;
    ctx->saved_data["slot"] = slot;
    return torch::embedding(weight, tokens, padding_idx);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor ids = ctx->get_saved_variables()[0].reshape({-1});
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const int64_t padding_idx = ctx->saved_data["padding_idx"].toInt();
    const torch::Tensor grad = grads[0].reshape({ids.numel(), grads[0].size(-1)});
    torch::Tensor slot = ctx->saved_data["slot"].toTensor();
    const torch::autograd::variable_list none = {torch::Tensor(), torch::Tensor(), torch::Tensor()};
    if (slot.dim() != 2 || slot.size(0) != rows) {  // no TiedHead in this graph
      torch::autograd::variable_list out = {
          at::embedding_dense_backward(grad, ids, rows, padding_idx, false)};
      out.insert(out.end(), none.begin(), none.end());
      return out;
    }
    const auto [unique, inverse, counts] =
        at::_unique2(ids, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
    int64_t local_padding = -1;  // the padding row's index among the unique ids
    if (padding_idx >= 0) {
      const torch::Tensor hit = unique.eq(padding_idx).nonzero();
      if (hit.numel() > 0) local_padding = hit.item<int64_t>();
    }
    const torch::Tensor sums = at::embedding_dense_backward(grad, inverse, unique.size(0),
                                                            local_padding, false);
    slot.index_add_(0, unique, sums);
    torch::autograd::variable_list out = {slot.detach()};  // a fresh handle: autograd keeps it
    slot.set_();  // the slot lets go of the gradient's storage
    out.insert(out.end(), none.begin(), none.end());
    return out;
  }
};

// The slot from this thread's last Embed for its Head (both run in one forward, in order).
thread_local torch::Tensor tied_grad_slot;


/// Megatron's RowParallelLinear: this rank's partial x W_local^T, summed over the ranks, then
/// the (replicated) bias once. At TP size 1 it is the plain layer (bias inside the GEMM).
torch::Tensor RowParallel(Linear& linear, const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.enabled()) return linear(x);
  auto y = worker::ReduceFromTensorParallelRegion(torch::linear(x, linear->weight), tp);
  return linear->bias.defined() ? y + linear->bias : y;
}

/// cap * tanh(x / cap) (Gemma 2 soft-capping).
torch::Tensor SoftCap(const torch::Tensor& x, double cap) { return torch::tanh(x / cap) * cap; }

/// repeat_kv: [B, H_kv, S, D] -> [B, H_kv * n_rep, S, D], each kv head repeated n_rep times
/// consecutively (equivalent to repeat_interleave on dim 1).
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto b = x.size(0), h = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, n_rep, s, d}).reshape({b, h * n_rep, s, d});
}

/// Ulysses' first exchange for one attention: q [B, T / cp, H, D], k and v [B, T / cp, Hkv,
/// D] (this rank's columns) -> each [B, T, heads / cp, D] (the whole sequence of this rank's
/// share of the heads), and T. When cp does not divide Hkv, k and v are repeated to H first
/// (repeat_kv's order), so each rank's query heads keep their own KV heads.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, int64_t> UlyssesExchange(
    const torch::Tensor& q, torch::Tensor k, torch::Tensor v, const ContextParallel& cp) {
  const int64_t heads = q.size(2), kv_heads = k.size(2);
  TORCH_CHECK(heads % cp.size == 0, "context parallel: cp=", cp.size, " does not divide the ",
              heads, " query heads of this rank (num_attention_heads / tp)");
  if (kv_heads % cp.size != 0) {
    k = k.repeat_interleave(heads / kv_heads, 2);
    v = v.repeat_interleave(heads / kv_heads, 2);
  }
  torch::Tensor whole_q = worker::SequenceToHeads(q, cp);
  const int64_t t = whole_q.size(1);
  return {whole_q, worker::SequenceToHeads(k, cp), worker::SequenceToHeads(v, cp), t};
}

/// Mask over a cached prefix: [T, past + T] bool, true where query slot past + t may attend key
/// slot s: s <= past + t, and with a sliding window also past + t - s < window.
torch::Tensor AttentionMask(int64_t past, int64_t t, int64_t window, torch::Device device) {
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto query_slot = torch::arange(past, past + t, opts).unsqueeze(1);
  auto key_slot = torch::arange(0, past + t, opts).unsqueeze(0);
  auto mask = key_slot <= query_slot;
  if (window > 0) mask = mask.logical_and(key_slot > query_slot - window);
  return mask;
}

Status Positive(std::string_view field, double value) {
  if (value > 0) return Status::Ok();
  return Status::InvalidArgument("config field '" + std::string(field) + "' = " +
                                 json(value).dump() + ": must be positive");
}

std::string ActivationName(Activation a) {
  return a == Activation::kSilu ? "silu" : "gelu_pytorch_tanh";
}

}  // namespace

// --- DecoderSpec --------------------------------------------------------------------------

Status DecoderSpec::Validate() const {
  GH_RETURN_IF_ERROR(Positive("vocab_size", static_cast<double>(vocab_size)));
  GH_RETURN_IF_ERROR(Positive("hidden_size", static_cast<double>(hidden_size)));
  GH_RETURN_IF_ERROR(Positive("num_hidden_layers", static_cast<double>(num_hidden_layers)));
  GH_RETURN_IF_ERROR(Positive("num_attention_heads", static_cast<double>(num_attention_heads)));
  GH_RETURN_IF_ERROR(Positive("num_key_value_heads", static_cast<double>(num_key_value_heads)));
  GH_RETURN_IF_ERROR(Positive("head_dim", static_cast<double>(head_dim)));
  GH_RETURN_IF_ERROR(
      Positive("max_position_embeddings", static_cast<double>(max_position_embeddings)));
  GH_RETURN_IF_ERROR(Positive("rms_norm_eps", rms_norm_eps));
  GH_RETURN_IF_ERROR(Positive("attention scaling", attention_scaling));
  if (num_attention_heads % num_key_value_heads != 0) {
    return Status::InvalidArgument(
        "config field 'num_attention_heads' = " + std::to_string(num_attention_heads) +
        " is not a multiple of 'num_key_value_heads' = " + std::to_string(num_key_value_heads));
  }
  if (ropes.empty()) return Status::InvalidArgument("no RoPE setting (a family bug)");
  for (const auto& rope : ropes) {
    const int64_t dim = RotaryDim(rope, head_dim);
    if (dim < 2 || dim % 2 != 0 || dim > head_dim) {
      return Status::InvalidArgument(
          "config field 'head_dim' = " + std::to_string(head_dim) + " with partial_rotary_factor " +
          json(rope.partial_rotary_factor).dump() + " gives rotary dim " + std::to_string(dim) +
          "; it must be even and at least 2");
    }
  }
  if (static_cast<int64_t>(layers.size()) != num_hidden_layers) {
    return Status::InvalidArgument("layer_types has " + std::to_string(layers.size()) +
                                   " entries but num_hidden_layers = " +
                                   std::to_string(num_hidden_layers));
  }
  bool any_moe = false, any_dense = false;
  for (const auto& l : layers) {
    if (l.rope < 0 || l.rope >= static_cast<int>(ropes.size())) {
      return Status::InvalidArgument("layer RoPE index out of range (a family bug)");
    }
    if (l.sliding_window < 0) {
      return Status::InvalidArgument("config field 'sliding_window' = " +
                                     std::to_string(l.sliding_window) + ": must be positive");
    }
    (l.moe ? any_moe : any_dense) = true;
  }
  if (any_dense) GH_RETURN_IF_ERROR(Positive("intermediate_size", static_cast<double>(intermediate_size)));
  if (any_moe) {
    GH_RETURN_IF_ERROR(Positive("num_experts", static_cast<double>(num_experts)));
    GH_RETURN_IF_ERROR(
        Positive("moe_intermediate_size", static_cast<double>(moe_intermediate_size)));
    if (num_experts_per_tok <= 0 || num_experts_per_tok > num_experts) {
      return Status::InvalidArgument("config field 'num_experts_per_tok' = " +
                                     std::to_string(num_experts_per_tok) + ": must be in [1, " +
                                     "num_experts = " + std::to_string(num_experts) + "]");
    }
  }
  if (pad_token_id.has_value() && (*pad_token_id < 0 || *pad_token_id >= vocab_size)) {
    return Status::InvalidArgument("config field 'pad_token_id' = " +
                                   std::to_string(*pad_token_id) + ": must be in [0, vocab_size)");
  }
  for (const auto& [field, cap] : {std::pair{"attn_logit_softcapping", attn_logit_softcapping},
                                   std::pair{"final_logit_softcapping", final_logit_softcapping}}) {
    if (cap.has_value()) GH_RETURN_IF_ERROR(Positive(field, *cap));
  }
  return Status::Ok();
}

json DecoderSpec::ToJson() const {
  json layer_list = json::array();
  for (const auto& l : layers) {
    layer_list.push_back({{"sliding_window", l.sliding_window}, {"rope", l.rope}, {"moe", l.moe}});
  }
  json rope_list = json::array();
  for (const auto& r : ropes) rope_list.push_back(r.ToJson());
  json j{
      {"model_type", model_type},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"tie_word_embeddings", tie_word_embeddings},
      {"pad_token_id", pad_token_id.has_value() ? json(*pad_token_id) : json(nullptr)},
      {"hidden_act", ActivationName(hidden_act)},
      {"norm", norm == NormKind::kLlama ? "weight * x" : "x * (1 + weight), fp32"},
      {"qkv_bias", qkv_bias},
      {"o_bias", o_bias},
      {"mlp_bias", mlp_bias},
      {"qk_norm", qk_norm},
      {"sandwich_norm", sandwich_norm},
      {"fused_qkv", fused_qkv},
      {"fused_gate_up", fused_gate_up},
      {"scale_embeddings", scale_embeddings},
      {"attention_scaling", attention_scaling},
      {"attn_logit_softcapping",
       attn_logit_softcapping ? json(*attn_logit_softcapping) : json(nullptr)},
      {"final_logit_softcapping",
       final_logit_softcapping ? json(*final_logit_softcapping) : json(nullptr)},
      {"ropes", rope_list},
      {"layers", layer_list},
  };
  if (num_experts > 0) {
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["norm_topk_prob"] = norm_topk_prob;
  }
  return j;
}

// --- Linear and embedding -----------------------------------------------------------------

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias, const ParamOptions& po) {
  weight = register_parameter("weight", NewParameter({out, in}, po, InitNormal));
  if (with_bias) {
    bias = register_parameter("bias", NewParameter({out}, po, [](torch::Tensor& t) { t.zero_(); }));
  }
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim,
                             std::optional<int64_t> padding_idx, const ParamOptions& po)
    : padding_idx_(padding_idx) {
  const auto init = [&](torch::Tensor& t) {
    InitNormal(t);
    if (padding_idx) t[*padding_idx].zero_();  // upstream zeroes the padding row
  };
  weight = register_parameter("weight", NewParameter({num_embeddings, dim}, po, init));
}

// --- RMSNorm ------------------------------------------------------------------------------

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, NormKind kind, TensorParallel grad_sum,
                         const ParamOptions& po)
    : eps_(eps), kind_(kind), grad_sum_(std::move(grad_sum)) {
  // Identity at init: weight 1 for weight * x, weight 0 for x * (1 + weight).
  const double identity = kind == NormKind::kLlama ? 1.0 : 0.0;
  weight_ = register_parameter(
      "weight", NewParameter({dim}, po, [&](torch::Tensor& t) { t.fill_(identity); }));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor w = worker::CopyToTensorParallelRegion(weight_, grad_sum_);
  auto h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  if (kind_ == NormKind::kLlama) return w * h.to(x.scalar_type());
  return (h * (1.0 + w.to(torch::kFloat32))).to(x.scalar_type());
}

// --- Attention ----------------------------------------------------------------------------

AttentionImpl::AttentionImpl(const DecoderSpec& spec, const TensorParallel& tp,
                             const ParamOptions& po)
    : num_heads_(Local(spec.num_attention_heads, tp)),
      num_kv_heads_(Local(spec.num_key_value_heads, tp)),
      head_dim_(spec.head_dim),
      scaling_(spec.attention_scaling),
      softcap_(spec.attn_logit_softcapping),
      tp_(tp) {
  const int64_t hidden = spec.hidden_size;
  const int64_t q_out = num_heads_ * head_dim_, kv_out = num_kv_heads_ * head_dim_;
  if (spec.fused_qkv) {
    wqkv_ = register_module("wqkv", Linear(hidden, q_out + 2 * kv_out, spec.qkv_bias, po));
  } else {
    wq_ = register_module("wq", Linear(hidden, q_out, spec.qkv_bias, po));
    wk_ = register_module("wk", Linear(hidden, kv_out, spec.qkv_bias, po));
    wv_ = register_module("wv", Linear(hidden, kv_out, spec.qkv_bias, po));
  }
  wo_ = register_module("wo", Linear(q_out, hidden, spec.o_bias, po));
  if (spec.qk_norm) {
    // One weight over head_dim shared by all heads: each rank sees only its heads' share of
    // the gradient, so it is summed over the ranks.
    q_norm_ = register_module("q_norm", RMSNorm(head_dim_, spec.rms_norm_eps, spec.norm, tp, po));
    k_norm_ = register_module("k_norm", RMSNorm(head_dim_, spec.rms_norm_eps, spec.norm, tp, po));
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                     const torch::Tensor& mask, worker::KVCache* cache,
                                     int64_t layer, const torch::Tensor& slots,
                                     const ContextParallel* cp) {
  const int64_t b = x.size(0);
  int64_t t = x.size(1);
  const torch::Tensor in = worker::CopyToTensorParallelRegion(x, tp_);
  torch::Tensor q, k, v;
  if (wqkv_) {
    auto qkv = wqkv_(in);
    const int64_t q_out = num_heads_ * head_dim_, kv_out = num_kv_heads_ * head_dim_;
    q = qkv.narrow(-1, 0, q_out);
    k = qkv.narrow(-1, q_out, kv_out);
    v = qkv.narrow(-1, q_out + kv_out, kv_out);
  } else {
    q = wq_(in);
    k = wk_(in);
    v = wv_(in);
  }
  q = q.view({b, t, num_heads_, head_dim_});
  k = k.view({b, t, num_kv_heads_, head_dim_});
  if (q_norm_) {
    q = q_norm_(q);  // per head, over head_dim (Qwen3Attention / Gemma3Attention)
    k = k_norm_(k);
  }
  v = v.view({b, t, num_kv_heads_, head_dim_});
  const bool ulysses = cp != nullptr && cp->enabled();
  TORCH_CHECK(!ulysses || cache == nullptr, "context parallel: no cache");
  if (ulysses) std::tie(q, k, v, t) = UlyssesExchange(q, k, v, *cp);
  const int64_t heads = q.size(2), kv_heads = k.size(2);
  q = q.transpose(1, 2);                                                   // [B, H, T, D]
  k = k.transpose(1, 2);                                                   // [B, Hkv, T, D]
  v = v.transpose(1, 2);                                                   // [B, Hkv, T, D]

  // RoPE (apply_rotary_pos_emb): rotate queries and keys by their absolute positions.
  q = ApplyRotary(q, rope);
  k = ApplyRotary(k, rope);

  torch::Tensor keys = k, values = v;
  if (cache != nullptr && slots.defined()) {
    std::tie(keys, values) = cache->WriteAt(layer, k, v, slots);  // [B, Hkv, max_len, D]
  } else if (cache != nullptr) {
    std::tie(keys, values) = cache->Append(layer, k, v);  // [B, Hkv, past + T, D]
  }
  const int64_t n_rep = heads / kv_heads;
  keys = RepeatKv(keys, n_rep);
  values = RepeatKv(values, n_rep);

  // Eager attention (eager_attention_forward): scores, optional soft-cap, mask, softmax in fp32
  // cast back to the query dtype.
  auto scores = torch::matmul(q, keys.transpose(2, 3)) * scaling_;  // [B, H, T, S]
  if (softcap_) scores = SoftCap(scores, *softcap_);
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  auto probs = torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type());
  auto out = torch::matmul(probs, values);  // [B, H, T, D]
  out = out.transpose(1, 2).contiguous();     // [B, T, H, D]
  if (ulysses) out = worker::HeadsToSequence(out, *cp);
  out = out.reshape({b, x.size(1), num_heads_ * head_dim_});
  return RowParallel(wo_, out, tp_);
}

// --- Feed-forward -------------------------------------------------------------------------

FeedForwardImpl::FeedForwardImpl(const DecoderSpec& spec, int64_t full_intermediate_size,
                                 const TensorParallel& tp, const ParamOptions& po)
    : act_(spec.hidden_act), tp_(tp) {
  const int64_t hidden = spec.hidden_size;
  const int64_t intermediate_size = Local(full_intermediate_size, tp);
  if (spec.fused_gate_up) {
    w13_ = register_module("w13", Linear(hidden, 2 * intermediate_size, spec.mlp_bias, po));
  } else {
    w1_ = register_module("w1", Linear(hidden, intermediate_size, spec.mlp_bias, po));
    w3_ = register_module("w3", Linear(hidden, intermediate_size, spec.mlp_bias, po));
  }
  w2_ = register_module("w2", Linear(intermediate_size, hidden, spec.mlp_bias, po));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  const torch::Tensor in = worker::CopyToTensorParallelRegion(x, tp_);
  if (w13_) {
    auto gate_up = w13_(in).chunk(2, -1);  // Phi3MLP: gate first, then up
    return RowParallel(w2_, gate_up[1] * Activate(act_, gate_up[0]), tp_);
  }
  return RowParallel(w2_, Activate(act_, w1_(in)) * w3_(in), tp_);
}

// --- Decoder layer ------------------------------------------------------------------------

TransformerBlockImpl::TransformerBlockImpl(const DecoderSpec& spec, const LayerSpec& layer,
                                           const TensorParallel& tp, const ParamOptions& po,
                                           const ExpertParallel& ep) {
  const int64_t h = spec.hidden_size;
  const double eps = spec.rms_norm_eps;
  const TensorParallel whole;  // layer norms see the whole hidden state on every rank
  attention_norm_ = register_module("attention_norm", RMSNorm(h, eps, spec.norm, whole, po));
  attention_ = register_module("attention", Attention(spec, tp, po));
  if (spec.sandwich_norm) {
    attention_post_norm_ =
        register_module("attention_post_norm", RMSNorm(h, eps, spec.norm, whole, po));
  }
  ffn_norm_ = register_module("ffn_norm", RMSNorm(h, eps, spec.norm, whole, po));
  if (layer.moe) {
    moe_ = register_module("moe", MoE(spec, tp, po, ep));
  } else {
    feed_forward_ =
        register_module("feed_forward", FeedForward(spec, spec.intermediate_size, tp, po));
  }
  if (spec.sandwich_norm) {
    ffn_post_norm_ = register_module("ffn_post_norm", RMSNorm(h, eps, spec.norm, whole, po));
  }
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                            const torch::Tensor& mask, worker::KVCache* cache,
                                            int64_t layer, const torch::Tensor& slots,
                                            const ContextParallel* cp) {
  auto a = attention_->forward(attention_norm_(x), rope, mask, cache, layer, slots, cp);
  if (attention_post_norm_) a = attention_post_norm_(a);
  auto h = x + a;
  auto n = ffn_norm_(h);
  auto m = moe_ ? moe_(n) : feed_forward_(n);
  if (ffn_post_norm_) m = ffn_post_norm_(m);
  return h + m;
}

// --- Causal LM ----------------------------------------------------------------------------

DecoderModel::DecoderModel(const DecoderSpec& spec, TensorParallel tp, const ParamOptions& po,
                           const ExpertParallel& ep)
    : spec_(spec), tp_(std::move(tp)), vocab_parallel_(VocabParallel(spec, tp_.size)) {
  TORCH_CHECK(!tp_.enabled() || tp_.comm, "tensor-parallel size ", tp_.size,
              " needs a communicator");
  // Vocabulary-parallel: this rank holds rows [rank * V_local, (rank + 1) * V_local).
  const int64_t vocab_rows = vocab_parallel_ ? spec.vocab_size / tp_.size : spec.vocab_size;
  const int64_t first_row = vocab_parallel_ ? tp_.rank * vocab_rows : 0;
  std::optional<int64_t> pad_row;  // the padding row, when this rank holds it
  if (spec.pad_token_id.has_value() && *spec.pad_token_id >= first_row &&
      *spec.pad_token_id < first_row + vocab_rows) {
    pad_row = *spec.pad_token_id - first_row;
  }
  tok_embeddings_ =
      register_module("tok_embeddings", Embedding(vocab_rows, spec.hidden_size, pad_row, po));
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (const auto& layer : spec.layers) {
    layers_->push_back(TransformerBlock(spec, layer, tp_, po, ep));
  }
  norm_ = register_module(
      "norm", RMSNorm(spec.hidden_size, spec.rms_norm_eps, spec.norm, TensorParallel{}, po));
  if (!spec.tie_word_embeddings) {
    output_ = register_module("output", Linear(spec.hidden_size, vocab_rows, false, po));
  }
}

torch::Tensor DecoderModel::ExpertTokenCounts() const {
  std::vector<torch::Tensor> rows;
  for (size_t i = 0; i < layers_->size(); ++i) {
    if (MoE moe = layers_->at<TransformerBlockImpl>(i).moe()) rows.push_back(moe->counts());
  }
  return rows.empty() ? torch::Tensor() : torch::stack(rows);
}

int64_t DecoderModel::ExpertNearTies() const {
  int64_t n = 0;
  for (size_t i = 0; i < layers_->size(); ++i) {
    if (MoE moe = layers_->at<TransformerBlockImpl>(i).moe()) n += moe->near_ties();
  }
  return n;
}

void DecoderModel::ResetExpertTokenCounts() {
  for (size_t i = 0; i < layers_->size(); ++i) {
    if (MoE moe = layers_->at<TransformerBlockImpl>(i).moe()) moe->ResetCounts();
  }
}

torch::Tensor DecoderModel::Embed(const torch::Tensor& tokens, bool shared_tied_grad) {
  tied_grad_slot = torch::Tensor();
  torch::Tensor h;  // [B, T, hidden]
  if (vocab_parallel_) {
    // VocabParallelEmbedding: ids outside this rank's rows look up row 0 and are zeroed; the
    // ranks' partial embeddings are summed.
    const int64_t rows = tok_embeddings_->weight.size(0);
    const auto local = tokens - tp_.rank * rows;
    const auto outside = local.lt(0).logical_or(local.ge(rows));
    h = tok_embeddings_(local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0);
    h = worker::ReduceFromTensorParallelRegion(h, tp_);
  } else if (shared_tied_grad && !output_ && !tp_.enabled() && torch::GradMode::is_enabled() &&
             tok_embeddings_->weight.requires_grad() && tok_embeddings_->weight.device().is_cpu()) {
    // Tied and training: no vocabulary-sized temporaries in backward (TiedEmbeddingLookup).
    // CPU only so far: CUDA's dense backward sums rows in another order.
    const int64_t rows = tok_embeddings_->weight.size(0);
    const int64_t padding = spec_.pad_token_id && *spec_.pad_token_id >= 0 &&
                                    *spec_.pad_token_id < rows
                                ? *spec_.pad_token_id
                                : -1;
    tied_grad_slot = torch::empty({0}, tok_embeddings_->weight.options());
    h = TiedEmbeddingLookup::apply(tok_embeddings_->weight, tokens, padding, tied_grad_slot);
  } else {
    h = tok_embeddings_(tokens);
  }
  if (spec_.scale_embeddings) {
    // GemmaModel: the normaliser sqrt(hidden_size) is first rounded to the hidden dtype.
    auto normalizer = torch::tensor(std::sqrt(static_cast<double>(spec_.hidden_size)),
                                    torch::TensorOptions().dtype(h.scalar_type()).device(tokens.device()));
    h = h * normalizer;
  }
  return h;
}

torch::Tensor DecoderModel::Head(const torch::Tensor& hidden) {
  torch::Tensor h = hidden;
  h = norm_(h);
  const torch::Tensor& lm_head = output_ ? output_->weight : tok_embeddings_->weight;
  torch::Tensor logits;
  if (vocab_parallel_) {
    // Column-parallel lm_head over the vocabulary; every rank gets all logits.
    logits = torch::linear(worker::CopyToTensorParallelRegion(h, tp_), lm_head);
    logits = worker::GatherFromTensorParallelRegion(logits, tp_);
  } else {
    torch::Tensor slot = std::exchange(tied_grad_slot, torch::Tensor());
    logits = output_         ? output_(h)
             : slot.defined() ? TiedHead::apply(h, lm_head, slot)  // training, tied: see above
                              : torch::linear(h, lm_head);
  }
  if (spec_.final_logit_softcapping) logits = SoftCap(logits, *spec_.final_logit_softcapping);
  return logits;
}

torch::Tensor DecoderModel::Forward(const torch::Tensor& tokens, const torch::Tensor& positions,
                                    worker::KVCache* cache) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
              "tokens must be int64 [B, T], got ", tokens.scalar_type(), " ", tokens.sizes());
  TORCH_CHECK(positions.sizes() == tokens.sizes() && positions.scalar_type() == torch::kLong,
              "positions must be int64 with the shape of tokens ", tokens.sizes(), ", got ",
              positions.scalar_type(), " ", positions.sizes());
  const int64_t t = tokens.size(1);
  const int64_t past = cache != nullptr ? cache->length() : 0;

  torch::Tensor h = Embed(tokens);  // [B, T, hidden]
  std::vector<RotaryTables> ropes;
  std::map<int64_t, torch::Tensor> masks;
  Tables(positions, past, h.scalar_type(), ropes, masks);
  torch::Tensor logits = Run(std::move(h), ropes, masks, cache);
  if (cache != nullptr) cache->Advance(t);
  return logits;
}

void DecoderModel::Tables(const torch::Tensor& positions, int64_t past, torch::ScalarType dtype,
                          std::vector<RotaryTables>& ropes,
                          std::map<int64_t, torch::Tensor>& masks) const {
  const auto device = positions.device();
  const int64_t t = positions.size(1);
  // RoPE tables per distinct setting; "dynamic" depends on the largest position.
  const int64_t seq_len = positions.numel() > 0 ? positions.max().item<int64_t>() + 1 : 0;
  ropes.reserve(spec_.ropes.size());
  for (const auto& r : spec_.ropes) {
    auto inv_freq = RopeInverseFrequencies(r, spec_.head_dim, spec_.max_position_embeddings,
                                           seq_len, device);
    ropes.push_back(RopeTables(positions, inv_freq, dtype));
  }
  // Masks per distinct window.
  for (const auto& l : spec_.layers) {
    if (!masks.count(l.sliding_window)) {
      masks.emplace(l.sliding_window, AttentionMask(past, t, l.sliding_window, device));
    }
  }
}

torch::Tensor DecoderModel::ForwardStage(const torch::Tensor& input, const torch::Tensor& positions,
                                         int64_t first_layer, int64_t end_layer) {
  const auto layers = static_cast<int64_t>(layers_->size());
  TORCH_CHECK(0 <= first_layer && first_layer < end_layer && end_layer <= layers,
              "stage: layers [", first_layer, ", ", end_layer, ") must be a non-empty range in [0, ",
              layers, "]");
  TORCH_CHECK(positions.dim() == 2 && positions.scalar_type() == torch::kLong,
              "stage: positions must be int64 [B, T], got ", positions.scalar_type(), " ",
              positions.sizes());
  torch::Tensor h;
  if (first_layer == 0) {
    TORCH_CHECK(input.sizes() == positions.sizes() && input.scalar_type() == torch::kLong,
                "stage 0: tokens must be int64 with the shape of positions ", positions.sizes(),
                ", got ", input.scalar_type(), " ", input.sizes());
    h = Embed(input, /*shared_tied_grad=*/false);
  } else {
    TORCH_CHECK(input.dim() == 3 && input.size(0) == positions.size(0) &&
                    input.size(1) == positions.size(1) && input.size(2) == spec_.hidden_size,
                "stage from layer ", first_layer, ": hidden states must be [B, T, ",
                spec_.hidden_size, "] for positions ", positions.sizes(), ", got ", input.sizes());
    h = input;
  }
  std::vector<RotaryTables> ropes;
  std::map<int64_t, torch::Tensor> masks;
  Tables(positions, /*past=*/0, h.scalar_type(), ropes, masks);
  for (int64_t i = first_layer; i < end_layer; ++i) {
    const LayerSpec& l = spec_.layers[static_cast<size_t>(i)];
    h = layers_->at<TransformerBlockImpl>(static_cast<size_t>(i))
            .forward(h, ropes[l.rope], masks.at(l.sliding_window), nullptr, i);
  }
  if (end_layer < layers) return h;
  tied_grad_slot = torch::Tensor();  // the plain head (see ForwardStage in model.h)
  return Head(h);
}

torch::Tensor DecoderModel::Run(torch::Tensor h, const std::vector<RotaryTables>& ropes,
                                const std::map<int64_t, torch::Tensor>& masks,
                                worker::KVCache* cache, const ContextParallel* cp) {
  for (size_t i = 0; i < layers_->size(); ++i) {
    const LayerSpec& l = spec_.layers[i];
    h = layers_->at<TransformerBlockImpl>(i).forward(h, ropes[l.rope], masks.at(l.sliding_window),
                                                      cache, static_cast<int64_t>(i), {}, cp);
  }
  return Head(h);
}

bool DecoderModel::SupportsStaticDecode() const {
  for (const auto& r : spec_.ropes) {
    if (r.rope_type == "dynamic") return false;
  }
  // MoEImpl::forward picks the experts that run from the routing on the host (nonzero, item),
  // which a captured graph cannot do.
  for (const auto& l : spec_.layers) {
    if (l.moe) return false;
  }
  return true;
}

torch::Tensor DecoderModel::DecodeStep(const torch::Tensor& tokens, const torch::Tensor& positions,
                                       worker::KVCache& cache) {
  TORCH_CHECK(SupportsStaticDecode(),
              "static decode: dynamic RoPE depends on the sequence length, which a captured "
              "step cannot read");
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(1) == 1 && tokens.scalar_type() == torch::kLong,
              "static decode: tokens must be int64 [B, 1], got ", tokens.scalar_type(), " ",
              tokens.sizes());
  TORCH_CHECK(positions.sizes() == tokens.sizes() && positions.scalar_type() == torch::kLong,
              "static decode: positions must be int64 [B, 1], got ", positions.sizes());
  const auto device = tokens.device();
  torch::Tensor h = Embed(tokens);
  std::vector<RotaryTables> ropes;
  for (const auto& r : spec_.ropes) {
    // Not dynamic: the frequencies do not depend on the sequence length.
    auto inv_freq = RopeInverseFrequencies(r, spec_.head_dim, spec_.max_position_embeddings,
                                           /*seq_len=*/0, device);
    ropes.push_back(RopeTables(positions, inv_freq, h.scalar_type()));
  }
  // Over every cache slot: slot s is visible to row b when s <= positions[b] (and inside the
  // sliding window); [B, 1, 1, max_len].
  const auto key_slot =
      torch::arange(cache.max_len(), torch::TensorOptions().dtype(torch::kLong).device(device))
          .view({1, -1});
  std::map<int64_t, torch::Tensor> masks;
  for (const auto& l : spec_.layers) {
    if (masks.count(l.sliding_window)) continue;
    auto mask = key_slot <= positions;
    if (l.sliding_window > 0) mask = mask.logical_and(key_slot > positions - l.sliding_window);
    masks.emplace(l.sliding_window, mask.view({tokens.size(0), 1, 1, -1}));
  }
  const torch::Tensor slots = positions.view({-1});
  for (size_t i = 0; i < layers_->size(); ++i) {
    const LayerSpec& l = spec_.layers[i];
    h = layers_->at<TransformerBlockImpl>(i).forward(h, ropes[l.rope], masks.at(l.sliding_window),
                                                      &cache, static_cast<int64_t>(i), slots);
  }
  return Head(h);
}

std::unique_ptr<worker::KVCache> DecoderModel::NewKVCache(int64_t batch, int64_t max_len) const {
  const auto& w = tok_embeddings_->weight;
  return std::make_unique<worker::KVCache>(spec_.num_hidden_layers, batch,
                                           spec_.num_key_value_heads / tp_.size, max_len,
                                           spec_.head_dim,
                                           w.scalar_type(), w.device());
}

}  // namespace gatehouse::models
