#include "gemma3/gemma3.h"

#include "decoder/family.h"
#include "gemma/gemma.h"

namespace gatehouse::models::gemma3 {
namespace {

using nlohmann::json;

constexpr const char* kFull = "full_attention";
constexpr const char* kSliding = "sliding_attention";

/// The two RoPE settings, as Gemma3TextConfig.convert_rope_params_to_dict builds them:
/// ropes[0] full_attention, ropes[1] sliding_attention.
Result<std::vector<RopeConfig>> ParseGemma3Ropes(ConfigReader& reader) {
  const json* params = reader.Raw("rope_parameters");
  const json* scaling = reader.Raw("rope_scaling");
  GH_ASSIGN_OR_RETURN(auto global_theta, reader.OptionalNumber("rope_theta"));
  GH_ASSIGN_OR_RETURN(auto local_theta, reader.OptionalNumber("rope_local_base_freq"));

  const json kDefault = {{"rope_type", "default"}};
  json full = kDefault, sliding = kDefault;
  if (params != nullptr) {
    if (!params->is_object()) return FieldError("rope_parameters", *params, "expected an object");
    for (const auto& [key, value] : params->items()) {
      if (key != kFull && key != kSliding) {
        return FieldError("rope_parameters", *params,
                          "Gemma 3 keys RoPE settings by layer type (\"full_attention\", "
                          "\"sliding_attention\"); upstream silently ignores key \"" +
                              key + "\"");
      }
      if (!value.is_null()) (key == kFull ? full : sliding) = value;
    }
  }
  if (scaling != nullptr) {
    if (!scaling->is_object()) return FieldError("rope_scaling", *scaling, "expected an object");
    // rope_parameters["full_attention"].update(rope_scaling); a non-object entry is reported by
    // ParseRopeDict below.
    if (full.is_object()) full.update(*scaling);
  }
  const std::string full_prefix =
      params == nullptr && scaling != nullptr ? "rope_scaling." : "rope_parameters.full_attention.";
  GH_ASSIGN_OR_RETURN(
      RopeConfig full_rope,
      ParseRopeDict(reader, full, full_prefix, global_theta.value_or(1e6),
                    global_theta.has_value() ? "rope_theta" : "default (global 1e6)"));
  GH_ASSIGN_OR_RETURN(
      RopeConfig sliding_rope,
      ParseRopeDict(reader, sliding, "rope_parameters.sliding_attention.",
                    local_theta.value_or(1e4),
                    local_theta.has_value() ? "rope_local_base_freq" : "default (local 1e4)"));
  GH_RETURN_IF_ERROR(gemma::RequireFullRotary(full_rope, full_prefix + "partial_rotary_factor"));
  GH_RETURN_IF_ERROR(gemma::RequireFullRotary(
      sliding_rope, "rope_parameters.sliding_attention.partial_rotary_factor"));
  return std::vector<RopeConfig>{full_rope, sliding_rope};
}

/// layer_types, else the pattern of Gemma3TextConfig.__post_init__: layer i slides unless
/// (i + 1) % sliding_window_pattern == 0 (default 6).
Result<std::vector<std::string>> ReadGemma3LayerTypes(ConfigReader& reader, int64_t layers) {
  reader.Ignore("_sliding_window_pattern",
                "private attribute save_pretrained writes; __post_init__ recomputes it from "
                "sliding_window_pattern, and layer_types decides");
  const json& config = reader.config();
  auto it = config.find("layer_types");
  std::vector<std::string> derived;
  if (it != config.end() && !it->is_null()) {
    reader.Ignore("sliding_window_pattern", "superseded by layer_types");
  } else {
    GH_ASSIGN_OR_RETURN(auto pattern, reader.OptionalInt("sliding_window_pattern"));
    const int64_t p = pattern.value_or(6);
    if (p <= 0) return FieldError("sliding_window_pattern", json(p), "must be positive");
    for (int64_t i = 0; i < layers; ++i) {
      derived.push_back((i + 1) % p != 0 ? kSliding : kFull);
    }
  }
  return ReadLayerTypes(reader, layers, derived);
}

}  // namespace

Result<DecoderSpec> ParseGemma3TextConfig(ConfigReader& reader) {
  DecoderSpec spec;
  GH_RETURN_IF_ERROR(gemma::ParseGemma2StyleCore(reader, "Gemma3MLP", spec));
  reader.Ignore("attn_logit_softcapping",
                "Gemma3Attention (transformers 5.24) does not pass it to the attention "
                "function: scores are not capped");
  spec.qk_norm = true;
  GH_ASSIGN_OR_RETURN(spec.final_logit_softcapping,
                      gemma::ReadSoftcap(reader, "final_logit_softcapping", std::nullopt));

  GH_ASSIGN_OR_RETURN(spec.ropes, ParseGemma3Ropes(reader));
  // Upstream drops a top-level partial_rotary_factor here; one other than 1 is a config that
  // expects something Gemma 3 does not do.
  GH_ASSIGN_OR_RETURN(auto top_prf, reader.OptionalNumber("partial_rotary_factor"));
  if (top_prf.has_value() && *top_prf != 1.0) {
    return FieldError("partial_rotary_factor", json(*top_prf),
                      "Gemma 3 rotates the whole head_dim; only 1 is supported");
  }

  GH_ASSIGN_OR_RETURN(auto types, ReadGemma3LayerTypes(reader, spec.num_hidden_layers));
  GH_RETURN_IF_ERROR(gemma::ApplyLayerTypes(reader, types, 0, 1, spec));
  return spec;
}

std::unique_ptr<worker::ModelFamily> MakeGemma3Family() {
  return std::make_unique<DecoderFamily>("gemma3", std::vector<std::string>{"gemma3_text"},
                                         &ParseGemma3TextConfig);
}

}  // namespace gatehouse::models::gemma3
