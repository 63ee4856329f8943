// Attempt lifecycle: one enum and one transition table, so every state change is checked in
// one place and the store persists only what the table allows. Pure logic, no I/O.
#pragma once

#include <optional>
#include <string_view>

#include "common/status.h"

namespace gatehouse::controller {

/// State of one attempt (one run of a cell).
///   queued  -> leased     the scheduler placed it on an agent
///   queued  -> cancelled  cancelled before any agent took it
///   queued  -> blocked    a cell it waits for (its reference cell or control) ended without
///                         PASS: it never runs, and its reason names that cell
///   leased  -> running    the agent relayed the first phase_start
///   leased|running -> passed | failed | error   the agent ended it (AttemptEnd)
///   leased|running -> blocked    the worker's run ended BLOCKED: an input from outside the
///                                adapter was unusable (a reference bundle that does not
///                                validate or could not be fetched, a pin the node lacks), so
///                                there is no verdict on the adapter
///   leased|running -> lost       its agent missed its heartbeats (the lease expired); the
///                                cell gets a new attempt when its retries allow
///   leased|running -> cancelled  a cancel was requested and the agent stopped it (or was lost)
///   leased|running -> timed_out  it ran past its time limit
/// passed, failed, error, lost, cancelled, timed_out and blocked are terminal. lost is not failed: it
/// says nothing about the adaptation.
enum class AttemptState {
  kQueued, kLeased, kRunning, kPassed, kFailed, kError, kLost, kCancelled, kTimedOut, kBlocked
};

/// Lower-case name as stored and shown: "queued", "leased", ...
std::string_view AttemptStateName(AttemptState s);

/// Inverse of AttemptStateName; nullopt for an unknown name.
std::optional<AttemptState> ParseAttemptState(std::string_view name);

/// True for passed, failed, error, lost, cancelled, timed_out and blocked.
bool IsTerminal(AttemptState s);

/// True when the table allows `from` -> `to`.
bool IsAllowedTransition(AttemptState from, AttemptState to);

/// OK when a cell whose latest attempt is number `number` in `state` may be run again: it ended
/// without a verdict (error, lost, cancelled, timed_out, blocked). Else FAILED_PRECONDITION
/// naming the cell and why: still going (queued, leased, running), or a verdict (passed, failed)
/// its frozen inputs would give again.
Status CheckRetryable(std::string_view cell_id, int number, AttemptState state);

/// OK when allowed, else FAILED_PRECONDITION "attempt <id>: illegal transition <from> -> <to>".
Status CheckTransition(long long attempt_id, AttemptState from, AttemptState to);

}  // namespace gatehouse::controller
