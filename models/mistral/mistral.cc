#include "mistral/mistral.h"

#include <optional>
#include <string>
#include <vector>

#include "decoder/family.h"

namespace gatehouse::models::mistral {

using nlohmann::json;

Result<DecoderSpec> ParseMistralConfig(ConfigReader& reader) {
  DecoderSpec spec;
  // MistralConfig: num_key_value_heads defaults to 8.
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, CoreDefaults{.num_key_value_heads = 8}, spec));
  if (const json* layer_types = reader.Raw("layer_types")) {
    return FieldError("layer_types", *layer_types,
                      "a mistral config with layer_types is loaded as \"ministral\" by "
                      "transformers' AutoConfig; the mistral family does not implement it");
  }
  // An absent sliding_window takes the dataclass default 4096; null means full attention.
  const bool window_given = reader.config().contains("sliding_window");
  GH_ASSIGN_OR_RETURN(std::optional<int64_t> window, reader.OptionalInt("sliding_window"));
  if (!window_given) window = 4096;
  if (window.has_value()) {
    if (*window <= 0) return FieldError("sliding_window", json(*window), "must be positive");
    for (auto& layer : spec.layers) layer.sliding_window = *window;
  }
  // MistralConfig takes RotaryEmbeddingConfigMixin.default_theta = 10000.
  GH_ASSIGN_OR_RETURN(RopeConfig rope, ParseRope(reader, 10000.0));
  GH_RETURN_IF_ERROR(FullRotaryAsUpstream(rope));
  spec.ropes = {rope};
  return spec;
}

std::unique_ptr<worker::ModelFamily> MakeMistralFamily() {
  return std::make_unique<DecoderFamily>("mistral", std::vector<std::string>{"mistral"},
                                         &ParseMistralConfig);
}

}  // namespace gatehouse::models::mistral
