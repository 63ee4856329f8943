// What the `gatehouse` CLI makes of cell objects (docs/protocols.md §1): whether a cell has
// ended, the exit code CI acts on, progress lines as phases end, and JUnit XML.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace gatehouse::cli {

/// Exit codes of `gatehouse submit --wait` and `gatehouse wait` (docs/cli.md). Each is distinct
/// so that CI can act on it.
enum ExitCode : int {
  kExitPass = 0,     // every cell passed
  kExitFail = 1,     // at least one cell failed: a gate FAILed (the adapter's evidence)
  kExitUsage = 2,    // bad flags, a bad matrix or a submit the controller refused (4xx)
  kExitBlocked = 3,  // no FAIL, but a cell ended error / lost / cancelled / timed_out, or a
                     // phase BLOCKED or UNKNOWN: no verdict on the adapter
  kExitTimeout = 4,  // --timeout-s ran out before every cell ended
  kExitUnreachable = 5,  // the controller could not be reached or answered 5xx
};

/// True for a cell status that no longer changes: passed, failed, error, lost (a lost attempt
/// that was retried is no longer the latest), cancelled, timed_out.
bool IsFinalStatus(std::string_view status);

/// The exit code for cells that have all ended: kExitFail if any failed, else kExitBlocked if
/// any is not passed, else kExitPass.
int VerdictExitCode(const std::vector<nlohmann::json>& cells);

/// One line per phase of `cell` that has ended and is not in `seen` (which gains it):
/// "<id 12 hex> <phase> <STATUS> <seconds> s[: <reason>]".
std::vector<std::string> NewPhaseLines(const nlohmann::json& cell, std::set<std::string>& seen);

/// What `--wait` prints when `cell` ends: "<id> <status>" (the full id), then, for a cell
/// that ended without a verdict (error, lost, cancelled, timed_out, blocked), its latest
/// attempt's reason, each line as "  <line>" (a failed build's reason carries the build's
/// last lines). Passed and failed cells get the first line alone: their phase lines said why.
std::vector<std::string> EndLines(const nlohmann::json& cell);

/// JUnit XML for CI systems that render it: one <testsuite> per cell (named after the cell id,
/// family and branch), one <testcase> per phase (classname "gatehouse.<family>", name
/// "<id 12 hex>.<phase>", time in seconds); FAIL -> <failure>, BLOCKED / UNKNOWN / unfinished ->
/// <error>, SKIPPED -> <skipped>, each with the reason.
std::string JUnitXml(const std::vector<nlohmann::json>& cells);

}  // namespace gatehouse::cli
