// The build step: configure and build an adaptation repository with its recipe
// (docs/protocols.md §5), output streamed as the attempt's "build" log.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "agent/process.h"
#include "agent/recipe.h"
#include "common/status.h"

namespace gatehouse::agent {

/// The agent-wide inputs of every build.
struct BuildConfig {
  /// Build trees go to `<work_dir>/build/<repo key>` and persist across attempts (incremental
  /// builds; ccache keeps object files across repositories).
  std::filesystem::path work_dir;
  /// The worker SDK dir holding GatehouseWorkerConfig.cmake.
  std::filesystem::path sdk_dir;
  /// LibTorch's CMake prefix; may be empty.
  std::string cmake_prefix_path;
  /// The cmake program; a bare name is looked up in PATH.
  std::filesystem::path cmake = "cmake";
  /// ProcessSpec::log_flush_timeout of the cmake steps.
  std::chrono::milliseconds log_flush_timeout{2000};
  /// The Python lane's interpreter: the node's environment with its pinned torch (its pip
  /// installs a Python-lane recipe). Empty: a Python-lane recipe fails to build, saying so.
  std::filesystem::path python;
};

/// One build of one checkout.
struct BuildRequest {
  std::filesystem::path checkout;  // the repository's working tree (absolute)
  std::string repo_key;            // RepoKey(url)
  Recipe recipe;
};

/// What the worker is given afterwards.
struct BuildResult {
  std::filesystem::path build_dir;
  std::vector<std::filesystem::path> plugins;  // absolute, in recipe order
  /// Python lane: where pip installed the repository (<build dir>/site), for the worker's
  /// --python-path, and the recipe's entries (--python-entry).
  std::filesystem::path python_path;
  std::vector<std::string> python_entries;
};

/// The configure and build commands of `request`, in order (exposed for tests and logs):
///   cmake -S <checkout>/<source_dir> -B <build dir> -G Ninja
///         -DCMAKE_PREFIX_PATH=<sdk>;<prefix> -DGatehouseWorker_DIR=<sdk>
///         -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DTORCH_CUDA_ARCH_LIST=9.0 <recipe cmake_args...>
///   cmake --build <build dir> --target <target>
/// Both with CCACHE_BASEDIR=<work dir>, CCACHE_NOHASHDIR=1 and
/// CCACHE_SLOPPINESS=pch_defines,time_macros in the environment.
/// A Python-lane recipe has one command instead, on the node's torch, no dependency
/// resolution and no build isolation (as trainers install their own packages):
///   <python> -m pip install --no-deps --no-build-isolation --no-input
///            --disable-pip-version-check --upgrade --target <build dir>/site <build dir>/src
/// where <build dir>/src is a fresh copy of <checkout>/<source_dir> (setuptools writes build/
/// and *.egg-info into the tree it builds; the checkout must stay exactly the commit).
std::vector<ProcessSpec> BuildCommands(const BuildConfig& config, const BuildRequest& request);

/// Runs the commands on the calling thread, passing their merged stdout+stderr (preceded by a
/// "+ <command>" line each) to `log`, then checks every plugin exists.
/// Errors: FAILED_PRECONDITION "build failed: <step> exited with code N: <last lines>" or
/// "build failed: plugin ... was not built"; what RunProcess returns when cmake cannot start.
Result<BuildResult> RunBuild(const BuildConfig& config, const BuildRequest& request,
                             const OutputHandler& log, CancelToken cancel = {});

}  // namespace gatehouse::agent
