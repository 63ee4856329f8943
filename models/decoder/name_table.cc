#include "decoder/name_table.h"

#include <array>
#include <string>

namespace gatehouse::models {
namespace {

/// When a row applies.
enum class When {
  kAlways,
  kSplitQkv,        // separate q/k/v projections
  kSplitQkvBias,    //   ... with biases (qwen2, llama attention_bias)
  kFusedQkv,        // one qkv_proj (phi3)
  kFusedQkvBias,
  kOBias,           // o_proj bias (llama attention_bias)
  kQkNorm,          // q_norm / k_norm (qwen3, gemma3)
  kPreNormOnly,     // post_attention_layernorm is the pre-MLP norm (llama, qwen, mistral, gemma)
  kSandwich,        // gemma2/3: post_attention_layernorm is a real post-norm
  kDenseSplit,      // dense layer, separate gate/up
  kDenseSplitBias,
  kDenseFused,      // dense layer, one gate_up_proj (phi3)
  kDenseFusedBias,
  kDenseDownBias,
  kMoe,             // sparse MoE layer (qwen3_moe)
};

struct Row {
  const char* hf;
  const char* internal;
  When when;
  bool per_expert = false;
};

/// The per-layer rows, in module order. "{layer}" expands over the layers, "{expert}" over the
/// experts. Before them comes model.embed_tokens.weight -> tok_embeddings.weight; after them
/// model.norm.weight -> norm.weight and lm_head.weight -> output.weight.
constexpr std::array kLayerTable = {
    Row{"model.layers.{layer}.input_layernorm.weight", "layers.{layer}.attention_norm.weight", When::kAlways},
    Row{"model.layers.{layer}.self_attn.q_proj.weight", "layers.{layer}.attention.wq.weight", When::kSplitQkv},
    Row{"model.layers.{layer}.self_attn.k_proj.weight", "layers.{layer}.attention.wk.weight", When::kSplitQkv},
    Row{"model.layers.{layer}.self_attn.v_proj.weight", "layers.{layer}.attention.wv.weight", When::kSplitQkv},
    Row{"model.layers.{layer}.self_attn.q_proj.bias", "layers.{layer}.attention.wq.bias",
        When::kSplitQkvBias},
    Row{"model.layers.{layer}.self_attn.k_proj.bias", "layers.{layer}.attention.wk.bias",
        When::kSplitQkvBias},
    Row{"model.layers.{layer}.self_attn.v_proj.bias", "layers.{layer}.attention.wv.bias",
        When::kSplitQkvBias},
    Row{"model.layers.{layer}.self_attn.qkv_proj.weight", "layers.{layer}.attention.wqkv.weight", When::kFusedQkv},
    Row{"model.layers.{layer}.self_attn.qkv_proj.bias", "layers.{layer}.attention.wqkv.bias", When::kFusedQkvBias},
    Row{"model.layers.{layer}.self_attn.q_norm.weight", "layers.{layer}.attention.q_norm.weight", When::kQkNorm},
    Row{"model.layers.{layer}.self_attn.k_norm.weight", "layers.{layer}.attention.k_norm.weight", When::kQkNorm},
    Row{"model.layers.{layer}.self_attn.o_proj.weight", "layers.{layer}.attention.wo.weight", When::kAlways},
    Row{"model.layers.{layer}.self_attn.o_proj.bias", "layers.{layer}.attention.wo.bias",
        When::kOBias},
    Row{"model.layers.{layer}.post_attention_layernorm.weight", "layers.{layer}.ffn_norm.weight", When::kPreNormOnly},
    Row{"model.layers.{layer}.post_attention_layernorm.weight",
        "layers.{layer}.attention_post_norm.weight", When::kSandwich},
    Row{"model.layers.{layer}.pre_feedforward_layernorm.weight", "layers.{layer}.ffn_norm.weight", When::kSandwich},
    Row{"model.layers.{layer}.mlp.gate_proj.weight", "layers.{layer}.feed_forward.w1.weight", When::kDenseSplit},
    Row{"model.layers.{layer}.mlp.up_proj.weight", "layers.{layer}.feed_forward.w3.weight",
        When::kDenseSplit},
    Row{"model.layers.{layer}.mlp.gate_proj.bias", "layers.{layer}.feed_forward.w1.bias",
        When::kDenseSplitBias},
    Row{"model.layers.{layer}.mlp.up_proj.bias", "layers.{layer}.feed_forward.w3.bias",
        When::kDenseSplitBias},
    Row{"model.layers.{layer}.mlp.gate_up_proj.weight", "layers.{layer}.feed_forward.w13.weight", When::kDenseFused},
    Row{"model.layers.{layer}.mlp.gate_up_proj.bias", "layers.{layer}.feed_forward.w13.bias", When::kDenseFusedBias},
    Row{"model.layers.{layer}.mlp.down_proj.weight", "layers.{layer}.feed_forward.w2.weight", When::kDenseSplit},
    Row{"model.layers.{layer}.mlp.down_proj.weight", "layers.{layer}.feed_forward.w2.weight", When::kDenseFused},
    Row{"model.layers.{layer}.mlp.down_proj.bias", "layers.{layer}.feed_forward.w2.bias",
        When::kDenseDownBias},
    Row{"model.layers.{layer}.mlp.gate.weight", "layers.{layer}.moe.router.weight",
        When::kMoe},
    Row{"model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight",
        "layers.{layer}.moe.experts.w1", When::kMoe, true},
    Row{"model.layers.{layer}.mlp.experts.{expert}.up_proj.weight",
        "layers.{layer}.moe.experts.w3", When::kMoe, true},
    Row{"model.layers.{layer}.mlp.experts.{expert}.down_proj.weight",
        "layers.{layer}.moe.experts.w2", When::kMoe, true},
    Row{"model.layers.{layer}.post_feedforward_layernorm.weight",
        "layers.{layer}.ffn_post_norm.weight", When::kSandwich},
};

bool Applies(When when, const DecoderSpec& s, const LayerSpec& layer) {
  const bool dense = !layer.moe;
  switch (when) {
    case When::kAlways: return true;
    case When::kSplitQkv: return !s.fused_qkv;
    case When::kSplitQkvBias: return !s.fused_qkv && s.qkv_bias;
    case When::kFusedQkv: return s.fused_qkv;
    case When::kFusedQkvBias: return s.fused_qkv && s.qkv_bias;
    case When::kOBias: return s.o_bias;
    case When::kQkNorm: return s.qk_norm;
    case When::kPreNormOnly: return !s.sandwich_norm;
    case When::kSandwich: return s.sandwich_norm;
    case When::kDenseSplit: return dense && !s.fused_gate_up;
    case When::kDenseSplitBias: return dense && !s.fused_gate_up && s.mlp_bias;
    case When::kDenseFused: return dense && s.fused_gate_up;
    case When::kDenseFusedBias: return dense && s.fused_gate_up && s.mlp_bias;
    case When::kDenseDownBias: return dense && s.mlp_bias;
    case When::kMoe: return layer.moe;
  }
  return false;
}

std::string ExpandLayer(std::string tmpl, int64_t layer) {
  static const std::string kKey = "{layer}";
  for (size_t pos = tmpl.find(kKey); pos != std::string::npos; pos = tmpl.find(kKey, pos)) {
    tmpl.replace(pos, kKey.size(), std::to_string(layer));
  }
  return tmpl;
}

}  // namespace

std::vector<worker::TensorNameRule> DecoderNameRules(const DecoderSpec& spec) {
  std::vector<worker::TensorNameRule> rules;
  rules.push_back({"model.embed_tokens.weight", "tok_embeddings.weight", false});
  for (int64_t l = 0; l < static_cast<int64_t>(spec.layers.size()); ++l) {
    for (const Row& row : kLayerTable) {
      if (!Applies(row.when, spec, spec.layers[l])) continue;
      worker::TensorNameRule rule{ExpandLayer(row.hf, l), ExpandLayer(row.internal, l), false};
      if (row.per_expert) rule.num_experts = spec.num_experts;
      rules.push_back(std::move(rule));
    }
  }
  rules.push_back({"model.norm.weight", "norm.weight", false});
  rules.push_back({kLmHeadHfName, "output.weight", false});
  return rules;
}

Result<worker::StateDictAdapter> MakeDecoderAdapter(const DecoderSpec& spec) {
  return worker::StateDictAdapter::Create(DecoderNameRules(spec), spec.num_hidden_layers,
                                          spec.tie_word_embeddings, kLmHeadHfName);
}

}  // namespace gatehouse::models
