#include "controller/attempt_state.h"

#include <array>
#include <string>

namespace gatehouse::controller {
namespace {

struct Transition {
  AttemptState from;
  AttemptState to;
};

// The whole lifecycle in one table.
constexpr std::array kTransitions = {
    Transition{AttemptState::kQueued, AttemptState::kLeased},
    Transition{AttemptState::kQueued, AttemptState::kCancelled},
    Transition{AttemptState::kQueued, AttemptState::kBlocked},
    Transition{AttemptState::kLeased, AttemptState::kRunning},
    Transition{AttemptState::kLeased, AttemptState::kPassed},
    Transition{AttemptState::kLeased, AttemptState::kFailed},
    Transition{AttemptState::kLeased, AttemptState::kError},
    Transition{AttemptState::kLeased, AttemptState::kBlocked},
    Transition{AttemptState::kLeased, AttemptState::kLost},
    Transition{AttemptState::kLeased, AttemptState::kCancelled},
    Transition{AttemptState::kLeased, AttemptState::kTimedOut},
    Transition{AttemptState::kRunning, AttemptState::kPassed},
    Transition{AttemptState::kRunning, AttemptState::kFailed},
    Transition{AttemptState::kRunning, AttemptState::kError},
    Transition{AttemptState::kRunning, AttemptState::kBlocked},
    Transition{AttemptState::kRunning, AttemptState::kLost},
    Transition{AttemptState::kRunning, AttemptState::kCancelled},
    Transition{AttemptState::kRunning, AttemptState::kTimedOut},
};

constexpr std::array<std::pair<AttemptState, std::string_view>, 10> kNames = {{
    {AttemptState::kQueued, "queued"},
    {AttemptState::kLeased, "leased"},
    {AttemptState::kRunning, "running"},
    {AttemptState::kPassed, "passed"},
    {AttemptState::kFailed, "failed"},
    {AttemptState::kError, "error"},
    {AttemptState::kLost, "lost"},
    {AttemptState::kCancelled, "cancelled"},
    {AttemptState::kTimedOut, "timed_out"},
    {AttemptState::kBlocked, "blocked"},
}};

}  // namespace

std::string_view AttemptStateName(AttemptState s) {
  for (const auto& [state, name] : kNames) {
    if (state == s) return name;
  }
  return "error";
}

std::optional<AttemptState> ParseAttemptState(std::string_view name) {
  for (const auto& [state, n] : kNames) {
    if (n == name) return state;
  }
  return std::nullopt;
}

bool IsTerminal(AttemptState s) {
  return s != AttemptState::kQueued && s != AttemptState::kLeased && s != AttemptState::kRunning;
}

bool IsAllowedTransition(AttemptState from, AttemptState to) {
  for (const Transition& t : kTransitions) {
    if (t.from == from && t.to == to) return true;
  }
  return false;
}

Status CheckRetryable(std::string_view cell_id, int number, AttemptState state) {
  const std::string cell(cell_id), name(AttemptStateName(state));
  if (!IsTerminal(state)) {
    return Status::FailedPrecondition("cell '" + cell + "': its attempt " + std::to_string(number) +
                                      " is " + name + ", not ended: nothing to retry");
  }
  if (state == AttemptState::kPassed || state == AttemptState::kFailed) {
    return Status::FailedPrecondition(
        "cell '" + cell + "' has a verdict (" + name + ", attempt " + std::to_string(number) +
        "): its frozen inputs would give it again; change an input to make another cell");
  }
  return Status::Ok();
}

Status CheckTransition(long long attempt_id, AttemptState from, AttemptState to) {
  if (IsAllowedTransition(from, to)) return Status::Ok();
  return Status::FailedPrecondition("attempt " + std::to_string(attempt_id) +
                                    ": illegal transition " + std::string(AttemptStateName(from)) +
                                    " -> " + std::string(AttemptStateName(to)));
}

}  // namespace gatehouse::controller
