// The Gemma 3 text family (HF model_type "gemma3_text", Gemma3ForCausalLM): config parsing onto
// the shared decoder.
//
// Semantics follow transformers 5.24 models/gemma3/configuration_gemma3.py (Gemma3TextConfig)
// and modeling_gemma3.py (Gemma3TextModel, Gemma3ForCausalLM). As Gemma 2 (models/gemma2/
// gemma2.h: sandwich norms, query_pre_attn_scalar, sliding layers, final logit soft-capping),
// with these differences:
//   Gemma3Attention       q_norm / k_norm (Gemma3RMSNorm, x * (1 + w), over head_dim) on the
//                         projected queries and keys, before RoPE; attn_logit_softcapping is
//                         NOT passed to the attention function, so scores are never capped
//                         (the field is accounted as ignored);
//   Gemma3TextConfig      defaults: no soft-capping, layer_types from sliding_window_pattern
//                         (default 6: layer i slides unless (i + 1) % 6 == 0);
//   Gemma3RotaryEmbedding one RoPE per layer type. rope_parameters is keyed by
//                         "full_attention" / "sliding_attention"; convert_rope_params_to_dict
//                         fills a missing entry with {"rope_type": "default"}, merges a legacy
//                         rope_scaling into "full_attention", and takes a missing rope_theta from
//                         the legacy top-level rope_theta (full) / rope_local_base_freq
//                         (sliding), else default_theta 1e6 (global) / 1e4 (local).
#pragma once

#include <memory>

#include "decoder/config_reader.h"
#include "decoder/model.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::gemma3 {

/// Maps a transformers-saved Gemma3TextConfig to a DecoderSpec; ropes[0] is the
/// "full_attention" RoPE, ropes[1] the "sliding_attention" one. Errors: INVALID_ARGUMENT naming
/// the field (and value) for a missing required field (including head_dim and
/// num_key_value_heads), a wrong JSON type, hidden_activation other than "gelu_pytorch_tanh",
/// a bad layer_types entry or sliding_window_pattern, a sliding layer without a positive
/// sliding_window, use_bidirectional_attention true, a rope_parameters key other than the two
/// layer types, partial_rotary_factor other than 1, non-positive final_logit_softcapping or
/// query_pre_attn_scalar, or an unsupported rope type.
Result<DecoderSpec> ParseGemma3TextConfig(ConfigReader& reader);

/// The registration record: family "gemma3", model_type "gemma3_text".
std::unique_ptr<worker::ModelFamily> MakeGemma3Family();

}  // namespace gatehouse::models::gemma3
