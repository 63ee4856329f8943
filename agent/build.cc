// Build step: cmake configure + build as argv (docs/protocols.md §5).
#include "agent/build.h"

#include <algorithm>
#include <cctype>
#include <fstream>
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

// A build tree configured for another source dir (the recipe's source_dir changed between
// commits) makes cmake refuse; start that tree afresh.
void DropStaleBuildTree(const std::filesystem::path& build_dir, const std::filesystem::path& source) {
  std::ifstream cache(build_dir / "CMakeCache.txt");
  if (!cache) return;
  const std::string key = "CMAKE_HOME_DIRECTORY:INTERNAL=";
  std::string line;
  while (std::getline(cache, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::error_code ec;
    const auto cached = std::filesystem::weakly_canonical(line.substr(key.size()), ec);
    if (cached != std::filesystem::weakly_canonical(source, ec)) {
      cache.close();
      std::filesystem::remove_all(build_dir, ec);
    }
    return;
  }
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
  const std::filesystem::path source = request.checkout / request.recipe.source_dir;
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
  // CCACHE_BASEDIR at the work dir holds both the checkout (<work>/repos/<key>) and the build
  // tree (<work>/build/<key>), so ccache hashes both as paths relative to the build tree: the
  // same sources hit on every agent and in every work dir, the precompiled header included.
  // The SDK's plugin helper precompiles <torch/torch.h>; ccache caches sources compiled against
  // a precompiled header only with this sloppiness (ccache manual, "Precompiled headers").
  const std::vector<std::pair<std::string, std::string>> env = {
      {"CCACHE_BASEDIR", config.work_dir.string()},
      {"CCACHE_NOHASHDIR", "1"},
      {"CCACHE_SLOPPINESS", "pch_defines,time_macros"}};

  ProcessSpec configure;
  configure.exe = config.cmake;
  configure.args = {"-S",
                    source.lexically_normal().string(),
                    "-B",
                    build_dir.string(),
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
  build.args = {"--build", build_dir.string(), "--target", request.recipe.target};
  build.cwd = request.checkout;
  build.env = env;
  build.merge_stderr = true;
  build.log_flush_timeout = config.log_flush_timeout;
  return {configure, build};
}

Result<BuildResult> RunBuild(const BuildConfig& config, const BuildRequest& request,
                             const OutputHandler& log, CancelToken cancel) {
  const std::filesystem::path build_dir = BuildDir(config, request);
  DropStaleBuildTree(build_dir, request.checkout / request.recipe.source_dir);
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
    const std::filesystem::path source = request.checkout / request.recipe.source_dir;
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
    return result;
  }
  GH_RETURN_IF_ERROR(RunStep(commands[0], "cmake configure", config, log, cancel));
  GH_RETURN_IF_ERROR(RunStep(commands[1], "cmake --build", config, log, cancel));
  for (const std::string& plugin : request.recipe.plugins) {
    const std::filesystem::path path = build_dir / plugin;
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
