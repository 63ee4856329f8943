// The injected wall clock. Every timestamp the controller stores comes from a Clock, so tests
// can fix time instead of sleeping.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace gatehouse::controller {

/// Returns "now". Must be safe to call from any thread.
using Clock = std::function<std::chrono::system_clock::time_point()>;

/// The real system clock.
Clock SystemClock();

/// Returns "now" on a clock that never jumps: leases and heartbeats are measured on it, so a
/// wall-clock step (NTP, an operator) neither expires every lease nor keeps a dead agent alive.
using MonotonicClock = std::function<std::chrono::steady_clock::time_point()>;

/// std::chrono::steady_clock.
MonotonicClock SteadyClock();

/// A monotonic clock that reads `clock` (a test's fake wall clock moves both at once).
MonotonicClock MonotonicFrom(Clock clock);

/// UTC ISO-8601 with milliseconds: "2025-01-02T03:04:05.678Z". Sorts like time.
std::string FormatTimestamp(std::chrono::system_clock::time_point t);

}  // namespace gatehouse::controller
