#include "qwen2/qwen2.h"

#include <optional>
#include <string>
#include <vector>

#include "decoder/family.h"

namespace gatehouse::models::qwen2 {

using nlohmann::json;

Status ParseQwenSlidingWindow(ConfigReader& reader, DecoderSpec& spec) {
  GH_ASSIGN_OR_RETURN(bool use_sliding_window, reader.Bool("use_sliding_window", false));
  // An absent sliding_window takes the dataclass default 4096; an explicit null means none.
  const bool window_given = reader.config().contains("sliding_window");
  GH_ASSIGN_OR_RETURN(std::optional<int64_t> window, reader.OptionalInt("sliding_window"));
  if (!window_given) window = 4096;
  if (window.has_value() && *window <= 0) {
    return FieldError("sliding_window", json(*window), "must be positive");
  }
  // Qwen2Config.__post_init__: sliding_window = sliding_window if use_sliding_window else None.
  if (!use_sliding_window) window.reset();
  GH_ASSIGN_OR_RETURN(std::optional<int64_t> max_window_layers,
                      reader.OptionalInt("max_window_layers"));
  const int64_t first_sliding = max_window_layers.value_or(28);

  std::vector<std::string> derived;
  for (int64_t i = 0; i < spec.num_hidden_layers; ++i) {
    derived.push_back(window.has_value() && i >= first_sliding ? "sliding_attention"
                                                                : "full_attention");
  }
  GH_ASSIGN_OR_RETURN(std::vector<std::string> types,
                      ReadLayerTypes(reader, spec.num_hidden_layers, std::move(derived)));
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != "sliding_attention") continue;
    if (!window.has_value()) {
      return FieldError("layer_types[" + std::to_string(i) + "]", json(types[i]),
                        "a sliding layer needs a window, but use_sliding_window is false or "
                        "sliding_window is null (transformers raises at the first forward)");
    }
    spec.layers[i].sliding_window = *window;
  }
  return Status::Ok();
}

Result<DecoderSpec> ParseQwen2Config(ConfigReader& reader) {
  // Qwen2Attention reads getattr(config, "head_dim", hidden_size // num_attention_heads): an
  // absent head_dim is derived, an explicit null reaches the attention as None and fails there.
  if (const auto it = reader.config().find("head_dim");
      it != reader.config().end() && it->is_null()) {
    return FieldError("head_dim", nullptr, "must be an integer (Qwen2Attention fails on null)");
  }
  DecoderSpec spec;
  // Qwen2Config: num_key_value_heads defaults to 32.
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, CoreDefaults{.num_key_value_heads = 32}, spec));
  // Qwen2Attention: q/k/v projections always carry a bias, o_proj never; the MLP has none.
  spec.qkv_bias = true;
  spec.o_bias = false;
  GH_RETURN_IF_ERROR(ParseQwenSlidingWindow(reader, spec));
  GH_RETURN_IF_ERROR(reader.IgnoreUnreadFlag(
      "use_mrope",
      "the qwen2 text model never reads it (multimodal RoPE is Qwen2-VL's); "
      "docs/config-fields.md",
      "asks for multimodal RoPE, which the qwen2 text model does not compute"));
  // Qwen2Config takes RotaryEmbeddingConfigMixin.default_theta = 10000.
  GH_ASSIGN_OR_RETURN(RopeConfig rope, ParseRope(reader, 10000.0));
  GH_RETURN_IF_ERROR(FullRotaryAsUpstream(rope));
  spec.ropes = {rope};
  return spec;
}

std::unique_ptr<worker::ModelFamily> MakeQwen2Family() {
  return std::make_unique<DecoderFamily>("qwen2", std::vector<std::string>{"qwen2"},
                                         &ParseQwen2Config);
}

}  // namespace gatehouse::models::qwen2
