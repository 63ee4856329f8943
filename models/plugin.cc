// The model-family plugin: the shared library the worker dlopen()s. Its only exported symbols
// are the GATEHOUSE_DEFINE_PLUGIN entry points (model_family.h); everything else is hidden.
// A new family adds one line to RegisterFamilies (docs/adding-a-model-family.md).
#include <memory>

#include "gatehouse/worker/model_family.h"
#include "gemma/gemma.h"
#include "gemma2/gemma2.h"
#include "gemma3/gemma3.h"
#include "llama/llama.h"
#include "mistral/mistral.h"
#include "phi3/phi3.h"
#include "qwen2/qwen2.h"
#include "qwen3/qwen3.h"
#include "qwen3_moe/qwen3_moe.h"

namespace gatehouse::models {
namespace {

Status RegisterFamilies(worker::FamilyRegistry& registry) {
  GH_RETURN_IF_ERROR(registry.Register(llama::MakeLlamaFamily()));
  GH_RETURN_IF_ERROR(registry.Register(phi3::MakePhi3Family()));
  GH_RETURN_IF_ERROR(registry.Register(qwen3_moe::MakeQwen3MoeFamily()));
  GH_RETURN_IF_ERROR(registry.Register(qwen2::MakeQwen2Family()));
  GH_RETURN_IF_ERROR(registry.Register(qwen3::MakeQwen3Family()));
  GH_RETURN_IF_ERROR(registry.Register(mistral::MakeMistralFamily()));
  GH_RETURN_IF_ERROR(registry.Register(gemma::MakeGemmaFamily()));
  GH_RETURN_IF_ERROR(registry.Register(gemma2::MakeGemma2Family()));
  GH_RETURN_IF_ERROR(registry.Register(gemma3::MakeGemma3Family()));
  return Status::Ok();
}

}  // namespace
}  // namespace gatehouse::models

GATEHOUSE_DEFINE_PLUGIN(gatehouse::models::RegisterFamilies)
