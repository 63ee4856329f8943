// The run spec the agent hands the worker (docs/protocols.md §2 and §3): the frozen cell spec
// plus the `attempt` member. Parsing is strict: the controller fills every default before it
// freezes the cell, so a missing member, an unknown member (at any depth) or a value out of
// range is an error naming the member's path (e.g. "training.steps"). Torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace gatehouse::worker {

/// A path with the controller's content digest ("sha256:<hex>", common/sha256.h
/// DirectoryDigest). The identity gate recomputes it on the node and BLOCKs on a mismatch.
struct DigestedPath {
  std::string path;
  std::string digest;
};

struct RunSpec {
  int64_t spec_version = 1;
  std::string repository;
  std::string commit;  // 40 hex
  std::string model_family;
  DigestedPath checkpoint;  // HF checkpoint directory
  DigestedPath reference;   // reference bundle directory (reference.safetensors + .json)

  struct Runtime {
    std::string torch;   // pinned torch version, "2.11.0" (no local suffix)
    std::string device;  // "cpu" | "cuda"
    std::string cuda;    // pinned CUDA version "13.0"; empty: not pinned (optional member)
  } runtime;

  struct Launch {
    std::string runner;  // "gatehouse-worker"
    int64_t processes_per_rank = 1;
  } launch;

  struct Topology {
    int64_t tp = 1, dp = 1, pp = 1, ep = 1;  // each >= 1
    /// tp * dp * pp: the number of worker ranks.
    int64_t world_size() const { return tp * dp * pp; }
  } topology;

  std::string precision;  // "fp32" | "bf16"
  std::string mode;       // "eager" | "cuda_graph"

  struct Decode {
    int64_t max_new_tokens = 32;  // >= 1
    std::string sampling;         // "greedy"
  } decode;

  struct Training {
    int64_t steps = 2;  // >= 2 optimizer steps
    double lr = 1e-3;   // AdamW learning rate, > 0
    int64_t seed = 1234;
  } training;

  std::map<std::string, std::string> env;
  /// Requested phases, each a name of kPhases, no duplicates, in the order given.
  std::vector<std::string> phases;

  struct Attempt {
    int64_t id = 0;
    std::string dir;  // absolute; artifacts go under here
    struct Checkout {
      std::string head;  // SHA the agent checked out
      bool clean = false;
      std::string path;
    } checkout;
    std::string agent;
  } attempt;

  /// True when `phase` is in `phases`.
  bool Requested(std::string_view phase) const;
};

/// Parses and validates a run spec. Errors: INVALID_ARGUMENT naming the member path and the
/// offending value (missing, unknown, wrong type, out of range).
Result<RunSpec> ParseRunSpec(const nlohmann::json& json);

/// Reads `path` (JSON) and parses it. Errors: NOT_FOUND (cannot read), INVALID_ARGUMENT (bad
/// JSON or spec), naming the path.
Result<RunSpec> LoadRunSpec(const std::filesystem::path& path);

}  // namespace gatehouse::worker
