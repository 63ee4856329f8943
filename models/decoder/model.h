// The decoder-only transformer every family here is an instance of, in LibTorch.
//
// A family (models/<family>/) maps its config.json to a DecoderSpec and names its tensors; the
// computation lives here once, switched by the spec. Each switch follows an upstream modeling
// file of transformers 5.x:
//   llama    modeling_llama.py    RMSNorm w * x, RoPE (rotate_half), GQA, SwiGLU MLP
//   qwen2    modeling_qwen2.py    q/k/v bias, sliding window on layers >= max_window_layers
//   qwen3    modeling_qwen3.py    q_norm / k_norm (RMSNorm over head_dim) before RoPE
//   mistral  modeling_mistral.py  sliding window on every layer
//   gemma*   modeling_gemma*.py   RMSNorm (1 + w) in fp32, embeddings * sqrt(hidden_size),
//                                 GELU(tanh) MLP, sandwich norms, attention / final logit
//                                 soft-capping, query_pre_attn_scalar, per-layer-type RoPE
//   phi3     modeling_phi3.py     fused qkv_proj and gate_up_proj, partial rotary
//   qwen3_moe modeling_qwen3_moe.py  top-k softmax router and experts held as 3-D tensors
//
// Internal parameter names (torchtitan-style; the right-hand side of every family's name
// table):
//   tok_embeddings.weight, norm.weight, output.weight (absent when tied),
//   layers.{i}.attention_norm.weight, layers.{i}.attention_post_norm.weight (sandwich),
//   layers.{i}.ffn_norm.weight, layers.{i}.ffn_post_norm.weight (sandwich),
//   layers.{i}.attention.{wq,wk,wv,wo}.{weight,bias} or attention.wqkv.{weight,bias} (fused),
//   layers.{i}.attention.{q_norm,k_norm}.weight,
//   layers.{i}.feed_forward.{w1,w2,w3}.{weight,bias} or feed_forward.{w13,w2} (fused),
//   layers.{i}.moe.router.weight [E, hidden],
//   layers.{i}.moe.experts.{w1,w3} [E, moe_intermediate, hidden], moe.experts.w2
//   [E, hidden, moe_intermediate].
//
// Tensor parallelism (a TensorParallel of size > 1; the plan is parallelize.h): the modules
// hold local shards and insert the Megatron mappings (tensor_parallel.h) around them:
// attention heads and MLP / expert intermediate features column-parallel, wo / w2 row-parallel
// (all-reduce, then the bias), vocabulary-parallel embedding and lm_head when tp divides
// vocab_size (else replicated). At size 1 the computation is exactly the plain one.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "decoder/rope.h"
#include "common/status.h"
#include "gatehouse/worker/kv_cache.h"
#include "gatehouse/worker/model_family.h"
#include "gatehouse/worker/tensor_parallel.h"

namespace gatehouse::models {

using worker::ContextParallel;
using worker::ExpertParallel;
using worker::TensorParallel;

/// How RMSNorm applies its weight.
enum class NormKind {
  /// LlamaRMSNorm: normalise in fp32, cast to the input dtype, then weight * x.
  kLlama,
  /// GemmaRMSNorm: normalise and multiply by (1 + weight) in fp32, then cast.
  kGemma,
};

/// MLP activation (hidden_act / hidden_activation).
enum class Activation {
  kSilu,      // "silu"
  kGeluTanh,  // "gelu_pytorch_tanh" (GELU, tanh approximation)
};

/// Per-layer settings.
struct LayerSpec {
  /// 0 = full causal attention; else a query at position q sees keys k with q - k < window
  /// (masking_utils.sliding_window_overlay).
  int64_t sliding_window = 0;
  /// Index into DecoderSpec::ropes.
  int rope = 0;
  /// A sparse MoE block instead of the dense MLP.
  bool moe = false;
};

/// Everything that decides the computation of one decoder model.
struct DecoderSpec {
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  /// Embedding padding_idx: that row gets no gradient (torch.nn.Embedding); no effect forward.
  std::optional<int64_t> pad_token_id;

  Activation hidden_act = Activation::kSilu;
  NormKind norm = NormKind::kLlama;
  bool qkv_bias = false;      // biases on q/k/v projections
  bool o_bias = false;        // bias on the output projection
  bool mlp_bias = false;      // biases on gate/up/down
  bool qk_norm = false;       // q_norm / k_norm over head_dim, before RoPE
  bool sandwich_norm = false; // post-attention and post-feed-forward norms (Gemma 2/3)
  bool fused_qkv = false;     // one wqkv projection: rows q, then k, then v (Phi-3)
  bool fused_gate_up = false; // one w13 projection: rows gate, then up (Phi-3)
  /// Multiply the embeddings by sqrt(hidden_size), rounded to the model dtype (Gemma).
  bool scale_embeddings = false;
  /// Multiplier of q.k^T: head_dim^-0.5, or query_pre_attn_scalar^-0.5 (Gemma 2/3).
  double attention_scaling = 0.0;
  /// tanh soft-capping of attention scores / final logits: cap * tanh(x / cap).
  std::optional<double> attn_logit_softcapping;
  std::optional<double> final_logit_softcapping;

  /// RoPE settings referenced by LayerSpec::rope (at least one).
  std::vector<RopeConfig> ropes;
  /// One entry per layer.
  std::vector<LayerSpec> layers;

  /// Sparse MoE (qwen3_moe): experts, experts per token, expert intermediate size, and whether
  /// the top-k probabilities are renormalised to sum to 1.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;

  /// Positivity, divisibility and consistency. Errors: INVALID_ARGUMENT naming the field.
  Status Validate() const;
  nlohmann::json ToJson() const;
};

/// ModelArgs of every decoder family: a validated DecoderSpec.
class DecoderArgs : public worker::ModelArgs {
 public:
  explicit DecoderArgs(DecoderSpec spec) : spec_(std::move(spec)) {}
  const DecoderSpec& spec() const { return spec_; }

  nlohmann::json ToJson() const override { return spec_.ToJson(); }
  int64_t vocab_size() const override { return spec_.vocab_size; }
  int64_t num_hidden_layers() const override { return spec_.num_hidden_layers; }
  int64_t num_key_value_heads() const override { return spec_.num_key_value_heads; }
  int64_t head_dim() const override { return spec_.head_dim; }
  int64_t max_position_embeddings() const override { return spec_.max_position_embeddings; }
  bool tie_word_embeddings() const override { return spec_.tie_word_embeddings; }
  int64_t min_sliding_window() const override {
    int64_t w = 0;
    for (const auto& layer : spec_.layers) {
      if (layer.sliding_window > 0 && (w == 0 || layer.sliding_window < w)) w = layer.sliding_window;
    }
    return w;
  }

 private:
  DecoderSpec spec_;
};

/// How a DecoderModel makes its parameters: the dtype and device of every one, and whether to
/// draw upstream's fresh-weight init (_init_weights: normal(0, 0.02) for linears and
/// embeddings, zero biases, norms at their identity) or leave them uninitialised because a
/// checkpoint load overwrites them next (worker::SkipWeightInit). Parameters are made where
/// they live: no fp32 CPU copy first.
struct ParamOptions {
  torch::TensorOptions options = torch::TensorOptions().dtype(torch::kFloat32);
  bool init = true;
};

/// RMSNorm over the last dimension, weight [dim] (see NormKind for the two upstream forms).
class RMSNormImpl : public torch::nn::Module {
 public:
  /// `grad_sum`: set (size > 1) when each rank applies the norm to only its own heads (q_norm /
  /// k_norm under TP): the weight's gradient is then summed over the ranks.
  RMSNormImpl(int64_t dim, double eps, NormKind kind, TensorParallel grad_sum = {},
              const ParamOptions& po = {});
  /// x: [..., dim] -> [..., dim], in x's dtype.
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_;
  double eps_;
  NormKind kind_;
  TensorParallel grad_sum_;
};
TORCH_MODULE(RMSNorm);

/// torch.nn.Linear as upstream's Python modules compute it: y = x W^T + b through at::linear,
/// which folds a contiguous [B, T, in] input to 2-D and adds the bias inside the GEMM (addmm).
/// The C++ frontend's torch::nn::Linear instead computes matmul, then adds the bias
/// (torch/nn/functional/linear.h): in bf16 that rounds twice and moves the top-1 of 2-4 % of
/// tokens against transformers' bf16 forward; its constructor also draws a kaiming init in
/// fp32 on the CPU that upstream's _init_weights then replaces. weight [out, in], bias [out]
/// (undefined without bias). x: [..., in] -> [..., out], dtype of the weight.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias, const ParamOptions& po);
  torch::Tensor forward(const torch::Tensor& x) { return torch::linear(x, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(Linear);

/// torch.nn.Embedding's lookup: weight [num_embeddings, dim]; the padding row, when there is
/// one, gets no gradient (padding_idx). tokens [...] int64 -> [..., dim].
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t dim, std::optional<int64_t> padding_idx,
                const ParamOptions& po);
  torch::Tensor forward(const torch::Tensor& tokens) {
    return torch::embedding(weight, tokens, padding_idx_.value_or(-1));
  }
  torch::Tensor weight;

 private:
  std::optional<int64_t> padding_idx_;
};
TORCH_MODULE(Embedding);

/// Self-attention with grouped KV heads (repeat_kv), optional q/k norm, RoPE, sliding window
/// and soft-capping; eager softmax in fp32 (eager_attention_forward).
class AttentionImpl : public torch::nn::Module {
 public:
  /// Under TP this rank holds num_attention_heads / tp.size query heads and
  /// num_key_value_heads / tp.size KV heads.
  AttentionImpl(const DecoderSpec& spec, const TensorParallel& tp, const ParamOptions& po = {});
  /// x: [B, T, hidden]; mask: [T, S] bool, true = may attend (S = cached prefix + T), or
  /// [B, 1, 1, S] for a static step; cache: when non-null, this layer's new K/V are appended
  /// at `layer`, or, when `slots` ([B] int64) is defined, written at row b's slot slots[b]
  /// (KVCache::WriteAt; T must be 1) and S is the cache's max_len. Returns [B, T, hidden].
  /// `cp` (enabled: no cache): x holds this rank's T / cp.size columns of the sequence; q, k
  /// and v go through SequenceToHeads (KV heads repeated first when cp.size does not divide
  /// them), attention runs over the whole sequence (`rope` and `mask` are the whole
  /// sequence's) on this rank's share of the heads, and HeadsToSequence brings the output back.
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope,
                        const torch::Tensor& mask, worker::KVCache* cache, int64_t layer,
                        const torch::Tensor& slots = {},
                        const worker::ContextParallel* cp = nullptr);

 private:
  int64_t num_heads_;
  int64_t num_kv_heads_;
  int64_t head_dim_;
  double scaling_;
  std::optional<double> softcap_;
  TensorParallel tp_;
  Linear wq_{nullptr}, wk_{nullptr}, wv_{nullptr}, wqkv_{nullptr}, wo_{nullptr};
  RMSNorm q_norm_{nullptr}, k_norm_{nullptr};
};
TORCH_MODULE(Attention);

/// Gated MLP: w2(act(w1 x) * w3 x); w1 = gate_proj, w3 = up_proj, w2 = down_proj (or w13 =
/// gate_up_proj, split in halves). x: [B, T, hidden] -> [B, T, hidden].
class FeedForwardImpl : public torch::nn::Module {
 public:
  /// Under TP this rank holds intermediate_size / tp.size features.
  FeedForwardImpl(const DecoderSpec& spec, int64_t intermediate_size, const TensorParallel& tp,
                  const ParamOptions& po = {});
  torch::Tensor forward(const torch::Tensor& x);

 private:
  Activation act_;
  TensorParallel tp_;
  Linear w1_{nullptr}, w2_{nullptr}, w3_{nullptr}, w13_{nullptr};
};
TORCH_MODULE(FeedForward);

/// Sparse MoE block (Qwen3MoeSparseMoeBlock): router logits = x router^T; softmax in fp32;
/// top-k experts; optional renormalisation; each expert is a SwiGLU MLP; outputs weighted and
/// summed in expert order (index_add_), as upstream. x: [B, T, hidden] -> [B, T, hidden].
class MoEImpl : public torch::nn::Module {
 public:
  /// Under TP every rank holds every expert with moe_intermediate_size / tp.size features
  /// (the router is replicated, so every rank routes the same way). Under EP this rank holds
  /// experts [ep.rank * E / ep.size, (ep.rank + 1) * E / ep.size) (the stacked parameters'
  /// dim 0 is E / ep.size): the tokens routed to an expert go to the rank that holds it and
  /// its outputs come back (AllToAllRows), then are weighted and summed where the tokens live.
  /// ep.size must divide num_experts.
  MoEImpl(const DecoderSpec& spec, const TensorParallel& tp, const ParamOptions& po = {},
          const ExpertParallel& ep = {});
  torch::Tensor forward(const torch::Tensor& x);
  /// Tokens routed to each expert since construction or ResetCounts: [E] int64, CPU (a copy).
  torch::Tensor counts() const;
  /// Of those tokens, the ones decided by a near tie (worker::CausalLM::ExpertNearTies).
  int64_t near_ties() const;
  void ResetCounts();

 private:
  /// Local expert `e` (an index into w1_ / w2_ / w3_) on `state` [n, H] -> [n, H].
  torch::Tensor Expert(int64_t e, const torch::Tensor& state) const;
  /// The expert-parallel forward over `expert_in` [N, H] routed by `top_i`, `top_p` [N, k].
  torch::Tensor ExpertParallelForward(const torch::Tensor& expert_in, const torch::Tensor& top_i,
                                      const torch::Tensor& top_p);

  TensorParallel tp_;
  ExpertParallel ep_;
  /// Accumulates counts_ and near_ties_ for one forward's routing (`logits` [N, E], `top_i`
  /// [N, k]), on the routing's device.
  void CountRoutings(const torch::Tensor& logits, const torch::Tensor& top_i);
  torch::Tensor counts_;     // [E] int64 on the routing's device; undefined until a forward
  torch::Tensor near_ties_;  // 0-d int64, the same
  int64_t num_experts_;
  int64_t top_k_;
  bool norm_topk_prob_;
  Activation act_;
  Linear router_{nullptr};
  torch::Tensor w1_, w2_, w3_;  // [E, I, H], [E, H, I], [E, I, H]
};
TORCH_MODULE(MoE);

/// One pre-norm decoder layer (optionally with Gemma 2/3 sandwich norms):
/// h = x + post(attention(attention_norm(x))); out = h + post(mlp(ffn_norm(h))).
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(const DecoderSpec& spec, const LayerSpec& layer, const TensorParallel& tp,
                       const ParamOptions& po = {}, const ExpertParallel& ep = {});
  /// The MoE block, or null for a dense layer.
  MoE moe() const { return moe_; }
  /// As AttentionImpl::forward.
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope,
                        const torch::Tensor& mask, worker::KVCache* cache, int64_t layer,
                        const torch::Tensor& slots = {},
                        const worker::ContextParallel* cp = nullptr);

 private:
  RMSNorm attention_norm_{nullptr}, attention_post_norm_{nullptr};
  Attention attention_{nullptr};
  RMSNorm ffn_norm_{nullptr}, ffn_post_norm_{nullptr};
  FeedForward feed_forward_{nullptr};
  MoE moe_{nullptr};
};
TORCH_MODULE(TransformerBlock);

/// The causal LM. With tie_word_embeddings it registers no `output` parameter and computes
/// logits with tok_embeddings.weight, as upstream's tied lm_head does.
class DecoderModel : public worker::CausalLM {
 public:
  /// Builds the parameters as `po` says (default: fp32 on the CPU, initialised like upstream's
  /// _init_weights). `spec` must be valid. Throws c10::Error. `tp`: this rank's part of a
  /// tensor-parallel model (parameters are the local shards of DecoderTpPlan(spec, tp.size);
  /// Forward still returns full logits on every rank). The plan must be valid for the spec
  /// (DecoderTpPlan returns no error). `ep`: this rank's experts of an expert-parallel
  /// model (MoEImpl); Forward returns the logits of this rank's own tokens.
  explicit DecoderModel(const DecoderSpec& spec, TensorParallel tp = {},
                        const ParamOptions& po = {}, const ExpertParallel& ep = {});

  /// tokens, positions: [B, T] int64. Returns logits [B, T, vocab] in the model dtype.
  /// See worker::CausalLM::Forward for the cache contract. Throws c10::Error on bad shapes or
  /// cache overflow.
  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& positions,
                        worker::KVCache* cache) override;
  std::unique_ptr<worker::KVCache> NewKVCache(int64_t batch, int64_t max_len) const override;
  /// False when a RoPE setting is "dynamic" (its frequencies depend on the running sequence
  /// length) or a layer is MoE (the experts that run are chosen on the host): a captured step
  /// can read neither.
  bool SupportsStaticDecode() const override;
  /// See worker::CausalLM::DecodeStep. Throws c10::Error on bad shapes or dynamic RoPE.
  torch::Tensor DecodeStep(const torch::Tensor& tokens, const torch::Tensor& positions,
                           worker::KVCache& cache) override;

  /// True: every decoder packs (a block-diagonal causal mask; dynamic RoPE per sequence).
  bool SupportsPacked() const override { return true; }
  /// See worker::CausalLM::ForwardPacked. Throws c10::Error on bad shapes or cu_seqlens.
  torch::Tensor ForwardPacked(const torch::Tensor& tokens, const torch::Tensor& positions,
                              const torch::Tensor& cu_seqlens) override;

  /// True: every decoder runs a packed forward over a context-parallel group (Ulysses).
  bool SupportsContextParallel() const override { return true; }
  /// See worker::CausalLM::ForwardPackedContextParallel. The query heads this rank holds
  /// (num_attention_heads / tp) must divide by cp.size. Throws c10::Error on bad shapes,
  /// cu_seqlens or a head count cp.size does not divide.
  torch::Tensor ForwardPackedContextParallel(const torch::Tensor& tokens,
                                             const torch::Tensor& positions,
                                             const torch::Tensor& cu_seqlens,
                                             const worker::ContextParallel& cp) override;

  /// True: any range of the layers runs alone (pipeline stages).
  bool SupportsStages() const override { return true; }
  /// See worker::CausalLM::ForwardStage. A tied embedding goes through the plain lookup and
  /// linear head here (the training path that shares one gradient buffer between them needs
  /// both on one stage). Throws c10::Error on bad shapes or a range outside the layers.
  torch::Tensor ForwardStage(const torch::Tensor& input, const torch::Tensor& positions,
                             int64_t first_layer, int64_t end_layer) override;

  /// [MoE layers, num_experts] counts of each MoE layer (see worker::CausalLM).
  torch::Tensor ExpertTokenCounts() const override;
  int64_t ExpertNearTies() const override;
  void ResetExpertTokenCounts() override;

  const DecoderSpec& spec() const { return spec_; }

 private:
  /// Token embeddings [B, T, hidden] (vocabulary-parallel under TP, scaled for Gemma).
  /// `shared_tied_grad`: a tied embedding in training takes the path whose backward shares one
  /// gradient buffer with the head's (Head must follow on this model).
  torch::Tensor Embed(const torch::Tensor& tokens, bool shared_tied_grad = true);
  /// RoPE tables per RoPE setting and attention masks per sliding window for `positions`
  /// [B, T] after `past` cached positions, in `dtype` on `device`.
  void Tables(const torch::Tensor& positions, int64_t past, torch::ScalarType dtype,
              std::vector<RotaryTables>& ropes, std::map<int64_t, torch::Tensor>& masks) const;
  /// Final norm, lm_head (gathered under TP) and soft-capping: [B, T, hidden] -> logits.
  torch::Tensor Head(const torch::Tensor& h);
  /// The layers over embeddings `h` [B, T, hidden] under `masks` (one per sliding window) and
  /// `ropes` (one per RoPE setting), then the head: what Forward and ForwardPacked share.
  /// `cp`: h holds this rank's columns; masks and ropes are the whole sequence's.
  torch::Tensor Run(torch::Tensor h, const std::vector<RotaryTables>& ropes,
                    const std::map<int64_t, torch::Tensor>& masks, worker::KVCache* cache,
                    const worker::ContextParallel* cp = nullptr);
  /// A packing's masks (block-diagonal causal, per sliding window, [T, T]) and RoPE tables
  /// (dynamic RoPE per sequence) for `positions` [1, T] and `cu_seqlens` [S + 1] (0 first, T
  /// last, checked here), in `dtype` on `positions`' device.
  void PackedTables(const torch::Tensor& positions, const torch::Tensor& cu_seqlens,
                    torch::ScalarType dtype, std::vector<RotaryTables>& ropes,
                    std::map<int64_t, torch::Tensor>& masks) const;

  DecoderSpec spec_;
  TensorParallel tp_;
  bool vocab_parallel_ = false;  // tok_embeddings / output hold vocab_size / tp.size rows
  Embedding tok_embeddings_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  RMSNorm norm_{nullptr};
  Linear output_{nullptr};  // null when tie_word_embeddings
};

}  // namespace gatehouse::models
