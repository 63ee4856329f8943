// The Llama decoder in LibTorch: modules and forward only (no checkpoint names, no
// parallelism). Semantics follow transformers' models/llama/modeling_llama.py (5.x):
// LlamaRMSNorm, LlamaRotaryEmbedding + apply_rotary_pos_emb (rotate_half convention, so HF
// q/k weights need no permutation), LlamaAttention with repeat_kv and eager attention,
// LlamaMLP (SwiGLU), pre-norm LlamaDecoderLayer, LlamaForCausalLM with optional tied lm_head.
//
// Parameter names are torchtitan-style (the internal side of the name table):
//   tok_embeddings.weight, layers.{i}.attention_norm.weight,
//   layers.{i}.attention.{wq,wk,wv,wo}.{weight,bias}, layers.{i}.ffn_norm.weight,
//   layers.{i}.feed_forward.{w1,w2,w3}.{weight,bias}, norm.weight, output.weight.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "gatehouse/worker/kv_cache.h"
#include "gatehouse/worker/model_family.h"
#include "llama/args.h"

namespace gatehouse::models::llama {

/// Root-mean-square norm (LlamaRMSNorm): computes in fp32, casts back to the input dtype, then
/// multiplies by `weight` [dim].
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  /// x: [..., dim] -> [..., dim].
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_;
  double eps_;
};
TORCH_MODULE(RMSNorm);

/// Rotary position embedding tables for the "default" rope type
/// (LlamaRotaryEmbedding.compute_default_rope_parameters / forward).
struct RotaryTables {
  /// [B, T, head_dim], in the model dtype (computed in fp32, then cast, as upstream).
  torch::Tensor cos;
  torch::Tensor sin;
};

/// inv_freq[j] = 1 / theta^(2j / head_dim), j in [0, head_dim/2); fp32 [head_dim/2].
torch::Tensor RopeInverseFrequencies(int64_t head_dim, double theta, torch::Device device);
/// cos/sin of positions [B, T] (int64) times inv_freq, duplicated to [B, T, head_dim].
RotaryTables RopeTables(const torch::Tensor& positions, const torch::Tensor& inv_freq,
                        torch::Dtype dtype);
/// x * cos + rotate_half(x) * sin for x [B, H, T, head_dim] and tables [B, T, head_dim].
torch::Tensor ApplyRotary(const torch::Tensor& x, const RotaryTables& rope);

/// Grouped-query self-attention (LlamaAttention, eager attention interface).
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaArgs& args);
  /// x: [B, T, hidden]; mask: [T, S] bool, true = may attend (S = cached prefix + T);
  /// cache: when non-null, this layer's new K/V are appended at `layer`. Returns [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope,
                        const torch::Tensor& mask, worker::KVCache* cache, int64_t layer);

 private:
  int64_t num_heads_;
  int64_t num_kv_heads_;
  int64_t head_dim_;
  double scaling_;
  torch::nn::Linear wq_{nullptr}, wk_{nullptr}, wv_{nullptr}, wo_{nullptr};
};
TORCH_MODULE(Attention);

/// SwiGLU MLP (LlamaMLP): w2(silu(w1(x)) * w3(x)); w1 = gate_proj, w3 = up_proj,
/// w2 = down_proj. x: [B, T, hidden] -> [B, T, hidden].
class FeedForwardImpl : public torch::nn::Module {
 public:
  explicit FeedForwardImpl(const LlamaArgs& args);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Linear w1_{nullptr}, w2_{nullptr}, w3_{nullptr};
};
TORCH_MODULE(FeedForward);

/// Pre-norm decoder layer (LlamaDecoderLayer):
/// h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)).
class TransformerBlockImpl : public torch::nn::Module {
 public:
  explicit TransformerBlockImpl(const LlamaArgs& args);
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope,
                        const torch::Tensor& mask, worker::KVCache* cache, int64_t layer);

 private:
  RMSNorm attention_norm_{nullptr};
  Attention attention_{nullptr};
  RMSNorm ffn_norm_{nullptr};
  FeedForward feed_forward_{nullptr};
};
TORCH_MODULE(TransformerBlock);

/// LlamaForCausalLM. With tie_word_embeddings the model registers no `output` parameter and
/// computes logits with tok_embeddings.weight, as upstream's tied lm_head does.
class LlamaModel : public worker::CausalLM {
 public:
  /// Builds fp32 CPU parameters initialised like upstream's _init_weights (normal(0, 0.02)
  /// for linears and embeddings, zeros for biases, ones for norms). Throws c10::Error.
  explicit LlamaModel(const LlamaArgs& args);

  /// tokens, positions: [B, T] int64. Returns logits [B, T, vocab] in the model dtype.
  /// See worker::CausalLM::Forward for the cache contract. Throws c10::Error on bad shapes or
  /// cache overflow.
  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& positions,
                        worker::KVCache* cache) override;
  std::unique_ptr<worker::KVCache> NewKVCache(int64_t batch, int64_t max_len) const override;

  const LlamaArgs& args() const { return args_; }

 private:
  LlamaArgs args_;
  torch::nn::Embedding tok_embeddings_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  RMSNorm norm_{nullptr};
  torch::nn::Linear output_{nullptr};  // null when tie_word_embeddings
};

}  // namespace gatehouse::models::llama
