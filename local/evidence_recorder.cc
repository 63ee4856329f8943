#include "local/evidence_recorder.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/verdict.h"
#include "controller/attempt_ending.h"
#include "controller/worker_event.h"

namespace gatehouse::local {

namespace fs = std::filesystem;
using controller::EventEffect;

EvidenceRecorder::EvidenceRecorder(std::string cell_id, fs::path dir, std::ostream& progress,
                                   std::ostream* echo)
    : cell_id_(std::move(cell_id)), dir_(std::move(dir)), progress_(progress), echo_(echo) {
  std::error_code ec;
  fs::create_directories(dir_ / "logs", ec);
  events_.open(dir_ / "events.jsonl", std::ios::trunc);
}

void EvidenceRecorder::Event(int64_t /*attempt_id*/, int64_t /*seq*/, std::string_view json) {
  events_ << json << "\n";
  events_.flush();
  Result<EventEffect> effect = controller::ParseWorkerEvent(json);
  if (!effect.ok()) {
    ++bad_events_;
    return;
  }
  switch (effect->kind) {
    case EventEffect::Kind::kNone:
      break;
    case EventEffect::Kind::kPhaseStart: {
      controller::PhaseRecord& p = phases_[effect->phase];
      p.phase = effect->phase;
      p.status = "RUNNING";
      break;
    }
    case EventEffect::Kind::kFigure: {
      controller::PhaseRecord& p = phases_[effect->phase];
      p.phase = effect->phase;
      if (p.status.empty()) p.status = "RUNNING";
      p.figures.push_back({effect->name, effect->value_json, effect->unit});
      break;
    }
    case EventEffect::Kind::kPhaseEnd: {
      controller::PhaseRecord& p = phases_[effect->phase];
      p.phase = effect->phase;
      p.status = effect->status;
      p.reason = effect->reason;
      p.classification = effect->classification;
      p.duration_ms = effect->duration_ms;
      nlohmann::json phase = {{"phase", p.phase}, {"status", p.status}, {"reason", p.reason}};
      if (p.duration_ms) phase["duration_ms"] = *p.duration_ms;
      std::set<std::string> seen;
      for (const std::string& line : cli::NewPhaseLines(
               nlohmann::json{{"id", cell_id_}, {"phases", nlohmann::json::array({phase})}},
               seen)) {
        progress_ << line << "\n";
      }
      progress_.flush();
      break;
    }
    case EventEffect::Kind::kRunEnd:
      run_status_ = effect->status;
      break;
  }
}

void EvidenceRecorder::Log(int64_t /*attempt_id*/, std::string_view stream, int64_t /*offset*/,
                           std::string_view data) {
  const std::string name(stream);
  auto it = logs_.find(name);
  if (it == logs_.end()) {
    it = logs_.emplace(name, std::ofstream(dir_ / "logs" / (name + ".log"), std::ios::trunc)).first;
  }
  it->second << data;
  it->second.flush();
  if (echo_ != nullptr) *echo_ << data << std::flush;
}

std::vector<controller::PhaseRecord> EvidenceRecorder::Phases() const {
  std::vector<controller::PhaseRecord> out;
  for (const auto& [name, phase] : phases_) out.push_back(phase);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return controller::PhaseOrder(a.phase) < controller::PhaseOrder(b.phase);
  });
  return out;
}

}  // namespace gatehouse::local
