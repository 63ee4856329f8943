// The `gatehouse run` subcommand (docs/cli.md): its flags and its execution. Only CLI11 and
// JSON here, so the CLI's main stays a REST client in what it includes (tests/layering).
#pragma once

#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/body_flags.h"

namespace gatehouse::local {

/// The flags of `gatehouse run`.
struct RunCommand {
  CLI::App* command = nullptr;  // set by AddRunCommand
  cli::BodyFlags flags;
  std::string body_file;
  std::string tree = ".";
  std::string repository;
  std::string work_dir;  // empty: $GATEHOUSE_RUN_DIR, else <cache>/gatehouse/run
  std::string out_dir;
  std::string python;            // empty: the build's
  std::string reference_python;  // empty: --python
  bool verbose = false;
  bool submit = false;
};

/// Adds the `run` subcommand to `app`, writing into `run` (which must outlive the parse).
void AddRunCommand(CLI::App& app, RunCommand& run);

/// Runs the cell locally; returns the exit code (cli::ExitCode: 0 PASS, 1 FAIL, 2 bad flags or
/// a body that does not freeze, 3 no verdict). With --submit and a PASS, `submit_body` is the
/// body for the controller (repository, commit and branch of the tree); a --submit of a tree
/// with changes is refused (2) before anything runs.
int ExecuteRun(const RunCommand& run, nlohmann::json& submit_body);

}  // namespace gatehouse::local
