// The reference bundle: upstream (transformers) outputs on the probe prompts, made by
// tools/refgen and compared against by the inference and decode gates.
//
// A bundle is a directory with
//   reference.json        {"format": "gatehouse-reference/1", ...}; optional "prompts" (array,
//                         one entry per prompt) or "num_prompts" (integer) fixes the count
//   reference.safetensors for each prompt i:
//     prompts.{i}.input_ids   I64 [T]      prompt token ids (T >= 1)
//     prompts.{i}.logits      F32 [T, V]   upstream logits of every prompt position
//     prompts.{i}.greedy_ids  I64 [N]      upstream greedy continuation (new tokens only)
//     prompts.{i}.logits_bf16 F32 [T, V]   optional: upstream logits with the weights and
//                                          compute in bf16 (the bf16 inference reference)
//     prompts.{i}.greedy_ids_bf16 I64 [N]  optional: upstream greedy continuation in bf16
//                                          (the bf16 decode reference)
// Without "prompts"/"num_prompts" the count is the number of consecutive i from 0 for which
// prompts.{i}.input_ids exists.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace gatehouse::worker {

/// Format tag reference.json must carry.
inline constexpr std::string_view kReferenceFormat = "gatehouse-reference/1";

struct ReferencePrompt {
  torch::Tensor input_ids;   // int64 [T], CPU
  torch::Tensor logits;      // float32 [T, V], CPU
  torch::Tensor greedy_ids;  // int64 [N], CPU
  /// float32 [T, V], CPU, or undefined when the bundle has no bf16 run.
  torch::Tensor logits_bf16;
  /// int64 [N], CPU, or undefined when the bundle has no bf16 greedy run.
  torch::Tensor greedy_ids_bf16;
};

struct ReferenceBundle {
  /// True when every prompt carries logits_bf16.
  bool has_bf16() const {
    for (const auto& p : prompts) {
      if (!p.logits_bf16.defined()) return false;
    }
    return !prompts.empty();
  }
  /// True when every prompt carries greedy_ids_bf16.
  bool has_bf16_greedy() const {
    for (const auto& p : prompts) {
      if (!p.greedy_ids_bf16.defined()) return false;
    }
    return !prompts.empty();
  }

  std::filesystem::path dir;
  nlohmann::json meta;  // reference.json as read
  std::vector<ReferencePrompt> prompts;
  int64_t vocab_size = 0;  // V, equal across prompts
};

/// Reads and validates a bundle: the format tag, at least one prompt, each tensor present with
/// the dtype and rank above, logits rows == input_ids length, one V for all prompts. Other
/// tensors and fields are ignored.
/// Errors: NOT_FOUND (directory or file missing), INVALID_ARGUMENT / DATA_LOSS naming the
/// file, the field or the tensor, and the offending value.
Result<ReferenceBundle> LoadReference(const std::filesystem::path& dir);

}  // namespace gatehouse::worker
