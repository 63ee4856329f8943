// Worker events (docs/protocols.md §4).
#include "gatehouse/worker/events.h"

#include <chrono>
#include <cmath>

namespace gatehouse::worker {

int64_t SystemClockMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void JsonlEventSink::Write(const nlohmann::json& event) {
  // Replace invalid UTF-8 instead of throwing: an event must never take the worker down.
  std::string line = event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

nlohmann::json FigureValueToJson(const FigureValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  const double d = std::get<double>(value);
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return d;
}

void EventWriter::Write(nlohmann::json event) {
  event["ts_ms"] = clock_();
  if (rank_ >= 0) event["rank"] = rank_;
  sink_.Write(event);
}

void EventWriter::PhaseStart(std::string_view phase) {
  Write({{"event", "phase_start"}, {"phase", phase}});
}

void EventWriter::EmitFigure(std::string_view phase, const Figure& figure) {
  Write({{"event", "figure"},
         {"phase", phase},
         {"name", figure.name},
         {"value", FigureValueToJson(figure.value)},
         {"unit", figure.unit}});
}

void EventWriter::PhaseEnd(std::string_view phase, GateStatus status, std::string_view reason,
                           std::string_view classification, int64_t duration_ms) {
  Write({{"event", "phase_end"},
         {"phase", phase},
         {"status", GateStatusName(status)},
         {"reason", reason},
         {"classification", status == GateStatus::kFail ? classification : ""},
         {"duration_ms", duration_ms}});
}

void EventWriter::EmitArtifact(std::string_view phase, const Artifact& artifact) {
  Write({{"event", "artifact"},
         {"phase", phase},
         {"name", artifact.name},
         {"path", artifact.path},
         {"bytes", artifact.bytes},
         {"sha256", artifact.sha256}});
}

void EventWriter::RunEnd(GateStatus status) {
  Write({{"event", "run_end"}, {"status", GateStatusName(status)}});
}

}  // namespace gatehouse::worker
