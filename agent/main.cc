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

#include <chrono>
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
#include "agent/sandbox.h"
#include "agent/slurm.h"
#include "agent/slurm_launcher.h"
#include "common/file_util.h"

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
  std::string reference_python = GATEHOUSE_REFERENCE_PYTHON;
  std::string reference_script = GATEHOUSE_REFERENCE_SCRIPT;
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
  app.add_option("--reference-python", reference_python,
                 "python with torch and transformers that runs reference cells (empty: this agent "
                 "runs none)")
      ->capture_default_str();
  std::string lane_python = GATEHOUSE_REFERENCE_PYTHON;
  app.add_option("--python", lane_python,
                 "python whose pip installs Python-lane recipes (the node's pinned torch; empty: "
                 "this agent runs no Python-lane cell)")
      ->capture_default_str();
  app.add_option("--reference-script", reference_script,
                 "the reference runner (tools/refgen/reference_cell.py)")
      ->capture_default_str();
  app.add_option("--torch-version", torch_version,
                 "torch version to report when the worker cannot be probed (the worker's own "
                 "--print-runtime wins)");
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "file holding the agent token (gatehouse-controller tokens create --kind agent); "
                 "GATEHOUSE_AGENT_TOKEN in the environment is used when not given")
      ->check(CLI::ExistingFile);
  bool tls = false;
  std::string tls_ca, tls_cert, tls_key;
  app.add_flag("--tls", tls, "connect to the controller over TLS");
  app.add_option("--tls-ca", tls_ca, "PEM CA that signed the controller's certificate "
                                     "(default: the system roots); implies --tls")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-cert", tls_cert, "PEM client certificate, for mutual TLS; implies --tls")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", tls_key, "PEM key of --tls-cert")->check(CLI::ExistingFile);
  int log_flush_timeout_ms = 2000;
  app.add_option("--log-flush-timeout-ms", log_flush_timeout_ms,
                 "after a build step or worker exits, how long processes it left may keep its "
                 "output open before they are killed and the log is cut")
      ->capture_default_str()
      ->check(CLI::Range(0, 600000));
  int64_t gpu_tolerance_mib = 512;
  app.add_option("--gpu-memory-tolerance-mib", gpu_tolerance_mib,
                 "after an attempt, how far above its idle baseline a GPU's memory.used may stay "
                 "before the agent drains")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  std::vector<std::string> secret_env;
  app.add_option("--secret-env", secret_env,
                 "name of an environment variable whose value is a secret (repeatable): the "
                 "worker and build inherit it, and its value is replaced by [REDACTED:NAME] in "
                 "every log and event before they leave this node");
  gatehouse::agent::SlurmConfig slurm;
  bool use_slurm = false;
  std::string slurm_rank;
  app.add_flag("--slurm", use_slurm,
               "run every attempt as a Slurm job step through srun on the cluster this machine "
               "submits to (docs/deploy.md, \"Slurm\"); the work dir, worker and "
               "gatehouse-slurm-rank must be at the same paths on the nodes");
  app.add_option("--slurm-partition", slurm.partition, "srun --partition (default: the cluster's)");
  app.add_option("--slurm-nodes", slurm.nodes, "nodes one attempt may use")
      ->check(CLI::PositiveNumber);
  app.add_option("--slurm-gpus-per-node", slurm.gpus_per_node,
                 "GPUs of each node; a cuda cell runs one rank per GPU")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--slurm-gpu-model", slurm.gpu_model,
                 "the nodes' GPU model as nvidia-smi names it (\"NVIDIA H200\")");
  app.add_option("--slurm-cpu-ranks-per-node", slurm.cpu_ranks_per_node,
                 "ranks of a cpu cell per node")
      ->check(CLI::PositiveNumber);
  app.add_option("--slurm-arg", slurm.extra_args,
                 "one more srun argument (repeatable): --account=..., --qos=...");
  app.add_option("--slurm-rank", slurm_rank,
                 "gatehouse-slurm-rank (default: beside this executable)");
  std::string sandbox_kind = "none";
  gatehouse::agent::SandboxConfig sandbox;
  sandbox.max_processes = 4096;
  std::vector<std::string> sandbox_hide;
  app.add_option("--sandbox", sandbox_kind,
                 "isolate each validation attempt's build and ranks: 'bwrap' (bubblewrap: a "
                 "user and "
                 "network namespace per attempt, read-only root, the work dir and token file "
                 "hidden; docs/deploy.md) or 'none'")
      ->check(CLI::IsMember({"none", "bwrap"}));
  app.add_option("--sandbox-max-processes", sandbox.max_processes,
                 "RLIMIT_NPROC of a sandboxed attempt's ranks (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--sandbox-hide", sandbox_hide,
                 "one more directory a sandboxed attempt must not see (repeatable)");
  std::vector<std::string> sandbox_devices;
  app.add_option("--sandbox-device", sandbox_devices,
                 "one more device node (or directory of them) a sandboxed attempt may use, "
                 "beside the GPUs' and RDMA's /dev entries found for each attempt (repeatable)");
  std::string cgroup_mode = "auto";
  gatehouse::agent::CgroupConfig cgroup;
  app.add_option("--cgroup", cgroup_mode,
                 "run each attempt (build and ranks) in a cgroup of its own under the one "
                 "delegated to the agent: 'auto' (where one is; otherwise the evidence says "
                 "none and why; a limit below makes it required), 'required' (exit at start "
                 "where none is) or 'none'")
      ->check(CLI::IsMember({"auto", "required", "none"}));
  app.add_option("--attempt-memory-limit", cgroup.memory_limit_bytes,
                 "memory limit of each attempt's cgroup, swap included: a whole number of "
                 "bytes or K/M/G/T (binary: 64G, 512M), at least 64M; 0: none")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--attempt-max-processes", cgroup.max_processes,
                 "pids.max of each attempt's cgroup: its processes and threads together "
                 "(0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{4194304}));
  CLI11_PARSE(app, argc, argv);

  spdlog::set_default_logger(spdlog::stderr_color_mt("agent"));
  // Below 64 MiB no worker starts (LibTorch alone maps more); past 1 EiB it is no limit.
  if (const int64_t m = cgroup.memory_limit_bytes;
      m < 0 || (m > 0 && m < (int64_t{64} << 20)) || m > (int64_t{1} << 60)) {
    spdlog::error("--attempt-memory-limit {} bytes: expected 0 (none) or 64M to 1E", m);
    return 2;
  }

  // The token comes from a file or the environment, never argv (argv is visible in ps).
  std::string token;
  if (!token_file.empty()) {
    auto secret = gatehouse::ReadSecretFile(token_file, "--token-file");
    if (!secret.ok()) {
      spdlog::error("{}", secret.status().ToString());
      return 2;
    }
    token = std::move(secret).value();
  } else if (const char* env = std::getenv("GATEHOUSE_AGENT_TOKEN"); env != nullptr) {
    token = env;
  }
  // Builds and workers run the submitted repository's code and inherit this environment: the
  // token must not be there.
  ::unsetenv("GATEHOUSE_AGENT_TOKEN");
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
  runner_config.python = lane_python;
  runner_config.worker = worker_path;
  runner_config.agent_name = name;
  auto secrets = gatehouse::agent::SecretsFromEnvironment(secret_env);
  if (!secrets.ok()) {
    spdlog::error("{}", secrets.status().message());
    return 2;
  }
  // The agent token is redacted too, wherever it would appear in a log.
  if (token.size() >= gatehouse::agent::Redactor::kMinSecretBytes) {
    secrets->emplace_back("GATEHOUSE_AGENT_TOKEN", token);
  }
  auto redactor = gatehouse::agent::Redactor::Create(*secrets);
  if (!redactor.ok()) {
    spdlog::error("{}", redactor.status().message());
    return 2;
  }
  runner_config.redactor = std::move(redactor).value();
  runner_config.log_flush_timeout = std::chrono::milliseconds(log_flush_timeout_ms);
  // Cleanup evidence after every attempt, against the GPU memory in use now, while idle.
  gatehouse::agent::CleanupChecker cleanup(gatehouse::agent::ProbeGpuMemoryUsedMiB,
                                           gpu_tolerance_mib);
  if (auto baseline = cleanup.TakeBaseline(); !baseline.ok()) {
    spdlog::warn("GPU memory baseline: {} (GPU memory is not part of the cleanup check)",
                 baseline.ToString());
  }
  runner_config.cleanup = &cleanup;
  std::error_code ec;
  fs::create_directories(runner_config.work_dir, ec);
  if (ec) {
    spdlog::error("cannot create work dir {}: {}", runner_config.work_dir.string(), ec.message());
    return 1;
  }
  AgentClientConfig client_config;
  client_config.controller = controller;
  client_config.agent_name = name;
  client_config.token = token;
  client_config.tls = tls || !tls_ca.empty() || !tls_cert.empty();
  client_config.tls_ca_file = tls_ca;
  client_config.tls_cert_file = tls_cert;
  client_config.tls_key_file = tls_key;
  client_config.capabilities = gatehouse::agent::ProbeCapabilities(worker_path, torch_version);
  if (!reference_python.empty()) {
    auto transformers = gatehouse::agent::ProbeReferenceRuntime(reference_python, reference_script);
    if (transformers.ok()) {
      client_config.capabilities.transformers_version = *transformers;
      runner_config.reference_python = reference_python;
      runner_config.reference_script = reference_script;
    } else {
      spdlog::warn("no reference cells on this agent: {}", transformers.status().ToString());
    }
  }
  if (use_slurm) {
    // The nodes' GPUs are Slurm's to hand out; this machine's are not used.
    std::error_code exe_ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", exe_ec);
    slurm.rank_exe = slurm_rank.empty() ? self.parent_path() / "gatehouse-slurm-rank"
                                        : fs::absolute(slurm_rank).lexically_normal();
    if (!fs::exists(slurm.rank_exe)) {
      spdlog::error("--slurm: {} does not exist (--slurm-rank)", slurm.rank_exe.string());
      return 2;
    }
    if (slurm.gpus_per_node > 0 && slurm.gpu_model.empty()) {
      spdlog::error("--slurm-gpus-per-node {} needs --slurm-gpu-model", slurm.gpus_per_node);
      return 2;
    }
    client_config.capabilities =
        gatehouse::agent::SlurmCapabilities(slurm, std::move(client_config.capabilities));
    runner_config.slurm = &slurm;
    // The jobs a killed run of this agent left behind: their attempts are lost already.
    if (auto left = gatehouse::agent::CancelLeftoverJobs(slurm, name); !left.ok()) {
      spdlog::warn("Slurm: cannot look for jobs an earlier run left: {}", left.status().message());
    } else if (!left->empty()) {
      spdlog::warn("Slurm: cancelled {} job(s) an earlier run of this agent left", left->size());
    }
    spdlog::info("Slurm engine: {} node(s) x {} GPU(s){}, {} cpu rank(s) per node, partition {}",
                 slurm.nodes, slurm.gpus_per_node,
                 slurm.gpu_model.empty() ? "" : " " + slurm.gpu_model, slurm.cpu_ranks_per_node,
                 slurm.partition.empty() ? "(default)" : slurm.partition);
  }
  const auto& caps = client_config.capabilities;
  runner_config.node_memory_bytes = caps.memory_bytes;
  for (const auto& gpu : caps.gpus) {
    if (use_slurm) break;
    runner_config.gpu_indices.push_back(gpu.index);
    runner_config.gpu_models.push_back(gpu.model);
  }
  spdlog::info("agent {}: {} cores, {} MiB, {} GPU(s), lane={}, torch {}, CUDA {}, NCCL {}, "
               "driver CUDA {}, work dir {}",
               name, caps.cpu_cores, caps.memory_bytes >> 20, caps.gpus.size(),
               caps.labels.at("lane"), caps.torch_version.empty() ? "?" : caps.torch_version,
               caps.cuda_version.empty() ? "-" : caps.cuda_version,
               caps.nccl_version.empty() ? "-" : caps.nccl_version,
               caps.cuda_driver_version.empty() ? "-" : caps.cuda_driver_version,
               runner_config.work_dir.string());
  if (sandbox_kind == "bwrap") {
    // Checked once here: an agent that cannot sandbox says so at start, not per attempt.
    auto version = gatehouse::agent::ProbeSandbox(sandbox);
    if (!version.ok()) {
      spdlog::error("--sandbox bwrap: {}", version.status().message());
      return 2;
    }
    sandbox.version = *version;
    sandbox.work_dir = runner_config.work_dir;
    if (!token_file.empty()) sandbox.hidden_files.push_back(fs::absolute(token_file));
    for (const auto& dir : sandbox_hide) sandbox.hidden_dirs.push_back(fs::absolute(dir));
    for (const auto& device : sandbox_devices) {
      if (!fs::exists(device)) {
        spdlog::error("--sandbox-device {}: no such device here", device);
        return 2;
      }
      sandbox.devices.push_back(fs::absolute(device));
    }
    runner_config.sandbox = &sandbox;
    if (const int stale = gatehouse::agent::RemoveStaleShmDirs(); stale > 0) {
      spdlog::info("sandbox: removed {} /dev/shm dir(s) of gone agents", stale);
    }
    // The accelerator's are found again for each attempt (AttemptSandbox::Open).
    std::string devices;
    for (const auto& device : gatehouse::agent::AcceleratorDevices()) {
      devices += " " + device.string();
    }
    for (const auto& device : sandbox.devices) devices += " " + device.string();
    spdlog::info("sandbox: bwrap per attempt, work dir {} hidden{}, devices:{}",
                 sandbox.work_dir.string(), token_file.empty() ? "" : ", token file hidden",
                 devices.empty() ? " none" : devices);
  }
  const bool limits = cgroup.memory_limit_bytes > 0 || cgroup.max_processes > 0;
  if (cgroup_mode == "none") {
    if (limits) {
      spdlog::error("{} needs a cgroup (--cgroup auto or required), not --cgroup none",
                    cgroup.memory_limit_bytes > 0 ? "--attempt-memory-limit"
                                                  : "--attempt-max-processes");
      return 2;
    }
    cgroup.none_reason = "gatehouse-agent --cgroup none";
  } else {
    // Found and prepared once here (on cgroup v2 the agent moves into a leaf of its own).
    cgroup = gatehouse::agent::PrepareCgroups(cgroup);
    if (cgroup.version == 0 && (cgroup_mode == "required" || limits)) {
      spdlog::error("--cgroup {}{}: {}", cgroup_mode,
                    limits ? " with attempt limits" : "", cgroup.none_reason);
      return 2;
    }
    if (cgroup.version == 0) {
      spdlog::info("cgroup: attempts run in none: {}", cgroup.none_reason);
    } else {
      gatehouse::agent::RemoveStaleCgroups(cgroup);  // a crashed run's attempts
      spdlog::info("cgroup v{}: each attempt in one under {} (memory limit {}, process limit {})",
                   cgroup.version, cgroup.parent.string(),
                   cgroup.memory_limit_bytes > 0
                       ? gatehouse::agent::FormatBytes(cgroup.memory_limit_bytes)
                       : "none",
                   cgroup.max_processes > 0 ? std::to_string(cgroup.max_processes) : "none");
    }
  }
  runner_config.cgroup = &cgroup;
  // How this agent isolates attempts, for the agents page (labels are not scheduled on).
  auto& labels = client_config.capabilities.labels;
  labels["sandbox"] = sandbox_kind == "bwrap" ? sandbox.version : "none";
  labels["cgroup"] = gatehouse::agent::DescribeCgroupConfig(cgroup);
  if (use_slurm) {
    if (sandbox_kind == "bwrap") {
      labels["sandbox"] += " (Slurm tasks: each in its own, node network)";
    }
    labels["cgroup"] += " (build only: Slurm steps run in Slurm's)";
  }
  AttemptRunner runner(runner_config);

  AgentClient client(client_config, runner);
  runner.SetArtifactChannel(&client);
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
    const bool refused = status.code() == gatehouse::StatusCode::kUnauthenticated ||
                         status.code() == gatehouse::StatusCode::kPermissionDenied;
    return refused ? 2 : 1;
  }
  spdlog::info("stopped");
  return 0;
}
