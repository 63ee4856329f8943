// Helpers of the Python lane's tests (python_lane_test, python_lane_parallel_test): the
// fixtures on disk, the worker executable run as the agent starts it, and adapter packages
// written for a test.
#pragma once

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace gatehouse::worker::lane_test {

namespace fs = std::filesystem;
using nlohmann::json;

/// variant -> family of the fixtures whose family is in `families` (the .done stamps).
std::map<std::string, std::string> Fixtures(const std::set<std::string>& families);

/// What one worker process reported: its phase_end events and figures by phase, and run_end's
/// status.
struct WorkerRun {
  std::map<std::string, json> ends;
  std::map<std::string, std::map<std::string, json>> figures;  // phase -> name -> value
  std::string run_end;
  int exit_code = -1;
  /// A figure's value; json null when absent.
  json Figure(const std::string& phase, const std::string& name) const {
    auto p = figures.find(phase);
    if (p == figures.end()) return json();
    auto f = p->second.find(name);
    return f == p->second.end() ? json() : f->second;
  }
};

/// Runs the worker executable on the lane as the agent starts it (`--python-entry`,
/// `--python-path`, events on stdout) over `variant` (of model family `family`) in `precision`
/// through `phases`, as `world` ranks with torchrun's variables (one process each, rendezvous
/// on 127.0.0.1; a topology of `dimension` = world, tp, dp or dp_shard, or several:
/// "dp=2,tp=2") when world > 1, with `worker_flags` added. `sys_path` goes in front of the
/// reference adapters. Returns each rank's events, rank 0 first; every process is bounded to
/// 10 minutes.
std::vector<WorkerRun> RunWorker(const std::string& entry, const std::string& family,
                                 const std::string& variant, const std::string& precision,
                                 const std::vector<std::string>& phases, int world = 1,
                                 const std::string& sys_path = "",
                                 const std::string& dimension = "tp",
                                 const std::string& worker_flags = "");

/// A package `name` under `dir` whose spec.py imports the reference adapter's SPEC for `family`
/// as `_GOOD` (and dataclasses), then runs `body`, which defines SPEC.
void WriteSpecPackage(const fs::path& dir, const std::string& name, const std::string& family,
                      const std::string& body);

/// The phases a parallel-gate test runs.
inline const std::vector<std::string> kParallelPhases = {"config", "construct", "load", "parallel"};

}  // namespace gatehouse::worker::lane_test
