// Per-attempt isolation on the node (docs/protocols.md §3.6): the ranks of one attempt run in a
// sandbox of bubblewrap (bwrap) inside one user and network namespace of their own, so the
// submitter's code sees this attempt's checkout, build output and directory only, not the
// agent's token or other attempts, and no network but its own loopback.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/process.h"
#include "common/status.h"

namespace gatehouse::agent {

/// How the agent isolates attempts (gatehouse-agent --sandbox).
struct SandboxConfig {
  std::filesystem::path bwrap = "bwrap";
  std::filesystem::path nsenter = "nsenter";
  /// Hidden from every attempt: the agent's work dir (other attempts, other repositories'
  /// checkouts and builds, the artifact cache) and token file, and any --sandbox-hide path.
  std::filesystem::path work_dir;
  std::vector<std::filesystem::path> hidden_files;  // replaced by an empty file
  std::vector<std::filesystem::path> hidden_dirs;   // replaced by an empty directory
  /// RLIMIT_NPROC of the ranks (processes and threads of the sandbox's user namespace); 0: none.
  int64_t max_processes = 0;
  /// Device nodes bound into every sandbox over bwrap's minimal /dev (`--dev-bind`) besides the
  /// accelerator's, which AttemptSandbox::Open and gatehouse-slurm-rank find themselves
  /// (--sandbox-device). The attempt's GPUs are chosen by CUDA_VISIBLE_DEVICES, as without a
  /// sandbox.
  std::vector<std::filesystem::path> devices;
  /// What `bwrap --version` printed ("bubblewrap 0.8.0"), set by ProbeSandbox at agent start.
  std::string version = "bwrap";
};

/// Checks once, at agent start, that bwrap runs and can make a user and network namespace
/// here, and returns its version line. Errors: UNAVAILABLE with bwrap's message.
Result<std::string> ProbeSandbox(const SandboxConfig& config);

/// What one attempt may see inside its sandbox (absolute paths).
struct SandboxPaths {
  std::filesystem::path attempt_dir;                // read-write; the ranks' TMPDIR is under it
  std::filesystem::path shm_dir;  // bound as /dev/shm (shared by the ranks); empty: bwrap's own
  std::vector<std::filesystem::path> read_only;     // its checkout, plugins' dirs, Python paths
  std::vector<std::filesystem::path> writable;      // a build's dir and caches
};

/// bwrap's arguments (no program) for one attempt: a new PID namespace, a read-only root (/tmp
/// included: Wrap sets TMPDIR to the attempt's own), a fresh /dev with config.devices bound in
/// and `paths.shm_dir` as /dev/shm, a fresh /proc, the work dir hidden and then
/// `paths.read_only` bound back read-only and the attempt dir read-write, hidden files and dirs
/// covered, killed with its parent. The user, network, IPC and UTS namespaces are the
/// attempt's holder's (AttemptSandbox), so all ranks share one loopback, one System V IPC
/// space and one /dev/shm (NCCL's shared-memory transport needs both ranks to see the same).
/// Where a device or the shm dir is not a directory or device on this machine, bwrap fails.
std::vector<std::string> BwrapArgs(const SandboxConfig& config, const SandboxPaths& paths);

/// The device nodes an accelerator needs under `dev` ("/dev"): NVIDIA's (nvidiactl, nvidia-uvm,
/// nvidia-uvm-tools, nvidia-modeset, nvidia<N>, the nvidia-caps directory), RDMA's
/// (infiniband/), AMD's (kfd, dri/), each that exists, sorted.
std::vector<std::filesystem::path> AcceleratorDevices(const std::filesystem::path& dev = "/dev");

/// At agent start: removes the ranks' /dev/shm directories (`gatehouse-sandbox-p<pid>-*` under
/// `shm_root`) of agents that are gone (a crashed run's). Returns how many were removed.
int RemoveStaleShmDirs(const std::filesystem::path& shm_root = "/dev/shm");

/// `command` (bwrap and its arguments, then `--` and the sandboxed program) less the covers
/// BwrapArgs puts over paths that do not exist here (`--tmpfs <dir>`, `--ro-bind /dev/null
/// <file>` whose target `exists` says is absent): bwrap cannot mount over a missing path under a
/// read-only root, and there is nothing to hide. Arguments after bwrap's `--` are kept.
std::vector<std::string> DropAbsentCovers(
    std::vector<std::string> command,
    const std::function<bool(const std::string&)>& exists);

/// What gatehouse-slurm-rank --sandboxed makes of a Slurm task's bwrap command on its node:
/// DropAbsentCovers (the agent's token file, for one, is usually not on a compute node), then
/// this node's `devices` (AcceleratorDevices here, not the agent's machine's) bound after
/// `--dev /dev`, and `shm_dir` bound as /dev/shm.
std::vector<std::string> PrepareSlurmTaskCommand(
    std::vector<std::string> command, const std::function<bool(const std::string&)>& exists,
    const std::vector<std::filesystem::path>& devices, const std::filesystem::path& shm_dir);

/// The /dev/shm directory the tasks of Slurm job `job_id` on this node share,
/// `<shm_root>/gatehouse-slurm-<job_id>` (mode 0700; one that exists must be a directory of
/// this user, not a link), held with a shared flock on a descriptor left open across exec, so
/// it is in use as long as one of the job's tasks runs. Directories of other jobs that no task
/// holds any more are removed first. Errors: FAILED_PRECONDITION naming the path and the OS
/// error.
Result<std::filesystem::path> OpenSlurmJobShm(const std::filesystem::path& shm_root,
                                              std::string_view job_id);

/// One attempt's sandbox: a holder process (`bwrap --unshare-user --unshare-net --unshare-ipc
/// --unshare-uts -- cat`, reading a pipe only the agent writes) owns the attempt's user, network
/// (loopback only), IPC and UTS namespaces, and a directory under /dev/shm
/// (gatehouse-sandbox-p<agent pid>-XXXXXX) is the ranks' shared /dev/shm; Wrap() makes a
/// process enter the namespaces (nsenter) and run under bwrap with BwrapArgs. The holder is
/// killed and the shm directory removed on destruction; the holder also ends with the agent
/// (its pipe reads EOF).
class AttemptSandbox {
 public:
  /// Starts the holder and waits until its namespaces are ready. The local ranks' devices are
  /// config.devices (--sandbox-device) and AcceleratorDevices() as they are now (a node's
  /// /dev/nvidia-uvm may appear only once CUDA has been used). Errors: UNAVAILABLE naming what
  /// failed (bwrap missing, user namespaces not allowed: bwrap's message).
  static Result<std::unique_ptr<AttemptSandbox>> Open(const SandboxConfig& config);
  ~AttemptSandbox();
  AttemptSandbox(const AttemptSandbox&) = delete;
  AttemptSandbox& operator=(const AttemptSandbox&) = delete;

  /// Rewrites `spec` to run inside the sandbox: nsenter --target <the holder's child> --user
  /// [--net] --ipc --uts --preserve-credentials -- bwrap <BwrapArgs> [--chdir cwd] -- [prlimit
  /// --nproc=N --] <exe> <args>, with GATEHOUSE_SANDBOX=Describe() and TMPDIR=<attempt
  /// dir>/tmp (created) added to its environment.
  /// `paths`: what the process sees (a rank: its checkout, plugins, Python paths; a build step:
  /// its build dir and caches writable). With `loopback_only` false the process keeps the
  /// node's network instead of the attempt's loopback (pip fetching from the package index);
  /// the other namespaces are the attempt's either way.
  void Wrap(ProcessSpec& spec, const SandboxPaths& paths, bool loopback_only = true) const;

  /// Rewrites `spec` (one task of a Slurm step, which Slurm starts on another node, where the
  /// holder's namespaces are not) to run under `bwrap --unshare-user --unshare-ipc <BwrapArgs>
  /// [--chdir cwd] -- [prlimit --nproc=N --] <exe> <args>` with only --sandbox-device's devices
  /// and no /dev/shm yet (gatehouse-slurm-rank adds its node's: PrepareSlurmTaskCommand): the
  /// same file system view and process limit as Wrap, user and IPC namespaces of its own, and
  /// the node's network, which ranks on other nodes need to reach each other. Its environment
  /// gains GATEHOUSE_SANDBOX=DescribeSlurmTask() and TMPDIR as Wrap's.
  void WrapSlurmTask(ProcessSpec& spec, const SandboxPaths& paths) const;

  /// The evidence line: "bubblewrap 0.8.0: user, network (loopback only), IPC and UTS
  /// namespaces and /dev/shm of the attempt, read-only root, agent work dir hidden, 5 device
  /// paths bound, token hidden, attempt dir writable, nproc 4096".
  const std::string& Describe() const { return description_; }

  /// The ranks' /dev/shm on this node (removed with the sandbox).
  const std::filesystem::path& shm_dir() const { return shm_dir_; }

  /// The evidence line of a Slurm task's sandbox: "bubblewrap 0.8.0 in each Slurm task: user
  /// and IPC namespaces and /dev/shm of the job's tasks on the node, the node's network (ranks
  /// span nodes), read-only root, ...".
  std::string DescribeSlurmTask() const;

 private:
  AttemptSandbox(SandboxConfig config, std::vector<std::filesystem::path> task_devices,
                 std::filesystem::path shm_dir, pid_t holder, pid_t inner, int lifeline,
                 std::string description);

  // bwrap's arguments after the namespace options: BwrapArgs of `config`, --chdir, `--`,
  // prlimit, the program; and the environment (GATEHOUSE_SANDBOX=`description`, TMPDIR) both
  // wraps add.
  static std::vector<std::string> Command(const SandboxConfig& config, ProcessSpec& spec,
                                          const SandboxPaths& paths,
                                          const std::string& description);

  SandboxConfig config_;  // devices: the local ranks' (--sandbox-device and this node's)
  std::vector<std::filesystem::path> task_devices_;  // --sandbox-device's: for Slurm tasks
  std::filesystem::path shm_dir_;  // the ranks' /dev/shm: /dev/shm/gatehouse-sandbox-p<pid>-*
  pid_t holder_ = -1;  // the bwrap process we started
  pid_t inner_ = -1;   // its child in the new namespaces (bwrap --info-fd "child-pid")
  int lifeline_ = -1;  // the write end of the holder's standard input
  std::string description_;
};

}  // namespace gatehouse::agent
