// Where an attempt's output goes: the interface the attempt runner owns and the transport
// implements (the gRPC layer turns each call into an AgentMessage; tests record them).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gatehouse::agent {

/// Log stream names (docs/protocols.md §4). With several ranks, rank r > 0 writes the worker
/// streams as `<name>.rank<r>` ("worker.rank1"; RankLogStream in agent/worker_launcher.h, §3.1).
inline constexpr std::string_view kBuildStream = "build";                // cmake configure + build
inline constexpr std::string_view kWorkerStream = "worker";              // worker standard error
inline constexpr std::string_view kWorkerStdoutStream = "worker-stdout";  // non-JSON stdout lines
inline constexpr std::string_view kCleanupStream = "cleanup";  // agent/cleanup.h: one JSON line

/// AttemptEnd outcomes (proto/gatehouse/agent/v1/agent.proto).
inline constexpr std::string_view kOutcomeFinished = "finished";
inline constexpr std::string_view kOutcomeError = "error";
/// The attempt's resources were taken away (a Slurm node failure, a job cancelled outside
/// Gatehouse): no word on the adaptation; the controller ends it `lost` and retries it as for an
/// expired lease.
inline constexpr std::string_view kOutcomeLost = "lost";

/// The agent's final word on an attempt (AttemptEnd).
struct AttemptEndReport {
  int64_t attempt_id = 0;
  /// Continues the attempt's event sequence: the number of events sent + 1, so the controller
  /// can order the end after every event it has applied.
  int64_t seq = 0;
  std::string outcome;  // kOutcomeFinished, kOutcomeError or kOutcomeLost
  std::string reason;   // empty when finished
  int32_t exit_code = 0;
  /// > 0: the kernel's OOM killer ended one of its processes at this cgroup memory limit.
  int64_t oom_limit_bytes = 0;
};

/// Receives one attempt's events, log chunks and end.
///
/// Threading: for a given attempt every call comes from the attempt runner's thread, one at a
/// time, in order. An implementation shared by several runners must serialise itself.
/// Errors: none are reported back; a transport that cannot deliver keeps or drops the message
/// (delivery after a reconnect is the transport's business, see agent/agent_client.h).
class AttemptSink {
 public:
  virtual ~AttemptSink() = default;
  /// One worker event: `json` is a JSON object with an "event" member, as the worker wrote it
  /// (without the newline). `seq` is 1, 2, 3... per attempt.
  virtual void Event(int64_t attempt_id, int64_t seq, std::string_view json) = 0;
  /// `data` is the bytes at `offset` of log stream `stream` of the attempt; offsets of one
  /// stream are contiguous and start at 0.
  virtual void Log(int64_t attempt_id, std::string_view stream, int64_t offset,
                   std::string_view data) = 0;
  /// The attempt is over; called exactly once per attempt, last.
  virtual void End(const AttemptEndReport& end) = 0;
};

/// Tracks the byte offset of one log stream of one attempt and forwards chunks to a sink.
/// Not thread-safe.
class LogStream {
 public:
  LogStream(AttemptSink& sink, int64_t attempt_id, std::string_view stream)
      : sink_(sink), attempt_id_(attempt_id), stream_(stream) {}

  void Write(std::string_view data) {
    if (data.empty()) return;
    sink_.Log(attempt_id_, stream_, offset_, data);
    offset_ += static_cast<int64_t>(data.size());
  }
  int64_t offset() const { return offset_; }

 private:
  AttemptSink& sink_;
  int64_t attempt_id_;
  std::string stream_;
  int64_t offset_ = 0;
};

}  // namespace gatehouse::agent
