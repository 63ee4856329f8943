// The flags that fill a submit body's cell fields (docs/cli.md), shared by `gatehouse submit`
// and `gatehouse run`, so a local run and a submit of the same flags freeze the same spec.
#pragma once

#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/status.h"

namespace gatehouse::cli {

/// Values of the body flags; empty / 0 when not given.
struct BodyFlags {
  std::string family, checkpoint, reference, precision, mode, device, phases;
  int tp = 0, max_new_tokens = 0, steps = 0;
  /// --mesh "dp_shard=2,tp=2": topology members (docs/protocols.md §2), checked for form here
  /// and for values by the controller.
  std::string mesh;
};

/// The topology members of a --mesh value "KEY=N[,KEY=N...]" (KEY one of tp, dp, pp, ep,
/// dp_shard, cp, etp; N a positive integer). Errors: INVALID_ARGUMENT naming the item.
Result<nlohmann::json> ParseMeshFlag(std::string_view value);

/// Adds --family, --checkpoint, --reference, --precision, --mode, --device, --tp, --mesh,
/// --phases, --max-new-tokens and --training-steps to `command`, writing into `flags` (which must outlive
/// the parse).
void AddBodyFlags(CLI::App& command, BodyFlags& flags);

/// Sets the body members of the flags that were given (model_family, checkpoint, ...,
/// topology.tp and the --mesh members, decode.max_new_tokens, training.steps, phases split at commas), replacing what
/// `body` had for them.
void ApplyBodyFlags(const BodyFlags& flags, nlohmann::json& body);

}  // namespace gatehouse::cli
