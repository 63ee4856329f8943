// Per-attempt cgroups (docs/protocols.md §3.7).
#include "agent/cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "agent/process.h"

namespace gatehouse::agent {
namespace fs = std::filesystem;

namespace {

std::vector<std::string> Split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = text.find(sep, start);
    parts.emplace_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return parts;
}

// mountinfo escapes space, tab, newline and backslash as \ooo (octal).
std::string Unescape(std::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string_view oct = field.substr(i + 1, 3);
      if (oct.size() == 3 && oct.find_first_not_of("01234567") == std::string_view::npos) {
        out.push_back(static_cast<char>(std::stoi(std::string(oct), nullptr, 8)));
        i += 3;
        continue;
      }
    }
    out.push_back(field[i]);
  }
  return out;
}

// `path` (a cgroup path as /proc/self/cgroup shows it) under a mount of cgroup root `root` at
// `mount_point`; empty when the path is outside that root.
fs::path UnderMount(const std::string& mount_point, const std::string& root,
                    const std::string& path) {
  for (const fs::path& part : fs::path(path)) {
    if (part == "..") return {};  // never outside the mount
  }
  std::string rest;
  if (root == "/") {
    rest = path;
  } else if (path == root || path.rfind(root + "/", 0) == 0) {
    rest = path.substr(root.size());
  } else {
    return {};
  }
  const fs::path relative = fs::path(rest).relative_path();
  return relative.empty() ? fs::path(mount_point) : fs::path(mount_point) / relative;
}

bool Contains(const std::vector<std::string>& words, std::string_view word) {
  for (const std::string& w : words) {
    if (w == word) return true;
  }
  return false;
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// Writes `value` to a cgroup interface file (it exists: no O_CREAT). Errors: INTERNAL naming
// the file and the OS error.
Status WriteValue(const fs::path& path, const std::string& value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::Internal("cgroup: cannot open " + path.string() + ": " + std::strerror(errno));
  }
  const ssize_t n = ::write(fd, value.data(), value.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return Status::Internal("cgroup: writing '" + value + "' to " + path.string() + ": " +
                            std::strerror(n < 0 ? err : EIO));
  }
  return Status::Ok();
}

// The value of `key` in a flat keyed file ("oom_kill 3" lines); -1 when absent.
int64_t KeyedValue(const fs::path& path, std::string_view key) {
  std::istringstream in(ReadText(path));
  std::string k;
  int64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return -1;
}

std::set<pid_t> Pids(const std::vector<fs::path>& dirs) {
  std::set<pid_t> pids;
  for (const fs::path& dir : dirs) {
    std::istringstream in(ReadText(dir / "cgroup.procs"));
    for (pid_t pid; in >> pid;) pids.insert(pid);
  }
  return pids;
}

int KillCgroup(int version, const std::vector<fs::path>& dirs, int wait_ms);

// Why the agent cannot make cgroups in `dir`, or "" when it can.
std::string NotWritable(const fs::path& dir, bool v2) {
  for (const fs::path& path :
       {dir, dir / "cgroup.procs", v2 ? dir / "cgroup.subtree_control" : dir}) {
    if (::access(path.c_str(), W_OK) != 0) {
      return path.string() + ": not writable by uid " + std::to_string(::geteuid()) + " (" +
             std::strerror(errno) +
             "; is it delegated to the agent: systemd's Delegate=, a container's writable "
             "cgroupfs?)";
    }
  }
  return "";
}

}  // namespace

CgroupPlace LocateCgroups(std::string_view proc_self_cgroup, std::string_view mountinfo) {
  // The mounts: cgroup2's one, and the v1 ones holding memory and pids.
  struct Mount {
    std::string root, point;
  };
  // Every mount of each kind: a bind mount of a subtree may come before the one holding us.
  std::vector<Mount> v2_mounts, memory_mounts, pids_mounts;
  for (const std::string& line : Split(mountinfo, '\n')) {
    const std::vector<std::string> fields = Split(line, ' ');
    size_t dash = 0;
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (dash < 6 || dash + 3 >= fields.size()) continue;  // fstype, source, super options
    const std::string& type = fields[dash + 1];
    const Mount mount{Unescape(fields[3]), Unescape(fields[4])};
    if (type == "cgroup2") {
      v2_mounts.push_back(mount);
    } else if (type == "cgroup") {
      const std::vector<std::string> options = Split(fields[dash + 3], ',');
      if (Contains(options, "memory")) memory_mounts.push_back(mount);
      if (Contains(options, "pids")) pids_mounts.push_back(mount);
    }
  }
  // The first mount that shows `path`.
  const auto find = [](const std::vector<Mount>& mounts, const std::string& path) {
    for (const Mount& m : mounts) {
      if (fs::path dir = UnderMount(m.point, m.root, path); !dir.empty()) return dir;
    }
    return fs::path();
  };
  CgroupPlace place;
  for (const std::string& line : Split(proc_self_cgroup, '\n')) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string id = line.substr(0, first);
    const std::vector<std::string> controllers =
        Split(std::string_view(line).substr(first + 1, second - first - 1), ',');
    const std::string path = line.substr(second + 1);
    if (id == "0" && controllers == std::vector<std::string>{""}) {
      place.v2 = find(v2_mounts, path);
      continue;
    }
    if (Contains(controllers, "memory")) place.v1_memory = find(memory_mounts, path);
    if (Contains(controllers, "pids")) place.v1_pids = find(pids_mounts, path);
  }
  return place;
}

CgroupConfig PrepareCgroups(CgroupConfig config, std::string_view proc_self_cgroup,
                            std::string_view mountinfo, pid_t self) {
  config.version = 0;
  const CgroupPlace place = LocateCgroups(proc_self_cgroup, mountinfo);
  const std::vector<std::string> controllers =
      place.v2.empty() ? std::vector<std::string>{}
                       : Words(ReadText(place.v2 / "cgroup.controllers"));
  if (Contains(controllers, "memory")) {
    if (std::string why = NotWritable(place.v2, true); !why.empty()) {
      config.none_reason = std::move(why);
      return config;
    }
    if (config.max_processes > 0 && !Contains(controllers, "pids")) {
      config.none_reason = "a process limit needs the pids controller, which " +
                           place.v2.string() + " does not offer (cgroup.controllers)";
      return config;
    }
    std::vector<std::string> wanted = {"memory"};
    if (Contains(controllers, "pids")) wanted.push_back("pids");
    const std::vector<std::string> enabled = Words(ReadText(place.v2 / "cgroup.subtree_control"));
    std::string enable;
    for (const std::string& c : wanted) {
      if (!Contains(enabled, c)) enable += (enable.empty() ? "+" : " +") + c;
    }
    if (!enable.empty()) {
      // A cgroup that hands controllers to its children holds no processes: the agent (and
      // only it; others would block this) moves into a leaf of its own first.
      bool moved = false;
      if (!Words(ReadText(place.v2 / "cgroup.procs")).empty()) {
        std::error_code ec;
        fs::create_directory(place.v2 / "agent", ec);
        if (ec) {
          config.none_reason = "cgroup: cannot make " + (place.v2 / "agent").string() + ": " +
                               ec.message();
          return config;
        }
        if (Status s = WriteValue(place.v2 / "agent" / "cgroup.procs", std::to_string(self));
            !s.ok()) {
          config.none_reason = s.message();
          return config;
        }
        moved = true;
      }
      if (Status s = WriteValue(place.v2 / "cgroup.subtree_control", enable); !s.ok()) {
        config.none_reason = s.message() + " (another process shares the agent's cgroup?)";
        if (moved) {  // back where it was, as if never tried
          (void)WriteValue(place.v2 / "cgroup.procs", std::to_string(self));
          ::rmdir((place.v2 / "agent").c_str());
        }
        return config;
      }
    }
    config.version = 2;
    config.parent = place.v2;
    return config;
  }
  if (!place.v1_memory.empty()) {
    if (std::string why = NotWritable(place.v1_memory, false); !why.empty()) {
      config.none_reason = std::move(why);
      return config;
    }
    const std::string pids_why =
        place.v1_pids.empty() ? "the agent's cgroups have no pids hierarchy"
                              : NotWritable(place.v1_pids, false);
    if (config.max_processes > 0 && !pids_why.empty()) {
      config.none_reason = "a process limit needs the pids controller: " + pids_why;
      return config;
    }
    config.version = 1;
    config.parent = place.v1_memory;
    if (pids_why.empty()) config.v1_pids_parent = place.v1_pids;
    return config;
  }
  config.none_reason = "no cgroup hierarchy offers the memory controller to the agent's cgroup";
  return config;
}

CgroupConfig PrepareCgroups(CgroupConfig config) {
  return PrepareCgroups(std::move(config), ReadText("/proc/self/cgroup"),
                        ReadText("/proc/self/mountinfo"), ::getpid());
}

std::string DescribeCgroupConfig(const CgroupConfig& config) {
  if (config.version == 0) return "none: " + config.none_reason;
  return "v" + std::to_string(config.version) + " under " + config.parent.string() +
         ": memory limit " +
         (config.memory_limit_bytes > 0 ? FormatBytes(config.memory_limit_bytes) : "none") +
         ", process limit " +
         (config.max_processes > 0 ? std::to_string(config.max_processes) : "none") +
         " per attempt";
}

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), value == static_cast<int64_t>(value) ? "%.0f %s" : "%.1f %s",
                value, kUnits[unit]);
  return text;
}

Result<std::unique_ptr<AttemptCgroup>> AttemptCgroup::Create(const CgroupConfig& config,
                                                             const std::string& name) {
  if (config.version != 1 && config.version != 2) {
    return Status::FailedPrecondition("cgroup: none prepared: " + config.none_reason);
  }
  std::vector<fs::path> dirs = {config.parent / name};
  if (config.version == 1 && !config.v1_pids_parent.empty()) {
    dirs.push_back(config.v1_pids_parent / name);
  }
  const auto remove_dirs = [&] {
    for (const fs::path& dir : dirs) ::rmdir(dir.c_str());
  };
  for (const fs::path& dir : dirs) {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      const std::string why = std::strerror(errno);
      remove_dirs();
      return Status::Internal("cgroup: cannot make " + dir.string() + ": " + why);
    }
  }
  std::vector<std::pair<fs::path, std::string>> writes;
  bool swap_limited = false;  // the kernel accounts swap (swapaccount) and it is limited too
  std::string description = "cgroup v" + std::to_string(config.version) + " " + dirs[0].string();
  const std::string limit = std::to_string(config.memory_limit_bytes);
  if (config.version == 2) {
    if (config.memory_limit_bytes > 0) {
      writes.emplace_back(dirs[0] / "memory.max", limit);
      // Swap would let the attempt pass its limit slowly instead of being stopped.
      swap_limited = fs::exists(dirs[0] / "memory.swap.max");
      if (swap_limited) writes.emplace_back(dirs[0] / "memory.swap.max", "0");
    }
    if (config.max_processes > 0) {
      if (!fs::exists(dirs[0] / "pids.max")) {
        remove_dirs();
        return Status::FailedPrecondition(
            "cgroup: a process limit needs the pids controller, which " + config.parent.string() +
            " does not offer");
      }
      writes.emplace_back(dirs[0] / "pids.max", std::to_string(config.max_processes));
    }
  } else {
    if (dirs.size() > 1) description += " and " + dirs[1].string();
    if (config.memory_limit_bytes > 0) {
      writes.emplace_back(dirs[0] / "memory.limit_in_bytes", limit);
      swap_limited = fs::exists(dirs[0] / "memory.memsw.limit_in_bytes");
      if (swap_limited) writes.emplace_back(dirs[0] / "memory.memsw.limit_in_bytes", limit);
    }
    if (config.max_processes > 0) {
      if (dirs.size() < 2) {
        remove_dirs();
        return Status::FailedPrecondition(
            "cgroup: a process limit needs the pids controller, which the agent's v1 cgroups "
            "do not offer");
      }
      writes.emplace_back(dirs[1] / "pids.max", std::to_string(config.max_processes));
    }
  }
  for (const auto& [path, value] : writes) {
    if (Status s = WriteValue(path, value); !s.ok()) {
      remove_dirs();
      return s;
    }
  }
  description += ": memory limit " + (config.memory_limit_bytes > 0
                                          ? FormatBytes(config.memory_limit_bytes) +
                                                (swap_limited ? " (no swap)"
                                                              : " (swap not accounted)")
                                          : std::string("none"));
  description += ", process limit " + (config.max_processes > 0
                                           ? std::to_string(config.max_processes)
                                           : std::string("none"));
  return std::unique_ptr<AttemptCgroup>(new AttemptCgroup(
      config.version, std::move(dirs), config.memory_limit_bytes, std::move(description)));
}

AttemptCgroup::AttemptCgroup(int version, std::vector<fs::path> dirs, int64_t memory_limit,
                             std::string description)
    : version_(version),
      dirs_(std::move(dirs)),
      memory_limit_(memory_limit),
      description_(std::move(description)) {}

AttemptCgroup::~AttemptCgroup() {
  if (const int left = KillAll(); left > 0) {
    spdlog::warn("{}: killed {} process(es) left behind", dirs_[0].string(), left);
  }
  for (const fs::path& dir : dirs_) {
    if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
      spdlog::warn("cgroup: cannot remove {}: {}", dir.string(), std::strerror(errno));
    }
  }
}

int64_t AttemptCgroup::OomKills() const {
  const int64_t n = KeyedValue(dirs_[0] / (version_ == 2 ? "memory.events" : "memory.oom_control"),
                               "oom_kill");
  return n < 0 ? 0 : n;
}

int64_t AttemptCgroup::PeakBytes() const {
  const std::string text =
      ReadText(dirs_[0] / (version_ == 2 ? "memory.peak" : "memory.max_usage_in_bytes"));
  try {
    return text.empty() ? -1 : std::stoll(text);
  } catch (const std::exception&) {
    return -1;
  }
}

Status AttemptCgroup::LimitMemory(int64_t bytes, const std::string& why) {
  const std::string value = std::to_string(bytes);
  if (version_ == 2) {
    GH_RETURN_IF_ERROR(WriteValue(dirs_[0] / "memory.max", value));
    if (fs::exists(dirs_[0] / "memory.swap.max")) {
      GH_RETURN_IF_ERROR(WriteValue(dirs_[0] / "memory.swap.max", "0"));
    }
  } else {
    // v1 wants memsw.limit >= limit at every step: lowering, the plain limit goes first.
    const bool lowering = memory_limit_ == 0 || bytes < memory_limit_;
    const fs::path plain = dirs_[0] / "memory.limit_in_bytes";
    const fs::path memsw = dirs_[0] / "memory.memsw.limit_in_bytes";
    const bool swap = fs::exists(memsw);
    if (lowering) GH_RETURN_IF_ERROR(WriteValue(plain, value));
    if (swap) GH_RETURN_IF_ERROR(WriteValue(memsw, value));
    if (!lowering) GH_RETURN_IF_ERROR(WriteValue(plain, value));
  }
  const std::string old = "memory limit " + (memory_limit_ > 0 ? FormatBytes(memory_limit_)
                                                                : std::string("none"));
  memory_limit_ = bytes;
  memory_limit_why_ = why;
  const std::string now = "memory limit " + FormatBytes(bytes) + (why.empty() ? "" : " (" + why + ")");
  if (auto at = description_.find(old); at != std::string::npos) {
    description_.replace(at, old.size(), now);
  } else {
    description_ += "; " + now;
  }
  return Status::Ok();
}

std::string AttemptCgroup::OomNote() const {
  const int64_t kills = OomKills();
  if (kills <= 0) return "";
  return "the attempt's cgroup reached its memory limit" +
         (memory_limit_ > 0 ? " (" + FormatBytes(memory_limit_) +
                                  (memory_limit_why_.empty() ? "" : ": " + memory_limit_why_) +
                                  ")"
                            : std::string()) +
         ": the kernel killed " + std::to_string(kills) + (kills == 1 ? " process" : " processes");
}

int AttemptCgroup::KillAll(int wait_ms) { return KillCgroup(version_, dirs_, wait_ms); }

namespace {

// SIGKILL to every process in `dirs` (v2 `cgroup.kill` where the kernel has it), then waits up
// to `wait_ms` for them to leave. Returns how many were found.
int KillCgroup(int version, const std::vector<fs::path>& dirs, int wait_ms) {
  std::set<pid_t> pids = Pids(dirs);
  const int found = static_cast<int>(pids.size());
  if (pids.empty()) return 0;
  const bool kill_file = version == 2 && fs::exists(dirs[0] / "cgroup.kill");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (!pids.empty() && std::chrono::steady_clock::now() < deadline) {
    // cgroup.kill reaches processes forked meanwhile too; the v1 loop catches them next round.
    if (kill_file) {
      (void)WriteValue(dirs[0] / "cgroup.kill", "1");
    } else {
      for (const pid_t pid : pids) ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pids = Pids(dirs);
  }
  return found;
}

}  // namespace

int RemoveStaleCgroups(const CgroupConfig& config) {
  if (config.version == 0) return 0;
  int removed = 0;
  for (const fs::path& parent : {config.parent, config.v1_pids_parent}) {
    if (parent.empty()) continue;
    std::error_code ec;
    for (const fs::directory_entry& entry : fs::directory_iterator(parent, ec)) {
      // gatehouse-a<attempt>-p<agent pid>: stale when that agent is gone.
      const std::string name = entry.path().filename().string();
      const size_t p = name.rfind("-p");
      if (name.rfind("gatehouse-a", 0) != 0 || p == std::string::npos || !entry.is_directory()) {
        continue;
      }
      const std::optional<pid_t> owner = GoneProcess(std::string_view(name).substr(p + 2));
      if (!owner) continue;
      const int left = KillCgroup(config.version, {entry.path()}, 30000);
      if (::rmdir(entry.path().c_str()) == 0) {
        ++removed;
        spdlog::info("cgroup: removed {} of a gone agent (pid {}){}", entry.path().string(),
                     *owner, left > 0 ? ", killing " + std::to_string(left) + " process(es)" : "");
      } else {
        spdlog::warn("cgroup: cannot remove {} of a gone agent: {}", entry.path().string(),
                     std::strerror(errno));
      }
    }
  }
  return removed;
}

}  // namespace gatehouse::agent
