#include "llama/llama.h"

#include "decoder/family.h"

namespace gatehouse::models::llama {

Result<DecoderSpec> ParseLlamaConfig(ConfigReader& reader) {
  DecoderSpec spec;
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, CoreDefaults{}, spec));
  GH_ASSIGN_OR_RETURN(bool attention_bias, reader.Bool("attention_bias", false));
  spec.qkv_bias = spec.o_bias = attention_bias;
  GH_ASSIGN_OR_RETURN(spec.mlp_bias, reader.Bool("mlp_bias", false));
  GH_ASSIGN_OR_RETURN(auto pretraining_tp, reader.OptionalInt("pretraining_tp"));
  if (pretraining_tp.value_or(1) != 1) {
    return FieldError("pretraining_tp", nlohmann::json(*pretraining_tp),
                      "only 1 is supported (no pretraining tensor-parallel slicing)");
  }
  // Written by SmolLM2's nanotron converter; docs/config-fields.md.
  reader.Ignore("is_llama_config",
                "a converter's marker: LlamaConfig does not define it and modeling_llama.py "
                "never reads it (docs/config-fields.md)");
  GH_RETURN_IF_ERROR(reader.IgnoreUnreadFlag(
      "rope_interleaved",
      "modeling_llama.py never reads it and always rotates halves (rotate_half); "
      "docs/config-fields.md",
      "declares interleaved RoPE, which upstream does not compute: convert the q/k projection "
      "rows to the rotate-half layout"));
  // LlamaConfig.default_theta (RotaryEmbeddingConfigMixin) is 10000.
  GH_ASSIGN_OR_RETURN(RopeConfig rope, ParseRope(reader, 10000.0));
  GH_RETURN_IF_ERROR(FullRotaryAsUpstream(rope));
  spec.ropes = {rope};
  return spec;
}

std::unique_ptr<worker::ModelFamily> MakeLlamaFamily() {
  return std::make_unique<DecoderFamily>("llama", std::vector<std::string>{"llama"},
                                         &ParseLlamaConfig);
}

}  // namespace gatehouse::models::llama
