#include "controller/clock.h"

#include <ctime>

#include <fmt/format.h>

namespace gatehouse::controller {

Clock SystemClock() {
  return [] { return std::chrono::system_clock::now(); };
}

MonotonicClock SteadyClock() {
  return [] { return std::chrono::steady_clock::now(); };
}

MonotonicClock MonotonicFrom(Clock clock) {
  return [clock = std::move(clock)] {
    return std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(clock().time_since_epoch()));
  };
}

std::string FormatTimestamp(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const auto ms_since_epoch = duration_cast<milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms_since_epoch / 1000);
  const int ms = static_cast<int>(ms_since_epoch % 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

}  // namespace gatehouse::controller
