// The Mistral family (HF model_type "mistral"): config parsing onto the shared decoder.
//
// Semantics follow transformers 5.24 models/mistral/configuration_mistral.py and
// modeling_mistral.py: Llama's computation without any bias, head_dim as its own field
// (absent or null: hidden_size / num_attention_heads), and one sliding_window for every layer
// (MistralModel builds create_sliding_window_causal_mask when config.sliding_window is set,
// create_causal_mask when it is null; the dataclass default is 4096). A mistral config with
// layer_types is loaded as "ministral" by transformers' AutoConfig (configuration_auto.py), so
// this family rejects it.
#pragma once

#include <memory>

#include "decoder/config_reader.h"
#include "decoder/model.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::mistral {

/// Maps a transformers-saved MistralConfig to a DecoderSpec. Errors: INVALID_ARGUMENT naming
/// the field (and value) for a missing required field, a wrong JSON type, hidden_act other
/// than "silu", an unsupported rope type, a non-positive sliding_window, or layer_types.
Result<DecoderSpec> ParseMistralConfig(ConfigReader& reader);

/// The registration record: family "mistral", model_type "mistral".
std::unique_ptr<worker::ModelFamily> MakeMistralFamily();

}  // namespace gatehouse::models::mistral
