// Per-attempt isolation with bubblewrap (docs/protocols.md §3.6).
#include "agent/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

extern char** environ;

namespace gatehouse::agent {

const std::filesystem::path kShmRoot = "/dev/shm";

std::vector<std::string> BwrapArgs(const SandboxConfig& config, const SandboxPaths& paths) {
  std::vector<std::string> args = {"--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/",
                                   "--dev", "/dev"};
  for (const auto& device : config.devices) {
    args.insert(args.end(), {"--dev-bind", device.string(), device.string()});
  }
  if (!paths.shm_dir.empty()) {
    args.insert(args.end(), {"--bind", paths.shm_dir.string(), "/dev/shm"});
  }
  args.insert(args.end(), {"--proc", "/proc"});
  // Later mounts go over earlier ones: hide first, then bind back what this attempt may use.
  if (!config.work_dir.empty()) {
    args.insert(args.end(), {"--tmpfs", config.work_dir.string()});
  }
  for (const auto& dir : config.hidden_dirs) args.insert(args.end(), {"--tmpfs", dir.string()});
  for (const auto& file : config.hidden_files) {
    args.insert(args.end(), {"--ro-bind", "/dev/null", file.string()});
  }
  for (const auto& path : paths.read_only) {
    args.insert(args.end(), {"--ro-bind", path.string(), path.string()});
  }
  for (const auto& path : paths.writable) {
    args.insert(args.end(), {"--bind", path.string(), path.string()});
  }
  args.insert(args.end(),
              {"--bind", paths.attempt_dir.string(), paths.attempt_dir.string()});
  return args;
}

namespace {

// Reads what `fd` delivers until EOF or `timeout`.
std::string ReadAll(int fd, std::chrono::milliseconds timeout) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.find('}') != std::string::npos) break;  // one JSON object
  }
  return out;
}

// Waits until process `pid` runs `program` (its /proc comm), up to `timeout`; false when it
// does not by then, or `parent` (its bwrap) has exited, which sets `*reaped` (it was waited
// for: its pid may already be another process's).
bool RunsProgram(pid_t pid, pid_t parent, std::string_view program,
                 std::chrono::milliseconds timeout, bool* reaped) {
  const std::string comm = "/proc/" + std::to_string(pid) + "/comm";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(comm);
    std::string name;
    if (std::getline(in, name) && name == program) return true;
    int status = 0;
    if (::waitpid(parent, &status, WNOHANG) == parent) {
      *reaped = true;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

// The evidence's words for what a sandboxed process sees and may do (BwrapArgs, prlimit);
// `devices` says which device paths are bound ("" for none).
std::string FileSystemView(const SandboxConfig& config, const std::string& devices) {
  std::string view = "read-only root, agent work dir hidden";
  if (!devices.empty()) view += ", " + devices;
  if (!config.hidden_files.empty()) view += ", token hidden";
  view += ", attempt dir writable";
  if (config.max_processes > 0) view += ", nproc " + std::to_string(config.max_processes);
  return view;
}

}  // namespace

Result<std::string> ProbeSandbox(const SandboxConfig& config) {
  const auto run = [&](std::vector<std::string> args) -> Result<std::string> {
    ProcessSpec probe;
    probe.exe = config.bwrap;
    probe.args = std::move(args);
    auto out = RunForOutput(probe);
    if (!out.ok()) return Status::Unavailable("sandbox: " + out.status().message());
    while (!out->empty() && out->back() == '\n') out->pop_back();
    return out;
  };
  GH_ASSIGN_OR_RETURN(std::string version, run({"--version"}));
  GH_RETURN_IF_ERROR(
      run({"--unshare-user", "--unshare-net", "--ro-bind", "/", "/", "true"}).status());
  return version;
}

Result<std::unique_ptr<AttemptSandbox>> AttemptSandbox::Open(const SandboxConfig& config) {
  // The holder reads a pipe only the agent writes: when the agent dies (or the sandbox closes)
  // it reads EOF and exits, taking the namespaces with it.
  int info[2] = {-1, -1}, errors[2] = {-1, -1}, lifeline[2] = {-1, -1};
  if (::pipe2(info, O_CLOEXEC) != 0 || ::pipe2(errors, O_CLOEXEC) != 0 ||
      ::pipe2(lifeline, O_CLOEXEC) != 0) {
    const std::string why = std::strerror(errno);
    for (const int fd : {info[0], info[1], errors[0], errors[1], lifeline[0], lifeline[1]}) {
      if (fd >= 0) ::close(fd);
    }
    return Status::Unavailable("sandbox: pipe: " + why);
  }
  // The ranks' shared /dev/shm, on the node's tmpfs, mode 0700.
  std::string shm_template =
      (kShmRoot / ("gatehouse-sandbox-p" + std::to_string(::getpid()) + "-XXXXXX")).string();
  if (::mkdtemp(shm_template.data()) == nullptr) {
    const std::string why = std::strerror(errno);
    for (const int fd : {info[0], info[1], errors[0], errors[1], lifeline[0], lifeline[1]}) {
      ::close(fd);
    }
    return Status::Unavailable("sandbox: cannot make " + shm_template + ": " + why);
  }
  const std::filesystem::path shm_dir = shm_template;
  const auto remove_shm = [&shm_dir] {
    std::error_code ec;
    std::filesystem::remove_all(shm_dir, ec);
  };
  const std::string bwrap = config.bwrap.string();
  std::vector<std::string> argv = {bwrap,           "--die-with-parent", "--unshare-user",
                                   "--unshare-net", "--unshare-ipc",     "--unshare-uts",
                                   "--ro-bind",     "/",                 "/",
                                   "--info-fd",     "3",                 "--",
                                   "cat"};
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, lifeline[0], 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, info[1], 3);
  posix_spawn_file_actions_adddup2(&actions, errors[1], 2);
  pid_t holder = -1;
  const int rc = ::posix_spawnp(&holder, bwrap.c_str(), &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(info[1]);
  ::close(errors[1]);
  ::close(lifeline[0]);
  if (rc != 0) {
    ::close(info[0]);
    ::close(errors[0]);
    ::close(lifeline[1]);
    remove_shm();
    return Status::Unavailable("sandbox: cannot start " + bwrap + ": " + std::strerror(rc));
  }
  const std::string text = ReadAll(info[0], std::chrono::seconds(10));
  ::close(info[0]);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  pid_t inner = -1;
  if (j.is_object() && j.contains("child-pid") && j["child-pid"].is_number_integer()) {
    inner = j["child-pid"].get<pid_t>();
  }
  // bwrap reports the child's pid as soon as it is cloned, before the child has written its
  // uid map and made its mounts; a rank entering the user namespace then is an unmapped user
  // there, and its own bwrap fails ("Creating new namespace failed"). The child is ready once
  // it runs `cat`.
  bool reaped = false;
  if (inner > 0 && !RunsProgram(inner, holder, "cat", std::chrono::seconds(10), &reaped)) {
    inner = -1;
  }
  if (inner <= 0) {
    ::close(lifeline[1]);
    if (!reaped) {
      ::kill(holder, SIGKILL);
      ::waitpid(holder, nullptr, 0);
    }
    std::string why = ReadAll(errors[0], std::chrono::milliseconds(500));
    ::close(errors[0]);
    remove_shm();
    while (!why.empty() && why.back() == '\n') why.pop_back();
    return Status::Unavailable("sandbox: bwrap could not make a user and network namespace" +
                               (why.empty() ? std::string() : ": " + why));
  }
  ::close(errors[0]);
  SandboxConfig local = config;
  for (const auto& device : AcceleratorDevices()) {
    if (std::find(local.devices.begin(), local.devices.end(), device) == local.devices.end()) {
      local.devices.push_back(device);
    }
  }
  std::string description =
      config.version +
      ": user, network (loopback only), IPC and UTS namespaces and /dev/shm of the attempt, " +
      FileSystemView(local, local.devices.empty()
                                ? ""
                                : std::to_string(local.devices.size()) + " device paths bound");
  return std::unique_ptr<AttemptSandbox>(new AttemptSandbox(
      std::move(local), config.devices, shm_dir, holder, inner, lifeline[1],
      std::move(description)));
}

AttemptSandbox::AttemptSandbox(SandboxConfig config,
                               std::vector<std::filesystem::path> task_devices,
                               std::filesystem::path shm_dir, pid_t holder, pid_t inner,
                               int lifeline, std::string description)
    : config_(std::move(config)),
      task_devices_(std::move(task_devices)),
      shm_dir_(std::move(shm_dir)),
      holder_(holder),
      inner_(inner),
      lifeline_(lifeline),
      description_(std::move(description)) {}

AttemptSandbox::~AttemptSandbox() {
  if (lifeline_ >= 0) ::close(lifeline_);
  if (holder_ > 0) {
    ::kill(holder_, SIGKILL);
    ::waitpid(holder_, nullptr, 0);
  }
  std::error_code ec;
  if (!shm_dir_.empty()) std::filesystem::remove_all(shm_dir_, ec);
}

std::vector<std::string> AttemptSandbox::Command(const SandboxConfig& config, ProcessSpec& spec,
                                                 const SandboxPaths& paths,
                                                 const std::string& description) {
  std::vector<std::string> args = BwrapArgs(config, paths);
  if (!spec.cwd.empty()) args.insert(args.end(), {"--chdir", spec.cwd.string()});
  args.push_back("--");
  if (config.max_processes > 0) {
    args.insert(args.end(), {"prlimit", "--nproc=" + std::to_string(config.max_processes), "--"});
  }
  args.push_back(spec.exe.string());
  args.insert(args.end(), spec.args.begin(), spec.args.end());
  spec.env.emplace_back("GATEHOUSE_SANDBOX", description);
  // The root (and /tmp with it) is read-only: temporary files go to the attempt's own dir.
  const std::filesystem::path tmp = paths.attempt_dir / "tmp";
  std::error_code ec;
  std::filesystem::create_directories(tmp, ec);
  spec.env.emplace_back("TMPDIR", tmp.string());
  return args;
}

void AttemptSandbox::Wrap(ProcessSpec& spec, const SandboxPaths& paths,
                          bool loopback_only) const {
  std::vector<std::string> args = {"--target", std::to_string(inner_), "--user"};
  if (loopback_only) args.push_back("--net");
  args.insert(args.end(),
              {"--ipc", "--uts", "--preserve-credentials", "--", config_.bwrap.string()});
  SandboxPaths view = paths;
  if (view.shm_dir.empty()) view.shm_dir = shm_dir_;
  const std::vector<std::string> command = Command(config_, spec, view, description_);
  args.insert(args.end(), command.begin(), command.end());
  spec.exe = config_.nsenter;
  spec.args = std::move(args);
}

void AttemptSandbox::WrapSlurmTask(ProcessSpec& spec, const SandboxPaths& paths) const {
  std::vector<std::string> args = {"--unshare-user", "--unshare-ipc"};
  // The node's devices and the job's /dev/shm there are added on the node.
  SandboxConfig task = config_;
  task.devices = task_devices_;
  SandboxPaths view = paths;
  view.shm_dir.clear();
  const std::vector<std::string> command = Command(task, spec, view, DescribeSlurmTask());
  args.insert(args.end(), command.begin(), command.end());
  spec.exe = config_.bwrap;
  spec.args = std::move(args);
}

std::string AttemptSandbox::DescribeSlurmTask() const {
  std::string devices = "the node's accelerator devices";
  if (!task_devices_.empty()) devices += " and " + std::to_string(task_devices_.size()) + " more";
  return config_.version +
         " in each Slurm task: user and IPC namespaces and /dev/shm of the job's tasks on the "
         "node, the node's network (ranks span nodes), " +
         FileSystemView(config_, devices + " bound");
}

std::vector<std::filesystem::path> AcceleratorDevices(const std::filesystem::path& dev) {
  static const std::set<std::string> kNames = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                                               "nvidia-modeset", "nvidia-caps", "infiniband",
                                               "kfd", "dri"};
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dev, ec)) {
    const std::string name = entry.path().filename().string();
    const bool numbered = name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
                          name.find_first_not_of("0123456789", 6) == std::string::npos;
    if (kNames.count(name) != 0 || numbered) found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

int RemoveStaleShmDirs(const std::filesystem::path& shm_root) {
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(shm_root, ec)) {
    // gatehouse-sandbox-p<agent pid>-XXXXXX: stale when that agent is gone.
    const std::string name = entry.path().filename().string();
    constexpr std::string_view kPrefix = "gatehouse-sandbox-p";
    if (name.rfind(kPrefix, 0) != 0) continue;
    const size_t dash = name.find('-', kPrefix.size());
    if (dash == std::string::npos) continue;
    if (!GoneProcess(std::string_view(name).substr(kPrefix.size(), dash - kPrefix.size()))) {
      continue;
    }
    std::error_code rm;
    if (std::filesystem::remove_all(entry.path(), rm) > 0 && !rm) ++removed;
  }
  return removed;
}

std::vector<std::string> DropAbsentCovers(
    std::vector<std::string> command,
    const std::function<bool(const std::string&)>& exists) {
  std::vector<std::string> out;
  out.reserve(command.size());
  size_t i = 0;
  if (!command.empty()) out.push_back(command[i++]);  // bwrap itself
  while (i < command.size()) {
    const std::string& a = command[i];
    if (a == "--") break;
    if (a == "--tmpfs" && i + 1 < command.size() && !exists(command[i + 1])) {
      i += 2;
      continue;
    }
    if (a == "--ro-bind" && i + 2 < command.size() && command[i + 1] == "/dev/null" &&
        !exists(command[i + 2])) {
      i += 3;
      continue;
    }
    // bwrap's options that take arguments are copied whole, so a value is never read as one.
    size_t take = 1;
    if (a == "--ro-bind" || a == "--bind" || a == "--dev-bind" || a == "--ro-bind-try" ||
        a == "--bind-try" || a == "--symlink" || a == "--setenv") {
      take = 3;
    } else if (a == "--tmpfs" || a == "--dev" || a == "--proc" || a == "--chdir" ||
               a == "--dir" || a == "--info-fd" || a == "--unsetenv" || a == "--remount-ro") {
      take = 2;
    }
    for (size_t k = 0; k < take && i < command.size(); ++k) out.push_back(command[i++]);
  }
  out.insert(out.end(), command.begin() + static_cast<std::ptrdiff_t>(i), command.end());
  return out;
}

std::vector<std::string> PrepareSlurmTaskCommand(
    std::vector<std::string> command, const std::function<bool(const std::string&)>& exists,
    const std::vector<std::filesystem::path>& devices, const std::filesystem::path& shm_dir) {
  command = DropAbsentCovers(std::move(command), exists);
  std::vector<std::string> mounts;
  for (const auto& device : devices) {
    mounts.insert(mounts.end(), {"--dev-bind", device.string(), device.string()});
  }
  if (!shm_dir.empty()) mounts.insert(mounts.end(), {"--bind", shm_dir.string(), "/dev/shm"});
  // After bwrap's `--dev /dev` (BwrapArgs puts it before any program argument).
  for (size_t i = 1; i + 1 < command.size() && command[i] != "--"; ++i) {
    if (command[i] == "--dev" && command[i + 1] == "/dev") {
      command.insert(command.begin() + static_cast<std::ptrdiff_t>(i + 2), mounts.begin(),
                     mounts.end());
      break;
    }
  }
  return command;
}

Result<std::filesystem::path> OpenSlurmJobShm(const std::filesystem::path& shm_root,
                                              std::string_view job_id) {
  namespace fs = std::filesystem;
  const std::string prefix = "gatehouse-slurm-";
  if (job_id.empty() || job_id.find_first_not_of("0123456789_") != std::string_view::npos) {
    return Status::FailedPrecondition("slurm job id '" + std::string(job_id) +
                                      "' is not a job id");
  }
  // Other jobs' directories that no task holds any more (their tasks have all ended).
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(shm_root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name == prefix + std::string(job_id)) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code rm;
      fs::remove_all(entry.path(), rm);
    }
    ::close(fd);
  }
  const fs::path dir = shm_root / (prefix + std::string(job_id));
  // Another job's task may be removing this directory as unheld between mkdir and flock: then
  // it is gone from its path once locked, and made again.
  for (int tries = 0; tries < 5; ++tries) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return Status::FailedPrecondition("cannot make " + dir.string() + ": " +
                                        std::strerror(errno));
    }
    // Held (shared) for as long as this task runs: the descriptor is inherited across exec.
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_uid != ::geteuid() ||
        (st.st_mode & 0077) != 0) {
      const std::string why = fd < 0 ? std::strerror(errno) : "not a 0700 directory of this user";
      if (fd >= 0) ::close(fd);
      return Status::FailedPrecondition("cannot use " + dir.string() + ": " + why);
    }
    if (::flock(fd, LOCK_SH) != 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return Status::FailedPrecondition("cannot lock " + dir.string() + ": " + why);
    }
    struct stat now {};
    if (::lstat(dir.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev) {
      return dir;
    }
    ::close(fd);
  }
  return Status::FailedPrecondition("cannot hold " + dir.string() + ": removed as it was made");
}

}  // namespace gatehouse::agent
