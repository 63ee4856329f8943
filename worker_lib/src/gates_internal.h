// Helpers shared by the gate sources (gates_*.cc, state_dict_io.cc, logit_comparison.cc,
// reference.cc).
// Not SDK API.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "gatehouse/worker/bars.h"
#include "gatehouse/worker/gates.h"
#include "figure_format.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace gatehouse::worker::internal {

/// "a, b, c" or "a, b, c, ... (12 in all)" when there are more than `max` items.
inline std::string JoinFew(const std::vector<std::string>& items, size_t max = 5) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < max; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > max) out += ", ... (" + std::to_string(items.size()) + " in all)";
  return out;
}

inline std::string ShapeString(c10::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Float64 statistics of a tensor's elements (a gradient, a weight).
struct Float64Stats {
  double sum = 0;
  double sum_sq = 0;
  bool finite = true;        // no NaN or Inf
  bool any_nonzero = false;
};

/// Elements per slice of StatsOf: a float64 slice is 32 MB, where the whole [151936, 896]
/// embedding gradient of Qwen2.5-0.5B is 1.1 GB in float64, and a few such temporaries per
/// training step would be the training gate's peak memory.
inline constexpr int64_t kStatsChunk = int64_t{1} << 22;

/// Float64Stats of `t` (any real dtype and device), converted to float64 one slice of `chunk`
/// elements at a time; sums accumulate across slices in float64.
///
/// Below float64 (float32, bfloat16, float16, integers, bool) the two sums decide the flags: a
/// finite element's square (at most 1.2e77) cannot overflow float64 nor can their sum, so a
/// NaN or an Inf is exactly what makes a sum non-finite; and a nonzero element's square is
/// nonzero in float64 (the smallest float32 denormal squared is 2e-90), so sum_sq > 0 is
/// exactly "some element is nonzero" (sum_sq != 0, so a NaN counts as nonzero, as it does
/// element by element). That saves two passes over every slice (the training gate runs this
/// over every weight and gradient: docs/real-size.md). Any other dtype (float64, whose squares
/// can overflow or underflow; complex) is checked element by element.
inline Float64Stats StatsOf(const torch::Tensor& t, int64_t chunk = kStatsChunk) {
  torch::NoGradGuard no_grad;
  Float64Stats s;
  const torch::Tensor flat = t.detach().reshape({-1});
  const torch::ScalarType type = flat.scalar_type();
  const bool wide = !(type == torch::kFloat || type == torch::kBFloat16 || type == torch::kHalf ||
                      c10::isIntegralType(type, /*includeBool=*/true));
  for (int64_t begin = 0; begin < flat.numel(); begin += chunk) {
    const torch::Tensor d =
        flat.slice(0, begin, std::min(begin + chunk, flat.numel())).to(torch::kDouble);
    if (wide) {
      s.finite = s.finite && torch::isfinite(d).all().item<bool>();
      s.any_nonzero = s.any_nonzero || (d != 0).any().item<bool>();
    }
    s.sum += d.sum().item<double>();
    s.sum_sq += d.pow(2).sum().item<double>();
  }
  if (!wide) {
    s.finite = std::isfinite(s.sum) && std::isfinite(s.sum_sq);
    s.any_nonzero = s.sum_sq != 0;
  }
  return s;
}

/// True when one sum over `t` (floating) proves every element finite: a NaN or an Inf makes
/// the sum NaN or infinite. One reduction, nothing of t's size allocated. False does not prove
/// a non-finite element (huge finite values can overflow the sum): count them then. Empty: true.
inline bool SumProvesFinite(const torch::Tensor& t) {
  return t.numel() == 0 || std::isfinite(t.sum().item<double>());
}

/// Hands the allocator's free memory back to the kernel (glibc malloc_trim(3)). Tensors below
/// glibc's mmap threshold (kMmapThresholdBytes: most of a layer's activations, and a small
/// layer's weights, gradients and optimizer state) live in malloc's heap, and freeing them
/// does not shrink the resident set: the runner calls this between phases, so one phase's
/// freed tensors do not count in the next one's peak, and the training gate between steps.
inline void ReturnFreedMemory() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

/// Resident memory of this process from /proc/self/status (proc(5)): VmHWM, the peak resident
/// set since the process started or since the last ResetPeakRss, and VmRSS, the current one.
struct ResidentMemory {
  std::optional<int64_t> peak_bytes;
  std::optional<int64_t> current_bytes;
};

inline ResidentMemory ReadResidentMemory() {
  ResidentMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    std::optional<int64_t>* field = line.rfind("VmHWM:", 0) == 0   ? &m.peak_bytes
                                    : line.rfind("VmRSS:", 0) == 0 ? &m.current_bytes
                                                                   : nullptr;
    if (field == nullptr) continue;
    try {
      *field = std::stoll(line.substr(6)) * 1024;  // "VmHWM:   123456 kB"
    } catch (const std::exception&) {
    }
  }
  return m;
}

/// Resets VmHWM to the current resident set: "5" written to /proc/self/clear_refs (Linux 4.0,
/// proc(5)). False where that is not possible (then the phase's peak is not reported).
inline bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

/// The size from which glibc serves an allocation with pages of its own (mmap), returned to
/// the kernel when it is freed: 16 MiB.
inline constexpr int kMmapThresholdBytes = 16 << 20;

/// Fixes glibc's mmap threshold at kMmapThresholdBytes and its heap-top trim threshold at twice
/// that (mallopt(3) M_MMAP_THRESHOLD, M_TRIM_THRESHOLD). By default the threshold adapts: it
/// rises to the largest mmapped block freed so far (up to 32 MiB), so once one phase freed
/// such a block, a later phase's mid-sized tensors (a Qwen2.5-0.5B MLP weight's gradient is
/// 17 MiB) come from the heap, and the holes that freed activations leave between them stay
/// resident: the training gate's peak was 8.98 GB after the inference gate and 8.57 GB without
/// it. Fixed, a phase's peak is what the phase holds, whatever ran before. RunGates calls it
/// first; idempotent.
inline void UseFixedMmapThreshold() {
#if defined(__GLIBC__)
  ::mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  ::mallopt(M_TRIM_THRESHOLD, 2 * kMmapThresholdBytes);
#endif
}

/// Steady-clock milliseconds (for durations).
inline double NowMsSteady() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Waits for queued GPU work, so wall times measure it (no-op on the CPU).
inline void SyncDevice(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

/// Positions [1, T] int64: start, start + 1, ...
inline torch::Tensor Positions(int64_t start, int64_t t, torch::Device device) {
  return torch::arange(start, start + t, torch::TensorOptions().dtype(torch::kLong).device(device))
      .unsqueeze(0);
}

/// One row of packed sequences, as trainers pack them: tokens and positions [1, T] (positions
/// restarting at 0 for each sequence), cu_seqlens [S + 1], on `device`.
struct Packed {
  torch::Tensor tokens;
  torch::Tensor positions;
  torch::Tensor cu_seqlens;
  std::vector<int64_t> bounds;  // cu_seqlens on the host
};

inline Packed Pack(const std::vector<torch::Tensor>& sequences, torch::Device device) {
  Packed p;
  std::vector<torch::Tensor> positions;
  p.bounds.push_back(0);
  for (const torch::Tensor& s : sequences) {
    positions.push_back(torch::arange(s.size(0), torch::kLong));
    p.bounds.push_back(p.bounds.back() + s.size(0));
  }
  p.tokens = torch::cat(sequences).unsqueeze(0).to(device);
  p.positions = torch::cat(positions).unsqueeze(0).to(device);
  p.cu_seqlens = torch::tensor(p.bounds, torch::kLong).to(device);
  return p;
}

/// True when an earlier gate left a loaded model (and its family/args); else sets `out`
/// UNKNOWN naming what is missing.
inline bool RequireLoadedModel(const GateContext& ctx, GateOutcome& out) {
  if (ctx.model && ctx.model_loaded && ctx.family && ctx.args) return true;
  out.Unknown(ctx.spec.Requested("load")
                  ? "no loaded model: phase load did not pass"
                  : "no loaded model: phase load was not requested");
  return false;
}

/// The model's parameter groups under checkpoint names: through the name table the load gate
/// built (ctx.adapter), or through the family's ToHf when it maps weights by code (the Python
/// lane; ToHfTensorsByCode). Needs phase load to have passed.
inline HfTensors HfNamesOf(const GateContext& ctx, const std::vector<ParamGroup>& groups) {
  if (ctx.family != nullptr && ctx.args && ctx.family->MapsWeightsByCode()) {
    return ToHfTensorsByCode(groups, *ctx.family, *ctx.args);
  }
  if (!ctx.adapter) {
    HfTensors none;
    none.unmapped.push_back("every parameter (no name table from phase load)");
    return none;
  }
  return ToHfTensors(groups, *ctx.adapter);
}

/// [T] float64 (LogitComparison::Add's per-position KL) as a JSON array of numbers.
inline std::vector<double> DoublesOf(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kDouble).cpu().contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

/// The artifact record of a file the gate wrote under `attempt_dir` at `rel`: its size and
/// SHA-256; an error names the file.
Result<Artifact> ArtifactOf(const std::filesystem::path& attempt_dir, const std::string& rel,
                            const std::string& name);

/// Writes `value` as JSON to `attempt_dir`/`rel` (creating its directory) and returns it as an
/// artifact named `name` (path relative to the attempt directory, size, SHA-256); an error
/// names the file.
Result<Artifact> WriteJsonArtifact(const std::filesystem::path& attempt_dir, const std::string& rel,
                                   const std::string& name, const nlohmann::json& value);

/// Where the two sides of a comparison with the bundle ran: upstream's site from the bundle,
/// ours from the context (the CPU's kernel family and this process's thread count).
/// "cuda" or "cpu": the device kind the cell runs on, as bundles name theirs.
inline const char* RunDeviceKind(const GateContext& ctx) {
  return ctx.device.is_cuda() ? "cuda" : "cpu";
}

/// The bundle's envelope of the cell's precision for a gate that compares the model with itself
/// (packing, logprob_parity), or null. Upstream's own spread between two of its paths bounds
/// ours only on the device kind it was measured on: another kind's kernels round a decode
/// step's and a forward's matrix products (or a packed row's) apart differently.
inline const Envelope* SelfComparisonEnvelope(const GateContext& ctx, const ReferenceBundle& ref) {
  const Envelope* e = ref.envelope.For(ctx.spec.precision);
  return e != nullptr && ref.device == RunDeviceKind(ctx) ? e : nullptr;
}

inline ComparisonSite SiteOf(const GateContext& ctx, const ReferenceBundle& ref) {
  ComparisonSite site{ctx.spec.precision, ref.device, RunDeviceKind(ctx),
                      ref.cpu_capability, CpuCapability()};
  site.reference_threads = ref.num_threads;
  site.run_threads = ctx.device.is_cuda() ? 0 : torch::get_num_threads();
  return site;
}

/// The comparison's claim (bars.h ClaimOf) as the gate's first figure, "claim", so that a
/// report showing a phase's first figures shows it; the envelope the bars came from, or that
/// the bundle has none, as figure "envelope".
inline void PutClaim(GateOutcome& out, bool within_bars, bool equal) {
  out.figures.insert(out.figures.begin(), Figure{"claim", ClaimOf(within_bars, equal), "text"});
}
inline void EnvelopeFigure(GateOutcome& out, const Envelope* envelope) {
  out.Text("envelope", envelope != nullptr
                           ? envelope->Describe()
                           : "none in the bundle: the site's own bars (equality on the same "
                             "kernels), so a correct adapter that computes in another order can "
                             "FAIL; add one with tools/refgen/envelope.py --bundle");
}

/// Reads the reference bundle on first use; on failure sets `out` BLOCKED naming the bundle and
/// the tensor or field at fault (the bundle is an outside input, not the adapter's).
bool RequireReference(GateContext& ctx, GateOutcome& out);

/// Runs the enclosing gate, on the CPU, with the bundle's intra-op thread count (reference.json
/// "num_threads"): LibTorch splits reductions by thread, so upstream's bits are reproduced only
/// at upstream's count. Restores the previous count when it goes out of scope. No-op on CUDA or
/// when the bundle does not say.
class ReferenceThreads {
 public:
  ReferenceThreads(const GateContext& ctx, const ReferenceBundle& ref)
      : before_(torch::get_num_threads()) {
    if (!ctx.device.is_cuda() && ref.num_threads > 0 && ref.num_threads != before_) {
      torch::set_num_threads(static_cast<int>(ref.num_threads));
      changed_ = true;
    }
  }
  ~ReferenceThreads() {
    if (changed_) torch::set_num_threads(before_);
  }
  ReferenceThreads(const ReferenceThreads&) = delete;
  ReferenceThreads& operator=(const ReferenceThreads&) = delete;

 private:
  int before_;
  bool changed_ = false;
};

}  // namespace gatehouse::worker::internal
