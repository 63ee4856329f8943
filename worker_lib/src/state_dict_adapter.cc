#include "gatehouse/worker/state_dict_adapter.h"

#include <set>

namespace gatehouse::worker {
namespace {

std::string ExpandLayer(const std::string& tmpl, int64_t layer) {
  static const std::string kKey = "{layer}";
  std::string out = tmpl;
  for (size_t pos = out.find(kKey); pos != std::string::npos; pos = out.find(kKey, pos)) {
    out.replace(pos, kKey.size(), std::to_string(layer));
  }
  return out;
}

}  // namespace

Result<StateDictAdapter> StateDictAdapter::Create(std::vector<TensorNameRule> rules,
                                                  int64_t num_hidden_layers,
                                                  bool tie_word_embeddings,
                                                  std::string tied_hf_name) {
  StateDictAdapter a;
  a.tie_word_embeddings_ = tie_word_embeddings;
  a.tied_hf_name_ = std::move(tied_hf_name);
  std::set<std::string> seen_hf, seen_internal;
  auto add = [&](std::string hf, std::string internal) -> Status {
    if (tie_word_embeddings && hf == a.tied_hf_name_) return Status::Ok();  // no own parameter
    if (!seen_hf.insert(hf).second) {
      return Status::InvalidArgument("name table maps HF name '" + hf + "' twice");
    }
    if (!seen_internal.insert(internal).second) {
      return Status::InvalidArgument("name table maps internal name '" + internal + "' twice");
    }
    a.hf_names_.push_back(std::move(hf));
    a.internal_names_.push_back(std::move(internal));
    return Status::Ok();
  };
  for (const auto& rule : rules) {
    if (rule.per_layer) {
      for (int64_t l = 0; l < num_hidden_layers; ++l) {
        GH_RETURN_IF_ERROR(add(ExpandLayer(rule.hf, l), ExpandLayer(rule.internal, l)));
      }
    } else {
      GH_RETURN_IF_ERROR(add(rule.hf, rule.internal));
    }
  }
  return a;
}

Result<std::string> StateDictAdapter::ToInternal(const std::string& hf_name) const {
  for (size_t i = 0; i < hf_names_.size(); ++i) {
    if (hf_names_[i] == hf_name) return internal_names_[i];
  }
  return Status::NotFound("no name-table row maps checkpoint key '" + hf_name + "'");
}

Result<std::string> StateDictAdapter::ToHf(const std::string& internal_name) const {
  for (size_t i = 0; i < internal_names_.size(); ++i) {
    if (internal_names_[i] == internal_name) return hf_names_[i];
  }
  return Status::NotFound("no name-table row maps parameter '" + internal_name + "'");
}

bool StateDictAdapter::IsTiedAlias(const std::string& hf_name) const {
  return tie_word_embeddings_ && hf_name == tied_hf_name_;
}

}  // namespace gatehouse::worker
