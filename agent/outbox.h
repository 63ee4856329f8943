// The agent's outbox: every message of an attempt (events, log chunks, the end) is kept, in the
// order it was produced, until the controller acknowledges the attempt's end, so a stream that
// breaks loses nothing: after the next registration the whole outbox is written again, before
// any newer message (docs/protocols.md §4; the controller drops duplicates by (attempt, seq)
// and log offsets). Holds serialised messages; knows no gRPC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace gatehouse::agent {

/// Threading: thread-safe. Send and Replay hold the outbox's lock while they write, so messages
/// reach the stream in the order they were kept, and a replay goes out before any newer
/// message; `write` must not call back into the outbox.
class Outbox {
 public:
  /// Writes one serialised message; false when it could not (no stream, or the write failed).
  using Write = std::function<bool(const std::string& bytes)>;

  /// `max_bytes`: droppable messages (log chunks) that would take the kept bytes past it are
  /// written once but not kept; the others (events, ends) are always kept.
  explicit Outbox(size_t max_bytes) : max_bytes_(max_bytes) {}

  /// Keeps `bytes` of attempt `attempt_id` (unless droppable and over the budget) and writes it.
  /// Returns whether it was kept; a failed write is not an error (the replay resends).
  bool Send(int64_t attempt_id, std::string bytes, bool droppable, const Write& write);

  /// Calls `attach` (the new stream becomes the writer), then writes every kept message in
  /// order, stopping at the first failed write. Returns how many were written.
  size_t Replay(const std::function<void()>& attach, const Write& write);

  /// Forgets attempt `attempt_id`'s messages (the controller acknowledged its end).
  void Acknowledge(int64_t attempt_id);

  /// The attempts with kept messages, each once, ascending.
  std::vector<int64_t> Attempts() const;

  /// Bytes kept now.
  size_t bytes() const;

 private:
  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::deque<std::pair<int64_t, std::string>> kept_;
  size_t bytes_ = 0;
};

}  // namespace gatehouse::agent
