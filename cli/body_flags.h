// The flags that fill a submit body's cell fields (docs/cli.md), shared by `gatehouse submit`
// and `gatehouse run`, so a local run and a submit of the same flags freeze the same spec.
#pragma once

#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace gatehouse::cli {

/// Values of the body flags; empty / 0 when not given.
struct BodyFlags {
  std::string family, checkpoint, reference, precision, mode, device, phases;
  int tp = 0, max_new_tokens = 0, steps = 0;
};

/// Adds --family, --checkpoint, --reference, --precision, --mode, --device, --tp, --phases,
/// --max-new-tokens and --training-steps to `command`, writing into `flags` (which must outlive
/// the parse).
void AddBodyFlags(CLI::App& command, BodyFlags& flags);

/// Sets the body members of the flags that were given (model_family, checkpoint, ...,
/// topology.tp, decode.max_new_tokens, training.steps, phases split at commas), replacing what
/// `body` had for them.
void ApplyBodyFlags(const BodyFlags& flags, nlohmann::json& body);

}  // namespace gatehouse::cli
