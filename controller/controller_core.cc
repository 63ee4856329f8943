#include "controller/controller_core.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/phases.h"
#include "controller/report.h"
#include "controller/scheduler.h"
#include "controller/worker_event.h"

namespace gatehouse::controller {
namespace {

Status CellNotFound(const std::string& id) {
  return Status::NotFound("cell '" + id + "' not found");
}

size_t PhaseOrder(const std::string& phase) { return PhaseIndex(phase).value_or(kPhases.size()); }

}  // namespace

ControllerCore::ControllerCore(Store& store, CellFreezer& freezer)
    : store_(store), freezer_(freezer) {}

// ---- REST side ----

Result<SubmitOutcome> ControllerCore::Submit(std::string_view body, const std::string& submitter) {
  GH_ASSIGN_OR_RETURN(FrozenCell frozen, freezer_.Freeze(body));
  CellRecord record;
  record.id = frozen.id;
  record.spec_json = frozen.spec_json;
  record.repository = frozen.repository;
  record.commit_sha = frozen.commit;
  record.branch = frozen.branch;
  record.model_family = frozen.model_family;
  record.submitter = submitter;
  GH_ASSIGN_OR_RETURN(bool created, store_.CreateCellIfAbsent(record));
  if (created) {
    spdlog::info("cell {} created ({} @ {}, {})", frozen.id, frozen.repository, frozen.commit,
                 frozen.model_family);
    Schedule();
  }
  GH_ASSIGN_OR_RETURN(CellDetail detail, GetCell(frozen.id));
  return SubmitOutcome{std::move(detail), created};
}

Result<std::vector<CellSummary>> ControllerCore::ListCells(int limit, int offset) {
  return store_.ListCells(std::clamp(limit, 1, 500), std::max(offset, 0));
}

Result<CellDetail> ControllerCore::GetCell(const std::string& id) {
  GH_ASSIGN_OR_RETURN(std::optional<CellRecord> cell, store_.GetCell(id));
  if (!cell) return CellNotFound(id);
  return LoadDetail(*cell);
}

Result<CellDetail> ControllerCore::LoadDetail(const CellRecord& cell) {
  CellDetail d;
  d.cell = cell;
  GH_ASSIGN_OR_RETURN(d.attempts, store_.ListAttempts(cell.id));
  if (!d.attempts.empty()) {
    d.status = d.attempts.back().state;
    GH_ASSIGN_OR_RETURN(d.phases, store_.ListPhases(d.attempts.back().id));
    std::stable_sort(d.phases.begin(), d.phases.end(), [](const auto& a, const auto& b) {
      return PhaseOrder(a.phase) < PhaseOrder(b.phase);
    });
  }
  return d;
}

Result<std::string> ControllerCore::Report(const std::string& id) {
  GH_ASSIGN_OR_RETURN(CellDetail d, GetCell(id));
  return RenderReport(d);
}

Result<std::string> ControllerCore::ReadLog(const std::string& id, const std::string& stream,
                                            std::optional<int> number) {
  GH_ASSIGN_OR_RETURN(std::optional<CellRecord> cell, store_.GetCell(id));
  if (!cell) return CellNotFound(id);
  GH_ASSIGN_OR_RETURN(std::vector<AttemptRecord> attempts, store_.ListAttempts(id));
  const AttemptRecord* chosen = nullptr;
  for (const AttemptRecord& a : attempts) {
    if (!number || a.number == *number) chosen = &a;
  }
  if (chosen == nullptr) {
    return Status::NotFound("cell '" + id + "' has no attempt " +
                            (number ? std::to_string(*number) : std::string("yet")));
  }
  return store_.ReadLog(chosen->id, stream);
}

// ---- agent side ----

Result<std::string> ControllerCore::RegisterAgent(const AgentHello& hello) {
  if (hello.name.empty()) return Status::InvalidArgument("register: field 'agent_name' is empty");
  AgentRecord record;
  record.id = hello.name;
  record.name = hello.name;
  record.capabilities_json = hello.capabilities_json;
  GH_RETURN_IF_ERROR(store_.UpsertAgent(record));
  return record.id;
}

void ControllerCore::AttachAgent(const std::string& agent_id, const AgentHello& hello,
                                 std::shared_ptr<AgentChannel> channel) {
  const int slots = std::max(hello.slots, 1);
  {
    std::lock_guard lock(agents_mu_);
    agents_[agent_id] = Attached{slots, std::max(hello.gpus, 0), hello.torch_version, std::move(channel)};
  }
  spdlog::info("agent '{}' connected ({} slot(s), {} GPU(s), torch '{}')", agent_id, slots,
               hello.gpus, hello.torch_version);
  Schedule();
}

void ControllerCore::DetachAgent(const std::string& agent_id, const AgentChannel* channel) {
  {
    std::lock_guard lock(agents_mu_);
    auto it = agents_.find(agent_id);
    if (it == agents_.end() || it->second.channel.get() != channel) return;  // replaced
    agents_.erase(it);
  }
  // TODO(issue 5): expire the leases of a disconnected agent (requeue or mark lost).
  Status s = store_.SetAgentState(agent_id, "disconnected");
  if (!s.ok()) spdlog::warn("agent '{}': {}", agent_id, s.ToString());
  spdlog::info("agent '{}' disconnected", agent_id);
}

Status ControllerCore::Heartbeat(const std::string& agent_id) {
  return store_.TouchAgent(agent_id);
}

Result<AttemptRecord> ControllerCore::AttemptOfAgent(const std::string& agent_id,
                                                     int64_t attempt_id) {
  GH_ASSIGN_OR_RETURN(AttemptRecord a, store_.GetAttempt(attempt_id));
  if (a.agent_id != agent_id) {
    return Status::FailedPrecondition("attempt " + std::to_string(attempt_id) +
                                      " is not leased to agent '" + agent_id + "'");
  }
  return a;
}

Status ControllerCore::RecordEvent(const std::string& agent_id, int64_t attempt_id, int64_t seq,
                                   const std::string& json) {
  GH_ASSIGN_OR_RETURN(AttemptRecord attempt, AttemptOfAgent(agent_id, attempt_id));
  (void)attempt;
  Result<EventEffect> effect = ParseWorkerEvent(json);
  if (!effect.ok()) {
    spdlog::warn("attempt {} event {}: {} (stored, not applied)", attempt_id, seq,
                 effect.status().message());
  }
  return store_.RecordEvent(attempt_id, seq, json, effect.ok() ? *effect : EventEffect{}).status();
}

Status ControllerCore::RecordLog(const std::string& agent_id, int64_t attempt_id,
                                 const std::string& stream, int64_t offset,
                                 const std::string& data) {
  GH_ASSIGN_OR_RETURN(AttemptRecord attempt, AttemptOfAgent(agent_id, attempt_id));
  (void)attempt;
  return store_.AppendLog(attempt_id, stream, offset, data).status();
}

Status ControllerCore::EndAttempt(const std::string& agent_id, int64_t attempt_id,
                                  const std::string& outcome, const std::string& reason,
                                  int exit_code) {
  GH_ASSIGN_OR_RETURN(AttemptRecord a, AttemptOfAgent(agent_id, attempt_id));
  if (IsTerminal(a.state)) return Status::Ok();  // a resend
  AttemptState to = AttemptState::kError;
  std::string why;
  if (outcome == "finished") {
    if (a.run_status.empty()) {
      why = "the worker finished without a run_end event (exit code " + std::to_string(exit_code) +
            ")";
    } else if (a.run_status == "PASS") {
      to = AttemptState::kPassed;
    } else {
      to = AttemptState::kFailed;
      why = "run_end status " + a.run_status;
      GH_ASSIGN_OR_RETURN(std::vector<PhaseRecord> phases, store_.ListPhases(attempt_id));
      std::stable_sort(phases.begin(), phases.end(), [](const auto& x, const auto& y) {
        return PhaseOrder(x.phase) < PhaseOrder(y.phase);
      });
      for (const PhaseRecord& p : phases) {
        auto status = ParseGateStatus(p.status);
        if (status && StopsLaterPhases(*status)) {
          why +=
              "; phase '" + p.phase + "' " + p.status + (p.reason.empty() ? "" : ": " + p.reason);
          break;
        }
      }
    }
  } else {
    why = reason.empty()
              ? "the agent reported an error (exit code " + std::to_string(exit_code) + ")"
              : reason;
    if (outcome != "error") why = "unknown outcome '" + outcome + "': " + why;
  }
  GH_ASSIGN_OR_RETURN(bool changed, store_.FinishAttempt(attempt_id, to, why));
  if (changed) {
    spdlog::info("attempt {} of cell {} ended {}{}", attempt_id, a.cell_id, AttemptStateName(to),
                 why.empty() ? "" : ": " + why);
  }
  Schedule();
  return Status::Ok();
}

void ControllerCore::Schedule() {
  std::vector<std::pair<std::shared_ptr<AgentChannel>, AssignmentMessage>> sends;
  {
    std::lock_guard schedule_lock(schedule_mu_);
    std::vector<AgentView> view;
    std::map<std::string, std::shared_ptr<AgentChannel>> channels;
    {
      std::lock_guard lock(agents_mu_);
      if (agents_.empty()) return;
      for (const auto& [id, attached] : agents_) {
        view.push_back({id, attached.slots, 0, attached.gpus, 0, attached.torch_version});
        channels[id] = attached.channel;
      }
    }
    auto queue = store_.ListQueuedAttempts();
    auto active = store_.ListActiveAttempts();
    if (!queue.ok() || !active.ok()) {
      spdlog::error("schedule: {}", (queue.ok() ? active.status() : queue.status()).ToString());
      return;
    }
    if (queue->empty()) return;
    for (const ActiveAttempt& a : *active) {
      for (AgentView& agent : view) {
        if (agent.agent_id != a.agent_id) continue;
        ++agent.running;
        const Demand d = DemandOfSpec(a.spec_json);
        if (d.gpu) agent.gpus_in_use += d.world_size;
      }
    }
    std::vector<Waiting> waiting;
    std::vector<Placement> placements = controller::Schedule(*queue, view, &waiting);
    for (const Waiting& w : waiting) {
      // Logged when the reason changes, not on every scheduling round.
      auto [it, inserted] = waiting_reasons_.try_emplace(w.attempt_id, w.reason);
      if (inserted || it->second != w.reason) {
        it->second = w.reason;
        spdlog::info("attempt {} waits: {}", w.attempt_id, w.reason);
      }
    }
    for (const Placement& p : placements) waiting_reasons_.erase(p.attempt_id);
    if (placements.empty()) return;
    std::vector<Lease> leases;
    for (const Placement& p : placements) leases.push_back({p.attempt_id, p.agent_id});
    Status s = store_.LeaseAttempts(leases);
    if (!s.ok()) {
      spdlog::error("schedule: {}", s.ToString());
      return;
    }
    for (const Placement& p : placements) {
      auto cell = store_.GetCell(p.cell_id);
      if (!cell.ok() || !cell->has_value()) {
        spdlog::error("schedule: cell {} of attempt {} unreadable", p.cell_id, p.attempt_id);
        continue;
      }
      const CellRecord& c = **cell;
      sends.emplace_back(channels[p.agent_id],
                         AssignmentMessage{p.attempt_id, c.id, c.spec_json, c.branch});
    }
  }
  for (auto& [channel, assignment] : sends) {
    if (channel->SendAssignment(assignment)) {
      spdlog::info("attempt {} of cell {} assigned", assignment.attempt_id, assignment.cell_id);
    } else {
      // TODO(issue 5): the lease stays until lease expiry requeues it.
      spdlog::warn("attempt {}: assignment could not be sent; it stays leased",
                   assignment.attempt_id);
    }
  }
}

}  // namespace gatehouse::controller
