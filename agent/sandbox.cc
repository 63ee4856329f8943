// Per-attempt isolation with bubblewrap (docs/protocols.md §3.6).
#include "agent/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <nlohmann/json.hpp>

extern char** environ;

namespace gatehouse::agent {

std::vector<std::string> BwrapArgs(const SandboxConfig& config, const SandboxPaths& paths) {
  std::vector<std::string> args = {"--die-with-parent", "--unshare-pid", "--unshare-ipc",
                                   "--unshare-uts", "--ro-bind", "/", "/", "--dev", "/dev",
                                   "--proc", "/proc"};
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
  const std::string bwrap = config.bwrap.string();
  std::vector<std::string> argv = {bwrap,          "--die-with-parent", "--unshare-user",
                                   "--unshare-net", "--ro-bind",         "/",
                                   "/",             "--info-fd",         "3",
                                   "--",            "cat"};
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
    return Status::Unavailable("sandbox: cannot start " + bwrap + ": " + std::strerror(rc));
  }
  const std::string text = ReadAll(info[0], std::chrono::seconds(10));
  ::close(info[0]);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  pid_t inner = -1;
  if (j.is_object() && j.contains("child-pid") && j["child-pid"].is_number_integer()) {
    inner = j["child-pid"].get<pid_t>();
  }
  if (inner <= 0) {
    ::close(lifeline[1]);
    ::kill(holder, SIGKILL);
    ::waitpid(holder, nullptr, 0);
    std::string why = ReadAll(errors[0], std::chrono::milliseconds(500));
    ::close(errors[0]);
    while (!why.empty() && why.back() == '\n') why.pop_back();
    return Status::Unavailable("sandbox: bwrap could not make a user and network namespace" +
                               (why.empty() ? std::string() : ": " + why));
  }
  ::close(errors[0]);
  std::string description = config.version + ": user+network namespace of the attempt (loopback only), "
                                      "read-only root, agent work dir hidden";
  if (!config.hidden_files.empty()) description += ", token hidden";
  description += ", attempt dir writable";
  if (config.max_processes > 0) description += ", nproc " + std::to_string(config.max_processes);
  return std::unique_ptr<AttemptSandbox>(
      new AttemptSandbox(config, holder, inner, lifeline[1], std::move(description)));
}

AttemptSandbox::AttemptSandbox(SandboxConfig config, pid_t holder, pid_t inner, int lifeline,
                               std::string description)
    : config_(std::move(config)),
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
}

void AttemptSandbox::Wrap(ProcessSpec& spec, const SandboxPaths& paths,
                          bool loopback_only) const {
  std::vector<std::string> args = {"--target", std::to_string(inner_), "--user"};
  if (loopback_only) args.push_back("--net");
  args.insert(args.end(), {"--preserve-credentials", "--", config_.bwrap.string()});
  const std::vector<std::string> bwrap = BwrapArgs(config_, paths);
  args.insert(args.end(), bwrap.begin(), bwrap.end());
  if (!spec.cwd.empty()) args.insert(args.end(), {"--chdir", spec.cwd.string()});
  args.push_back("--");
  if (config_.max_processes > 0) {
    args.insert(args.end(), {"prlimit", "--nproc=" + std::to_string(config_.max_processes), "--"});
  }
  args.push_back(spec.exe.string());
  args.insert(args.end(), spec.args.begin(), spec.args.end());
  spec.exe = config_.nsenter;
  spec.args = std::move(args);
  spec.env.emplace_back("GATEHOUSE_SANDBOX", description_);
  // The root (and /tmp with it) is read-only: temporary files go to the attempt's own dir.
  const std::filesystem::path tmp = paths.attempt_dir / "tmp";
  std::error_code ec;
  std::filesystem::create_directories(tmp, ec);
  spec.env.emplace_back("TMPDIR", tmp.string());
}

}  // namespace gatehouse::agent
