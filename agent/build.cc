// Build step: cmake configure + build as argv (docs/protocols.md §5).
#include "agent/build.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>

#include <nlohmann/json.hpp>

#include "common/sha256.h"

namespace gatehouse::agent {
namespace {

constexpr size_t kTailBytes = 16 * 1024;
constexpr size_t kTailLines = 25;

std::filesystem::path BuildDir(const BuildConfig& config, const BuildRequest& request) {
  return config.work_dir / "build" / request.repo_key;
}

// The last lines of a build's output, for the attempt's end reason.
class OutputTail {
 public:
  void Append(std::string_view data) {
    tail_.append(data);
    if (tail_.size() > 2 * kTailBytes) tail_.erase(0, tail_.size() - kTailBytes);
  }
  std::string LastLines() const {
    std::string_view text(tail_);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
    size_t start = 0;
    size_t pos = text.size();
    for (size_t lines = 0; pos > 0;) {
      const size_t newline = text.rfind('\n', pos - 1);
      if (newline == std::string_view::npos) break;
      if (++lines == kTailLines) {
        start = newline + 1;
        break;
      }
      pos = newline;
    }
    return std::string(text.substr(start));
  }

 private:
  std::string tail_;
};

// A display form of an argv for the build log (never executed).
std::string CommandLine(const ProcessSpec& spec) {
  std::string line = "+ " + spec.exe.string();
  for (const std::string& arg : spec.args) {
    line += ' ';
    const bool plain = !arg.empty() && arg.find_first_of(" \t\n'\"\\$;&|<>*?") == std::string::npos;
    line += plain ? arg : "'" + arg + "'";
  }
  return line + "\n";
}

// Lane cpp's places in <build dir> (BuildCommands).
constexpr const char* kSourceLink = "source";
constexpr const char* kTree = "tree";
constexpr const char* kStatsLog = "ccache-stats.log";

// <checkout>/<source_dir>, normal, without a trailing separator ("." gives the checkout).
std::filesystem::path SourceDir(const BuildRequest& request) {
  std::filesystem::path source = (request.checkout / request.recipe.source_dir).lexically_normal();
  if (!source.has_filename()) source = source.parent_path();
  return source;
}

// A build dir of the old layout holds its CMake tree itself (CMakeCache.txt in <build dir>):
// removed whole, as nothing of it is reused.
Status DropOldLayout(const std::filesystem::path& build_dir, const OutputHandler& log) {
  std::error_code ec;
  if (!std::filesystem::exists(build_dir / "CMakeCache.txt", ec)) return Status::Ok();
  log("[gatehouse-agent] " + build_dir.string() +
      " holds a build tree of an earlier layout: removed\n");
  std::filesystem::remove_all(build_dir, ec);
  if (ec) return Status::Internal("cannot remove " + build_dir.string() + ": " + ec.message());
  return Status::Ok();
}

// Points <build dir>/source at the checkout's source dir: relative when the checkout is in the
// work dir (the sandbox hides the work dir and binds back the checkout and the build dir, so
// the link resolves there too), absolute otherwise (a `gatehouse run` tree). When it pointed
// elsewhere (the recipe's source_dir changed, or another tree of the same repository), the
// tree is started afresh: ninja judges by mtimes, so objects of the other sources could pass
// for current.
Status LinkSource(const BuildConfig& config, const BuildRequest& request,
                  const std::filesystem::path& build_dir, const OutputHandler& log) {
  namespace fs = std::filesystem;
  const fs::path source = SourceDir(request);
  const fs::path inside = source.lexically_relative(config.work_dir.lexically_normal());
  const bool in_work_dir = !inside.empty() && *inside.begin() != "..";
  const fs::path target =
      in_work_dir ? source.lexically_relative(build_dir.lexically_normal()) : source;
  const fs::path link = build_dir / kSourceLink;
  const fs::path tree = build_dir / kTree;
  std::error_code ec;
  const fs::path current = fs::read_symlink(link, ec);
  if (!ec && current == target) return Status::Ok();
  if (fs::exists(tree, ec)) {
    log("[gatehouse-agent] build tree " + tree.string() + " was configured for " +
        (current.empty() ? std::string("another source") : current.string()) +
        ": starting it afresh\n");
  }
  fs::remove_all(tree, ec);
  fs::remove_all(link, ec);  // the link itself, never what it points at
  fs::create_directory_symlink(target, link, ec);
  if (ec) {
    return Status::Internal("cannot link " + link.string() + " to " + target.string() + ": " +
                            ec.message());
  }
  return Status::Ok();
}

// The build log's last line: "[gatehouse-agent] ccache: 211 of 211 compilations from the cache
// (100%), 0 compiled; build 22.4 s". `unreadable`: why the stats log gave no figures.
std::string SummaryLine(const BuildResult& result, bool python, const std::string& unreadable) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "build %.1f s",
                static_cast<double>(result.duration.count()) / 1000.0);
  std::string line = "[gatehouse-agent] ";
  if (python) return line + seconds + " (lane python: no ccache figures)\n";
  if (!result.ccache) return line + "ccache: no figures (" + unreadable + "); " + seconds + "\n";
  const CcacheStats& c = *result.ccache;
  if (c.compilations == 0) return line + "ccache: no compilation recorded; " + seconds + "\n";
  line += "ccache: " + std::to_string(c.hits()) + " of " + std::to_string(c.compilations) +
          " compilations from the cache (" + std::to_string(c.hits() * 100 / c.compilations) +
          "%), " + std::to_string(c.compiled()) + " compiled";
  if (!c.uncached.empty()) {
    std::string names;
    for (const auto& [name, count] : c.uncached) {
      names += (names.empty() ? "" : ", ") + name + " " + std::to_string(count);
    }
    line += " (" + std::to_string(c.compiled() - c.misses) + " without the cache: " + names + ")";
  }
  return line + "; " + seconds + "\n";
}

// The node's pip, output merged into the build log.
ProcessSpec PipCommand(const BuildConfig& config, const std::filesystem::path& cwd) {
  ProcessSpec spec;
  spec.exe = config.python;
  spec.cwd = cwd;
  spec.merge_stderr = true;
  spec.log_flush_timeout = config.log_flush_timeout;
  return spec;
}

Result<nlohmann::json> ReadReport(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return Status::FailedPrecondition("build failed: pip wrote no report " + path.string());
  nlohmann::json report = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.is_object() || !report.contains("install") ||
      !report["install"].is_array()) {
    return Status::FailedPrecondition("build failed: pip's report " + path.string() +
                                      " is not an installation report (pip >= 22.2 writes one)");
  }
  return report;
}

// One command of the build, its output teed into the log and a tail for the error.
Status RunStep(const ProcessSpec& spec, const std::string& step, const BuildConfig& config,
               const OutputHandler& log, const CancelToken& cancel, bool needs_network = false) {
  OutputTail tail;
  const OutputHandler tee = [&](std::string_view data) {
    tail.Append(data);
    log(data);
  };
  tee(CommandLine(spec));
  ProcessSpec run = spec;
  if (config.wrap) config.wrap(run, needs_network);
  GH_ASSIGN_OR_RETURN(const ProcessExit exit, RunProcess(run, tee, tee, cancel));
  if (exit.output_cut) {
    log("\n[gatehouse-agent] log flush timed out: processes " + step +
        " left still held its output " + std::to_string(config.log_flush_timeout.count()) +
        " ms after it exited (--log-flush-timeout-ms); they were killed\n");
  }
  if (!exit.ok()) {
    return Status::FailedPrecondition("build failed: " + step + " " + exit.Describe() + ":\n" +
                                      tail.LastLines());
  }
  return Status::Ok();
}

std::string Joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : " ") + item;
  return out;
}

// The adapter contract's distribution (python/pyproject.toml): the worker puts its own copy
// on sys.path, so an adapter that declares it needs nothing installed for it.
constexpr std::string_view kContractPackage = "gatehouse-adapter";

// A PEP 508 requirement's project name, normalized as PEP 503 does (lower case, each run of
// '-', '_' and '.' one '-'): "Gatehouse_Adapter>=1" -> "gatehouse-adapter".
std::string RequirementName(std::string_view requirement) {
  std::string name;
  bool separator = false;
  for (const char c : requirement) {
    if (c == '-' || c == '_' || c == '.') {
      separator = !name.empty();
      continue;
    }
    if (!std::isalnum(static_cast<unsigned char>(c))) break;
    if (separator) name += '-';
    separator = false;
    name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return name;
}

// "[gatehouse-agent] dependency layer <key> <what> (<requirements>): <packages>", for the log.
std::string LayerLine(const DependencyLayer& layer, const std::string& what) {
  return "[gatehouse-agent] dependency layer " + layer.key + " " + what + " (" +
         Joined(layer.requires_dist) + "): " +
         (layer.packages.empty() ? "the node's environment satisfies them"
                                 : Joined(layer.packages)) +
         "\n";
}

// The layer of `adapter_report` (pip's dry-run report of the adapter alone): found, or resolved
// and installed into a temporary directory renamed into place, so agents sharing a work dir
// never see half a layer (the first rename wins; the loser's copy is dropped).
Result<DependencyLayer> MakeDependencyLayer(const BuildConfig& config,
                                            const std::filesystem::path& build_dir,
                                            const nlohmann::json& adapter_report,
                                            const OutputHandler& log, const CancelToken& cancel) {
  namespace fs = std::filesystem;
  DependencyLayer layer;
  const nlohmann::json& install = adapter_report["install"];
  if (install.size() != 1 || !install[0].contains("metadata")) {
    return Status::FailedPrecondition(
        "build failed: pip's report of the adapter lists " + std::to_string(install.size()) +
        " packages, expected the adapter alone");
  }
  const nlohmann::json& metadata = install[0]["metadata"];
  if (metadata.contains("requires_dist") && metadata["requires_dist"].is_array()) {
    for (const auto& requirement : metadata["requires_dist"]) {
      if (!requirement.is_string()) continue;
      const std::string text = requirement.get<std::string>();
      if (RequirementName(text) == kContractPackage) {
        log("[gatehouse-agent] " + text + ": provided by the worker (its contract version is "
            "checked when the entry loads), not installed\n");
        continue;
      }
      layer.requires_dist.push_back(text);
    }
  }
  std::sort(layer.requires_dist.begin(), layer.requires_dist.end());
  if (layer.requires_dist.empty()) {
    log("[gatehouse-agent] the adapter declares no dependency to install\n");
    return layer;
  }
  Sha256 key;
  key.Update(config.python.string() + "\n");
  key.Update(adapter_report.value("environment", nlohmann::json::object()).dump() + "\n");
  for (const std::string& requirement : layer.requires_dist) key.Update(requirement + "\n");
  layer.key = key.FinalHex().substr(0, 16);
  layer.dir = config.work_dir / "python-deps" / layer.key;

  std::error_code ec;
  const auto read_manifest = [&]() -> bool {
    std::ifstream in(layer.dir / "layer.json");
    if (!in) return false;
    const nlohmann::json manifest = nlohmann::json::parse(in, nullptr, false);
    if (manifest.is_discarded() || !manifest.is_object() || !manifest.contains("packages") ||
        !manifest["packages"].is_array()) {
      return false;
    }
    layer.packages.clear();
    for (const auto& package : manifest["packages"]) {
      if (!package.is_string()) return false;
      layer.packages.push_back(package.get<std::string>());
    }
    return true;
  };
  if (read_manifest()) {
    log(LayerLine(layer, "reused"));
    return layer;
  }

  const fs::path report_path = build_dir / "dependencies-report.json";
  fs::remove(report_path, ec);
  GH_RETURN_IF_ERROR(RunStep(ResolveDependenciesCommand(config, layer.requires_dist, report_path),
                             "pip resolve", config, log, cancel, /*needs_network=*/true));
  GH_ASSIGN_OR_RETURN(const nlohmann::json report, ReadReport(report_path));
  for (const auto& item : report["install"]) {
    const nlohmann::json& m = item.value("metadata", nlohmann::json::object());
    if (!m.contains("name") || !m.contains("version")) {
      return Status::FailedPrecondition("build failed: pip's report " + report_path.string() +
                                        " lists a package without name and version");
    }
    layer.packages.push_back(m["name"].get<std::string>() + "==" +
                             m["version"].get<std::string>());
  }
  std::sort(layer.packages.begin(), layer.packages.end());

  std::random_device random;
  const fs::path staging = layer.dir.parent_path() /
                           (".staging-" + layer.key + "-" + std::to_string(random()));
  fs::create_directories(staging, ec);
  if (ec) return Status::Internal("cannot create " + staging.string() + ": " + ec.message());
  if (!layer.packages.empty()) {
    if (Status s = RunStep(InstallDependenciesCommand(config, layer.packages, staging / "site"),
                           "pip install dependencies", config, log, cancel,
                           /*needs_network=*/true);
        !s.ok()) {
      fs::remove_all(staging, ec);
      return s;
    }
  }
  const nlohmann::json manifest = {{"requires_dist", layer.requires_dist},
                                   {"packages", layer.packages},
                                   {"python", config.python.string()}};
  {
    std::ofstream out(staging / "layer.json");
    out << manifest.dump(1) << "\n";
    if (!out) {
      fs::remove_all(staging, ec);
      return Status::Internal("cannot write " + (staging / "layer.json").string());
    }
  }
  fs::rename(staging, layer.dir, ec);
  if (ec) {
    // Another agent made the same layer first: it holds the same pins.
    fs::remove_all(staging, ec);
    if (!read_manifest()) {
      return Status::Internal("cannot move the dependency layer into " + layer.dir.string());
    }
  }
  log(LayerLine(layer, "made"));
  return layer;
}

}  // namespace

Result<CcacheStats> ParseCcacheStatsLog(std::string_view text) {
  CcacheStats stats;
  bool in_record = false, hit = false, miss = false;
  std::vector<std::string> reasons;  // the record's counters that say why it was not cached
  const auto close_record = [&] {
    if (!in_record) return;
    ++stats.compilations;
    if (hit || miss) return;
    if (reasons.empty()) reasons.push_back("no counter");
    for (const std::string& reason : reasons) ++stats.uncached[reason];
  };
  size_t number = 0;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::string where = "ccache stats log line " + std::to_string(number) + ": ";
    if (line.front() == '#') {
      close_record();
      in_record = true;
      hit = miss = false;
      reasons.clear();
      continue;
    }
    if (line.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string_view::npos) {
      return Status::InvalidArgument(where + "'" + std::string(line) + "' is not a counter name");
    }
    if (!in_record) {
      return Status::InvalidArgument(where + "counter '" + std::string(line) +
                                     "' before any '# <input file>' line");
    }
    if (line == "direct_cache_hit") {
      ++stats.direct_hits;
      hit = true;
    } else if (line == "preprocessed_cache_hit") {
      ++stats.preprocessed_hits;
      hit = true;
    } else if (line == "cache_miss") {
      ++stats.misses;
      miss = true;
    } else if (line.rfind("local_storage_", 0) != 0 && line.rfind("remote_storage_", 0) != 0 &&
               !line.ends_with("_cache_miss")) {
      reasons.emplace_back(line);
    }
  }
  close_record();
  return stats;
}

std::string BuildEvidence(const BuildResult& result) {
  std::string out = "duration_ms=" + std::to_string(result.duration.count());
  if (result.ccache) {
    out += " compilations=" + std::to_string(result.ccache->compilations) +
           " cache_hits=" + std::to_string(result.ccache->hits());
  }
  return out;
}

ProcessSpec ResolveDependenciesCommand(const BuildConfig& config,
                                       const std::vector<std::string>& requires_dist,
                                       const std::filesystem::path& report) {
  ProcessSpec spec = PipCommand(config, report.parent_path());
  spec.args = {"-m", "pip", "install", "--dry-run", "--no-input", "--disable-pip-version-check",
               "--quiet", "--report", report.string()};
  spec.args.insert(spec.args.end(), requires_dist.begin(), requires_dist.end());
  return spec;
}

ProcessSpec InstallDependenciesCommand(const BuildConfig& config,
                                       const std::vector<std::string>& pins,
                                       const std::filesystem::path& site) {
  ProcessSpec spec = PipCommand(config, site.parent_path());
  spec.args = {"-m", "pip", "install", "--no-deps", "--no-input", "--disable-pip-version-check",
               "--target", site.string()};
  spec.args.insert(spec.args.end(), pins.begin(), pins.end());
  return spec;
}

std::vector<ProcessSpec> BuildCommands(const BuildConfig& config, const BuildRequest& request) {
  const std::filesystem::path build_dir = BuildDir(config, request);
  if (request.recipe.lane == "python") {
    ProcessSpec metadata = PipCommand(config, request.checkout);
    metadata.args = {"-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
                     "--no-input", "--disable-pip-version-check", "--quiet", "--report",
                     (build_dir / "adapter-report.json").string(), (build_dir / "src").string()};
    ProcessSpec install = PipCommand(config, request.checkout);
    install.args = {"-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-input",
                    "--disable-pip-version-check", "--upgrade", "--target",
                    (build_dir / "site").string(), (build_dir / "src").string()};
    return {metadata, install};
  }
  std::string prefix_path = config.sdk_dir.string();
  if (!config.cmake_prefix_path.empty()) prefix_path += ";" + config.cmake_prefix_path;
  // The sources are compiled as <build dir>/source/... from <build dir>/tree, and
  // CCACHE_BASEDIR at the work dir holds both, so ccache hashes them as ../source/...: the same
  // path for every repository key, agent and work dir (and a `gatehouse run` tree anywhere on
  // disk, linked the same way), the precompiled header included.
  // The SDK's plugin helper precompiles <torch/torch.h>; ccache caches sources compiled against
  // a precompiled header only with this sloppiness (ccache manual, "Precompiled headers").
  const std::vector<std::pair<std::string, std::string>> env = {
      {"CCACHE_BASEDIR", config.work_dir.string()},
      {"CCACHE_NOHASHDIR", "1"},
      {"CCACHE_SLOPPINESS", "pch_defines,time_macros"}};
  const std::filesystem::path tree = build_dir / kTree;

  ProcessSpec configure;
  configure.exe = config.cmake;
  configure.args = {"-S",
                    (build_dir / kSourceLink).string(),
                    "-B",
                    tree.string(),
                    "-G",
                    "Ninja",
                    "-DCMAKE_PREFIX_PATH=" + prefix_path,
                    "-DGatehouseWorker_DIR=" + config.sdk_dir.string(),
                    "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                    "-DTORCH_CUDA_ARCH_LIST=9.0"};
  configure.args.insert(configure.args.end(), request.recipe.cmake_args.begin(),
                        request.recipe.cmake_args.end());
  configure.cwd = request.checkout;
  configure.env = env;
  configure.merge_stderr = true;
  configure.log_flush_timeout = config.log_flush_timeout;

  ProcessSpec build;
  build.exe = config.cmake;
  build.args = {"--build", tree.string(), "--target", request.recipe.target};
  build.cwd = request.checkout;
  build.env = env;
  build.env.emplace_back("CCACHE_STATSLOG", (build_dir / kStatsLog).string());
  build.merge_stderr = true;
  build.log_flush_timeout = config.log_flush_timeout;
  return {configure, build};
}

Result<BuildResult> RunBuild(const BuildConfig& config, const BuildRequest& request,
                             const OutputHandler& log, CancelToken cancel) {
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 start);
  };
  const std::filesystem::path build_dir = BuildDir(config, request);
  GH_RETURN_IF_ERROR(DropOldLayout(build_dir, log));
  std::error_code ec;
  std::filesystem::create_directories(build_dir, ec);
  if (ec) return Status::Internal("cannot create " + build_dir.string() + ": " + ec.message());

  const bool python = request.recipe.lane == "python";
  if (python && config.python.empty()) {
    return Status::FailedPrecondition(
        "build failed: the recipe asks for lane \"python\" and this agent has no Python "
        "(--python)");
  }
  if (python) {
    // setuptools builds in the source tree (build/, *.egg-info): installing from a copy keeps
    // the checkout exactly the commit, which the worker's identity gate verifies.
    const std::filesystem::path copy = build_dir / "src";
    std::filesystem::remove_all(copy, ec);
    std::filesystem::create_directories(copy, ec);
    const std::filesystem::path source = SourceDir(request);
    for (const auto& entry : std::filesystem::directory_iterator(source, ec)) {
      if (entry.path().filename() == ".git") continue;
      std::filesystem::copy(entry.path(), copy / entry.path().filename(),
                            std::filesystem::copy_options::recursive |
                                std::filesystem::copy_options::copy_symlinks,
                            ec);
      if (ec) break;
    }
    if (ec) {
      return Status::FailedPrecondition("build failed: copying " + source.string() + " to " +
                                        copy.string() + ": " + ec.message());
    }
  } else {
    GH_RETURN_IF_ERROR(LinkSource(config, request, build_dir, log));
  }
  const std::vector<ProcessSpec> commands = BuildCommands(config, request);
  BuildResult result;
  result.build_dir = build_dir;
  if (python) {
    const std::filesystem::path report = build_dir / "adapter-report.json";
    std::filesystem::remove(report, ec);
    GH_RETURN_IF_ERROR(RunStep(commands[0], "pip metadata", config, log, cancel));
    GH_ASSIGN_OR_RETURN(const nlohmann::json adapter_report, ReadReport(report));
    GH_ASSIGN_OR_RETURN(const DependencyLayer layer,
                        MakeDependencyLayer(config, build_dir, adapter_report, log, cancel));
    GH_RETURN_IF_ERROR(RunStep(commands[1], "pip install", config, log, cancel));
    result.python_path.push_back(build_dir / "site");
    if (!layer.packages.empty()) result.python_path.push_back(layer.dir / "site");
    result.python_entries = request.recipe.entries;
    result.duration = elapsed();
    log(SummaryLine(result, /*python=*/true, ""));
    return result;
  }
  GH_RETURN_IF_ERROR(RunStep(commands[0], "cmake configure", config, log, cancel));
  // Only the build's compilations are counted: the log is removed first. ccache writes none when
  // it compiled nothing, and none when it did not run at all (a recipe may set
  // CMAKE_CXX_COMPILER_LAUNCHER otherwise; ccache before 4.4 has no stats log): Ninja's
  // "Building CXX object" lines tell those apart.
  const std::filesystem::path stats_log = build_dir / kStatsLog;
  std::filesystem::remove(stats_log, ec);
  bool compiled = false;
  const OutputHandler watch = [&](std::string_view data) {
    compiled = compiled || data.find("Building CXX object") != std::string_view::npos;
    log(data);
  };
  const Status built = RunStep(commands[1], "cmake --build", config, watch, cancel);
  result.duration = elapsed();
  std::string unreadable;
  if (!std::filesystem::exists(stats_log, ec) && compiled) {
    unreadable = "the build compiled sources but ccache wrote no statistics log " +
                 stats_log.string() + " (ccache 4.4 or later, as the compiler launcher, writes one)";
  } else {
    std::ifstream in(stats_log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Result<CcacheStats> stats = ParseCcacheStatsLog(text);
    if (stats.ok()) {
      result.ccache = std::move(stats).value();
    } else {
      unreadable = stats.status().message();
    }
  }
  log(SummaryLine(result, /*python=*/false, unreadable));
  GH_RETURN_IF_ERROR(built);
  for (const std::string& plugin : request.recipe.plugins) {
    const std::filesystem::path path = build_dir / kTree / plugin;
    if (!std::filesystem::is_regular_file(path, ec)) {
      return Status::FailedPrecondition("build failed: plugin '" + plugin + "' was not built (no " +
                                        path.string() + " after building target '" +
                                        request.recipe.target + "')");
    }
    result.plugins.push_back(path);
  }
  return result;
}

}  // namespace gatehouse::agent
