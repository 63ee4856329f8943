// Helpers for agent tests: temporary directories, files, and the git CLI (run as argv through
// the agent's own RunProcess; no shell).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/cleanup.h"
#include "agent/process.h"
#include "tests/common/temp_dir.h"

namespace gatehouse::agent::testing {

using gatehouse::test_util::TempDir;

inline void WriteFile(const std::filesystem::path& path, const std::string& text,
                      bool executable = false) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  ASSERT_TRUE(out) << "cannot write " << path;
  if (executable) ::chmod(path.c_str(), 0755);
}

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Runs `git <args>` in `dir` with a fixed identity; returns its stdout without the trailing
/// newline. Fails the test when git fails.
inline std::string Git(const std::filesystem::path& dir, std::initializer_list<std::string> args) {
  ProcessSpec spec;
  spec.exe = "git";
  spec.args = args;
  spec.cwd = dir;
  spec.env = {{"GIT_AUTHOR_NAME", "Test"},       {"GIT_AUTHOR_EMAIL", "test@example.com"},
              {"GIT_COMMITTER_NAME", "Test"},    {"GIT_COMMITTER_EMAIL", "test@example.com"},
              {"GIT_CONFIG_NOSYSTEM", "1"},      {"GIT_CONFIG_GLOBAL", "/dev/null"}};
  std::string out;
  std::string err;
  auto exit = RunProcess(
      spec, [&](std::string_view b) { out.append(b); }, [&](std::string_view b) { err.append(b); });
  EXPECT_TRUE(exit.ok()) << exit.status().ToString();
  if (exit.ok()) {
    std::string command = "git";
    for (const auto& a : args) command += " " + a;
    EXPECT_TRUE(exit->ok()) << command << " " << exit->Describe() << ": " << err;
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

/// `git init` of a repository on branch main at `dir`.
inline void GitInit(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  Git(dir, {"init", "-q", "-b", "main"});
}

/// Writes `files` (path -> text), commits everything and returns the commit SHA.
inline std::string CommitFiles(const std::filesystem::path& repo,
                               const std::vector<std::pair<std::string, std::string>>& files,
                               const std::string& message) {
  for (const auto& [name, text] : files) WriteFile(repo / name, text);
  Git(repo, {"add", "-A"});
  Git(repo, {"commit", "-q", "-m", message});
  return Git(repo, {"rev-parse", "HEAD"});
}

/// A `sleep 60` whose working directory is `dir` (a process an attempt left behind); killed and
/// reaped by End() or the destructor.
class Leftover {
 public:
  explicit Leftover(const std::filesystem::path& dir) {
    pid_ = ::fork();
    if (pid_ == 0) {
      if (::chdir(dir.c_str()) != 0) ::_exit(127);
      ::execlp("sleep", "sleep", "60", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Wait until the child has changed directory and exec'd.
    for (int i = 0; i < 200 && ProcessesUnder(dir).empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~Leftover() { End(); }
  void End() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = 0;
};

}  // namespace gatehouse::agent::testing
