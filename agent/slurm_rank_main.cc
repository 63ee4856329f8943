// gatehouse-slurm-rank: what every task of an attempt's Slurm step runs (docs/protocols.md
// §3.5). Sets torchrun's variables from Slurm's (TorchrunEnvironmentFromSlurm), says on
// standard error where this rank runs, and executes the worker command after `--` (with
// --sandboxed, a bwrap command given this node's devices and the job's /dev/shm here, less the
// covers of paths this node does not have: PrepareSlurmTaskCommand).
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "agent/sandbox.h"
#include "agent/slurm.h"

int main(int argc, char** argv) {
  int first = 1;
  // --sandboxed: the command is bwrap's (agent/sandbox.h), completed for this node.
  bool sandboxed = false;
  if (first < argc && std::string(argv[first]) == "--sandboxed") {
    sandboxed = true;
    ++first;
  }
  if (first < argc && std::string(argv[first]) == "--") ++first;
  if (first >= argc) {
    std::cerr << "usage: gatehouse-slurm-rank [--sandboxed] -- <worker> [args...]\n";
    return 2;
  }
  auto env = gatehouse::agent::TorchrunEnvironmentFromSlurm(
      [](const char* name) { return std::getenv(name); });
  if (!env.ok()) {
    std::cerr << "gatehouse-slurm-rank: " << env.status().message() << "\n";
    return 2;
  }
  std::string where;
  for (const auto& [name, value] : *env) {
    ::setenv(name.c_str(), value.c_str(), 1);
    where += " " + name + "=" + value;
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* step = std::getenv("SLURM_STEP_ID");
  // Slurm's node name first: the node a rank ran on, even where several share one host.
  const char* node = std::getenv("SLURMD_NODENAME");
  const std::string on = node == nullptr || *node == '\0' || std::string(node) == host
                             ? std::string(host)
                             : std::string(node) + " (host " + host + ")";
  std::cerr << "gatehouse-slurm-rank: slurm job " << (job ? job : "?") << " step "
            << (step ? step : "?") << " on " << on << ":" << where << std::endl;
  std::vector<std::string> command(argv + first, argv + argc);
  if (sandboxed) {
    // This node's devices and the job's /dev/shm here (the tasks of the job on this node meet
    // there, no other job's segments are visible).
    auto shm = gatehouse::agent::OpenSlurmJobShm("/dev/shm", job ? job : "");
    if (!shm.ok()) {
      std::cerr << "gatehouse-slurm-rank: " << shm.status().message() << "\n";
      return 2;
    }
    command = gatehouse::agent::PrepareSlurmTaskCommand(
        std::move(command),
        [](const std::string& path) {
          std::error_code ec;
          return std::filesystem::exists(std::filesystem::symlink_status(path, ec));
        },
        gatehouse::agent::AcceleratorDevices(), *shm);
  }
  std::vector<char*> cargv;
  for (std::string& a : command) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  ::execvp(cargv[0], cargv.data());
  std::cerr << "gatehouse-slurm-rank: cannot run " << command[0] << ": " << std::strerror(errno)
            << "\n";
  return 127;
}
