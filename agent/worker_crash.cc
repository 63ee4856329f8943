// Crashes the agent judges (docs/protocols.md §3.8).
#include "agent/worker_crash.h"

#include <csignal>
#include <regex>

#include <nlohmann/json.hpp>

#include "common/phases.h"

namespace gatehouse::agent {
namespace {

using nlohmann::json;

// The line with its hexadecimal addresses set aside: two runs of one crash print different ones.
std::string WithoutAddresses(const std::string& line) {
  static const std::regex kAddress("0x[0-9a-fA-F]+");
  return std::regex_replace(line, kAddress, "0x?");
}

std::string RankWords(const WorkerCrash& c) {
  return c.world_size > 1 ? "rank " + std::to_string(c.rank) + " of " + std::to_string(c.world_size)
                          : "the worker";
}

std::string ExitWords(const WorkerCrash& c) {
  std::string s = "exited with code " + std::to_string(c.exit_code);
  if (c.signal != 0) s += " (signal " + std::to_string(c.signal) + ")";
  return s;
}

}  // namespace

bool WorthARerun(const WorkerCrash& crash, bool oom_killed) {
  return !crash.phase.empty() && !crash.evidence_phase.empty() && !oom_killed &&
         crash.signal != SIGKILL && crash.signal != SIGTERM;
}

bool SameCrash(const WorkerCrash& a, const WorkerCrash& b) {
  return a.rank == b.rank && a.phase == b.phase && a.exit_code == b.exit_code &&
         a.signal == b.signal && WithoutAddresses(a.last_line) == WithoutAddresses(b.last_line);
}

CellSpec RerunSpec(const CellSpec& spec, const WorkerCrash& crash) {
  CellSpec rerun = spec;
  const std::optional<size_t> last = PhaseIndex(crash.phase);
  rerun.phases.clear();
  for (const std::string& p : spec.phases) {
    const std::optional<size_t> i = PhaseIndex(p);
    if (i && last && *i <= *last) rerun.phases.push_back(p);
  }
  return rerun;
}

std::vector<std::string> CrashFailEvents(const WorkerCrash& crash, const CellSpec& spec,
                                         int64_t ts_ms) {
  std::string reason = RankWords(crash) + " " + ExitWords(crash) + " in phase " + crash.phase +
                       ", and again when the agent reran phases up to " + crash.phase +
                       " on the same inputs: a crash in the adapter's code path";
  if (!crash.tail.empty()) reason += "; last stderr lines: " + crash.tail;
  std::vector<std::string> events;
  events.push_back(json{{"event", "phase_end"},
                        {"phase", crash.evidence_phase},
                        {"status", "FAIL"},
                        {"reason", reason},
                        {"classification", FailureClassName(FailureClass::kAdapterContract)},
                        {"duration_ms", 0},
                        {"ts_ms", ts_ms}}
                       .dump());
  const std::optional<size_t> failed = PhaseIndex(crash.evidence_phase);
  for (size_t i = failed ? *failed + 1 : kPhases.size(); i < kPhases.size(); ++i) {
    const std::string phase(kPhases[i]);
    events.push_back(json{{"event", "phase_end"},
                          {"phase", phase},
                          {"status", "SKIPPED"},
                          {"reason", spec.Requested(phase)
                                         ? "skipped: earlier phase " + crash.evidence_phase +
                                               " ended FAIL"
                                         : std::string("not requested")},
                          {"classification", ""},
                          {"duration_ms", 0},
                          {"ts_ms", ts_ms}}
                         .dump());
  }
  events.push_back(json{{"event", "run_end"}, {"status", "FAIL"}, {"ts_ms", ts_ms}}.dump());
  return events;
}

}  // namespace gatehouse::agent
