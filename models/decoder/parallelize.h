// The tensor-parallel plan of the shared decoder (every family here): which internal parameter
// is split along which dimension, as a table keyed by parameter path (torchtitan's
// parallelize_module plan, written as data). DecoderModel builds the local shards it describes
// (model.h); the worker shards checkpoint tensors and gathers them back with it.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "decoder/model.h"
#include "gatehouse/worker/tensor_parallel.h"

namespace gatehouse::models {

/// True when the embedding and lm_head are split over the vocabulary at `tp_size` ranks: TP
/// is on and divides vocab_size. Otherwise they are replicated (the plan says so).
bool VocabParallel(const DecoderSpec& spec, int64_t tp_size);

/// The plan at `tp_size` ranks (1 gives the same table, every split trivial):
///   tok_embeddings / output          vocab (dim 0) or replicated
///   wq, wk, wv (weight, bias)         colwise dim 0 (heads);  wqkv: blocks {q, k, v}
///   wo.weight                         rowwise dim 1;          wo.bias replicated
///   w1, w3 (weight, bias)             colwise dim 0;          w13: blocks {gate, up}
///   w2.weight                         rowwise dim 1;          w2.bias replicated
///   moe.experts.w1 / w3 [E, I, H]     colwise dim 1;          moe.experts.w2 [E, H, I] rowwise dim 2
///   norms, q_norm / k_norm, router    replicated (with the reason)
/// Errors: INVALID_ARGUMENT naming the config field and value that tp_size does not divide
/// (num_attention_heads, num_key_value_heads, intermediate_size, moe_intermediate_size), or a
/// tp_size below 1.
Result<worker::TpPlan> DecoderTpPlan(const DecoderSpec& spec, int64_t tp_size);

}  // namespace gatehouse::models
