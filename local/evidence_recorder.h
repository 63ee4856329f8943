// What `gatehouse run` keeps of an attempt: the controller's evidence (phases, figures, the
// run's status) made from the same worker events by the same parser, the raw events and the
// logs as files, and the phase lines `gatehouse submit --wait` prints.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "agent/attempt_sink.h"
#include "controller/records.h"

namespace gatehouse::local {

/// An AttemptSink for one attempt of cell `cell_id`: events are applied as the controller's
/// store applies them (controller::ParseWorkerEvent: rank 0 only; a phase_end replaces the
/// phase's status), written to <dir>/events.jsonl, and each ended phase printed to `progress`
/// as "<id 12 hex> <phase> <STATUS> <s> s[: reason]" (cli::NewPhaseLines). Log chunks go to
/// <dir>/logs/<stream>.log, and to `echo` too when it is set.
/// Threading: one attempt runner thread (AttemptSink's contract).
class EvidenceRecorder : public agent::AttemptSink {
 public:
  EvidenceRecorder(std::string cell_id, std::filesystem::path dir, std::ostream& progress,
                   std::ostream* echo = nullptr);

  void Event(int64_t attempt_id, int64_t seq, std::string_view json) override;
  void Log(int64_t attempt_id, std::string_view stream, int64_t offset,
           std::string_view data) override;
  void End(const agent::AttemptEndReport& end) override { end_ = end; }

  /// The phases seen, in kPhases order (unknown names last).
  std::vector<controller::PhaseRecord> Phases() const;
  /// run_end's status; empty when none came.
  const std::string& run_status() const { return run_status_; }
  const agent::AttemptEndReport& end() const { return end_; }
  /// Events that did not parse (kept in events.jsonl, applied to nothing).
  int bad_events() const { return bad_events_; }

 private:
  std::string cell_id_;
  std::filesystem::path dir_;
  std::ostream& progress_;
  std::ostream* echo_;
  std::ofstream events_;
  std::map<std::string, std::ofstream> logs_;
  std::map<std::string, controller::PhaseRecord> phases_;
  std::string run_status_;
  agent::AttemptEndReport end_;
  int bad_events_ = 0;
};

}  // namespace gatehouse::local
