// Memory admission: how much host and GPU memory each process of a cell needs, estimated before
// the cell is scheduled from its checkpoint's bytes and dtype, its precision, phases and
// topology, and corrected by the peaks earlier attempts measured (docs/scheduling.md "Memory").
// Pure arithmetic except ReadCheckpointFacts, which reads the checkpoint directory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/cell_spec.h"
#include "common/status.h"

namespace gatehouse::controller {

/// What a checkpoint's memory depends on, read once per checkpoint digest.
struct CheckpointFacts {
  /// Bytes of the weight files (*.safetensors, else *.bin / *.pt), headers included.
  int64_t bytes = 0;
  /// config.json's "torch_dtype" (or "dtype"), as written ("bfloat16"); empty when absent.
  std::string dtype;
  /// Bytes per element of `dtype`: float32 4, bfloat16 / float16 2, float64 8; 4 when absent
  /// or unknown (transformers' default).
  int element_bytes = 4;
  /// bytes / element_bytes: the parameter count the estimate works with.
  int64_t parameters() const { return element_bytes > 0 ? bytes / element_bytes : bytes; }
  bool operator==(const CheckpointFacts&) const = default;
};

/// Reads the facts of a Hugging Face checkpoint directory: the weight files' sizes (stat only,
/// nothing is read from them) and config.json's dtype. Errors: NOT_FOUND when `dir` holds no
/// weight file; INVALID_ARGUMENT when config.json exists and is not a JSON object.
Result<CheckpointFacts> ReadCheckpointFacts(const std::filesystem::path& dir);

/// The processes an attempt starts, by role.
inline constexpr std::string_view kReferenceRunnerRole = "reference runner";
inline constexpr std::string_view kWorkerRankRole = "worker rank";

/// One kind of process of an attempt: `count` of them, each needing about `host_bytes` of the
/// node's memory and `device_bytes` of one GPU's (0 for a CPU cell).
struct ProcessMemory {
  std::string role;  // kReferenceRunnerRole | kWorkerRankRole
  int count = 1;
  int64_t host_bytes = 0;
  int64_t device_bytes = 0;
  /// How the figure was reached: "formula" or "formula x 1.31 (measured peaks)" or
  /// "measured 5.0 GB + 10% (attempt 17)".
  std::string basis;
  bool operator==(const ProcessMemory&) const = default;
};

/// A cell's estimate. Empty (no processes) when nothing is known: it is then not checked.
struct MemoryEstimate {
  std::vector<ProcessMemory> processes;
  /// Host memory of the whole attempt on one node: the sum of count x host_bytes.
  int64_t host_bytes() const;
  /// The most GPU memory one of its processes needs (each rank has a GPU of its own).
  int64_t device_bytes_per_gpu() const;
  bool empty() const { return processes.empty(); }
  /// "reference runner ~5.8 GB" or "2 worker ranks ~3.1 GB each (6.2 GB)", "; " between
  /// roles, with " host" / " GPU" where both are given.
  std::string Describe() const;
  bool operator==(const MemoryEstimate&) const = default;
};

/// A peak an earlier attempt measured for one role, and the formula's estimate for it then.
struct MeasuredPeak {
  int64_t attempt_id = 0;
  std::string role;
  /// The cell's memory key (MemoryKey): the same key, the same processes on the same input.
  std::string memory_key;
  int64_t estimate_bytes = 0;  // the uncalibrated formula's host_bytes per process
  int64_t peak_bytes = 0;      // measured per process (its peak RSS, or the limit it hit)
};

/// What earlier attempts taught: peaks by memory key, and per role the largest ratio of a
/// measured peak to the formula (at least 1), which scales later estimates of that role.
struct MemoryCalibration {
  std::map<std::string, double> factor;            // role -> >= 1
  std::map<std::string, MeasuredPeak> by_key;      // "<memory key>/<role>" -> latest peak
  /// Built from peaks, newest last; only ratios of the newest `window` per role count.
  static MemoryCalibration From(const std::vector<MeasuredPeak>& peaks, size_t window = 20);
};

/// The key of a cell's memory behaviour: a digest over what the estimate reads (checkpoint
/// digest, kind, device, precision, topology, phases, decode and training lengths), so two
/// cells that differ only in repository, commit or family share measured peaks.
std::string MemoryKey(const CellSpec& spec);

/// The estimate of `spec` on a checkpoint with `facts` (docs/scheduling.md "Memory" gives the
/// formula and where its coefficients were measured). A peak measured for the same memory key
/// and role replaces the formula (+10%); otherwise the formula is scaled by the role's factor.
MemoryEstimate EstimateMemory(const CellSpec& spec, const CheckpointFacts& facts,
                              const MemoryCalibration& calibration = {});

/// "5.8 GB" (decimal units, one decimal; "512 MB" below a GB).
std::string FormatGigabytes(int64_t bytes);

}  // namespace gatehouse::controller
