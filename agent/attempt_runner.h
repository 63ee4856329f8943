// One attempt from assignment to end: checkout, recipe, build, worker (docs/architecture.md
// "Run of one attempt").
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/artifact_channel.h"
#include "agent/attempt_sink.h"
#include "agent/build.h"
#include "agent/checkout.h"
#include "agent/cgroup.h"
#include "agent/cleanup.h"
#include "agent/process.h"
#include "agent/redaction.h"
#include "agent/sandbox.h"
#include "agent/slurm.h"
#include "common/cell_spec.h"

namespace gatehouse::agent {

/// An Assignment as the domain sees it (no protobuf).
struct AttemptAssignment {
  int64_t attempt_id = 0;
  std::string cell_id;
  std::string spec_json;  // the frozen cell spec (docs/protocols.md §2)
  std::vector<InputFile> inputs;  // files to fetch first (a reference cell's bundle)
  /// `gatehouse run`: build and run this working tree as it is (committed or not) instead of
  /// checking out spec.commit; its HEAD must still be spec.commit. Empty: the agent's checkout.
  std::filesystem::path local_tree;
  /// With local_tree: the worker's GATEHOUSE_LOCAL_RUN (WorkerLaunch::local_run).
  std::string local_run;
  /// The controller's estimate of the attempt's host memory (Assignment.memory_estimate_bytes;
  /// 0: none) and its make-up. Without --attempt-memory-limit the attempt's cgroup gets
  /// MemoryLimitFor(estimate).
  int64_t memory_estimate_bytes = 0;
  std::string memory_estimate;
};

/// The cgroup memory limit of an attempt whose processes are estimated at `estimate_bytes`:
/// the estimate plus a margin of a quarter of it, at least 1 GiB, but no more than the node
/// holds less the controller's reserve for the system and the agent (1 GiB; `node_bytes` 0:
/// not known, not capped) and never below the estimate; 0 (none) for no estimate. Without
/// the cap a large cell's limit could pass the node's memory, and the kernel's global OOM
/// killer, not the attempt's cgroup, would choose what dies.
int64_t MemoryLimitFor(int64_t estimate_bytes, int64_t node_bytes = 0);

struct RunnerConfig {
  /// Absolute. Clones under repos/, build trees under build/, attempts under attempts/<id>/.
  std::filesystem::path work_dir;
  std::filesystem::path sdk_dir;
  std::string cmake_prefix_path;
  std::filesystem::path cmake = "cmake";
  std::filesystem::path worker;  // gatehouse-worker
  std::string agent_name;
  std::vector<int> gpu_indices;  // this node's GPUs (nvidia-smi index); worker_launcher.h VisibleDevices
  std::vector<std::string> gpu_models;  // their models, parallel to gpu_indices
  /// Secret values redacted from every log chunk, event and end reason (--secret-env).
  Redactor redactor;
  /// How long processes a build step or worker leaves behind may hold its output after it
  /// exits (--log-flush-timeout-ms; ProcessSpec::log_flush_timeout).
  std::chrono::milliseconds log_flush_timeout{2000};
  /// Checks what each attempt left behind (cleanup evidence); nullptr: no check.
  const CleanupChecker* cleanup = nullptr;
  /// The node's memory (MemTotal, Capabilities.memory_bytes): caps MemoryLimitFor. 0: unknown.
  int64_t node_memory_bytes = 0;
  /// The reference runner (protocols.md §3.4): `<python> <script> --run-spec run.json --out
  /// DIR`. Empty python: this agent runs no reference cells.
  std::filesystem::path reference_python;
  std::filesystem::path reference_script;
  /// The Python lane's interpreter (BuildConfig::python: its pip installs Python-lane
  /// recipes). Empty: Python-lane attempts end with a build error saying so.
  std::filesystem::path python;
  /// Set on an agent for a Slurm cluster (gatehouse-agent --slurm): every worker and reference
  /// runner runs as a Slurm job step (WorkerLaunch::slurm). Not owned.
  const SlurmConfig* slurm = nullptr;
  /// Set when validation attempts are isolated (gatehouse-agent --sandbox bwrap): their build
  /// steps (BuildConfig::wrap: checkout read-only, build dir and caches writable, the node's
  /// network for pip's index steps only) and ranks (their checkout, plugins, Python paths and
  /// attempt dir only) run in one AttemptSandbox.
  /// An attempt whose sandbox cannot be made ends with outcome "error" ("sandbox: ..."), never
  /// unsandboxed. Not owned.
  const SandboxConfig* sandbox = nullptr;
  /// The agent's cgroup settings (PrepareCgroups; gatehouse-agent --cgroup): with version 1 or 2
  /// each attempt's build steps and ranks (a reference cell's runner too) run in an
  /// AttemptCgroup of their own, which is emptied and removed at the attempt's end; a failed
  /// attempt whose processes the OOM killer ended says so in its end reason. With version 0 the
  /// ranks' evidence says "none: <why>". An attempt whose cgroup cannot be made ends with
  /// outcome "error" ("cgroup: ..."). nullptr: no cgroup and no evidence line. Not owned.
  const CgroupConfig* cgroup = nullptr;
};

/// Runs attempts one after another, reporting to an AttemptSink.
///
/// Threading: not thread-safe; Run() is called from a single runner thread. Cancellation comes
/// through the CancelToken, whose flag any thread may set.
class AttemptRunner {
 public:
  explicit AttemptRunner(RunnerConfig config);

  /// Where artifacts go and inputs come from (the controller); nullptr: a reference cell or a
  /// cell with inputs ends with outcome "error" naming what could not be stored or fetched.
  void SetArtifactChannel(ArtifactChannel* artifacts) { artifacts_ = artifacts; }

  /// Runs `assignment` to its end and calls sink.End() exactly once, last. Failures before the
  /// worker runs end the attempt with outcome "error" and a reason that says which step failed:
  /// "invalid spec: ...", "checkout failed: ...", "gatehouse.recipe.json ...", "build failed: ...",
  /// "cancelled: ...". With secrets configured, `sink` only sees redacted text.
  /// With a cleanup checker, the check's JSON report goes to log stream "cleanup" before the
  /// end; a failed check makes the runner unhealthy (see healthy()).
  void Run(const AttemptAssignment& assignment, AttemptSink& sink, CancelToken cancel = {});

  /// False after a failed cleanup check, until Recheck() is clean: the agent drains.
  bool healthy() const { return drain_reason_.empty(); }
  /// Why the agent drains ("cleanup after attempt 7: 1 leftover process: pid 42 (sleep)");
  /// empty when healthy.
  const std::string& drain_reason() const { return drain_reason_; }
  /// Checks again what the failed check found (same directory and ports); clears the drain
  /// when clean. Returns healthy().
  bool Recheck();

 private:
  AttemptEndReport RunSteps(const AttemptAssignment& assignment, AttemptSink& sink,
                            CancelToken cancel, std::vector<int>& used_ports);
  /// A reference cell: the reference runner, then its bundle stored as artifacts.
  AttemptEndReport RunReference(int64_t id, CellSpec spec, const AttemptAssignment& assignment,
                                AttemptSink& sink, CancelToken cancel,
                                std::vector<int>& used_ports);
  /// Fetches the reference bundle files of `inputs` (through the node's cache under
  /// <work_dir>/artifacts) into `dir`; returns the directory's digest. Errors name the file.
  Result<std::string> FetchReference(const std::vector<InputFile>& inputs,
                                     const std::filesystem::path& dir);

  RunnerConfig config_;
  ArtifactChannel* artifacts_ = nullptr;
  GitCheckout git_;
  std::string drain_reason_;
  int64_t unhealthy_attempt_ = 0;
  std::filesystem::path unhealthy_dir_;
  std::vector<int> unhealthy_ports_;
};

}  // namespace gatehouse::agent
