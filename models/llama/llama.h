// The Llama family (HF model_type "llama"): config parsing onto the shared decoder.
//
// Semantics follow transformers' LlamaConfig (models/llama/configuration_llama.py) and
// modeling_llama.py, transformers 5.x: RMSNorm w * x, RoPE with rope types default / linear /
// dynamic / llama3, grouped-query attention with optional attention_bias (q/k/v/o), SwiGLU MLP
// with optional mlp_bias, optional tied lm_head.
#pragma once

#include <memory>

#include "decoder/config_reader.h"
#include "decoder/model.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::llama {

/// Maps a transformers-saved LlamaConfig to a DecoderSpec. Errors: INVALID_ARGUMENT naming the
/// field (and value) for a missing required field, a wrong JSON type, hidden_act other than
/// "silu", pretraining_tp other than 1, or an unsupported rope type.
Result<DecoderSpec> ParseLlamaConfig(ConfigReader& reader);

/// The registration record: family "llama", model_type "llama".
std::unique_ptr<worker::ModelFamily> MakeLlamaFamily();

}  // namespace gatehouse::models::llama
