// gatehouse-agent: runs validation attempts on this machine for a Gatehouse controller.
//
//   gatehouse-agent --controller 127.0.0.1:50051 --sdk-dir build/sdk
//       --cmake-prefix-path "$(python -c 'import torch;print(torch.utils.cmake_prefix_path)')"
//       --worker build/bin/gatehouse-worker --torch-version 2.11.0
//
// Logs go to standard error; standard output gets one line per registration,
// "gatehouse-agent: registered as <id>", which scripts and tests wait for.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "agent/agent_client.h"
#include "agent/attempt_runner.h"
#include "agent/capabilities.h"

namespace {

namespace fs = std::filesystem;
using gatehouse::agent::AgentClient;
using gatehouse::agent::AgentClientConfig;
using gatehouse::agent::AttemptRunner;
using gatehouse::agent::RunnerConfig;

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "agent";
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gatehouse-agent: runs Gatehouse validation attempts for a controller"};
  std::string controller = "127.0.0.1:50051";
  std::string name = HostName();
  std::string work_dir = "var/agent";
  std::string sdk_dir;
  std::string cmake_prefix_path;
  std::string worker;
  std::string torch_version;
  app.add_option("--controller", controller, "controller agent RPC address, host:port")
      ->capture_default_str();
  app.add_option("--name", name, "agent name reported at registration (default: host name)");
  app.add_option("--work-dir", work_dir, "clones, build trees and attempt directories")
      ->capture_default_str();
  app.add_option("--sdk-dir", sdk_dir,
                 "the build tree's sdk/ dir holding GatehouseWorkerConfig.cmake")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--cmake-prefix-path", cmake_prefix_path,
                 "LibTorch's CMake prefix (torch.utils.cmake_prefix_path)");
  app.add_option("--worker", worker,
                 "path of gatehouse-worker (default: <sdk-dir>/../bin/gatehouse-worker)");
  app.add_option("--torch-version", torch_version,
                 "torch version to report when the worker cannot be probed (the worker's own "
                 "--print-runtime wins)");
  CLI11_PARSE(app, argc, argv);

  spdlog::set_default_logger(spdlog::stderr_color_mt("agent"));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [%t] %v");

  const fs::path sdk = fs::absolute(sdk_dir).lexically_normal();
  if (!fs::exists(sdk / "GatehouseWorkerConfig.cmake")) {
    spdlog::warn("{} holds no GatehouseWorkerConfig.cmake; builds will fail", sdk.string());
  }
  const fs::path worker_path =
      worker.empty() ? (sdk / ".." / "bin" / "gatehouse-worker").lexically_normal()
                     : fs::absolute(worker).lexically_normal();
  if (!fs::exists(worker_path)) {
    spdlog::warn("worker {} does not exist; attempts will fail", worker_path.string());
  }

  // Block SIGTERM/SIGINT before any thread starts (gRPC's included) so only the signal thread
  // receives them; children get an empty mask back (agent/process.cc).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  RunnerConfig runner_config;
  runner_config.work_dir = fs::absolute(work_dir).lexically_normal();
  runner_config.sdk_dir = sdk;
  runner_config.cmake_prefix_path = cmake_prefix_path;
  runner_config.worker = worker_path;
  runner_config.agent_name = name;
  std::error_code ec;
  fs::create_directories(runner_config.work_dir, ec);
  if (ec) {
    spdlog::error("cannot create work dir {}: {}", runner_config.work_dir.string(), ec.message());
    return 1;
  }
  AgentClientConfig client_config;
  client_config.controller = controller;
  client_config.agent_name = name;
  client_config.capabilities = gatehouse::agent::ProbeCapabilities(worker_path, torch_version);
  const auto& caps = client_config.capabilities;
  for (const auto& gpu : caps.gpus) runner_config.gpu_indices.push_back(gpu.index);
  spdlog::info("agent {}: {} cores, {} MiB, {} GPU(s), lane={}, torch {}, CUDA {}, NCCL {}, "
               "driver CUDA {}, work dir {}",
               name, caps.cpu_cores, caps.memory_bytes >> 20, caps.gpus.size(),
               caps.labels.at("lane"), caps.torch_version.empty() ? "?" : caps.torch_version,
               caps.cuda_version.empty() ? "-" : caps.cuda_version,
               caps.nccl_version.empty() ? "-" : caps.nccl_version,
               caps.cuda_driver_version.empty() ? "-" : caps.cuda_driver_version,
               runner_config.work_dir.string());
  AttemptRunner runner(runner_config);

  AgentClient client(client_config, runner);
  client.OnRegistered([](const std::string& agent_id) {
    std::cout << "gatehouse-agent: registered as " << agent_id << std::endl;
  });

  // First signal: stop gracefully (the running worker gets SIGTERM); second: exit at once.
  std::thread([&client, stop_signals] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    spdlog::info("signal {}: stopping", signal_number);
    client.Stop();
    sigwait(&stop_signals, &signal_number);
    std::_Exit(128 + signal_number);
  }).detach();

  const gatehouse::Status status = client.Run();
  if (!status.ok()) {
    spdlog::error("{}", status.ToString());
    return 1;
  }
  spdlog::info("stopped");
  return 0;
}
