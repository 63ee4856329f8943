// Running one attempt's ranks as a Slurm job step and supervising it (docs/protocols.md §3.5);
// the pure parts (shape, srun's arguments, job states) are slurm.h's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "agent/attempt_sink.h"
#include "agent/process.h"
#include "agent/slurm.h"
#include "agent/worker_crash.h"

namespace gatehouse::agent {

/// Log stream of srun's own lines (no task label): allocation, node failures, cancels.
inline constexpr std::string_view kSlurmStream = "slurm";

/// One attempt for RunSlurmRanks: the worker command every rank runs, and the job.
struct SlurmRun {
  int64_t attempt_id = 0;
  ProcessSpec worker;  // exe, args, cwd (the attempt dir), env (the spec's and the agent's)
  std::string job_name;  // SlurmJobName
  SlurmShape shape;
  bool cuda = false;
  /// `worker` is a bwrap command (AttemptSandbox::WrapSlurmTask): each task runs
  /// `gatehouse-slurm-rank --sandboxed`, which drops the covers its node has nothing under.
  bool sandboxed = false;
};

/// Runs `srun <SrunArgs> <config.rank_exe> [--sandboxed] -- <worker.exe> <worker.args>` (the
/// allocation and the step in one: the job lives as long as srun) and relays it as RunWorker
/// relays local ranks: srun --label prefixes each task's line with its number, so task r's
/// standard output goes through its own WorkerStdoutRelay (events share one sequence; text on
/// RankLogStream("worker-stdout", r)) and its standard error to RankLogStream("worker", r);
/// srun's own lines go to kSlurmStream.
///
/// Cancel: `scancel --name=<job_name>` (Slurm signals every task, then kills them after its
/// KillWait); srun itself gets SIGTERM, then SIGKILL, when it has not ended cancel.grace later.
/// The end, once srun has exited and the job has left the running states (squeue, waited for
/// up to 30 s):
///  - "finished" when every rank emitted run_end (exit code srun's);
///  - else SlurmEnd's outcome for the job's state ("lost" for a node failure or a cancel from
///    outside; "error" otherwise), with the ranks that did not emit run_end, srun's exit and its
///    last own line, and for the first of those ranks that wrote to its standard error (else
///    the first) "; rank R was in phase P" and "; rank R's last stderr lines: ..."
///    (TailLines::Summary); "(cancelled)" when the agent cancelled it;
///  - "error" naming srun's exit and last line when the job cannot be found (srun could not
///    allocate: bad partition, too many nodes) or srun cannot start.
/// A job still pending or running after srun ended is cancelled. `seq` is events + 1.
/// `crash`, when given, is set for an "error" end of a job the agent did not cancel, naming that
/// rank (WorkerCrash; srun's exit code and signal stand for the task's).
AttemptEndReport RunSlurmRanks(const SlurmConfig& config, const SlurmRun& run, AttemptSink& sink,
                               CancelToken cancel = {},
                               std::optional<WorkerCrash>* crash = nullptr);

/// At agent start: cancels the jobs an earlier run of this agent left in the queue (its srun was
/// killed with it; the controller has already ended those attempts lost). Returns the ids
/// cancelled. Errors: UNAVAILABLE when squeue or scancel fails, with its message.
Result<std::vector<std::string>> CancelLeftoverJobs(const SlurmConfig& config,
                                                    std::string_view agent_name);

}  // namespace gatehouse::agent
