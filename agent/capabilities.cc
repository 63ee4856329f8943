// Machine probing for the Register message.
#include "agent/capabilities.h"

#include <charconv>
#include <fstream>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "agent/process.h"

namespace gatehouse::agent {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    parts.push_back(s.substr(start, end == std::string_view::npos ? s.npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return parts;
}

template <typename T>
bool ParseNumber(std::string_view s, T& out) {
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

}  // namespace

Result<int64_t> ParseMemTotal(std::string_view meminfo) {
  for (std::string_view line : Split(meminfo, '\n')) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    line.remove_prefix(9);
    line = Trim(line);
    if (line.size() < 3 || line.substr(line.size() - 2) != "kB") break;
    int64_t kib = 0;
    if (!ParseNumber(Trim(line.substr(0, line.size() - 2)), kib)) break;
    return kib * 1024;
  }
  return Status::NotFound("no well-formed MemTotal line in /proc/meminfo");
}

Result<std::vector<GpuInfo>> ParseNvidiaSmiCsv(std::string_view csv) {
  std::vector<GpuInfo> gpus;
  for (std::string_view line : Split(csv, '\n')) {
    if (Trim(line).empty()) continue;
    const auto fields = Split(line, ',');
    GpuInfo gpu;
    int64_t mib = 0;
    if (fields.size() != 3 || !ParseNumber(Trim(fields[1]), mib)) {
      return Status::InvalidArgument("nvidia-smi: unexpected line '" + std::string(line) +
                                     "' (want: name, memory MiB, uuid)");
    }
    gpu.model = std::string(Trim(fields[0]));
    gpu.memory_bytes = mib * 1024 * 1024;
    gpu.uuid = std::string(Trim(fields[2]));
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

AgentCapabilities ProbeCapabilities(std::string torch_version) {
  AgentCapabilities caps;
  caps.cpu_cores = static_cast<int32_t>(std::thread::hardware_concurrency());
  caps.torch_version = std::move(torch_version);
  caps.slots = 1;

  std::ifstream meminfo("/proc/meminfo");
  std::stringstream text;
  text << meminfo.rdbuf();
  if (auto memory = ParseMemTotal(text.str()); memory.ok()) {
    caps.memory_bytes = *memory;
  } else {
    spdlog::warn("memory probe: {}", memory.status().ToString());
  }

  if (const auto nvidia_smi = FindProgram("nvidia-smi"); !nvidia_smi.empty()) {
    ProcessSpec spec;
    spec.exe = nvidia_smi;
    spec.args = {"--query-gpu=name,memory.total,uuid", "--format=csv,noheader,nounits"};
    std::string out;
    std::string err;
    auto exit = RunProcess(
        spec, [&](std::string_view b) { out.append(b); }, [&](std::string_view b) { err.append(b); });
    if (!exit.ok()) {
      spdlog::warn("GPU probe: {}", exit.status().ToString());
    } else if (!exit->ok()) {
      spdlog::warn("GPU probe: nvidia-smi {}: {}", exit->Describe(), err);
    } else if (auto gpus = ParseNvidiaSmiCsv(out); gpus.ok()) {
      caps.gpus = std::move(gpus).value();
    } else {
      spdlog::warn("GPU probe: {}", gpus.status().ToString());
    }
  }
  caps.labels["lane"] = caps.gpus.empty() ? "cpu" : "gpu";
  return caps;
}

}  // namespace gatehouse::agent
