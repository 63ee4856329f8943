// Placement of queued attempts on agents. Pure logic over an in-memory view: no I/O, no
// clock; the caller persists the decisions (Store::LeaseAttempts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "controller/records.h"

namespace gatehouse::controller {

/// An agent as the scheduler sees it.
struct AgentView {
  std::string agent_id;
  int slots = 1;    // attempts it runs at once (Capabilities.slots; <= 0 means 1)
  int running = 0;  // attempts currently leased to it or running on it
};

/// One decision: run `attempt_id` on `agent_id`.
struct Placement {
  int64_t attempt_id = 0;
  std::string cell_id;
  std::string agent_id;
};

/// Places queued attempts first-in first-out: each attempt, in `queue` order, goes to the agent
/// with the most free slots (ties: the earlier agent in `agents`). Stops when no slot is free;
/// later attempts stay queued. Deterministic for equal inputs.
/// TODO: capability fit (GPU count and kind, runtime pin, lane labels), priorities, fairness.
std::vector<Placement> Schedule(const std::vector<QueuedAttempt>& queue,
                                const std::vector<AgentView>& agents);

}  // namespace gatehouse::controller
