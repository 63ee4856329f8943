// Worker events: one JSON object per line on standard output (docs/protocols.md §4).
//
// The worker writes events through an EventWriter, which builds each object and hands it to
// an EventSink. The worker's sink writes JSON lines to stdout and flushes each one (the agent
// relays lines as they come); tests use MemoryEventSink and read the objects back.
// Torch-free.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/phases.h"

namespace gatehouse::worker {

/// Value of a figure: an integer count, a real number, or text. Non-finite reals are written
/// as the strings "NaN", "Infinity", "-Infinity" (JSON has no such numbers).
using FigureValue = std::variant<int64_t, double, std::string>;

/// One measured fact of a phase. `unit` is one of count, bytes, ms, tokens/s, ratio, nats,
/// percent, text, or another unit spelled out (e.g. "logits", "l2_norm").
struct Figure {
  std::string name;
  FigureValue value;
  std::string unit;
};

/// A file a phase produced. `path` is relative to the attempt directory.
struct Artifact {
  std::string name;
  std::string path;
  uint64_t bytes = 0;
  std::string sha256;  // lower-case hex, no prefix
};

/// Receives finished event objects. Implementations decide where they go.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void Write(const nlohmann::json& event) = 0;
};

/// Writes each event as one line of compact JSON to a FILE* and flushes it. Invalid UTF-8 in
/// strings (a dlerror text, a tensor name) is replaced rather than thrown on. Not thread-safe.
class JsonlEventSink : public EventSink {
 public:
  /// `out` is not owned and must outlive the sink.
  explicit JsonlEventSink(FILE* out) : out_(out) {}
  void Write(const nlohmann::json& event) override;

 private:
  FILE* out_;
};

/// Keeps events in memory (tests).
class MemoryEventSink : public EventSink {
 public:
  void Write(const nlohmann::json& event) override { events_.push_back(event); }
  const std::vector<nlohmann::json>& events() const { return events_; }

 private:
  std::vector<nlohmann::json> events_;
};

/// Milliseconds since the Unix epoch.
using ClockMs = std::function<int64_t()>;
/// The system clock in milliseconds since the Unix epoch.
int64_t SystemClockMs();

/// Builds the events of docs/protocols.md §4 and writes them to a sink. Every event carries
/// `ts_ms` from the injected clock. Not thread-safe.
///
/// Events: phase_start {phase}; figure {phase, name, value, unit}; phase_end {phase, status,
/// reason, classification, duration_ms}; artifact {phase, name, path, bytes, sha256};
/// run_end {status}. `classification` is non-empty only on FAIL.
class EventWriter {
 public:
  explicit EventWriter(EventSink& sink, ClockMs clock = SystemClockMs)
      : sink_(sink), clock_(std::move(clock)) {}

  int64_t NowMs() const { return clock_(); }
  /// In a group of several worker ranks every event also carries "rank": `rank` (rank 0's
  /// events are the attempt's evidence; the others are kept for the record). Off by default.
  void SetRank(int64_t rank) { rank_ = rank; }
  void PhaseStart(std::string_view phase);
  void EmitFigure(std::string_view phase, const Figure& figure);
  /// `classification` is dropped (written as "") unless status is FAIL.
  void PhaseEnd(std::string_view phase, GateStatus status, std::string_view reason,
                std::string_view classification, int64_t duration_ms);
  void EmitArtifact(std::string_view phase, const Artifact& artifact);
  void RunEnd(GateStatus status);

 private:
  void Write(nlohmann::json event);

  EventSink& sink_;
  ClockMs clock_;
  int64_t rank_ = -1;  // -1: not in a group, no "rank" member
};

/// JSON for a figure value (see FigureValue for non-finite reals).
nlohmann::json FigureValueToJson(const FigureValue& value);

}  // namespace gatehouse::worker
