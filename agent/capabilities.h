// What this agent offers the scheduler: cores, memory, GPUs, labels, runtime (Register message).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gatehouse::agent {

struct GpuInfo {
  int32_t index = 0;          // nvidia-smi's index: what CUDA_VISIBLE_DEVICES names
  std::string model;          // e.g. "NVIDIA H200"
  int64_t memory_bytes = 0;
  std::string uuid;
  std::string driver_version;  // NVIDIA driver, e.g. "580.95.05"
};

/// The runtime the worker executable reports (`gatehouse-worker --print-runtime`, the worker's
/// RuntimeJson): versions as "major.minor[.patch]", empty when absent.
struct WorkerRuntime {
  std::string torch, cuda, cudnn, nccl, cuda_driver;
  bool cuda_available = false;
  bool nccl_groups = false;  // the worker can join NCCL process groups
};

struct AgentCapabilities {
  int32_t cpu_cores = 0;
  int64_t memory_bytes = 0;
  std::vector<GpuInfo> gpus;
  std::map<std::string, std::string> labels;  // lane=gpu when a GPU is present, else lane=cpu
  /// The effective runtime: what the worker reports, not what anyone says it is.
  std::string torch_version;
  std::string cuda_version, nccl_version, cudnn_version, cuda_driver_version;
  int32_t slots = 1;                          // attempts run at once
  /// transformers of the reference runner (ProbeReferenceRuntime); empty: no reference cells.
  std::string transformers_version;
};

/// The reference runner's versions: `<python> <script> --print-runtime` prints
/// {"torch": ..., "transformers": ...}; returns transformers'. Errors: as the process run;
/// INVALID_ARGUMENT for other output.
Result<std::string> ProbeReferenceRuntime(const std::filesystem::path& python,
                                          const std::filesystem::path& script);

/// MemTotal of /proc/meminfo text, in bytes. Errors: NOT_FOUND when the line is missing or
/// malformed.
Result<int64_t> ParseMemTotal(std::string_view meminfo);

/// The nvidia-smi query ProbeCapabilities runs (ParseNvidiaSmiCsv reads its output).
inline constexpr std::string_view kNvidiaSmiQuery =
    "--query-gpu=index,name,memory.total,uuid,driver_version";

/// Parses `nvidia-smi --query-gpu=index,name,memory.total,uuid,driver_version
/// --format=csv,noheader,nounits` (memory in MiB). Blank lines are skipped. Errors:
/// INVALID_ARGUMENT naming the bad line.
Result<std::vector<GpuInfo>> ParseNvidiaSmiCsv(std::string_view csv);

/// Parses `nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits`: index ->
/// MiB. Errors: INVALID_ARGUMENT naming the bad line.
Result<std::map<int, int64_t>> ParseGpuMemoryCsv(std::string_view csv);

/// GPU memory in use now, per nvidia-smi index (MiB), for cleanup checks (agent/cleanup.h).
/// An empty map when nvidia-smi is not installed; UNAVAILABLE when it fails.
Result<std::map<int, int64_t>> ProbeGpuMemoryUsedMiB();

/// Parses the worker's `--print-runtime` output (one JSON object; docs/protocols.md §3.2).
/// Errors: INVALID_ARGUMENT naming the member that is missing or of the wrong type, or saying
/// the text is not a JSON object.
Result<WorkerRuntime> ParseWorkerRuntime(std::string_view json_text);

/// Runs `worker --print-runtime` and parses what it prints. Blocking (the worker loads
/// LibTorch: about a second). Errors: UNAVAILABLE when it cannot run or exits non-zero (with
/// its stderr), else as ParseWorkerRuntime.
Result<WorkerRuntime> ProbeWorkerRuntime(const std::filesystem::path& worker);

/// Probes this machine: cores, memory, GPUs (nvidia-smi when it is in PATH) and the effective
/// runtime of `worker` (ProbeWorkerRuntime). `torch_version` (the agent's --torch-version) is
/// used only when the worker cannot be probed; when both exist and differ, the worker's wins
/// and a warning names both. Never fails: a probe that does not work is logged and leaves its
/// fields empty (no GPUs, memory 0, no versions).
AgentCapabilities ProbeCapabilities(const std::filesystem::path& worker, std::string torch_version);

}  // namespace gatehouse::agent
