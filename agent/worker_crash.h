// A worker rank that died on its own inside a phase, and what the agent makes of it: the same
// crash twice on the same inputs is the adapter's FAIL, not an infrastructure error
// (docs/protocols.md §3.8).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/cell_spec.h"

namespace gatehouse::agent {

/// How a worker group ended when one of its ranks died by itself: not cancelled, not stopped by
/// the agent after another rank's failure, and not unable to start. Filled by the launchers
/// (RunWorker, RunSlurmRanks) from the rank's relay (its phase) and its standard error
/// (TailLines).
struct WorkerCrash {
  int rank = 0;
  int world_size = 1;
  /// The dying rank's phase in progress (WorkerStdoutRelay::current_phase); empty when it died
  /// between phases (before its first phase_start, or after a phase_end).
  std::string phase;
  /// Rank 0's phase in progress when the group ended: the phase of the evidence (rank 0's
  /// events) that a FAIL must close. Equal to `phase` for a single worker.
  std::string evidence_phase;
  int exit_code = 0;
  int signal = 0;  // the terminating signal; 0 when it exited on its own
  /// TailLines::Summary of its standard error, and the last of those lines ("" when none).
  std::string tail;
  std::string last_line;
};

/// True when a rerun on the same inputs is worth making: the rank died inside a phase (rank 0
/// inside one too), by its own hand (not SIGKILL or SIGTERM, which come from outside: the OOM
/// killer, an operator, a node's shutdown) and was not killed by its cgroup's OOM killer
/// (`oom_killed`).
bool WorthARerun(const WorkerCrash& crash, bool oom_killed);

/// The same crash: the same rank, phase, exit code and signal, and the same last stderr line
/// once hexadecimal addresses ("0x7f3a...") are set aside.
bool SameCrash(const WorkerCrash& a, const WorkerCrash& b);

/// The spec of the rerun: `spec` with its phases cut after `crash.phase` (the phases before it
/// still run: they build the state the crashing phase starts from).
CellSpec RerunSpec(const CellSpec& spec, const WorkerCrash& crash);

/// The events that close the attempt's evidence after a crash that happened twice (protocols.md
/// §4 shapes, untagged: rank 0's view): phase_end of `crash.evidence_phase` with status FAIL,
/// classification adapter_contract and a reason naming the rank, the phase, the exit and the
/// last stderr lines; a lone SKIPPED phase_end for every later phase of kPhases ("skipped:
/// earlier phase P ended FAIL" when `spec` requests it, else "not requested"); run_end FAIL.
/// `ts_ms` stamps them all.
std::vector<std::string> CrashFailEvents(const WorkerCrash& crash, const CellSpec& spec,
                                         int64_t ts_ms);

}  // namespace gatehouse::agent
