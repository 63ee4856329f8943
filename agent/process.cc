// Child processes through Boost.Process v1 (argv only; no shell), output drained with poll(2).
#include "agent/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>

#include <boost/process/args.hpp>
#include <boost/process/child.hpp>
#include <boost/process/env.hpp>
#include <boost/process/environment.hpp>
#include <boost/process/exe.hpp>
#include <boost/process/extend.hpp>
#include <boost/process/io.hpp>
#include <boost/process/pipe.hpp>
#include <boost/process/search_path.hpp>
#include <boost/process/start_dir.hpp>

namespace gatehouse::agent {
namespace {

namespace bp = boost::process;
using Clock = std::chrono::steady_clock;

constexpr size_t kReadChunkBytes = 64 * 1024;
constexpr auto kPollInterval = std::chrono::milliseconds(100);
// How long pipes held open by descendants are read after the child itself exited.

// Runs in the forked child before exec, after the redirections: own process group (so a cancel
// reaches cmake's or the worker's descendants), no signals blocked (the agent blocks
// SIGTERM/SIGINT for its signal thread, and a mask survives exec), default SIGPIPE, and no
// descriptor besides 0-2 and Boost's exec-error pipe (`keep`, -1 for none). Only
// async-signal-safe calls. (bp::limit_handles would do the last part, but in Boost 1.81 it also
// closes stdout/stderr redirected to a bp::pipe, which declares no used handles.)
void PrepareChild(int keep) {
  ::setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  if (keep < 3) {
    ::close_range(3, ~0U, 0);
  } else {
    if (keep > 3) ::close_range(3, static_cast<unsigned>(keep) - 1, 0);
    ::close_range(static_cast<unsigned>(keep) + 1, ~0U, 0);
  }
}

// Runs in the forked child before exec: writes its pid to each `procs` file (cgroup.procs of
// the cgroups to join). Only async-signal-safe calls; a failure ends the child (code 126) with
// a line on its standard error naming the file and errno.
void JoinCgroups(const std::vector<std::string>& procs) {
  if (procs.empty()) return;
  char digits[24];
  size_t n = 0;
  for (pid_t pid = ::getpid(); pid > 0; pid /= 10) digits[n++] = static_cast<char>('0' + pid % 10);
  char text[24];
  for (size_t i = 0; i < n; ++i) text[i] = digits[n - 1 - i];
  for (const std::string& path : procs) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    bool joined = false;
    int err = errno;
    if (fd >= 0) {
      joined = ::write(fd, text, n) == static_cast<ssize_t>(n);
      err = errno;
      ::close(fd);
    }
    if (!joined) {
      char code[16];
      size_t k = sizeof(code);
      for (int e = err > 0 ? err : 0; k == sizeof(code) || e > 0; e /= 10) {
        code[--k] = static_cast<char>('0' + e % 10);
      }
      static constexpr char kMessage[] = "gatehouse-agent: cannot join the attempt's cgroup: ";
      (void)!::write(2, kMessage, sizeof(kMessage) - 1);
      (void)!::write(2, path.c_str(), path.size());
      (void)!::write(2, " (errno ", 8);
      (void)!::write(2, code + k, sizeof(code) - k);
      (void)!::write(2, ")\n", 2);
      ::_exit(126);
    }
  }
}

void SignalGroup(pid_t pid, int sig) {
  if (pid <= 0) return;
  // The child may not have reached setpgid yet; signal it directly too.
  ::kill(-pid, sig);
  ::kill(pid, sig);
}

ProcessExit DecodeWaitStatus(int status) {
  ProcessExit exit;
  if (WIFSIGNALED(status)) {
    exit.signal = WTERMSIG(status);
    exit.exit_code = 128 + exit.signal;
  } else if (WIFEXITED(status)) {
    exit.exit_code = WEXITSTATUS(status);
  } else {
    exit.exit_code = -1;
  }
  return exit;
}

}  // namespace

std::string ProcessExit::Describe() const {
  std::string s = "exited with code " + std::to_string(exit_code);
  if (signal != 0) s += " (signal " + std::to_string(signal) + ")";
  return s;
}

std::filesystem::path FindProgram(std::string_view name) {
  return bp::search_path(std::string(name));
}

Result<ProcessExit> RunProcess(const ProcessSpec& spec, const OutputHandler& on_stdout,
                               const OutputHandler& on_stderr, CancelToken cancel) {
  std::filesystem::path exe = spec.exe;
  if (!exe.has_parent_path()) {
    exe = FindProgram(spec.exe.string());
    if (exe.empty()) {
      return Status::NotFound("program '" + spec.exe.string() + "' not found in PATH");
    }
  }
  std::error_code fs_ec;
  exe = std::filesystem::absolute(exe, fs_ec);  // the child resolves it after changing directory
  if (!std::filesystem::is_regular_file(exe, fs_ec)) {
    return Status::NotFound("program '" + exe.string() + "' does not exist");
  }

  bp::environment env = boost::this_process::environment();
  for (const auto& [key, value] : spec.env) env[key] = value;
  const std::filesystem::path cwd = spec.cwd.empty() ? std::filesystem::current_path() : spec.cwd;
  std::vector<std::string> cgroup_procs;
  for (const auto& dir : spec.cgroups) cgroup_procs.push_back((dir / "cgroup.procs").string());
  // Must come after the redirections in the argument list: handlers run in that order.
  const auto exec_setup = bp::extend::on_exec_setup = [&cgroup_procs](auto& exec) {
    JoinCgroups(cgroup_procs);
    const auto used = exec.get_used_handles();
    PrepareChild(used.empty() ? -1 : used.front());
  };

  bp::pipe out_pipe;
  std::optional<bp::pipe> err_pipe;
  std::error_code ec;
  bp::child child;
  if (spec.merge_stderr) {
    child = bp::child(bp::exe = exe, bp::args = spec.args, env, bp::start_dir = cwd,
                      bp::std_in < bp::null, (bp::std_out & bp::std_err) > out_pipe,
                      exec_setup, ec);
  } else {
    err_pipe.emplace();
    child = bp::child(bp::exe = exe, bp::args = spec.args, env, bp::start_dir = cwd,
                      bp::std_in < bp::null, bp::std_out > out_pipe, bp::std_err > *err_pipe,
                      exec_setup, ec);
  }
  if (ec) {
    return Status::Unavailable("cannot start '" + exe.string() + "': " + ec.message());
  }
  const pid_t pid = child.id();

  std::array<pollfd, 2> fds{};
  std::array<const OutputHandler*, 2> handlers{&on_stdout, &on_stderr};
  fds[0] = {out_pipe.native_source(), POLLIN, 0};
  fds[1] = {err_pipe ? err_pipe->native_source() : -1, POLLIN, 0};
  int open_fds = err_pipe ? 2 : 1;

  std::string buffer(kReadChunkBytes, '\0');
  std::optional<Clock::time_point> exited_at;
  std::optional<Clock::time_point> term_sent_at;
  bool kill_sent = false;
  bool exited = false;
  bool output_cut = false;
  while (open_fds > 0 || !exited) {
    const auto now = Clock::now();
    if (!term_sent_at && !exited && cancel.requested()) {
      SignalGroup(pid, SIGTERM);
      term_sent_at = now;
    }
    if (term_sent_at && !kill_sent && !exited && now - *term_sent_at >= cancel.grace) {
      SignalGroup(pid, SIGKILL);
      kill_sent = true;
    }
    if (exited && open_fds > 0 && now - *exited_at >= spec.log_flush_timeout) {
      // Descendants outlived the child and still hold the pipes: end them.
      ::kill(-pid, SIGKILL);
      output_cut = true;
      break;
    }

    // Once both pipes are closed, only the exit is awaited: look more often.
    const int timeout_ms = open_fds > 0 ? static_cast<int>(kPollInterval.count()) : 10;
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      const std::string why = std::strerror(errno);
      SignalGroup(pid, SIGKILL);
      child.wait(ec);
      return Status::Internal("poll on the output of '" + exe.string() + "' failed: " + why);
    }
    for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer.data(), buffer.size());
      if (n > 0) {
        (*handlers[i])(std::string_view(buffer.data(), static_cast<size_t>(n)));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;  // EOF (or a broken pipe): stop polling it
        --open_fds;
      }
    }
    if (!exited && !child.running(ec)) {
      exited = true;
      exited_at = Clock::now();
    }
  }

  child.wait(ec);
  if (ec) {
    return Status::Internal("waiting for '" + exe.string() + "' failed: " + ec.message());
  }
  ProcessExit result = DecodeWaitStatus(child.native_exit_code());
  result.output_cut = output_cut;
  return result;
}

Result<std::string> RunForOutput(const ProcessSpec& spec) {
  std::string out, err;
  GH_ASSIGN_OR_RETURN(const ProcessExit exit,
                      RunProcess(
                          spec, [&](std::string_view b) { out.append(b); },
                          [&](std::string_view b) { err.append(b); }));
  if (!exit.ok()) {
    while (!err.empty() && err.back() == '\n') err.pop_back();
    return Status::Unavailable(spec.exe.filename().string() + " " + exit.Describe() +
                               (err.empty() ? "" : ": " + err));
  }
  return out;
}

std::optional<pid_t> GoneProcess(std::string_view digits) {
  pid_t pid = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (ec != std::errc() || end != digits.data() + digits.size() || pid <= 0) return std::nullopt;
  if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) return std::nullopt;
  return pid;
}

}  // namespace gatehouse::agent
