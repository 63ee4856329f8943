// Launching the worker for one attempt and relaying its output (docs/protocols.md §3, §4).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/attempt_sink.h"
#include "agent/checkout.h"
#include "agent/process.h"
#include "common/status.h"

namespace gatehouse::agent {

/// Everything one worker launch needs.
struct WorkerLaunch {
  int64_t attempt_id = 0;
  std::filesystem::path attempt_dir;  // absolute; created when missing; the worker's cwd
  nlohmann::json spec;                // the frozen cell spec (a JSON object)
  CheckoutResult checkout;
  std::vector<std::filesystem::path> plugins;  // absolute
  std::filesystem::path worker;       // the gatehouse-worker executable
  std::string agent_name;
};

/// run.json: the frozen spec plus "attempt": {id, dir, checkout: {head, clean, path}, agent}.
nlohmann::json MakeRunSpec(const WorkerLaunch& launch);

/// The worker's extra environment: the spec's "env" entries (in key order), then RANK=0,
/// WORLD_SIZE=1, LOCAL_RANK=0. Errors: INVALID_ARGUMENT when "env" is not an object of strings.
Result<std::vector<std::pair<std::string, std::string>>> WorkerEnvironment(
    const nlohmann::json& spec);

/// Splits the worker's standard output into lines. A line that is a JSON object with an "event"
/// member goes to the sink as an AttemptEvent (seq 1, 2, ...); any other line (and a line over
/// 4 MiB) goes, with its newline, to log stream "worker-stdout", whose offsets count only those
/// bytes. Free text is never interpreted. Not thread-safe.
class WorkerStdoutRelay {
 public:
  WorkerStdoutRelay(AttemptSink& sink, int64_t attempt_id);
  void Feed(std::string_view bytes);
  /// Relays a final line that had no newline.
  void Finish();
  int64_t events_sent() const { return next_seq_ - 1; }
  bool saw_run_end() const { return saw_run_end_; }

 private:
  void Line(std::string_view line);

  AttemptSink& sink_;
  int64_t attempt_id_;
  LogStream text_;
  std::string partial_;
  bool overlong_ = false;  // in a line already sent to the log in pieces
  int64_t next_seq_ = 1;
  bool saw_run_end_ = false;
};

/// Writes `<attempt_dir>/run.json`, runs
/// `<worker> --run-spec <attempt_dir>/run.json --plugin <p>...` with cwd = attempt_dir and
/// env = the agent's environment + WorkerEnvironment(spec), and relays its standard output
/// (WorkerStdoutRelay) and standard error (log stream "worker") to `sink` until it exits.
/// Does not call sink.End(); returns the report to send: outcome "finished" with the exit code
/// when the worker emitted a run_end event, else "error" with the reason ("worker exited with
/// code N [(signal S)] before run_end", "cannot start worker: ...", ...). `seq` is events + 1.
AttemptEndReport RunWorker(const WorkerLaunch& launch, AttemptSink& sink, CancelToken cancel = {});

}  // namespace gatehouse::agent
