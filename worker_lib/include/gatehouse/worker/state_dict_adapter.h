// StateDictAdapter: the HF <-> internal tensor-name table of one model family, as data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace gatehouse::worker {

/// One row of a family's name table. Templates may hold "{layer}", expanded for every layer
/// index in [0, num_hidden_layers) when per_layer is true.
/// Example (llama): hf "model.layers.{layer}.self_attn.q_proj.weight"
///                  internal "layers.{layer}.attention.wq.weight".
struct TensorNameRule {
  std::string hf;
  std::string internal;
  bool per_layer = false;
};

/// Maps HF checkpoint names to internal parameter names and back. Built from the family's
/// rule table for one config (num_hidden_layers, tie_word_embeddings).
///
/// Tied embeddings follow upstream transformers: when tie_word_embeddings is true the model
/// has no separate lm_head parameter; `tied_hf_name` (e.g. "lm_head.weight") is then not
/// expected in a checkpoint. If a checkpoint still ships it, the load gate accepts it, does not
/// use it, and says so (IsTiedAlias()).
class StateDictAdapter {
 public:
  /// Errors: INVALID_ARGUMENT when two rows expand to the same HF or internal name.
  static Result<StateDictAdapter> Create(std::vector<TensorNameRule> rules,
                                         int64_t num_hidden_layers, bool tie_word_embeddings,
                                         std::string tied_hf_name);

  /// Internal name for an HF name; NOT_FOUND names the key when no row maps it.
  Result<std::string> ToInternal(const std::string& hf_name) const;
  /// HF name for an internal name; NOT_FOUND names the parameter when no row maps it.
  Result<std::string> ToHf(const std::string& internal_name) const;
  /// Every HF name a checkpoint of this config must hold, in table order.
  const std::vector<std::string>& ExpectedHfNames() const { return hf_names_; }
  /// True when `hf_name` is the lm_head name of a tied model (present but not used).
  bool IsTiedAlias(const std::string& hf_name) const;
  bool tie_word_embeddings() const { return tie_word_embeddings_; }

 private:
  std::vector<std::string> hf_names_;
  std::vector<std::string> internal_names_;
  bool tie_word_embeddings_ = false;
  std::string tied_hf_name_;
};

}  // namespace gatehouse::worker
