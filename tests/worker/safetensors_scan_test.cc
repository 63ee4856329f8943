// Tests of the finiteness scan over a safetensors byte stream (worker_lib/include/gatehouse/
// worker/safetensors_scan.h): its counts equal torch's isnan/isinf in every covered dtype,
// whatever the block sizes, and a file it cannot follow is left out, never half counted.
#include "gatehouse/worker/safetensors_scan.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>

#include "common/sha256.h"
#include "gatehouse/worker/safetensors_torch.h"
#include "tests/common/temp_dir.h"

namespace gatehouse::worker::safetensors {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Feeds `bytes` to a fresh scan as file `name` in blocks of random sizes in [1, max_block].
FiniteScan ScanInBlocks(const std::string& name, const std::string& bytes, size_t max_block,
                        uint32_t seed) {
  FiniteScan scan;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> size(1, max_block);
  scan.BeginFile(name, bytes.size());
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min(size(rng), bytes.size() - at);
    scan.Bytes(std::string_view(bytes).substr(at, n));
    at += n;
  }
  scan.EndFile();
  return scan;
}

class FiniteScanTest : public testing::Test {
 protected:
  // Tensors with NaN, +-Inf, huge finite, subnormal and -0 values in each covered dtype, and
  // an integer tensor whose bytes would read as NaN if it were taken for a float; "0.odd" (6
  // bytes, first by name) puts every later element at an offset no block size aligns.
  void SetUp() override {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    torch::Tensor base = torch::randn({7, 13});
    base[0][1] = nan;
    base[2][3] = inf;
    base[4][5] = -inf;
    base[6][7] = 3.0e38f;
    base[1][1] = 1e-40f;  // subnormal in fp32
    base[3][3] = -0.0f;
    tensors_ = {{"a.f32", base},
                {"b.f64", base.to(torch::kFloat64)},
                {"c.bf16", base.to(torch::kBFloat16)},
                // 3e38 overflows fp16 to +Inf: one more Inf there
                {"d.f16", base.to(torch::kFloat16)},
                {"e.finite", torch::randn({5, 3})},
                {"f.empty", torch::empty({0, 4})},
                {"g.i64", torch::full({3}, int64_t{-1})},
                {"0.odd", torch::randn({3}).to(torch::kBFloat16)}};
    path_ = dir_.path() / "model.safetensors";
    ASSERT_TRUE(WriteTensors(path_, tensors_).ok());
  }

  // Each covered tensor's count equals torch's; the integer tensor is not in the scan.
  void ExpectCountsOf(const FiniteScan& scan) {
    Result<File> file = File::Open(path_);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    for (const auto& [name, t] : tensors_) {
      const TensorInfo* info = file->Find(name);
      ASSERT_NE(info, nullptr) << name;
      std::optional<NonFiniteCount> got =
          scan.Find("model.safetensors", name, info->begin, info->end);
      if (!t.is_floating_point()) {
        EXPECT_FALSE(got.has_value()) << name;
        continue;
      }
      ASSERT_TRUE(got.has_value()) << name;
      EXPECT_EQ(got->nan, t.isnan().sum().item<int64_t>()) << name;
      EXPECT_EQ(got->inf, t.isinf().sum().item<int64_t>()) << name;
    }
  }

  test_util::TempDir dir_;
  fs::path path_;
  std::vector<std::pair<std::string, torch::Tensor>> tensors_;
};

// Verifies the scan's NaN and Inf counts equal torch's in F32, F64, BF16 and F16 when it sees
// the file through DirectoryDigest, and that the digest is the one it gives without a scan.
TEST_F(FiniteScanTest, CountsEqualTorchsThroughTheDigest) {
  FiniteScan scan;
  Result<std::string> with = DirectoryDigest(dir_.path(), &scan);
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(*with, *DirectoryDigest(dir_.path()));
  EXPECT_EQ(scan.files_scanned(), 1u);
  ExpectCountsOf(scan);
  // The fixture's non-finite values, as torch sees them (fp16 overflows 3e38 to one more Inf).
  Result<File> file = File::Open(path_);
  ASSERT_TRUE(file.ok());
  const TensorInfo* f16 = file->Find("d.f16");
  auto d = scan.Find("model.safetensors", "d.f16", f16->begin, f16->end);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->nan, 1);
  EXPECT_EQ(d->inf, 3);
  EXPECT_EQ(scan.bytes_counted(), (7 * 13) * (4 + 8 + 2 + 2) + 5 * 3 * 4 + 3 * 2);
}

// Verifies blocks of any size, splitting the length field, the header and single elements,
// give the same counts.
TEST_F(FiniteScanTest, BlockSizesDoNotChangeTheCounts) {
  const std::string bytes = ReadAll(path_);
  for (size_t max_block : {1, 2, 3, 7, 64, 4096}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE("max block " + std::to_string(max_block) + ", seed " + std::to_string(seed));
      FiniteScan scan = ScanInBlocks("model.safetensors", bytes, max_block, seed);
      ASSERT_EQ(scan.files_scanned(), 1u);
      ExpectCountsOf(scan);
    }
  }
}

// Verifies a file the scan cannot follow is left out (the load gate then counts for itself):
// a lying header, a file whose bytes differ in number from its size, a file that is not
// safetensors by name, and a lookup at other offsets than the scanned ones.
TEST_F(FiniteScanTest, FilesItCannotFollowAreLeftOut) {
  const std::string bytes = ReadAll(path_);
  Result<File> file = File::Open(path_);
  ASSERT_TRUE(file.ok());
  const TensorInfo* a = file->Find("a.f32");

  std::string lying = bytes;
  lying[0] = static_cast<char>(lying[0] + 1);  // header length one more than it is
  EXPECT_EQ(ScanInBlocks("model.safetensors", lying, 4096, 1).files_scanned(), 0u);

  FiniteScan short_read;
  short_read.BeginFile("model.safetensors", bytes.size() + 4);  // 4 bytes never came
  short_read.Bytes(bytes);
  short_read.EndFile();
  EXPECT_EQ(short_read.files_scanned(), 0u);
  EXPECT_FALSE(short_read.Find("model.safetensors", "a.f32", a->begin, a->end).has_value());

  FiniteScan long_read;
  long_read.BeginFile("model.safetensors", bytes.size() - 4);
  long_read.Bytes(bytes);
  long_read.EndFile();
  EXPECT_EQ(long_read.files_scanned(), 0u);

  EXPECT_EQ(ScanInBlocks("model.bin", bytes, 4096, 1).files_scanned(), 0u);

  FiniteScan scan = ScanInBlocks("model.safetensors", bytes, 4096, 1);
  EXPECT_TRUE(scan.Find("model.safetensors", "a.f32", a->begin, a->end).has_value());
  EXPECT_FALSE(scan.Find("model.safetensors", "a.f32", a->begin + 4, a->end).has_value());
  EXPECT_FALSE(scan.Find("other.safetensors", "a.f32", a->begin, a->end).has_value());
}

// Verifies one scan follows several files, each under its own name.
TEST_F(FiniteScanTest, SeveralFilesKeepTheirOwnCounts) {
  ASSERT_TRUE(WriteTensors(dir_.path() / "second.safetensors",
                           {{"a.f32", torch::full({4}, std::numeric_limits<float>::infinity())}})
                  .ok());
  FiniteScan scan;
  ASSERT_TRUE(DirectoryDigest(dir_.path(), &scan).ok());
  EXPECT_EQ(scan.files_scanned(), 2u);
  Result<File> second = File::Open(dir_.path() / "second.safetensors");
  ASSERT_TRUE(second.ok());
  auto inf = scan.Find("second.safetensors", "a.f32", 0, 16);
  ASSERT_TRUE(inf.has_value());
  EXPECT_EQ(inf->inf, 4);
  ExpectCountsOf(scan);
}

}  // namespace
}  // namespace gatehouse::worker::safetensors
