// Launching the worker for one attempt: run.json, the ranks and their supervision
// (docs/protocols.md §3, §3.1); the output relay of each rank is output_relay.h's (§4).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/attempt_sink.h"
#include "agent/checkout.h"
#include "agent/output_relay.h"
#include "agent/process.h"
#include "agent/sandbox.h"
#include "agent/slurm.h"
#include "agent/worker_crash.h"
#include "common/cell_spec.h"
#include "common/status.h"

namespace gatehouse::agent {

/// Everything one worker launch needs.
struct WorkerLaunch {
  int64_t attempt_id = 0;
  std::filesystem::path attempt_dir;  // absolute; created when missing; the worker's cwd
  CellSpec spec;                       // the frozen cell spec
  CheckoutResult checkout;
  std::vector<std::filesystem::path> plugins;  // absolute
  /// Python lane: `--python-entry` each, and `--python-path` each (where pip installed the
  /// repository, then its dependency layer), in order.
  std::vector<std::string> python_entries;
  std::vector<std::filesystem::path> python_path;
  std::filesystem::path worker;       // the gatehouse-worker executable (or the reference runner)
  /// Arguments before `--run-spec run.json` and after the plugins: a reference cell runs
  /// `<python> <script> --run-spec run.json --out <dir>` (protocols.md §3.4).
  std::vector<std::string> args_before, args_after;
  std::string agent_name;
  std::vector<int> gpu_indices;       // this agent's GPUs (nvidia-smi index); empty: none
  std::vector<std::string> gpu_models;  // their models, parallel to gpu_indices ("NVIDIA H200")
  std::chrono::milliseconds log_flush_timeout{2000};  // ProcessSpec::log_flush_timeout
  /// Set on an agent for a Slurm cluster: the ranks run as one Slurm job step
  /// (RunSlurmRanks, slurm_launcher.h) instead of local processes.
  const SlurmConfig* slurm = nullptr;
  /// Set when attempts are isolated (gatehouse-agent --sandbox bwrap): every local rank runs
  /// inside it (AttemptSandbox::Wrap), seeing `sandbox_paths` (its checkout, plugins' dirs,
  /// Python paths, attempt dir). Not used for Slurm steps.
  const AttemptSandbox* sandbox = nullptr;
  SandboxPaths sandbox_paths;
  /// The attempt's cgroup (AttemptCgroup::Join): every local rank joins it before it execs.
  /// Empty: none. Not used for Slurm steps.
  std::vector<std::filesystem::path> cgroup_dirs;
  /// GATEHOUSE_CGROUP for the local ranks (the identity gate's `cgroup` figure):
  /// AttemptCgroup::Describe(), or "none: <why>". Empty: not set.
  std::string cgroup_evidence;
  /// GATEHOUSE_LOCAL_RUN for every rank (protocols.md §3.9): what makes the run local and
  /// unfrozen (`gatehouse run`: "local, unfrozen; tree has 2 changed files: a.cc, b.h"). Always
  /// set, empty for an agent's attempt, so that no inherited value reaches a frozen cell's
  /// worker.
  std::string local_run;
  /// GATEHOUSE_BUILD for every rank (protocols.md §5.1): the attempt's build time and ccache
  /// figures (BuildEvidence, agent/build.h), which the identity gate records. Always set, empty
  /// when nothing was built (a reference cell).
  std::string build_evidence;
};

/// run.json: the frozen spec plus "attempt": {id, dir, checkout: {head, clean, path}, agent}.
nlohmann::json MakeRunSpec(const WorkerLaunch& launch);

/// A TCP port on 127.0.0.1 that was free a moment ago: binds a socket to port 0, reads the port
/// the kernel chose and closes the socket (torchrun's way; another process may take it before
/// the worker binds it). Errors: UNAVAILABLE naming the failing call and the OS error.
Result<int> FindFreePort();

/// CUDA_VISIBLE_DEVICES for every rank of an attempt on an agent with GPUs `gpu_indices`
/// (one attempt at a time per agent): a cuda cell sees the first world_size() of them, one per
/// rank, which each rank uses as device LOCAL_RANK; a cell pinning runtime.gpu_model sees the
/// first world_size() whose model (`gpu_models`, parallel to gpu_indices) contains the pin,
/// case-insensitively, as the scheduler matches it (a node may mix GPU models); a CPU cell sees
/// none (""), so it cannot touch a GPU by accident. CUDA_DEVICE_ORDER=PCI_BUS_ID is set with it
/// (nvidia-smi's order). nullopt when the agent has no GPUs (nothing is set). The value wins
/// over a CUDA_VISIBLE_DEVICES in the spec's env. Models match with GpuModelMatches
/// (common/cell_spec.h), as the scheduler's. Errors: FAILED_PRECONDITION when a cuda cell
/// needs more GPUs (of the pinned model) than the agent has, naming both counts.
Result<std::optional<std::string>> VisibleDevices(const CellSpec& spec,
                                                  const std::vector<int>& gpu_indices,
                                                  const std::vector<std::string>& gpu_models = {});

/// The log stream of rank `rank` for a worker stream: `stream` itself for rank 0,
/// `<stream>.rank<rank>` for the others ("worker.rank1", "worker-stdout.rank3").
std::string RankLogStream(std::string_view stream, int rank);

/// The extra environment of rank `rank` of `world_size`: the spec's "env" entries (in key
/// order), then the rank variables, which win over the spec's. For world_size 1: RANK=0,
/// WORLD_SIZE=1, LOCAL_RANK=0. For more (torchrun's conventions, one node): RANK, WORLD_SIZE,
/// LOCAL_RANK=RANK, LOCAL_WORLD_SIZE=WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=master_port.
std::vector<std::pair<std::string, std::string>> WorkerEnvironment(const CellSpec& spec,
                                                                   int rank = 0,
                                                                   int world_size = 1,
                                                                   int master_port = 0);

/// Writes `<attempt_dir>/run.json` and runs spec.topology.world_size() worker processes
/// ("ranks"), each
/// `<worker> --run-spec <attempt_dir>/run.json --plugin <p>... [--python-entry <e>...
/// --python-path <dir>]` with cwd = attempt_dir and
/// env = the agent's environment + WorkerEnvironment(spec, rank, world size, one free port),
/// each on its own thread through RunProcess. Every rank's standard output goes through a
/// WorkerStdoutRelay (text on RankLogStream("worker-stdout", rank)) and its standard error to
/// RankLogStream("worker", rank); all sink calls are serialised and the attempt's events share
/// one sequence (1, 2, 3, ... in relay order). Events are relayed verbatim.
///
/// A rank fails when it cannot start, ends without a run_end event, or exits non-zero or by a
/// signal. The first failure the agent observes (or `cancel`) stops every other rank: SIGTERM
/// to its process group, then SIGKILL after `cancel.grace`. Returns once every rank has ended
/// and every thread has joined. Does not call sink.End(); returns the report to send:
///  - "finished" with rank 0's exit code when every rank emitted run_end (with more than one
///    rank, a rank r > 0 whose run_end status differs from rank 0's, or that exited non-zero
///    after its run_end, gets a "gatehouse-agent: ..." line on log stream "worker");
///  - else "error". One rank: "worker exited with code N [(signal S)] before run_end
///    [(cancelled)]" or "cannot start worker: ...". More: "rank R of N exited with code C
///    [(signal S)] before|after run_end[; ranks a, b stopped]", "cannot start rank R of N: ...",
///    or "ranks a, b of N stopped before run_end (cancelled)"; exit_code is the failed rank's.
///    A worker or rank that died on its own says where and why: " in phase P" when it had
///    started P and not ended it, and "; its last stderr lines: ..." (one worker) or "; rank R's
///    last stderr lines: ..." (TailLines::Summary of its standard error) when it wrote any.
/// Errors before any launch (too few GPUs, attempt dir, run.json, no free port) are "error" ends
/// too. With launch.slurm set, the ranks run through RunSlurmRanks instead, with the same
/// streams and the end it reports (a job too large for the Slurm config is an "error" end). `seq` is events + 1.
/// `used_ports`, when given, receives the ports the ranks were told to use (MASTER_PORT), for
/// the cleanup check. `crash`, when given, is set when the end is "error" because a rank died
/// by itself (WorkerCrash), and left empty otherwise.
AttemptEndReport RunWorker(const WorkerLaunch& launch, AttemptSink& sink, CancelToken cancel = {},
                           std::vector<int>* used_ports = nullptr,
                           std::optional<WorkerCrash>* crash = nullptr);

}  // namespace gatehouse::agent
