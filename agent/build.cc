// Build step: cmake configure + build as argv (docs/protocols.md §5).
#include "agent/build.h"

#include <fstream>

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

}  // namespace

std::vector<ProcessSpec> BuildCommands(const BuildConfig& config, const BuildRequest& request) {
  const std::filesystem::path source = request.checkout / request.recipe.source_dir;
  const std::filesystem::path build_dir = BuildDir(config, request);
  if (request.recipe.lane == "python") {
    ProcessSpec install;
    install.exe = config.python;
    install.args = {"-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-input",
                    "--disable-pip-version-check", "--upgrade", "--target",
                    (build_dir / "site").string(), (build_dir / "src").string()};
    install.cwd = request.checkout;
    install.merge_stderr = true;
    install.log_flush_timeout = config.log_flush_timeout;
    return {install};
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
  const char* const cmake_steps[] = {"cmake configure", "cmake --build"};
  const char* const pip_steps[] = {"pip install"};
  const char* const* step_names = python ? pip_steps : cmake_steps;
  for (size_t i = 0; i < commands.size(); ++i) {
    OutputTail tail;
    const OutputHandler tee = [&](std::string_view data) {
      tail.Append(data);
      log(data);
    };
    tee(CommandLine(commands[i]));
    GH_ASSIGN_OR_RETURN(const ProcessExit exit, RunProcess(commands[i], tee, tee, cancel));
    if (exit.output_cut) {
      log("\n[gatehouse-agent] log flush timed out: processes " + std::string(step_names[i]) +
          " left still held its output " + std::to_string(config.log_flush_timeout.count()) +
          " ms after it exited (--log-flush-timeout-ms); they were killed\n");
    }
    if (!exit.ok()) {
      return Status::FailedPrecondition("build failed: " + std::string(step_names[i]) + " " +
                                        exit.Describe() + ":\n" + tail.LastLines());
    }
  }

  BuildResult result;
  result.build_dir = build_dir;
  if (python) {
    result.python_path = build_dir / "site";
    result.python_entries = request.recipe.entries;
    return result;
  }
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
