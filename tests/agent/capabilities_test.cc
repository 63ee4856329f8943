// Tests of the capability probes: /proc/meminfo and nvidia-smi CSV parsing, and the lane label.
#include "agent/capabilities.h"

#include <gtest/gtest.h>

namespace gatehouse::agent {
namespace {

// Verifies MemTotal is read in kB and returned in bytes, and a missing line is an error.
TEST(CapabilitiesTest, ParsesMemTotal) {
  auto bytes = ParseMemTotal("MemFree:  10 kB\nMemTotal:       16318480 kB\nSwapTotal: 0 kB\n");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, int64_t{16318480} * 1024);
  EXPECT_FALSE(ParseMemTotal("MemFree: 10 kB\n").ok());
  EXPECT_FALSE(ParseMemTotal("MemTotal: lots kB\n").ok());
}

// Verifies nvidia-smi's noheader/nounits CSV: name, MiB, uuid per GPU; bad lines are named.
TEST(CapabilitiesTest, ParsesNvidiaSmiCsv) {
  auto gpus = ParseNvidiaSmiCsv(
      "0, NVIDIA H200, 143771, GPU-aaaa-bbbb, 580.95.05\n"
      "1, NVIDIA H200, 143771, GPU-cccc-dddd, 580.95.05\n\n");
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].model, "NVIDIA H200");
  EXPECT_EQ((*gpus)[0].memory_bytes, int64_t{143771} * 1024 * 1024);
  EXPECT_EQ((*gpus)[1].uuid, "GPU-cccc-dddd");
  EXPECT_EQ((*gpus)[1].index, 1);
  EXPECT_EQ((*gpus)[1].driver_version, "580.95.05");
  EXPECT_FALSE(ParseNvidiaSmiCsv("NVIDIA H200, 143771, GPU-aaaa-bbbb\n").ok());
  EXPECT_TRUE(ParseNvidiaSmiCsv("").ok());
  auto bad = ParseNvidiaSmiCsv("No devices were found\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("No devices were found"), std::string::npos);
}

// Verifies the worker's --print-runtime output is read member by member, and a missing or
// mistyped member is named.
TEST(CapabilitiesTest, ParsesWorkerRuntime) {
  auto r = ParseWorkerRuntime(
      R"({"torch":"2.11.0","torch_headers":"2.11.0","cuda":"13.0","cudnn":"9.19.0",)"
      R"("nccl":"2.28.9","cuda_driver":"","cuda_available":false,"cuda_device_count":0,)"
      R"("nccl_groups":true})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->torch, "2.11.0");
  EXPECT_EQ(r->cuda, "13.0");
  EXPECT_EQ(r->nccl, "2.28.9");
  EXPECT_TRUE(r->nccl_groups);
  EXPECT_FALSE(r->cuda_available);
  auto missing = ParseWorkerRuntime(R"({"torch":"2.11.0"})");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'cuda'"), std::string::npos);
  EXPECT_FALSE(ParseWorkerRuntime("Segmentation fault").ok());
}

// Verifies the probe of this machine: cores and memory found, one slot, lane matches the GPUs,
// and the runtime comes from the worker itself (the CI wheel: torch 2.11 built with CUDA 13),
// not from --torch-version, which is kept only when the worker cannot be probed.
TEST(CapabilitiesTest, ProbesThisMachine) {
  const AgentCapabilities caps = ProbeCapabilities(GATEHOUSE_WORKER_BIN, "0.0.1");
  EXPECT_GT(caps.cpu_cores, 0);
  EXPECT_GT(caps.memory_bytes, 0);
  EXPECT_EQ(caps.slots, 1);
  EXPECT_EQ(caps.torch_version, "2.11.0");
  EXPECT_EQ(caps.cuda_version.substr(0, 3), "13.");
  EXPECT_FALSE(caps.nccl_version.empty());
  EXPECT_EQ(caps.labels.at("lane"), caps.gpus.empty() ? "cpu" : "gpu");

  const AgentCapabilities unprobed = ProbeCapabilities("/nonexistent/gatehouse-worker", "2.11.0");
  EXPECT_EQ(unprobed.torch_version, "2.11.0");
  EXPECT_EQ(unprobed.cuda_version, "");
}

}  // namespace
}  // namespace gatehouse::agent
