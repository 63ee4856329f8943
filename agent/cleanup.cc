#include "agent/cleanup.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <system_error>

namespace gatehouse::agent {
namespace fs = std::filesystem;

bool CleanupReport::healthy() const {
  if (!leftover_processes.empty() || !busy_ports.empty()) return false;
  for (const Gpu& g : gpus) {
    if (g.used_mib > g.baseline_mib + gpu_tolerance_mib) return false;
  }
  return true;
}

std::string CleanupReport::Summary() const {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : "; ") + part; };
  if (!leftover_processes.empty()) {
    std::string list;
    for (const auto& p : leftover_processes) list += (list.empty() ? "" : ", ") + p;
    add(std::to_string(leftover_processes.size()) + " leftover process" +
        (leftover_processes.size() == 1 ? "" : "es") + ": " + list);
  }
  for (int port : busy_ports) add("port " + std::to_string(port) + " still in use");
  for (const Gpu& g : gpus) {
    if (g.used_mib > g.baseline_mib + gpu_tolerance_mib) {
      add("GPU " + std::to_string(g.index) + ": " + std::to_string(g.used_mib) +
          " MiB used, baseline " + std::to_string(g.baseline_mib) + " MiB (tolerance " +
          std::to_string(gpu_tolerance_mib) + ")");
    }
  }
  return out.empty() ? "clean" : out;
}

nlohmann::json CleanupReport::ToJson() const {
  nlohmann::json gpus_json = nlohmann::json::array();
  for (const Gpu& g : gpus) {
    gpus_json.push_back(
        {{"index", g.index}, {"baseline_mib", g.baseline_mib}, {"used_mib", g.used_mib}});
  }
  return {{"healthy", healthy()},          {"leftover_processes", leftover_processes},
          {"busy_ports", busy_ports},       {"gpus", gpus_json},
          {"gpu_tolerance_mib", gpu_tolerance_mib}, {"gpu_note", gpu_note}};
}

CleanupChecker::CleanupChecker(GpuMemoryProbe probe, int64_t gpu_tolerance_mib)
    : probe_(std::move(probe)), tolerance_mib_(gpu_tolerance_mib) {}

Status CleanupChecker::TakeBaseline() {
  if (!probe_) {
    baseline_note_ = "no GPU probe";
    return Status::Ok();
  }
  auto used = probe_();
  if (!used.ok()) {
    baseline_note_ = "GPU baseline probe failed: " + used.status().message();
    return used.status();
  }
  baseline_ = std::move(used).value();
  baseline_note_ = baseline_.empty() ? "no GPUs" : "";
  return Status::Ok();
}

CleanupReport CleanupChecker::Check(const fs::path& attempt_dir,
                                    const std::vector<int>& ports) const {
  CleanupReport report;
  report.gpu_tolerance_mib = tolerance_mib_;
  report.leftover_processes = ProcessesUnder(attempt_dir);
  for (int port : ports) {
    if (port > 0 && !PortFree(port)) report.busy_ports.push_back(port);
  }
  if (!baseline_note_.empty()) {
    report.gpu_note = baseline_note_;
    return report;
  }
  auto used = probe_();
  if (!used.ok()) {
    report.gpu_note = "GPU probe failed: " + used.status().message();
    return report;
  }
  for (const auto& [index, baseline] : baseline_) {
    auto it = used->find(index);
    report.gpus.push_back({index, baseline, it == used->end() ? baseline : it->second});
  }
  return report;
}

std::vector<std::string> ProcessesUnder(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(dir, ec);
  if (ec || root.empty()) return out;
  const std::string self = std::to_string(::getpid());
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string pid = it->path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || pid == self) {
      continue;
    }
    std::error_code link_ec;
    const fs::path cwd = fs::read_symlink(it->path() / "cwd", link_ec);
    if (link_ec) continue;  // gone meanwhile, or not ours to read
    auto [root_end, cwd_it] = std::mismatch(root.begin(), root.end(), cwd.begin(), cwd.end());
    if (root_end != root.end()) continue;
    std::string comm;
    std::ifstream(it->path() / "comm") >> comm;
    out.push_back("pid " + pid + " (" + (comm.empty() ? "?" : comm) + ")");
  }
  return out;
}

bool PortFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return free;
}

}  // namespace gatehouse::agent
