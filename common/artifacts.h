// The files a validation cell's attempt keeps as artifacts (docs/protocols.md §7): the plot
// data its gates write under the attempt directory. The worker writes them, the agent uploads
// those present after the worker ends, and the controller refuses any other name or a larger
// file from a validation cell, so an agent token cannot fill the controller's disk through one.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace gatehouse {

/// Relative paths under the attempt directory: per prompt, KL along the position of the
/// inference gate (against upstream) and of the parallel gate (TP=N against TP=1), JSON
/// {"unit": "nats", "reference": "fp32"|"bf16"|"tp1", "prompts": [{"prompt": i, "kl": [...]}]}.
inline constexpr std::string_view kInferenceKlArtifact = "inference/kl_by_position.json";
inline constexpr std::string_view kParallelKlArtifact = "parallel/kl_by_position.json";
inline constexpr std::array<std::string_view, 2> kValidationArtifacts = {kInferenceKlArtifact,
                                                                         kParallelKlArtifact};

/// The largest such file the controller takes, bytes (a float per position and prompt).
inline constexpr int64_t kValidationArtifactMaxBytes = int64_t{8} << 20;

}  // namespace gatehouse
