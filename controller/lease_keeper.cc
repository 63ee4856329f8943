#include "controller/lease_keeper.h"

#include <algorithm>
#include <cstdio>

#include <spdlog/spdlog.h>

namespace gatehouse::controller {

LeaseKeeper::LeaseKeeper(Store& store, AgentRegistry& agents, const Dispatcher& dispatcher,
                         TimeLimits limits, Clock clock)
    : store_(store), agents_(agents), dispatcher_(dispatcher), limits_(limits),
      clock_(std::move(clock)) {}

bool LeaseKeeper::SendCancel(const std::string& agent_id, int64_t attempt_id,
                             const std::string& reason) {
  std::shared_ptr<AgentChannel> channel = agents_.Channel(agent_id);
  return channel && channel->SendCancel(attempt_id, reason);
}

int LeaseKeeper::EnforceTimeLimits() {
  const auto now = clock_();
  const auto cutoff = [&](std::chrono::seconds limit) {
    return limit.count() > 0 ? FormatTimestamp(now - limit) : std::string();
  };
  auto overdue =
      store_.ListOverdue(cutoff(limits_.queued), cutoff(limits_.attempt), cutoff(limits_.phase));
  if (!overdue.ok()) {
    spdlog::error("time limits: {}", overdue.status().ToString());
    return 0;
  }
  int stopped = 0;
  for (const OverdueAttempt& o : *overdue) {
    std::string why;
    switch (o.limit) {
      case OverdueAttempt::Limit::kQueued: {
        why = "timed out: queued since " + o.since + ", over the limit of " +
              std::to_string(limits_.queued.count()) + " s (--queued-timeout-s)";
        if (const std::string waited = dispatcher_.WaitingReason(o.attempt_id); !waited.empty()) {
          why += "; it waited because " + waited;
        }
        break;
      }
      case OverdueAttempt::Limit::kAttempt:
        why = "timed out: leased since " + o.since + ", over the attempt limit of " +
              std::to_string(limits_.attempt.count()) + " s (--attempt-timeout-s)";
        break;
      case OverdueAttempt::Limit::kPhase:
        why = "timed out: phase '" + o.phase + "' running since " + o.since +
              ", over the phase limit of " + std::to_string(limits_.phase.count()) +
              " s (--phase-timeout-s)";
        break;
    }
    if (o.state == AttemptState::kQueued) {
      auto changed = store_.CancelQueued(o.attempt_id, why, AttemptState::kTimedOut);
      if (!changed.ok()) {
        spdlog::error("attempt {}: {}", o.attempt_id, changed.status().ToString());
      } else if (*changed) {
        spdlog::warn("attempt {} of cell {}: {}", o.attempt_id, o.cell_id, why);
        ++stopped;
      }
      continue;
    }
    auto first = store_.RequestCancel(o.attempt_id, why, AttemptState::kTimedOut);
    if (!first.ok()) {  // it ended meanwhile: nothing to stop
      spdlog::info("attempt {}: {}", o.attempt_id, first.status().message());
      continue;
    }
    if (!*first) continue;
    const bool sent = SendCancel(o.agent_id, o.attempt_id, why);
    spdlog::warn("attempt {} of cell {}: {}; stop {} agent '{}'", o.attempt_id, o.cell_id, why,
                 sent ? "sent to" : "recorded (not reachable now) for", o.agent_id);
    ++stopped;
  }
  return stopped;
}

std::vector<std::pair<int64_t, std::string>> LeaseKeeper::Reconcile(
    const std::string& agent_id, const std::vector<int64_t>& held) {
  std::vector<std::pair<int64_t, std::string>> cancels;
  auto active = store_.ListActiveAttempts();
  if (!active.ok()) {
    spdlog::error("agent '{}': reconcile: {}", agent_id, active.status().ToString());
    return cancels;
  }
  for (const ActiveAttempt& a : *active) {
    if (a.agent_id != agent_id ||
        std::find(held.begin(), held.end(), a.attempt_id) != held.end()) {
      continue;
    }
    Lose(a.attempt_id, a.cell_id,
         "agent '" + agent_id + "' registered again without attempt " +
             std::to_string(a.attempt_id) + " (it restarted, or never received the assignment)");
  }
  // What the agent holds but should stop: attempts that ended here while it was away (lost,
  // cancelled: their retry may wait behind them), and cancels it may have missed.
  for (const int64_t id : held) {
    Result<AttemptRecord> a = store_.GetAttempt(id);
    if (!a.ok() || a->agent_id != agent_id) continue;
    if (IsTerminal(a->state) && a->state != AttemptState::kPassed &&
        a->state != AttemptState::kFailed && a->state != AttemptState::kError) {
      cancels.emplace_back(id, "attempt already ended (" + std::string(AttemptStateName(a->state)) +
                                   ") on the controller");
    } else if (!IsTerminal(a->state) && !a->cancel_reason.empty()) {
      cancels.emplace_back(id, a->cancel_reason);
    }
  }
  return cancels;
}

bool LeaseKeeper::Lose(int64_t attempt_id, const std::string& cell_id,
                       const std::string& reason) {
  Result<std::optional<int64_t>> retry =
      store_.LoseAttempt(attempt_id, reason, agents_.lease().retry_limit);
  if (!retry.ok()) {
    spdlog::error("attempt {}: {}", attempt_id, retry.status().ToString());
    return false;
  }
  spdlog::warn("attempt {} of cell {} lost: {}{}", attempt_id, cell_id, reason,
               *retry ? "; retried as attempt id " + std::to_string(**retry) : "; no retry");
  return true;
}

int LeaseKeeper::ExpireLeases() {
  auto active = store_.ListActiveAttempts();
  if (!active.ok()) {
    spdlog::error("lease expiry: {}", active.status().ToString());
    return 0;
  }
  const LeaseConfig& lease = agents_.lease();
  int lost = 0;
  for (const ActiveAttempt& a : *active) {
    // Read now, not from a snapshot: an agent heard from meanwhile (e.g. it re-registered
    // holding this attempt) keeps it.
    const auto silent = agents_.SilentFor(a.agent_id);
    if (!silent) continue;
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f", std::chrono::duration<double>(*silent).count());
    if (Lose(a.attempt_id, a.cell_id,
             "agent '" + a.agent_id + "' unreachable: not heard from for " + seconds +
                 " s (heartbeat every " + std::to_string(lease.heartbeat_interval.count()) +
                 " ms, " + std::to_string(lease.missed_heartbeats) + " missed)")) {
      ++lost;
    }
  }
  return lost;
}

}  // namespace gatehouse::controller
