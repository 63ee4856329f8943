#include "controller/dispatcher.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace gatehouse::controller {
namespace {

std::string Short(const std::string& id) { return id.substr(0, 12); }

// "waiting for its reference cell 41c8ffab1420 (running)<suffix>".
std::string CellWaitText(const std::string& what, const std::string& id, AttemptState state,
                         const std::string& suffix) {
  return "waiting for " + what + " " + Short(id) + " (" + std::string(AttemptStateName(state)) +
         ")" + suffix;
}

}  // namespace

Dispatcher::Prerequisites Dispatcher::CheckPrerequisites(const Demand& demand) {
  Prerequisites out;
  for (const std::string& id : demand.waits_for) {
    auto cell = store_.GetCell(id);
    auto attempts = store_.ListAttempts(id);
    if (!cell.ok() || !cell->has_value() || !attempts.ok() || attempts->empty()) {
      out.waiting = "the cell it waits for, " + Short(id) + ", is not readable";
      continue;
    }
    auto spec = ParseCellSpecJson((*cell)->spec_json);
    const bool reference = spec.ok() && spec->IsReference();
    const std::string what = reference ? "its reference cell" : "its control";
    const AttemptRecord& last = attempts->back();
    if (last.state == AttemptState::kPassed) {
      // Only the cell's own reference brings its bundle (a control that happens to be a
      // reference cell is waited for, not compared with).
      if (!reference || id != demand.reference_cell) continue;
      auto files = store_.ListArtifacts(last.id);
      if (!files.ok()) {
        out.waiting = "the artifacts of " + what + " " + Short(id) +
                      " are not readable: " + files.status().message();
        continue;
      }
      std::string expired;  // a bundle file retention removed, and when
      for (const ArtifactRecord& f : *files) {
        constexpr std::string_view kPrefix = "reference/";
        if (f.name.rfind(kPrefix, 0) != 0) continue;
        if (!f.expired_at.empty()) expired = f.name + " (" + f.digest + ") at " + f.expired_at;
        out.inputs.push_back({"reference", f.name.substr(kPrefix.size()), f.digest, f.size});
      }
      if (!expired.empty()) {
        // The bundle is gone but the inputs that made it are frozen: make it again.
        out.inputs.clear();
        auto again = store_.RunAgainForExpiredArtifacts(id, last.id);
        if (!again.ok()) {
          out.waiting = "the bundle of " + what + " " + Short(id) + " was removed by artifact "
                        "retention and it cannot run again: " + again.status().message();
          continue;
        }
        if (again->has_value()) {
          spdlog::info("cell {}: artifact retention removed {}; attempt {} makes the bundle "
                       "again", id, expired, (*again)->number);
          out.queued_again = true;
        }
        out.waiting = "waiting for " + what + " " + Short(id) + ": it makes its bundle again "
                      "(artifact retention removed " + expired + ")";
        continue;
      }
      const auto has = [&](std::string_view name) {
        return std::any_of(out.inputs.begin(), out.inputs.end(),
                           [&](const InputArtifact& in) { return in.name == name; });
      };
      if (!has("reference.json") || !has("reference.safetensors")) {
        out.blocked = what + " " + id + " passed (attempt " + std::to_string(last.number) +
                      ") but did not store a whole reference bundle (reference.json and "
                      "reference.safetensors)";
        return out;
      }
      continue;
    }
    if (IsTerminal(last.state)) {
      out.blocked = what + " " + id + " ended " + std::string(AttemptStateName(last.state)) +
                    " (attempt " + std::to_string(last.number) + ")" +
                    (last.reason.empty() ? "" : ": " + last.reason);
      return out;
    }
    // The only attempt that follows a passed one makes an expired bundle again.
    const auto before = std::find_if(attempts->begin(), attempts->end(), [&](const AttemptRecord& a) {
      return a.id == last.retry_of;
    });
    CellWait wait{what, id, ""};
    if (before != attempts->end() && before->state == AttemptState::kPassed) {
      wait.suffix = ": it makes its bundle again (artifact retention removed attempt " +
                    std::to_string(before->number) + "'s)";
    }
    out.waiting = CellWaitText(what, id, last.state, wait.suffix);
    out.waiting_on = std::move(wait);
  }
  return out;
}

Dispatcher::Dispatcher(Store& store, AgentRegistry& agents, SchedulingPolicy policy)
    : store_(store), agents_(agents), policy_(policy) {}

std::shared_ptr<const MemoryCalibration> Dispatcher::Calibration() {
  std::lock_guard lock(calibration_mu_);
  if (calibration_ == nullptr) {
    auto peaks = store_.ListMemoryPeaks(kCalibrationPeaks);
    if (!peaks.ok()) spdlog::warn("memory calibration: {}", peaks.status().ToString());
    calibration_ = std::make_shared<const MemoryCalibration>(
        MemoryCalibration::From(peaks.ok() ? *peaks : std::vector<MeasuredPeak>{}));
    ++calibration_version_;
  }
  return calibration_;
}

MemoryEstimate Dispatcher::EstimateMemoryOf(const CellSpec& spec) {
  if (spec.checkpoint.digest.empty()) return {};
  auto facts = store_.GetCheckpointFacts(spec.checkpoint.digest);
  if (!facts.ok()) {
    spdlog::warn("memory estimate: {}", facts.status().ToString());
    return {};
  }
  if (!facts->has_value()) return {};
  return EstimateMemory(spec, **facts, *Calibration());
}

Demand Dispatcher::DemandOfStored(const std::string& spec_json) {
  Result<CellSpec> spec = ParseCellSpecJson(spec_json);
  if (!spec.ok()) return DemandOfSpec(spec_json);  // invalid, saying why
  return DemandOf(*spec, EstimateMemoryOf(*spec));
}

void Dispatcher::RecordPeak(int64_t attempt_id, const std::string& cell_id,
                            int64_t oom_limit_bytes) {
  auto cell = store_.GetCell(cell_id);
  if (!cell.ok() || !cell->has_value()) return;
  Result<CellSpec> spec = ParseCellSpecJson((*cell)->spec_json);
  if (!spec.ok() || spec->checkpoint.digest.empty()) return;
  auto facts = store_.GetCheckpointFacts(spec->checkpoint.digest);
  auto figure = store_.AttemptPeakRss(attempt_id);
  if (!facts.ok() || !facts->has_value() || !figure.ok()) return;
  const MemoryEstimate formula = EstimateMemory(*spec, **facts);  // uncalibrated
  // A rank killed at the limit used at least the limit (per process: the limit is the
  // attempt's, shared by its ranks).
  const ProcessMemory& process = formula.processes.front();
  const int64_t oom_peak = oom_limit_bytes > 0 ? oom_limit_bytes / std::max(process.count, 1) : 0;
  const int64_t peak = std::max(*figure, oom_peak);
  if (peak <= 0) return;  // it measured nothing (ended before any phase)
  MeasuredPeak row{attempt_id, process.role, MemoryKey(*spec), process.host_bytes, peak};
  if (Status s = store_.RecordMemoryPeak(row); !s.ok()) {
    spdlog::warn("memory calibration: {}", s.ToString());
    return;
  }
  spdlog::info("attempt {}: {} peak {} (the formula said {}{})", attempt_id, process.role,
               FormatGigabytes(peak), FormatGigabytes(process.host_bytes),
               oom_limit_bytes > 0 ? ", killed at its memory limit" : "");
  std::lock_guard lock(calibration_mu_);
  calibration_ = nullptr;
}

void Dispatcher::Remember(const std::string& cell_id, Demand demand) {
  std::lock_guard lock(remembered_mu_);
  remembered_.insert_or_assign(cell_id, std::move(demand));
}

std::string Dispatcher::WaitingReason(int64_t attempt_id) const {
  std::optional<CellWait> wait;
  std::string reason;
  {
    std::lock_guard lock(waiting_mu_);
    auto it = waiting_reasons_.find(attempt_id);
    if (it == waiting_reasons_.end()) return "";
    reason = it->second;
    if (auto w = cell_waits_.find(attempt_id); w != cell_waits_.end()) wait = w->second;
  }
  if (!wait) return reason;
  auto attempts = store_.ListAttempts(wait->cell_id);
  if (!attempts.ok() || attempts->empty() || IsTerminal(attempts->back().state)) return reason;
  return CellWaitText(wait->what, wait->cell_id, attempts->back().state, wait->suffix);
}

std::vector<Send> Dispatcher::Pass(bool* again) {
  std::vector<Send> sends;
  // Specs are read only for cells whose demand is not cached (specs never change).
  auto queue = store_.ListQueuedAttempts(/*with_specs=*/false);
  if (!queue.ok()) {
    spdlog::error("schedule: {}", queue.status().ToString());
    return sends;
  }
  if (queue->empty()) return sends;  // most passes (after every end): nothing waits
  std::vector<AgentView> view = agents_.SchedulableViews();  // sorted by agent id
  auto active = store_.ListActiveAttempts();
  if (!active.ok()) {
    spdlog::error("schedule: {}", active.status().ToString());
    return sends;
  }
  // Estimates made with an older calibration are made again (from the stored specs).
  Calibration();  // reloaded when a peak was recorded since
  int64_t version = 0;
  {
    std::lock_guard lock(calibration_mu_);
    version = calibration_version_;
  }
  if (version != demands_version_) {
    demands_.clear();
    demands_version_ = version;
  }
  if (demands_.size() > kMaxCachedDemands) demands_.clear();
  {
    std::lock_guard lock(remembered_mu_);
    for (auto& [cell_id, demand] : remembered_) demands_.insert_or_assign(cell_id, std::move(demand));
    remembered_.clear();
  }
  // The demand of a cell, from the cache or from its stored spec; nullptr when unreadable.
  auto demand_of = [this](const std::string& cell_id) -> const Demand* {
    auto it = demands_.find(cell_id);
    if (it != demands_.end()) return &it->second;
    auto cell = store_.GetCell(cell_id);
    if (!cell.ok() || !cell->has_value()) {
      spdlog::error("schedule: cell {} unreadable", cell_id);
      return nullptr;
    }
    return &demands_.emplace(cell_id, DemandOfStored((*cell)->spec_json)).first->second;
  };
  RunningLoad load;
  for (const ActiveAttempt& a : *active) {
    ++load.by_repository[a.repository];
    ++load.by_submitter[a.submitter];
    auto it = std::lower_bound(view.begin(), view.end(), a.agent_id,
                               [](const AgentView& v, const std::string& id) { return v.agent_id < id; });
    if (it == view.end() || it->agent_id != a.agent_id) continue;
    ++it->running;
    const Demand* demand = demand_of(a.cell_id);
    if (demand == nullptr) continue;
    if (demand->gpu) it->gpus_in_use += demand->world_size;
    it->memory_in_use += demand->memory.host_bytes();
  }
  std::vector<Demand> demands;
  std::vector<QueuedAttempt> placeable;  // the queue less cells whose spec is unreadable
  demands.reserve(queue->size());
  placeable.reserve(queue->size());
  std::vector<Waiting> waiting;
  std::map<int64_t, CellWait> cell_waits;                // by attempt id
  std::map<int64_t, std::vector<InputArtifact>> inputs;  // by attempt id
  for (QueuedAttempt& q : *queue) {
    const Demand* demand = demand_of(q.cell_id);
    if (demand == nullptr) continue;
    if (!demand->waits_for.empty()) {
      // Controls before variants: held back until the cells it waits for PASSed; blocked for
      // good when one ended otherwise.
      Prerequisites pre = CheckPrerequisites(*demand);
      if (pre.queued_again) *again = true;  // place the reference cell's new attempt
      if (!pre.blocked.empty()) {
        auto changed = store_.CancelQueued(q.attempt_id, "blocked: " + pre.blocked,
                                           AttemptState::kBlocked);
        if (changed.ok() && *changed) {
          spdlog::info("attempt {} of cell {} blocked: {}", q.attempt_id, q.cell_id, pre.blocked);
          *again = true;  // a cell waiting for this one is blocked in turn
        }
        continue;
      }
      if (!pre.waiting.empty()) {
        waiting.push_back({q.attempt_id, pre.waiting});
        if (pre.waiting_on) cell_waits[q.attempt_id] = std::move(*pre.waiting_on);
        continue;
      }
      inputs[q.attempt_id] = std::move(pre.inputs);
    }
    demands.push_back(*demand);
    placeable.push_back(std::move(q));
  }
  std::vector<Placement> placements =
      Schedule(placeable, demands, view, &waiting, policy_, load);
  {
    // Only this pass's waiting attempts are kept; a reason is logged when it changes.
    std::lock_guard lock(waiting_mu_);
    std::map<int64_t, std::string> now_waiting;
    for (const Waiting& w : waiting) {
      auto old = waiting_reasons_.find(w.attempt_id);
      if (old == waiting_reasons_.end() || old->second != w.reason) {
        spdlog::info("attempt {} waits: {}", w.attempt_id, w.reason);
      }
      now_waiting[w.attempt_id] = w.reason;
    }
    waiting_reasons_ = std::move(now_waiting);
    cell_waits_ = std::move(cell_waits);
  }
  if (placements.empty()) return sends;
  std::vector<Lease> leases;
  for (const Placement& p : placements) leases.push_back({p.attempt_id, p.agent_id});
  Status s = store_.LeaseAttempts(leases);
  if (!s.ok()) {
    // FAILED_PRECONDITION: an attempt left the queue meanwhile (cancelled, timed out); the
    // batch rolled back whole, so place again from a fresh read.
    if (s.code() == StatusCode::kFailedPrecondition) *again = true;
    spdlog::warn("schedule: {}", s.ToString());
    return sends;
  }
  {
    // The bundles handed out are in use: artifact retention counts from now.
    std::vector<std::string> used;
    for (const Placement& p : placements) {
      auto it = inputs.find(p.attempt_id);
      if (it == inputs.end()) continue;
      for (const InputArtifact& in : it->second) used.push_back(in.digest);
    }
    if (Status t = store_.TouchBlobs(used); !t.ok()) spdlog::warn("schedule: {}", t.ToString());
  }
  // The channels of the agents placed on. ControllerCore::AttachAgent swaps a channel only
  // while no pass runs; an agent that detached meanwhile keeps its lease, as a failed
  // send does (reconcile or lease expiry ends it).
  std::vector<std::shared_ptr<AgentChannel>> channels;
  for (const Placement& p : placements) channels.push_back(agents_.Channel(p.agent_id));
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    auto cell = store_.GetCell(p.cell_id);
    if (!cell.ok() || !cell->has_value()) {
      spdlog::error("schedule: cell {} of attempt {} unreadable", p.cell_id, p.attempt_id);
      continue;
    }
    if (channels[i] == nullptr) {
      spdlog::warn("attempt {}: agent '{}' detached before its assignment was sent; it stays "
                   "leased", p.attempt_id, p.agent_id);
      continue;
    }
    const CellRecord& c = **cell;
    AssignmentMessage message{p.attempt_id, c.id, c.spec_json, c.branch, {}};
    if (auto it = inputs.find(p.attempt_id); it != inputs.end()) message.inputs = it->second;
    if (const Demand* demand = demand_of(p.cell_id); demand != nullptr) {
      message.memory_estimate_bytes = demand->memory.host_bytes();
      message.memory_estimate = demand->memory.Describe();
    }
    sends.emplace_back(channels[i], std::move(message));
  }
  return sends;
}

}  // namespace gatehouse::controller
