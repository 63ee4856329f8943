// Per-attempt cgroups (docs/protocols.md §3.7): each validation attempt's build steps and ranks
// run in a cgroup of their own under the one delegated to the agent, with a memory limit and a
// process limit, so one attempt cannot take the node's memory, its peak and out-of-memory kills
// are counted, and nothing it started outlives it.
//
// Kernel interfaces (Documentation/admin-guide/cgroup-v2.rst and cgroup-v1/memory.rst):
//  - v2 (one unified hierarchy): memory.max, memory.swap.max, memory.peak, memory.events
//    ("oom_kill N"), pids.max, cgroup.kill; a cgroup that gives controllers to its children
//    holds no processes itself ("no internal processes"), so the agent moves into a leaf
//    "agent" before enabling memory and pids in cgroup.subtree_control.
//  - v1 (one hierarchy per controller): memory.limit_in_bytes, memory.memsw.limit_in_bytes,
//    memory.max_usage_in_bytes, memory.oom_control ("oom_kill N"); pids.max in the pids one.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gatehouse::agent {

/// Where the agent's own cgroups are, from /proc/self/cgroup and /proc/self/mountinfo. An empty
/// path: that hierarchy is not mounted (or this process is outside what is mounted).
struct CgroupPlace {
  std::filesystem::path v2;         // the agent's cgroup in the unified hierarchy
  std::filesystem::path v1_memory;  // its cgroup in the v1 memory hierarchy
  std::filesystem::path v1_pids;    // its cgroup in the v1 pids hierarchy
};

/// Reads the texts of /proc/self/cgroup ("ID:CONTROLLERS:PATH" lines; "0::PATH" is v2) and
/// /proc/self/mountinfo (proc(5): the root and mount point of each cgroup/cgroup2 mount) into
/// directories. A path outside a mount's root (a cgroup namespace) is not found.
CgroupPlace LocateCgroups(std::string_view proc_self_cgroup, std::string_view mountinfo);

/// How the agent confines attempts in cgroups (gatehouse-agent --cgroup, --attempt-memory-limit,
/// --attempt-max-processes), completed by PrepareCgroups.
struct CgroupConfig {
  int64_t memory_limit_bytes = 0;  // memory.max / memory.limit_in_bytes per attempt; 0: none
  int64_t max_processes = 0;       // pids.max per attempt; 0: none
  // Set by PrepareCgroups:
  int version = 0;                 // 1 or 2; 0: attempts get no cgroup (`none_reason` says why)
  std::filesystem::path parent;    // where attempt cgroups are made (v1: in the memory hierarchy)
  std::filesystem::path v1_pids_parent;  // v1: the same in the pids hierarchy; may be empty
  std::string none_reason;
};

/// Finds the cgroup delegated to the agent (from the texts of /proc/self/cgroup and
/// /proc/self/mountinfo; `self` is the pid to move) and makes it ready for attempt cgroups: v2
/// when the unified hierarchy offers the memory controller to the agent's cgroup, else v1's
/// memory (and pids) hierarchies. On v2 the agent moves itself into the leaf `<cgroup>/agent`
/// and enables memory (and pids) for the children, as systemd's delegation model asks.
/// Returns `config` with version and parents set, or with version 0 and `none_reason` saying
/// why ("no cgroup hierarchy offers the memory controller to the agent's cgroup",
/// "/sys/fs/cgroup/...: not writable by uid 998 (is the unit's Delegate= set?)", or the write
/// that failed).
CgroupConfig PrepareCgroups(CgroupConfig config, std::string_view proc_self_cgroup,
                            std::string_view mountinfo, pid_t self);
/// The same, reading this process's /proc/self/cgroup and /proc/self/mountinfo.
CgroupConfig PrepareCgroups(CgroupConfig config);

/// At agent start: removes the attempt cgroups (`gatehouse-a<id>-p<pid>`) under config.parent
/// (and its v1 pids twin) whose agent process is gone, killing what still runs in them (a
/// crashed agent's attempts). Those of live agents sharing the cgroup are left alone. Returns
/// how many were removed.
int RemoveStaleCgroups(const CgroupConfig& config);

/// What the agent's registration says of its attempts' cgroups (label `cgroup`, shown on the
/// agents page): "v2 under /sys/fs/cgroup/gatehouse: memory limit 64 GiB, process limit 16384
/// per attempt" (a limit "none" when not set), or "none: <none_reason>".
std::string DescribeCgroupConfig(const CgroupConfig& config);

/// "8 GiB", "512 MiB", "1234 bytes".
std::string FormatBytes(int64_t bytes);

/// One attempt's cgroup: made under the agent's, limits written before any process joins;
/// a process joins by writing its pid to each of Join() / cgroup.procs before it execs
/// (ProcessSpec::cgroups), so everything it starts is counted and limited too. Destruction
/// kills what is left in it and removes it.
class AttemptCgroup {
 public:
  /// Makes `<parent>/<name>` (and its v1 pids twin) and writes the limits. Errors: INTERNAL
  /// naming the directory or file and the OS error.
  static Result<std::unique_ptr<AttemptCgroup>> Create(const CgroupConfig& config,
                                                       const std::string& name);
  ~AttemptCgroup();
  AttemptCgroup(const AttemptCgroup&) = delete;
  AttemptCgroup& operator=(const AttemptCgroup&) = delete;

  /// Sets the memory limit (swap included where the kernel accounts it) to `bytes`, e.g. once
  /// the build is done, before the ranks start; `why` says where the figure came from ("the
  /// controller's estimate 5.8 GB + margin") and goes into Describe() and OomNote(). A limit
  /// below what the cgroup holds makes the kernel reclaim first (page cache). Errors: INTERNAL
  /// naming the file and the OS error (the old limit stays).
  Status LimitMemory(int64_t bytes, const std::string& why);
  /// The memory limit in bytes; 0: none.
  int64_t memory_limit() const { return memory_limit_; }

  /// The directories whose cgroup.procs a process writes its pid to.
  const std::vector<std::filesystem::path>& Join() const { return dirs_; }

  /// The evidence line: "cgroup v2 /sys/fs/cgroup/.../gatehouse-a7-p123: memory limit 8 GiB
  /// (no swap), process limit 4096" ("none" for a limit not set; "(swap not accounted)" where
  /// the kernel does not account swap, so swap is not limited).
  const std::string& Describe() const { return description_; }

  /// Processes the kernel's OOM killer ended inside this cgroup (memory.events or
  /// memory.oom_control "oom_kill"); 0 when unknown.
  int64_t OomKills() const;
  /// The most memory its processes used at once, in bytes (memory.peak; v1
  /// memory.max_usage_in_bytes); -1 when the kernel does not say.
  int64_t PeakBytes() const;
  /// "" when no process was OOM-killed, else a sentence for the attempt's end reason:
  /// "the attempt's cgroup reached its memory limit (8 GiB): the kernel killed 1 process".
  std::string OomNote() const;

  /// Sends SIGKILL to every process still in the cgroup (v2 cgroup.kill where the kernel has
  /// it) and waits up to `wait_ms` for it to empty. Returns how many processes were found.
  int KillAll(int wait_ms = 30000);

 private:
  AttemptCgroup(int version, std::vector<std::filesystem::path> dirs, int64_t memory_limit,
                std::string description);

  int version_;
  std::vector<std::filesystem::path> dirs_;  // [0] holds the memory controller
  int64_t memory_limit_;
  std::string memory_limit_why_;  // LimitMemory's `why`; empty for the operator's limit
  std::string description_;
};

}  // namespace gatehouse::agent
