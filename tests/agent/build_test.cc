// Tests of the build step with a tiny torch-free CMake project in a temporary directory.
#include "agent/build.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>

#include "agent_test_util.h"

namespace gatehouse::agent {
namespace {

using testing::TempDir;
using testing::WriteFile;

class BuildTest : public ::testing::Test {
 protected:
  void SetUp() override {
    checkout_ = tmp_.path() / "checkout";
    WriteFile(checkout_ / "plugin" / "CMakeLists.txt",
              "cmake_minimum_required(VERSION 3.25)\n"
              "project(tiny LANGUAGES CXX)\n"
              "add_library(tiny_plugin SHARED plugin.cc)\n");
    WriteFile(checkout_ / "plugin" / "plugin.cc", "extern \"C\" int tiny_plugin() { return 42; }\n");
    std::filesystem::create_directories(tmp_.path() / "sdk");
    config_.work_dir = tmp_.path() / "work";
    config_.sdk_dir = tmp_.path() / "sdk";
    config_.cmake_prefix_path = "/opt/libtorch/share/cmake";
    request_.checkout = checkout_;
    request_.repo_key = "0123456789abcdef";
    request_.recipe.source_dir = "plugin";
    request_.recipe.cmake_args = {"-DCMAKE_BUILD_TYPE=Release"};
    request_.recipe.target = "tiny_plugin";
    request_.recipe.plugins = {"libtiny_plugin.so"};
  }

  Result<BuildResult> Build() {
    log_.clear();
    return RunBuild(config_, request_, [this](std::string_view bytes) { log_.append(bytes); });
  }

  TempDir tmp_;
  std::filesystem::path checkout_;
  BuildConfig config_;
  BuildRequest request_;
  std::string log_;
};

// Verifies the exact configure and build argv and the ccache environment (docs/protocols.md §5).
TEST_F(BuildTest, CommandsFollowTheRecipe) {
  const auto commands = BuildCommands(config_, request_);
  ASSERT_EQ(commands.size(), 2u);
  const auto build_dir = config_.work_dir / "build" / "0123456789abcdef";
  EXPECT_EQ(commands[0].exe, "cmake");
  EXPECT_EQ(commands[0].args,
            (std::vector<std::string>{
                "-S", (build_dir / "source").string(), "-B", (build_dir / "tree").string(),
                "-G", "Ninja",
                "-DCMAKE_PREFIX_PATH=" + config_.sdk_dir.string() + ";/opt/libtorch/share/cmake",
                "-DGatehouseWorker_DIR=" + config_.sdk_dir.string(),
                "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DTORCH_CUDA_ARCH_LIST=9.0",
                "-DCMAKE_BUILD_TYPE=Release"}));
  EXPECT_EQ(commands[1].args, (std::vector<std::string>{"--build", (build_dir / "tree").string(),
                                                        "--target", "tiny_plugin"}));
  std::vector<std::pair<std::string, std::string>> env = {
      {"CCACHE_BASEDIR", config_.work_dir.string()},
      {"CCACHE_NOHASHDIR", "1"},
      {"CCACHE_SLOPPINESS", "pch_defines,time_macros"}};
  EXPECT_TRUE(commands[0].merge_stderr);
  EXPECT_EQ(commands[0].env, env);
  env.emplace_back("CCACHE_STATSLOG", (build_dir / "ccache-stats.log").string());
  EXPECT_TRUE(commands[1].merge_stderr);
  EXPECT_EQ(commands[1].env, env);
}

// Verifies a successful build: the plugin path is absolute and exists, and the log shows both
// commands and cmake's own output, then the build's ccache figures and time.
TEST_F(BuildTest, BuildsTrivialSharedLibrary) {
  auto built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  ASSERT_EQ(built->plugins.size(), 1u);
  EXPECT_TRUE(built->plugins[0].is_absolute());
  EXPECT_TRUE(std::filesystem::is_regular_file(built->plugins[0]));
  EXPECT_EQ(built->plugins[0], built->build_dir / "tree" / "libtiny_plugin.so");
  EXPECT_NE(log_.find("+ cmake -S"), std::string::npos) << log_;
  EXPECT_NE(log_.find("+ cmake --build"), std::string::npos) << log_;
  EXPECT_NE(log_.find("Build files have been written"), std::string::npos) << log_;
  // The checkout is outside the work dir (as a `gatehouse run` tree): linked absolutely.
  EXPECT_EQ(std::filesystem::read_symlink(built->build_dir / "source"), checkout_ / "plugin");
  ASSERT_TRUE(built->ccache.has_value()) << log_;
  EXPECT_EQ(built->ccache->compilations, 1) << log_;
  EXPECT_NE(log_.find(" of 1 compilations from the cache ("), std::string::npos) << log_;
  EXPECT_EQ(BuildEvidence(*built),
            "duration_ms=" + std::to_string(built->duration.count()) +
                " compilations=1 cache_hits=" + std::to_string(built->ccache->hits()));

  // A second build of the same tree is incremental and still succeeds, compiling nothing.
  auto again = Build();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(again->ccache.has_value()) << log_;
  EXPECT_EQ(again->ccache->compilations, 0) << log_;
  EXPECT_NE(log_.find("[gatehouse-agent] ccache: no compilation recorded; build "),
            std::string::npos)
      << log_;
}

// Verifies that a build compiling without ccache (the recipe's cmake_args come last and may
// drop the launcher) gets no ccache figures rather than a count of zero.
TEST_F(BuildTest, ABuildWithoutCcacheHasNoCcacheFigures) {
  request_.recipe.cmake_args.push_back("-DCMAKE_CXX_COMPILER_LAUNCHER=");
  auto built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  EXPECT_FALSE(built->ccache.has_value()) << log_;
  EXPECT_NE(log_.find("[gatehouse-agent] ccache: no figures (the build compiled sources but "
                      "ccache wrote no statistics log "),
            std::string::npos)
      << log_;
  EXPECT_EQ(BuildEvidence(*built), "duration_ms=" + std::to_string(built->duration.count()));
}

// Verifies that a build dir of the earlier layout (the CMake tree in build/<key> itself) is
// removed rather than left to confuse the new one.
TEST_F(BuildTest, AnEarlierLayoutsBuildDirIsReplaced) {
  const auto build_dir = config_.work_dir / "build" / request_.repo_key;
  WriteFile(build_dir / "CMakeCache.txt", "CMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere\n");
  WriteFile(build_dir / "CMakeFiles" / "stale.txt", "old\n");
  auto built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  EXPECT_NE(log_.find("holds a build tree of an earlier layout: removed"), std::string::npos)
      << log_;
  EXPECT_FALSE(std::filesystem::exists(build_dir / "CMakeCache.txt"));
  EXPECT_FALSE(std::filesystem::exists(build_dir / "CMakeFiles"));
  EXPECT_TRUE(std::filesystem::exists(build_dir / "tree" / "CMakeCache.txt"));
}

// Verifies that a compile error ends in "build failed" with the compiler's message in the reason.
TEST_F(BuildTest, CompileErrorReportsBuildFailed) {
  WriteFile(checkout_ / "plugin" / "plugin.cc", "int broken( { return; }\n");
  auto built = Build();
  ASSERT_FALSE(built.ok());
  const std::string message = built.status().message();
  EXPECT_EQ(message.rfind("build failed: cmake --build exited with code", 0), 0u) << message;
  EXPECT_NE(message.find("plugin.cc"), std::string::npos) << message;
  EXPECT_NE(log_.find("error"), std::string::npos);
}

// Verifies that a configure error ends in "build failed" naming the configure step.
TEST_F(BuildTest, ConfigureErrorReportsBuildFailed) {
  WriteFile(checkout_ / "plugin" / "CMakeLists.txt",
            "cmake_minimum_required(VERSION 3.25)\nproject(tiny NONE)\n"
            "message(FATAL_ERROR \"recipe project refuses\")\n");
  auto built = Build();
  ASSERT_FALSE(built.ok());
  const std::string message = built.status().message();
  EXPECT_EQ(message.rfind("build failed: cmake configure exited with code 1", 0), 0u) << message;
  EXPECT_NE(message.find("recipe project refuses"), std::string::npos) << message;
}

// Verifies that a plugin the recipe names but the build does not produce is reported.
TEST_F(BuildTest, MissingPluginReported) {
  request_.recipe.plugins = {"libnot_built.so"};
  auto built = Build();
  ASSERT_FALSE(built.ok());
  EXPECT_NE(built.status().message().find("plugin 'libnot_built.so' was not built"),
            std::string::npos)
      << built.status().message();
}

// Verifies that a build tree configured from another source dir is started afresh instead of
// making cmake refuse the mismatch.
TEST_F(BuildTest, SourceDirChangeRebuildsTree) {
  ASSERT_TRUE(Build().ok()) << log_;
  WriteFile(checkout_ / "other" / "CMakeLists.txt",
            "cmake_minimum_required(VERSION 3.25)\nproject(tiny LANGUAGES CXX)\n"
            "add_library(tiny_plugin SHARED plugin.cc)\n");
  WriteFile(checkout_ / "other" / "plugin.cc", "extern \"C\" int tiny_plugin() { return 7; }\n");
  request_.recipe.source_dir = "other";
  auto built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  EXPECT_NE(log_.find("was configured for " + (checkout_ / "plugin").string() +
                      ": starting it afresh"),
            std::string::npos)
      << log_;
  EXPECT_EQ(std::filesystem::read_symlink(built->build_dir / "source"), checkout_ / "other");
}

// ccache's statistics log as ccache 4.7 writes it (a record per invocation, counters sorted).
TEST(CcacheStatsLogTest, CountsHitsMissesAndWhatWasNotCached) {
  auto stats = ParseCcacheStatsLog(
      "# ../source/a.cc\n"
      "cache_miss\ndirect_cache_miss\nlocal_storage_miss\nlocal_storage_write\n"
      "preprocessed_cache_miss\n"
      "# ../source/b.cc\n"
      "direct_cache_hit\nlocal_storage_hit\nlocal_storage_read_hit\n"
      "\n"
      "# ../source/c.cc\r\n"
      "preprocessed_cache_hit\r\n"
      "# ../source/d.cc\n"
      "could_not_use_precompiled_header\n"
      "# ../source/e.cc\n");
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->compilations, 5);
  EXPECT_EQ(stats->direct_hits, 1);
  EXPECT_EQ(stats->preprocessed_hits, 1);
  EXPECT_EQ(stats->misses, 1);
  EXPECT_EQ(stats->hits(), 2);
  EXPECT_EQ(stats->compiled(), 3);
  EXPECT_EQ(stats->uncached, (std::map<std::string, int64_t>{
                                 {"could_not_use_precompiled_header", 1}, {"no counter", 1}}));
  auto empty = ParseCcacheStatsLog("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->compilations, 0);
}

TEST(CcacheStatsLogTest, RefusesWhatCcacheDoesNotWrite) {
  auto orphan = ParseCcacheStatsLog("\ndirect_cache_hit\n# a.cc\n");
  ASSERT_FALSE(orphan.ok());
  EXPECT_EQ(orphan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(orphan.status().message(),
            "ccache stats log line 2: counter 'direct_cache_hit' before any '# <input file>' line");
  auto garbage = ParseCcacheStatsLog("# a.cc\nDirect cache hit\n");
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().message(),
            "ccache stats log line 2: 'Direct cache hit' is not a counter name");
}

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "";
  while (!dirs.empty()) {
    const size_t colon = dirs.find(':');
    const std::filesystem::path dir(std::string(dirs.substr(0, colon)));
    dirs.remove_prefix(colon == std::string_view::npos ? dirs.size() : colon + 1);
    if (!dir.empty() && ::access((dir / program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

// Issue 38: byte-identical sources built for another repository (another key), in another work
// dir, or from a tree outside the work dir (`gatehouse run`) take every object from the cache
// the first build filled: the compile lines name ../source/... from every build tree.
TEST_F(BuildTest, IdenticalSourcesHitTheCacheForAnyRepositoryAndWorkDir) {
  for (const char* tool : {"ccache", "ninja"}) {
    if (!OnPath(tool)) GTEST_SKIP() << tool << " is not installed here: no ccache to measure";
  }
  // One cache of the test's own, restored however the test ends.
  struct CacheDir {
    std::optional<std::string> previous;
    explicit CacheDir(const std::filesystem::path& dir) {
      if (const char* kept = std::getenv("CCACHE_DIR")) previous = kept;
      setenv("CCACHE_DIR", dir.c_str(), 1);
    }
    ~CacheDir() {
      if (previous) {
        setenv("CCACHE_DIR", previous->c_str(), 1);
      } else {
        unsetenv("CCACHE_DIR");
      }
    }
  } cache_dir(tmp_.path() / "ccache");
  const auto write_project = [](const std::filesystem::path& root) {
    WriteFile(root / "gh" / "CMakeLists.txt",
              "cmake_minimum_required(VERSION 3.25)\nproject(tiny LANGUAGES CXX)\n"
              "add_library(tiny_plugin SHARED a.cc b.cc c.cc)\n"
              "target_include_directories(tiny_plugin PRIVATE include)\n");
    WriteFile(root / "gh" / "include" / "tiny.h", "int tiny_value();\n");
    WriteFile(root / "gh" / "a.cc", "#include \"tiny.h\"\nint tiny_value() { return 42; }\n");
    WriteFile(root / "gh" / "b.cc",
              "#include \"tiny.h\"\nextern \"C\" int tiny_plugin() { return tiny_value(); }\n");
    WriteFile(root / "gh" / "c.cc",
              "#include \"tiny.h\"\nconst char* tiny_file() { return __FILE__; }\n");
  };
  struct Case {
    std::string name;
    std::filesystem::path work_dir, checkout;
    std::string key;
  };
  const auto root = tmp_.path();
  const std::vector<Case> cases = {
      {"first repository", root / "work-a", root / "work-a" / "repos" / "1111111111111111",
       "1111111111111111"},
      {"another repository, same work dir", root / "work-a",
       root / "work-a" / "repos" / "2222222222222222", "2222222222222222"},
      {"another work dir", root / "other" / "work-b",
       root / "other" / "work-b" / "repos" / "3333333333333333", "3333333333333333"},
      {"a local tree outside the work dir", root / "work-c", root / "my-adapter",
       "4444444444444444"}};
  request_.recipe.source_dir = "gh";
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.name);
    write_project(c.checkout);
    config_.work_dir = c.work_dir;
    request_.checkout = c.checkout;
    request_.repo_key = c.key;
    auto built = Build();
    ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
    const auto link = std::filesystem::read_symlink(built->build_dir / "source");
    EXPECT_EQ(link.is_relative(), i < 3) << link;  // relative inside the work dir
    ASSERT_TRUE(built->ccache.has_value()) << log_;
    EXPECT_EQ(built->ccache->compilations, 3) << log_;
    EXPECT_EQ(built->ccache->hits(), i == 0 ? 0 : 3) << log_;
    if (i > 0) {
      EXPECT_NE(log_.find("ccache: 3 of 3 compilations from the cache (100%), 0 compiled; build "),
                std::string::npos)
          << log_;
    }
    std::printf("[ measure  ] %s: %lld of %lld from the cache, build %lld ms\n", c.name.c_str(),
                static_cast<long long>(built->ccache->hits()),
                static_cast<long long>(built->ccache->compilations),
                static_cast<long long>(built->duration.count()));
  }
}


// The Python lane: one pip command on the node's Python (docs/protocols.md §5), installing the
// repository into <build dir>/site, which the worker gets as --python-path with the entries.
class PipBuildTest : public BuildTest {
 protected:
  void SetUp() override {
    BuildTest::SetUp();
    WriteFile(checkout_ / "py" / "pyproject.toml",
              "[build-system]\nrequires = [\"setuptools>=61\"]\n"
              "build-backend = \"setuptools.build_meta\"\n"
              "[project]\nname = \"tiny-adapter\"\nversion = \"0.1\"\n"
              "[tool.setuptools.packages.find]\nwhere = [\".\"]\ninclude = [\"tiny*\"]\n");
    WriteFile(checkout_ / "py" / "tiny" / "__init__.py", "SPEC = 'tiny'\n");
    config_.python = GATEHOUSE_PYTHON;
    request_.recipe = Recipe{};
    request_.recipe.lane = "python";
    request_.recipe.build_system = "pip";
    request_.recipe.source_dir = "py";
    request_.recipe.entries = {"tiny:SPEC"};
  }
};

TEST_F(PipBuildTest, CommandsAreMetadataThenInstall) {
  const auto commands = BuildCommands(config_, request_);
  ASSERT_EQ(commands.size(), 2u);
  const auto build_dir = config_.work_dir / "build" / "0123456789abcdef";
  EXPECT_EQ(commands[0].exe, GATEHOUSE_PYTHON);
  EXPECT_EQ(commands[0].args,
            (std::vector<std::string>{"-m", "pip", "install", "--dry-run", "--no-deps",
                                      "--no-build-isolation", "--no-input",
                                      "--disable-pip-version-check", "--quiet", "--report",
                                      (build_dir / "adapter-report.json").string(),
                                      (build_dir / "src").string()}));
  EXPECT_EQ(commands[1].exe, GATEHOUSE_PYTHON);
  EXPECT_EQ(commands[1].args,
            (std::vector<std::string>{"-m", "pip", "install", "--no-deps", "--no-build-isolation",
                                      "--no-input", "--disable-pip-version-check", "--upgrade",
                                      "--target", (build_dir / "site").string(),
                                      (build_dir / "src").string()}));
}

TEST_F(PipBuildTest, InstallsThePackageForTheWorker) {
  auto built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  ASSERT_EQ(built->python_path.size(), 1u) << log_;  // no dependency declared: no layer
  EXPECT_TRUE(std::filesystem::is_regular_file(built->python_path[0] / "tiny" / "__init__.py"))
      << log_;
  EXPECT_NE(log_.find("the adapter declares no dependency to install"), std::string::npos) << log_;
  EXPECT_EQ(built->python_entries, (std::vector<std::string>{"tiny:SPEC"}));
  EXPECT_TRUE(built->plugins.empty());
  // Built from a copy: the checkout holds only what was written into it.
  EXPECT_FALSE(std::filesystem::exists(checkout_ / "py" / "build")) << log_;
  EXPECT_FALSE(std::filesystem::exists(checkout_ / "py" / "tiny_adapter.egg-info")) << log_;
  EXPECT_NE(log_.find("+ " + std::string(GATEHOUSE_PYTHON) + " -m pip install"), std::string::npos)
      << log_;
  // pip's build goes through no ccache: the build's time, and no ccache figure.
  EXPECT_FALSE(built->ccache.has_value());
  EXPECT_NE(log_.find(" s (lane python: no ccache figures)\n"), std::string::npos) << log_;
  EXPECT_EQ(BuildEvidence(*built), "duration_ms=" + std::to_string(built->duration.count()));
  // Again at another commit: the same tree, the package replaced.
  WriteFile(checkout_ / "py" / "tiny" / "__init__.py", "SPEC = 'tiny, again'\n");
  built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  std::ifstream in(built->python_path[0] / "tiny" / "__init__.py");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "SPEC = 'tiny, again'\n");
}

TEST_F(PipBuildTest, FailedInstallIsABuildError) {
  WriteFile(checkout_ / "py" / "pyproject.toml", "[project\nname = broken\n");
  auto built = Build();
  ASSERT_FALSE(built.ok());
  EXPECT_EQ(built.status().message().rfind("build failed: pip metadata exited with code", 0), 0u)
      << built.status().message();
  config_.python.clear();
  built = Build();
  ASSERT_FALSE(built.ok());
  EXPECT_NE(built.status().message().find("no Python (--python)"), std::string::npos)
      << built.status().message();
}

// Dependencies the adapter declares: those the node's environment lacks go into a layer made
// once per (interpreter, requirements) and reused by later commits; those it has (here
// setuptools) are left to it. Packages come from a local wheelhouse (PIP_NO_INDEX), as a node
// with its own index would configure pip.
class PipDependencyTest : public PipBuildTest {
 protected:
  void SetUp() override {
    PipBuildTest::SetUp();
    const std::filesystem::path dep = tmp_.path() / "dep-src";
    WriteFile(dep / "pyproject.toml",
              "[build-system]\nrequires = [\"setuptools>=61\"]\n"
              "build-backend = \"setuptools.build_meta\"\n"
              "[project]\nname = \"ghdep-fixture\"\nversion = \"1.2\"\n"
              "[tool.setuptools.packages.find]\nwhere = [\".\"]\ninclude = [\"ghdep_fixture*\"]\n");
    WriteFile(dep / "ghdep_fixture" / "__init__.py", "VALUE = 12\n");
    wheelhouse_ = tmp_.path() / "wheelhouse";
    ProcessSpec wheel;
    wheel.exe = GATEHOUSE_PYTHON;
    wheel.args = {"-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                  "--disable-pip-version-check", "--quiet", "-w", wheelhouse_.string(),
                  dep.string()};
    wheel.merge_stderr = true;
    std::string out;
    const OutputHandler keep = [&](std::string_view d) { out.append(d); };
    auto exit = RunProcess(wheel, keep, keep);
    ASSERT_TRUE(exit.ok() && exit->ok()) << out;
    setenv("PIP_NO_INDEX", "1", 1);
    setenv("PIP_FIND_LINKS", wheelhouse_.string().c_str(), 1);
    Declare("\"ghdep-fixture>=1.0\", \"setuptools\"");
  }
  void TearDown() override {
    unsetenv("PIP_NO_INDEX");
    unsetenv("PIP_FIND_LINKS");
  }
  void Declare(const std::string& dependencies) {
    WriteFile(checkout_ / "py" / "pyproject.toml",
              "[build-system]\nrequires = [\"setuptools>=61\"]\n"
              "build-backend = \"setuptools.build_meta\"\n"
              "[project]\nname = \"tiny-adapter\"\nversion = \"0.1\"\n"
              "dependencies = [" + dependencies + "]\n"
              "[tool.setuptools.packages.find]\nwhere = [\".\"]\ninclude = [\"tiny*\"]\n");
  }
  std::filesystem::path wheelhouse_;
};

TEST_F(PipDependencyTest, LayerMadeOnceAndReusedWhileRequirementsStay) {
  auto built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  ASSERT_EQ(built->python_path.size(), 2u) << log_;
  const std::filesystem::path layer_site = built->python_path[1];
  EXPECT_EQ(layer_site.parent_path().parent_path(), config_.work_dir / "python-deps");
  EXPECT_TRUE(std::filesystem::is_regular_file(layer_site / "ghdep_fixture" / "__init__.py"))
      << log_;
  // What the node has stays the node's: the layer holds the missing package alone.
  EXPECT_FALSE(std::filesystem::exists(layer_site / "setuptools")) << log_;
  EXPECT_NE(log_.find("made (ghdep-fixture>=1.0 setuptools): ghdep-fixture==1.2"),
            std::string::npos)
      << log_;
  EXPECT_NE(log_.find("--target " + layer_site.parent_path().parent_path().string() +
                      "/.staging-"),
            std::string::npos)
      << log_;

  // Another commit, same requirements: nothing resolved or installed but the adapter.
  WriteFile(checkout_ / "py" / "tiny" / "__init__.py", "SPEC = 'tiny, again'\n");
  built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  ASSERT_EQ(built->python_path.size(), 2u) << log_;
  EXPECT_EQ(built->python_path[1], layer_site);
  EXPECT_NE(log_.find("reused (ghdep-fixture>=1.0 setuptools): ghdep-fixture==1.2"),
            std::string::npos)
      << log_;
  EXPECT_EQ(log_.find("--dry-run --no-input"), std::string::npos) << log_;
  EXPECT_EQ(log_.find("pip install --no-deps --no-input"), std::string::npos) << log_;

  // Requirements changed: another layer.
  Declare("\"ghdep-fixture>=1.1\"");
  built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  ASSERT_EQ(built->python_path.size(), 2u) << log_;
  EXPECT_NE(built->python_path[1], layer_site);
  EXPECT_NE(log_.find("made (ghdep-fixture>=1.1): ghdep-fixture==1.2"), std::string::npos)
      << log_;
}

TEST_F(PipDependencyTest, SatisfiedByTheNodeNeedsNoLayer) {
  Declare("\"setuptools\"");
  auto built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  EXPECT_EQ(built->python_path.size(), 1u) << log_;
  EXPECT_NE(log_.find("the node's environment satisfies them"), std::string::npos) << log_;
  EXPECT_EQ(log_.find("pip install --no-deps --no-input"), std::string::npos) << log_;
}

// The contract package comes with the worker: declaring it (as an adapter developed against
// python/gatehouse_adapter naturally does) installs nothing and resolves nothing for it.
TEST_F(PipDependencyTest, TheContractPackageIsTheWorkers) {
  Declare("\"Gatehouse_Adapter>=1\"");  // pip reports it as Gatehouse-Adapter>=1
  auto built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  EXPECT_EQ(built->python_path.size(), 1u) << log_;
  EXPECT_NE(log_.find("Adapter>=1: provided by the worker"), std::string::npos) << log_;
  EXPECT_NE(log_.find("the adapter declares no dependency to install"), std::string::npos) << log_;
}

TEST_F(PipDependencyTest, UnresolvableRequirementIsABuildError) {
  Declare("\"ghdep-fixture>=9\"");
  auto built = Build();
  ASSERT_FALSE(built.ok());
  EXPECT_EQ(built.status().message().rfind("build failed: pip resolve exited with code", 0), 0u)
      << built.status().message();
  // Nothing half made is left to be reused.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(config_.work_dir / "python-deps", ec)) {
    ADD_FAILURE() << "left behind: " << entry.path();
  }
}

}  // namespace
}  // namespace gatehouse::agent
