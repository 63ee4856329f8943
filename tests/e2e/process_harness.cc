#include "process_harness.h"

#include <signal.h>

#include <boost/process.hpp>
#include <fstream>
#include <sstream>
#include <thread>

namespace gatehouse::testing {

namespace bp = boost::process;
namespace fs = std::filesystem;

namespace {
std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

struct Daemon::Impl {
  fs::path out;
  fs::path err;
  bp::child child;
};

Daemon::Daemon(const std::string& exe, const std::vector<std::string>& args,
               const fs::path& log_prefix)
    : impl_(std::make_unique<Impl>()) {
  impl_->out = log_prefix.string() + ".stdout";
  impl_->err = log_prefix.string() + ".stderr";
  impl_->child = bp::child(exe, bp::args(args), bp::std_out > impl_->out.string(),
                           bp::std_err > impl_->err.string(), bp::std_in.close());
}

Daemon::~Daemon() { Stop(); }

bool Daemon::running() {
  std::error_code ec;
  return impl_->child.valid() && impl_->child.running(ec);
}

std::optional<std::string> Daemon::WaitForLine(const std::regex& pattern,
                                               std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::istringstream lines(ReadFile(impl_->out));
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (std::regex_search(line, m, pattern)) return m.size() > 1 ? m[1].str() : line;
    }
    if (!running()) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return std::nullopt;
}

void Daemon::Stop() {
  if (!running()) return;
  ::kill(impl_->child.id(), SIGTERM);
  for (int i = 0; i < 100 && running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::error_code ec;
  if (running()) impl_->child.terminate(ec);
  impl_->child.wait(ec);
}

void Daemon::Interrupt() {
  if (running()) ::kill(impl_->child.id(), SIGINT);
}

void Daemon::Kill() {
  if (!running()) return;
  ::kill(impl_->child.id(), SIGKILL);
  std::error_code ec;
  impl_->child.wait(ec);
}

std::string Daemon::Stderr() const { return ReadFile(impl_->err); }

CommandResult RunCommand(const std::string& exe, const std::vector<std::string>& args,
                         const fs::path& cwd) {
  CommandResult r;
  try {
    fs::path path = exe.find('/') == std::string::npos ? bp::search_path(exe) : fs::path(exe);
    bp::ipstream out;
    bp::child c(path.string(), bp::args(args), bp::start_dir(cwd.string()),
                (bp::std_out & bp::std_err) > out, bp::std_in.close());
    std::string line;
    while (std::getline(out, line)) r.output += line + "\n";
    c.wait();
    r.exit_code = c.exit_code();
  } catch (const std::exception& e) {
    r.output += std::string("failed to run ") + exe + ": " + e.what();
  }
  return r;
}

}  // namespace gatehouse::testing
