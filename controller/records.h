// Domain records the controller stores and shows: cells, attempts, phases, figures, agents.
// Plain structs; no transport, SQLite or libgit2 types. Times are UTC ISO-8601 strings with
// milliseconds, e.g. "2025-01-02T03:04:05.678Z" (see clock.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/cell_spec.h"
#include "controller/attempt_state.h"
#include "controller/memory_estimate.h"

namespace gatehouse::controller {

/// A frozen cell as stored: identity (id, spec_json) plus labels (branch, submitter).
struct CellRecord {
  std::string id;         // SHA-256 hex of spec_json
  std::string spec_json;  // canonical frozen spec, docs/protocols.md §2
  std::string repository;
  std::string commit_sha;
  std::string branch;  // label only
  std::string model_family;
  std::string created_at;
  std::string submitter;  // label only
  int priority = 0;       // label only: -100..100, higher is placed first
  /// Hidden by an operator from readiness and the matrix (CellVisibilityAction); a label, not
  /// part of the identity; the cell and its evidence stay.
  bool hidden = false;
};

/// One hide or show of a cell (POST /api/v1/cells/{id}/hide|show), as recorded.
struct CellVisibilityAction {
  std::string cell_id;
  std::string action;  // "hide" or "show"
  std::string actor;   // the token's name
  std::string reason;
  std::string at;      // timestamp
};

/// One run of a cell.
struct AttemptRecord {
  int64_t id = 0;
  std::string cell_id;
  int number = 0;  // 1, 2, ... per cell
  AttemptState state = AttemptState::kQueued;
  std::string agent_id;    // empty until leased
  std::string reason;      // why it ended error/failed, when known
  std::string run_status;  // run_end status (PASS, FAIL, ...), empty until reported
  std::string created_at;
  std::string started_at;
  std::string ended_at;
  std::string cancel_reason;  // why a cancel was requested while it ran; empty when none was
  int64_t retry_of = 0;       // the lost attempt this one retries; 0 for a first attempt
  std::string leased_at;      // empty until leased
  /// The state a requested stop ends it in: cancelled (a cancel) or timed_out (a time limit).
  AttemptState cancel_as = AttemptState::kCancelled;
};

/// A file an attempt stored in the artifact store (content-addressed: protocols.md §7).
struct ArtifactRecord {
  int64_t attempt_id = 0;
  std::string name;    // relative path as the attempt named it ("reference/reference.json")
  std::string digest;  // "sha256:<hex>" of its bytes: the blob it names
  int64_t size = 0;    // bytes
  std::string created_at;
  /// When retention removed the blob's bytes (migrations/0010_artifact_retention.sql); empty
  /// while they are stored.
  std::string expired_at;
};

/// One blob of the artifact store: its bytes, however many attempts named them (protocols.md §7).
struct BlobRecord {
  std::string digest;        // "sha256:<hex>"
  int64_t size = 0;          // bytes
  std::string created_at;
  std::string last_used_at;  // stored, handed to an attempt as an input, or fetched
  std::string expired_at;    // when retention removed the bytes; empty while stored
};

/// The webhook delivery of one ended attempt (migrations/0008_webhooks.sql; protocols.md §8).
struct WebhookDelivery {
  int64_t id = 0;
  int64_t attempt_id = 0;
  std::string cell_id;
  std::string created_at;   // when the attempt ended
  std::string state;        // pending | delivered | failed | skipped
  int tries = 0;            // POSTs made so far
  std::string next_try_at;  // when a pending delivery is next due
  int last_status = 0;      // HTTP status of the last try; 0 when nothing answered
  std::string last_error;   // why the last try failed (or why it was skipped)
  std::string delivered_at;
  bool retried = false;     // the attempt was lost and retried: its cell has not ended
};

/// What one webhook try came to, to record (Store::RecordWebhookTry).
struct WebhookTry {
  std::string state;        // the delivery's state after this try
  bool counts = true;       // a POST was made (false: skipped without one)
  int status = 0;           // HTTP status; 0 when nothing answered
  std::string error;        // empty when delivered
  std::string next_try_at;  // for a delivery still pending
};

/// An attempt over one of its time limits (Store::ListOverdue).
struct OverdueAttempt {
  enum class Limit { kQueued, kAttempt, kPhase };
  int64_t attempt_id = 0;
  std::string cell_id;
  AttemptState state = AttemptState::kQueued;
  std::string agent_id;
  Limit limit = Limit::kQueued;
  std::string since;  // created_at (queued), leased_at (attempt) or the phase's started_at
  std::string phase;  // the running phase (kPhase)
};

/// A figure reported by a gate. value_json is a JSON number or string.
struct FigureRecord {
  std::string name;
  std::string value_json;
  std::string unit;
};

/// One gate of one attempt. status is RUNNING until phase_end arrives.
struct PhaseRecord {
  std::string phase;
  std::string status;
  std::string reason;
  std::string classification;
  std::string started_at;
  std::string ended_at;
  std::optional<int64_t> duration_ms;
  std::vector<FigureRecord> figures;
};

/// A row of the cell list: the cell and its latest attempt's state.
struct CellSummary {
  CellRecord cell;
  AttemptState status = AttemptState::kQueued;
};

/// A repository's branch policy as stored (migrations/0013_designated_branches.sql).
struct RepositoryBranches {
  std::string repository;  // as cells store it (CellSpec::repository)
  /// The remote's HEAD as the controller's mirror last saw it; empty while not seen.
  std::string default_branch;
  std::string default_seen_at;  // when it was first seen as the default
  /// The branches an admin designated; nullopt while none were set (the default branch then).
  std::optional<std::vector<std::string>> designated;
  std::string designated_by;  // the admin token's name
  std::string designated_reason;
  std::string designated_at;
};

/// One cell submitted on one branch (migrations/0013_designated_branches.sql): the label keeps
/// the first, this every one.
struct CellBranch {
  std::string cell_id;
  std::string branch;
};

/// Which validation cells the matrix considers; an empty member matches every cell.
struct MatrixFilter {
  std::string repository;
  std::string branch;
  std::string commit;  // 40 hex
  std::string model_family;
  bool include_hidden = false;  // also cells an operator hid (CellRecord::hidden)
  /// Only cells submitted on a designated branch (controller/readiness.h DesignatedBranches):
  /// a cell of a repository in `restricted` counts when one of its branches is in
  /// `designated` (repository, branch). nullopt: every branch.
  struct Designated {
    std::vector<std::string> restricted;
    std::vector<std::pair<std::string, std::string>> designated;
  };
  std::optional<Designated> designated;
};

/// One square of the matrix (GET /api/v1/matrix): the newest validation cell of one model
/// family x checkpoint x device x precision x topology x mode among those the filter matches.
struct MatrixSquare {
  std::string model_family;
  std::string checkpoint_path;
  std::string checkpoint_digest;
  std::string device;
  std::string precision;
  CellSpec::Topology topology;  // the square's mesh
  std::string mode;
  std::string cell_id;  // the newest cell
  std::string repository;
  std::string branch;
  std::string commit_sha;
  std::string created_at;
  AttemptState status = AttemptState::kQueued;  // its latest attempt
  int64_t attempt_id = 0;  // that attempt
  int64_t cells = 0;  // cells of this square the filter matches
  /// Why that attempt is still queued (the dispatcher's latest reason); empty otherwise.
  std::string waiting_reason;
};

/// What the matrix can be filtered by: every repository with its branches, every model family
/// (validation cells only).
struct MatrixChoices {
  std::vector<std::pair<std::string, std::vector<std::string>>> repositories;  // sorted
  std::vector<std::string> model_families;                                    // sorted
};

/// An agent as it registered.
struct AgentRecord {
  std::string id;
  std::string name;
  std::string capabilities_json;
  std::string registered_at;
  std::string last_heartbeat_at;
  std::string state;  // "connected" | "disconnected"
};

/// A bearer token as stored (migrations/0003_tokens.sql); the secret itself is never stored.
struct TokenRecord {
  int64_t id = 0;
  std::string name;
  std::string kind;    // "api" | "agent"
  std::string scopes;  // comma-separated ("read,submit"); empty for agent tokens
  std::string created_at;
  std::string last_used_at;  // empty: never used
  std::string revoked_at;    // empty: active
};

/// A queued attempt, as the scheduler sees it (FIFO order = creation order).
struct QueuedAttempt {
  int64_t attempt_id = 0;
  std::string cell_id;
  std::string spec_json;  // the cell's frozen spec (the scheduler reads what it needs)
  int priority = 0;       // the cell's
  std::string submitter;  // the cell's (fairness)
  std::string repository;  // the cell's (per-repository limit)
};

/// A leased or running attempt, where it runs and whose it is (its spec is read by cell id
/// when needed: the scheduler caches demands per cell).
struct ActiveAttempt {
  std::string agent_id;
  int64_t attempt_id = 0;
  std::string cell_id;
  std::string submitter;
  std::string repository;
};

/// What one worker event (docs/protocols.md §4) does to the stored evidence.
struct EventEffect {
  enum class Kind { kNone, kPhaseStart, kFigure, kPhaseEnd, kRunEnd };
  Kind kind = Kind::kNone;
  std::string phase;                   // phase_start, figure, phase_end
  std::string name;                    // figure
  std::string value_json;              // figure: JSON number or string
  std::string unit;                    // figure
  std::string status;                  // phase_end, run_end: PASS|FAIL|BLOCKED|UNKNOWN|SKIPPED
  std::string reason;                  // phase_end
  std::string classification;          // phase_end (FAIL only)
  std::optional<int64_t> duration_ms;  // phase_end
};

}  // namespace gatehouse::controller

namespace gatehouse::controller {

/// A cell another one waits for (its reference cell or control), as it stands now.
struct PrerequisiteStatus {
  std::string role;     // "reference cell" | "control"
  std::string cell_id;
  bool found = false;   // false: no such cell is stored
  AttemptState status = AttemptState::kQueued;  // its latest attempt's state
  std::string reason;   // its latest attempt's reason
  std::vector<PhaseRecord> phases;  // its latest attempt's, for the comparison in the report
};

/// A cell with everything the API and the report show about it.
struct CellDetail {
  CellRecord cell;
  AttemptState status = AttemptState::kQueued;  // the latest attempt's state
  std::vector<AttemptRecord> attempts;          // by number ascending
  std::vector<PhaseRecord> phases;              // of the latest attempt, in kPhases order
  /// Why the latest attempt is still queued, as the scheduler last saw it ("gpu-1: 1 of 4
  /// GPUs free, needs 2"); empty when it is not queued or was not considered yet.
  std::string waiting_reason;
  /// The files every attempt stored (a failed attempt's are kept beside its retry's).
  std::vector<ArtifactRecord> artifacts;
  /// The webhook delivery of every ended attempt (protocols.md §8), by attempt.
  std::vector<WebhookDelivery> webhook_deliveries;
  /// The cells this one waits for (its reference cell, its control) as they stand now.
  std::vector<PrerequisiteStatus> prerequisites;
  /// Every hide and show of the cell, oldest first.
  std::vector<CellVisibilityAction> visibility;
  /// What the scheduler holds the cell to now (docs/scheduling.md "Memory"); empty when its
  /// checkpoint's facts are not known.
  MemoryEstimate memory_estimate;
};

}  // namespace gatehouse::controller
