// Tests of the build step with a tiny torch-free CMake project in a temporary directory.
#include "agent/build.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

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
  const auto build_dir = (config_.work_dir / "build" / "0123456789abcdef").string();
  EXPECT_EQ(commands[0].exe, "cmake");
  EXPECT_EQ(commands[0].args,
            (std::vector<std::string>{
                "-S", (checkout_ / "plugin").string(), "-B", build_dir, "-G", "Ninja",
                "-DCMAKE_PREFIX_PATH=" + config_.sdk_dir.string() + ";/opt/libtorch/share/cmake",
                "-DGatehouseWorker_DIR=" + config_.sdk_dir.string(),
                "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DTORCH_CUDA_ARCH_LIST=9.0",
                "-DCMAKE_BUILD_TYPE=Release"}));
  EXPECT_EQ(commands[1].args,
            (std::vector<std::string>{"--build", build_dir, "--target", "tiny_plugin"}));
  for (const auto& command : commands) {
    EXPECT_TRUE(command.merge_stderr);
    EXPECT_EQ(command.env, (std::vector<std::pair<std::string, std::string>>{
                               {"CCACHE_BASEDIR", config_.work_dir.string()},
                               {"CCACHE_NOHASHDIR", "1"},
                               {"CCACHE_SLOPPINESS", "pch_defines,time_macros"}}));
  }
}

// Verifies a successful build: the plugin path is absolute and exists, and the log shows both
// commands and cmake's own output.
TEST_F(BuildTest, BuildsTrivialSharedLibrary) {
  auto built = Build();
  ASSERT_TRUE(built.ok()) << built.status().ToString() << "\n" << log_;
  ASSERT_EQ(built->plugins.size(), 1u);
  EXPECT_TRUE(built->plugins[0].is_absolute());
  EXPECT_TRUE(std::filesystem::is_regular_file(built->plugins[0]));
  EXPECT_EQ(built->plugins[0].filename(), "libtiny_plugin.so");
  EXPECT_NE(log_.find("+ cmake -S"), std::string::npos) << log_;
  EXPECT_NE(log_.find("+ cmake --build"), std::string::npos) << log_;
  EXPECT_NE(log_.find("Build files have been written"), std::string::npos) << log_;

  // A second build of the same tree is incremental and still succeeds.
  auto again = Build();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
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
