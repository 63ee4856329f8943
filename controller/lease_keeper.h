// Leases and time limits: an agent silent past the lease timeout loses its leased and running
// attempts (retried within the cell's limit), an agent that registers again loses what it no
// longer holds, and an attempt over a time limit is stopped. Domain logic over the store and the
// agent registry: no transport, SQLite or libgit2 header.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "controller/agent_registry.h"
#include "controller/clock.h"
#include "controller/dispatcher.h"
#include "controller/store/store.h"

namespace gatehouse::controller {

/// Time limits (controller flags --queued-timeout-s, --attempt-timeout-s, --phase-timeout-s);
/// zero turns a limit off. An attempt over a limit ends timed_out (never retried): a queued one
/// at once, a leased or running one when its agent has stopped the worker group (as a cancel).
struct TimeLimits {
  std::chrono::seconds queued{24 * 3600};  // from the attempt's creation
  std::chrono::seconds attempt{6 * 3600};  // from its lease: checkout, build and every gate
  std::chrono::seconds phase{2 * 3600};    // one gate, from its phase_start
};

/// Threading: thread-safe (its state is the store's and the registry's). ControllerCore calls
/// ExpireLeases and EnforceTimeLimits every second on its maintenance thread, and Reconcile
/// while no scheduling pass runs.
class LeaseKeeper {
 public:
  /// `clock` stamps the time limits (wall time); `dispatcher` says why a queued attempt waited.
  LeaseKeeper(Store& store, AgentRegistry& agents, const Dispatcher& dispatcher,
              TimeLimits limits, Clock clock);

  /// Expires the leases of agents not heard from for the lease timeout (AgentRegistry::SilentFor):
  /// each of their leased or running attempts becomes lost (reason names the agent and the
  /// silence) and, within the cell's retry limit, gets a new queued attempt
  /// (Store::LoseAttempt). Returns the attempts lost; the caller schedules when any were.
  int ExpireLeases();

  /// Ends what is over a time limit: a queued attempt becomes timed_out at once (its reason
  /// says why it waited); a leased or running one gets a stop request (recorded as timed_out,
  /// reason naming the limit, and the phase for a phase limit) sent to its agent like a cancel,
  /// and ends timed_out when the agent reports the end (or at lease expiry). Returns the
  /// attempts stopped.
  int EnforceTimeLimits();

  /// An agent registered again holding `held`: every leased or running attempt of it that it
  /// does not hold is lost (retried within the cell's limit); returns the Cancels to send for
  /// held attempts that ended here while it was away (lost, cancelled, timed out) or whose
  /// cancel it may have missed.
  std::vector<std::pair<int64_t, std::string>> Reconcile(const std::string& agent_id,
                                                         const std::vector<int64_t>& held);

  /// Sends a Cancel for `attempt_id` to `agent_id` if it is attached; false when it is not.
  bool SendCancel(const std::string& agent_id, int64_t attempt_id, const std::string& reason);

  /// Ends attempt `attempt_id` (of cell `cell_id`) lost with `reason` and retries it within the
  /// retry limit (Store::LoseAttempt), logged: for an expired lease, an agent that registers
  /// again without it, or an agent's end with outcome "lost". False (logged) on a store error.
  bool Lose(int64_t attempt_id, const std::string& cell_id, const std::string& reason);

 private:

  Store& store_;
  AgentRegistry& agents_;
  const Dispatcher& dispatcher_;
  const TimeLimits limits_;
  const Clock clock_;
};

}  // namespace gatehouse::controller
