// LlamaFamily: the registration record of the Llama family (HF model_type "llama").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gatehouse/worker/model_family.h"

namespace gatehouse::models::llama {

/// The Llama family: args (args.h), model (model.h) and name table (state_dict_adapter.h).
/// Stateless and thread-safe. Every method catches LibTorch / JSON exceptions and returns
/// them as a Status.
class LlamaFamily : public worker::ModelFamily {
 public:
  static constexpr std::string_view kName = "llama";

  std::string_view name() const override { return kName; }
  std::vector<std::string> model_types() const override { return {"llama"}; }
  /// See ParseLlamaConfig (args.h).
  Result<worker::ParsedConfig> ParseConfig(const nlohmann::json& config) const override;
  /// `args` must come from this family's ParseConfig (or be a validated LlamaArgs).
  /// Errors: INVALID_ARGUMENT for other args; INTERNAL when LibTorch fails (e.g. no memory).
  Result<std::shared_ptr<worker::CausalLM>> Construct(const worker::ModelArgs& args,
                                                      torch::Dtype dtype,
                                                      torch::Device device) const override;
  Result<worker::StateDictAdapter> Adapter(const worker::ModelArgs& args) const override;
};

}  // namespace gatehouse::models::llama
