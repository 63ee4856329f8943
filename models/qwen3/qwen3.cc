#include "qwen3/qwen3.h"

#include <cmath>
#include <string>
#include <vector>

#include "decoder/family.h"
#include "qwen2/qwen2.h"

namespace gatehouse::models::qwen3 {

using nlohmann::json;

Result<DecoderSpec> ParseQwen3Config(ConfigReader& reader) {
  // Qwen3Config declares head_dim = 128, so an absent head_dim is 128, never hidden / heads;
  // an explicit null reaches Qwen3Attention as None and fails there.
  const auto head_dim_field = reader.config().find("head_dim");
  const bool head_dim_given = head_dim_field != reader.config().end();
  if (head_dim_given && head_dim_field->is_null()) {
    return FieldError("head_dim", nullptr, "must be an integer (Qwen3Attention fails on null)");
  }
  DecoderSpec spec;
  // Qwen3Config: num_key_value_heads defaults to 32.
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, CoreDefaults{.num_key_value_heads = 32}, spec));
  if (!head_dim_given) {
    spec.head_dim = 128;
    spec.attention_scaling = 1.0 / std::sqrt(static_cast<double>(spec.head_dim));
  }
  spec.qk_norm = true;
  GH_ASSIGN_OR_RETURN(bool attention_bias, reader.Bool("attention_bias", false));
  spec.qkv_bias = spec.o_bias = attention_bias;
  GH_RETURN_IF_ERROR(qwen2::ParseQwenSlidingWindow(reader, spec));
  // Qwen3Config takes RotaryEmbeddingConfigMixin.default_theta = 10000.
  GH_ASSIGN_OR_RETURN(RopeConfig rope, ParseRope(reader, 10000.0));
  GH_RETURN_IF_ERROR(FullRotaryAsUpstream(rope));
  spec.ropes = {rope};
  return spec;
}

std::unique_ptr<worker::ModelFamily> MakeQwen3Family() {
  return std::make_unique<DecoderFamily>("qwen3", std::vector<std::string>{"qwen3"},
                                         &ParseQwen3Config);
}

}  // namespace gatehouse::models::qwen3
