// Verifies the memory estimate (controller/memory_estimate.h): checkpoint facts read from a
// directory, the formula at the published 0.5B size against the peaks docs/real-size.md
// measured, and calibration by measured peaks.
#include "controller/memory_estimate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/common/sample_spec.h"

namespace gatehouse::controller {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CheckpointFactsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gh-facts-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, size_t bytes, char fill = 'x') {
    std::ofstream(dir_ / name) << std::string(bytes, fill);
  }
  fs::path dir_;
};

TEST_F(CheckpointFactsTest, WeightBytesAndTheConfigsDtype) {
  Write("model-00001-of-00002.safetensors", 3000);
  Write("model-00002-of-00002.safetensors", 1000);
  Write("tokenizer.json", 50000);  // not weights
  std::ofstream(dir_ / "config.json") << R"({"torch_dtype": "bfloat16", "hidden_size": 8})";
  auto facts = ReadCheckpointFacts(dir_);
  ASSERT_TRUE(facts.ok()) << facts.status().ToString();
  EXPECT_EQ(facts->bytes, 4000);
  EXPECT_EQ(facts->dtype, "bfloat16");
  EXPECT_EQ(facts->element_bytes, 2);
  EXPECT_EQ(facts->parameters(), 2000);
}

TEST_F(CheckpointFactsTest, NewerConfigsSayDtypeAndAbsentMeansFloat32) {
  Write("model.safetensors", 400);
  std::ofstream(dir_ / "config.json") << R"({"dtype": "float16"})";
  EXPECT_EQ(ReadCheckpointFacts(dir_)->element_bytes, 2);
  std::ofstream(dir_ / "config.json") << R"({"hidden_size": 8})";
  auto facts = ReadCheckpointFacts(dir_);
  EXPECT_EQ(facts->dtype, "");
  EXPECT_EQ(facts->element_bytes, 4);
  EXPECT_EQ(facts->parameters(), 100);
}

TEST_F(CheckpointFactsTest, NoWeightsOrABadConfigAreErrorsNamingTheDirectory) {
  std::ofstream(dir_ / "config.json") << "{}";
  auto none = ReadCheckpointFacts(dir_);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr(dir_.string()));
  Write("pytorch_model.bin", 800);  // the older format counts when there is no safetensors
  EXPECT_EQ(ReadCheckpointFacts(dir_)->bytes, 800);
  std::ofstream(dir_ / "config.json") << "[1, 2]";
  auto bad = ReadCheckpointFacts(dir_);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("config.json is not a JSON object"));
}

/// The Qwen2.5-0.5B-size checkpoint of docs/real-size.md: 1.98 GB of fp32 weights.
CheckpointFacts HalfBillionFp32() { return {1'976'000'000, "float32", 4}; }

CellSpec Reference(const CellSpec& validation) {
  CellSpec ref = validation;
  ref.kind = "reference";
  return ref;
}

TEST(MemoryEstimateTest, TheFormulaCoversThePeaksMeasuredAtTheHalfBillionSize) {
  // docs/real-size.md: the reference runner peaked at 5.03 GB (2.54x), a worker running every
  // phase at 8.57 GB (4.33x). The formula must cover both without asking for twice as much.
  CellSpec spec = testing::SampleSpec();
  spec.checkpoint.digest = "sha256:aa";
  const MemoryEstimate worker = EstimateMemory(spec, HalfBillionFp32());
  ASSERT_EQ(worker.processes.size(), 1u);
  EXPECT_EQ(worker.processes[0].role, kWorkerRankRole);
  EXPECT_EQ(worker.processes[0].basis, "formula");
  EXPECT_GE(worker.host_bytes(), 8'570'000'000);
  EXPECT_LE(worker.host_bytes(), 2 * 8'570'000'000);
  const MemoryEstimate ref = EstimateMemory(Reference(spec), HalfBillionFp32());
  EXPECT_EQ(ref.processes[0].role, kReferenceRunnerRole);
  EXPECT_GE(ref.host_bytes(), 5'030'000'000);
  EXPECT_LE(ref.host_bytes(), 2 * 5'030'000'000);
  EXPECT_THAT(ref.Describe(), HasSubstr("reference runner ~"));
}

TEST(MemoryEstimateTest, PrecisionPhasesAndTopologyMoveTheFigure) {
  CellSpec spec = testing::SampleSpec();
  const int64_t full = EstimateMemory(spec, HalfBillionFp32()).host_bytes();
  CellSpec inference = spec;
  inference.phases = {"identity", "config", "construct", "load", "inference", "decode"};
  EXPECT_LT(EstimateMemory(inference, HalfBillionFp32()).host_bytes(), full / 2);
  CellSpec bf16 = inference;
  bf16.precision = "bf16";
  EXPECT_LT(EstimateMemory(bf16, HalfBillionFp32()).host_bytes(),
            EstimateMemory(inference, HalfBillionFp32()).host_bytes());
  // Two TP ranks: two processes on the node, each with half the weights.
  CellSpec tp2 = spec;
  tp2.topology.tp = 2;
  const MemoryEstimate sharded = EstimateMemory(tp2, HalfBillionFp32());
  ASSERT_EQ(sharded.processes[0].count, 2);
  EXPECT_LT(sharded.processes[0].host_bytes, full);
  EXPECT_THAT(sharded.Describe(), HasSubstr("2 worker ranks ~"));
  // A CUDA cell needs GPU memory per rank and less on the host.
  CellSpec cuda = spec;
  cuda.runtime.device = "cuda";
  const MemoryEstimate gpu = EstimateMemory(cuda, HalfBillionFp32());
  EXPECT_GT(gpu.device_bytes_per_gpu(), gpu.host_bytes());
  EXPECT_THAT(gpu.Describe(), HasSubstr(" GPU"));
}

TEST(MemoryEstimateTest, AMeasuredPeakOfTheSameKeyReplacesTheFormulaBothWays) {
  CellSpec spec = testing::SampleSpec();
  spec.checkpoint.digest = "sha256:aa";
  const MemoryEstimate formula = EstimateMemory(spec, HalfBillionFp32());
  // Measured below the formula: the next estimate comes down to the peak + 10%.
  MemoryCalibration low = MemoryCalibration::From(
      {{7, std::string(kWorkerRankRole), MemoryKey(spec), formula.host_bytes(), 6'000'000'000}});
  const MemoryEstimate calibrated = EstimateMemory(spec, HalfBillionFp32(), low);
  EXPECT_EQ(calibrated.host_bytes(), 6'600'000'000);
  EXPECT_THAT(calibrated.processes[0].basis, HasSubstr("measured 6.0 GB + 10% (attempt 7)"));
  // Another checkpoint: its formula is not lowered (a factor only raises).
  CellSpec other = spec;
  other.checkpoint.digest = "sha256:bb";
  EXPECT_EQ(EstimateMemory(other, HalfBillionFp32(), low).host_bytes(), formula.host_bytes());
}

TEST(MemoryEstimateTest, AFormulaThatFellShortScalesTheRolesLaterEstimates) {
  CellSpec spec = testing::SampleSpec();
  spec.checkpoint.digest = "sha256:aa";
  CellSpec other = spec;
  other.checkpoint.digest = "sha256:bb";
  const int64_t formula = EstimateMemory(other, HalfBillionFp32()).host_bytes();
  // Attempt 3 measured 1.5x its formula (an OOM kill counts its limit as the peak).
  MemoryCalibration c = MemoryCalibration::From(
      {{3, std::string(kWorkerRankRole), MemoryKey(spec), 1000, 1500},
       {4, std::string(kReferenceRunnerRole), "k", 1000, 900}});
  EXPECT_DOUBLE_EQ(c.factor[std::string(kWorkerRankRole)], 1.5);
  EXPECT_DOUBLE_EQ(c.factor[std::string(kReferenceRunnerRole)], 1.0);  // never below 1
  const MemoryEstimate scaled = EstimateMemory(other, HalfBillionFp32(), c);
  EXPECT_NEAR(static_cast<double>(scaled.host_bytes()), 1.5 * static_cast<double>(formula), 2.0);
  EXPECT_THAT(scaled.processes[0].basis, HasSubstr("formula x 1.50 (measured peaks)"));
  // Only the newest `window` ratios of a role count.
  std::vector<MeasuredPeak> peaks = {{1, std::string(kWorkerRankRole), "k", 1000, 3000}};
  for (int i = 2; i <= 4; ++i) peaks.push_back({i, std::string(kWorkerRankRole), "k", 1000, 1000});
  EXPECT_DOUBLE_EQ(MemoryCalibration::From(peaks, 3).factor[std::string(kWorkerRankRole)], 1.0);
  EXPECT_DOUBLE_EQ(MemoryCalibration::From(peaks, 4).factor[std::string(kWorkerRankRole)], 3.0);
}

TEST(MemoryEstimateTest, TheMemoryKeyIgnoresRepositoryCommitAndFamily) {
  CellSpec a = testing::SampleSpec();
  CellSpec b = a;
  b.repository = "https://example.com/other.git";
  b.commit = std::string(40, 'b');
  b.model_family = "other";
  EXPECT_EQ(MemoryKey(a), MemoryKey(b));
  b.precision = "bf16";
  EXPECT_NE(MemoryKey(a), MemoryKey(b));
}

TEST(MemoryEstimateTest, GigabytesAreDecimal) {
  EXPECT_EQ(FormatGigabytes(44'000'000'000), "44.0 GB");
  EXPECT_EQ(FormatGigabytes(512'000'000), "512 MB");
}

}  // namespace
}  // namespace gatehouse::controller
