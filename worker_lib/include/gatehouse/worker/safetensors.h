// Our safetensors reader and writer (format: huggingface/safetensors README "Format"; facts in
// docs/gate-facts.md). The reader memory-maps the file and validates the header before any
// tensor is touched. This header is torch-free (so the parser can be fuzzed on its own); the
// LibTorch bridge is safetensors_torch.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gatehouse::worker::safetensors {

/// Largest header accepted, in bytes (upstream's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// Element types of the format. Sub-byte types (F4, F6_*) are recognised and rejected with a
/// clear error by the reader (no gate needs them yet).
enum class Dtype {
  kBool, kU8, kI8, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64, kC64,
  kF8_E5M2, kF8_E4M3, kF8_E8M0, kF8_E4M3FNUZ, kF8_E5M2FNUZ,
};

/// "BF16" -> kBF16. Errors: INVALID_ARGUMENT naming the string.
Result<Dtype> ParseDtype(std::string_view name);
std::string_view DtypeName(Dtype dtype);
/// Bytes per element.
uint64_t DtypeSize(Dtype dtype);

/// One header entry. Offsets are relative to the start of the byte buffer; end is exclusive.
struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t num_elements() const;
};

/// Parses and validates a header JSON for a buffer of `buffer_bytes`. Checks: a JSON object;
/// every entry has dtype/shape/data_offsets of the right types; no negative dims; dtype x shape
/// = end - begin; offsets tile the buffer exactly (sorted by begin, each begins where the
/// previous ended, the last ends at buffer_bytes; no overlap, no hole); `__metadata__` is
/// string -> string; arrays/objects nest at most 64 levels. Errors: DATA_LOSS naming the
/// tensor, the field and the values.
/// Returns tensors in header-key order (sorted by name) and fills `metadata` if non-null.
Result<std::vector<TensorInfo>> ParseHeader(std::string_view header_json, uint64_t buffer_bytes,
                                            std::map<std::string, std::string>* metadata);

/// A memory-mapped, validated safetensors file. Movable, not copyable. The mapping is private
/// (MAP_PRIVATE) and, where the kernel allows, writable: a write changes this process's copy
/// of the page only (copy-on-write), never the file. It lives as long as the File or the
/// longest-lived holder of SharedMapping(). Thread-safe for concurrent reads.
class File {
 public:
  /// Opens and validates `path`: at least 8 bytes, header length <= kMaxHeaderBytes and within
  /// the file, header starts with '{', then ParseHeader over the rest of the file.
  /// Errors: NOT_FOUND (cannot open), DATA_LOSS (truncated or lying header), naming the path;
  /// a ParseHeader error also gets the file, header and data buffer sizes in bytes.
  static Result<File> Open(const std::filesystem::path& path);

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::filesystem::path& path() const;
  const std::vector<TensorInfo>& tensors() const;
  const std::map<std::string, std::string>& metadata() const;
  /// nullptr when absent.
  const TensorInfo* Find(std::string_view name) const;
  /// The raw little-endian bytes of a tensor of this file.
  std::string_view Bytes(const TensorInfo& info) const;
  /// Drops the pages that lie wholly inside the tensor's bytes from this process's resident
  /// set (madvise MADV_DONTNEED on the private mapping): the page cache keeps them and a later
  /// read maps them again. A loader calls it once a tensor is copied out, so reading a whole
  /// checkpoint does not leave every page of it resident beside the model. Only for a tensor
  /// nothing wrote: a page written copy-on-write would lose the write.
  void Release(const TensorInfo& info) const;
  /// True when the mapping is writable copy-on-write (PROT_READ | PROT_WRITE, MAP_PRIVATE);
  /// false when only a read-only mapping could be made (a strict overcommit policy can refuse
  /// a large writable private mapping): then a tensor viewing it must never be written.
  bool copy_on_write() const;
  /// The whole-file mapping, shared: a tensor that views it holds this, so the bytes outlive
  /// the File (a parameter adopted from the checkpoint, docs/gate-facts.md "Loading at real
  /// sizes").
  std::shared_ptr<void> SharedMapping() const;

 private:
  struct Impl;
  explicit File(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A tensor to write: raw little-endian bytes with dtype and shape.
struct TensorBytes {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  std::string_view bytes;  // must be num_elements x DtypeSize bytes
};

/// Writes a safetensors file: header with keys sorted by name, offsets in that order, header
/// padded with spaces to a multiple of 8. Writes to `path.tmp` then renames (no half file).
/// Errors: INVALID_ARGUMENT (duplicate name, byte length != dtype x shape), DATA_LOSS (I/O).
Status WriteFile(const std::filesystem::path& path, const std::vector<TensorBytes>& tensors,
                 const std::map<std::string, std::string>& metadata);

}  // namespace gatehouse::worker::safetensors
