#include "gemma/gemma.h"

#include <cmath>

#include "decoder/family.h"

namespace gatehouse::models::gemma {

using nlohmann::json;

Status RequirePresent(ConfigReader& reader, std::string_view field) {
  const json& config = reader.config();
  auto it = config.find(std::string(field));
  if (it == config.end() || it->is_null()) return MissingField(field);
  return Status::Ok();
}

Result<std::optional<double>> ReadSoftcap(ConfigReader& reader, std::string_view field,
                                          std::optional<double> absent_default) {
  const bool present = reader.config().contains(std::string(field));
  GH_ASSIGN_OR_RETURN(auto value, reader.OptionalNumber(field));
  if (!present) return absent_default;
  return value;  // null: no capping
}

Status RejectBidirectional(ConfigReader& reader) {
  GH_ASSIGN_OR_RETURN(bool bidirectional, reader.Bool("use_bidirectional_attention", false));
  if (bidirectional) {
    return FieldError("use_bidirectional_attention", json(true),
                      "non-causal attention is not implemented (only causal decoding)");
  }
  return Status::Ok();
}

Status RequireFullRotary(const RopeConfig& rope, std::string_view field) {
  if (rope.partial_rotary_factor == 1.0) return Status::Ok();
  return FieldError(field, json(rope.partial_rotary_factor),
                    "Gemma's default RoPE rotates the whole head_dim and ignores this factor "
                    "while scaled rope types honour it; only 1 is supported");
}

Status ReadQueryPreAttnScalar(ConfigReader& reader, DecoderSpec& spec) {
  GH_ASSIGN_OR_RETURN(auto scalar, reader.OptionalNumber("query_pre_attn_scalar"));
  const double q = scalar.value_or(256.0);
  if (!(q > 0)) return FieldError("query_pre_attn_scalar", json(q), "must be positive");
  // Gemma2Attention / Gemma3Attention: self.scaling = config.query_pre_attn_scalar**-0.5.
  spec.attention_scaling = std::pow(q, -0.5);
  return Status::Ok();
}

Status ApplyLayerTypes(ConfigReader& reader, const std::vector<std::string>& types, int full_rope,
                       int sliding_rope, DecoderSpec& spec) {
  const bool present = reader.config().contains("sliding_window");
  GH_ASSIGN_OR_RETURN(auto window, reader.OptionalInt("sliding_window"));
  if (!present) window = 4096;  // Gemma2Config / Gemma3TextConfig default
  spec.layers.assign(types.size(), LayerSpec{});
  for (size_t i = 0; i < types.size(); ++i) {
    LayerSpec& layer = spec.layers[i];
    if (types[i] != "sliding_attention") {
      layer.rope = full_rope;
      continue;
    }
    if (!window.has_value()) {
      return FieldError(
          "sliding_window", json(nullptr),
          "layer " + std::to_string(i) + " is a sliding_attention layer, which needs a window");
    }
    if (*window <= 0) return FieldError("sliding_window", json(*window), "must be positive");
    layer.sliding_window = *window;
    layer.rope = sliding_rope;
  }
  return Status::Ok();
}

Result<DecoderSpec> ParseGemmaConfig(ConfigReader& reader) {
  DecoderSpec spec;
  GH_RETURN_IF_ERROR(RequirePresent(reader, "num_key_value_heads"));
  // The 4.x field hidden_activation was what GemmaMLP applied then; 5.x applies hidden_act and
  // leaves hidden_activation unread. Accept it only where both readings agree.
  GH_ASSIGN_OR_RETURN(auto legacy_act, reader.OptionalString("hidden_activation"));
  if (legacy_act.has_value() && *legacy_act != "gelu_pytorch_tanh") {
    return FieldError("hidden_activation", json(*legacy_act),
                      "transformers 4.x applied hidden_activation, 5.x applies hidden_act; only "
                      "\"gelu_pytorch_tanh\", where both agree, is accepted");
  }
  CoreDefaults defaults;
  defaults.tie_word_embeddings = true;
  // ParseCoreFields validates hidden_activation (just checked); hidden_act is read below since
  // it has a legacy alias.
  defaults.activation_field = "hidden_activation";
  defaults.activation = Activation::kGeluTanh;
  defaults.head_dim_optional = false;
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, defaults, spec));
  // GemmaConfig.__post_init__: "gelu" is a legacy spelling of the tanh approximation.
  GH_RETURN_IF_ERROR(
      reader.StringIn("hidden_act", "gelu_pytorch_tanh", {"gelu_pytorch_tanh", "gelu"}, "gemma")
          .status());
  spec.hidden_act = Activation::kGeluTanh;
  spec.norm = NormKind::kGemma;
  spec.scale_embeddings = true;
  GH_ASSIGN_OR_RETURN(bool attention_bias, reader.Bool("attention_bias", false));
  spec.qkv_bias = spec.o_bias = attention_bias;
  GH_RETURN_IF_ERROR(RejectBidirectional(reader));
  // GemmaConfig has no default_theta of its own: RotaryEmbeddingConfigMixin's 10000.
  GH_ASSIGN_OR_RETURN(RopeConfig rope, ParseRope(reader, 10000.0));
  spec.ropes = {rope};
  GH_RETURN_IF_ERROR(RequireFullRotary(rope, "partial_rotary_factor"));
  return spec;
}

std::unique_ptr<worker::ModelFamily> MakeGemmaFamily() {
  return std::make_unique<DecoderFamily>("gemma", std::vector<std::string>{"gemma"},
                                         &ParseGemmaConfig);
}

Status ParseGemma2StyleCore(ConfigReader& reader, std::string_view mlp_class, DecoderSpec& spec) {
  GH_RETURN_IF_ERROR(RequirePresent(reader, "num_key_value_heads"));
  CoreDefaults defaults;
  defaults.tie_word_embeddings = true;
  defaults.activation_field = "hidden_activation";
  defaults.activation = Activation::kGeluTanh;
  defaults.head_dim_optional = false;
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, defaults, spec));
  reader.Ignore("hidden_act", std::string(mlp_class) +
                                  " applies hidden_activation; hidden_act (found in Hub "
                                  "configs) is never read");
  reader.Ignore("cache_implementation",
                "generate()'s cache layout (\"hybrid\"); the decode gate's KV cache gives the "
                "same attention");
  spec.norm = NormKind::kGemma;
  spec.scale_embeddings = true;
  spec.sandwich_norm = true;
  GH_ASSIGN_OR_RETURN(bool attention_bias, reader.Bool("attention_bias", false));
  spec.qkv_bias = spec.o_bias = attention_bias;
  GH_RETURN_IF_ERROR(RejectBidirectional(reader));
  return ReadQueryPreAttnScalar(reader, spec);
}

}  // namespace gatehouse::models::gemma
