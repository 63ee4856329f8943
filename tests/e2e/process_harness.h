// Test harness for real processes: start a daemon with its output in files, wait for a line it
// prints, stop it (SIGTERM, then SIGKILL); run a command to completion. argv only, no shell.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace gatehouse::testing {

/// A child process whose stdout/stderr go to `<log_prefix>.stdout` / `.stderr`.
/// The destructor stops it. Not thread-safe.
class Daemon {
 public:
  Daemon(const std::string& exe, const std::vector<std::string>& args,
         const std::filesystem::path& log_prefix);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  /// Waits until stdout holds a line matching `pattern`; returns the first capture group (or the
  /// whole line), or nullopt on timeout or if the process exited.
  std::optional<std::string> WaitForLine(const std::regex& pattern, std::chrono::seconds timeout);
  bool running();
  /// SIGTERM, wait up to 10 s, then SIGKILL.
  void Stop();
  /// SIGINT now (a terminal's Ctrl-C), without waiting.
  void Interrupt();
  /// SIGKILL now (a crash: no cleanup), then reaps it. Its own children are not signalled.
  void Kill();
  /// The process's stderr so far (for failure messages).
  std::string Stderr() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

/// Runs `exe args...` in `cwd` to completion (exe looked up on PATH when not a path).
CommandResult RunCommand(const std::string& exe, const std::vector<std::string>& args,
                         const std::filesystem::path& cwd);

}  // namespace gatehouse::testing
