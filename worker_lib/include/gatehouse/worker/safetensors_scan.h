// A finiteness scan of safetensors files read as a byte stream: the identity gate hashes every
// checkpoint file (common/sha256.h DirectoryDigest), and this scan counts each floating
// tensor's NaN and Inf elements from those same blocks, so the load gate need not read the
// weights a second time to prove them finite (docs/gate-facts.md "Loading at real sizes").
// Torch-free, like safetensors.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/sha256.h"
#include "gatehouse/worker/safetensors.h"

namespace gatehouse::worker::safetensors {

/// NaN and Inf elements of one tensor's stored bytes, with the offsets they were counted at
/// (relative to the data buffer, as TensorInfo).
struct NonFiniteCount {
  uint64_t begin = 0;
  uint64_t end = 0;
  int64_t nan = 0;
  int64_t inf = 0;
};

/// True for the dtypes whose non-finite values the scan recognises by their bits: F64, F32,
/// F16, BF16 (IEEE 754 layouts: exponent all ones; mantissa zero is Inf, else NaN).
bool ScanCoversDtype(Dtype dtype);

/// Counts, for every `*.safetensors` file it is shown, each floating tensor's NaN and Inf
/// elements (ScanCoversDtype). Works on blocks of any size and alignment. A file whose header
/// does not parse (as File::Open would refuse it) or whose byte count differs from its size
/// is left out: the load gate then checks its tensors itself, and reports the fault.
class FiniteScan : public DigestObserver {
 public:
  void BeginFile(const std::filesystem::path& relative, uint64_t size) override;
  void Bytes(std::string_view block) override;
  void EndFile() override;

  /// The counts of `tensor` in `file` (its path relative to the scanned directory), when the
  /// file was scanned in full and holds the tensor at [begin, end) with a covered dtype;
  /// nullopt otherwise (the caller then counts for itself).
  std::optional<NonFiniteCount> Find(const std::string& file, const std::string& tensor,
                                     uint64_t begin, uint64_t end) const;
  /// Bytes of floating tensors counted, over the files scanned in full.
  uint64_t bytes_counted() const { return bytes_counted_; }
  /// Files scanned in full.
  size_t files_scanned() const { return files_.size(); }

 private:
  void Data(std::string_view bytes);
  void Elements(const TensorInfo& tensor, std::string_view bytes);
  void FinishTensors();

  std::map<std::string, std::map<std::string, NonFiniteCount>> files_;
  uint64_t bytes_counted_ = 0;
  // The file being read.
  bool active_ = false;    // a .safetensors file whose stream is still followed
  std::string name_;
  uint64_t size_ = 0;
  uint64_t read_ = 0;      // bytes seen so far
  uint64_t header_len_ = 0;
  std::string head_;       // the 8 length bytes, then the header JSON
  bool parsed_ = false;
  std::vector<TensorInfo> tensors_;  // sorted by begin
  size_t at_ = 0;          // tensors_[at_] holds the next data byte
  uint64_t pos_ = 0;       // offset of the next data byte in the data buffer
  NonFiniteCount tensor_;  // tensors_[at_]'s counts so far
  std::string carry_;      // the bytes of an element split across blocks
  std::map<std::string, NonFiniteCount> counts_;
};

}  // namespace gatehouse::worker::safetensors
