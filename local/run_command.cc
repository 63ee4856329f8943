#include "local/run_command.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <spdlog/spdlog.h>

#include "cli/verdict.h"
#include "local/local_run.h"

namespace gatehouse::local {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

fs::path DefaultWorkDir() {
  if (const std::string set = Env("GATEHOUSE_RUN_DIR"); !set.empty()) return set;
  if (const std::string xdg = Env("XDG_CACHE_HOME"); !xdg.empty()) {
    return fs::path(xdg) / "gatehouse" / "run";
  }
  const std::string home = Env("HOME");
  return fs::path(home.empty() ? "/tmp" : home) / ".cache" / "gatehouse" / "run";
}

// LibTorch's CMake prefix as `python` reports it (torch.utils.cmake_prefix_path); empty when
// it cannot say (the build then fails naming CMake's error).
std::string TorchPrefix(const fs::path& python) {
  const std::string command =
      "'" + python.string() + "' -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  ::pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

int ExitCodeOf(controller::AttemptState state) {
  switch (state) {
    case controller::AttemptState::kPassed:
      return cli::kExitPass;
    case controller::AttemptState::kFailed:
      return cli::kExitFail;
    default:
      return cli::kExitBlocked;
  }
}

}  // namespace

void AddRunCommand(CLI::App& app, RunCommand& run) {
  run.command = app.add_subcommand(
      "run", "run a cell on this machine, before any queue: build the working tree as it is "
             "(committed or not), run upstream's reference and the gates, print the phase lines "
             "and write the report; no controller, no token");
  CLI::App& c = *run.command;
  c.add_option("--body", run.body_file, "a JSON submit body (docs/protocols.md §1); flags override");
  cli::AddBodyFlags(c, run.flags);
  c.add_option("--tree", run.tree, "a directory in the adapter's git working tree")
      ->capture_default_str();
  c.add_option("--repository", run.repository,
               "the spec's repository (default: the tree's origin URL, else its path)");
  c.add_option("--work-dir", run.work_dir,
               "build trees, reference bundles and runs (default: $GATEHOUSE_RUN_DIR, else "
               "~/.cache/gatehouse/run)");
  c.add_option("--out", run.out_dir, "where report.md, spec.json, events.jsonl and logs/ go "
                                     "(default: <work-dir>/runs/<cell>-<attempt>)");
  c.add_option("--python", run.python,
               "Python with torch (and transformers) for the Python lane and the reference "
               "(default: the one this build was made with)");
  c.add_option("--reference-python", run.reference_python,
               "Python that runs the reference runner (default: --python)");
  c.add_flag("--verbose", run.verbose, "also print the build's and the worker's output");
  c.add_flag("--submit", run.submit,
             "after a PASS, submit the same cell to the controller and wait for its frozen "
             "verdict (the tree must have no changes and its commit be pushed)");
}

namespace {

/// Set by the first SIGINT or SIGTERM: the run stops its processes (each in a process group of
/// its own, so a terminal's Ctrl-C reaches only this one) and ends cancelled. A second signal
/// ends this process at once.
std::atomic<bool> stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void OnStopSignal(int sig) {
  if (stop_requested.exchange(true)) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  static constexpr char kMessage[] =
      "gatehouse: stopping the run: its processes get SIGTERM, SIGKILL after 10 s (again to quit "
      "now)\n";
  (void)!::write(2, kMessage, sizeof(kMessage) - 1);
}

}  // namespace

int ExecuteRun(const RunCommand& run, json& submit_body) {
  LocalRunOptions o;
  if (!run.body_file.empty()) {
    std::ifstream in(run.body_file);
    if (!in.is_open()) {
      std::cerr << "gatehouse: --body " << run.body_file << ": cannot open the file ("
                << std::strerror(errno) << ")\n";
      return cli::kExitUsage;
    }
    o.body = json::parse(in, nullptr, false);
    if (!o.body.is_object()) {
      std::cerr << "gatehouse: --body " << run.body_file << ": not a JSON object\n";
      return cli::kExitUsage;
    }
  }
  cli::ApplyBodyFlags(run.flags, o.body);
  if (run.submit) {
    auto tree = agent::InspectWorkingTree(run.tree);
    if (tree.ok() && !tree->changed.empty()) {
      std::cerr << "gatehouse: --submit: " << DescribeLocalRun(*tree)
                << "; a frozen verdict is of a commit: commit and push, then run again\n";
      return cli::kExitUsage;
    }
  }
  o.tree = run.tree;
  o.repository = run.repository;
  o.work_dir = run.work_dir.empty() ? DefaultWorkDir() : fs::path(run.work_dir);
  o.out_dir = run.out_dir;
  const fs::path python = run.python.empty() ? fs::path(GATEHOUSE_RUN_PYTHON) : fs::path(run.python);
  o.tools.sdk_dir = GATEHOUSE_RUN_SDK_DIR;
  o.tools.worker = GATEHOUSE_RUN_WORKER;
  o.tools.python = python;
  o.tools.reference_python = run.reference_python.empty() ? python : fs::path(run.reference_python);
  o.tools.reference_script = GATEHOUSE_RUN_REFERENCE_SCRIPT;
  // The build's own Python's LibTorch prefix is known at build time; another Python is asked
  // (importing torch takes seconds, most of a warm run).
  o.tools.cmake_prefix_path = run.python.empty() && *GATEHOUSE_RUN_TORCH_PREFIX != '\0'
                                  ? std::string(GATEHOUSE_RUN_TORCH_PREFIX)
                                  : TorchPrefix(python);
  // The attempt runner's own log lines are the agent's; here the phase lines say it.
  spdlog::set_level(run.verbose ? spdlog::level::info : spdlog::level::warn);
  o.progress = &std::cout;
  o.echo = run.verbose ? &std::cerr : nullptr;

  struct sigaction on_stop {};
  on_stop.sa_handler = OnStopSignal;
  sigemptyset(&on_stop.sa_mask);
  for (int sig : {SIGINT, SIGTERM}) ::sigaction(sig, &on_stop, nullptr);
  o.cancel = &stop_requested;

  Result<LocalRunResult> result = RunLocally(o);
  if (!result.ok()) {
    std::cerr << "gatehouse: run: "
              << (stop_requested.load() ? "stopped by SIGINT or SIGTERM: " : "")
              << result.status().message() << "\n";
    if (stop_requested.load()) return cli::kExitBlocked;
    const StatusCode code = result.status().code();
    return code == StatusCode::kInvalidArgument || code == StatusCode::kNotFound
               ? cli::kExitUsage
               : cli::kExitBlocked;
  }
  const controller::AttemptEnding& ending = result->ending;
  std::cout << result->cell_id << " " << controller::AttemptStateName(ending.state) << "\n";
  if (ending.state != controller::AttemptState::kPassed &&
      ending.state != controller::AttemptState::kFailed && !ending.reason.empty()) {
    std::cout << "  " << ending.reason << "\n";
  }
  std::cout << "report: " << (result->out_dir / "report.md").string() << "\n";
  const int code = ExitCodeOf(ending.state);
  if (code == cli::kExitPass) submit_body = result->submit_body;
  return code;
}

}  // namespace gatehouse::local
