// Machine probing for the Register message.
#include "agent/capabilities.h"

#include <charconv>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
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

/// Runs `exe args...` to completion and returns its standard output. Errors: UNAVAILABLE
/// naming the command when it cannot run or exits non-zero (with its standard error).
Result<std::string> CaptureStdout(const std::filesystem::path& exe, std::vector<std::string> args) {
  ProcessSpec spec;
  spec.exe = exe;
  spec.args = std::move(args);
  const std::string command = exe.string() + (spec.args.empty() ? "" : " " + spec.args.front());
  std::string out;
  std::string err;
  auto exit = RunProcess(
      spec, [&](std::string_view b) { out.append(b); }, [&](std::string_view b) { err.append(b); });
  if (!exit.ok()) return Status::Unavailable(command + ": " + exit.status().message());
  if (!exit->ok()) return Status::Unavailable(command + " " + exit->Describe() + ": " + err);
  return out;
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
    if (fields.size() != 5 || !ParseNumber(Trim(fields[0]), gpu.index) ||
        !ParseNumber(Trim(fields[2]), mib)) {
      return Status::InvalidArgument("nvidia-smi: unexpected line '" + std::string(line) +
                                     "' (want: index, name, memory MiB, uuid, driver version)");
    }
    gpu.model = std::string(Trim(fields[1]));
    gpu.memory_bytes = mib * 1024 * 1024;
    gpu.uuid = std::string(Trim(fields[3]));
    gpu.driver_version = std::string(Trim(fields[4]));
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

Result<std::map<int, int64_t>> ParseGpuMemoryCsv(std::string_view csv) {
  std::map<int, int64_t> out;
  for (std::string_view line : Split(csv, '\n')) {
    line = Trim(line);
    if (line.empty()) continue;
    const auto fields = Split(line, ',');
    int index = 0;
    int64_t used = 0;
    if (fields.size() != 2 || !ParseNumber(Trim(fields[0]), index) ||
        !ParseNumber(Trim(fields[1]), used)) {
      return Status::InvalidArgument("nvidia-smi memory line '" + std::string(line) +
                                     "': expected 'index, memory.used'");
    }
    out[index] = used;
  }
  return out;
}

Result<std::map<int, int64_t>> ProbeGpuMemoryUsedMiB() {
  const auto nvidia_smi = FindProgram("nvidia-smi");
  if (nvidia_smi.empty()) return std::map<int, int64_t>();
  GH_ASSIGN_OR_RETURN(std::string out,
                      CaptureStdout(nvidia_smi, {"--query-gpu=index,memory.used",
                                                 "--format=csv,noheader,nounits"}));
  return ParseGpuMemoryCsv(out);
}

Result<WorkerRuntime> ParseWorkerRuntime(std::string_view json_text) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return Status::InvalidArgument("worker --print-runtime: output is not a JSON object");
  }
  WorkerRuntime r;
  for (const auto& [key, field] : {std::pair{"torch", &r.torch}, std::pair{"cuda", &r.cuda},
                                   std::pair{"cudnn", &r.cudnn}, std::pair{"nccl", &r.nccl},
                                   std::pair{"cuda_driver", &r.cuda_driver}}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) {
      return Status::InvalidArgument(std::string("worker --print-runtime: member '") + key +
                                     "' missing or not a string");
    }
    *field = it->get<std::string>();
  }
  for (const auto& [key, field] : {std::pair{"cuda_available", &r.cuda_available},
                                   std::pair{"nccl_groups", &r.nccl_groups}}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_boolean()) {
      return Status::InvalidArgument(std::string("worker --print-runtime: member '") + key +
                                     "' missing or not true/false");
    }
    *field = it->get<bool>();
  }
  if (r.torch.empty()) return Status::InvalidArgument("worker --print-runtime: member 'torch' is empty");
  return r;
}

Result<WorkerRuntime> ProbeWorkerRuntime(const std::filesystem::path& worker) {
  GH_ASSIGN_OR_RETURN(std::string out, CaptureStdout(worker, {"--print-runtime"}));
  return ParseWorkerRuntime(out);
}

Result<std::string> ProbeReferenceRuntime(const std::filesystem::path& python,
                                          const std::filesystem::path& script) {
  GH_ASSIGN_OR_RETURN(std::string out, CaptureStdout(python, {script.string(), "--print-runtime"}));
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("transformers") || !j["transformers"].is_string() ||
      j["transformers"].get<std::string>().empty()) {
    return Status::InvalidArgument("reference runner --print-runtime: no 'transformers' version");
  }
  return j["transformers"].get<std::string>();
}

AgentCapabilities ProbeCapabilities(const std::filesystem::path& worker, std::string torch_version) {
  AgentCapabilities caps;
  caps.cpu_cores = static_cast<int32_t>(std::thread::hardware_concurrency());
  caps.torch_version = std::move(torch_version);
  caps.slots = 1;

  if (auto runtime = ProbeWorkerRuntime(worker); runtime.ok()) {
    if (!caps.torch_version.empty() && caps.torch_version != runtime->torch) {
      spdlog::warn("--torch-version {} ignored: the worker runs torch {}", caps.torch_version,
                   runtime->torch);
    }
    caps.torch_version = runtime->torch;
    caps.cuda_version = runtime->cuda;
    caps.nccl_version = runtime->nccl;
    caps.cudnn_version = runtime->cudnn;
    caps.cuda_driver_version = runtime->cuda_driver;
  } else {
    spdlog::warn("runtime probe: {}{}", runtime.status().ToString(),
                 caps.torch_version.empty() ? "" : "; reporting --torch-version " + caps.torch_version);
  }

  std::ifstream meminfo("/proc/meminfo");
  std::stringstream text;
  text << meminfo.rdbuf();
  if (auto memory = ParseMemTotal(text.str()); memory.ok()) {
    caps.memory_bytes = *memory;
  } else {
    spdlog::warn("memory probe: {}", memory.status().ToString());
  }

  if (const auto nvidia_smi = FindProgram("nvidia-smi"); !nvidia_smi.empty()) {
    auto out = CaptureStdout(nvidia_smi, {std::string(kNvidiaSmiQuery), "--format=csv,noheader,nounits"});
    if (!out.ok()) {
      spdlog::warn("GPU probe: {}", out.status().ToString());
    } else if (auto gpus = ParseNvidiaSmiCsv(*out); gpus.ok()) {
      caps.gpus = std::move(gpus).value();
    } else {
      spdlog::warn("GPU probe: {}", gpus.status().ToString());
    }
  }
  caps.labels["lane"] = caps.gpus.empty() ? "cpu" : "gpu";
  return caps;
}

}  // namespace gatehouse::agent
