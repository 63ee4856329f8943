#include "gemma2/gemma2.h"

#include "decoder/family.h"
#include "gemma/gemma.h"

namespace gatehouse::models::gemma2 {

Result<DecoderSpec> ParseGemma2Config(ConfigReader& reader) {
  DecoderSpec spec;
  GH_RETURN_IF_ERROR(gemma::ParseGemma2StyleCore(reader, "Gemma2MLP", spec));
  GH_ASSIGN_OR_RETURN(spec.attn_logit_softcapping,
                      gemma::ReadSoftcap(reader, "attn_logit_softcapping", 50.0));
  GH_ASSIGN_OR_RETURN(spec.final_logit_softcapping,
                      gemma::ReadSoftcap(reader, "final_logit_softcapping", 30.0));

  // Gemma2Config has no default_theta of its own: RotaryEmbeddingConfigMixin's 10000.
  GH_ASSIGN_OR_RETURN(RopeConfig rope, ParseRope(reader, 10000.0));
  spec.ropes = {rope};
  GH_RETURN_IF_ERROR(gemma::RequireFullRotary(rope, "partial_rotary_factor"));

  // Gemma2Config.__post_init__: layer i slides when (i + 1) % 2 != 0, i.e. even layers.
  std::vector<std::string> derived;
  for (int64_t i = 0; i < spec.num_hidden_layers; ++i) {
    derived.push_back((i + 1) % 2 != 0 ? "sliding_attention" : "full_attention");
  }
  GH_ASSIGN_OR_RETURN(auto types, ReadLayerTypes(reader, spec.num_hidden_layers, derived));
  GH_RETURN_IF_ERROR(gemma::ApplyLayerTypes(reader, types, 0, 0, spec));
  return spec;
}

std::unique_ptr<worker::ModelFamily> MakeGemma2Family() {
  return std::make_unique<DecoderFamily>("gemma2", std::vector<std::string>{"gemma2"},
                                         &ParseGemma2Config);
}

}  // namespace gatehouse::models::gemma2
