#include "controller/controller_core.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/artifacts.h"
#include "common/phases.h"
#include "controller/attempt_ending.h"
#include "controller/scheduler.h"
#include "controller/worker_event.h"

namespace gatehouse::controller {

ControllerCore::ControllerCore(Store& store, CellFreezer& freezer, LeaseConfig lease, Clock clock,
                               TimeLimits limits, SchedulingPolicy policy,
                               MonotonicClock lease_clock)
    : store_(store),
      freezer_(freezer),
      clock_(std::move(clock)),
      lease_clock_(lease_clock ? std::move(lease_clock) : MonotonicFrom(clock_)),
      agents_(lease, lease_clock_),
      dispatcher_(store_, agents_, policy),
      leases_(store_, agents_, dispatcher_, limits, clock_),
      cells_(store_, freezer_, dispatcher_, leases_, [this] { Schedule(); }),
      scheduling_([this] { RunSchedulingPasses(); }, kMinPassInterval),
      maintenance_(
          [this] {
            ExpireLeases();
            EnforceTimeLimits();
            if ((retention_.count() > 0 || max_total_bytes_ > 0) &&
                (last_retention_pass_ == std::chrono::steady_clock::time_point{} ||
                 lease_clock_() - last_retention_pass_ >= kRetentionInterval)) {
              last_retention_pass_ = lease_clock_();
              if (auto n = ExpireArtifacts(); !n.ok()) {
                spdlog::error("artifact retention: {}", n.status().ToString());
              }
            }
          },
          std::chrono::seconds(1)) {}

// ---- REST side ----

Result<SubmitOutcome> ControllerCore::Submit(std::string_view body, const std::string& submitter) {
  return cells_.Submit(body, submitter);
}

Result<std::vector<CellSummary>> ControllerCore::ListCells(int limit, int offset) {
  return cells_.ListCells(limit, offset);
}

Result<CellDetail> ControllerCore::GetCell(const std::string& id) { return cells_.GetCell(id); }

Result<CellDetail> ControllerCore::RetryCell(const std::string& id) { return cells_.RetryCell(id); }

Result<ReadinessView> ControllerCore::Readiness(bool include_hidden, bool all_branches) {
  return cells_.Readiness(include_hidden, all_branches);
}

Result<std::vector<BranchDesignation>> ControllerCore::Designations(const std::string& repository) {
  return cells_.Designations(repository);
}

Result<BranchDesignation> ControllerCore::SetDesignatedBranches(
    const std::string& repository, const std::vector<std::string>& branches,
    const std::string& actor, const std::string& reason) {
  return cells_.SetDesignatedBranches(repository, branches, actor, reason);
}

Result<CellDetail> ControllerCore::SetHidden(const std::string& id, bool hidden,
                                             const std::string& actor, const std::string& reason) {
  return cells_.SetHidden(id, hidden, actor, reason);
}

Result<CellDetail> ControllerCore::CancelCell(const std::string& id, const std::string& reason) {
  return cells_.CancelCell(id, reason);
}

Result<std::vector<AgentStatus>> ControllerCore::ListAgents() {
  GH_ASSIGN_OR_RETURN(std::vector<AgentRecord> records, store_.ListAgents());
  GH_ASSIGN_OR_RETURN(std::vector<ActiveAttempt> active,
                      store_.ListActiveAttempts());
  std::map<std::string, std::vector<std::string>> running;
  for (const ActiveAttempt& a : active) running[a.agent_id].push_back(a.cell_id);
  std::vector<AgentStatus> out;
  const auto wall_now = clock_();
  for (AgentRecord& r : records) {
    AgentStatus st;
    const AgentLiveness live = agents_.Liveness(r.id);
    st.attached = live.attached;
    st.slots = live.slots;
    st.drain_reason = live.drain_reason;
    st.silent = live.silent;
    if (live.heard_ago) {
      st.last_seen_at = FormatTimestamp(
          wall_now - std::chrono::duration_cast<std::chrono::system_clock::duration>(*live.heard_ago));
    }
    st.running_cells = running[r.id];
    st.record = std::move(r);
    out.push_back(std::move(st));
  }
  return out;
}

Result<std::string> ControllerCore::Report(const std::string& id) { return cells_.Report(id); }

Result<std::string> ControllerCore::ReadLog(const std::string& id, const std::string& stream,
                                            std::optional<int> number, int64_t from) {
  return cells_.ReadLog(id, stream, number, from);
}

Result<std::pair<Matrix, MatrixChoices>> ControllerCore::CellMatrix(const MatrixFilter& filter,
                                                                    std::string_view status,
                                                                    bool all_branches) {
  return cells_.CellMatrix(filter, status, all_branches);
}

// ---- agent side ----

Result<std::string> ControllerCore::RegisterAgent(const AgentHello& hello) {
  if (hello.name.empty()) return Status::InvalidArgument("register: field 'agent_name' is empty");
  GH_RETURN_IF_ERROR(agents_.CheckName(hello));
  AgentRecord record;
  record.id = hello.name;
  record.name = hello.name;
  record.capabilities_json = hello.capabilities_json;
  GH_RETURN_IF_ERROR(store_.UpsertAgent(record));
  cells_.NoteAgentMemory(hello.name, hello.memory_bytes, hello.gpu_memory_bytes);
  // Heard from once attached (AttachAgent): a sign of life here would make a silent instance
  // holding the name look alive to the attach-time check.
  return record.id;
}

Status ControllerCore::AttachAgent(const std::string& agent_id, const AgentHello& hello,
                                   std::shared_ptr<AgentChannel> channel) {
  const int slots = std::max(hello.slots, 1);
  std::vector<std::pair<int64_t, std::string>> cancels;
  {
    // Under schedule_mu_: a scheduling pass that leased work over the old channel has
    // committed its leases before the reconcile below reads them (and loses what the agent
    // does not hold), and no pass uses the old channel after the swap.
    std::lock_guard schedule_lock(schedule_mu_);
    // The name again, atomically with the attach: two instances may both have passed
    // RegisterAgent before either attached.
    GH_RETURN_IF_ERROR(agents_.Attach(agent_id, hello, channel));
    cancels = leases_.Reconcile(agent_id, hello.held_attempts);
  }
  spdlog::info("agent '{}' connected ({} slot(s), {} GPU(s), torch '{}')", agent_id, slots,
               hello.gpus, hello.torch_version);
  for (const auto& [attempt_id, reason] : cancels) channel->SendCancel(attempt_id, reason);
  Schedule();
  return Status::Ok();
}

void ControllerCore::DetachAgent(const std::string& agent_id, const AgentChannel* channel) {
  if (!agents_.Detach(agent_id, channel)) return;  // a newer stream replaced it
  // Its leases stay: it may reconnect and go on; ExpireLeases ends them if it stays away.
  Status s = store_.SetAgentState(agent_id, "disconnected");
  if (!s.ok()) spdlog::warn("agent '{}': {}", agent_id, s.ToString());
  spdlog::info("agent '{}' disconnected", agent_id);
}

Status ControllerCore::Heartbeat(const std::string& agent_id, const std::string& drain_reason) {
  Touch(agent_id);
  const bool resumed = agents_.SetDrainReason(agent_id, drain_reason);
  if (agents_.HeartbeatWriteDue(agent_id)) GH_RETURN_IF_ERROR(store_.TouchAgent(agent_id));
  if (resumed) Schedule();
  return Status::Ok();
}

void ControllerCore::Touch(const std::string& agent_id) {
  // An attached agent that was silent takes work again: schedule, or a retry queued while it
  // was silent would wait for an unrelated event.
  if (agents_.Touch(agent_id)) Schedule();
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
  Touch(agent_id);
  GH_ASSIGN_OR_RETURN(AttemptRecord attempt, AttemptOfAgent(agent_id, attempt_id));
  if (IsTerminal(attempt.state)) {
    spdlog::warn("attempt {} event {} arrived after the attempt ended ({}): stored as stale",
                 attempt_id, seq, AttemptStateName(attempt.state));
  }
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
  Touch(agent_id);
  GH_ASSIGN_OR_RETURN(AttemptRecord attempt, AttemptOfAgent(agent_id, attempt_id));
  (void)attempt;
  return store_.AppendLog(attempt_id, stream, offset, data).status();
}

Status ControllerCore::EndAttempt(const std::string& agent_id, int64_t attempt_id,
                                  const std::string& outcome, const std::string& reason,
                                  int exit_code, int64_t oom_limit_bytes) {
  Touch(agent_id);
  GH_ASSIGN_OR_RETURN(AttemptRecord a, AttemptOfAgent(agent_id, attempt_id));
  if (IsTerminal(a.state)) {  // a resend, or the end of a lost attempt: its slot is free now
    Schedule();
    return Status::Ok();
  }
  if (outcome == "lost" && a.cancel_reason.empty()) {
    // Taken away on the agent's side (a Slurm node failure): ended and retried exactly as an
    // expired lease, in one transaction.
    const bool ended =
        leases_.Lose(attempt_id, a.cell_id, reason.empty() ? "the agent reported it lost" : reason);
    Schedule();
    return ended ? Status::Ok()
                 : Status::Unavailable("attempt " + std::to_string(attempt_id) +
                                       " could not be ended lost (see the controller's log)");
  }
  AttemptState to = AttemptState::kError;
  std::string why;
  if (!a.cancel_reason.empty() && (outcome != "finished" || a.run_status.empty())) {
    // Stopped on request before its run_end: cancelled (or timed_out when a time limit asked),
    // with what the agent saw.
    to = a.cancel_as;
    why = a.cancel_reason + (reason.empty() ? "" : "; " + reason);
  } else {
    std::vector<PhaseRecord> phases;
    if (outcome == "finished" && !a.run_status.empty() && a.run_status != "PASS") {
      GH_ASSIGN_OR_RETURN(phases, store_.ListPhases(attempt_id));
    }
    AttemptEnding ending = EndingOf(outcome, reason, exit_code, a.run_status, std::move(phases));
    to = ending.state;
    why = std::move(ending.reason);
  }
  GH_ASSIGN_OR_RETURN(bool changed, store_.FinishAttempt(attempt_id, to, why));
  if (changed) {
    spdlog::info("attempt {} of cell {} ended {}{}", attempt_id, a.cell_id, AttemptStateName(to),
                 why.empty() ? "" : ": " + why);
    // A run cut short measured part of its peak; one the kernel killed at its limit, at least
    // the limit.
    if (outcome == "finished" || oom_limit_bytes > 0) {
      dispatcher_.RecordPeak(attempt_id, a.cell_id, oom_limit_bytes);
    }
  }
  Schedule();
  return Status::Ok();
}

Result<std::unique_ptr<BlobStore::Writer>> ControllerCore::BeginArtifact(
    const std::string& agent_id, int64_t attempt_id, const std::string& name,
    const std::string& digest, int64_t size) {
  if (blobs_ == nullptr) return Status::Unavailable("this controller stores no artifacts");
  GH_RETURN_IF_ERROR(CheckArtifactName(name));
  GH_ASSIGN_OR_RETURN(AttemptRecord a, AttemptOfAgent(agent_id, attempt_id));
  Touch(agent_id);
  if (IsTerminal(a.state)) {
    return Status::FailedPrecondition("attempt " + std::to_string(attempt_id) + " already ended (" +
                                      std::string(AttemptStateName(a.state)) + ")");
  }
  // A reference cell stores its bundle's two files, a validation cell its gates' plot data
  // (common/artifacts.h, at most kValidationArtifactMaxBytes each): an agent token cannot fill
  // the controller's disk through a cell.
  GH_ASSIGN_OR_RETURN(std::optional<CellRecord> cell, store_.GetCell(a.cell_id));
  const Result<CellSpec> spec =
      cell ? ParseCellSpecJson(cell->spec_json) : Result<CellSpec>(Status::NotFound(""));
  const bool reference_file =
      name == "reference/reference.json" || name == "reference/reference.safetensors";
  const bool plot_file = std::find(kValidationArtifacts.begin(), kValidationArtifacts.end(),
                                   name) != kValidationArtifacts.end();
  if (!spec.ok() || (spec->IsReference() ? !reference_file : !plot_file)) {
    return Status::InvalidArgument(
        "artifact '" + name + "' of attempt " + std::to_string(attempt_id) +
        ": a reference cell stores reference/reference.json and reference/reference.safetensors, "
        "a validation cell inference/kl_by_position.json and parallel/kl_by_position.json");
  }
  if (plot_file && size > kValidationArtifactMaxBytes) {
    return Status::ResourceExhausted("artifact '" + name + "' of attempt " +
                                     std::to_string(attempt_id) + ": " + std::to_string(size) +
                                     " bytes, a validation cell's plot data is at most " +
                                     std::to_string(kValidationArtifactMaxBytes));
  }
  GH_ASSIGN_OR_RETURN(std::vector<ArtifactRecord> stored, store_.ListArtifacts(attempt_id));
  for (const ArtifactRecord& r : stored) {
    if (r.name == name && r.digest != digest) {
      return Status::AlreadyExists("attempt " + std::to_string(attempt_id) +
                                   " already stored artifact '" + name + "' as " + r.digest +
                                   ", not " + digest);
    }
  }
  return blobs_->Begin(digest, size);
}

Result<bool> ControllerCore::RecordArtifact(const std::string& agent_id, int64_t attempt_id,
                                            const std::string& name, const std::string& digest,
                                            int64_t size) {
  GH_ASSIGN_OR_RETURN(AttemptRecord a, AttemptOfAgent(agent_id, attempt_id));
  if (IsTerminal(a.state)) {
    return Status::FailedPrecondition("attempt " + std::to_string(attempt_id) + " already ended (" +
                                      std::string(AttemptStateName(a.state)) + ")");
  }
  // Under blob_mu_: a retention pass may have removed an older copy of these bytes between
  // the upload's commit (which kept the file it found) and now.
  if (blobs_ == nullptr) return Status::Unavailable("this controller stores no artifacts");
  std::lock_guard lock(blob_mu_);
  if (!blobs_->Path(digest).ok()) {
    return Status::Unavailable("artifact '" + name + "' (" + digest +
                               ") was removed by artifact retention while it was uploaded; "
                               "upload it again");
  }
  GH_ASSIGN_OR_RETURN(bool created,
                      store_.RecordArtifact({attempt_id, name, digest, size, "", ""}));
  if (created) spdlog::info("attempt {}: artifact '{}' stored ({}, {} bytes)", attempt_id, name, digest, size);
  return created;
}

Result<std::filesystem::path> ControllerCore::ArtifactPath(const std::string& digest) {
  if (blobs_ == nullptr) return Status::Unavailable("this controller stores no artifacts");
  if (!IsBlobDigest(digest)) {
    return Status::InvalidArgument("artifact digest '" + digest.substr(0, 80) +
                                   "': expected sha256:<64 lower-case hex>");
  }
  // Under blob_mu_: a retention pass between the check and the touch could remove a blob
  // about to be served; once touched, no pass removes it for the retention time.
  std::lock_guard lock(blob_mu_);
  GH_ASSIGN_OR_RETURN(std::optional<BlobRecord> blob, store_.GetBlob(digest));
  if (!blob) return Status::NotFound("artifact " + digest + " is not stored");
  if (!blob->expired_at.empty()) {
    return Status::NotFound("artifact " + digest + " was removed at " + blob->expired_at +
                            " by artifact retention (unused since " + blob->last_used_at + ")");
  }
  GH_ASSIGN_OR_RETURN(std::filesystem::path path, blobs_->Path(digest));
  GH_RETURN_IF_ERROR(store_.TouchBlobs({digest}));
  return path;
}

Result<int> ControllerCore::ExpireArtifacts() {
  if (blobs_ == nullptr || (retention_.count() <= 0 && max_total_bytes_ <= 0)) return 0;
  std::lock_guard lock(blob_mu_);
  const auto now = clock_();
  Store::BlobRetention r;
  if (retention_.count() > 0) r.used_before = FormatTimestamp(now - retention_);
  r.max_total_bytes = max_total_bytes_;
  r.kept_since = FormatTimestamp(now - kCapKeepsRecent);
  GH_ASSIGN_OR_RETURN(std::vector<BlobRecord> expired, store_.ExpireBlobs(r));
  for (const BlobRecord& b : expired) {
    spdlog::info("artifact retention: {} ({} bytes) removed, unused since {}", b.digest, b.size,
                 b.last_used_at);
  }
  // The files of this pass's blobs; on the first pass also those of every blob expired
  // before (a pass that a crash cut short between its commit and its removals).
  std::vector<std::string> remove;
  if (!swept_expired_) {
    GH_ASSIGN_OR_RETURN(remove, store_.ListExpiredBlobs());
  } else {
    for (const BlobRecord& b : expired) remove.push_back(b.digest);
  }
  for (const std::string& digest : remove) GH_RETURN_IF_ERROR(blobs_->Remove(digest));
  swept_expired_ = true;
  return static_cast<int>(expired.size());
}

Result<std::vector<ArtifactRecord>> ControllerCore::ListCellArtifacts(const std::string& id) {
  GH_ASSIGN_OR_RETURN(std::optional<CellRecord> cell, store_.GetCell(id));
  if (!cell) return Status::NotFound("cell '" + id + "' not found");
  GH_ASSIGN_OR_RETURN(std::vector<AttemptRecord> attempts, store_.ListAttempts(id));
  std::vector<ArtifactRecord> out;
  for (const AttemptRecord& a : attempts) {
    GH_ASSIGN_OR_RETURN(std::vector<ArtifactRecord> files, store_.ListArtifacts(a.id));
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

ControllerCore::~ControllerCore() { StopBackgroundWork(); }

void ControllerCore::StartBackgroundWork() {
  scheduling_.Start();
  maintenance_.Start();
}

void ControllerCore::StopBackgroundWork() {
  maintenance_.Stop();
  scheduling_.Stop();
}

void ControllerCore::Schedule() { scheduling_.Request(); }

void ControllerCore::RunSchedulingPasses() {
  // Passes coalesce: a caller that finds one in progress leaves a note and returns; the pass
  // in progress runs again before it stops, so nothing queued meanwhile is left unplaced (and
  // many submits at once cost a few passes, not one each).
  schedule_pending_.store(true);
  while (schedule_pending_.load()) {
    std::vector<Send> sends;
    {
      std::unique_lock schedule_lock(schedule_mu_, std::try_to_lock);
      if (!schedule_lock.owns_lock()) return;
      if (!schedule_pending_.exchange(false)) return;
      bool again = false;
      sends = dispatcher_.Pass(&again);
      if (again) schedule_pending_.store(true);
    }
    for (auto& [channel, assignment] : sends) {
      if (channel->SendAssignment(assignment)) {
        spdlog::info("attempt {} of cell {} assigned", assignment.attempt_id, assignment.cell_id);
      } else {
        // The lease stays: the agent re-registers without it (lost at once, retried) or
        // stays away (lost at lease expiry, retried).
        spdlog::warn("attempt {}: assignment could not be sent; it stays leased",
                     assignment.attempt_id);
      }
    }
  }
}

int ControllerCore::ExpireLeases() {
  const int lost = leases_.ExpireLeases();
  if (lost > 0) Schedule();
  return lost;
}

int ControllerCore::EnforceTimeLimits() { return leases_.EnforceTimeLimits(); }

}  // namespace gatehouse::controller
