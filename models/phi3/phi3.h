// The Phi-3 family (HF model_type "phi3"): config parsing onto the shared decoder.
//
// Semantics follow transformers 5.24 Phi3Config (models/phi3/configuration_phi3.py) and
// modeling_phi3.py: Llama-style decoder (RMSNorm w * x, grouped-query attention, SwiGLU) with
//  - one fused qkv_proj [q; k; v] rows (Phi3Attention: q = first num_heads * head_dim rows,
//    then k, then v) and one fused gate_up_proj [gate; up] rows (Phi3MLP: chunk(2) gives gate
//    first), both kept fused inside (DecoderSpec::fused_qkv / fused_gate_up), no biases;
//  - partial rotary embedding: rope_parameters.partial_rotary_factor (or the top-level
//    partial_rotary_factor, which Phi3Config.convert_rope_params_to_dict copies in) rotates the
//    first int(head_dim * factor) channels of each head;
//  - sliding_window (when not null) on every layer (Phi3Model uses the sliding-window mask).
// Phi3Config accepts rope types "default" and "longrope" (legacy "su" / "yarn" become
// "longrope"); LongRoPE (short_factor / long_factor, original_max_position_embeddings) is not
// implemented and is rejected, so is any other type. resid_pdrop / embd_pdrop are dropout
// probabilities (embd_pdrop is not even read by modeling_phi3.py); Gatehouse runs without
// dropout, as upstream does in eval mode.
#pragma once

#include <memory>

#include "decoder/config_reader.h"
#include "decoder/model.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::phi3 {

/// Maps a transformers-saved Phi3Config to a DecoderSpec. pad_token_id defaults to 32000 when
/// absent (Phi3Config's default; the embedding's padding_idx). Errors: INVALID_ARGUMENT naming
/// the field (and value) for a missing required field, a wrong JSON type, hidden_act other
/// than "silu", a rope type other than "default" (longrope named as not implemented), a
/// partial_rotary_factor outside (0, 1] or giving an odd rotary dimension, or a non-positive
/// sliding_window.
Result<DecoderSpec> ParsePhi3Config(ConfigReader& reader);

/// The registration record: family "phi3", model_type "phi3".
std::unique_ptr<worker::ModelFamily> MakePhi3Family();

}  // namespace gatehouse::models::phi3
