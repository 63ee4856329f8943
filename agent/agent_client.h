// The agent's transport: one gRPC bidirectional stream AgentService.Connect to the controller
// (proto/gatehouse/agent/v1/agent.proto). It translates protobuf to the domain (AttemptAssignment,
// AttemptSink) and back; the attempt lifecycle itself lives in AttemptRunner.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/attempt_runner.h"
#include "agent/attempt_sink.h"
#include "agent/capabilities.h"
#include "agent/outbox.h"
#include "agent/artifact_channel.h"
#include "common/status.h"

namespace grpc {
class ChannelCredentials;
class ClientContext;
template <class W, class R>
class ClientReaderWriter;
}  // namespace grpc

namespace gatehouse::agent::v1 {
class AgentMessage;
class ControllerMessage;
}  // namespace gatehouse::agent::v1

namespace gatehouse::agent {

struct AgentClientConfig {
  std::string controller = "127.0.0.1:50051";  // host:port
  std::string agent_name;
  AgentCapabilities capabilities;
  /// Reconnect backoff: initial, doubled per failed connection, capped.
  std::chrono::milliseconds initial_backoff{200};
  std::chrono::milliseconds max_backoff{5000};
  /// A controller that accepts the stream but sends no Registered within this is dropped.
  std::chrono::milliseconds register_timeout{30000};
  /// Used when Registered carries no interval.
  std::chrono::milliseconds default_heartbeat{5000};
  /// Grace between SIGTERM and SIGKILL when a running worker or build is cancelled.
  std::chrono::milliseconds kill_grace{10000};
  /// While draining (a failed cleanup check), how often the check is repeated.
  std::chrono::milliseconds drain_recheck{5000};
  /// Agent token sent as "authorization: Bearer <token>" on the stream; empty: none.
  std::string token;
  /// TLS to the controller. tls: verify the controller's certificate against tls_ca_file
  /// (PEM), or the system roots when that is empty. tls_cert_file + tls_key_file: the agent's
  /// own certificate, for a controller that requires mutual TLS.
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
};

/// Connects to the controller, registers, heartbeats, and runs assigned attempts one at a time.
///
/// Threads: Run()'s caller reads the stream (and reconnects); a heartbeat thread per connection
/// writes Heartbeats; one runner thread runs attempts (AttemptRunner) and writes their events,
/// log chunks and ends through an AttemptSink. Every write to the stream holds `write_mu_`.
/// Stop() may be called from any thread (the signal thread).
class AgentClient : public ArtifactChannel {
 public:
  AgentClient(AgentClientConfig config, AttemptRunner& runner);
  ~AgentClient();
  AgentClient(const AgentClient&) = delete;
  AgentClient& operator=(const AgentClient&) = delete;

  /// Called on the reading thread after each registration with the id the controller gave.
  void OnRegistered(std::function<void(const std::string& agent_id)> callback) {
    on_registered_ = std::move(callback);
  }

  /// Serves until Stop(): connect, register, read assignments; when the stream breaks,
  /// reconnects with exponential backoff and registers again. Returns OK after Stop(), or
  /// UNAUTHENTICATED / PERMISSION_DENIED when the controller refuses the token while the agent
  /// holds no attempt (with attempts held it keeps trying, so their evidence can still land).
  Status Run();

  /// Ends Run(): cancels the stream and the running attempt (its worker gets SIGTERM, then
  /// SIGKILL after kill_grace). Idempotent.
  void Stop();

  /// ArtifactChannel over PutArtifact / GetArtifact (a call of its own each, with the agent
  /// token and TLS settings of the stream; chunks of 1 MiB). Put retries a refused connection
  /// up to 3 times with backoff; a refusal by the controller is not retried.
  Status Put(int64_t attempt_id, const std::string& name,
             const std::filesystem::path& path) override;
  Status Get(const std::string& digest, int64_t size, const std::filesystem::path& dest) override;

 private:
  using Stream = grpc::ClientReaderWriter<v1::AgentMessage, v1::ControllerMessage>;
  class StreamSink;
  struct QueuedAttempt {
    AttemptAssignment assignment;
    bool cancelled = false;
    std::string cancel_reason;
  };

  /// One connection; returns why it ended. Sets `registered` once Registered arrived.
  Status Session(bool& registered);
  /// Channel credentials from the TLS settings (files read on each connect, so rotated
  /// certificates are picked up).
  Result<std::shared_ptr<grpc::ChannelCredentials>> Credentials() const;
  void HeartbeatLoop(std::chrono::milliseconds interval);
  void RunnerLoop();
  void HandleMessage(const v1::ControllerMessage& message);
  /// Writes under write_mu_; false when no stream is attached or the write failed.
  bool Write(const v1::AgentMessage& message);
  /// Keeps `message` of attempt `attempt_id` in the outbox and writes it (a failed write is
  /// resent after the next registration).
  void Send(int64_t attempt_id, const v1::AgentMessage& message);
  /// Attaches `stream` for writing and writes the whole outbox on it, in order, before any
  /// newer message (after a registration).
  void AttachAndReplay(Stream* stream);
  /// Forgets attempt `attempt_id`'s messages (the controller acknowledged its end).
  void Acknowledge(int64_t attempt_id);
  /// The attempts this agent holds: running, queued, or with unacknowledged messages.
  std::vector<int64_t> HeldAttempts() const;
  int64_t RunningAttempt() const;
  /// On the runner thread: copies the runner's drain state and, when it changed, tells the
  /// controller at once (a Heartbeat carrying it), so an end is never followed by work the
  /// agent will not take.
  void PublishDrainState();
  /// On the runner thread: while the runner is unhealthy, rechecks every drain_recheck until it
  /// is clean or the client stops. Returns false when stopping.
  bool WaitUntilHealthy();

  AgentClientConfig config_;
  /// Random per process (Register.instance_id): tells this agent's reconnects from a second
  /// agent started with the same name.
  const std::string instance_id_;
  AttemptRunner& runner_;
  std::unique_ptr<StreamSink> sink_;
  std::function<void(const std::string&)> on_registered_;

  mutable std::mutex mu_;  // guards everything below up to write_mu_
  std::condition_variable cv_;
  bool stopping_ = false;
  grpc::ClientContext* context_ = nullptr;  // of the live session, for Stop()
  std::deque<QueuedAttempt> queue_;
  int64_t running_attempt_ = 0;
  /// The runner's drain reason as last told to the controller (copied on the runner thread).
  std::string drain_reason_;
  bool session_over_ = false;  // tells the heartbeat thread to end
  std::atomic<bool> cancel_running_{false};

  std::mutex write_mu_;
  Stream* stream_ = nullptr;  // attached after Registered, detached before Finish()

  /// Log chunks past this many outbox bytes are written once but not kept for resending (a
  /// warning names them); events and ends are always kept.
  static constexpr size_t kMaxOutboxBytes = size_t{256} << 20;
  /// Messages (serialised AgentMessage) of attempts whose end the controller has not
  /// acknowledged (EndAck). Its lock is held across a keep and its write and across a replay,
  /// so it is taken before write_mu_ and never while mu_ is held.
  Outbox outbox_{kMaxOutboxBytes};

  std::thread runner_thread_;
};

}  // namespace gatehouse::agent
