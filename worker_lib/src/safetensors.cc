// safetensors reader and writer (format: huggingface/safetensors README "Format" and
// src/tensor.rs `Metadata::validate`; facts in docs/gate-facts.md).
#include "gatehouse/worker/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

namespace gatehouse::worker::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors bytes are little-endian; a big-endian host would need byte swaps");

using nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr uint64_t kLengthFieldBytes = 8;
// Deepest nesting of arrays/objects accepted in a header (a valid one needs 3). Deeper input is
// rejected while parsing: nlohmann's dump(), which error messages use, recurses once per
// level, and a header of 100k '[' overflowed the stack (found by
// tests/fuzz/fuzz_safetensors_header).
constexpr int kMaxJsonDepth = 64;

// Thrown by ParseRejectingDuplicates when the header nests deeper than kMaxJsonDepth.
struct TooDeep {};

struct DtypeRow {
  Dtype dtype;
  std::string_view name;
  uint64_t size;
};

// One row per Dtype, in enum order.
constexpr std::array<DtypeRow, 19> kDtypes = {{
    {Dtype::kBool, "BOOL", 1},
    {Dtype::kU8, "U8", 1},
    {Dtype::kI8, "I8", 1},
    {Dtype::kI16, "I16", 2},
    {Dtype::kU16, "U16", 2},
    {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2},
    {Dtype::kI32, "I32", 4},
    {Dtype::kU32, "U32", 4},
    {Dtype::kF32, "F32", 4},
    {Dtype::kF64, "F64", 8},
    {Dtype::kI64, "I64", 8},
    {Dtype::kU64, "U64", 8},
    {Dtype::kC64, "C64", 8},
    {Dtype::kF8_E5M2, "F8_E5M2", 1},
    {Dtype::kF8_E4M3, "F8_E4M3", 1},
    {Dtype::kF8_E8M0, "F8_E8M0", 1},
    {Dtype::kF8_E4M3FNUZ, "F8_E4M3FNUZ", 1},
    {Dtype::kF8_E5M2FNUZ, "F8_E5M2FNUZ", 1},
}};

constexpr bool RowsInEnumOrder() {
  for (size_t i = 0; i < kDtypes.size(); ++i) {
    if (static_cast<size_t>(kDtypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(RowsInEnumOrder(), "kDtypes is indexed by Dtype");

// Dtypes of the format whose elements are smaller than a byte; recognised, not supported.
constexpr std::array<std::string_view, 3> kSubByteDtypes = {"F4", "F6_E2M3", "F6_E3M2"};

std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::string OffsetsString(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// Bytes that `shape` of `dtype` needs; false on u64 overflow or a negative dim.
bool ByteLength(Dtype dtype, const std::vector<int64_t>& shape, uint64_t* bytes) {
  uint64_t n = DtypeSize(dtype);
  for (int64_t dim : shape) {
    if (dim < 0) return false;
    if (dim != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      return false;
    }
    n *= static_cast<uint64_t>(dim);
  }
  *bytes = n;
  return true;
}

// A JSON value's type for messages, e.g. "a string".
std::string Kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a float";
    default: return "an unsupported value";
  }
}

// A JSON value as short text for messages (long values cut).
std::string Show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMax = 80;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

// Parses JSON, rejecting a key repeated within one object (nlohmann keeps the last silently;
// the format forbids duplicates). Throws nlohmann's exceptions on bad JSON, TooDeep when
// arrays/objects nest deeper than kMaxJsonDepth.
// `duplicate` receives the first one, as "key 'k' at the top level" or "key 'k' inside 'obj'".
json ParseRejectingDuplicates(std::string_view text, std::string* duplicate) {
  struct Frame {
    std::string name;  // key under which this object sits ("" for the top level)
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Frame> frames;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        if (depth >= kMaxJsonDepth) throw TooDeep{};
        frames.push_back({frames.empty() ? std::string() : frames.back().last_key, {}, {}});
        break;
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) throw TooDeep{};
        break;
      case json::parse_event_t::object_end:
        if (!frames.empty()) frames.pop_back();
        break;
      case json::parse_event_t::key: {
        Frame& f = frames.back();
        f.last_key = parsed.get<std::string>();
        if (!f.keys.insert(f.last_key).second && duplicate->empty()) {
          *duplicate = "key " + Quote(f.last_key) +
                       (frames.size() == 1 ? " at the top level" : " inside " + Quote(f.name));
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), callback);
}

// Reads one tensor entry into `info`, checking field types, dims, and that dtype x shape needs
// exactly the bytes its offsets hold (how entries tile the buffer is CheckTiling's job).
Status ParseEntry(const std::string& name, const json& entry, TensorInfo* info) {
  const std::string where = "tensor " + Quote(name);
  if (!entry.is_object()) {
    return Status::DataLoss(where + ": entry is " + Kind(entry) + " (" + Show(entry) +
                            "), expected an object with dtype, shape and data_offsets");
  }
  info->name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return Status::DataLoss(where + ": field 'dtype' is missing");
  if (!dtype_it->is_string()) {
    return Status::DataLoss(where + ": field 'dtype' is " + Kind(*dtype_it) + " (" +
                            Show(*dtype_it) + "), expected a string");
  }
  Result<Dtype> dtype = ParseDtype(dtype_it->get<std::string>());
  if (!dtype.ok()) return Status::DataLoss(where + ": field 'dtype': " + dtype.status().message());
  info->dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return Status::DataLoss(where + ": field 'shape' is missing");
  if (!shape_it->is_array()) {
    return Status::DataLoss(where + ": field 'shape' is " + Kind(*shape_it) + " (" +
                            Show(*shape_it) + "), expected an array of integers");
  }
  info->shape.clear();
  for (size_t i = 0; i < shape_it->size(); ++i) {
    const json& dim = (*shape_it)[i];
    if (dim.is_number_integer() && !dim.is_number_unsigned() && dim.get<int64_t>() < 0) {
      return Status::DataLoss(where + ": field 'shape' " + Show(*shape_it) + " has negative dim " +
                              std::to_string(dim.get<int64_t>()) + " at index " +
                              std::to_string(i));
    }
    if (!dim.is_number_integer() ||
        (dim.is_number_unsigned() &&
         dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      return Status::DataLoss(where + ": field 'shape' " + Show(*shape_it) + " has dim " +
                              Show(dim) + " at index " + std::to_string(i) +
                              ", expected a non-negative 64-bit integer");
    }
    info->shape.push_back(dim.get<int64_t>());
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) {
    return Status::DataLoss(where + ": field 'data_offsets' is missing");
  }
  const json& offsets = *offsets_it;
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return Status::DataLoss(where + ": field 'data_offsets' is " + Show(offsets) +
                            ", expected [begin, end] of two non-negative integers");
  }
  info->begin = offsets[0].get<uint64_t>();
  info->end = offsets[1].get<uint64_t>();
  if (info->end < info->begin) {
    return Status::DataLoss(where + ": field 'data_offsets' " +
                            OffsetsString(info->begin, info->end) + " ends before it begins");
  }

  uint64_t needed = 0;
  if (!ByteLength(info->dtype, info->shape, &needed)) {
    return Status::DataLoss(where + ": dtype " + std::string(DtypeName(info->dtype)) +
                            " x shape " + ShapeString(info->shape) +
                            " overflows a 64-bit byte count");
  }
  const uint64_t held = info->end - info->begin;
  if (needed != held) {
    return Status::DataLoss(where + ": data_offsets " + OffsetsString(info->begin, info->end) +
                            " hold " + std::to_string(held) + " bytes but dtype " +
                            std::string(DtypeName(info->dtype)) + " x shape " +
                            ShapeString(info->shape) + " needs " + std::to_string(needed));
  }
  return Status::Ok();
}

// Checks that the tensors tile [0, buffer_bytes) exactly: in (begin, end) order each begins
// where the previous ended, and the last ends at buffer_bytes.
Status CheckTiling(const std::vector<TensorInfo>& tensors, uint64_t buffer_bytes) {
  std::vector<const TensorInfo*> order;
  order.reserve(tensors.size());
  for (const TensorInfo& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t expected = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* t : order) {
    const std::string where =
        "tensor " + Quote(t->name) + ": data_offsets " + OffsetsString(t->begin, t->end);
    const std::string after = previous == nullptr
                                  ? std::string("at the start of the data buffer")
                                  : "after tensor " + Quote(previous->name) + " ending at " +
                                        std::to_string(previous->end);
    if (t->begin > expected) {
      return Status::DataLoss(where + " leave a hole of " + std::to_string(t->begin - expected) +
                              " bytes " + after);
    }
    if (t->begin < expected) {  // only possible after a previous tensor
      return Status::DataLoss(where + " overlap tensor " + Quote(previous->name) + " ending at " +
                              std::to_string(previous->end));
    }
    if (t->end > buffer_bytes) {
      return Status::DataLoss(where + " run past the end of the data buffer, which holds " +
                              std::to_string(buffer_bytes) + " bytes");
    }
    expected = t->end;
    previous = t;
  }
  if (expected != buffer_bytes) {
    return Status::DataLoss("the data buffer holds " + std::to_string(buffer_bytes) +
                            " bytes but the tensors end at " + std::to_string(expected) + ": " +
                            std::to_string(buffer_bytes - expected) + " unused tail bytes");
  }
  return Status::Ok();
}

std::string Errno(int err) { return std::strerror(err); }

// Writes all of `bytes` to `fd`.
bool WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

Result<Dtype> ParseDtype(std::string_view name) {
  for (const DtypeRow& row : kDtypes) {
    if (row.name == name) return row.dtype;
  }
  for (std::string_view sub : kSubByteDtypes) {
    if (sub == name) {
      return Status::InvalidArgument("dtype " + Quote(name) +
                                     " is a sub-byte type, which this reader does not support");
    }
  }
  return Status::InvalidArgument("unknown dtype " + Quote(name));
}

std::string_view DtypeName(Dtype dtype) { return kDtypes[static_cast<size_t>(dtype)].name; }

uint64_t DtypeSize(Dtype dtype) { return kDtypes[static_cast<size_t>(dtype)].size; }

uint64_t TensorInfo::num_elements() const {
  uint64_t n = 1;
  for (int64_t dim : shape) n *= static_cast<uint64_t>(dim);
  return n;
}

Result<std::vector<TensorInfo>> ParseHeader(std::string_view header_json, uint64_t buffer_bytes,
                                            std::map<std::string, std::string>* metadata) {
  json header;
  std::string duplicate;
  try {
    header = ParseRejectingDuplicates(header_json, &duplicate);
  } catch (const json::exception& e) {
    return Status::DataLoss(std::string("header is not valid JSON: ") + e.what());
  } catch (const TooDeep&) {
    return Status::DataLoss("header nests JSON arrays/objects deeper than " +
                            std::to_string(kMaxJsonDepth) + " levels");
  }
  if (!duplicate.empty()) return Status::DataLoss("header has duplicate " + duplicate);
  if (!header.is_object()) {
    return Status::DataLoss("header is " + Kind(header) + ", expected a JSON object");
  }

  std::vector<TensorInfo> tensors;
  tensors.reserve(header.size());
  // nlohmann::json objects iterate in key order, so `tensors` ends up sorted by name.
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        return Status::DataLoss("field '__metadata__' is " + Kind(value) +
                                ", expected an object of string -> string");
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return Status::DataLoss("field '__metadata__': key " + Quote(mkey) + " has " +
                                  Kind(mvalue) + " value " + Show(mvalue) +
                                  ", expected a string");
        }
      }
      if (metadata != nullptr) {
        metadata->clear();
        for (const auto& [mkey, mvalue] : value.items()) {
          (*metadata)[mkey] = mvalue.get<std::string>();
        }
      }
      continue;
    }
    TensorInfo info;
    GH_RETURN_IF_ERROR(ParseEntry(key, value, &info));
    tensors.push_back(std::move(info));
  }
  GH_RETURN_IF_ERROR(CheckTiling(tensors, buffer_bytes));
  return tensors;
}

// ---------------------------------------------------------------------------------------------
// File

struct File::Impl {
  std::filesystem::path path;
  std::shared_ptr<void> mapping;  // whole file; munmap when the last holder goes
  size_t map_bytes = 0;
  bool copy_on_write = false;  // PROT_WRITE granted (MAP_PRIVATE either way)
  const char* buffer = nullptr;  // start of the data buffer inside the mapping
  uint64_t buffer_bytes = 0;
  std::vector<TensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
};

Result<File> File::Open(const std::filesystem::path& path) {
  const std::string where = "safetensors file " + Quote(path.string());
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::NotFound(where + ": cannot open: " + Errno(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::NotFound(where + ": cannot stat: " + Errno(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::NotFound(where + ": not a regular file");
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kLengthFieldBytes) {
    ::close(fd);
    return Status::DataLoss(where + ": file is " + std::to_string(file_bytes) +
                            " bytes, shorter than the 8-byte header length field");
  }

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->map_bytes = static_cast<size_t>(file_bytes);
  // Writable and private, so a tensor of it can become a parameter that training updates in
  // place (copy-on-write: the file never changes); read-only where that is refused.
  void* map = ::mmap(nullptr, impl->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  impl->copy_on_write = map != MAP_FAILED;
  if (map == MAP_FAILED) map = ::mmap(nullptr, impl->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    return Status::DataLoss(where + ": mmap of " + std::to_string(file_bytes) +
                            " bytes failed: " + Errno(map_err));
  }
  const size_t map_bytes = impl->map_bytes;
  impl->mapping = std::shared_ptr<void>(map, [map_bytes](void* p) { ::munmap(p, map_bytes); });
  const char* base = static_cast<const char*>(map);

  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, base, sizeof(header_bytes));  // little-endian host (static_assert)
  if (header_bytes > kMaxHeaderBytes) {
    return Status::DataLoss(where + ": header length " + std::to_string(header_bytes) +
                            " exceeds the limit of " + std::to_string(kMaxHeaderBytes) +
                            " bytes");
  }
  if (header_bytes > file_bytes - kLengthFieldBytes) {
    return Status::DataLoss(where + ": header length " + std::to_string(header_bytes) +
                            " runs past the end of the file (" + std::to_string(file_bytes) +
                            " bytes, so at most " +
                            std::to_string(file_bytes - kLengthFieldBytes) +
                            " bytes of header)");
  }
  std::string_view header(base + kLengthFieldBytes, static_cast<size_t>(header_bytes));
  if (header.empty() || header.front() != '{') {
    std::string first = "nothing";
    if (!header.empty()) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02x", static_cast<unsigned char>(header[0]));
      first = std::string("byte ") + hex;
    }
    return Status::DataLoss(where + ": header does not start with '{' (it starts with " + first +
                            ")");
  }
  impl->buffer = header.data() + header.size();
  impl->buffer_bytes = file_bytes - kLengthFieldBytes - header_bytes;
  Result<std::vector<TensorInfo>> tensors =
      ParseHeader(header, impl->buffer_bytes, &impl->metadata);
  if (!tensors.ok()) {
    // The sizes make a truncated file plain (tensor offsets count from the buffer's start).
    return tensors.status().WithContext(
        where + " (" + std::to_string(file_bytes) + " bytes: 8-byte length field, " +
        std::to_string(header_bytes) + "-byte header, " + std::to_string(impl->buffer_bytes) +
        "-byte data buffer)");
  }
  impl->tensors = std::move(tensors).value();
  return File(std::move(impl));
}

File::File(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

const std::filesystem::path& File::path() const { return impl_->path; }
const std::vector<TensorInfo>& File::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& File::metadata() const { return impl_->metadata; }

const TensorInfo* File::Find(std::string_view name) const {
  const auto& tensors = impl_->tensors;
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors.end() || it->name != name) return nullptr;
  return &*it;
}

std::string_view File::Bytes(const TensorInfo& info) const {
  // Guards against an info from another file; a validated info of this file always fits.
  if (info.end < info.begin || info.end > impl_->buffer_bytes) return {};
  return {impl_->buffer + info.begin, static_cast<size_t>(info.end - info.begin)};
}

bool File::copy_on_write() const { return impl_->copy_on_write; }
std::shared_ptr<void> File::SharedMapping() const { return impl_->mapping; }

void File::Release(const TensorInfo& info) const {
  if (info.end <= info.begin || info.end > impl_->buffer_bytes) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(impl_->buffer + info.begin);
  const uintptr_t end = reinterpret_cast<uintptr_t>(impl_->buffer + info.end);
  const uintptr_t first = (begin + page - 1) / page * page;  // pages wholly inside [begin, end)
  const uintptr_t last = end / page * page;
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

// ---------------------------------------------------------------------------------------------
// Writer

Status WriteFile(const std::filesystem::path& path, const std::vector<TensorBytes>& tensors,
                 const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorBytes*> sorted;
  sorted.reserve(tensors.size());
  for (const TensorBytes& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorBytes* a, const TensorBytes* b) { return a->name < b->name; });

  json header = json::object();
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorBytes& t = *sorted[i];
    const std::string where = "tensor " + Quote(t.name);
    if (t.name == kMetadataKey) {
      return Status::InvalidArgument(where + ": the name is reserved for metadata");
    }
    if (i > 0 && sorted[i - 1]->name == t.name) {
      return Status::InvalidArgument(where + ": duplicate tensor name");
    }
    uint64_t needed = 0;
    if (!ByteLength(t.dtype, t.shape, &needed)) {
      return Status::InvalidArgument(where + ": shape " + ShapeString(t.shape) +
                                     " has a negative dim or overflows a 64-bit byte count");
    }
    if (needed != t.bytes.size()) {
      return Status::InvalidArgument(where + ": " + std::to_string(t.bytes.size()) +
                                     " bytes given but dtype " + std::string(DtypeName(t.dtype)) +
                                     " x shape " + ShapeString(t.shape) + " needs " +
                                     std::to_string(needed));
    }
    header[t.name] = {{"dtype", std::string(DtypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + needed}}};
    offset += needed;
  }
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("a tensor name or metadata entry is not valid "
                                               "UTF-8: ") +
                                   e.what());
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  char length[kLengthFieldBytes];
  const uint64_t header_bytes = header_text.size();
  std::memcpy(length, &header_bytes, sizeof(length));  // little-endian host (static_assert)

  std::filesystem::path tmp = path;
  tmp += ".tmp";
  const std::string where = "safetensors file " + Quote(tmp.string());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::DataLoss(where + ": cannot create: " + Errno(errno));
  bool ok = WriteAll(fd, std::string_view(length, sizeof(length))) && WriteAll(fd, header_text);
  for (size_t i = 0; ok && i < sorted.size(); ++i) ok = WriteAll(fd, sorted[i]->bytes);
  int err = errno;
  if (ok && ::fsync(fd) != 0) {
    ok = false;
    err = errno;
  }
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return Status::DataLoss(where + ": write failed: " + Errno(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    return Status::DataLoss(where + ": rename to " + Quote(path.string()) +
                            " failed: " + Errno(err));
  }
  return Status::Ok();
}

}  // namespace gatehouse::worker::safetensors
