#include "llama/state_dict_adapter.h"

#include <array>

namespace gatehouse::models::llama {
namespace {

/// When a row of the table applies.
enum class RowWhen {
  kAlways,
  kAttentionBias,  // LlamaConfig.attention_bias: q/k/v/o_proj have biases
  kMlpBias,        // LlamaConfig.mlp_bias: gate/up/down_proj have biases
};

struct Row {
  const char* hf;
  const char* internal;
  bool per_layer;
  RowWhen when;
};

/// The Llama name table, in module order. "{layer}" expands over [0, num_hidden_layers).
constexpr std::array kLlamaTable = {
    Row{"model.embed_tokens.weight", "tok_embeddings.weight", false, RowWhen::kAlways},
    Row{"model.layers.{layer}.input_layernorm.weight", "layers.{layer}.attention_norm.weight", true,
        RowWhen::kAlways},
    Row{"model.layers.{layer}.self_attn.q_proj.weight", "layers.{layer}.attention.wq.weight", true,
        RowWhen::kAlways},
    Row{"model.layers.{layer}.self_attn.k_proj.weight", "layers.{layer}.attention.wk.weight", true,
        RowWhen::kAlways},
    Row{"model.layers.{layer}.self_attn.v_proj.weight", "layers.{layer}.attention.wv.weight", true,
        RowWhen::kAlways},
    Row{"model.layers.{layer}.self_attn.o_proj.weight", "layers.{layer}.attention.wo.weight", true,
        RowWhen::kAlways},
    Row{"model.layers.{layer}.self_attn.q_proj.bias", "layers.{layer}.attention.wq.bias", true,
        RowWhen::kAttentionBias},
    Row{"model.layers.{layer}.self_attn.k_proj.bias", "layers.{layer}.attention.wk.bias", true,
        RowWhen::kAttentionBias},
    Row{"model.layers.{layer}.self_attn.v_proj.bias", "layers.{layer}.attention.wv.bias", true,
        RowWhen::kAttentionBias},
    Row{"model.layers.{layer}.self_attn.o_proj.bias", "layers.{layer}.attention.wo.bias", true,
        RowWhen::kAttentionBias},
    Row{"model.layers.{layer}.post_attention_layernorm.weight", "layers.{layer}.ffn_norm.weight",
        true, RowWhen::kAlways},
    Row{"model.layers.{layer}.mlp.gate_proj.weight", "layers.{layer}.feed_forward.w1.weight", true,
        RowWhen::kAlways},
    Row{"model.layers.{layer}.mlp.down_proj.weight", "layers.{layer}.feed_forward.w2.weight", true,
        RowWhen::kAlways},
    Row{"model.layers.{layer}.mlp.up_proj.weight", "layers.{layer}.feed_forward.w3.weight", true,
        RowWhen::kAlways},
    Row{"model.layers.{layer}.mlp.gate_proj.bias", "layers.{layer}.feed_forward.w1.bias", true,
        RowWhen::kMlpBias},
    Row{"model.layers.{layer}.mlp.down_proj.bias", "layers.{layer}.feed_forward.w2.bias", true,
        RowWhen::kMlpBias},
    Row{"model.layers.{layer}.mlp.up_proj.bias", "layers.{layer}.feed_forward.w3.bias", true,
        RowWhen::kMlpBias},
    Row{"model.norm.weight", "norm.weight", false, RowWhen::kAlways},
    Row{kLmHeadHfName, "output.weight", false, RowWhen::kAlways},
};

bool Applies(RowWhen when, const LlamaArgs& args) {
  switch (when) {
    case RowWhen::kAlways:
      return true;
    case RowWhen::kAttentionBias:
      return args.attention_bias_;
    case RowWhen::kMlpBias:
      return args.mlp_bias_;
  }
  return false;
}

}  // namespace

std::vector<worker::TensorNameRule> LlamaNameRules(const LlamaArgs& args) {
  std::vector<worker::TensorNameRule> rules;
  for (const Row& row : kLlamaTable) {
    if (Applies(row.when, args)) rules.push_back({row.hf, row.internal, row.per_layer});
  }
  return rules;
}

Result<worker::StateDictAdapter> MakeLlamaAdapter(const LlamaArgs& args) {
  return worker::StateDictAdapter::Create(LlamaNameRules(args), args.num_hidden_layers_,
                                          args.tie_word_embeddings_, kLmHeadHfName);
}

}  // namespace gatehouse::models::llama
