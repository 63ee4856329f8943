// The controller's domain service: submitting and reading cells, and the agent side of an
// attempt's life (registration, events, logs, end). Transports (REST, gRPC) translate to and
// from these calls; this layer includes no transport, SQLite or libgit2 header.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/cell_identity.h"
#include "controller/records.h"
#include "controller/store/store.h"

namespace gatehouse::controller {

/// Work pushed to an agent (the domain form of agent.proto's Assignment).
struct AssignmentMessage {
  int64_t attempt_id = 0;
  std::string cell_id;
  std::string spec_json;  // canonical frozen spec
  std::string branch;     // label only
};

/// The controller's outbound half of one connected agent's stream. Implemented by the gRPC
/// transport. Implementations must be thread-safe.
class AgentChannel {
 public:
  virtual ~AgentChannel() = default;
  /// Returns false when the stream is closed or broken.
  virtual bool SendAssignment(const AssignmentMessage& assignment) = 0;
};

/// What an agent says about itself when it registers.
struct AgentHello {
  std::string name;
  std::string capabilities_json;  // Capabilities as JSON, stored as is
  int slots = 1;                  // attempts it runs at once
  int gpus = 0;                   // GPUs it discovered (scheduling: one per CUDA rank)
  std::string torch_version;      // its worker's torch (scheduling: the cell's runtime pin)
};

/// Result of a submission.
struct SubmitOutcome {
  CellDetail cell;
  bool created = false;  // false: the same inputs were submitted before
};

/// The attempt heartbeat interval agents are told at registration.
inline constexpr int kHeartbeatIntervalMs = 5000;

/// Domain service of the controller.
///
/// Threading: thread-safe; called from REST handler threads and gRPC stream threads. Blocking:
/// Submit fetches git and hashes directories; the rest does SQLite work. Scheduling runs after
/// every change that can free or need a slot; assignments are sent outside internal locks.
class ControllerCore {
 public:
  ControllerCore(Store& store, CellFreezer& freezer);

  // ---- REST side ----

  /// Freezes the body (docs/protocols.md §1-2) and stores the cell with attempt 1 unless it
  /// exists. Errors: as CellFreezer::Freeze; INTERNAL on a store failure.
  Result<SubmitOutcome> Submit(std::string_view body, const std::string& submitter);

  /// Cells newest first. `limit` in [1, 500], `offset` >= 0.
  Result<std::vector<CellSummary>> ListCells(int limit, int offset);

  /// NOT_FOUND "cell '<id>' not found".
  Result<CellDetail> GetCell(const std::string& id);

  /// The Markdown evidence report (controller/report.h). NOT_FOUND as GetCell.
  Result<std::string> Report(const std::string& id);

  /// A log stream of the cell's latest attempt (or of attempt `number`), chunks in offset
  /// order. NOT_FOUND for an unknown cell or attempt number.
  Result<std::string> ReadLog(const std::string& id, const std::string& stream,
                              std::optional<int> number);

  // ---- agent side ----

  /// Stores the agent (id = name) as connected. Call AttachAgent once the agent has been told.
  /// Errors: INVALID_ARGUMENT for an empty name.
  Result<std::string> RegisterAgent(const AgentHello& hello);

  /// Makes `channel` the agent's outbound stream (replacing an older one), keeps what it
  /// offers (hello: slots, GPUs, torch version) for scheduling, and schedules.
  void AttachAgent(const std::string& agent_id, const AgentHello& hello,
                   std::shared_ptr<AgentChannel> channel);

  /// The stream of `channel` ended: the agent is disconnected unless a newer stream replaced it.
  /// TODO(issue 5): leases of a disconnected agent are not yet expired or requeued.
  void DetachAgent(const std::string& agent_id, const AgentChannel* channel);

  /// Records a heartbeat.
  Status Heartbeat(const std::string& agent_id);

  /// Stores an event idempotently by (attempt_id, seq) and applies it (phase_start makes the
  /// attempt running). Errors: NOT_FOUND unknown attempt; FAILED_PRECONDITION when the attempt
  /// is leased to another agent. An event line that cannot be interpreted is stored anyway.
  Status RecordEvent(const std::string& agent_id, int64_t attempt_id, int64_t seq,
                     const std::string& json);

  /// Stores a log chunk; a resent offset is ignored. Errors as RecordEvent.
  Status RecordLog(const std::string& agent_id, int64_t attempt_id, const std::string& stream,
                   int64_t offset, const std::string& data);

  /// The agent ended an attempt. outcome "finished": passed if run_end said PASS, else failed
  /// (error when no run_end arrived); "error" (or anything else): error with `reason`. A resend
  /// for an attempt already ended is ignored. Then schedules. Errors as RecordEvent.
  Status EndAttempt(const std::string& agent_id, int64_t attempt_id, const std::string& outcome,
                    const std::string& reason, int exit_code);

  /// Places queued attempts on attached agents (free slots; the torch pin; one free GPU per
  /// rank of a CUDA attempt: scheduler.h), persists the leases and sends the assignments. Why
  /// an attempt keeps waiting is logged when it changes. Errors are logged, not returned.
  void Schedule();

 private:
  struct Attached {
    int slots = 1;
    int gpus = 0;
    std::string torch_version;
    std::shared_ptr<AgentChannel> channel;
  };

  Result<CellDetail> LoadDetail(const CellRecord& cell);
  Result<AttemptRecord> AttemptOfAgent(const std::string& agent_id, int64_t attempt_id);

  Store& store_;
  CellFreezer& freezer_;

  std::mutex agents_mu_;  // guards agents_
  std::map<std::string, Attached> agents_;
  std::mutex schedule_mu_;  // one scheduling pass at a time
  /// Guarded by schedule_mu_: why each queued attempt last waited (logged when it changes).
  std::map<int64_t, std::string> waiting_reasons_;
};

}  // namespace gatehouse::controller
