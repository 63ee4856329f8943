#include "llama/family.h"

#include <exception>

#include "llama/args.h"
#include "llama/model.h"
#include "llama/state_dict_adapter.h"

namespace gatehouse::models::llama {
namespace {

Result<const LlamaArgs*> AsLlamaArgs(const worker::ModelArgs& args) {
  const auto* llama = dynamic_cast<const LlamaArgs*>(&args);
  if (llama == nullptr) {
    return Status::InvalidArgument("the llama family was given model args of another family");
  }
  return llama;
}

}  // namespace

Result<worker::ParsedConfig> LlamaFamily::ParseConfig(const nlohmann::json& config) const {
  try {
    return ParseLlamaConfig(config);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("llama config: ") + e.what());
  }
}

Result<std::shared_ptr<worker::CausalLM>> LlamaFamily::Construct(const worker::ModelArgs& args,
                                                                  torch::Dtype dtype,
                                                                  torch::Device device) const {
  GH_ASSIGN_OR_RETURN(const LlamaArgs* llama, AsLlamaArgs(args));
  GH_RETURN_IF_ERROR(llama->Validate());
  try {
    auto model = std::make_shared<LlamaModel>(*llama);
    model->to(device, dtype);
    return std::shared_ptr<worker::CausalLM>(std::move(model));
  } catch (const c10::Error& e) {
    return Status::Internal(std::string("constructing the llama model: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Status::Internal(std::string("constructing the llama model: ") + e.what());
  }
}

Result<worker::StateDictAdapter> LlamaFamily::Adapter(const worker::ModelArgs& args) const {
  GH_ASSIGN_OR_RETURN(const LlamaArgs* llama, AsLlamaArgs(args));
  try {
    return MakeLlamaAdapter(*llama);
  } catch (const std::exception& e) {
    return Status::Internal(std::string("llama name table: ") + e.what());
  }
}

}  // namespace gatehouse::models::llama
