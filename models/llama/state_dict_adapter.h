// The Llama HF <-> internal tensor-name table, as data.
//
// HF names are those transformers' LlamaForCausalLM.save_pretrained writes (5.x); internal
// names are LlamaModel's parameters (model.h). Llama needs no layout fix: transformers' RoPE
// uses the rotate_half convention, as LlamaModel does, so q_proj/k_proj need no permutation.
#pragma once

#include <vector>

#include "common/status.h"
#include "gatehouse/worker/state_dict_adapter.h"
#include "llama/args.h"

namespace gatehouse::models::llama {

/// The HF name of the output projection, absent from tied checkpoints.
inline constexpr const char* kLmHeadHfName = "lm_head.weight";

/// The rows of the name table that apply to `args` (bias rows only when attention_bias /
/// mlp_bias is set). The lm_head row is always included; StateDictAdapter::Create drops it for
/// a tied model.
std::vector<worker::TensorNameRule> LlamaNameRules(const LlamaArgs& args);

/// The adapter for `args`. Errors: INVALID_ARGUMENT if the table maps a name twice (a bug).
Result<worker::StateDictAdapter> MakeLlamaAdapter(const LlamaArgs& args);

}  // namespace gatehouse::models::llama
