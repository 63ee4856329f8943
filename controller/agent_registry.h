// The agents as the controller knows them now: which are attached (what each offers, its
// stream), when each was last heard from, which drain, and which instance holds a name. In
// memory only; the store keeps what the API shows of them (ControllerCore::ListAgents).
// Domain logic: no transport, SQLite or libgit2 header.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/clock.h"
#include "controller/scheduler.h"

namespace gatehouse::controller {

/// Work pushed to an agent (the domain form of agent.proto's Assignment).
/// A stored artifact an attempt needs as input, fetched by digest (the reference cell's bundle
/// files for a validation cell with a reference.cell).
struct InputArtifact {
  std::string role;    // "reference": the files make up the reference bundle directory
  std::string name;    // path inside that directory ("reference.json")
  std::string digest;  // "sha256:<hex>"
  int64_t size = 0;    // bytes
};

struct AssignmentMessage {
  int64_t attempt_id = 0;
  std::string cell_id;
  std::string spec_json;  // canonical frozen spec
  std::string branch;     // label only
  std::vector<InputArtifact> inputs;
  /// Host memory of the attempt's processes together (Demand::memory); 0: not known.
  int64_t memory_estimate_bytes = 0;
  std::string memory_estimate;  // MemoryEstimate::Describe
};

/// The controller's outbound half of one connected agent's stream. Implemented by the gRPC
/// transport. Implementations must be thread-safe.
class AgentChannel {
 public:
  virtual ~AgentChannel() = default;
  /// Returns false when the stream is closed or broken.
  virtual bool SendAssignment(const AssignmentMessage& assignment) = 0;
  /// Asks the agent to stop attempt `attempt_id` (agent.proto Cancel). Same return.
  virtual bool SendCancel(int64_t attempt_id, const std::string& reason) = 0;
};

/// What an agent says about itself when it registers.
struct AgentHello {
  std::string name;
  std::string capabilities_json;  // Capabilities as JSON, stored as is
  int slots = 1;                  // attempts it runs at once
  int gpus = 0;                   // GPUs it discovered (scheduling: one per CUDA rank)
  std::string torch_version;      // its worker's torch (scheduling: the cell's runtime pin)
  std::string cuda_version;       // CUDA its worker's LibTorch is built with ("13.0"; pin)
  /// Register.running_attempt_ids: the attempts the agent still holds (AttachAgent reconciles).
  std::vector<int64_t> held_attempts;
  /// Register.drain_reason: non-empty while the agent drains (takes no new work).
  std::string drain_reason;
  std::string lane;                     // Capabilities.labels["lane"]: cpu | gpu | npu
  std::vector<std::string> gpu_models;  // Capabilities.gpus[].model
  std::string instance_id;              // Register.instance_id; empty: not sent
  std::string transformers_version;     // Capabilities.transformers_version; empty: none
  int64_t memory_bytes = 0;      // Capabilities.memory_bytes (MemTotal); 0: not reported
  int64_t gpu_memory_bytes = 0;  // the smallest of Capabilities.gpus[].memory_bytes; 0: none
};

/// The attempt heartbeat interval agents are told at registration.
inline constexpr int kHeartbeatIntervalMs = 5000;

/// Leases and retries (controller flags --heartbeat-ms, --missed-heartbeats, --retry-limit).
struct LeaseConfig {
  /// How often agents heartbeat (told at registration).
  std::chrono::milliseconds heartbeat_interval{kHeartbeatIntervalMs};
  /// An agent not heard from (any message) for this many intervals is unreachable: its leases
  /// expire and its attempts become lost.
  int missed_heartbeats = 3;
  /// Lost attempts of one cell retried automatically (a new attempt each); 0: never.
  int retry_limit = 2;
  /// After a controller (re)start, how long an agent holding a lease has to reconnect before
  /// its attempts are lost (at least one lease timeout applies); covers the agents' reconnect
  /// backoff (at most 5 s by default).
  std::chrono::milliseconds restart_grace{15000};
  /// heartbeat_interval x missed_heartbeats.
  std::chrono::milliseconds lease_timeout() const { return heartbeat_interval * missed_heartbeats; }
};

/// One agent's live state, for the API.
struct AgentLiveness {
  bool attached = false;     // it has a stream to this controller now
  int slots = 0;             // while attached
  std::string drain_reason;  // non-empty while it drains
  bool silent = false;       // not heard from within the lease timeout
  /// How long ago it was last heard from; nullopt: not since the controller started.
  std::optional<std::chrono::steady_clock::duration> heard_ago;
};

/// Attached agents and their liveness. An agent is silent when not heard from (any message)
/// for the lease timeout; one not heard from since the controller started counts from the
/// start plus what restart_grace adds beyond a lease, so agents holding leases have time to
/// reconnect after a controller restart. Times are read from the lease clock (monotonic).
///
/// Threading: thread-safe (one mutex; no call blocks on I/O or calls out).
class AgentRegistry {
 public:
  AgentRegistry(LeaseConfig lease, MonotonicClock clock);

  /// ALREADY_EXISTS when another instance (one that sent an instance_id other than
  /// hello.instance_id) holds hello.name and is not silent: two agents with one name would take
  /// each other's leases.
  Status CheckName(const AgentHello& hello) const;

  /// Attaches `id` with what `hello` offers and `channel` (replacing an older stream), heard
  /// from now. Errors: as CheckName, checked atomically with the attach.
  Status Attach(const std::string& id, const AgentHello& hello,
                std::shared_ptr<AgentChannel> channel);

  /// Detaches `id` unless a newer stream replaced `channel`; true when it detached.
  bool Detach(const std::string& id, const AgentChannel* channel);

  /// A sign of life from `id`. True when it is attached and was silent until now: it takes work
  /// again (the caller schedules).
  bool Touch(const std::string& id);

  /// Records whether attached agent `id` drains (`reason` non-empty) and logs a change. True
  /// when its draining just ended: it takes work again (the caller schedules).
  bool SetDrainReason(const std::string& id, const std::string& reason);

  /// True when the stored last_heartbeat_at of `id` is due for a write: leases run on the
  /// in-memory time, the stored one is for people, written at most every 30 s per agent.
  bool HeartbeatWriteDue(const std::string& id);

  /// The stream of `id`; nullptr when it is not attached.
  std::shared_ptr<AgentChannel> Channel(const std::string& id) const;

  /// Attached agents that are not silent, as the scheduler sees them (running and GPUs in use
  /// left 0 for the caller to count), sorted by agent id.
  std::vector<AgentView> SchedulableViews() const;

  /// How long `id` has not been heard from when it is silent; nullopt when it is not.
  std::optional<std::chrono::steady_clock::duration> SilentFor(const std::string& id) const;

  /// The live state of `id`.
  AgentLiveness Liveness(const std::string& id) const;

  const LeaseConfig& lease() const { return lease_; }

 private:
  struct Attached {
    int slots = 1;
    int gpus = 0;
    std::string torch_version;
    std::string cuda_version;
    std::shared_ptr<AgentChannel> channel;
    std::string drain_reason;
    std::string lane;
    std::vector<std::string> gpu_models;
    std::string instance_id;
    std::string transformers_version;
    int64_t memory_bytes = 0;
    int64_t gpu_memory_bytes = 0;
  };
  static constexpr std::chrono::seconds kHeartbeatWriteInterval{30};

  Status CheckNameLocked(const AgentHello& hello, std::chrono::steady_clock::time_point now) const;
  std::chrono::steady_clock::time_point LastHeardLocked(const std::string& id) const;
  bool SilentLocked(const std::string& id, std::chrono::steady_clock::time_point now) const;

  const LeaseConfig lease_;
  const MonotonicClock clock_;
  /// When an agent not heard from since the start counts as last heard (start + grace beyond
  /// one lease).
  const std::chrono::steady_clock::time_point not_yet_heard_;

  mutable std::mutex mu_;
  std::map<std::string, Attached> agents_;
  std::map<std::string, std::chrono::steady_clock::time_point> last_seen_;
  std::map<std::string, std::chrono::steady_clock::time_point> heartbeat_written_;
};

}  // namespace gatehouse::controller
