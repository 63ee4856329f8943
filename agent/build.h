// The build step: configure and build an adaptation repository with its recipe
// (docs/protocols.md §5), output streamed as the attempt's "build" log.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/process.h"
#include "common/recipe.h"
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
  /// installs a Python-lane recipe; pip >= 22.2 for --report). Empty: a Python-lane recipe
  /// fails to build, saying so.
  std::filesystem::path python;
  /// Rewrites each command before it runs (the attempt's sandbox, agent/sandbox.h);
  /// `needs_network` is true for the steps that fetch from the package index (pip resolve,
  /// pip install dependencies). Empty: commands run as they are.
  std::function<void(ProcessSpec& spec, bool needs_network)> wrap;
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
  /// Python lane: the worker's --python-path, in order: where pip installed the repository
  /// (<build dir>/site), then the dependency layer's site when the adapter needs packages the
  /// node's environment lacks; and the recipe's entries (--python-entry).
  std::vector<std::filesystem::path> python_path;
  std::vector<std::string> python_entries;
};

/// The configure and build commands of `request`, in order (exposed for tests and logs):
///   cmake -S <checkout>/<source_dir> -B <build dir> -G Ninja
///         -DCMAKE_PREFIX_PATH=<sdk>;<prefix> -DGatehouseWorker_DIR=<sdk>
///         -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DTORCH_CUDA_ARCH_LIST=9.0 <recipe cmake_args...>
///   cmake --build <build dir> --target <target>
/// Both with CCACHE_BASEDIR=<work dir>, CCACHE_NOHASHDIR=1 and
/// CCACHE_SLOPPINESS=pch_defines,time_macros in the environment.
/// A Python-lane recipe has two commands instead, on the node's torch with no build isolation
/// (as trainers install their own packages): the adapter's metadata (its declared
/// dependencies, nothing resolved or installed), then the adapter itself:
///   <python> -m pip install --dry-run --no-deps --no-build-isolation --no-input
///            --disable-pip-version-check --quiet --report <build dir>/adapter-report.json
///            <build dir>/src
///   <python> -m pip install --no-deps --no-build-isolation --no-input
///            --disable-pip-version-check --upgrade --target <build dir>/site <build dir>/src
/// where <build dir>/src is a fresh copy of <checkout>/<source_dir> (setuptools writes build/
/// and *.egg-info into the tree it builds; the checkout must stay exactly the commit). Between
/// them RunBuild makes or reuses the dependency layer (DependencyLayer).
std::vector<ProcessSpec> BuildCommands(const BuildConfig& config, const BuildRequest& request);

/// The Python lane's dependency layer: the packages an adapter declares that the node's
/// environment does not already satisfy, installed once under
/// `<work dir>/python-deps/<key>/site` and shared by every commit (and repository) declaring
/// the same requirements. `key`: the first 16 hex digits of SHA-256 over the interpreter's
/// path, pip's marker environment and the sorted requirement strings (docs/protocols.md §5).
struct DependencyLayer {
  std::string key;                    // empty: the adapter declares no dependency
  std::filesystem::path dir;          // <work dir>/python-deps/<key>
  std::vector<std::string> requires_dist;  // as declared (pip's report, PEP 508 strings)
  std::vector<std::string> packages;  // name==version installed in dir/site; empty: none needed
};

/// The commands that make a layer: resolve `requires_dist` against the node's environment,
/// writing the packages still missing to `report` (nothing installed), then install exactly
/// those pins without dependencies into `site`:
///   <python> -m pip install --dry-run --no-input --disable-pip-version-check --quiet
///            --report <report> <requires_dist...>
///   <python> -m pip install --no-deps --no-input --disable-pip-version-check
///            --target <site> <name==version...>
/// The second is made once the first's report is read (see RunBuild), so it is returned by
/// its own call with `pins`.
ProcessSpec ResolveDependenciesCommand(const BuildConfig& config,
                                       const std::vector<std::string>& requires_dist,
                                       const std::filesystem::path& report);
ProcessSpec InstallDependenciesCommand(const BuildConfig& config,
                                       const std::vector<std::string>& pins,
                                       const std::filesystem::path& site);

/// Runs the commands on the calling thread, passing their merged stdout+stderr (preceded by a
/// "+ <command>" line each) to `log`, then checks every plugin exists.
/// Errors: FAILED_PRECONDITION "build failed: <step> exited with code N: <last lines>" or
/// "build failed: plugin ... was not built"; what RunProcess returns when cmake cannot start.
Result<BuildResult> RunBuild(const BuildConfig& config, const BuildRequest& request,
                             const OutputHandler& log, CancelToken cancel = {});

}  // namespace gatehouse::agent
