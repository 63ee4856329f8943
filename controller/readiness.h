// Readiness (GET /api/v1/readiness, docs/protocols.md §1): for each combination an adapter is
// validated on (model family, checkpoint, device, precision, topology, mode, and the phases run
// and torch pin, so a cell that ran fewer gates never stands for one that ran them all), the
// latest verdict of every adapter commit that has a cell for it. Pure: computed from the stored
// cells.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/cell_spec.h"
#include "controller/records.h"

namespace gatehouse::controller {

/// One adapter commit's standing for one combination: its newest cell decides.
struct ReadinessCommit {
  std::string repository;
  std::string branch;  // the newest cell's branch label
  std::string commit;  // 40 hex
  std::string readiness;  // ReadinessOf(status)
  AttemptState status = AttemptState::kQueued;  // the newest cell's latest attempt
  std::string cell_id;
  std::string created_at;  // the newest cell's
  /// bf16 combinations only: the same commit's readiness in the fp32 combination that is
  /// otherwise equal ("none" without such a cell); empty for fp32 ones.
  std::string fp32_readiness;
};

/// One combination and every commit validated on it, newest cell first.
struct ReadinessCombination {
  std::string model_family;
  DigestedPath checkpoint;
  std::string device;
  std::string precision;
  CellSpec::Topology topology;
  std::string mode;
  std::vector<std::string> phases;  // the gates the cells ran
  std::string torch;                // the runtime pin
  std::vector<ReadinessCommit> commits;
  /// What the combination's verdicts say about the numerics (kBf16NumericsNote for bf16
  /// combinations: their bars are bf16's own rounding envelope; empty for fp32).
  std::string numerics;
};

/// A bf16 cell is held to bf16's envelope of correct implementations, whose rounding is as wide
/// as some real bugs (an RMSNorm without its fp32 upcast, a softmax in bf16: docs/mutations.md):
/// the numerics are claimed by the fp32 cell of the same combination.
inline constexpr std::string_view kBf16NumericsNote =
    "bf16 bars are the envelope of bf16 rounding, wide enough to pass numerics bugs of that size "
    "(an RMSNorm without its fp32 upcast, a softmax in bf16): a numerics claim needs the fp32 "
    "cell of this combination (fp32_readiness per commit)";

/// "validated" (passed), "failed" (a gate FAILed: the adapter is wrong at that commit),
/// "blocked" (the cell could not run: its reference cell or control did not pass), or
/// "unverified" (no verdict: queued, running, error, lost, cancelled, timed_out).
std::string_view ReadinessOf(AttemptState status);

/// Groups the validation cells of `cells` (newest first, as Store::ListCells returns them;
/// reference cells validate no adapter and are left out) by combination, sorted by family,
/// checkpoint, device, precision, topology, mode, phases and torch pin; per (repository,
/// commit) the newest cell decides, whatever its remaining inputs (decode length, training
/// knobs, env). A cell whose stored spec does not parse is skipped. A bf16 combination carries
/// kBf16NumericsNote and, per commit, its readiness in the equal fp32 combination.
std::vector<ReadinessCombination> ComputeReadiness(const std::vector<CellSummary>& cells);

/// Which branches of one repository readiness and the matrix count (docs/protocols.md §1,
/// designated branches).
struct BranchDesignation {
  std::string repository;
  /// "configured" (an admin's set), "default_branch" (none set: the remote's default branch) or
  /// "unknown" (neither known: every branch counts, as before designations existed).
  std::string source;
  std::vector<std::string> branches;  // sorted; empty for "unknown"
  RepositoryBranches stored;          // the row it comes from (repository alone when none)
};

/// The designation of a stored row (or of a repository without one: "unknown").
BranchDesignation DesignationOf(const RepositoryBranches& row);

/// Every repository's designation, to ask whether a cell counts.
class DesignatedBranches {
 public:
  explicit DesignatedBranches(const std::vector<RepositoryBranches>& rows);

  /// Whether a cell of `repository` submitted on `branch` counts: `branch` is designated, or
  /// the repository's designation is "unknown". A cell submitted by commit alone (branch "")
  /// counts only for an "unknown" one.
  bool Counts(const std::string& repository, const std::string& branch) const;

  /// The designation of `repository` ("unknown" without a row).
  BranchDesignation Of(const std::string& repository) const;

  /// The matrix's filter: every repository with a designation and its designated branches.
  MatrixFilter::Designated AsFilter() const;

 private:
  std::map<std::string, BranchDesignation> by_repository_;
};

/// The cells of `cells` that count under `designated`, each a cell whose label or one of the
/// other branches it was submitted on (`branches`, Store::ListCellBranches) is designated; a
/// kept cell whose label is not designated shows the designated branch it counts for (the first
/// by name). Reference cells are kept (ComputeReadiness leaves them out). Order is kept.
std::vector<CellSummary> OnDesignatedBranches(std::vector<CellSummary> cells,
                                              const std::vector<CellBranch>& branches,
                                              const DesignatedBranches& designated);

/// A column of the matrix: device x precision x topology x mode.
struct MatrixColumn {
  std::string key;  // "cpu fp32 tp=2 dp=1 pp=1 ep=1 eager": the column's name in MatrixJson
  std::string device;
  std::string precision;
  CellSpec::Topology topology;
  std::string mode;
};

/// A row of the matrix: model family x checkpoint, its squares by column key, and its
/// readiness: "failed" when a square's newest cell FAILed, else "blocked" when one was blocked,
/// else "validated" when every square's passed, else "unverified".
struct MatrixRow {
  std::string model_family;
  DigestedPath checkpoint;
  std::string readiness;
  std::map<std::string, int> counts;  // squares per ReadinessOf
  std::map<std::string, MatrixSquare> squares;  // by MatrixColumn::key
};

/// The dashboard's matrix (GET /api/v1/matrix).
struct Matrix {
  std::vector<MatrixColumn> columns;  // sorted by device, precision, topology, mode
  std::vector<MatrixRow> rows;        // in the order of the squares (family, checkpoint)
};

/// Arranges `squares` (Store::Matrix, sorted by family and checkpoint) into rows and columns,
/// keeping only squares whose status is `status` when it is not empty (an attempt state name,
/// "passed", or a readiness word, "validated"); columns and rows left empty are dropped.
Matrix ArrangeMatrix(const std::vector<MatrixSquare>& squares, std::string_view status);

}  // namespace gatehouse::controller
