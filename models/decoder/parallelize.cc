#include "decoder/parallelize.h"

#include <string>
#include <utility>
#include <vector>

namespace gatehouse::models {
namespace {

using worker::ShardRule;
using worker::ShardStyle;

Status Divisible(std::string_view field, int64_t value, int64_t tp) {
  if (value % tp == 0) return Status::Ok();
  return Status::InvalidArgument("config field '" + std::string(field) + "' = " +
                                 std::to_string(value) +
                                 " is not divisible by the tensor-parallel size " +
                                 std::to_string(tp));
}

}  // namespace

bool VocabParallel(const DecoderSpec& spec, int64_t tp_size) {
  return tp_size > 1 && spec.vocab_size % tp_size == 0;
}

Result<worker::TpPlan> DecoderTpPlan(const DecoderSpec& spec, int64_t tp) {
  if (tp < 1) {
    return Status::InvalidArgument("tensor-parallel size " + std::to_string(tp) +
                                   " must be at least 1");
  }
  GH_RETURN_IF_ERROR(Divisible("num_attention_heads", spec.num_attention_heads, tp));
  GH_RETURN_IF_ERROR(Divisible("num_key_value_heads", spec.num_key_value_heads, tp));
  bool any_dense = false, any_moe = false;
  for (const auto& l : spec.layers) (l.moe ? any_moe : any_dense) = true;
  if (any_dense) GH_RETURN_IF_ERROR(Divisible("intermediate_size", spec.intermediate_size, tp));
  if (any_moe) {
    GH_RETURN_IF_ERROR(Divisible("moe_intermediate_size", spec.moe_intermediate_size, tp));
  }

  const int64_t q_out = spec.num_attention_heads * spec.head_dim;
  const int64_t kv_out = spec.num_key_value_heads * spec.head_dim;
  const std::string replicated_norm = "RMSNorm over hidden_size: the residual stream is replicated";
  std::vector<ShardRule> rules;
  auto add = [&rules](std::string pattern, ShardStyle style, int64_t dim,
                      std::vector<int64_t> blocks = {}, std::string note = {}) {
    rules.push_back({std::move(pattern), style, dim, std::move(blocks), std::move(note)});
  };
  if (VocabParallel(spec, tp)) {
    add("tok_embeddings.weight", ShardStyle::kVocab, 0, {},
        "vocabulary-parallel: out-of-range ids give 0, partial embeddings summed");
    add("output.weight", ShardStyle::kVocab, 0, {}, "column-parallel over the vocabulary; logits gathered");
  } else {
    const std::string why = tp == 1 ? "tp = 1" : "vocab_size " + std::to_string(spec.vocab_size) +
                                                     " is not divisible by tp " + std::to_string(tp);
    add("tok_embeddings.weight", ShardStyle::kReplicated, 0, {}, "replicated: " + why);
    add("output.weight", ShardStyle::kReplicated, 0, {}, "replicated: " + why);
  }
  add("norm.weight", ShardStyle::kReplicated, 0, {}, replicated_norm);
  for (const char* norm : {"attention_norm", "attention_post_norm", "ffn_norm", "ffn_post_norm"}) {
    add("layers.{i}." + std::string(norm) + ".weight", ShardStyle::kReplicated, 0, {},
        replicated_norm);
  }
  for (const char* p : {"wq", "wk", "wv"}) {
    for (const char* t : {"weight", "bias"}) {
      add("layers.{i}.attention." + std::string(p) + "." + t, ShardStyle::kColwise, 0, {},
          "column-parallel: attention heads");
    }
  }
  for (const char* t : {"weight", "bias"}) {
    add("layers.{i}.attention.wqkv." + std::string(t), ShardStyle::kColwise, 0,
        {q_out, kv_out, kv_out}, "column-parallel per block: q heads, k heads, v heads");
  }
  add("layers.{i}.attention.wo.weight", ShardStyle::kRowwise, 1, {},
      "row-parallel: partial outputs all-reduced");
  add("layers.{i}.attention.wo.bias", ShardStyle::kReplicated, 0, {},
      "added once, after the all-reduce");
  for (const char* p : {"q_norm", "k_norm"}) {
    add("layers.{i}.attention." + std::string(p) + ".weight", ShardStyle::kReplicated, 0, {},
        "per-head RMSNorm over head_dim, one weight for all heads; gradient summed over ranks");
  }
  for (const char* p : {"w1", "w3"}) {
    for (const char* t : {"weight", "bias"}) {
      add("layers.{i}.feed_forward." + std::string(p) + "." + t, ShardStyle::kColwise, 0, {},
          "column-parallel: intermediate features");
    }
  }
  for (const char* t : {"weight", "bias"}) {
    add("layers.{i}.feed_forward.w13." + std::string(t), ShardStyle::kColwise, 0,
        {spec.intermediate_size, spec.intermediate_size},
        "column-parallel per block: gate, up");
  }
  add("layers.{i}.feed_forward.w2.weight", ShardStyle::kRowwise, 1, {},
      "row-parallel: partial outputs all-reduced");
  add("layers.{i}.feed_forward.w2.bias", ShardStyle::kReplicated, 0, {},
      "added once, after the all-reduce");
  add("layers.{i}.moe.router.weight", ShardStyle::kReplicated, 0, {},
      "router on the replicated hidden state: every rank routes alike");
  add("layers.{i}.moe.experts.w1", ShardStyle::kColwise, 1, {},
      "every expert column-parallel over moe_intermediate_size");
  add("layers.{i}.moe.experts.w3", ShardStyle::kColwise, 1, {},
      "every expert column-parallel over moe_intermediate_size");
  add("layers.{i}.moe.experts.w2", ShardStyle::kRowwise, 2, {},
      "every expert row-parallel; expert outputs all-reduced");
  return worker::TpPlan(tp, std::move(rules));
}

}  // namespace gatehouse::models
