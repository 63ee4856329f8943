#include "controller/cell_service.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/phases.h"
#include "controller/attempt_ending.h"
#include "controller/report.h"

namespace gatehouse::controller {
namespace {

Status CellNotFound(const std::string& id) {
  return Status::NotFound("cell '" + id + "' not found");
}

/// An int64 of the agent's Capabilities as protobuf's JSON writes it (a string) or a number.
int64_t JsonInt64(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (const std::exception&) {
      return 0;
    }
  }
  return 0;
}

}  // namespace

Status CellService::RecordCheckpointFacts(const CellSpec& spec) {
  if (spec.checkpoint.digest.empty()) return Status::Ok();
  GH_ASSIGN_OR_RETURN(std::optional<CheckpointFacts> known,
                      store_.GetCheckpointFacts(spec.checkpoint.digest));
  if (known) return Status::Ok();
  Result<CheckpointFacts> facts = ReadCheckpointFacts(spec.checkpoint.path);
  if (!facts.ok()) {
    // Not a reason to refuse the cell (its load gate says what is wrong): it is not estimated.
    spdlog::warn("memory estimate: {}", facts.status().message());
    return Status::Ok();
  }
  return store_.PutCheckpointFacts(spec.checkpoint.digest, *facts);
}

void CellService::NoteAgentMemory(const std::string& name, int64_t memory_bytes,
                                  int64_t gpu_memory_bytes) {
  std::lock_guard lock(fleet_mu_);
  if (fleet_) (*fleet_)[name] = {memory_bytes, gpu_memory_bytes};
}

Result<std::map<std::string, CellService::AgentMemory>> CellService::FleetMemory() {
  std::lock_guard lock(fleet_mu_);
  if (fleet_) return *fleet_;
  GH_ASSIGN_OR_RETURN(std::vector<AgentRecord> agents, store_.ListAgents());
  std::map<std::string, AgentMemory> fleet;
  for (const AgentRecord& agent : agents) {
    nlohmann::json caps = nlohmann::json::parse(agent.capabilities_json, nullptr, false);
    if (!caps.is_object()) continue;
    AgentMemory m{JsonInt64(caps, "memory_bytes"), 0};
    if (auto gpus = caps.find("gpus"); gpus != caps.end() && gpus->is_array()) {
      for (const nlohmann::json& gpu : *gpus) {
        const int64_t g = gpu.is_object() ? JsonInt64(gpu, "memory_bytes") : 0;
        if (g > 0 && (m.gpu_bytes == 0 || g < m.gpu_bytes)) m.gpu_bytes = g;
      }
    }
    fleet[agent.name] = m;
  }
  fleet_ = fleet;
  return fleet;
}

Status CellService::AdmitMemory(const CellSpec& spec) {
  const MemoryEstimate estimate = dispatcher_.EstimateMemoryOf(spec);
  if (estimate.empty()) return Status::Ok();
  GH_ASSIGN_OR_RETURN(auto fleet, FleetMemory());
  const bool gpu = spec.runtime.device == "cuda";
  std::string why;  // the misfit of the agent with the most memory
  int64_t most = 0;
  int known = 0;
  for (const auto& [name, memory] : fleet) {
    if (memory.host_bytes <= 0) continue;  // not reported: it might hold anything
    const std::string misfit =
        MemoryMisfit(estimate, memory.host_bytes, gpu ? memory.gpu_bytes : 0);
    if (misfit.empty()) return Status::Ok();  // it fits this agent, idle
    ++known;
    if (memory.host_bytes > most) {
      most = memory.host_bytes;
      why = name + ": " + misfit;
    }
  }
  if (known == 0) return Status::Ok();
  return Status::InvalidArgument(
      std::string(spec.IsReference() ? "its reference cell " : "the cell ") +
      "fits no agent that ever registered (" + std::to_string(known) + " known; the largest, " +
      why + ")");
}

CellService::CellService(Store& store, CellFreezer& freezer, Dispatcher& dispatcher,
                         LeaseKeeper& leases, std::function<void()> schedule)
    : store_(store), freezer_(freezer), dispatcher_(dispatcher), leases_(leases),
      schedule_(std::move(schedule)) {}

Result<bool> CellService::StoreCell(const FrozenCell& frozen, const std::string& submitter) {
  CellRecord record;
  record.id = frozen.id;
  record.spec_json = frozen.spec_json;
  record.repository = frozen.repository;
  record.commit_sha = frozen.commit;
  record.branch = frozen.branch;
  record.model_family = frozen.model_family;
  record.priority = frozen.priority;
  record.submitter = submitter;
  GH_ASSIGN_OR_RETURN(bool created, store_.CreateCellIfAbsent(record));
  if (created) {
    if (frozen.spec.IsReference()) {
      spdlog::info("cell {} created (reference for {})", frozen.id, frozen.spec.checkpoint.path);
    } else {
      spdlog::info("cell {} created ({} @ {}, {})", frozen.id, frozen.repository, frozen.commit,
                   frozen.model_family);
    }
    dispatcher_.Remember(frozen.id,
                         DemandOf(frozen.spec, dispatcher_.EstimateMemoryOf(frozen.spec)));
  }
  if (!frozen.spec.IsReference()) {
    // Only a hint for readiness: a failure here costs no submit.
    if (Status s = store_.RecordDefaultBranch(frozen.repository, frozen.default_branch); !s.ok()) {
      spdlog::warn("{}", s.message());
    }
  }
  return created;
}

Status CellService::CheckNamedCell(const std::string& id, std::string_view field,
                                   bool must_be_reference) {
  GH_ASSIGN_OR_RETURN(std::optional<CellRecord> named, store_.GetCell(id));
  if (!named) {
    return Status::InvalidArgument("field '" + std::string(field) + "': no cell '" + id + "'");
  }
  if (must_be_reference) {
    Result<CellSpec> spec = ParseCellSpecJson(named->spec_json);
    if (!spec.ok() || !spec->IsReference()) {
      return Status::InvalidArgument("field '" + std::string(field) + "': cell '" + id +
                                     "' is not a reference cell");
    }
  }
  return Status::Ok();
}

Status CellService::CheckNamedCells(const CellSpec& spec, bool auto_reference) {
  if (!auto_reference && !spec.reference.cell.empty()) {
    GH_RETURN_IF_ERROR(CheckNamedCell(spec.reference.cell, "reference.cell", true));
  }
  if (!spec.control.empty()) GH_RETURN_IF_ERROR(CheckNamedCell(spec.control, "control", false));
  return Status::Ok();
}

Result<SubmitOutcome> CellService::Submit(std::string_view body, const std::string& submitter) {
  GH_ASSIGN_OR_RETURN(FreezeOutcome outcome, freezer_.Freeze(body));
  if (auto* pending = std::get_if<DigestPending>(&outcome)) {
    // A pending spec has no reference cell of its own yet: a reference.cell came in the body.
    GH_RETURN_IF_ERROR(CheckNamedCells(pending->spec, false));
    SubmitOutcome answer;
    answer.pending = std::move(*pending);
    return answer;
  }
  const FrozenCell& frozen = std::get<FrozenCell>(outcome);
  GH_RETURN_IF_ERROR(CheckNamedCells(frozen.spec, frozen.reference_cell != nullptr));
  // Memory admission: a cell no known agent could ever hold is refused, not queued forever.
  GH_RETURN_IF_ERROR(RecordCheckpointFacts(frozen.spec));
  if (frozen.reference_cell != nullptr) GH_RETURN_IF_ERROR(AdmitMemory(frozen.reference_cell->spec));
  GH_RETURN_IF_ERROR(AdmitMemory(frozen.spec));
  bool any_created = false;
  // The reference first: a validation cell is never stored without the cell it waits for.
  if (frozen.reference_cell != nullptr) {
    GH_ASSIGN_OR_RETURN(any_created, StoreCell(*frozen.reference_cell, submitter));
  }
  GH_ASSIGN_OR_RETURN(bool created, StoreCell(frozen, submitter));
  if (created || any_created) schedule_();
  GH_ASSIGN_OR_RETURN(CellDetail detail, GetCell(frozen.id));
  return SubmitOutcome{std::move(detail), created};
}

Result<std::vector<CellSummary>> CellService::ListCells(int limit, int offset) {
  return store_.ListCells(std::clamp(limit, 1, 500), std::max(offset, 0));
}

Result<CellDetail> CellService::GetCell(const std::string& id) {
  GH_ASSIGN_OR_RETURN(std::optional<CellRecord> cell, store_.GetCell(id));
  if (!cell) return CellNotFound(id);
  return LoadDetail(*cell);
}

Result<CellDetail> CellService::LoadDetail(const CellRecord& cell) {
  CellDetail d;
  d.cell = cell;
  if (Result<CellSpec> spec = ParseCellSpecJson(cell.spec_json); spec.ok()) {
    d.memory_estimate = dispatcher_.EstimateMemoryOf(*spec);
  }
  GH_ASSIGN_OR_RETURN(d.attempts, store_.ListAttempts(cell.id));
  if (!d.attempts.empty()) {
    d.status = d.attempts.back().state;
    if (d.status == AttemptState::kQueued) {
      d.waiting_reason = dispatcher_.WaitingReason(d.attempts.back().id);
    }
    // A queued attempt has sent no event, so it has no phases (a submit's answer skips the read).
    if (d.status != AttemptState::kQueued) {
      GH_ASSIGN_OR_RETURN(d.phases, store_.ListPhases(d.attempts.back().id));
    }
    std::stable_sort(d.phases.begin(), d.phases.end(), [](const auto& a, const auto& b) {
      return PhaseOrder(a.phase) < PhaseOrder(b.phase);
    });
    for (const AttemptRecord& a : d.attempts) {
      if (a.state == AttemptState::kQueued) continue;  // nothing stored yet
      GH_ASSIGN_OR_RETURN(std::vector<ArtifactRecord> files, store_.ListArtifacts(a.id));
      d.artifacts.insert(d.artifacts.end(), files.begin(), files.end());
    }
    if (IsTerminal(d.status) || d.attempts.size() > 1) {
      GH_ASSIGN_OR_RETURN(d.webhook_deliveries, store_.ListWebhookDeliveries(d.cell.id));
    }
  }
  GH_ASSIGN_OR_RETURN(d.visibility, store_.ListCellVisibility(cell.id));
  if (auto spec = ParseCellSpecJson(cell.spec_json); spec.ok()) {
    for (const auto& [role, pre] : {std::pair<std::string, std::string>{"reference cell",
                                                                        spec->reference.cell},
                                    {"control", spec->control}}) {
      if (pre.empty()) continue;
      PrerequisiteStatus p{role, pre};
      GH_ASSIGN_OR_RETURN(std::vector<AttemptRecord> attempts, store_.ListAttempts(pre));
      if (!attempts.empty()) {
        p.found = true;
        p.status = attempts.back().state;
        p.reason = attempts.back().reason;
        if (p.status != AttemptState::kQueued) {
          GH_ASSIGN_OR_RETURN(p.phases, store_.ListPhases(attempts.back().id));
        }
      }
      d.prerequisites.push_back(std::move(p));
    }
  }
  return d;
}

Result<CellDetail> CellService::CancelCell(const std::string& id, const std::string& reason) {
  GH_ASSIGN_OR_RETURN(std::optional<CellRecord> cell, store_.GetCell(id));
  if (!cell) return CellNotFound(id);
  GH_ASSIGN_OR_RETURN(std::vector<AttemptRecord> attempts, store_.ListAttempts(id));
  if (attempts.empty()) return Status::FailedPrecondition("cell '" + id + "' has no attempt");
  const AttemptRecord& a = attempts.back();
  const std::string why = "cancelled: " + (reason.empty() ? std::string("requested") : reason);
  AttemptState state = a.state;
  if (state == AttemptState::kQueued) {
    // Only while still queued: a scheduling pass may lease it meanwhile, and then the agent
    // must be told.
    GH_ASSIGN_OR_RETURN(bool changed, store_.CancelQueued(a.id, why));
    if (changed) {
      spdlog::info("attempt {} of cell {} cancelled while queued", a.id, id);
      return LoadDetail(*cell);
    }
    GH_ASSIGN_OR_RETURN(AttemptRecord now, store_.GetAttempt(a.id));
    state = now.state;
  }
  if (state == AttemptState::kLeased || state == AttemptState::kRunning) {
    GH_ASSIGN_OR_RETURN(bool first, store_.RequestCancel(a.id, why));
    if (first) {
      const bool sent = leases_.SendCancel(a.agent_id, a.id, why);
      spdlog::info("attempt {} of cell {}: cancel {} agent '{}'", a.id, id,
                   sent ? "sent to" : "recorded; not reachable now:", a.agent_id);
    }
  } else {
    return Status::FailedPrecondition("cell '" + id + "': its latest attempt " +
                                      std::to_string(a.number) + " already ended (" +
                                      std::string(AttemptStateName(state)) + ")");
  }
  return LoadDetail(*cell);
}

Status CellService::PlanRetry(const std::string& id, int depth, std::vector<std::string>* plan) {
  if (depth > 8) return Status::FailedPrecondition("cell '" + id + "': prerequisites nest too deep");
  GH_ASSIGN_OR_RETURN(std::optional<CellRecord> cell, store_.GetCell(id));
  if (!cell) return CellNotFound(id);
  GH_ASSIGN_OR_RETURN(std::vector<AttemptRecord> own, store_.ListAttempts(id));
  if (!own.empty()) GH_RETURN_IF_ERROR(CheckRetryable(id, own.back().number, own.back().state));
  GH_ASSIGN_OR_RETURN(CellSpec spec, ParseCellSpecJson(cell->spec_json));
  for (const std::string& pre : {spec.reference.cell, spec.control}) {
    if (pre.empty()) continue;
    GH_ASSIGN_OR_RETURN(std::vector<AttemptRecord> attempts, store_.ListAttempts(pre));
    if (attempts.empty()) continue;
    const AttemptState state = attempts.back().state;
    if (state == AttemptState::kFailed) {
      return Status::FailedPrecondition("cell '" + id + "' waits for cell " + pre +
                                        ", which ended failed: it would be blocked again");
    }
    if (IsTerminal(state) && state != AttemptState::kPassed &&
        std::find(plan->begin(), plan->end(), pre) == plan->end()) {
      GH_RETURN_IF_ERROR(PlanRetry(pre, depth + 1, plan));
    }
  }
  plan->push_back(id);
  return Status::Ok();
}

Result<CellDetail> CellService::RetryCell(const std::string& id) {
  // Every cell of the chain is checked before any is queued, so a refusal changes nothing.
  std::vector<std::string> plan;
  GH_RETURN_IF_ERROR(PlanRetry(id, 0, &plan));
  for (const std::string& cell : plan) {
    GH_ASSIGN_OR_RETURN(AttemptRecord retry, store_.RetryCell(cell));
    spdlog::info("cell {} retried as attempt {} (id {})", cell, retry.number, retry.id);
  }
  schedule_();
  return GetCell(id);
}

Result<CellDetail> CellService::SetHidden(const std::string& id, bool hidden,
                                          const std::string& actor, const std::string& reason) {
  if (reason.empty()) return Status::InvalidArgument("field 'reason': required, and not empty");
  GH_ASSIGN_OR_RETURN(CellVisibilityAction action,
                      store_.SetCellHidden(id, hidden, actor.empty() ? "(no token)" : actor, reason));
  spdlog::info("cell {} {} by '{}': {}", id, hidden ? "hidden" : "shown", action.actor, reason);
  return GetCell(id);
}

Result<ReadinessView> CellService::Readiness(bool include_hidden, bool all_branches) {
  constexpr int kPage = 500;
  std::vector<CellSummary> all;
  for (int offset = 0;; offset += kPage) {
    GH_ASSIGN_OR_RETURN(std::vector<CellSummary> page, store_.ListCells(kPage, offset));
    const bool last = page.size() < static_cast<size_t>(kPage);
    for (CellSummary& c : page) {
      if (include_hidden || !c.cell.hidden) all.push_back(std::move(c));
    }
    if (last) break;
  }
  ReadinessView view;
  view.all_branches = all_branches;
  if (!all_branches) {
    GH_ASSIGN_OR_RETURN(std::vector<RepositoryBranches> rows, store_.ListRepositoryBranches());
    GH_ASSIGN_OR_RETURN(std::vector<CellBranch> branches, store_.ListCellBranches());
    all = OnDesignatedBranches(std::move(all), branches, DesignatedBranches(rows));
    GH_ASSIGN_OR_RETURN(view.designations, Designations());
  }
  view.combinations = ComputeReadiness(all);
  return view;
}

Result<std::vector<BranchDesignation>> CellService::Designations(const std::string& repository) {
  GH_ASSIGN_OR_RETURN(std::vector<RepositoryBranches> rows, store_.ListRepositoryBranches());
  const DesignatedBranches designated(rows);
  if (!repository.empty()) return std::vector<BranchDesignation>{designated.Of(repository)};
  std::set<std::string> repositories;
  for (const RepositoryBranches& row : rows) repositories.insert(row.repository);
  GH_ASSIGN_OR_RETURN(MatrixChoices choices, store_.ListMatrixChoices());
  for (const auto& [name, branches] : choices.repositories) repositories.insert(name);
  std::vector<BranchDesignation> out;
  for (const std::string& name : repositories) out.push_back(designated.Of(name));
  return out;
}

Result<BranchDesignation> CellService::SetDesignatedBranches(
    const std::string& repository, const std::vector<std::string>& branches,
    const std::string& actor, const std::string& reason) {
  const std::string who = actor.empty() ? "(no token)" : actor;
  GH_ASSIGN_OR_RETURN(RepositoryBranches row,
                      store_.SetDesignatedBranches(repository, branches, who, reason));
  BranchDesignation d = DesignationOf(row);
  std::string names;
  for (const std::string& b : d.branches) names += (names.empty() ? "" : ", ") + b;
  spdlog::info("repository '{}': designated branches {} ({}) by '{}': {}", repository,
               names.empty() ? "reset" : names, d.source, who, reason);
  return d;
}

Result<std::pair<Matrix, MatrixChoices>> CellService::CellMatrix(MatrixFilter filter,
                                                                 std::string_view status,
                                                                 bool all_branches) {
  // A filter naming a branch asks for that branch's cells, designated or not.
  if (!all_branches && filter.branch.empty()) {
    GH_ASSIGN_OR_RETURN(std::vector<RepositoryBranches> rows, store_.ListRepositoryBranches());
    filter.designated = DesignatedBranches(rows).AsFilter();
  }
  GH_ASSIGN_OR_RETURN(std::vector<MatrixSquare> squares, store_.Matrix(filter));
  for (MatrixSquare& q : squares) {
    if (q.status == AttemptState::kQueued) q.waiting_reason = dispatcher_.WaitingReason(q.attempt_id);
  }
  GH_ASSIGN_OR_RETURN(MatrixChoices choices, store_.ListMatrixChoices());
  return std::pair{ArrangeMatrix(squares, status), std::move(choices)};
}

Result<std::string> CellService::Report(const std::string& id) {
  GH_ASSIGN_OR_RETURN(CellDetail d, GetCell(id));
  return RenderReport(d);
}

Result<std::string> CellService::ReadLog(const std::string& id, const std::string& stream,
                                            std::optional<int> number, int64_t from) {
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
  GH_ASSIGN_OR_RETURN(std::string log, store_.ReadLog(chosen->id, stream, from));
  if (!log.empty() || !IsTerminal(chosen->state) || from > 0) return log;  // a running one may still write it
  // An ended attempt without that stream: a misspelt name reads as an empty log otherwise.
  GH_ASSIGN_OR_RETURN(std::vector<std::string> streams, store_.ListLogStreams(chosen->id));
  if (std::find(streams.begin(), streams.end(), stream) != streams.end()) return log;
  std::string have;
  for (const std::string& name : streams) have += (have.empty() ? "" : ", ") + name;
  return Status::NotFound("cell '" + id + "' attempt " + std::to_string(chosen->number) +
                          " has no log stream '" + stream + "' (it has " +
                          (have.empty() ? std::string("none") : have) + ")");
}

}  // namespace gatehouse::controller
