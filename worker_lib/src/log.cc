// spdlog behind log.h (torch-free translation unit: see log.h).
#include "gatehouse/worker/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace gatehouse::worker::log {

void UseStderr() {
  auto logger = spdlog::get("worker");
  if (!logger) logger = spdlog::stderr_color_mt("worker");
  spdlog::set_default_logger(logger);
}

void Info(std::string_view message) { spdlog::info("{}", message); }
void Warn(std::string_view message) { spdlog::warn("{}", message); }
void Error(std::string_view message) { spdlog::error("{}", message); }

}  // namespace gatehouse::worker::log
