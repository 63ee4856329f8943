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
      "NVIDIA H200, 143771, GPU-aaaa-bbbb\nNVIDIA H200, 143771, GPU-cccc-dddd\n\n");
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].model, "NVIDIA H200");
  EXPECT_EQ((*gpus)[0].memory_bytes, int64_t{143771} * 1024 * 1024);
  EXPECT_EQ((*gpus)[1].uuid, "GPU-cccc-dddd");
  EXPECT_TRUE(ParseNvidiaSmiCsv("").ok());
  auto bad = ParseNvidiaSmiCsv("No devices were found\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("No devices were found"), std::string::npos);
}

// Verifies the probe of this machine: cores and memory found, one slot, lane matches the GPUs.
TEST(CapabilitiesTest, ProbesThisMachine) {
  const AgentCapabilities caps = ProbeCapabilities("2.11.0");
  EXPECT_GT(caps.cpu_cores, 0);
  EXPECT_GT(caps.memory_bytes, 0);
  EXPECT_EQ(caps.slots, 1);
  EXPECT_EQ(caps.torch_version, "2.11.0");
  EXPECT_EQ(caps.labels.at("lane"), caps.gpus.empty() ? "cpu" : "gpu");
}

}  // namespace
}  // namespace gatehouse::agent
