// The worker's standard output, split into events and text (docs/protocols.md §4): what the
// agent relays of one rank. Rank supervision is worker_launcher.h's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "agent/attempt_sink.h"

namespace gatehouse::agent {

/// Splits the worker's standard output into lines. A line that is a JSON object with an "event"
/// member goes to the sink verbatim as an AttemptEvent; any other line (and a line over 4 MiB)
/// goes, with its newline, to log stream `text_stream` ("worker-stdout" by default), whose
/// offsets count only those bytes. Free text is never interpreted. Not thread-safe.
class WorkerStdoutRelay {
 public:
  /// Events are numbered 1, 2, 3, ... by this relay alone.
  WorkerStdoutRelay(AttemptSink& sink, int64_t attempt_id);
  /// Events take their number from `*next_seq` (then increment it), a counter the relays of all
  /// ranks of one attempt share; the caller serialises the relays that share it.
  WorkerStdoutRelay(AttemptSink& sink, int64_t attempt_id, int64_t* next_seq,
                    std::string_view text_stream);
  WorkerStdoutRelay(const WorkerStdoutRelay&) = delete;  // may point at its own counter
  WorkerStdoutRelay& operator=(const WorkerStdoutRelay&) = delete;
  void Feed(std::string_view bytes);
  /// Relays a final line that had no newline.
  void Finish();
  /// Events this relay sent.
  int64_t events_sent() const { return events_sent_; }
  bool saw_run_end() const { return saw_run_end_; }
  /// The "status" member of the run_end event (empty when none or not a string).
  const std::string& run_end_status() const { return run_end_status_; }
  /// The phase of the last phase_start event not yet followed by its phase_end (empty when
  /// none): where a worker that dies was.
  const std::string& current_phase() const { return current_phase_; }

 private:
  void Line(std::string_view line);

  AttemptSink& sink_;
  int64_t attempt_id_;
  LogStream text_;
  std::string partial_;
  bool overlong_ = false;  // in a line already sent to the log in pieces
  int64_t own_seq_ = 1;
  int64_t* next_seq_ = &own_seq_;
  int64_t events_sent_ = 0;
  bool saw_run_end_ = false;
  std::string run_end_status_;
  std::string current_phase_;
};

/// The last lines a process wrote to a stream (its standard error), kept to explain how it
/// ended: a Python traceback's final "SomeError: message", a C++ `what():`, an assertion.
/// Keeps the last kMaxLines lines that are not blank, surrounding blanks removed, each of at
/// most kMaxLineBytes (a longer line keeps its end after "..."), the unfinished last line
/// counted among them. Not thread-safe.
class TailLines {
 public:
  static constexpr size_t kMaxLines = 6;
  static constexpr size_t kMaxLineBytes = 300;
  void Feed(std::string_view bytes);
  /// The kept lines, oldest first, joined by " | "; empty when there are none.
  std::string Summary() const;
  /// The last kept line (the unfinished one when there is one); empty when there is none.
  std::string Last() const;

 private:
  void Push(std::string line);
  std::vector<std::string> lines_;  // oldest first
  std::string partial_;
};

}  // namespace gatehouse::agent
