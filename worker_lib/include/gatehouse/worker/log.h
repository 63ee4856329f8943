// The worker's log: spdlog behind plain functions.
//
// LibTorch ships its own (newer) fmt headers, which clash with the system spdlog's fmt in one
// translation unit; so spdlog is included only by log.cc, and torch code logs through these
// functions. Messages go to the default spdlog logger; the worker points it at stderr
// (standard output carries only events). Thread-safe (spdlog's loggers are).
#pragma once

#include <string_view>

namespace gatehouse::worker::log {

/// Makes the default logger write to standard error. Call once, first thing in main().
void UseStderr();
void Info(std::string_view message);
void Warn(std::string_view message);
void Error(std::string_view message);

}  // namespace gatehouse::worker::log
