// The Qwen3 family (HF model_type "qwen3"): config parsing onto the shared decoder.
//
// Semantics follow transformers 5.24 models/qwen3/configuration_qwen3.py and modeling_qwen3.py:
// Llama's computation plus q_norm / k_norm (RMSNorm over head_dim, per head, before RoPE),
// optional attention_bias on q/k/v/o, head_dim as its own field (Qwen3Config default 128, not
// hidden_size / num_attention_heads), and Qwen2's sliding-window flags (use_sliding_window,
// sliding_window, max_window_layers, layer_types; see qwen2.h).
#pragma once

#include <memory>

#include "decoder/config_reader.h"
#include "decoder/model.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::qwen3 {

/// Maps a transformers-saved Qwen3Config to a DecoderSpec. An absent head_dim is 128 (the
/// config class default). Errors: INVALID_ARGUMENT naming the field (and value) for a missing
/// required field, a wrong JSON type, a null head_dim, hidden_act other than "silu", an
/// unsupported rope type, or a sliding-window setting as qwen2::ParseQwenSlidingWindow.
Result<DecoderSpec> ParseQwen3Config(ConfigReader& reader);

/// The registration record: family "qwen3", model_type "qwen3".
std::unique_ptr<worker::ModelFamily> MakeQwen3Family();

}  // namespace gatehouse::models::qwen3
