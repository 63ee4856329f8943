// The Gemma 2 family (HF model_type "gemma2"): config parsing onto the shared decoder.
//
// Semantics follow transformers 5.24 models/gemma2/configuration_gemma2.py (Gemma2Config) and
// modeling_gemma2.py. Besides Gemma's (1 + w) RMSNorm, scaled embeddings and tied lm_head
// (models/gemma/gemma.h):
//   Gemma2MLP            activation from hidden_activation (hidden_act is never read);
//   Gemma2DecoderLayer   sandwich norms: post_attention_layernorm after attention,
//                        pre_feedforward_layernorm / post_feedforward_layernorm around the MLP;
//   Gemma2Attention      scaling query_pre_attn_scalar^-0.5 (default 256); scores soft-capped
//                        as cap * tanh(s / cap) with attn_logit_softcapping (default 50) before
//                        the mask; "sliding_attention" layers see the last sliding_window keys
//                        (default 4096; layer_types default alternates sliding, full, ...);
//   Gemma2ForCausalLM    logits soft-capped with final_logit_softcapping (default 30).
// An absent softcapping field takes the default, an explicit null disables capping.
#pragma once

#include <memory>

#include "decoder/config_reader.h"
#include "decoder/model.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::gemma2 {

/// Maps a transformers-saved Gemma2Config to a DecoderSpec. Errors: INVALID_ARGUMENT naming the
/// field (and value) for a missing required field (including head_dim and
/// num_key_value_heads), a wrong JSON type, hidden_activation other than "gelu_pytorch_tanh",
/// a bad layer_types entry, a sliding layer without a positive sliding_window,
/// use_bidirectional_attention true, partial_rotary_factor other than 1, non-positive
/// soft-capping or query_pre_attn_scalar, or an unsupported rope type.
Result<DecoderSpec> ParseGemma2Config(ConfigReader& reader);

/// The registration record: family "gemma2", model_type "gemma2".
std::unique_ptr<worker::ModelFamily> MakeGemma2Family();

}  // namespace gatehouse::models::gemma2
