// Tests of per-attempt cgroups (agent/cgroup.h, docs/protocols.md §3.7): where the agent's
// cgroups are found (v2, v1 and hybrid hosts, a container's cgroup namespace), the v2
// delegation steps on a fake cgroup tree (the agent moves into a leaf, then enables memory and
// pids for its children), and, on this host's real cgroups, a memory limit the kernel enforces
// (an allocation past it is OOM-killed and counted), a process limit, and processes an attempt
// left behind killed with its cgroup. The real-cgroup tests are SKIPPED with the reason where
// no cgroup is delegated to this process.
#include "agent/cgroup.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "agent/process.h"
#include "agent_test_util.h"

namespace gatehouse::agent {
namespace {

namespace fs = std::filesystem;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

// A systemd host on cgroup v2 only (Debian 12's default): the agent's service cgroup.
TEST(CgroupLocateTest, UnifiedHierarchyGivesTheServiceCgroup) {
  const CgroupPlace place = LocateCgroups(
      "0::/system.slice/gatehouse-agent.service\n",
      "24 1 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n"
      "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
      "rw,nsdelegate,memory_recursiveprot\n");
  EXPECT_EQ(place.v2, fs::path("/sys/fs/cgroup/system.slice/gatehouse-agent.service"));
  EXPECT_TRUE(place.v1_memory.empty());
  EXPECT_TRUE(place.v1_pids.empty());
}

// A hybrid host (this kind of VM): memory and pids in v1 hierarchies, an empty unified one.
TEST(CgroupLocateTest, HybridHostGivesTheV1MemoryAndPidsCgroups) {
  const CgroupPlace place = LocateCgroups(
      "9:name=systemd:/\n8:pids:/jobs/7\n4:memory:/process_api/e53\n1:cpu,cpuacct:/\n0::/\n",
      "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
      "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
      "33 25 0:29 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
      "35 25 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
  EXPECT_EQ(place.v1_memory, fs::path("/sys/fs/cgroup/memory/process_api/e53"));
  EXPECT_EQ(place.v1_pids, fs::path("/sys/fs/cgroup/pids/jobs/7"));
  EXPECT_EQ(place.v2, fs::path("/sys/fs/cgroup/unified"));
}

// A container: the mount's root is its own cgroup, so paths are taken relative to it; a path
// outside the mounted root is not reachable; mountinfo's octal escapes are undone.
TEST(CgroupLocateTest, MountRootAndEscapesAreHonoured) {
  const std::string mount =
      "40 30 0:30 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(LocateCgroups("0::/kubepods/pod1/agent\n", mount).v2,
            fs::path("/sys/fs/cgroup/agent"));
  EXPECT_EQ(LocateCgroups("0::/kubepods/pod1\n", mount).v2, fs::path("/sys/fs/cgroup"));
  EXPECT_TRUE(LocateCgroups("0::/kubepods/pod10/x\n", mount).v2.empty());
  EXPECT_TRUE(LocateCgroups("0::/other\n", mount).v2.empty());
  EXPECT_EQ(LocateCgroups("0::/a\n", "41 30 0:30 / /mnt/cg\\040two rw - cgroup2 none rw\n").v2,
            fs::path("/mnt/cg two/a"));
  EXPECT_TRUE(LocateCgroups("0::/a\n", "").v2.empty()) << "nothing mounted";
  EXPECT_TRUE(LocateCgroups("0::/../x\n", mount).v2.empty()) << "never above the mount";
  EXPECT_TRUE(LocateCgroups("0::/kubepods/pod1/../../x\n", mount).v2.empty());
}

// A bind mount of another subtree listed first does not hide the mount that holds the cgroup.
TEST(CgroupLocateTest, EveryMountOfAKindIsTried) {
  const std::string mounts =
      "40 30 0:30 /machine.slice/vm1 /var/lib/vm1/cgroup rw - cgroup2 cgroup2 rw\n"
      "41 30 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
      "42 30 0:31 /other /mnt/mem rw - cgroup cgroup rw,memory\n"
      "43 30 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
  const CgroupPlace place =
      LocateCgroups("4:memory:/system.slice/a.service\n0::/system.slice/a.service\n", mounts);
  EXPECT_EQ(place.v2, fs::path("/sys/fs/cgroup/system.slice/a.service"));
  EXPECT_EQ(place.v1_memory, fs::path("/sys/fs/cgroup/memory/system.slice/a.service"));
}

// A fake cgroup2 tree in a temporary directory (regular files stand in for the kernel's).
class CgroupV2FakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = tmp_.path() / "cg" / "system.slice" / "gatehouse-agent.service";
    WriteFile(service_ / "cgroup.controllers", "cpu io memory pids\n");
    WriteFile(service_ / "cgroup.subtree_control", "");
    WriteFile(service_ / "cgroup.procs", "4242\n");
    WriteFile(service_ / "agent" / "cgroup.procs", "");
    mountinfo_ = "35 24 0:30 / " + (tmp_.path() / "cg").string() +
                 " rw,relatime shared:9 - cgroup2 cgroup2 rw\n";
  }
  TempDir tmp_{"gatehouse-cgroup"};
  fs::path service_;
  std::string mountinfo_;
};

TEST_F(CgroupV2FakeTest, TheAgentMovesIntoALeafThenEnablesMemoryAndPids) {
  // Verifies systemd's delegation model: the agent's pid goes to <service>/agent first (a
  // cgroup with processes cannot hand controllers down), then +memory +pids are enabled.
  const CgroupConfig config =
      PrepareCgroups({}, "0::/system.slice/gatehouse-agent.service\n", mountinfo_, 4242);
  EXPECT_EQ(config.version, 2) << config.none_reason;
  EXPECT_EQ(config.parent, service_);
  EXPECT_EQ(ReadFile(service_ / "agent" / "cgroup.procs"), "4242");
  EXPECT_EQ(ReadFile(service_ / "cgroup.subtree_control"), "+memory +pids");
}

TEST_F(CgroupV2FakeTest, ControllersAlreadyEnabledMoveNothing) {
  WriteFile(service_ / "cgroup.subtree_control", "memory pids\n");
  const CgroupConfig config =
      PrepareCgroups({}, "0::/system.slice/gatehouse-agent.service\n", mountinfo_, 4242);
  EXPECT_EQ(config.version, 2) << config.none_reason;
  EXPECT_EQ(ReadFile(service_ / "agent" / "cgroup.procs"), "");
}

TEST_F(CgroupV2FakeTest, NoMemoryControllerMeansNoneWithTheReason) {
  WriteFile(service_ / "cgroup.controllers", "cpu io\n");
  const CgroupConfig config =
      PrepareCgroups({}, "0::/system.slice/gatehouse-agent.service\n", mountinfo_, 4242);
  EXPECT_EQ(config.version, 0);
  EXPECT_EQ(config.none_reason,
            "no cgroup hierarchy offers the memory controller to the agent's cgroup");
  EXPECT_EQ(ReadFile(service_ / "cgroup.subtree_control"), "") << "nothing written";
}

TEST_F(CgroupV2FakeTest, AProcessLimitWithoutThePidsControllerMeansNone) {
  // Verifies the agent refuses at start (version 0, main exits 2) rather than failing every
  // attempt later.
  WriteFile(service_ / "cgroup.controllers", "cpu memory\n");
  CgroupConfig config;
  config.max_processes = 100;
  config = PrepareCgroups(config, "0::/system.slice/gatehouse-agent.service\n", mountinfo_, 4242);
  EXPECT_EQ(config.version, 0);
  EXPECT_EQ(config.none_reason, "a process limit needs the pids controller, which " +
                                    service_.string() + " does not offer (cgroup.controllers)");
  config.max_processes = 0;
  config = PrepareCgroups(config, "0::/system.slice/gatehouse-agent.service\n", mountinfo_, 4242);
  EXPECT_EQ(config.version, 2) << "memory alone is enough without a process limit";
  EXPECT_EQ(ReadFile(service_ / "cgroup.subtree_control"), "+memory");
}

TEST_F(CgroupV2FakeTest, SwapNotAccountedIsSaid) {
  // Without memory.swap.max (swap accounting off) the limit does not cover swap: the evidence
  // must not claim it does.
  const fs::path attempt = service_ / "gatehouse-a8-p1";
  for (const char* file : {"memory.max", "cgroup.procs"}) WriteFile(attempt / file, "");
  CgroupConfig config;
  config.memory_limit_bytes = int64_t{1} << 30;
  config = PrepareCgroups(config, "0::/system.slice/gatehouse-agent.service\n", mountinfo_, 4242);
  auto cgroup = AttemptCgroup::Create(config, "gatehouse-a8-p1");
  ASSERT_TRUE(cgroup.ok()) << cgroup.status().ToString();
  EXPECT_EQ((*cgroup)->Describe(), "cgroup v2 " + attempt.string() +
                                       ": memory limit 1 GiB (swap not accounted), process "
                                       "limit none");
}

TEST_F(CgroupV2FakeTest, AnAttemptCgroupGetsItsLimitsBeforeAnyProcessJoins) {
  // Verifies the files written: memory.max and pids.max (the kernel makes them with the
  // directory; the fake makes them beforehand), memory.swap.max 0 where swap is accounted.
  const fs::path attempt = service_ / "gatehouse-a7-p1";
  for (const char* file : {"memory.max", "memory.swap.max", "pids.max", "cgroup.procs"}) {
    WriteFile(attempt / file, "");
  }
  CgroupConfig config;
  config.memory_limit_bytes = int64_t{8} << 30;
  config.max_processes = 4096;
  config = PrepareCgroups(config, "0::/system.slice/gatehouse-agent.service\n", mountinfo_, 4242);
  ASSERT_EQ(config.version, 2) << config.none_reason;
  auto cgroup = AttemptCgroup::Create(config, "gatehouse-a7-p1");
  ASSERT_TRUE(cgroup.ok()) << cgroup.status().ToString();
  EXPECT_EQ(ReadFile(attempt / "memory.max"), "8589934592");
  EXPECT_EQ(ReadFile(attempt / "memory.swap.max"), "0");
  EXPECT_EQ(ReadFile(attempt / "pids.max"), "4096");
  EXPECT_EQ((*cgroup)->Join(), std::vector<fs::path>{attempt});
  EXPECT_EQ((*cgroup)->Describe(), "cgroup v2 " + attempt.string() +
                                       ": memory limit 8 GiB (no swap), process limit 4096");
  EXPECT_EQ((*cgroup)->OomKills(), 0);
  EXPECT_EQ((*cgroup)->OomNote(), "");
  WriteFile(attempt / "memory.events", "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n");
  EXPECT_EQ((*cgroup)->OomNote(),
            "the attempt's cgroup reached its memory limit (8 GiB): the kernel killed 2 processes");
  WriteFile(attempt / "memory.peak", "123456789\n");
  EXPECT_EQ((*cgroup)->PeakBytes(), 123456789);
}

TEST(CgroupFormatTest, BytesInBinaryUnits) {
  EXPECT_EQ(FormatBytes(512), "512 bytes");
  EXPECT_EQ(FormatBytes(64 << 20), "64 MiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(FormatBytes(int64_t{70} << 40), "70 TiB");
}

TEST(CgroupFormatTest, TheAgentsCgroupsAsRegistered) {
  // Verifies the `cgroup` label of the agent's registration: where, and each limit or "none".
  CgroupConfig config;
  config.none_reason = "gatehouse-agent --cgroup none";
  EXPECT_EQ(DescribeCgroupConfig(config), "none: gatehouse-agent --cgroup none");
  config.version = 2;
  config.parent = "/sys/fs/cgroup/system.slice/gatehouse-agent.service";
  config.memory_limit_bytes = int64_t{64} << 30;
  EXPECT_EQ(DescribeCgroupConfig(config),
            "v2 under /sys/fs/cgroup/system.slice/gatehouse-agent.service: memory limit 64 GiB, "
            "process limit none per attempt");
  config.memory_limit_bytes = 0;
  config.max_processes = 16384;
  EXPECT_EQ(DescribeCgroupConfig(config),
            "v2 under /sys/fs/cgroup/system.slice/gatehouse-agent.service: memory limit none, "
            "process limit 16384 per attempt");
}

TEST(CgroupJoinTest, AChildThatCannotJoinItsCgroupSaysSoAndExits126) {
  // Verifies ProcessSpec::cgroups: a cgroup that cannot be joined never runs the program.
  ProcessSpec spec;
  spec.exe = "/bin/echo";
  spec.args = {"ran"};
  spec.cgroups = {"/nonexistent/gatehouse-cgroup"};
  std::string out, err;
  auto exit = RunProcess(spec, [&](std::string_view b) { out.append(b); },
                         [&](std::string_view b) { err.append(b); });
  ASSERT_TRUE(exit.ok()) << exit.status().ToString();
  EXPECT_EQ(exit->exit_code, 126);
  EXPECT_EQ(out, "");
  EXPECT_EQ(err,
            "gatehouse-agent: cannot join the attempt's cgroup: "
            "/nonexistent/gatehouse-cgroup/cgroup.procs (errno " + std::to_string(ENOENT) +
                ")\n");
}

// True while `pid` runs (exists and is not a zombie waiting for its reaper).
bool Running(pid_t pid) {
  std::string stat;
  try {
    stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  } catch (...) {
    return false;
  }
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// On this host's own cgroups: SKIPPED where none is delegated to this process.
class CgroupRealTest : public ::testing::Test {
 protected:
  // The cgroup config with `memory` and `processes` limits, or nullopt (the test skips).
  std::optional<CgroupConfig> Prepare(int64_t memory, int64_t processes) {
    CgroupConfig config;
    config.memory_limit_bytes = memory;
    config.max_processes = processes;
    config = PrepareCgroups(config);
    if (config.version == 0) {
      skip_ = config.none_reason;
      return std::nullopt;
    }
    return config;
  }
  // Runs python3 `code` in `cgroup`; returns its exit and what it printed.
  std::pair<ProcessExit, std::string> Python(const AttemptCgroup& cgroup, const std::string& code) {
    ProcessSpec spec;
    spec.exe = "python3";
    spec.args = {"-c", code};
    spec.cgroups = cgroup.Join();
    spec.merge_stderr = true;
    std::string out;
    auto exit = RunProcess(spec, [&](std::string_view b) { out.append(b); },
                           [&](std::string_view b) { out.append(b); });
    EXPECT_TRUE(exit.ok()) << exit.status().ToString();
    return {exit.ok() ? *exit : ProcessExit{-1, 0, false}, out};
  }
  std::string Name(const char* what) {
    return "gatehouse-test-" + std::to_string(::getpid()) + "-" + what;
  }
  std::string skip_;
};

TEST_F(CgroupRealTest, TheKernelHoldsAnAttemptToItsMemoryLimitAndItIsCounted) {
  auto config = Prepare(64 << 20, 0);
  if (!config) GTEST_SKIP() << "no cgroup delegated here: " << skip_;
  auto cgroup = AttemptCgroup::Create(*config, Name("memory"));
  ASSERT_TRUE(cgroup.ok()) << cgroup.status().ToString();
  const fs::path dir = (*cgroup)->Join()[0];
  EXPECT_TRUE(fs::is_directory(dir));

  // 16 MiB fits: the process runs in the attempt's cgroup and ends well.
  const auto [small, small_out] =
      Python(**cgroup, "b = b'x' * (16 << 20); print(open('/proc/self/cgroup').read())");
  EXPECT_TRUE(small.ok()) << small.Describe() << small_out;
  EXPECT_NE(small_out.find(dir.filename().string()), std::string::npos) << small_out;
  EXPECT_EQ((*cgroup)->OomKills(), 0);

  // 256 MiB does not: the OOM killer ends it inside the cgroup, and the note says so.
  const auto [big, big_out] = Python(**cgroup, "b = b'x' * (256 << 20); print('survived')");
  EXPECT_EQ(big.signal, SIGKILL) << big.Describe() << big_out;
  EXPECT_EQ(big_out.find("survived"), std::string::npos);
  EXPECT_EQ((*cgroup)->OomKills(), 1);
  EXPECT_EQ((*cgroup)->OomNote(),
            "the attempt's cgroup reached its memory limit (64 MiB): the kernel killed 1 process");
  const int64_t peak = (*cgroup)->PeakBytes();
  if (peak >= 0) {
    EXPECT_GT(peak, 16 << 20);
    EXPECT_LE(peak, 64 << 20);
  }
  cgroup->reset();
  EXPECT_FALSE(fs::exists(dir)) << "removed with the attempt";
}

TEST_F(CgroupRealTest, AProcessLimitRefusesTheForkPastIt) {
  auto config = Prepare(0, 16);
  if (!config) GTEST_SKIP() << "no cgroup delegated here: " << skip_;
  auto cgroup = AttemptCgroup::Create(*config, Name("pids"));
  if (!cgroup.ok() && cgroup.status().code() == StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << cgroup.status().message();
  }
  ASSERT_TRUE(cgroup.ok()) << cgroup.status().ToString();
  const auto [exit, out] = Python(**cgroup,
                                  "import os, time\n"
                                  "n = 0\n"
                                  "try:\n"
                                  "    for _ in range(64):\n"
                                  "        if os.fork() == 0:\n"
                                  "            os.close(1); os.close(2); time.sleep(30)\n"
                                  "        n += 1\n"
                                  "    print('forked', n)\n"
                                  "except OSError as e:\n"
                                  "    print('refused after', n, e.strerror)\n");
  EXPECT_TRUE(exit.ok()) << exit.Describe();
  EXPECT_EQ(out.rfind("refused after 15 Resource temporarily unavailable", 0), 0u) << out;
  // The children closed their output, so RunProcess did not wait for them: still there.
  EXPECT_EQ((*cgroup)->KillAll(), 15);
  EXPECT_EQ((*cgroup)->KillAll(), 0) << "all gone";
}

TEST_F(CgroupRealTest, WhatAnAttemptLeftRunningDiesWithItsCgroup) {
  // Verifies KillAll: a daemon in a session of its own escapes the process-group kill of
  // RunProcess, not the cgroup.
  auto config = Prepare(0, 0);
  if (!config) GTEST_SKIP() << "no cgroup delegated here: " << skip_;
  auto cgroup = AttemptCgroup::Create(*config, Name("leftover"));
  ASSERT_TRUE(cgroup.ok()) << cgroup.status().ToString();
  ProcessSpec spec;
  spec.exe = "/bin/sh";
  spec.args = {"-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"};
  spec.cgroups = (*cgroup)->Join();
  std::string out;
  auto exit = RunProcess(spec, [&](std::string_view b) { out.append(b); }, [](std::string_view) {});
  ASSERT_TRUE(exit.ok() && exit->ok()) << out;
  const pid_t daemon = std::stoi(out);
  ASSERT_TRUE(Running(daemon)) << "the daemon outlived its parent";
  const fs::path dir = (*cgroup)->Join()[0];
  cgroup->reset();  // kills and removes
  EXPECT_FALSE(fs::exists(dir));
  // Killed; init reaps it shortly.
  for (int i = 0; i < 100 && Running(daemon); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(Running(daemon)) << "pid " << daemon << " still runs";
}

TEST_F(CgroupRealTest, ACrashedAgentsAttemptCgroupsAreRemovedAtStart) {
  // Verifies RemoveStaleCgroups: the cgroup of an agent that is gone (a pid that exited) is
  // emptied and removed; one of a live agent (this process) is left alone.
  auto config = Prepare(0, 0);
  if (!config) GTEST_SKIP() << "no cgroup delegated here: " << skip_;
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const fs::path stale = config->parent / ("gatehouse-a1-p" + std::to_string(gone));
  const fs::path live = config->parent / ("gatehouse-a2-p" + std::to_string(::getpid()));
  ASSERT_TRUE(fs::create_directory(stale));
  ASSERT_TRUE(fs::create_directory(live));
  ProcessSpec spec;
  spec.exe = "/bin/sh";
  spec.args = {"-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"};
  spec.cgroups = {stale};
  std::string out;
  auto exit = RunProcess(spec, [&](std::string_view b) { out.append(b); }, [](std::string_view) {});
  ASSERT_TRUE(exit.ok() && exit->ok()) << out;
  const pid_t orphan = std::stoi(out);
  ASSERT_TRUE(Running(orphan));
  EXPECT_GE(RemoveStaleCgroups(*config), 1);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live)) << "a live agent's cgroup is its own";
  for (int i = 0; i < 100 && Running(orphan); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(Running(orphan));
  ::rmdir(live.c_str());
}

}  // namespace
}  // namespace gatehouse::agent
