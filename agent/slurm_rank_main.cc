// gatehouse-slurm-rank: what every task of an attempt's Slurm step runs (docs/protocols.md
// §3.5). Sets torchrun's variables from Slurm's (TorchrunEnvironmentFromSlurm), says on
// standard error where this rank runs, and executes the worker command after `--`.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "agent/slurm.h"

int main(int argc, char** argv) {
  int first = 1;
  if (first < argc && std::string(argv[first]) == "--") ++first;
  if (first >= argc) {
    std::cerr << "usage: gatehouse-slurm-rank -- <worker> [args...]\n";
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
  std::cerr << "gatehouse-slurm-rank: slurm job " << (job ? job : "?") << " step "
            << (step ? step : "?") << " on " << host << ":" << where << std::endl;
  ::execvp(argv[first], argv + first);
  std::cerr << "gatehouse-slurm-rank: cannot run " << argv[first] << ": " << std::strerror(errno)
            << "\n";
  return 127;
}
