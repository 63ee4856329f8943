// The HF <-> internal tensor-name table of the decoder families, as data.
//
// HF names are those transformers' *ForCausalLM.save_pretrained writes (5.x); internal names
// are DecoderModel's parameters (model.h). One table serves every family: each row says when
// it applies (a DecoderSpec feature), so a family's table is the rows its spec switches on.
// No layout fix is needed: transformers' RoPE uses the rotate_half convention, as DecoderModel
// does, so q_proj/k_proj need no permutation.
#pragma once

#include <vector>

#include "decoder/model.h"
#include "common/status.h"
#include "gatehouse/worker/state_dict_adapter.h"

namespace gatehouse::models {

/// The HF name of the output projection, absent from tied checkpoints.
inline constexpr const char* kLmHeadHfName = "lm_head.weight";

/// The rows that apply to `spec`, with "{layer}" already expanded (layers may differ: dense or
/// MoE) and "{expert}" left for the adapter (TensorNameRule::num_experts). The lm_head row is
/// always included; StateDictAdapter::Create drops it for a tied model.
std::vector<worker::TensorNameRule> DecoderNameRules(const DecoderSpec& spec);

/// The adapter for `spec`. Errors: INVALID_ARGUMENT if the table maps a name twice (a bug).
Result<worker::StateDictAdapter> MakeDecoderAdapter(const DecoderSpec& spec);

}  // namespace gatehouse::models
