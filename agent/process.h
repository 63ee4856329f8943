// Running a child process from an argv vector (never through a shell) and streaming its output.
// Used by the build step (cmake), the worker launch and GPU discovery (nvidia-smi).
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace gatehouse::agent {

/// What to run. The program receives exactly `args` as argv[1..]; no shell ever sees them.
struct ProcessSpec {
  /// An absolute or relative path, or a bare name looked up in PATH.
  std::filesystem::path exe;
  std::vector<std::string> args;
  /// Working directory; empty inherits the agent's.
  std::filesystem::path cwd;
  /// Entries added to (or replacing those of) the agent's own environment.
  std::vector<std::pair<std::string, std::string>> env;
  /// Send standard error into the standard-output pipe, so both arrive as one ordered stream
  /// through `on_stdout` (the build log).
  bool merge_stderr = false;
  /// Cgroup directories the child joins before it execs (its pid written to each one's
  /// cgroup.procs, agent/cgroup.h), so it and all it starts are counted and limited there. A
  /// child that cannot join says so on its standard error and exits with code 126.
  std::vector<std::filesystem::path> cgroups;
  /// The final log flush: after the child exits, how long descendants that still hold its
  /// pipes are waited for before its process group is killed and the output cut
  /// (gatehouse-agent --log-flush-timeout-ms).
  std::chrono::milliseconds log_flush_timeout{2000};
};

/// How a child ended.
struct ProcessExit {
  int exit_code = 0;  // exit status; 128 + signal when a signal ended it
  int signal = 0;     // the terminating signal; 0 when it exited on its own
  /// True when descendants still held the pipes log_flush_timeout after the child exited:
  /// they were killed and what they had not written yet is missing.
  bool output_cut = false;
  bool ok() const { return exit_code == 0 && signal == 0; }
  /// "exited with code 1" or "exited with code 137 (signal 9)".
  std::string Describe() const;
};

/// Receives output bytes as they arrive (any chunking; never empty).
using OutputHandler = std::function<void(std::string_view bytes)>;

/// Cancellation of a running child: once `*flag` is true the child's process group gets SIGTERM,
/// then SIGKILL after `grace`.
struct CancelToken {
  const std::atomic<bool>* flag = nullptr;
  std::chrono::milliseconds grace{10000};
  bool requested() const { return flag != nullptr && flag->load(); }
};

/// Runs `spec` to completion on the calling thread, calling the handlers from this thread only.
/// The child starts in its own process group with an empty signal mask, standard input from
/// /dev/null and no inherited descriptors besides 0-2. Returns once the child has exited and its
/// pipes are drained (descendants that keep a pipe open are waited for at most
/// spec.log_flush_timeout after the child's exit, then killed: ProcessExit::output_cut). Errors: NOT_FOUND when the program cannot be found, UNAVAILABLE when it cannot
/// be started (names the program and the OS error).
Result<ProcessExit> RunProcess(const ProcessSpec& spec, const OutputHandler& on_stdout,
                               const OutputHandler& on_stderr, CancelToken cancel = {});

/// Runs `spec` to completion (RunProcess) and returns its standard output, for short client
/// commands (squeue, bwrap --version). Errors: as RunProcess; UNAVAILABLE "<program> exited
/// with code N: <its standard error>" when it does not exit 0.
Result<std::string> RunForOutput(const ProcessSpec& spec);

/// The pid written as `digits` (the "<pid>" an agent puts in the names of what it makes:
/// cgroups `gatehouse-a7-p812`, /dev/shm dirs `gatehouse-sandbox-p812-...`) when that process
/// is gone: not this one, and kill(pid, 0) says ESRCH. nullopt when it runs or `digits` is not
/// a positive number. What it names was a crashed agent's, for the agent at start to remove.
std::optional<pid_t> GoneProcess(std::string_view digits);

/// The absolute path of a program named `name` in PATH, or an empty path.
std::filesystem::path FindProgram(std::string_view name);

}  // namespace gatehouse::agent
