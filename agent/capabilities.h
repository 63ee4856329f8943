// What this agent offers the scheduler: cores, memory, GPUs, labels, runtime (Register message).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gatehouse::agent {

struct GpuInfo {
  std::string model;          // e.g. "NVIDIA H200"
  int64_t memory_bytes = 0;
  std::string uuid;
};

struct AgentCapabilities {
  int32_t cpu_cores = 0;
  int64_t memory_bytes = 0;
  std::vector<GpuInfo> gpus;
  std::map<std::string, std::string> labels;  // lane=gpu when a GPU is present, else lane=cpu
  std::string torch_version;                  // what the lead passes with --torch-version
  int32_t slots = 1;                          // attempts run at once
};

/// MemTotal of /proc/meminfo text, in bytes. Errors: NOT_FOUND when the line is missing or
/// malformed.
Result<int64_t> ParseMemTotal(std::string_view meminfo);

/// Parses `nvidia-smi --query-gpu=name,memory.total,uuid --format=csv,noheader,nounits`
/// (memory in MiB). Blank lines are skipped. Errors: INVALID_ARGUMENT naming the bad line.
Result<std::vector<GpuInfo>> ParseNvidiaSmiCsv(std::string_view csv);

/// Probes this machine. Blocking (runs nvidia-smi when it is in PATH); never fails: a probe that
/// does not work is logged and leaves its field empty (no GPUs, memory 0).
AgentCapabilities ProbeCapabilities(std::string torch_version);

}  // namespace gatehouse::agent
