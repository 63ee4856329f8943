#include "controller/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/sha256.h"

namespace gatehouse::controller {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kGiB = int64_t{1} << 30;

// Coefficients of the formula (docs/scheduling.md "Memory", measured on the Qwen2.5-0.5B-size
// checkpoint in docs/real-size.md: the reference runner peaked at 2.54x an fp32 checkpoint's
// bytes, a worker running every phase at 4.33x).
/// What a process holds before any weight: the interpreter or LibTorch, allocator arenas.
constexpr int64_t kProcessBase = kGiB;
/// The reference runner: fp32 weights (its references are fp32, bf16 ones derived), its
/// training traces and envelope, per fp32 parameter byte.
constexpr double kReferencePerFp32Byte = 2.5;
/// A worker rank that trains (training, packing or save): weights and gradients in the cell's
/// precision, two fp32 AdamW moments (8 bytes per parameter), 10% for activations.
constexpr double kTrainingActivations = 1.1;
/// A rank that only runs forwards and decodes: weights plus activations and logits.
constexpr double kInferencePerWeightByte = 1.5;

bool Trains(const CellSpec& spec) {
  return spec.Requested("training") || spec.Requested("packing") || spec.Requested("save");
}

int ElementBytesOf(const std::string& dtype) {
  if (dtype == "bfloat16" || dtype == "float16" || dtype == "half" || dtype == "bf16") return 2;
  if (dtype == "float64" || dtype == "double") return 8;
  return 4;
}

int64_t Scale(double bytes, double factor) { return std::llround(bytes * factor); }

/// The formula's host bytes of one process of `role`; `device` for a CUDA cell's GPU bytes.
struct Formula {
  int64_t host = 0;
  int64_t device = 0;
};

Formula ReferenceFormula(const CellSpec& spec, const CheckpointFacts& facts) {
  const double weights = kReferencePerFp32Byte * 4.0 * static_cast<double>(facts.parameters());
  Formula f;
  if (spec.runtime.device == "cuda") {
    f.device = kProcessBase + Scale(weights, 1.0);
    f.host = kProcessBase + facts.bytes;  // the checkpoint read on the host before the copy
  } else {
    f.host = kProcessBase + Scale(weights, 1.0);
  }
  return f;
}

Formula WorkerFormula(const CellSpec& spec, const CheckpointFacts& facts) {
  const double params = static_cast<double>(facts.parameters());
  const double weight_bytes = params * (spec.precision == "bf16" ? 2.0 : 4.0);
  double bytes = Trains(spec) ? (2.0 * weight_bytes + 8.0 * params) * kTrainingActivations
                              : kInferencePerWeightByte * weight_bytes;
  // Tensor and pipeline parallel ranks each hold their shard; data parallel ranks a replica.
  const int64_t shards = std::max<int64_t>(1, spec.topology.tp * spec.topology.pp);
  bytes /= static_cast<double>(shards);
  Formula f;
  if (spec.runtime.device == "cuda") {
    f.device = kProcessBase + Scale(bytes, 1.0);
    f.host = kProcessBase + facts.bytes / shards;
  } else {
    f.host = kProcessBase + Scale(bytes, 1.0);
  }
  return f;
}

std::string FormatFactor(double factor) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", factor);
  return buf;
}

}  // namespace

Result<CheckpointFacts> ReadCheckpointFacts(const fs::path& dir) {
  CheckpointFacts facts;
  int64_t safetensors = 0, other = 0;
  int files = 0;
  std::error_code ec;  // the directory's; a file that cannot be read is skipped
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::error_code file_ec;
    if (!entry.is_regular_file(file_ec)) continue;
    const std::string ext = entry.path().extension().string();
    const auto size = static_cast<int64_t>(entry.file_size(file_ec));
    if (file_ec) continue;
    if (ext == ".safetensors") {
      safetensors += size;
      ++files;
    } else if (ext == ".bin" || ext == ".pt" || ext == ".pth") {
      other += size;
      ++files;
    }
  }
  if (ec) return Status::NotFound("checkpoint '" + dir.string() + "': " + ec.message());
  if (files == 0) {
    return Status::NotFound("checkpoint '" + dir.string() + "': no weight file (*.safetensors)");
  }
  facts.bytes = safetensors > 0 ? safetensors : other;
  std::ifstream in(dir / "config.json");
  if (in) {
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) {
      return Status::InvalidArgument("checkpoint '" + dir.string() +
                                     "': config.json is not a JSON object");
    }
    for (const char* key : {"torch_dtype", "dtype"}) {
      if (auto it = config.find(key); it != config.end() && it->is_string()) {
        facts.dtype = it->get<std::string>();
        break;
      }
    }
  }
  facts.element_bytes = ElementBytesOf(facts.dtype);
  return facts;
}

int64_t MemoryEstimate::host_bytes() const {
  int64_t total = 0;
  for (const ProcessMemory& p : processes) total += p.host_bytes * p.count;
  return total;
}

int64_t MemoryEstimate::device_bytes_per_gpu() const {
  int64_t most = 0;
  for (const ProcessMemory& p : processes) most = std::max(most, p.device_bytes);
  return most;
}

std::string MemoryEstimate::Describe() const {
  std::string out;
  for (const ProcessMemory& p : processes) {
    std::string line = (p.count == 1 ? "" : std::to_string(p.count) + " ") + p.role +
                       (p.count == 1 ? "" : "s");
    const std::string each = p.count == 1 ? "" : " each";
    line += " ~" + FormatGigabytes(p.host_bytes) + (p.device_bytes > 0 ? " host" : "") + each;
    if (p.count > 1) line += " (" + FormatGigabytes(p.host_bytes * p.count) + ")";
    if (p.device_bytes > 0) line += ", ~" + FormatGigabytes(p.device_bytes) + " GPU" + each;
    out += (out.empty() ? "" : "; ") + line;
  }
  return out;
}

MemoryCalibration MemoryCalibration::From(const std::vector<MeasuredPeak>& peaks, size_t window) {
  MemoryCalibration c;
  std::map<std::string, size_t> seen;  // role -> ratios counted, newest first
  for (auto it = peaks.rbegin(); it != peaks.rend(); ++it) {
    const MeasuredPeak& p = *it;
    if (p.peak_bytes <= 0) continue;
    c.by_key.try_emplace(p.memory_key + "/" + p.role, p);  // newest wins (walking backwards)
    if (p.estimate_bytes <= 0 || seen[p.role]++ >= window) continue;
    const double ratio = static_cast<double>(p.peak_bytes) / static_cast<double>(p.estimate_bytes);
    double& f = c.factor.try_emplace(p.role, 1.0).first->second;
    f = std::max(f, ratio);
  }
  return c;
}

namespace {

// [tp, dp, pp, ep], then dp_shard, cp, etp when any is not 1: the keys of cells stored before
// those dimensions existed stay as they were, so their measured peaks still apply.
nlohmann::json TopologyKey(const CellSpec::Topology& t) {
  nlohmann::json key = {t.tp, t.dp, t.pp, t.ep};
  if (t.dp_shard != 1 || t.cp != 1 || t.etp != 1) {
    key.push_back(t.dp_shard);
    key.push_back(t.cp);
    key.push_back(t.etp);
  }
  return key;
}

}  // namespace

std::string MemoryKey(const CellSpec& spec) {
  nlohmann::json key = {
      {"checkpoint", spec.checkpoint.digest.empty() ? spec.checkpoint.path : spec.checkpoint.digest},
      {"kind", spec.kind},
      {"device", spec.runtime.device},
      {"precision", spec.precision},
      {"mode", spec.mode},
      {"topology", TopologyKey(spec.topology)},
      {"phases", spec.phases},
      {"decode", spec.decode.max_new_tokens},
      {"training", spec.training.steps},
      {"prompts", spec.prompts.size()}};
  return Sha256Hex(key.dump()).substr(0, 32);
}

MemoryEstimate EstimateMemory(const CellSpec& spec, const CheckpointFacts& facts,
                              const MemoryCalibration& calibration) {
  MemoryEstimate estimate;
  ProcessMemory p;
  Formula f;
  if (spec.IsReference()) {
    p.role = std::string(kReferenceRunnerRole);
    f = ReferenceFormula(spec, facts);
  } else {
    p.role = std::string(kWorkerRankRole);
    p.count = spec.topology.world_size();
    f = WorkerFormula(spec, facts);
  }
  p.host_bytes = f.host;
  p.device_bytes = f.device;
  p.basis = "formula";
  auto measured = calibration.by_key.find(MemoryKey(spec) + "/" + p.role);
  if (measured != calibration.by_key.end() && spec.runtime.device != "cuda") {
    // The same processes on the same input ran before: what they took, plus 10%.
    p.host_bytes = Scale(static_cast<double>(measured->second.peak_bytes), 1.1);
    p.basis = "measured " + FormatGigabytes(measured->second.peak_bytes) + " + 10% (attempt " +
              std::to_string(measured->second.attempt_id) + ")";
  } else if (auto factor = calibration.factor.find(p.role);
             factor != calibration.factor.end() && factor->second > 1.0) {
    p.host_bytes = Scale(static_cast<double>(p.host_bytes), factor->second);
    p.device_bytes = Scale(static_cast<double>(p.device_bytes), factor->second);
    p.basis = "formula x " + FormatFactor(factor->second) + " (measured peaks)";
  }
  estimate.processes.push_back(std::move(p));
  return estimate;
}

std::string FormatGigabytes(int64_t bytes) {
  char buf[32];
  if (bytes < 1'000'000'000) {
    std::snprintf(buf, sizeof buf, "%lld MB", static_cast<long long>((bytes + 500'000) / 1'000'000));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GB", static_cast<double>(bytes) / 1e9);
  }
  return buf;
}

}  // namespace gatehouse::controller
