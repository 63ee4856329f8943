#include "controller/scheduler.h"

#include <algorithm>

namespace gatehouse::controller {

std::vector<Placement> Schedule(const std::vector<QueuedAttempt>& queue,
                                const std::vector<AgentView>& agents) {
  std::vector<int> free(agents.size());
  for (size_t i = 0; i < agents.size(); ++i) {
    free[i] = std::max(agents[i].slots, 1) - agents[i].running;
  }
  std::vector<Placement> out;
  for (const QueuedAttempt& attempt : queue) {
    auto best = std::max_element(free.begin(), free.end());  // first of equal maxima
    if (best == free.end() || *best <= 0) break;
    const size_t i = static_cast<size_t>(best - free.begin());
    out.push_back({attempt.attempt_id, attempt.cell_id, agents[i].agent_id});
    --*best;
  }
  return out;
}

}  // namespace gatehouse::controller
