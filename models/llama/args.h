// LlamaArgs: the Llama hyper-parameters, parsed from a transformers-saved config.json.
//
// Semantics follow transformers' LlamaConfig (models/llama/configuration_llama.py) and the RoPE
// standardisation in modeling_rope_utils.py (RotaryEmbeddingConfigMixin), transformers 5.x.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/status.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::llama {

/// Llama hyper-parameters. Construct with ParseLlamaConfig (or fill the fields and call
/// Validate, as tests do for a small "debug" model).
class LlamaArgs : public worker::ModelArgs {
 public:
  int64_t vocab_size_ = 0;
  int64_t hidden_size_ = 0;
  int64_t intermediate_size_ = 0;
  int64_t num_hidden_layers_ = 0;
  int64_t num_attention_heads_ = 0;
  /// Defaults to num_attention_heads (multi-head attention) when absent or null.
  int64_t num_key_value_heads_ = 0;
  /// Defaults to hidden_size / num_attention_heads when absent or null.
  int64_t head_dim_ = 0;
  int64_t max_position_embeddings_ = 0;
  double rms_norm_eps_ = 0.0;
  /// RoPE base. Taken from rope_parameters.rope_theta, else the top-level rope_theta, else
  /// 10000 (transformers' RotaryEmbeddingConfigMixin.default_theta).
  double rope_theta_ = 10000.0;
  /// Where rope_theta came from: "rope_parameters.rope_theta", "rope_scaling.rope_theta",
  /// "rope_theta" (legacy top-level field) or "default".
  std::string rope_theta_source_ = "default";
  /// Only "default" is implemented (plain RoPE, no frequency scaling).
  std::string rope_type_ = "default";
  bool tie_word_embeddings_ = false;
  /// Biases on q/k/v/o projections (LlamaConfig.attention_bias).
  bool attention_bias_ = false;
  /// Biases on gate/up/down projections (LlamaConfig.mlp_bias).
  bool mlp_bias_ = false;
  /// Embedding padding_idx (LlamaConfig.pad_token_id): that row gets no gradient, as in
  /// torch.nn.Embedding. Forward results do not depend on it.
  std::optional<int64_t> pad_token_id_;

  /// Checks positivity and divisibility. Errors: INVALID_ARGUMENT naming the field and value.
  Status Validate() const;

  nlohmann::json ToJson() const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t num_hidden_layers() const override { return num_hidden_layers_; }
  int64_t num_key_value_heads() const override { return num_key_value_heads_; }
  int64_t head_dim() const override { return head_dim_; }
  int64_t max_position_embeddings() const override { return max_position_embeddings_; }
  bool tie_word_embeddings() const override { return tie_word_embeddings_; }
};

/// Maps a transformers-saved LlamaConfig (the parsed config.json object) to LlamaArgs and a
/// report that puts every top-level field in `mapped` or `ignored` (with the reason), or, for
/// fields this family does not know, in `unmapped`.
/// Errors: INVALID_ARGUMENT naming the field (and value) for a missing required field, a wrong
/// JSON type, an invalid value, hidden_act other than "silu", pretraining_tp other than 1, or a
/// rope type other than "default" (in rope_parameters or the legacy rope_scaling).
Result<worker::ParsedConfig> ParseLlamaConfig(const nlohmann::json& config);

}  // namespace gatehouse::models::llama
