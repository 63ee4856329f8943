#include "qwen3_moe/qwen3_moe.h"

#include <set>
#include <string>

#include "decoder/family.h"

namespace gatehouse::models::qwen3_moe {
namespace {

using nlohmann::json;

/// num_experts, spelled "num_experts" (hub configs) or "num_local_experts" (what
/// save_pretrained writes through Qwen3MoeConfig.attribute_map); 128 when neither is given.
Result<int64_t> ReadNumExperts(ConfigReader& reader) {
  GH_ASSIGN_OR_RETURN(auto experts, reader.OptionalInt("num_experts"));
  GH_ASSIGN_OR_RETURN(auto local, reader.OptionalInt("num_local_experts"));
  if (experts.has_value() && local.has_value() && *experts != *local) {
    return FieldError("num_local_experts", json(*local),
                      "disagrees with num_experts = " + std::to_string(*experts) +
                          " (the same Qwen3MoeConfig attribute)");
  }
  const int64_t n = experts.value_or(local.value_or(128));
  if (n < 0) {
    return FieldError(experts.has_value() ? "num_experts" : "num_local_experts", json(n),
                      "must not be negative");
  }
  return n;
}

/// mlp_only_layers: a list of layer indices (absent or null: none).
Result<std::set<int64_t>> ReadMlpOnlyLayers(ConfigReader& reader) {
  std::set<int64_t> out;
  const json* v = reader.Raw("mlp_only_layers");
  if (v == nullptr) return out;
  if (!v->is_array()) return FieldError("mlp_only_layers", *v, "expected a list of layer indices");
  for (size_t i = 0; i < v->size(); ++i) {
    const json& e = (*v)[i];
    if (!e.is_number_integer()) {
      return FieldError("mlp_only_layers[" + std::to_string(i) + "]", e,
                        "expected an integer layer index");
    }
    out.insert(e.get<int64_t>());
  }
  return out;
}

}  // namespace

Result<DecoderSpec> ParseQwen3MoeConfig(ConfigReader& reader) {
  DecoderSpec spec;
  // Qwen3MoeConfig: num_key_value_heads defaults to 4.
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, CoreDefaults{.num_key_value_heads = 4}, spec));
  GH_ASSIGN_OR_RETURN(bool attention_bias, reader.Bool("attention_bias", false));
  spec.qkv_bias = spec.o_bias = attention_bias;
  spec.qk_norm = true;  // Qwen3MoeAttention always has q_norm / k_norm
  GH_ASSIGN_OR_RETURN(RopeConfig rope, ParseRope(reader, 10000.0));
  GH_RETURN_IF_ERROR(FullRotaryAsUpstream(rope));
  spec.ropes = {rope};

  // Sliding window: every layer, only with use_sliding_window (Qwen3MoeConfig.__post_init__).
  GH_ASSIGN_OR_RETURN(bool use_sliding, reader.Bool("use_sliding_window", false));
  GH_ASSIGN_OR_RETURN(auto window, reader.OptionalInt("sliding_window"));
  if (use_sliding && window.has_value()) {
    if (*window <= 0) return FieldError("sliding_window", json(*window), "must be positive");
    for (auto& layer : spec.layers) layer.sliding_window = *window;
  }

  reader.Ignore("max_window_layers",
                "Qwen3MoeConfig does not define it and modeling_qwen3_moe.py never reads it: "
                "with use_sliding_window every layer slides (docs/config-fields.md)");

  // Sparse MoE blocks.
  GH_ASSIGN_OR_RETURN(spec.num_experts, ReadNumExperts(reader));
  GH_ASSIGN_OR_RETURN(auto top_k, reader.OptionalInt("num_experts_per_tok"));
  spec.num_experts_per_tok = top_k.value_or(8);
  GH_ASSIGN_OR_RETURN(auto moe_inter, reader.OptionalInt("moe_intermediate_size"));
  spec.moe_intermediate_size = moe_inter.value_or(768);
  GH_ASSIGN_OR_RETURN(spec.norm_topk_prob, reader.Bool("norm_topk_prob", false));
  GH_ASSIGN_OR_RETURN(auto step, reader.OptionalInt("decoder_sparse_step"));
  const int64_t sparse_step = step.value_or(1);
  if (sparse_step < 1) {
    return FieldError("decoder_sparse_step", json(sparse_step),
                      "must be >= 1 (layer l is sparse when (l + 1) % decoder_sparse_step == 0)");
  }
  GH_ASSIGN_OR_RETURN(std::set<int64_t> mlp_only, ReadMlpOnlyLayers(reader));
  for (int64_t l = 0; l < spec.num_hidden_layers; ++l) {
    spec.layers[static_cast<size_t>(l)].moe =
        !mlp_only.count(l) && spec.num_experts > 0 && (l + 1) % sparse_step == 0;
  }

  // Training-only router loss (see the header). Looked at without reading it through the
  // reader, so the field is reported ignored (with the reason), not mapped.
  auto flag = reader.config().find("output_router_logits");
  const bool router_logits =
      flag != reader.config().end() && flag->is_boolean() && flag->get<bool>();
  reader.Ignore("output_router_logits",
                router_logits
                    ? "true: upstream adds router_aux_loss_coef x the load-balancing loss to the "
                      "training loss; Gatehouse's training gate uses the LM cross-entropy only "
                      "and does not reproduce that term; no effect on logits, decode or save"
                    : "false: upstream adds no router auxiliary loss; an output/loss flag with "
                      "no effect on logits");
  reader.Ignore("router_aux_loss_coef",
                router_logits
                    ? "weight of the router load-balancing loss in training, which Gatehouse's "
                      "training gate does not reproduce (output_router_logits is true); no "
                      "effect on logits, decode or save"
                    : "weight of the router load-balancing loss, unused while "
                      "output_router_logits is false");
  return spec;
}

std::unique_ptr<worker::ModelFamily> MakeQwen3MoeFamily() {
  return std::make_unique<DecoderFamily>("qwen3_moe", std::vector<std::string>{"qwen3_moe"},
                                         &ParseQwen3MoeConfig);
}

}  // namespace gatehouse::models::qwen3_moe
