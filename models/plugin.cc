// The model-family plugin: the shared library the worker dlopen()s. Its only exported symbols
// are the GATEHOUSE_DEFINE_PLUGIN entry points (model_family.h); everything else is hidden.
// A new family adds one line to RegisterFamilies.
#include <memory>

#include "gatehouse/worker/model_family.h"
#include "llama/family.h"

namespace gatehouse::models {
namespace {

Status RegisterFamilies(worker::FamilyRegistry& registry) {
  GH_RETURN_IF_ERROR(registry.Register(std::make_unique<llama::LlamaFamily>()));
  return Status::Ok();
}

}  // namespace
}  // namespace gatehouse::models

GATEHOUSE_DEFINE_PLUGIN(gatehouse::models::RegisterFamilies)
