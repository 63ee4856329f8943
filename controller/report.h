// The Markdown evidence report of a cell (the evidence of docs/architecture.md "Phases,
// statuses and blame", rendered).
#pragma once

#include <string>

#include "controller/records.h"

namespace gatehouse::controller {

/// Renders the cell's identity, the latest attempt's phase table (phase | status | key figures
/// | reason), the decode phase's text in full when it showed any (prompt, ours, upstream), its
/// attempts, each non-PASS phase's reason, and the submit body that reproduces the cell. Pure
/// function of `detail`.
std::string RenderReport(const CellDetail& detail);

}  // namespace gatehouse::controller
