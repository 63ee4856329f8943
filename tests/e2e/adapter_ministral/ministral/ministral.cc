// MinistralConfig -> DecoderSpec: Mistral's decoder (no biases, SiLU MLP, RMSNorm) with a
// sliding window on the layers layer_types names "sliding_attention" (the config class makes
// every layer sliding when sliding_window is set and layer_types is not).
#include "ministral/ministral.h"

#include <optional>
#include <string>
#include <vector>

#include "decoder/family.h"

namespace acme::ministral {

using gatehouse::Result;
using gatehouse::Status;
using namespace gatehouse::models;

Result<DecoderSpec> ParseMinistralConfig(ConfigReader& reader) {
  DecoderSpec spec;
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, CoreDefaults{}, spec));
  GH_ASSIGN_OR_RETURN(std::optional<int64_t> window, reader.OptionalInt("sliding_window"));
  if (!reader.config().contains("sliding_window")) window = 4096;  // the dataclass default
  std::vector<std::string> derived(static_cast<size_t>(spec.num_hidden_layers),
                                   window ? "sliding_attention" : "full_attention");
  GH_ASSIGN_OR_RETURN(std::vector<std::string> types,
                      ReadLayerTypes(reader, spec.num_hidden_layers, std::move(derived)));
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "sliding_attention" && window) spec.layers[i].sliding_window = *window;
  }
  GH_ASSIGN_OR_RETURN(RopeConfig rope, ParseRope(reader, 10000.0));
  spec.ropes = {rope};
  return spec;
}

std::unique_ptr<gatehouse::worker::ModelFamily> MakeMinistralFamily() {
  return std::make_unique<DecoderFamily>("ministral", std::vector<std::string>{"ministral"},
                                         &ParseMinistralConfig);
}

}  // namespace acme::ministral
