// `gatehouse run`: a cell run on the user's machine, before any queue. The same code as a
// frozen cell end to end: the controller's CellFreezer freezes the body (the working tree
// standing in for the mirror), the agent's AttemptRunner builds the tree as it is and runs the
// worker (and, when the body names no reference, the reference runner first, as a reference
// cell would), the controller's event parser, attempt ending and report renderer turn the
// events into evidence. What differs is said in the evidence: the identity gate's `evidence`
// figure is "local, unfrozen; ..." and names the tree's changes (docs/cli.md "gatehouse run").
#pragma once

#include <atomic>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/checkout.h"
#include "common/cell_spec.h"
#include "common/status.h"
#include "controller/attempt_ending.h"

namespace gatehouse::local {

/// Where a local run finds its tools; the build's own paths by default (local/run_command.cc).
struct LocalTools {
  std::filesystem::path sdk_dir;       // holds GatehouseWorkerConfig.cmake
  std::string cmake_prefix_path;       // LibTorch's CMake prefix
  std::filesystem::path worker;        // gatehouse-worker
  std::filesystem::path python;        // the Python lane's interpreter (pip installs)
  std::filesystem::path reference_python;  // torch + transformers: runs the reference runner
  std::filesystem::path reference_script;  // tools/refgen/reference_cell.py
};

struct LocalRunOptions {
  /// A directory inside the working tree to build (committed or not).
  std::filesystem::path tree;
  /// The submit body (docs/protocols.md §1) without repository, branch and commit, which come
  /// from the tree: commit = its HEAD, repository = `repository` below.
  nlohmann::json body = nlohmann::json::object();
  /// The spec's repository: what a submit of this cell would name. Empty: the tree's "origin"
  /// remote's URL, else the tree's path.
  std::string repository;
  /// Build trees, reference bundles, attempts and runs (created when missing).
  std::filesystem::path work_dir;
  /// Where the run's report.md, spec.json, events.jsonl and logs/ go. Empty:
  /// <work_dir>/runs/<cell id 12>-<attempt>.
  std::filesystem::path out_dir;
  LocalTools tools;
  SubmitContext context;
  /// Phase lines and progress ("gatehouse: reference ... reused").
  std::ostream* progress = nullptr;
  /// When set, the build's and worker's output too, as it comes.
  std::ostream* echo = nullptr;
  /// When set and it turns true (any thread, a signal handler), the running build, reference
  /// runner or worker ranks are stopped (SIGTERM to each process group, SIGKILL after the
  /// grace) and the run ends cancelled.
  const std::atomic<bool>* cancel = nullptr;
};

/// The run's end, for the exit code and --submit.
struct LocalRunResult {
  std::string cell_id;
  CellSpec spec;
  agent::WorkingTree tree;
  controller::AttemptEnding ending;
  std::filesystem::path out_dir;  // report.md is here
  /// The body a submit of the same cell to a controller takes (repository, commit and branch
  /// named; for --submit).
  nlohmann::json submit_body;
};

/// Freezes, builds, runs and reports one cell locally; prints phase lines as they end.
/// Errors: INVALID_ARGUMENT / NOT_FOUND from freezing, naming the field or path (as a
/// controller's 400/404 would); NOT_FOUND for a tree outside git; FAILED_PRECONDITION when the
/// reference run did not end with a bundle (its reason and where its logs are). A run that ends
/// without PASS is not an error: see LocalRunResult::ending.
Result<LocalRunResult> RunLocally(const LocalRunOptions& options);

/// What GATEHOUSE_LOCAL_RUN says of `tree`: "local, unfrozen; tree clean" or "local,
/// unfrozen; tree has 3 changed files: a.cc, b.h, c.py" (at most 8 named, then "and N more").
std::string DescribeLocalRun(const agent::WorkingTree& tree);

}  // namespace gatehouse::local
