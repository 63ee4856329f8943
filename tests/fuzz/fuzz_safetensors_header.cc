// libFuzzer target for the safetensors reader (worker_lib/src/safetensors.cc). The input is a
// whole safetensors file: 8-byte little-endian header length, header JSON, data buffer.
//
// Each input is checked three ways:
//  1. In memory: the header and the data buffer are copied into heap blocks of exactly their
//     size and handed to ParseHeader; every tensor it accepts is read byte by byte, so an
//     offset outside the buffer is an AddressSanitizer report, and the accepted tensors must
//     tile the buffer (sorted by name, unique, dtype x shape == end - begin).
//  2. File::Open over the same bytes (a memfd, opened by its /proc/self/fd path): it must
//     accept exactly what (1) accepts, with the same tensors and metadata (the framing checks
//     of File::Open are replicated here from its documentation).
//  3. An accepted file is written again with WriteFile and reopened: same names, dtypes,
//     shapes, bytes and metadata.
// Any disagreement aborts, which libFuzzer reports as a crash with the input saved.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gatehouse/worker/safetensors.h"

namespace st = gatehouse::worker::safetensors;

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_safetensors_header: invariant violated: %s\n", what.c_str());
  std::abort();
}

#define FUZZ_CHECK(cond, what) \
  do {                         \
    if (!(cond)) Fail(std::string(#cond) + ": " + (what)); \
  } while (0)

// The file of the WriteFile round trip: on tmpfs when there is one (WriteFile fsyncs), one per
// process, removed after each input.
const std::filesystem::path& ScratchFile() {
  static const std::filesystem::path file = [] {
    std::string base = "/dev/shm";
    if (access(base.c_str(), W_OK) != 0) {
      const char* tmp = std::getenv("TMPDIR");
      base = tmp != nullptr ? tmp : "/tmp";
    }
    return std::filesystem::path(base) /
           ("gatehouse-fuzz-st." + std::to_string(getpid()) + ".safetensors");
  }();
  return file;
}

bool SameEntries(const std::vector<st::TensorInfo>& a, const std::vector<st::TensorInfo>& b,
                 bool compare_offsets) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape) {
      return false;
    }
    if (compare_offsets && (a[i].begin != b[i].begin || a[i].end != b[i].end)) return false;
  }
  return true;
}

// (1): ParseHeader over exact-size heap copies. Returns whether the input is a valid file.
bool CheckInMemory(const uint8_t* data, size_t size, std::vector<st::TensorInfo>* tensors_out,
                   std::map<std::string, std::string>* metadata_out) {
  if (size < 8) return false;
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, data, 8);
  if (header_bytes > st::kMaxHeaderBytes || header_bytes > size - 8) return false;
  const bool starts_with_brace = header_bytes > 0 && data[8] == '{';

  // Exact-size copies: reading one byte past either is an ASan report.
  std::vector<char> header(data + 8, data + 8 + header_bytes);
  const size_t buffer_bytes = size - 8 - static_cast<size_t>(header_bytes);
  std::unique_ptr<char[]> buffer(new char[buffer_bytes == 0 ? 1 : buffer_bytes]);
  if (buffer_bytes > 0) std::memcpy(buffer.get(), data + 8 + header_bytes, buffer_bytes);

  std::map<std::string, std::string> metadata;
  auto parsed = st::ParseHeader(std::string_view(header.data(), header.size()), buffer_bytes,
                                &metadata);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == gatehouse::StatusCode::kDataLoss,
               parsed.status().message());
    FUZZ_CHECK(!parsed.status().message().empty(), "empty error message");
    return false;
  }
  const std::vector<st::TensorInfo>& tensors = *parsed;

  uint64_t total = 0;
  unsigned checksum = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const st::TensorInfo& t = tensors[i];
    FUZZ_CHECK(i == 0 || tensors[i - 1].name < t.name, "tensors not sorted and unique: " + t.name);
    FUZZ_CHECK(t.name != "__metadata__", "metadata key returned as a tensor");
    FUZZ_CHECK(t.begin <= t.end && t.end <= buffer_bytes, "offsets outside the buffer: " + t.name);
    FUZZ_CHECK(st::ParseDtype(st::DtypeName(t.dtype)).ok(), "dtype name does not round-trip");
    uint64_t elements = 1;
    for (int64_t dim : t.shape) {
      FUZZ_CHECK(dim >= 0, "negative dim accepted: " + t.name);
      elements *= static_cast<uint64_t>(dim);  // cannot wrap: the byte count did not
    }
    FUZZ_CHECK(elements == t.num_elements(), "num_elements disagrees: " + t.name);
    FUZZ_CHECK(elements * st::DtypeSize(t.dtype) == t.end - t.begin,
               "dtype x shape != end - begin: " + t.name);
    for (uint64_t b = t.begin; b < t.end; ++b) checksum += static_cast<unsigned char>(buffer[b]);
    total += t.end - t.begin;
  }
  FUZZ_CHECK(total == buffer_bytes, "tensors do not cover the buffer exactly");
  (void)checksum;
  if (!starts_with_brace) return false;  // File::Open rejects it before ParseHeader
  *tensors_out = tensors;
  *metadata_out = std::move(metadata);
  return true;
}

// (2) and (3): File::Open over a memfd, then WriteFile and reopen.
void CheckFile(const uint8_t* data, size_t size, bool valid,
               const std::vector<st::TensorInfo>& tensors,
               const std::map<std::string, std::string>& metadata) {
  int fd = memfd_create("fuzz-safetensors", MFD_CLOEXEC);
  if (fd < 0) Fail("memfd_create failed");
  size_t written = 0;
  while (written < size) {
    ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) Fail("write to memfd failed");
    written += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto file = st::File::Open(path);
  close(fd);
  if (!file.ok()) {
    FUZZ_CHECK(!valid, "File::Open rejected what ParseHeader accepted: " +
                           file.status().message());
    FUZZ_CHECK(file.status().code() == gatehouse::StatusCode::kDataLoss,
               file.status().message());
    return;
  }
  FUZZ_CHECK(valid, "File::Open accepted what the in-memory check rejected");
  FUZZ_CHECK(SameEntries(file->tensors(), tensors, /*compare_offsets=*/true),
             "File::Open and ParseHeader disagree on the tensors");
  FUZZ_CHECK(file->metadata() == metadata, "File::Open and ParseHeader disagree on metadata");

  std::vector<st::TensorBytes> out;
  for (const st::TensorInfo& t : file->tensors()) {
    FUZZ_CHECK(file->Find(t.name) != nullptr && file->Find(t.name)->name == t.name,
               "Find misses " + t.name);
    std::string_view bytes = file->Bytes(t);
    FUZZ_CHECK(bytes.size() == t.end - t.begin, "Bytes has the wrong size: " + t.name);
    out.push_back({t.name, t.dtype, t.shape, bytes});
  }
  const std::filesystem::path& copy = ScratchFile();
  gatehouse::Status written_status = st::WriteFile(copy, out, file->metadata());
  FUZZ_CHECK(written_status.ok(), "WriteFile of a valid file failed: " + written_status.message());
  auto reread = st::File::Open(copy);
  unlink(copy.c_str());  // the mapping keeps the bytes
  FUZZ_CHECK(reread.ok(), "the rewritten file does not open: " + reread.status().message());
  FUZZ_CHECK(SameEntries(reread->tensors(), file->tensors(), /*compare_offsets=*/false),
             "the rewritten file has other tensors");
  FUZZ_CHECK(reread->metadata() == file->metadata(), "the rewritten file has other metadata");
  for (const st::TensorInfo& t : reread->tensors()) {
    FUZZ_CHECK(reread->Bytes(t) == file->Bytes(*file->Find(t.name)),
               "the rewritten file has other bytes for " + t.name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<st::TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  const bool valid = CheckInMemory(data, size, &tensors, &metadata);
  CheckFile(data, size, valid, tensors, metadata);
  return 0;
}
