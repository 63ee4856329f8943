// The cell side of the controller: submitting a body (frozen into a cell, stored once), listing
// and reading cells, cancelling, the report and the logs. Domain logic over the store, the
// dispatcher (waiting reasons, demands) and the lease keeper (cancels to agents): no transport,
// SQLite or libgit2 header.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/cell_identity.h"
#include "controller/dispatcher.h"
#include "controller/lease_keeper.h"
#include "controller/readiness.h"
#include "controller/records.h"
#include "controller/store/store.h"

namespace gatehouse::controller {

/// Result of a submission: the cell, or (pending set) no cell yet because a directory digest is
/// still being computed; nothing was stored then, and the same body is to be submitted again.
struct SubmitOutcome {
  CellDetail cell;
  bool created = false;  // false: the same inputs were submitted before
  std::optional<DigestPending> pending;
};

/// What GET /api/v1/readiness answers: the combinations and which branches they count.
struct ReadinessView {
  std::vector<ReadinessCombination> combinations;
  bool all_branches = false;  // every branch counted (branches=all)
  /// Without all_branches: the designation of every repository with a validation cell or a
  /// stored policy, by repository.
  std::vector<BranchDesignation> designations;
};

/// Threading: thread-safe (its state is the store's). Blocking: Submit fetches git (it hashes
/// a small directory itself and never waits for a large one); the rest does SQLite work.
class CellService {
 public:
  /// `schedule` asks for a scheduling pass (after a cell is created).
  CellService(Store& store, CellFreezer& freezer, Dispatcher& dispatcher, LeaseKeeper& leases,
              std::function<void()> schedule);

  /// Freezes the body (docs/protocols.md §1-2) and stores the cell with attempt 1 unless it
  /// exists (first its reference cell, when the body named no reference); a new cell's demand
  /// goes to the dispatcher and a pass is asked for. While a digest is computed, answers
  /// `pending` and stores nothing. The checkpoint's facts are recorded once per digest for
  /// the memory estimate. Errors: as CellFreezer::Freeze; INVALID_ARGUMENT when
  /// `reference.cell` names no reference cell or `control` no cell (checked before a pending
  /// answer), or when the cell's (or its new reference cell's) memory estimate fits no agent
  /// that ever registered a memory size (AdmitMemory); INTERNAL on a store failure.
  Result<SubmitOutcome> Submit(std::string_view body, const std::string& submitter);

  /// An agent registered with a node of `memory_bytes` and a smallest GPU of
  /// `gpu_memory_bytes` (0: not reported): submit's admission counts it from now on.
  void NoteAgentMemory(const std::string& name, int64_t memory_bytes, int64_t gpu_memory_bytes);

  /// Cells newest first. `limit` in [1, 500], `offset` >= 0.
  Result<std::vector<CellSummary>> ListCells(int limit, int offset);

  /// NOT_FOUND "cell '<id>' not found". A queued latest attempt carries the dispatcher's last
  /// waiting reason.
  Result<CellDetail> GetCell(const std::string& id);

  /// Cancels the cell's latest attempt: a queued one ends cancelled at once; for a leased or
  /// running one the cancel is recorded and sent to its agent, which stops the worker group
  /// (grace, then kill) and reports the end, and the attempt ends cancelled (if the agent is
  /// lost first, the lease expiry ends it cancelled, without a retry). A second cancel while
  /// one is pending changes nothing. Errors: NOT_FOUND as GetCell; FAILED_PRECONDITION naming
  /// the state when the latest attempt has already ended.
  Result<CellDetail> CancelCell(const std::string& id, const std::string& reason);

  /// Runs the cell again: a new attempt, queued, when its latest one ended without a verdict
  /// (error, lost, cancelled, timed_out, blocked). The cells it waits for (reference.cell,
  /// control) that ended the same way are retried first, so a cell blocked by a reference
  /// cell's infrastructure error runs once that reference runs. Errors: NOT_FOUND as GetCell;
  /// FAILED_PRECONDITION as Store::RetryCell, or when a cell it waits for ended failed (it
  /// would be blocked again).
  Result<CellDetail> RetryCell(const std::string& id);

  /// ComputeReadiness (controller/readiness.h) over every stored cell, hidden ones only with
  /// `include_hidden`, and only cells submitted on a designated branch of their repository
  /// (OnDesignatedBranches) unless `all_branches`. INTERNAL on a store failure.
  Result<ReadinessView> Readiness(bool include_hidden = false, bool all_branches = false);

  /// The designated branches of every repository with a validation cell or a stored policy, by
  /// repository; of `repository` alone when it is not empty ("unknown" when nothing is known
  /// of it). INTERNAL on a store failure.
  Result<std::vector<BranchDesignation>> Designations(const std::string& repository = "");

  /// Designates `branches` (checked by the caller) of `repository` for readiness and the
  /// matrix, recording `actor` and `reason`; an empty list goes back to the default branch.
  /// Returns the designation now. INTERNAL on a store failure.
  Result<BranchDesignation> SetDesignatedBranches(const std::string& repository,
                                                  const std::vector<std::string>& branches,
                                                  const std::string& actor,
                                                  const std::string& reason);

  /// Hides cell `id` from readiness and the matrix (`hidden`), or shows it again, recording
  /// `actor` (the caller's token name) and `reason` (Store::SetCellHidden); the cell and its
  /// evidence stay. Errors: NOT_FOUND as GetCell; FAILED_PRECONDITION when it already is;
  /// INVALID_ARGUMENT for an empty reason.
  Result<CellDetail> SetHidden(const std::string& id, bool hidden, const std::string& actor,
                               const std::string& reason);

  /// The dashboard's matrix: Store::Matrix arranged by ArrangeMatrix (controller/readiness.h),
  /// and what it can be filtered by. Only cells on designated branches count unless
  /// `all_branches` or the filter names a branch. INTERNAL on a store failure.
  Result<std::pair<Matrix, MatrixChoices>> CellMatrix(MatrixFilter filter, std::string_view status,
                                                      bool all_branches = false);

  /// The Markdown evidence report (controller/report.h). NOT_FOUND as GetCell.
  Result<std::string> Report(const std::string& id);

  /// A log stream of the cell's latest attempt (or of attempt `number`), chunks in offset
  /// order, from byte `from` on. NOT_FOUND for an unknown cell or attempt number.
  Result<std::string> ReadLog(const std::string& id, const std::string& stream,
                              std::optional<int> number, int64_t from = 0);

 private:
  /// Reads and records the facts of spec's checkpoint unless recorded for its digest. A
  /// checkpoint whose facts cannot be read is logged and left unestimated.
  Status RecordCheckpointFacts(const CellSpec& spec);
  /// INVALID_ARGUMENT when agents that registered a memory size exist and none of them, idle,
  /// could hold the estimate of `spec` (MemoryMisfit names the figures); OK otherwise.
  Status AdmitMemory(const CellSpec& spec);
  /// The memory of every agent that ever registered, by name: read from the store once, then
  /// kept current by NoteAgentMemory.
  struct AgentMemory {
    int64_t host_bytes = 0;
    int64_t gpu_bytes = 0;  // its smallest GPU's
  };
  Result<std::map<std::string, AgentMemory>> FleetMemory();

  std::mutex fleet_mu_;
  std::optional<std::map<std::string, AgentMemory>> fleet_;

  Result<CellDetail> LoadDetail(const CellRecord& cell);
  // Appends to `plan` the cells to retry for cell `id`, the ones it waits for first; refuses
  // (changing nothing) when one of them cannot be; `depth` bounds the chain.
  Status PlanRetry(const std::string& id, int depth, std::vector<std::string>* plan);
  // Stores `frozen` with its first attempt unless it exists; true when created.
  Result<bool> StoreCell(const FrozenCell& frozen, const std::string& submitter);
  // INVALID_ARGUMENT naming `field` unless cell `id` exists (and is a reference cell).
  Status CheckNamedCell(const std::string& id, std::string_view field, bool must_be_reference);
  // CheckNamedCell for the spec's reference.cell (when the body named it: not
  // `auto_reference`) and control.
  Status CheckNamedCells(const CellSpec& spec, bool auto_reference);

  Store& store_;
  CellFreezer& freezer_;
  Dispatcher& dispatcher_;
  LeaseKeeper& leases_;
  const std::function<void()> schedule_;
};

}  // namespace gatehouse::controller
