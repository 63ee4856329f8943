// StateDictAdapter: the HF <-> internal tensor-name table of one model family, as data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
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
  /// > 0: `hf` also holds "{expert}" and `internal` names one stacked parameter of shape
  /// [num_experts, ...] whose slice e (along dim 0) is expert e's HF tensor (MoE experts are
  /// stored per expert in HF checkpoints and held as one 3-D tensor inside).
  /// Example (qwen3_moe): hf "model.layers.1.mlp.experts.{expert}.up_proj.weight" [I, H]
  ///                      internal "layers.1.moe.experts.w3" [E, I, H].
  int64_t num_experts = 0;
};

/// Where one HF tensor lives inside the model: a whole parameter (slice -1) or slice `slice`
/// along dim 0 of a stacked parameter.
struct TensorSlot {
  std::string internal;
  int64_t slice = -1;
};

/// One HF tensor that makes up (part of) an internal parameter; slice as in TensorSlot.
struct HfSlice {
  std::string hf;
  int64_t slice = -1;
};

/// Maps HF checkpoint names to internal parameter names and back. Built from the family's
/// rule table for one config (num_hidden_layers, tie_word_embeddings).
///
/// Tied embeddings follow upstream transformers: when tie_word_embeddings is true the model
/// has no separate lm_head parameter; `tied_hf_name` (e.g. "lm_head.weight") is then not
/// expected in a checkpoint. If a checkpoint still ships it, the load gate accepts it, does not
/// use it, and says so (IsTiedAlias()).
///
/// Stacked rows (TensorNameRule::num_experts > 0) expand "{expert}" over [0, num_experts): HF
/// name e maps to slice e of the internal parameter. Loading copies each HF tensor into its
/// slice; saving writes each slice under its HF name.
class StateDictAdapter {
 public:
  /// Errors: INVALID_ARGUMENT when two rows expand to the same HF name, the same internal
  /// name (an unstacked parameter), the same slice of a stacked parameter, or one internal
  /// name both stacked and unstacked; when a row has "{expert}" without num_experts > 0 (or
  /// num_experts > 0 without "{expert}" in hf), "{expert}" in its internal name, or
  /// num_experts < 0.
  static Result<StateDictAdapter> Create(std::vector<TensorNameRule> rules,
                                         int64_t num_hidden_layers, bool tie_word_embeddings,
                                         std::string tied_hf_name);

  /// Where the HF tensor `hf_name` goes. NOT_FOUND names the key when no row maps it.
  Result<TensorSlot> Resolve(const std::string& hf_name) const;
  /// The HF tensors that make up `internal_name`, in slice order: one entry {hf, -1} for an
  /// unstacked parameter, num_experts entries {hf_e, e} for a stacked one. NOT_FOUND names
  /// the parameter when no row maps it.
  Result<std::vector<HfSlice>> HfSlices(const std::string& internal_name) const;

  /// Internal name for an HF name (for an expert's HF name: the stacked parameter it is a
  /// slice of; Resolve says which slice). NOT_FOUND names the key when no row maps it.
  Result<std::string> ToInternal(const std::string& hf_name) const;
  /// HF name for an unstacked internal name. NOT_FOUND names the parameter when no row maps
  /// it; INVALID_ARGUMENT for a stacked parameter (it has one HF name per slice: HfSlices).
  Result<std::string> ToHf(const std::string& internal_name) const;
  /// Every HF name a checkpoint of this config must hold, in table order (experts expanded in
  /// index order).
  const std::vector<std::string>& ExpectedHfNames() const { return hf_names_; }
  /// True when `hf_name` is the lm_head name of a tied model (present but not used).
  bool IsTiedAlias(const std::string& hf_name) const;
  bool tie_word_embeddings() const { return tie_word_embeddings_; }

 private:
  /// hf_names_[i] goes to slots_[i].
  std::vector<std::string> hf_names_;
  std::vector<TensorSlot> slots_;
  std::unordered_map<std::string, size_t> by_hf_;
  /// internal name -> indices into hf_names_/slots_, in slice order.
  std::unordered_map<std::string, std::vector<size_t>> by_internal_;
  bool tie_word_embeddings_ = false;
  std::string tied_hf_name_;
};

}  // namespace gatehouse::worker
