// The run spec the agent hands the worker (docs/protocols.md §2 and §3): the frozen cell spec
// (common/cell_spec.h, parsed by the same code as the controller's and the agent's) plus the
// `attempt` member, the facts of this attempt. Torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/cell_spec.h"
#include "common/status.h"

namespace gatehouse::worker {

using ::gatehouse::DigestedPath;

/// The cell spec plus the attempt's facts.
struct RunSpec : CellSpec {
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
};

/// Parses and validates a run spec: the `attempt` member here, the rest with ParseCellSpec.
/// Errors: INVALID_ARGUMENT naming the field and the offending value (missing, unknown, wrong
/// type, out of range), e.g. "missing field 'attempt.dir'".
Result<RunSpec> ParseRunSpec(const nlohmann::json& json);

/// Reads `path` (JSON) and parses it. Errors: NOT_FOUND (cannot read), INVALID_ARGUMENT (bad
/// JSON or spec), naming the path.
Result<RunSpec> LoadRunSpec(const std::filesystem::path& path);

}  // namespace gatehouse::worker
