// The Qwen2 family (HF model_type "qwen2"): config parsing onto the shared decoder.
//
// Semantics follow transformers 5.24 models/qwen2/configuration_qwen2.py and modeling_qwen2.py:
// Llama's computation plus biases on q_proj / k_proj / v_proj (none on o_proj or the MLP), and
// sliding-window attention on the layers layer_types marks "sliding_attention". Qwen2Config
// sets sliding_window to None unless use_sliding_window, then derives layer_types when absent:
// "sliding_attention" for layer i >= max_window_layers when a window is set. Eager attention
// honours the window through the mask (create_sliding_window_causal_mask, chosen per layer by
// layer type), a key at k visible from a query at q when q - window < k <= q.
#pragma once

#include <memory>

#include "decoder/config_reader.h"
#include "decoder/model.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::qwen2 {

/// Reads use_sliding_window, sliding_window, max_window_layers and layer_types as
/// Qwen2Config / Qwen3Config do, and sets spec.layers[i].sliding_window (0 = full attention).
/// `spec.layers` must already hold num_hidden_layers entries. Absent fields take the config
/// class defaults (use_sliding_window false, sliding_window 4096, max_window_layers 28).
/// Errors: INVALID_ARGUMENT naming the field for a wrong type, a non-positive window, a
/// layer_types entry of the wrong kind or count, or sliding layers without a window
/// (use_sliding_window false or sliding_window null: transformers raises at the first forward).
Status ParseQwenSlidingWindow(ConfigReader& reader, DecoderSpec& spec);

/// Maps a transformers-saved Qwen2Config to a DecoderSpec. Errors: INVALID_ARGUMENT naming the
/// field (and value) for a missing required field, a wrong JSON type, a null head_dim,
/// hidden_act other than "silu", an unsupported rope type, or a sliding-window setting as
/// ParseQwenSlidingWindow.
Result<DecoderSpec> ParseQwen2Config(ConfigReader& reader);

/// The registration record: family "qwen2", model_type "qwen2".
std::unique_ptr<worker::ModelFamily> MakeQwen2Family();

}  // namespace gatehouse::models::qwen2
