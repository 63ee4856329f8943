#include "gatehouse/worker/model_family.h"

namespace gatehouse::worker {
namespace {

thread_local bool skip_weight_init = false;

}  // namespace

SkipWeightInit::SkipWeightInit() : previous_(skip_weight_init) { skip_weight_init = true; }

SkipWeightInit::~SkipWeightInit() { skip_weight_init = previous_; }

bool WeightInitSkipped() { return skip_weight_init; }

Status FamilyRegistry::Register(std::unique_ptr<ModelFamily> family) {
  if (FindByName(family->name()) != nullptr) {
    return Status::AlreadyExists("model family '" + std::string(family->name()) +
                                 "' is registered twice");
  }
  for (const auto& type : family->model_types()) {
    if (const ModelFamily* other = FindByModelType(type)) {
      return Status::AlreadyExists("model_type '" + type + "' is served by both '" +
                                   std::string(other->name()) + "' and '" +
                                   std::string(family->name()) + "'");
    }
  }
  families_.push_back(std::move(family));
  return Status::Ok();
}

const ModelFamily* FamilyRegistry::FindByName(std::string_view name) const {
  for (const auto& f : families_) {
    if (f->name() == name) return f.get();
  }
  return nullptr;
}

const ModelFamily* FamilyRegistry::FindByModelType(std::string_view model_type) const {
  for (const auto& f : families_) {
    for (const auto& t : f->model_types()) {
      if (t == model_type) return f.get();
    }
  }
  return nullptr;
}

std::vector<std::string> FamilyRegistry::Names() const {
  std::vector<std::string> out;
  for (const auto& f : families_) out.emplace_back(f->name());
  return out;
}

}  // namespace gatehouse::worker
