// The Qwen3-MoE family (HF model_type "qwen3_moe"): config parsing onto the shared decoder.
//
// Semantics follow transformers 5.24 Qwen3MoeConfig (models/qwen3_moe/configuration_qwen3_moe.py)
// and modeling_qwen3_moe.py: Qwen3 attention (q_norm / k_norm over head_dim before RoPE,
// optional attention_bias on q/k/v/o), RMSNorm w * x, and per layer either a dense SwiGLU MLP
// of intermediate_size or a Qwen3MoeSparseMoeBlock: router logits x W_gate^T, softmax in fp32,
// top num_experts_per_tok experts, optionally renormalised (norm_topk_prob), each expert a
// SwiGLU MLP of moe_intermediate_size, weighted sum. Layer l is sparse when
// l is not in mlp_only_layers and num_experts > 0 and (l + 1) % decoder_sparse_step == 0
// (Qwen3MoeDecoderLayer). A sliding window applies to every layer when use_sliding_window is
// true and sliding_window is set (Qwen3MoeConfig.__post_init__ nulls it otherwise).
//
// Checkpoints: save_pretrained writes each expert's gate/up/down projection under its own key
// (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight) although transformers holds them
// fused as 3-D tensors; Gatehouse holds them as stacked [E, ...] parameters
// (TensorNameRule::num_experts). The saved config.json spells num_experts "num_local_experts"
// (Qwen3MoeConfig.attribute_map); hub configs spell it "num_experts"; both are read.
//
// Training: upstream adds router_aux_loss_coef x the load-balancing loss to the LM loss only
// when output_router_logits is true (Qwen3MoeForCausalLM.forward). Gatehouse's training gate
// computes the LM cross-entropy from the logits alone and CausalLM exposes no router logits, so
// both fields are ignored, with a reason that says which case applies; logits, decode and
// save do not depend on them.
#pragma once

#include <memory>

#include "decoder/config_reader.h"
#include "decoder/model.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::qwen3_moe {

/// Maps a transformers-saved Qwen3MoeConfig to a DecoderSpec. Defaults for absent fields are
/// Qwen3MoeConfig's (num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768,
/// decoder_sparse_step 1, norm_topk_prob false, no mlp_only_layers, rope_theta 10000).
/// Errors: INVALID_ARGUMENT naming the field (and value) for a missing required field, a wrong
/// JSON type, hidden_act other than "silu", an unsupported rope type, num_experts and
/// num_local_experts that disagree, decoder_sparse_step < 1, a non-positive sliding_window, or
/// num_experts_per_tok outside [1, num_experts].
Result<DecoderSpec> ParseQwen3MoeConfig(ConfigReader& reader);

/// The registration record: family "qwen3_moe", model_type "qwen3_moe".
std::unique_ptr<worker::ModelFamily> MakeQwen3MoeFamily();

}  // namespace gatehouse::models::qwen3_moe
