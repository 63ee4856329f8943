// The controller's domain service, the facade the transports (REST, gRPC) call: submitting and
// reading cells, and the agent side of an attempt's life (registration, events, logs, end).
// It composes the parts that each own one concern: the cell service (cell_service.h: submit,
// list, get, cancel, report, log), the agent registry (agent_registry.h: who is attached, what
// each offers, who is alive), the dispatcher (dispatcher.h: one scheduling pass, the demand
// cache, waiting reasons), the lease keeper (lease_keeper.h: expiry, time limits, reconcile)
// and two background loops (loops.h: the scheduler thread and the one-second maintenance
// thread). No transport, SQLite or libgit2 header.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/agent_registry.h"
#include "controller/cell_identity.h"
#include "controller/cell_service.h"
#include "controller/clock.h"
#include "controller/dispatcher.h"
#include "controller/lease_keeper.h"
#include "controller/loops.h"
#include "controller/readiness.h"
#include "controller/records.h"
#include "controller/scheduler.h"
#include "controller/store/blob_store.h"
#include "controller/store/store.h"

namespace gatehouse::controller {

/// An agent as the API shows it: what it registered with and its live state here.
struct AgentStatus {
  AgentRecord record;        // as stored (capabilities JSON, registered_at, state)
  bool attached = false;     // it has a stream to this controller now
  bool silent = false;       // not heard from within the lease timeout: takes no new work
  std::string drain_reason;  // non-empty while it drains
  int slots = 0;             // while attached
  std::vector<std::string> running_cells;  // the cells of its attempts leased or running
  std::string last_seen_at;  // when this controller last heard from it; empty: not since start
};

/// Domain service of the controller.
///
/// Threading: thread-safe; called from REST handler threads and gRPC callback threads. Blocking:
/// Submit fetches git (directories are hashed on the digest cache's thread); the rest does
/// SQLite work. Scheduling runs after every change that can free or need a slot; assignments
/// are sent outside internal locks.
class ControllerCore {
 public:
  /// `clock` stamps stored rows and time limits (wall time); `lease_clock` measures leases,
  /// heartbeats and silence (monotonic; the controller passes SteadyClock()). Without one,
  /// leases read `clock` (MonotonicFrom: tests move one fake clock).
  ControllerCore(Store& store, CellFreezer& freezer, LeaseConfig lease = {},
                 Clock clock = SystemClock(), TimeLimits limits = {},
                 SchedulingPolicy policy = {}, MonotonicClock lease_clock = {});

  const LeaseConfig& lease_config() const { return agents_.lease(); }

  // ---- REST side: the cell service (cell_service.h documents each) ----

  Result<SubmitOutcome> Submit(std::string_view body, const std::string& submitter);
  Result<std::vector<CellSummary>> ListCells(int limit, int offset);
  Result<CellDetail> GetCell(const std::string& id);
  Result<CellDetail> CancelCell(const std::string& id, const std::string& reason);
  /// CellService::Readiness.
  Result<ReadinessView> Readiness(bool include_hidden = false, bool all_branches = false);
  /// CellService::Designations.
  Result<std::vector<BranchDesignation>> Designations(const std::string& repository = "");
  /// CellService::SetDesignatedBranches.
  Result<BranchDesignation> SetDesignatedBranches(const std::string& repository,
                                                  const std::vector<std::string>& branches,
                                                  const std::string& actor,
                                                  const std::string& reason);
  /// CellService::SetHidden.
  Result<CellDetail> SetHidden(const std::string& id, bool hidden, const std::string& actor,
                               const std::string& reason);
  /// CellService::RetryCell, then schedules.
  Result<CellDetail> RetryCell(const std::string& id);
  Result<std::string> Report(const std::string& id);
  Result<std::string> ReadLog(const std::string& id, const std::string& stream,
                              std::optional<int> number, int64_t from = 0);
  /// CellService::CellMatrix.
  Result<std::pair<Matrix, MatrixChoices>> CellMatrix(const MatrixFilter& filter,
                                                      std::string_view status,
                                                      bool all_branches = false);

  /// Every agent that registered, with its live state (attached, silent, draining, running
  /// attempts). Errors: INTERNAL on a store failure.
  Result<std::vector<AgentStatus>> ListAgents();

  // ---- agent side ----

  /// Stores the agent (id = name) as connected. Call AttachAgent once the agent has been told.
  /// Errors: INVALID_ARGUMENT for an empty name; ALREADY_EXISTS when another instance of that
  /// name (one that sent an instance_id other than hello.instance_id) is attached and not
  /// silent: two agents with one name would take each other's leases.
  Result<std::string> RegisterAgent(const AgentHello& hello);

  /// Makes `channel` the agent's outbound stream (replacing an older one), keeps what it
  /// offers (hello: slots, GPUs, torch version) for scheduling, reconciles its leases with
  /// hello.held_attempts, and schedules. Reconcile: every leased or running attempt of the
  /// agent it does not hold is lost (retried within the cell's limit, as ExpireLeases: it
  /// restarted, or never received the assignment); a held attempt that ended here while it
  /// was away (lost, cancelled), or whose cancel it may have missed, is sent a Cancel.
  /// Errors: ALREADY_EXISTS as RegisterAgent, checked again atomically with the attach (two
  /// instances may both pass RegisterAgent before either attaches); nothing is attached then.
  Status AttachAgent(const std::string& agent_id, const AgentHello& hello,
                     std::shared_ptr<AgentChannel> channel);

  /// The stream of `channel` ended: the agent is disconnected unless a newer stream replaced it.
  /// Its attempts keep their leases: the agent may reconnect and go on (its events carry
  /// (attempt, seq)); ExpireLeases ends them if it stays away.
  void DetachAgent(const std::string& agent_id, const AgentChannel* channel);

  /// Records a heartbeat (any message from an agent also counts as a sign of life) and the
  /// agent's drain state: a non-empty `drain_reason` keeps new work away from it (the waiting
  /// reason of queued cells says so); when it clears, scheduling runs.
  Status Heartbeat(const std::string& agent_id, const std::string& drain_reason = "");

  /// LeaseKeeper::ExpireLeases (lease_keeper.h), then schedules when any attempt was lost.
  /// StartBackgroundWork runs it every second. Returns the attempts lost.
  int ExpireLeases();

  /// LeaseKeeper::EnforceTimeLimits (lease_keeper.h). StartBackgroundWork runs it every
  /// second. Returns the attempts stopped.
  int EnforceTimeLimits();

  /// Stores an event idempotently by (attempt_id, seq) and applies it (phase_start makes the
  /// attempt running). Errors: NOT_FOUND unknown attempt; FAILED_PRECONDITION when the attempt
  /// is leased to another agent. An event line that cannot be interpreted is stored anyway.
  Status RecordEvent(const std::string& agent_id, int64_t attempt_id, int64_t seq,
                     const std::string& json);

  /// Stores a log chunk; a resent offset is ignored. Errors as RecordEvent.
  Status RecordLog(const std::string& agent_id, int64_t attempt_id, const std::string& stream,
                   int64_t offset, const std::string& data);

  /// The agent ended an attempt. outcome "finished": passed if run_end said PASS, else failed
  /// (error when no run_end arrived); "lost" (what ran it was taken away, protocols.md §3.5):
  /// lost with `reason` and retried within the retry limit, as an expired lease (cancelled when
  /// a cancel was requested); "error" (or anything else): error with `reason`. A resend
  /// for an attempt already ended is ignored. `oom_limit_bytes` > 0: the kernel killed one of
  /// its processes at that cgroup memory limit. A finished or OOM-killed attempt's peak memory
  /// is recorded for the estimates (Dispatcher::RecordPeak). Then schedules. Errors as
  /// RecordEvent.
  Status EndAttempt(const std::string& agent_id, int64_t attempt_id, const std::string& outcome,
                    const std::string& reason, int exit_code, int64_t oom_limit_bytes = 0);

  // ---- artifacts (protocols.md §7) ----

  /// The blob store artifacts go to; without one, uploads and fetches are UNAVAILABLE. Set
  /// once, before the transports start.
  void SetBlobStore(BlobStore* blobs) { blobs_ = blobs; }
  /// Starts storing file `name` (CheckArtifactName) of attempt `attempt_id`, leased to
  /// `agent_id` and not ended, as blob `digest` of `size` bytes; Commit the writer, then
  /// RecordArtifact. Only a reference cell stores artifacts, and only reference/reference.json
  /// and reference/reference.safetensors. Errors as RecordEvent; FAILED_PRECONDITION for an
  /// ended attempt; INVALID_ARGUMENT for a bad or refused name or digest; ALREADY_EXISTS when
  /// the attempt stored other bytes under that name; RESOURCE_EXHAUSTED over the size limit.
  Result<std::unique_ptr<BlobStore::Writer>> BeginArtifact(const std::string& agent_id,
                                                           int64_t attempt_id,
                                                           const std::string& name,
                                                           const std::string& digest,
                                                           int64_t size);
  /// Records the committed blob as the attempt's artifact; false for a resend. Errors as
  /// Store::RecordArtifact.
  Result<bool> RecordArtifact(const std::string& agent_id, int64_t attempt_id,
                              const std::string& name, const std::string& digest, int64_t size);
  /// The file of a blob some attempt stored, counted as used now. NOT_FOUND otherwise, and for
  /// a blob retention removed (the message says when and why).
  Result<std::filesystem::path> ArtifactPath(const std::string& digest);
  /// Artifact retention (protocols.md §7): a blob not used for `keep`
  /// (--artifact-retention-days) is removed, and while the stored blobs hold more than
  /// `max_total_bytes` (--artifact-max-total-bytes) the least recently used are, except one used
  /// within kCapKeepsRecent. Zero turns either off (the default: every blob is kept as long as
  /// the database). Set once, before the background work starts.
  void SetArtifactRetention(std::chrono::hours keep, int64_t max_total_bytes = 0) {
    retention_ = keep;
    max_total_bytes_ = max_total_bytes;
  }
  /// One retention pass: marks expired what the retention settings remove (Store::ExpireBlobs)
  /// and removes their files (the first pass also any file left of blobs expired before). Returns how many blobs it expired; 0
  /// without a setting or a blob store. The maintenance thread runs it every
  /// kRetentionInterval. A cell that needs an expired bundle later runs its reference cell
  /// again (Dispatcher).
  Result<int> ExpireArtifacts();
  static constexpr std::chrono::minutes kRetentionInterval{10};
  static constexpr std::chrono::hours kCapKeepsRecent{1};
  /// The artifacts of every attempt of cell `id`, by attempt. NOT_FOUND for an unknown cell.
  Result<std::vector<ArtifactRecord>> ListCellArtifacts(const std::string& id);

  /// Places queued attempts on attached agents (free slots; the torch pin; one free GPU per
  /// rank of a CUDA attempt: scheduler.h), persists the leases and sends the assignments. Why
  /// an attempt keeps waiting is logged when it changes. Errors are logged, not returned.
  /// With the scheduler thread started, only asks that thread for a pass and returns; else
  /// runs the pass on the caller's thread (passes coalesce either way).
  void Schedule();

  /// Starts the background threads: the scheduler thread (from now on Schedule() only asks it
  /// for a pass, so the REST and agent threads never run one; requests made while a pass runs
  /// are served by one more pass, started at most every kMinPassInterval (5 ms), so a burst of
  /// submits is placed a batch per pass) and the maintenance thread (ExpireLeases and
  /// EnforceTimeLimits every second). The controller process starts them; unit tests schedule
  /// on the caller's thread and call ExpireLeases themselves. Idempotent.
  void StartBackgroundWork();
  /// Stops and joins both threads (after their current run); called by the destructor.
  void StopBackgroundWork();
  ~ControllerCore();

 private:
  /// A sign of life from `agent_id`; schedules when it takes work again.
  void Touch(const std::string& agent_id);

  Result<AttemptRecord> AttemptOfAgent(const std::string& agent_id, int64_t attempt_id);

  Store& store_;
  CellFreezer& freezer_;
  const Clock clock_;
  /// Leases, heartbeats and silence run on this clock (never on clock_, which stamps rows).
  const MonotonicClock lease_clock_;
  AgentRegistry agents_;
  Dispatcher dispatcher_;
  LeaseKeeper leases_;
  CellService cells_;
  BlobStore* blobs_ = nullptr;
  std::chrono::hours retention_{0};
  int64_t max_total_bytes_ = 0;
  /// Held while a retention pass removes files, while an upload is recorded and while a fetch
  /// is checked and counted as a use, so no blob is removed behind a new record or a fetch.
  std::mutex blob_mu_;
  std::chrono::steady_clock::time_point last_retention_pass_{};
  bool swept_expired_ = false;  // under blob_mu_: a pass removed every expired blob's file once

  /// Schedule()'s passes, on whichever thread runs them.
  void RunSchedulingPasses();
  /// The scheduler thread starts passes at most this often (batching; see StartBackgroundWork).
  static constexpr std::chrono::milliseconds kMinPassInterval{5};
  /// One scheduling pass at a time (Dispatcher::Pass); AttachAgent holds it too, so a pass
  /// never sends over a channel being replaced and a reconcile reads committed leases.
  std::mutex schedule_mu_;
  std::atomic<bool> schedule_pending_{false};  // a pass was asked for (Schedule coalesces)

  // Declared last: destroyed (threads joined) before the members their tasks use.
  CoalescingLoop scheduling_;
  PeriodicLoop maintenance_;
};

}  // namespace gatehouse::controller
