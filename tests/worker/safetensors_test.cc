// Tests of the safetensors reader and writer (worker_lib/include/gatehouse/worker/safetensors.h)
// and its LibTorch bridge. Corrupt files are written byte by byte here.
#include "gatehouse/worker/safetensors.h"

#include <gtest/gtest.h>

#include "tests/common/temp_dir.h"
#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "gatehouse/worker/safetensors_torch.h"

namespace gatehouse::worker::safetensors {
namespace {

namespace fs = std::filesystem;

constexpr Dtype kAllDtypes[] = {
    Dtype::kBool, Dtype::kU8,          Dtype::kI8,          Dtype::kI16,    Dtype::kU16,
    Dtype::kF16,  Dtype::kBF16,        Dtype::kI32,         Dtype::kU32,    Dtype::kF32,
    Dtype::kF64,  Dtype::kI64,         Dtype::kU64,         Dtype::kC64,    Dtype::kF8_E5M2,
    Dtype::kF8_E4M3, Dtype::kF8_E8M0,  Dtype::kF8_E4M3FNUZ, Dtype::kF8_E5M2FNUZ,
};

testing::AssertionResult Contains(const std::string& message, const std::string& part) {
  if (message.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << part << "\"";
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `n` deterministic, varied bytes; for BOOL only 0 and 1.
std::string PatternBytes(size_t n, Dtype dtype) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<char>(dtype == Dtype::kBool ? i % 2 : (i * 37 + 11) % 251);
  }
  return out;
}

using ScratchDir = gatehouse::test_util::TempDir;

class SafetensorsTest : public testing::Test {
 protected:
  // Writes an 8-byte little-endian length (default: the header's size), the header, the buffer.
  fs::path WriteRaw(std::string_view header, std::string_view buffer,
                    std::optional<uint64_t> length = std::nullopt) {
    fs::path path = dir_ / "raw.safetensors";
    uint64_t n = length.value_or(header.size());
    char field[8];
    for (int i = 0; i < 8; ++i) field[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(field, 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    return path;
  }

  // The status of opening a raw file made of `header` and `buffer`.
  Status OpenRaw(std::string_view header, std::string_view buffer,
                 std::optional<uint64_t> length = std::nullopt) {
    return File::Open(WriteRaw(header, buffer, length)).status();
  }

  ScratchDir scratch_{"safetensors_test"};
  const fs::path dir_ = scratch_.path();
};

// ---------------------------------------------------------------------------------------------
// Dtypes and the torch-free writer/reader

// Every dtype name parses back to itself, sizes are right, sub-byte and unknown names are errors.
TEST(DtypeTest, NamesRoundTripAndBadNamesAreRejected) {
  for (Dtype d : kAllDtypes) {
    Result<Dtype> parsed = ParseDtype(DtypeName(d));
    ASSERT_TRUE(parsed.ok()) << DtypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DtypeSize(Dtype::kBF16), 2u);
  EXPECT_EQ(DtypeSize(Dtype::kC64), 8u);
  EXPECT_EQ(DtypeSize(Dtype::kF8_E4M3), 1u);
  Status sub = ParseDtype("F6_E2M3").status();
  EXPECT_EQ(sub.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(sub.message(), "dtype 'F6_E2M3' is a sub-byte type"));
  Status unknown = ParseDtype("bf16").status();
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(unknown.message(), "unknown dtype 'bf16'"));
}

// WriteFile then File::Open returns every dtype's bytes, shape and the metadata unchanged.
TEST_F(SafetensorsTest, RawRoundTripOfEveryDtype) {
  std::vector<std::string> storage;
  std::vector<TensorBytes> tensors;
  storage.reserve(std::size(kAllDtypes));
  for (Dtype d : kAllDtypes) {
    storage.push_back(PatternBytes(2 * 3 * DtypeSize(d), d));
    tensors.push_back({"t." + std::string(DtypeName(d)), d, {2, 3}, storage.back()});
  }
  const fs::path path = dir_ / "all.safetensors";
  ASSERT_TRUE(WriteFile(path, tensors, {{"format", "pt"}}).ok());

  Result<File> file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo* info = file->Find(tensors[i].name);
    ASSERT_NE(info, nullptr) << tensors[i].name;
    EXPECT_EQ(info->dtype, tensors[i].dtype);
    EXPECT_EQ(info->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(file->Bytes(*info), storage[i]) << tensors[i].name;
  }
  EXPECT_EQ(file->Find("absent"), nullptr);
}

// The writer sorts keys, lays offsets out in that order, pads the header with spaces to a
// multiple of 8, and leaves no .tmp file behind.
TEST_F(SafetensorsTest, WriterLayoutIsSortedAndPadded) {
  std::string a(4, 'a'), b(8, 'b');
  const fs::path path = dir_ / "layout.safetensors";
  ASSERT_TRUE(WriteFile(path, {{"zeta", Dtype::kF64, {1}, b}, {"alpha", Dtype::kI32, {1}, a}},
                        {})
                  .ok());
  EXPECT_FALSE(fs::exists(dir_ / "layout.safetensors.tmp"));

  const std::string raw = ReadAll(path);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = raw.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  EXPECT_LT(header.find("\"alpha\""), header.find("\"zeta\""));
  EXPECT_EQ(raw.substr(8 + n), a + b);

  Result<File> file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->tensors()[0].name, "alpha");
  EXPECT_EQ(file->tensors()[0].begin, 0u);
  EXPECT_EQ(file->tensors()[1].begin, 4u);
  EXPECT_EQ(file->tensors()[1].end, 12u);
}

// The writer refuses a duplicate name and a byte length that disagrees with dtype x shape,
// naming the tensor, and writes no file.
TEST_F(SafetensorsTest, WriterRejectsDuplicateNameAndWrongLength) {
  std::string four(4, 'x');
  const fs::path path = dir_ / "bad.safetensors";
  Status dup = WriteFile(path, {{"w", Dtype::kF32, {1}, four}, {"w", Dtype::kF32, {1}, four}}, {});
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(dup.message(), "tensor 'w': duplicate tensor name"));

  Status len = WriteFile(path, {{"w", Dtype::kF32, {2}, four}}, {});
  EXPECT_EQ(len.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(len.message(), "tensor 'w': 4 bytes given but dtype F32 x shape [2] needs 8"));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(dir_ / "bad.safetensors.tmp"));
}

// Empty tensors (a zero dim) and 0-rank scalars round trip; an all-empty file has no buffer.
TEST_F(SafetensorsTest, EmptyAndScalarTensorsRoundTrip) {
  std::string scalar = PatternBytes(4, Dtype::kF32);
  const fs::path path = dir_ / "edge.safetensors";
  ASSERT_TRUE(WriteFile(path,
                        {{"empty", Dtype::kF32, {0}, {}},
                         {"empty3d", Dtype::kBF16, {2, 0, 3}, {}},
                         {"scalar", Dtype::kF32, {}, scalar}},
                        {})
                  .ok());
  Result<File> file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const TensorInfo* empty = file->Find("empty3d");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->shape, (std::vector<int64_t>{2, 0, 3}));
  EXPECT_EQ(empty->num_elements(), 0u);
  EXPECT_TRUE(file->Bytes(*empty).empty());
  const TensorInfo* s = file->Find("scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->num_elements(), 1u);
  EXPECT_EQ(file->Bytes(*s), scalar);

  Result<torch::Tensor> t = ReadTensor(*file, *s);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->dim(), 0);
  Result<torch::Tensor> e = ReadTensor(*file, *empty);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->sizes().vec(), (std::vector<int64_t>{2, 0, 3}));
  EXPECT_EQ(e->scalar_type(), torch::kBFloat16);

  ASSERT_TRUE(WriteFile(dir_ / "none.safetensors", {}, {}).ok());
  Result<File> none = File::Open(dir_ / "none.safetensors");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->tensors().empty());
}

// ---------------------------------------------------------------------------------------------
// Corrupt files

// A file shorter than the 8-byte length field is DATA_LOSS naming the file and its size.
TEST_F(SafetensorsTest, FileShorterThanLengthField) {
  const fs::path path = dir_ / "short.safetensors";
  std::ofstream(path, std::ios::binary) << "abcde";
  Status s = File::Open(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), path.string()));
  EXPECT_TRUE(Contains(s.message(), "file is 5 bytes, shorter than the 8-byte header length"));
}

// A header length beyond the end of the file is DATA_LOSS naming the length and file size.
TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  Status s = OpenRaw("{}", "", /*length=*/64);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "raw.safetensors"));
  EXPECT_TRUE(Contains(s.message(), "header length 64 runs past the end of the file (10 bytes"));
}

// A buffer shorter than a tensor's offsets (a truncated file) names the tensor and sizes.
TEST_F(SafetensorsTest, BufferShorterThanOffsets) {
  Status s = OpenRaw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                     std::string(8, '\0'));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "raw.safetensors"));
  EXPECT_TRUE(Contains(s.message(), "tensor 'w': data_offsets [0, 16] run past the end of the "
                                    "data buffer, which holds 8 bytes"));
}

// A header that is not JSON is DATA_LOSS saying so.
TEST_F(SafetensorsTest, HeaderNotJson) {
  Status s = OpenRaw(R"({"w": {"dtype": "F32",)", "");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "header is not valid JSON"));
}

// A header that does not start with '{' (an array, or leading spaces) is DATA_LOSS naming the
// first byte.
TEST_F(SafetensorsTest, HeaderNotStartingWithBrace) {
  Status array = OpenRaw("[1, 2]", "");
  EXPECT_EQ(array.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(array.message(), "header does not start with '{' (it starts with byte 0x5b)"));
  Status spaces = OpenRaw("  {}", "");
  EXPECT_EQ(spaces.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(spaces.message(), "(it starts with byte 0x20)"));
}

// A tensor name given twice, or a field repeated inside an entry, is DATA_LOSS naming the key.
TEST_F(SafetensorsTest, DuplicateKey) {
  Status tensor = OpenRaw(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                          "x");
  EXPECT_EQ(tensor.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(tensor.message(), "header has duplicate key 'w' at the top level"));

  Status field = OpenRaw(R"({"w":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})",
                         "x");
  EXPECT_EQ(field.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(field.message(), "header has duplicate key 'dtype' inside 'w'"));
}

// Two tensors sharing bytes is DATA_LOSS naming both and the offsets.
TEST_F(SafetensorsTest, OverlappingOffsets) {
  Status s = OpenRaw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                     std::string(12, '\0'));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "tensor 'b': data_offsets [4, 12] overlap tensor 'a' ending at 8"));
}

// Unclaimed bytes between two tensors are DATA_LOSS naming the tensor after the hole and its size.
TEST_F(SafetensorsTest, HoleBetweenTensors) {
  Status s = OpenRaw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                     std::string(12, '\0'));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(),
                       "tensor 'b': data_offsets [8, 12] leave a hole of 4 bytes after tensor 'a'"));
}

// Bytes after the last tensor are DATA_LOSS naming the buffer size and where tensors end.
TEST_F(SafetensorsTest, UnusedTailBytes) {
  Status s = OpenRaw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                     std::string(8, '\0'));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "the data buffer holds 8 bytes but the tensors end at 4: 4 "
                                    "unused tail bytes"));
}

// Offsets holding a byte count other than dtype x shape is DATA_LOSS naming all the values.
TEST_F(SafetensorsTest, ByteLengthDisagreesWithDtypeAndShape) {
  Status s = OpenRaw(
      R"({"model.embed_tokens.weight":{"dtype":"F32","shape":[5,6],"data_offsets":[0,100]}})",
      std::string(100, '\0'));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "tensor 'model.embed_tokens.weight': data_offsets [0, 100] "
                                    "hold 100 bytes but dtype F32 x shape [5, 6] needs 120"));
}

// A shape whose byte count overflows 64 bits is DATA_LOSS, not a wrapped-around match.
TEST_F(SafetensorsTest, ShapeOverflow) {
  Status s = OpenRaw(
      R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", "");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "tensor 'w': dtype F32 x shape [4611686018427387904, 4] "
                                    "overflows a 64-bit byte count"));
}

// A negative dim is DATA_LOSS naming the tensor, the shape and the dim.
TEST_F(SafetensorsTest, NegativeDim) {
  Status s = OpenRaw(R"({"w":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,8]}})",
                     std::string(8, '\0'));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "tensor 'w': field 'shape' [-1,2] has negative dim -1"));
}

// An unknown dtype, or a sub-byte one, is DATA_LOSS naming the tensor, the field and the value.
TEST_F(SafetensorsTest, UnknownAndSubByteDtype) {
  Status unknown = OpenRaw(R"({"w":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})",
                           std::string(4, '\0'));
  EXPECT_EQ(unknown.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(unknown.message(), "tensor 'w': field 'dtype': unknown dtype 'F17'"));

  Status sub = OpenRaw(R"({"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", "x");
  EXPECT_EQ(sub.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(sub.message(), "tensor 'w': field 'dtype': dtype 'F4' is a sub-byte type"));
}

// Fields of the wrong JSON type are DATA_LOSS naming the tensor, the field and the value.
TEST_F(SafetensorsTest, FieldsOfWrongType) {
  Status offsets = OpenRaw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":"0,4"}})",
                           std::string(4, '\0'));
  EXPECT_EQ(offsets.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(offsets.message(), "tensor 'w': field 'data_offsets' is \"0,4\", expected "
                                          "[begin, end]"));
  Status shape = OpenRaw(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
                         std::string(4, '\0'));
  EXPECT_EQ(shape.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(shape.message(), "tensor 'w': field 'shape' [1.5] has dim 1.5 at index 0"));
  Status missing = OpenRaw(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  EXPECT_EQ(missing.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(missing.message(), "tensor 'w': field 'dtype' is missing"));
}

// Metadata with a non-string value is DATA_LOSS naming the metadata key.
TEST_F(SafetensorsTest, NonStringMetadata) {
  Status s = OpenRaw(R"({"__metadata__":{"format":"pt","step":1}})", "");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(),
                       "field '__metadata__': key 'step' has an integer value 1, expected a string"));
}

// A header length over kMaxHeaderBytes is DATA_LOSS before anything is read (length faked).
TEST_F(SafetensorsTest, HeaderOverLimit) {
  Status s = OpenRaw("{}", "", /*length=*/kMaxHeaderBytes + 1);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "header length 100000001 exceeds the limit of 100000000"));
}

// A missing file is NOT_FOUND naming the path.
TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  const fs::path path = dir_ / "nope.safetensors";
  Status s = File::Open(path).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s.message(), path.string()));
}

// ParseHeader on its own: a valid header gives tensors sorted by name and the metadata.
TEST(ParseHeaderTest, SortsTensorsAndFillsMetadata) {
  std::map<std::string, std::string> metadata;
  Result<std::vector<TensorInfo>> tensors = ParseHeader(
      R"({"b":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"U8","shape":[2],"data_offsets":[8,10]},"__metadata__":{"k":"v"}}   )",
      10, &metadata);
  ASSERT_TRUE(tensors.ok()) << tensors.status().ToString();
  ASSERT_EQ(tensors->size(), 2u);
  EXPECT_EQ((*tensors)[0].name, "a");
  EXPECT_EQ((*tensors)[0].begin, 8u);
  EXPECT_EQ((*tensors)[1].dtype, Dtype::kI64);
  EXPECT_EQ(metadata.at("k"), "v");
}

// Regression found by tests/fuzz/fuzz_safetensors_header: a header nesting arrays 100k deep
// in a field whose error message shows the value (dtype, an entry, a metadata value) is
// DATA_LOSS, not a stack overflow in nlohmann's recursive dump.
TEST(ParseHeaderTest, DeeplyNestedHeaderIsRejectedNotAStackOverflow) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& header :
       {R"({"a":{"dtype":)" + deep + R"(,"shape":[],"data_offsets":[0,0]}})",
        R"({"a":)" + deep + "}", R"({"__metadata__":{"k":)" + deep + "}}"}) {
    Result<std::vector<TensorInfo>> tensors = ParseHeader(header, 0, nullptr);
    ASSERT_FALSE(tensors.ok());
    EXPECT_EQ(tensors.status().code(), StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(tensors.status().message(), "deeper than 64 levels"));
  }
}

// ---------------------------------------------------------------------------------------------
// LibTorch bridge

// Every dtype maps to a torch dtype and back, and WriteTensors/ReadTensor keep bytes exact.
TEST_F(SafetensorsTest, TorchRoundTripOfEveryDtype) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (Dtype d : kAllDtypes) {
    Result<torch::Dtype> td = ToTorchDtype(d);
    ASSERT_TRUE(td.ok()) << td.status().ToString();
    Result<Dtype> back = FromTorchDtype(*td);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, d);
    std::string bytes = PatternBytes(3 * 4 * DtypeSize(d), d);
    torch::Tensor t = torch::empty({3, 4}, torch::TensorOptions().dtype(*td));
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    tensors.emplace_back("t." + std::string(DtypeName(d)), t);
  }
  const fs::path path = dir_ / "torch.safetensors";
  ASSERT_TRUE(WriteTensors(path, tensors).ok());
  Result<File> file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  for (const auto& [name, original] : tensors) {
    const TensorInfo* info = file->Find(name);
    ASSERT_NE(info, nullptr) << name;
    Result<torch::Tensor> read = ReadTensor(*file, *info);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(read->scalar_type(), original.scalar_type()) << name;
    EXPECT_EQ(read->sizes(), original.sizes()) << name;
    ASSERT_EQ(read->nbytes(), original.nbytes()) << name;
    EXPECT_EQ(std::memcmp(read->data_ptr(), original.data_ptr(), original.nbytes()), 0) << name;
  }
}

// BF16 bit patterns (NaN payloads, -0, subnormals, infinities) survive write and read exactly.
TEST_F(SafetensorsTest, Bf16RoundTripIsBitExact) {
  std::vector<uint16_t> bits = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f80, 0xff80,
                                0x7fc1, 0xffff, 0x7f7f, 0x3f80, 0xbf81, 0x1234};
  torch::Tensor t = torch::empty({static_cast<int64_t>(bits.size())}, torch::kBFloat16);
  std::memcpy(t.data_ptr(), bits.data(), bits.size() * 2);
  const fs::path path = dir_ / "bf16.safetensors";
  ASSERT_TRUE(WriteTensors(path, {{"w", t}}).ok());

  const std::string raw = ReadAll(path);
  EXPECT_EQ(raw.substr(raw.size() - bits.size() * 2),
            std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2));
  Result<File> file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<torch::Tensor> read = ReadTensor(*file, file->tensors()[0]);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->scalar_type(), torch::kBFloat16);
  std::vector<uint16_t> got(bits.size());
  std::memcpy(got.data(), read->data_ptr(), got.size() * 2);
  EXPECT_EQ(got, bits);
}

// Non-contiguous, grad-requiring and conjugated tensors are written as their logical values.
TEST_F(SafetensorsTest, WriteTensorsMaterialisesViews) {
  torch::Tensor base = torch::arange(6, torch::kFloat32).reshape({2, 3});
  torch::Tensor transposed = base.t();
  torch::Tensor grad = base.clone().requires_grad_(true);
  torch::Tensor complex = torch::complex(base, base + 1).conj();
  const fs::path path = dir_ / "views.safetensors";
  ASSERT_TRUE(WriteTensors(path, {{"t", transposed}, {"g", grad}, {"c", complex}}).ok());
  Result<File> file = File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<torch::Tensor> t = ReadTensor(*file, *file->Find("t"));
  Result<torch::Tensor> g = ReadTensor(*file, *file->Find("g"));
  Result<torch::Tensor> c = ReadTensor(*file, *file->Find("c"));
  ASSERT_TRUE(t.ok() && g.ok() && c.ok());
  EXPECT_TRUE(torch::equal(*t, transposed));
  EXPECT_TRUE(torch::equal(*g, base));
  EXPECT_TRUE(torch::equal(*c, complex.resolve_conj()));
}

// A torch dtype with no safetensors name is INVALID_ARGUMENT naming the tensor and the dtype.
TEST_F(SafetensorsTest, WriteTensorsRejectsUnmappedDtype) {
  Status s = WriteTensors(dir_ / "c128.safetensors",
                          {{"z", torch::zeros({2}, torch::kComplexDouble)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "tensor 'z': torch dtype ComplexDouble has no safetensors"));
}

// ViewTensor reads the mapped bytes in place (no copy) when they are aligned to the element
// size, copies them when not, and both read the stored values; Release drops the pages without
// changing what a later read sees.
TEST_F(SafetensorsTest, ViewTensorIsZeroCopyWhenAligned) {
  std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  header.append((8 - header.size() % 8) % 8, ' ');  // the buffer starts 8-aligned: b is not
  std::string buffer(9, '\0');
  buffer[0] = 7;
  const float values[2] = {1.5f, -2.25f};
  std::memcpy(buffer.data() + 1, values, sizeof(values));
  Result<File> file = File::Open(WriteRaw(header, buffer));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const TensorInfo& a = *file->Find("a");
  const TensorInfo& b = *file->Find("b");

  Result<torch::Tensor> va = ViewTensor(*file, a);
  ASSERT_TRUE(va.ok()) << va.status().ToString();
  EXPECT_EQ(va->data_ptr(), static_cast<const void*>(file->Bytes(a).data()));  // in place
  EXPECT_EQ(va->item<uint8_t>(), 7);

  Result<torch::Tensor> vb = ViewTensor(*file, b);
  ASSERT_TRUE(vb.ok()) << vb.status().ToString();
  EXPECT_NE(vb->data_ptr(), static_cast<const void*>(file->Bytes(b).data()));  // copied
  EXPECT_EQ(reinterpret_cast<uintptr_t>(vb->data_ptr()) % 4, 0u);
  EXPECT_FLOAT_EQ(vb->index({0}).item<float>(), 1.5f);
  EXPECT_FLOAT_EQ(vb->index({1}).item<float>(), -2.25f);

  // A page-sized aligned tensor: Release, then the view still reads the file's values.
  std::vector<std::pair<std::string, torch::Tensor>> big = {
      {"w", torch::arange(0, 8192, torch::kFloat32).reshape({8, 1024})}};
  const fs::path path = dir_ / "big.safetensors";
  ASSERT_TRUE(WriteTensors(path, big).ok());
  Result<File> bigf = File::Open(path);
  ASSERT_TRUE(bigf.ok()) << bigf.status().ToString();
  Result<torch::Tensor> w = ViewTensor(*bigf, *bigf->Find("w"));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->data_ptr(), static_cast<const void*>(bigf->Bytes(*bigf->Find("w")).data()));
  EXPECT_TRUE(torch::equal(*w, big[0].second));
  bigf->Release(*bigf->Find("w"));
  EXPECT_TRUE(torch::equal(*w, big[0].second));
}

}  // namespace
}  // namespace gatehouse::worker::safetensors
