#include "phi3/phi3.h"

#include <string>

#include "decoder/family.h"

namespace gatehouse::models::phi3 {
namespace {

using nlohmann::json;

/// Phi3Config's pad_token_id default.
constexpr int64_t kDefaultPadTokenId = 32000;

/// Rejects every rope type but "default" before the shared parser runs, with Phi-3's own
/// reason (Phi3Config.validate_rope allows only "default" and "longrope"; "su" and "yarn" are
/// legacy names of "longrope").
Status CheckRopeType(const json& config) {
  for (const char* dict_name : {"rope_parameters", "rope_scaling"}) {
    auto dict = config.find(dict_name);
    if (dict == config.end() || !dict->is_object()) continue;
    for (const char* key : {"rope_type", "type"}) {
      auto type = dict->find(key);
      if (type == dict->end() || type->is_null()) continue;
      const std::string field = std::string(dict_name) + "." + key;
      if (!type->is_string()) return FieldError(field, *type, "expected a string");
      const std::string t = type->get<std::string>();
      if (t == "default") continue;
      if (t == "longrope" || t == "su" || t == "yarn") {
        return FieldError(field, *type,
                          "Phi-3 LongRoPE (every RoPE frequency rescaled by short_factor, or "
                          "by long_factor once the sequence exceeds "
                          "original_max_position_embeddings, and the attention scaled) is not "
                          "implemented, so no length is computed as upstream does; only "
                          "\"default\" is supported");
      }
      return FieldError(field, *type,
                        "Phi3Config accepts only \"default\" and \"longrope\" (and only "
                        "\"default\" is implemented)");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<DecoderSpec> ParsePhi3Config(ConfigReader& reader) {
  DecoderSpec spec;
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, CoreDefaults{}, spec));
  if (!reader.config().contains("pad_token_id")) spec.pad_token_id = kDefaultPadTokenId;
  spec.fused_qkv = true;
  spec.fused_gate_up = true;

  GH_RETURN_IF_ERROR(CheckRopeType(reader.config()));
  GH_ASSIGN_OR_RETURN(RopeConfig rope, ParseRope(reader, 10000.0));
  spec.ropes = {rope};

  GH_ASSIGN_OR_RETURN(auto window, reader.OptionalInt("sliding_window"));
  if (window.has_value()) {
    if (*window <= 0) return FieldError("sliding_window", json(*window), "must be positive");
    for (auto& layer : spec.layers) layer.sliding_window = *window;
  }

  GH_RETURN_IF_ERROR(reader.IgnoreUnreadFlag(
      "attention_bias",
      "Phi3Attention builds qkv_proj and o_proj without biases whatever the config says; "
      "docs/config-fields.md",
      "asks for attention biases, which Phi3Attention never builds"));
  reader.Ignore("original_max_position_embeddings",
                "read only by LongRoPE (rope_type \"longrope\"), which this family rejects; "
                "default RoPE does not use it");
  reader.Ignore("resid_pdrop",
                "residual dropout probability; Gatehouse inference and training run without "
                "dropout (upstream applies none in eval mode either)");
  reader.Ignore("embd_pdrop",
                "embedding dropout probability; not read by modeling_phi3.py (transformers "
                "5.24) at all");
  return spec;
}

std::unique_ptr<worker::ModelFamily> MakePhi3Family() {
  return std::make_unique<DecoderFamily>("phi3", std::vector<std::string>{"phi3"},
                                         &ParsePhi3Config);
}

}  // namespace gatehouse::models::phi3
