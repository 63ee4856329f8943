// The build step: configure and build an adaptation repository with its recipe
// (docs/protocols.md §5), output streamed as the attempt's "build" log.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/process.h"
#include "common/recipe.h"
#include "common/status.h"

namespace gatehouse::agent {

/// The agent-wide inputs of every build.
struct BuildConfig {
  /// Each repository's builds keep `<work_dir>/build/<repo key>` across attempts (incremental
  /// builds; ccache keeps object files across repositories and work dirs): see BuildCommands.
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

/// What ccache's statistics log (CCACHE_STATSLOG) recorded over one build: one record per
/// ccache invocation, each a compilation through ccache.
struct CcacheStats {
  int64_t compilations = 0;       // records
  int64_t direct_hits = 0;        // direct_cache_hit
  int64_t preprocessed_hits = 0;  // preprocessed_cache_hit
  int64_t misses = 0;             // cache_miss: compiled, and the result stored
  /// Records with neither a hit nor a miss (ccache ran the compiler without its cache, or the
  /// compilation failed), each named by its counters ("could_not_use_precompiled_header": 2).
  std::map<std::string, int64_t> uncached;
  int64_t hits() const { return direct_hits + preprocessed_hits; }
  /// Compilations the compiler ran: misses and the uncached.
  int64_t compiled() const { return compilations - hits(); }
};

/// Parses the text of a ccache statistics log (ccache >= 4.4, `stats_log`/CCACHE_STATSLOG;
/// ccache's src/core/StatsLog.cpp writes, per invocation, "# <input file>" and then one line per
/// counter the invocation incremented, e.g. "direct_cache_hit", "cache_miss",
/// "local_storage_write"). Empty lines are skipped; an empty log is zero compilations.
/// Errors: INVALID_ARGUMENT "ccache stats log line N: ..." for a counter before the first
/// "# " line or a line that is not a counter name ([a-z0-9_]+).
Result<CcacheStats> ParseCcacheStatsLog(std::string_view text);

/// What the worker is given afterwards.
struct BuildResult {
  /// `<work dir>/build/<repo key>`; lane cpp's CMake build tree is its `tree/`.
  std::filesystem::path build_dir;
  /// Absolute (`<build dir>/tree/<plugin>`), in recipe order.
  std::vector<std::filesystem::path> plugins;
  /// Python lane: the worker's --python-path, in order: where pip installed the repository
  /// (<build dir>/site), then the dependency layer's site when the adapter needs packages the
  /// node's environment lacks; and the recipe's entries (--python-entry).
  std::vector<std::filesystem::path> python_path;
  std::vector<std::string> python_entries;
  /// How long RunBuild took, from its start to the last step's end.
  std::chrono::milliseconds duration{0};
  /// Lane cpp: what ccache's statistics log recorded of `cmake --build` (zero compilations when
  /// nothing was out of date). Empty for the Python lane (pip's build goes through no ccache)
  /// and when the log could not be read (the build log says why).
  std::optional<CcacheStats> ccache;
};

/// The worker's GATEHOUSE_BUILD (docs/protocols.md §5.1), which its identity gate records as
/// figures: "duration_ms=<n>", then " compilations=<n> cache_hits=<n>" when `result.ccache` is
/// set.
std::string BuildEvidence(const BuildResult& result);

/// The configure and build commands of `request`, in order (exposed for tests and logs), with
/// <build dir> = <work dir>/build/<repo key>:
///   cmake -S <build dir>/source -B <build dir>/tree -G Ninja
///         -DCMAKE_PREFIX_PATH=<sdk>;<prefix> -DGatehouseWorker_DIR=<sdk>
///         -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DTORCH_CUDA_ARCH_LIST=9.0 <recipe cmake_args...>
///   cmake --build <build dir>/tree --target <target>
/// Both with CCACHE_BASEDIR=<work dir>, CCACHE_NOHASHDIR=1 and
/// CCACHE_SLOPPINESS=pch_defines,time_macros in the environment, the second also with
/// CCACHE_STATSLOG=<build dir>/ccache-stats.log. <build dir>/source is a symlink RunBuild points
/// at <checkout>/<source_dir> (relative when the checkout is in the work dir, so that it
/// resolves in the sandbox too); CMake keeps that path in the compile lines and ccache makes
/// it relative to the build tree, `../source/...`, the same for every repository, work dir and
/// `gatehouse run` tree: byte-identical sources hit the cache wherever they were compiled.
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
/// "+ <command>" line each) to `log`, then checks every plugin exists. A build dir of the
/// earlier layout (the CMake tree in <build dir> itself) is removed first; lane cpp's tree is
/// started afresh when `source` pointed at another directory (the recipe's source_dir changed,
/// or another local tree of the same repository). The log ends with the build's time and, lane
/// cpp, ccache's figures: "[gatehouse-agent] ccache: 211 of 211 compilations from the cache
/// (100%), 0 compiled; build 22.4 s", or "ccache: no figures (<why>)" when the build compiled
/// sources but ccache left no statistics log (another launcher, ccache before 4.4).
/// Errors: FAILED_PRECONDITION "build failed: <step> exited with code N: <last lines>" or
/// "build failed: plugin ... was not built"; what RunProcess returns when cmake cannot start.
Result<BuildResult> RunBuild(const BuildConfig& config, const BuildRequest& request,
                             const OutputHandler& log, CancelToken cancel = {});

}  // namespace gatehouse::agent
