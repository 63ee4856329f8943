// Per-attempt isolation on the node (docs/protocols.md §3.6): the ranks of one attempt run in a
// sandbox of bubblewrap (bwrap) inside one user and network namespace of their own, so the
// submitter's code sees this attempt's checkout, build output and directory only, not the
// agent's token or other attempts, and no network but its own loopback.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>
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
  /// What `bwrap --version` printed ("bubblewrap 0.8.0"), set by ProbeSandbox at agent start.
  std::string version = "bwrap";
};

/// Checks once, at agent start, that bwrap runs and can make a user and network namespace
/// here, and returns its version line. Errors: UNAVAILABLE with bwrap's message.
Result<std::string> ProbeSandbox(const SandboxConfig& config);

/// What one attempt may see inside its sandbox (absolute paths).
struct SandboxPaths {
  std::filesystem::path attempt_dir;                // read-write; the ranks' TMPDIR is under it
  std::vector<std::filesystem::path> read_only;     // its checkout, plugins' dirs, Python paths
  std::vector<std::filesystem::path> writable;      // a build's dir and caches
};

/// bwrap's arguments (no program) for one attempt: a read-only root (/tmp included: Wrap sets
/// TMPDIR to the attempt's own), fresh /dev and /proc, the work dir hidden and then `paths.read_only` bound back read-only and the attempt
/// dir read-write, hidden files and dirs covered, new PID, IPC and UTS namespaces, a session of
/// its own, killed with its parent. The user and network namespace are the attempt's holder's
/// (AttemptSandbox), so all ranks share one loopback.
std::vector<std::string> BwrapArgs(const SandboxConfig& config, const SandboxPaths& paths);

/// One attempt's sandbox: a holder process (`bwrap --unshare-user --unshare-net -- cat`, reading
/// a pipe only the agent writes) owns the attempt's user and network namespace (loopback only);
/// Wrap() makes a process enter them (nsenter) and run under bwrap with BwrapArgs. The holder is
/// killed on destruction, and ends with the agent (its pipe reads EOF).
class AttemptSandbox {
 public:
  /// Starts the holder and waits for its namespaces. Errors: UNAVAILABLE naming what failed
  /// (bwrap missing, user namespaces not allowed: bwrap's message).
  static Result<std::unique_ptr<AttemptSandbox>> Open(const SandboxConfig& config);
  ~AttemptSandbox();
  AttemptSandbox(const AttemptSandbox&) = delete;
  AttemptSandbox& operator=(const AttemptSandbox&) = delete;

  /// Rewrites `spec` to run inside the sandbox: nsenter -t <holder> -U [-n]
  /// --preserve-credentials -- bwrap <BwrapArgs> [--chdir cwd] -- [prlimit --nproc=N --] <exe>
  /// <args>, with GATEHOUSE_SANDBOX=Describe() and TMPDIR=<attempt dir>/tmp (created) added to
  /// its environment.
  /// `paths`: what the process sees (a rank: its checkout, plugins, Python paths; a build step:
  /// its build dir and caches writable). With `loopback_only` false the process keeps the
  /// node's network instead of the attempt's loopback (pip fetching from the package index);
  /// the user namespace is the attempt's either way.
  void Wrap(ProcessSpec& spec, const SandboxPaths& paths, bool loopback_only = true) const;

  /// The evidence line: "bwrap 0.8.0: user+network namespace (loopback only), read-only root,
  /// work dir hidden, token hidden, attempt dir writable, nproc 4096".
  const std::string& Describe() const { return description_; }

 private:
  AttemptSandbox(SandboxConfig config, pid_t holder, pid_t inner, int lifeline,
                 std::string description);

  SandboxConfig config_;
  pid_t holder_ = -1;  // the bwrap process we started
  pid_t inner_ = -1;   // its child in the new namespaces (bwrap --info-fd "child-pid")
  int lifeline_ = -1;  // the write end of the holder's standard input
  std::string description_;
};

}  // namespace gatehouse::agent
