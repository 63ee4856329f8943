// The finiteness scan over a safetensors byte stream (safetensors_scan.h). Bit layouts: IEEE
// 754 binary64/32/16 and bfloat16 (binary32's upper half): a value is non-finite exactly when
// its exponent field is all ones; then a zero mantissa is an infinity and any other a NaN.
#include "gatehouse/worker/safetensors_scan.h"

#include <algorithm>
#include <cstring>

namespace gatehouse::worker::safetensors {

namespace {

template <typename U>
struct Layout {
  U exponent;
  U mantissa;
};

constexpr Layout<uint64_t> kF64{0x7ff0000000000000ull, 0x000fffffffffffffull};
constexpr Layout<uint32_t> kF32{0x7f800000u, 0x007fffffu};
constexpr Layout<uint16_t> kF16{0x7c00u, 0x03ffu};
constexpr Layout<uint16_t> kBF16{0x7f80u, 0x007fu};

// Elements of `count` little-endian values at `p` whose exponent is all ones. A branch-free
// loop the compiler vectorises (this file is built at -O3): the common case, no such element,
// costs one pass at memory speed over bytes the digest just brought into cache.
template <typename U>
uint64_t CountExponentAllOnes(const char* p, size_t count, U exponent) {
  uint64_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    U x;
    std::memcpy(&x, p + i * sizeof(U), sizeof(U));
    n += (x & exponent) == exponent;
  }
  return n;
}

template <typename U>
void Count(const char* p, size_t count, const Layout<U>& layout, NonFiniteCount* into) {
  if (CountExponentAllOnes(p, count, layout.exponent) == 0) return;
  for (size_t i = 0; i < count; ++i) {
    U x;
    std::memcpy(&x, p + i * sizeof(U), sizeof(U));
    if ((x & layout.exponent) != layout.exponent) continue;
    ((x & layout.mantissa) == 0 ? into->inf : into->nan) += 1;
  }
}

void CountAs(Dtype dtype, const char* p, size_t count, NonFiniteCount* into) {
  switch (dtype) {
    case Dtype::kF64: return Count(p, count, kF64, into);
    case Dtype::kF32: return Count(p, count, kF32, into);
    case Dtype::kF16: return Count(p, count, kF16, into);
    case Dtype::kBF16: return Count(p, count, kBF16, into);
    default: return;
  }
}

}  // namespace

bool ScanCoversDtype(Dtype dtype) {
  return dtype == Dtype::kF64 || dtype == Dtype::kF32 || dtype == Dtype::kF16 ||
         dtype == Dtype::kBF16;
}

void FiniteScan::BeginFile(const std::filesystem::path& relative, uint64_t size) {
  name_ = relative.generic_string();
  size_ = size;
  read_ = 0;
  header_len_ = 0;
  head_.clear();
  parsed_ = false;
  tensors_.clear();
  at_ = 0;
  pos_ = 0;
  tensor_ = {};
  carry_.clear();
  counts_.clear();
  active_ = relative.extension() == ".safetensors" && size >= 8;
}

void FiniteScan::Bytes(std::string_view block) {
  if (!active_) return;
  read_ += block.size();
  if (read_ > size_) {  // the file grew while it was read: its counts would not be its digest's
    active_ = false;
    return;
  }
  if (!parsed_) {
    if (head_.size() < 8) {
      const size_t take = std::min<size_t>(8 - head_.size(), block.size());
      head_.append(block.substr(0, take));
      block.remove_prefix(take);
      if (head_.size() < 8) return;
      uint64_t len = 0;
      for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(head_[i]);
      if (len > kMaxHeaderBytes || len > size_ - 8) {
        active_ = false;
        return;
      }
      header_len_ = len;
      head_.reserve(8 + len);
    }
    const size_t take = std::min<size_t>(8 + header_len_ - head_.size(), block.size());
    head_.append(block.substr(0, take));
    block.remove_prefix(take);
    if (head_.size() < 8 + header_len_) return;
    Result<std::vector<TensorInfo>> parsed = ParseHeader(
        std::string_view(head_).substr(8), size_ - 8 - header_len_, /*metadata=*/nullptr);
    std::string().swap(head_);
    if (!parsed.ok()) {
      active_ = false;
      return;
    }
    tensors_ = std::move(parsed).value();
    std::stable_sort(tensors_.begin(), tensors_.end(),
                     [](const TensorInfo& a, const TensorInfo& b) { return a.begin < b.begin; });
    parsed_ = true;
    FinishTensors();  // tensors of no bytes at the start
  }
  Data(block);
}

void FiniteScan::FinishTensors() {
  while (at_ < tensors_.size() && tensors_[at_].end <= pos_) {
    const TensorInfo& t = tensors_[at_];
    if (ScanCoversDtype(t.dtype)) {
      tensor_.begin = t.begin;
      tensor_.end = t.end;
      counts_.emplace(t.name, tensor_);
    }
    tensor_ = {};
    carry_.clear();  // empty already: a tensor's bytes are whole elements (ParseHeader)
    ++at_;
  }
}

void FiniteScan::Data(std::string_view bytes) {
  while (!bytes.empty() && at_ < tensors_.size()) {
    const TensorInfo& t = tensors_[at_];
    const size_t take = static_cast<size_t>(std::min<uint64_t>(bytes.size(), t.end - pos_));
    if (ScanCoversDtype(t.dtype)) Elements(t, bytes.substr(0, take));
    pos_ += take;
    bytes.remove_prefix(take);
    FinishTensors();
  }
}

void FiniteScan::Elements(const TensorInfo& tensor, std::string_view bytes) {
  const size_t width = static_cast<size_t>(DtypeSize(tensor.dtype));
  if (!carry_.empty()) {  // an element split between the previous block and this one
    const size_t take = std::min(width - carry_.size(), bytes.size());
    carry_.append(bytes.substr(0, take));
    bytes.remove_prefix(take);
    if (carry_.size() < width) return;
    CountAs(tensor.dtype, carry_.data(), 1, &tensor_);
    carry_.clear();
  }
  const size_t whole = bytes.size() / width;
  CountAs(tensor.dtype, bytes.data(), whole, &tensor_);
  carry_.assign(bytes.substr(whole * width));
}

void FiniteScan::EndFile() {
  if (active_ && parsed_ && read_ == size_ && at_ == tensors_.size()) {
    for (const auto& [name, count] : counts_) bytes_counted_ += count.end - count.begin;
    files_[name_] = std::move(counts_);
  }
  active_ = false;
  counts_.clear();
  tensors_.clear();
}

std::optional<NonFiniteCount> FiniteScan::Find(const std::string& file, const std::string& tensor,
                                               uint64_t begin, uint64_t end) const {
  auto f = files_.find(file);
  if (f == files_.end()) return std::nullopt;
  auto t = f->second.find(tensor);
  if (t == f->second.end() || t->second.begin != begin || t->second.end != end) {
    return std::nullopt;
  }
  return t->second;
}

}  // namespace gatehouse::worker::safetensors
