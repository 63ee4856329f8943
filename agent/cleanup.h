// Cleanup evidence (issue 5): after each attempt the agent checks that the attempt left nothing
// behind (no process still working in its directory, the ports it used free again, GPU memory
// back to the agent's idle baseline) and records what it found. An agent whose check fails
// drains: it takes no work until a recheck is clean (agent_client.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace gatehouse::agent {

/// What one check found.
struct CleanupReport {
  /// Processes other than the agent whose working directory is the attempt's directory or
  /// below it: "pid 1234 (python3)".
  std::vector<std::string> leftover_processes;
  /// Ports the attempt used (MASTER_PORT) that 127.0.0.1 cannot bind now.
  std::vector<int> busy_ports;
  struct Gpu {
    int index = 0;
    int64_t baseline_mib = 0;  // memory.used when the agent was idle
    int64_t used_mib = 0;      // memory.used now
  };
  std::vector<Gpu> gpus;
  int64_t gpu_tolerance_mib = 0;
  /// Why GPU memory was not compared ("no GPUs", a probe error); empty when it was.
  std::string gpu_note;

  /// No leftover process, no busy port, every GPU within tolerance of its baseline.
  bool healthy() const;
  /// "clean" or the problems, e.g. "1 leftover process: pid 42 (sleep); GPU 0: 2048 MiB used,
  /// baseline 10 MiB".
  std::string Summary() const;
  /// {"healthy", "leftover_processes", "busy_ports", "gpus": [{"index", "baseline_mib",
  /// "used_mib"}], "gpu_tolerance_mib", "gpu_note"}.
  nlohmann::json ToJson() const;
};

/// GPU memory in use per nvidia-smi index, MiB; an empty map when the node has no GPU.
using GpuMemoryProbe = std::function<Result<std::map<int, int64_t>>()>;

/// Runs the checks. Thread-compatible (the runner thread and the drain recheck take turns).
class CleanupChecker {
 public:
  /// `gpu_tolerance_mib`: how far above its baseline a GPU may stay (allocator caches of
  /// other tenants, driver state).
  explicit CleanupChecker(GpuMemoryProbe probe, int64_t gpu_tolerance_mib = 512);

  /// Records the idle GPU memory (call at agent start, before any attempt). A probe error is
  /// returned; GPU memory is then not compared.
  Status TakeBaseline();

  /// Checks what the attempt in `attempt_dir` that used `ports` left behind.
  CleanupReport Check(const std::filesystem::path& attempt_dir, const std::vector<int>& ports) const;

 private:
  GpuMemoryProbe probe_;
  int64_t tolerance_mib_;
  std::map<int, int64_t> baseline_;
  std::string baseline_note_ = "baseline not taken";
};

/// Processes other than this one whose cwd (/proc/<pid>/cwd) is `dir` or below it.
std::vector<std::string> ProcessesUnder(const std::filesystem::path& dir);

/// True when a TCP socket can be bound to 127.0.0.1:`port` now (SO_REUSEADDR: a port in
/// TIME_WAIT counts as free, a listener does not).
bool PortFree(int port);

}  // namespace gatehouse::agent
