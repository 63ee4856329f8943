#include "llama/model.h"

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

namespace gatehouse::models::llama {
namespace {

/// Standard deviation of upstream's fresh-weight init (LlamaConfig.initializer_range default).
constexpr double kInitStd = 0.02;

torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) {
  torch::nn::Linear linear(torch::nn::LinearOptions(in, out).bias(bias));
  torch::NoGradGuard no_grad;
  linear->weight.normal_(0.0, kInitStd);
  if (bias) linear->bias.zero_();
  return linear;
}

/// rotate_half: [x1, x2] -> [-x2, x1] along the last dimension.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  return torch::cat({-x2, x1}, -1);
}

/// repeat_kv: [B, H_kv, S, D] -> [B, H_kv * n_rep, S, D], each kv head repeated n_rep times
/// consecutively (equivalent to repeat_interleave on dim 1).
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto b = x.size(0), h = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, n_rep, s, d}).reshape({b, h * n_rep, s, d});
}

/// Causal mask over a cached prefix: [T, past + T] bool, true where query t (absolute slot
/// past + t) may attend key slot s, i.e. s <= past + t.
torch::Tensor CausalMask(int64_t past, int64_t t, torch::Device device) {
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto query_slot = torch::arange(past, past + t, opts).unsqueeze(1);
  auto key_slot = torch::arange(0, past + t, opts).unsqueeze(0);
  return key_slot <= query_slot;
}

}  // namespace

// --- RMSNorm ------------------------------------------------------------------------------

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight_ = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto h = x.to(torch::kFloat32);
  auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps_);
  return weight_ * h.to(x.scalar_type());
}

// --- RoPE ---------------------------------------------------------------------------------

torch::Tensor RopeInverseFrequencies(int64_t head_dim, double theta, torch::Device device) {
  auto exponent = torch::arange(0, head_dim, 2, torch::TensorOptions().dtype(torch::kFloat32)
                                                    .device(device)) /
                  static_cast<double>(head_dim);
  return 1.0 / torch::pow(theta, exponent);
}

RotaryTables RopeTables(const torch::Tensor& positions, const torch::Tensor& inv_freq,
                        torch::Dtype dtype) {
  auto freqs = positions.unsqueeze(-1).to(torch::kFloat32) * inv_freq;  // [B, T, D/2]
  auto emb = torch::cat({freqs, freqs}, -1);                             // [B, T, D]
  return RotaryTables{emb.cos().to(dtype), emb.sin().to(dtype)};
}

torch::Tensor ApplyRotary(const torch::Tensor& x, const RotaryTables& rope) {
  auto cos = rope.cos.unsqueeze(1);  // [B, 1, T, D]: broadcast over heads
  auto sin = rope.sin.unsqueeze(1);
  return x * cos + RotateHalf(x) * sin;
}

// --- Attention ----------------------------------------------------------------------------

AttentionImpl::AttentionImpl(const LlamaArgs& args)
    : num_heads_(args.num_attention_heads_),
      num_kv_heads_(args.num_key_value_heads_),
      head_dim_(args.head_dim_),
      scaling_(1.0 / std::sqrt(static_cast<double>(args.head_dim_))) {
  const int64_t hidden = args.hidden_size_;
  const bool bias = args.attention_bias_;
  wq_ = register_module("wq", MakeLinear(hidden, num_heads_ * head_dim_, bias));
  wk_ = register_module("wk", MakeLinear(hidden, num_kv_heads_ * head_dim_, bias));
  wv_ = register_module("wv", MakeLinear(hidden, num_kv_heads_ * head_dim_, bias));
  wo_ = register_module("wo", MakeLinear(num_heads_ * head_dim_, hidden, bias));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                     const torch::Tensor& mask, worker::KVCache* cache,
                                     int64_t layer) {
  const int64_t b = x.size(0), t = x.size(1);
  auto q = wq_(x).view({b, t, num_heads_, head_dim_}).transpose(1, 2);     // [B, H, T, D]
  auto k = wk_(x).view({b, t, num_kv_heads_, head_dim_}).transpose(1, 2);  // [B, Hkv, T, D]
  auto v = wv_(x).view({b, t, num_kv_heads_, head_dim_}).transpose(1, 2);  // [B, Hkv, T, D]

  // RoPE (apply_rotary_pos_emb): rotate queries and keys by their absolute positions.
  torch::Tensor q_rotated = ApplyRotary(q, rope);
  torch::Tensor k_rotated = ApplyRotary(k, rope);

  torch::Tensor keys = k_rotated, values = v;
  if (cache != nullptr) {
    std::tie(keys, values) = cache->Append(layer, k_rotated, v);  // [B, Hkv, past + T, D]
  }
  const int64_t n_rep = num_heads_ / num_kv_heads_;
  keys = RepeatKv(keys, n_rep);
  values = RepeatKv(values, n_rep);

  // Eager attention (eager_attention_forward): softmax in fp32, cast back to the query dtype.
  auto scores = torch::matmul(q_rotated, keys.transpose(2, 3)) * scaling_;  // [B, H, T, S]
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  auto probs = torch::softmax(scores, -1, torch::kFloat32).to(q_rotated.scalar_type());
  auto out = torch::matmul(probs, values);                                   // [B, H, T, D]
  out = out.transpose(1, 2).contiguous().reshape({b, t, num_heads_ * head_dim_});
  return wo_(out);
}

// --- Feed-forward -------------------------------------------------------------------------

FeedForwardImpl::FeedForwardImpl(const LlamaArgs& args) {
  const int64_t hidden = args.hidden_size_, inter = args.intermediate_size_;
  const bool bias = args.mlp_bias_;
  w1_ = register_module("w1", MakeLinear(hidden, inter, bias));  // gate_proj
  w2_ = register_module("w2", MakeLinear(inter, hidden, bias));  // down_proj
  w3_ = register_module("w3", MakeLinear(hidden, inter, bias));  // up_proj
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  return w2_(torch::silu(w1_(x)) * w3_(x));
}

// --- Decoder layer ------------------------------------------------------------------------

TransformerBlockImpl::TransformerBlockImpl(const LlamaArgs& args) {
  attention_norm_ = register_module("attention_norm", RMSNorm(args.hidden_size_, args.rms_norm_eps_));
  attention_ = register_module("attention", Attention(args));
  ffn_norm_ = register_module("ffn_norm", RMSNorm(args.hidden_size_, args.rms_norm_eps_));
  feed_forward_ = register_module("feed_forward", FeedForward(args));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                            const torch::Tensor& mask, worker::KVCache* cache,
                                            int64_t layer) {
  auto h = x + attention_(attention_norm_(x), rope, mask, cache, layer);
  return h + feed_forward_(ffn_norm_(h));
}

// --- Causal LM ----------------------------------------------------------------------------

LlamaModel::LlamaModel(const LlamaArgs& args) : args_(args) {
  auto emb_opts = torch::nn::EmbeddingOptions(args.vocab_size_, args.hidden_size_);
  if (args.pad_token_id_.has_value()) emb_opts.padding_idx(*args.pad_token_id_);
  tok_embeddings_ = register_module("tok_embeddings", torch::nn::Embedding(emb_opts));
  {
    torch::NoGradGuard no_grad;
    tok_embeddings_->weight.normal_(0.0, kInitStd);
    if (args.pad_token_id_.has_value()) tok_embeddings_->weight[*args.pad_token_id_].zero_();
  }
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < args.num_hidden_layers_; ++i) layers_->push_back(TransformerBlock(args));
  norm_ = register_module("norm", RMSNorm(args.hidden_size_, args.rms_norm_eps_));
  if (!args.tie_word_embeddings_) {
    output_ = register_module("output", MakeLinear(args.hidden_size_, args.vocab_size_, false));
  }
}

torch::Tensor LlamaModel::Forward(const torch::Tensor& tokens, const torch::Tensor& positions,
                                  worker::KVCache* cache) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
              "tokens must be int64 [B, T], got ", tokens.scalar_type(), " ", tokens.sizes());
  TORCH_CHECK(positions.sizes() == tokens.sizes() && positions.scalar_type() == torch::kLong,
              "positions must be int64 with the shape of tokens ", tokens.sizes(), ", got ",
              positions.scalar_type(), " ", positions.sizes());
  const int64_t t = tokens.size(1);
  const int64_t past = cache != nullptr ? cache->length() : 0;
  const auto device = tokens.device();

  auto h = tok_embeddings_(tokens);  // [B, T, hidden]
  const auto inv_freq = RopeInverseFrequencies(args_.head_dim_, args_.rope_theta_, device);
  const RotaryTables rope = RopeTables(positions, inv_freq, h.scalar_type());
  const auto mask = CausalMask(past, t, device);  // [T, past + T]

  for (size_t i = 0; i < layers_->size(); ++i) {
    h = layers_->at<TransformerBlockImpl>(i).forward(h, rope, mask, cache,
                                                      static_cast<int64_t>(i));
  }
  h = norm_(h);
  auto logits = output_ ? output_(h) : torch::linear(h, tok_embeddings_->weight);
  if (cache != nullptr) cache->Advance(t);
  return logits;
}

std::unique_ptr<worker::KVCache> LlamaModel::NewKVCache(int64_t batch, int64_t max_len) const {
  const auto& w = tok_embeddings_->weight;
  return std::make_unique<worker::KVCache>(args_.num_hidden_layers_, batch,
                                           args_.num_key_value_heads_, max_len, args_.head_dim_,
                                           w.scalar_type(), w.device());
}

}  // namespace gatehouse::models::llama
