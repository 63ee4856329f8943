// A matrix file: one JSON file in the adaptation repository that names every cell CI submits,
// as the product of its axes (docs/cli.md, "Matrix files").
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "common/status.h"

namespace gatehouse::cli {

/// The most cells one matrix may expand to: a typo in an axis must not queue thousands.
inline constexpr size_t kMaxMatrixCells = 256;

/// Expands a matrix object into submit bodies (docs/protocols.md §1), one per combination, in
/// axis order (repository, branch, checkpoints, precision, topology, mode, device; the last
/// varies fastest). Each axis is a value or a non-empty list of values; "checkpoints" items are
/// a checkpoint path or {"checkpoint", "reference"}; "base" holds the submit members every cell
/// shares (training, decode, phases, env, runtime, priority, commit, model_family, ...).
/// The bodies are not validated here: the controller does that, naming the field.
/// Errors: INVALID_ARGUMENT naming the member: not an object, an unknown member, an empty
/// list, a checkpoint item of the wrong form, a member both on an axis and in "base", or more
/// than kMaxMatrixCells cells.
Result<std::vector<nlohmann::json>> ExpandMatrix(const nlohmann::json& matrix);

}  // namespace gatehouse::cli
