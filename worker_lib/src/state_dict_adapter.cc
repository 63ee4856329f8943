#include "gatehouse/worker/state_dict_adapter.h"

#include <algorithm>

namespace gatehouse::worker {
namespace {

constexpr std::string_view kLayerKey = "{layer}";
constexpr std::string_view kExpertKey = "{expert}";

std::string Expand(std::string tmpl, std::string_view key, int64_t index) {
  for (size_t pos = tmpl.find(key); pos != std::string::npos; pos = tmpl.find(key, pos)) {
    tmpl.replace(pos, key.size(), std::to_string(index));
  }
  return tmpl;
}

bool Contains(const std::string& s, std::string_view key) {
  return s.find(key) != std::string::npos;
}

std::string SlotName(const TensorSlot& slot) {
  return slot.slice < 0 ? slot.internal
                        : slot.internal + "[" + std::to_string(slot.slice) + "]";
}

}  // namespace

Result<StateDictAdapter> StateDictAdapter::Create(std::vector<TensorNameRule> rules,
                                                  int64_t num_hidden_layers,
                                                  bool tie_word_embeddings,
                                                  std::string tied_hf_name) {
  StateDictAdapter a;
  a.tie_word_embeddings_ = tie_word_embeddings;
  a.tied_hf_name_ = std::move(tied_hf_name);
  auto add = [&](std::string hf, std::string internal, int64_t slice) -> Status {
    if (tie_word_embeddings && slice < 0 && hf == a.tied_hf_name_) {
      return Status::Ok();  // no own parameter
    }
    if (a.by_hf_.count(hf)) {
      return Status::InvalidArgument("name table maps HF name '" + hf + "' twice");
    }
    std::vector<size_t>& same = a.by_internal_[internal];
    for (size_t i : same) {
      const TensorSlot& other = a.slots_[i];
      if ((other.slice < 0) != (slice < 0)) {
        return Status::InvalidArgument("name table maps internal name '" + internal +
                                       "' both as a stacked parameter and as a whole one ('" +
                                       a.hf_names_[i] + "' and '" + hf + "')");
      }
      if (other.slice == slice) {
        return Status::InvalidArgument(
            "name table maps internal name '" + SlotName({internal, slice}) + "' twice ('" +
            a.hf_names_[i] + "' and '" + hf + "')");
      }
    }
    same.push_back(a.slots_.size());
    a.by_hf_.emplace(hf, a.slots_.size());
    a.hf_names_.push_back(std::move(hf));
    a.slots_.push_back({std::move(internal), slice});
    return Status::Ok();
  };
  for (const auto& rule : rules) {
    const std::string row = "name-table row '" + rule.hf + "' -> '" + rule.internal + "'";
    if (rule.num_experts < 0) {
      return Status::InvalidArgument(row + ": num_experts = " + std::to_string(rule.num_experts) +
                                     " is negative");
    }
    const bool stacked = rule.num_experts > 0;
    if (stacked != Contains(rule.hf, kExpertKey)) {
      return Status::InvalidArgument(
          row + (stacked ? ": num_experts > 0 but the HF name has no {expert}"
                         : ": the HF name has {expert} but num_experts is 0"));
    }
    if (Contains(rule.internal, kExpertKey)) {
      return Status::InvalidArgument(
          row + ": {expert} in the internal name (experts are slices of one stacked parameter)");
    }
    const int64_t layers = rule.per_layer ? num_hidden_layers : 1;
    for (int64_t l = 0; l < layers; ++l) {
      std::string hf = rule.per_layer ? Expand(rule.hf, kLayerKey, l) : rule.hf;
      std::string internal = rule.per_layer ? Expand(rule.internal, kLayerKey, l) : rule.internal;
      if (!stacked) {
        GH_RETURN_IF_ERROR(add(std::move(hf), std::move(internal), -1));
        continue;
      }
      for (int64_t e = 0; e < rule.num_experts; ++e) {
        GH_RETURN_IF_ERROR(add(Expand(hf, kExpertKey, e), internal, e));
      }
    }
  }
  return a;
}

Result<TensorSlot> StateDictAdapter::Resolve(const std::string& hf_name) const {
  auto it = by_hf_.find(hf_name);
  if (it == by_hf_.end()) {
    return Status::NotFound("no name-table row maps checkpoint key '" + hf_name + "'");
  }
  return slots_[it->second];
}

Result<std::vector<HfSlice>> StateDictAdapter::HfSlices(const std::string& internal_name) const {
  auto it = by_internal_.find(internal_name);
  if (it == by_internal_.end() || it->second.empty()) {
    return Status::NotFound("no name-table row maps parameter '" + internal_name + "'");
  }
  std::vector<HfSlice> out;
  out.reserve(it->second.size());
  for (size_t i : it->second) out.push_back({hf_names_[i], slots_[i].slice});
  std::sort(out.begin(), out.end(),
            [](const HfSlice& x, const HfSlice& y) { return x.slice < y.slice; });
  return out;
}

Result<std::string> StateDictAdapter::ToInternal(const std::string& hf_name) const {
  GH_ASSIGN_OR_RETURN(TensorSlot slot, Resolve(hf_name));
  return slot.internal;
}

Result<std::string> StateDictAdapter::ToHf(const std::string& internal_name) const {
  GH_ASSIGN_OR_RETURN(std::vector<HfSlice> slices, HfSlices(internal_name));
  if (slices.size() != 1 || slices[0].slice >= 0) {
    return Status::InvalidArgument("parameter '" + internal_name + "' is stacked over " +
                                   std::to_string(slices.size()) +
                                   " HF tensors (one per expert); it has no single HF name");
  }
  return slices[0].hf;
}

bool StateDictAdapter::IsTiedAlias(const std::string& hf_name) const {
  return tie_word_embeddings_ && hf_name == tied_hf_name_;
}

}  // namespace gatehouse::worker
