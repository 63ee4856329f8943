// A tiny DecoderSpec for the decoder's per-source tests, and the transformers config.json that
// describes the same model, so one case can be built here and upstream alike.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "decoder/model.h"

namespace gatehouse::test_util {

/// Llama-shaped: vocab 64, hidden 32, intermediate 64, 2 layers, 4 heads over 2 KV heads of
/// head_dim 8, plain RoPE (theta 10000), untied, fp32 on the CPU. Tests switch features on.
inline models::DecoderSpec TinySpec() {
  models::DecoderSpec spec;
  spec.model_type = "llama";
  spec.vocab_size = 64;
  spec.hidden_size = 32;
  spec.intermediate_size = 64;
  spec.num_hidden_layers = 2;
  spec.num_attention_heads = 4;
  spec.num_key_value_heads = 2;
  spec.head_dim = 8;
  spec.max_position_embeddings = 64;
  spec.rms_norm_eps = 1e-6;
  spec.attention_scaling = 1.0 / std::sqrt(8.0);
  spec.ropes = {models::RopeConfig{}};
  spec.layers.assign(2, models::LayerSpec{});
  return spec;
}

/// The config.json fields of TinySpec() that every family's config class reads (model_type
/// and the feature flags are the caller's). Token ids are null so that no id falls outside the
/// tiny vocabulary.
inline nlohmann::json TinyConfig() {
  return {{"vocab_size", 64},          {"hidden_size", 32},       {"intermediate_size", 64},
          {"num_hidden_layers", 2},    {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"head_dim", 8},             {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},      {"tie_word_embeddings", false},
          {"pad_token_id", nullptr},   {"bos_token_id", nullptr},  {"eos_token_id", nullptr}};
}

}  // namespace gatehouse::test_util
