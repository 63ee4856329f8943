// One scheduling pass at a time: read the queue and the live agents, ask the scheduler
// (scheduler.h) where each attempt goes, persist the leases, hand back the assignments to send.
// Keeps each cell's demand (specs never change) and why each queued attempt waits. Domain
// logic over the store and the agent registry: no transport, SQLite or libgit2 header.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "controller/agent_registry.h"
#include "controller/scheduler.h"
#include "controller/store/store.h"

namespace gatehouse::controller {

/// An assignment and the stream to send it on.
using Send = std::pair<std::shared_ptr<AgentChannel>, AssignmentMessage>;

/// Threading: Pass is not reentrant (ControllerCore serialises passes); WaitingReason is
/// thread-safe.
class Dispatcher {
 public:
  Dispatcher(Store& store, AgentRegistry& agents, SchedulingPolicy policy);

  /// One pass: places queued attempts on live agents (free slots, pins, one free GPU per rank
  /// of a CUDA attempt: scheduler.h), persists the leases and returns the assignments to send
  /// once the caller's lock is released. Sets `*again` when the batch must be placed again from
  /// a fresh read (an attempt left the queue meanwhile, so the leases rolled back). Why an
  /// attempt keeps waiting is logged when it changes. Errors are logged, not returned.
  std::vector<Send> Pass(bool* again);

  /// The demand of a cell just frozen (its spec already read), so no pass reads and parses the
  /// stored spec again. Thread-safe; taken up by the next pass.
  void Remember(const std::string& cell_id, Demand demand);

  /// The memory estimate of `spec` (controller/memory_estimate.h) from its checkpoint's
  /// recorded facts and what ended attempts measured so far; empty when no facts are recorded
  /// for its checkpoint digest. Thread-safe.
  MemoryEstimate EstimateMemoryOf(const CellSpec& spec);

  /// Learns from attempt `attempt_id` of `cell_id`, just ended: records the peak its processes
  /// measured (its largest peak_rss_bytes figure, or `oom_limit_bytes` when the kernel killed
  /// one of them at that cgroup limit) beside the formula's estimate, so later estimates of
  /// the same memory key use it and the role's factor grows when the formula fell short.
  /// Failures are logged. Thread-safe.
  void RecordPeak(int64_t attempt_id, const std::string& cell_id, int64_t oom_limit_bytes);

  /// Why queued attempt `attempt_id` waited in the last pass; empty when it did not. A wait
  /// for another cell (its reference cell, its control) names that cell's state as it is now,
  /// not as it was in the pass ("(running)" once the reference cell started, with no pass
  /// in between).
  std::string WaitingReason(int64_t attempt_id) const;

 private:
  /// What the cells a queued cell waits for (Demand::waits_for) allow: `blocked` (one ended
  /// without PASS; names it and why), else `waiting` (one has not ended; says which), else the
  /// reference bundle's files of a passed reference cell as `inputs`. A passed reference cell
  /// whose bundle retention removed runs again (a new attempt; `queued_again`), and the cell
  /// waits for it.
  /// A wait for a cell that has not ended: the text is made again from its live state.
  struct CellWait {
    std::string what;     // "its reference cell" | "its control"
    std::string cell_id;
    std::string suffix;   // ": it makes its bundle again (...)" or ""
  };
  struct Prerequisites {
    std::string blocked;
    std::string waiting;
    std::optional<CellWait> waiting_on;  // set when `waiting` is a CellWait's text
    std::vector<InputArtifact> inputs;
    bool queued_again = false;
  };
  Prerequisites CheckPrerequisites(const Demand& demand);

  /// The calibration now, reloaded from the store after a RecordPeak.
  std::shared_ptr<const MemoryCalibration> Calibration();
  /// The demand of a stored spec with its memory estimate.
  Demand DemandOfStored(const std::string& spec_json);

  Store& store_;
  AgentRegistry& agents_;
  const SchedulingPolicy policy_;
  std::mutex calibration_mu_;
  std::shared_ptr<const MemoryCalibration> calibration_;  // null: to be (re)loaded
  int64_t calibration_version_ = 0;  // bumped by every reload
  int64_t demands_version_ = -1;     // the calibration demands_ were estimated with (Pass only)
  /// Demands of cells with active attempts, by cell id (specs never change). Pass only.
  std::unordered_map<std::string, Demand> demands_;
  static constexpr size_t kMaxCachedDemands = 100000;
  /// Recorded peaks the calibration reads (the newest).
  static constexpr int kCalibrationPeaks = 1000;
  /// Demands given to Remember since the last pass.
  std::mutex remembered_mu_;
  std::unordered_map<std::string, Demand> remembered_;
  /// Why each queued attempt last waited; written only by Pass.
  mutable std::mutex waiting_mu_;
  std::map<int64_t, std::string> waiting_reasons_;
  std::map<int64_t, CellWait> cell_waits_;  // the waits of waiting_reasons_ that are CellWaits
};

}  // namespace gatehouse::controller
