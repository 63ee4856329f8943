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

  Store& store_;
  AgentRegistry& agents_;
  const SchedulingPolicy policy_;
  /// Demands of cells with active attempts, by cell id (specs never change). Pass only.
  std::unordered_map<std::string, Demand> demands_;
  static constexpr size_t kMaxCachedDemands = 100000;
  /// Demands given to Remember since the last pass.
  std::mutex remembered_mu_;
  std::unordered_map<std::string, Demand> remembered_;
  /// Why each queued attempt last waited; written only by Pass.
  mutable std::mutex waiting_mu_;
  std::map<int64_t, std::string> waiting_reasons_;
  std::map<int64_t, CellWait> cell_waits_;  // the waits of waiting_reasons_ that are CellWaits
};

}  // namespace gatehouse::controller
