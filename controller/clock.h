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

/// UTC ISO-8601 with milliseconds: "2025-01-02T03:04:05.678Z". Sorts like time.
std::string FormatTimestamp(std::chrono::system_clock::time_point t);

}  // namespace gatehouse::controller
