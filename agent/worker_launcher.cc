// Worker launch and rank supervision (docs/protocols.md §3, §3.1); each rank's output goes
// through output_relay.h.
#include "agent/worker_launcher.h"

#include "agent/slurm_launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

namespace gatehouse::agent {
namespace {

using nlohmann::json;

AttemptEndReport ErrorEnd(int64_t attempt_id, int64_t events, std::string reason) {
  AttemptEndReport end;
  end.attempt_id = attempt_id;
  end.seq = events + 1;
  end.outcome = std::string(kOutcomeError);
  end.reason = std::move(reason);
  return end;
}

Status WriteFile(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::Internal("cannot write " + tmp.string());
    out << text;
    if (!out.flush()) return Status::Internal("cannot write " + tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::Internal("cannot rename " + tmp.string() + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

json MakeRunSpec(const WorkerLaunch& launch) {
  json run = CellSpecToJson(launch.spec);
  run["attempt"] = {
      {"id", launch.attempt_id},
      {"dir", launch.attempt_dir.string()},
      {"checkout",
       {{"head", launch.checkout.head},
        {"clean", launch.checkout.clean},
        {"path", launch.checkout.path.string()}}},
      {"agent", launch.agent_name},
  };
  return run;
}

Result<int> FindFreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  std::string failed;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    failed = "bind 127.0.0.1:0";
  } else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    failed = "getsockname";
  }
  const int error = errno;
  ::close(fd);
  if (!failed.empty()) return Status::Unavailable(failed + ": " + std::strerror(error));
  return static_cast<int>(ntohs(addr.sin_port));
}

std::string RankLogStream(std::string_view stream, int rank) {
  std::string name(stream);
  if (rank != 0) name += ".rank" + std::to_string(rank);
  return name;
}

std::vector<std::pair<std::string, std::string>> WorkerEnvironment(const CellSpec& spec,
                                                                   int rank, int world_size,
                                                                   int master_port) {
  std::vector<std::pair<std::string, std::string>> env(spec.env.begin(), spec.env.end());
  // Later entries replace earlier ones (ProcessSpec::env), so the rank variables win.
  env.emplace_back("RANK", std::to_string(rank));
  env.emplace_back("WORLD_SIZE", std::to_string(world_size));
  env.emplace_back("LOCAL_RANK", std::to_string(rank));
  if (world_size > 1) {
    env.emplace_back("LOCAL_WORLD_SIZE", std::to_string(world_size));
    env.emplace_back("MASTER_ADDR", "127.0.0.1");
    env.emplace_back("MASTER_PORT", std::to_string(master_port));
  }
  return env;
}

namespace {

constexpr auto kCancelPoll = std::chrono::milliseconds(50);

// "0, 2, 3"
std::string JoinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (const int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// Supervises the ranks of one attempt for RunWorker: one thread per rank runs RunProcess; the
// first failure observed, or a cancel, stops the others through their shared stop flag. Every
// sink call (and the shared event counter) is guarded by mu_.
class WorkerGroup {
 public:
  WorkerGroup(int64_t attempt_id, AttemptSink& sink, CancelToken cancel,
              std::vector<ProcessSpec> specs)
      : attempt_id_(attempt_id),
        sink_(sink),
        cancel_(cancel),
        specs_(std::move(specs)),
        world_size_(static_cast<int>(specs_.size())),
        ranks_(specs_.size()) {
    for (int r = 0; r < world_size_; ++r) {
      Rank& rank = ranks_[static_cast<size_t>(r)];
      rank.relay = std::make_unique<WorkerStdoutRelay>(
          sink_, attempt_id_, &next_seq_, RankLogStream(kWorkerStdoutStream, r));
      rank.stderr_log =
          std::make_unique<LogStream>(sink_, attempt_id_, RankLogStream(kWorkerStream, r));
    }
  }

  // Starts every rank, waits for all of them (stopping the group on the first failure or a
  // cancel), joins the threads and returns the end report.
  /// After Run(): the rank that died by itself, if that is how the group ended.
  const std::optional<WorkerCrash>& crash() const { return crash_; }

  AttemptEndReport Run() {
    std::vector<std::thread> threads;
    threads.reserve(ranks_.size());
    for (int r = 0; r < world_size_; ++r) {
      try {
        threads.emplace_back([this, r] { RunRank(r); });
      } catch (const std::system_error& e) {
        std::lock_guard lock(mu_);
        for (int rest = r; rest < world_size_; ++rest) {
          ranks_[static_cast<size_t>(rest)].ended = true;
          ++ended_;
        }
        ranks_[static_cast<size_t>(r)].run_error =
            Status::Unavailable(std::string("cannot create a thread: ") + e.what());
        if (!stop_) {
          first_failure_ = r;
          Stop();
        }
        break;
      }
    }
    {
      std::unique_lock lock(mu_);
      while (ended_ < world_size_) {
        if (!stop_ && cancel_.requested()) {
          cancelled_ = true;
          Stop();
        }
        ended_cv_.wait_for(lock, kCancelPoll);
      }
    }
    for (std::thread& t : threads) t.join();
    return Report();
  }

 private:
  struct Rank {
    std::unique_ptr<WorkerStdoutRelay> relay;
    std::unique_ptr<LogStream> stderr_log;
    TailLines stderr_tail;  // its last lines, for the reason when it fails
    bool stderr_at_line_start = true;
    std::optional<ProcessExit> exit;  // empty when it never ran or RunProcess failed
    Status run_error;                 // why RunProcess failed (cannot start, ...)
    bool ended = false;
  };

  // A rank that ended this way fails the group.
  static bool Failed(const Rank& rank) {
    return !rank.exit || !rank.exit->ok() || !rank.relay->saw_run_end();
  }

  void RunRank(int r) {
    Rank& rank = ranks_[static_cast<size_t>(r)];
    std::optional<Result<ProcessExit>> exit;
    if (!stop_) {  // else the group is already stopping: do not start this rank at all
      exit = RunProcess(
          specs_[static_cast<size_t>(r)],
          [&](std::string_view bytes) {
            std::lock_guard lock(mu_);
            rank.relay->Feed(bytes);
          },
          [&](std::string_view bytes) {
            std::lock_guard lock(mu_);
            rank.stderr_log->Write(bytes);
            rank.stderr_tail.Feed(bytes);
            rank.stderr_at_line_start = bytes.back() == '\n';
          },
          CancelToken{&stop_, cancel_.grace});
    }
    std::lock_guard lock(mu_);
    rank.relay->Finish();
    if (exit && exit->ok() && (*exit)->output_cut) {
      rank.stderr_log->Write(std::string(rank.stderr_at_line_start ? "" : "\n") +
                             "[gatehouse-agent] log flush timed out: processes the worker left "
                             "still held its output " +
                             std::to_string(specs_[static_cast<size_t>(r)].log_flush_timeout.count()) +
                             " ms after it exited (--log-flush-timeout-ms); they were killed and "
                             "the output is cut here\n");
    }
    if (exit && exit->ok()) {
      rank.exit = **exit;
    } else if (exit) {
      rank.run_error = exit->status();
    }
    rank.ended = true;
    ++ended_;
    if (!stop_ && Failed(rank)) {
      first_failure_ = r;
      Stop();
    }
    ended_cv_.notify_all();
  }

  // Stops every rank still running (mu_ held).
  void Stop() {
    stop_ = true;
    for (int r = 0; r < world_size_; ++r) {
      if (!ranks_[static_cast<size_t>(r)].ended) stopped_.push_back(r);
    }
  }

  std::string OfN(int r) const { return std::to_string(r) + " of " + std::to_string(world_size_); }

  // "rank 1 of 4 exited with code 137 (signal 9) before run_end"
  std::string DescribeFailure(int r) const {
    const Rank& rank = ranks_[static_cast<size_t>(r)];
    if (!rank.run_error.ok()) {
      const bool start = rank.run_error.code() == StatusCode::kNotFound ||
                         rank.run_error.code() == StatusCode::kUnavailable;
      return (start ? "cannot start rank " : "rank ") + OfN(r) + ": " + rank.run_error.message();
    }
    if (!rank.exit) return "rank " + OfN(r) + " did not start";
    return "rank " + OfN(r) + " " + rank.exit->Describe() +
           (rank.relay->saw_run_end() ? " after run_end" : " before run_end") + InPhase(rank);
  }

  // Rank r's crash as WorkerCrash says (mu_ held or every thread joined).
  WorkerCrash CrashOf(int r) const {
    const Rank& rank = ranks_[static_cast<size_t>(r)];
    WorkerCrash c;
    c.rank = r;
    c.world_size = world_size_;
    c.phase = rank.relay->current_phase();
    c.evidence_phase = ranks_[0].relay->current_phase();
    c.exit_code = rank.exit->exit_code;
    c.signal = rank.exit->signal;
    c.tail = rank.stderr_tail.Summary();
    c.last_line = rank.stderr_tail.Last();
    return c;
  }

  // " in phase P" when the rank died inside a phase it had started, else "".
  static std::string InPhase(const Rank& rank) {
    const std::string& phase = rank.relay->current_phase();
    return phase.empty() ? std::string() : " in phase " + phase;
  }

  // "; <who> last stderr lines: a | b" (TailLines::Summary), or "" when it wrote none: the
  // cause a dying worker printed (a traceback's last line, a `what():`) sits there, not in
  // its exit code.
  static std::string LastLines(const Rank& rank, const std::string& who) {
    const std::string tail = rank.stderr_tail.Summary();
    return tail.empty() ? std::string() : "; " + who + " last stderr lines: " + tail;
  }

  // After a finished group: a line on rank 0's stderr stream for each rank r > 0 whose run_end
  // status differs from rank 0's or that exited non-zero after its run_end.
  void NoteDisagreements() {
    const Rank& first = ranks_[0];
    for (int r = 1; r < world_size_; ++r) {
      const Rank& rank = ranks_[static_cast<size_t>(r)];
      std::string note;
      if (rank.relay->run_end_status() != first.relay->run_end_status()) {
        note = "gatehouse-agent: rank " + OfN(r) + " ended with run_end status '" +
               rank.relay->run_end_status() + "', rank 0 with '" + first.relay->run_end_status() +
               "'; rank 0's events are the evidence\n";
      }
      if (!rank.exit->ok()) {
        note += "gatehouse-agent: rank " + OfN(r) + " " + rank.exit->Describe() +
                " after run_end\n";
      }
      if (note.empty()) continue;
      if (!ranks_[0].stderr_at_line_start) note.insert(0, "\n");
      ranks_[0].stderr_log->Write(note);
      ranks_[0].stderr_at_line_start = true;
    }
  }

  AttemptEndReport Report() {
    std::lock_guard lock(mu_);  // every thread has joined; taken for form's sake
    const int64_t events = next_seq_ - 1;
    bool all_finished = true;
    for (const Rank& rank : ranks_) {
      all_finished = all_finished && rank.exit && rank.relay->saw_run_end();
    }
    const Rank& first = ranks_[0];
    if (all_finished) {
      if (world_size_ > 1) NoteDisagreements();
      AttemptEndReport end;
      end.attempt_id = attempt_id_;
      end.seq = next_seq_;
      end.outcome = std::string(kOutcomeFinished);
      end.exit_code = first.exit->exit_code;
      return end;
    }
    if (world_size_ == 1) {  // the single worker's wording, as before groups
      if (!first.run_error.ok()) {
        return ErrorEnd(attempt_id_, events, "cannot start worker: " + first.run_error.message());
      }
      if (!first.exit) return ErrorEnd(attempt_id_, events, "worker not started (cancelled)");
      std::string reason = "worker " + first.exit->Describe() + " before run_end";
      if (cancelled_ || cancel_.requested()) {
        reason += " (cancelled)";
      } else {
        reason += InPhase(first) + LastLines(first, "its");
        crash_ = CrashOf(0);
      }
      AttemptEndReport end = ErrorEnd(attempt_id_, events, std::move(reason));
      end.exit_code = first.exit->exit_code;
      return end;
    }
    std::string reason;
    const Rank* blamed = &first;
    if (first_failure_) {
      blamed = &ranks_[static_cast<size_t>(*first_failure_)];
      reason = DescribeFailure(*first_failure_);
      if (!stopped_.empty()) {
        reason +=
            (stopped_.size() == 1 ? "; rank " : "; ranks ") + JoinRanks(stopped_) + " stopped";
      }
      reason += LastLines(*blamed, "rank " + std::to_string(*first_failure_) + "'s");
      if (blamed->exit && !cancelled_ && !cancel_.requested()) crash_ = CrashOf(*first_failure_);
    } else if (cancelled_) {
      reason = (stopped_.size() == 1 ? "rank " : "ranks ") + JoinRanks(stopped_) + " of " +
               std::to_string(world_size_) + " stopped before run_end (cancelled)";
    } else {
      reason = "not every rank of " + std::to_string(world_size_) + " emitted run_end";
    }
    AttemptEndReport end = ErrorEnd(attempt_id_, events, std::move(reason));
    if (blamed->exit) end.exit_code = blamed->exit->exit_code;
    return end;
  }

  const int64_t attempt_id_;
  AttemptSink& sink_;
  const CancelToken cancel_;
  const std::vector<ProcessSpec> specs_;
  const int world_size_;
  std::atomic<bool> stop_{false};  // the ranks' cancel flag

  std::mutex mu_;
  std::condition_variable ended_cv_;
  int64_t next_seq_ = 1;           // the attempt's event sequence, shared by the ranks' relays
  std::vector<Rank> ranks_;        // fixed size; each thread touches its own, under mu_
  int ended_ = 0;                  // ranks that have ended (or will never start)
  std::optional<int> first_failure_;
  bool cancelled_ = false;
  std::vector<int> stopped_;       // ranks still running when the group was stopped
  std::optional<WorkerCrash> crash_;  // set by Report() when a rank died by itself
};

}  // namespace

Result<std::optional<std::string>> VisibleDevices(const CellSpec& spec,
                                                  const std::vector<int>& gpu_indices,
                                                  const std::vector<std::string>& gpu_models) {
  if (gpu_indices.empty()) return std::optional<std::string>();
  if (spec.runtime.device != "cuda") return std::optional<std::string>("");
  const std::string& pin = spec.runtime.gpu_model;
  const int world_size = spec.topology.world_size();
  std::vector<int> usable;
  for (size_t i = 0; i < gpu_indices.size(); ++i) {
    if (pin.empty() || (i < gpu_models.size() && GpuModelMatches(gpu_models[i], pin))) {
      usable.push_back(gpu_indices[i]);
    }
  }
  if (world_size > static_cast<int>(usable.size())) {
    return Status::FailedPrecondition(
        "the cell needs " + std::to_string(world_size) + " " + (pin.empty() ? "" : pin + " ") +
        "GPUs (one per rank) but this agent has " + std::to_string(usable.size()));
  }
  std::string list;
  for (int i = 0; i < world_size; ++i) {
    list += (i ? "," : "") + std::to_string(usable[static_cast<size_t>(i)]);
  }
  return std::optional<std::string>(list);
}

AttemptEndReport RunWorker(const WorkerLaunch& launch, AttemptSink& sink, CancelToken cancel,
                           std::vector<int>* used_ports, std::optional<WorkerCrash>* crash) {
  if (crash != nullptr) crash->reset();
  const int64_t id = launch.attempt_id;
  const int world_size = launch.spec.topology.world_size();
  int master_port = 0;
  if (world_size > 1 && launch.slurm == nullptr) {
    auto port = FindFreePort();
    if (!port.ok()) {
      return ErrorEnd(id, 0, "cannot find a free port for MASTER_PORT: " + port.status().message());
    }
    master_port = *port;
    if (used_ports != nullptr) used_ports->push_back(master_port);
  }
  std::optional<SlurmShape> shape;
  if (launch.slurm != nullptr) {
    auto slurm_shape = ShapeOf(launch.spec, *launch.slurm);
    if (!slurm_shape.ok()) return ErrorEnd(id, 0, slurm_shape.status().message());
    shape = *slurm_shape;
  }
  auto visible = launch.slurm != nullptr
                     ? Result<std::optional<std::string>>(std::optional<std::string>())
                     : VisibleDevices(launch.spec, launch.gpu_indices, launch.gpu_models);
  if (!visible.ok()) return ErrorEnd(id, 0, visible.status().message());
  std::vector<ProcessSpec> specs(static_cast<size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    specs[static_cast<size_t>(rank)].env = WorkerEnvironment(launch.spec, rank, world_size, master_port);
    specs[static_cast<size_t>(rank)].log_flush_timeout = launch.log_flush_timeout;
    if (*visible) {
      // nvidia-smi numbers GPUs in PCI bus order; CUDA's default order differs on mixed nodes.
      specs[static_cast<size_t>(rank)].env.emplace_back("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
      specs[static_cast<size_t>(rank)].env.emplace_back("CUDA_VISIBLE_DEVICES", **visible);
    }
  }

  std::error_code ec;
  std::filesystem::create_directories(launch.attempt_dir, ec);
  if (ec) {
    return ErrorEnd(id, 0, "cannot create attempt dir " + launch.attempt_dir.string() + ": " +
                               ec.message());
  }
  const std::filesystem::path run_spec = launch.attempt_dir / "run.json";
  if (Status s = WriteFile(run_spec, MakeRunSpec(launch).dump(2) + "\n"); !s.ok()) {
    return ErrorEnd(id, 0, s.message());
  }
  for (ProcessSpec& spec : specs) {
    spec.exe = launch.worker;
    spec.args = launch.args_before;
    spec.args.push_back("--run-spec");
    spec.args.push_back(run_spec.string());
    for (const auto& plugin : launch.plugins) {
      spec.args.push_back("--plugin");
      spec.args.push_back(plugin.string());
    }
    for (const auto& entry : launch.python_entries) {
      spec.args.push_back("--python-entry");
      spec.args.push_back(entry);
    }
    for (const auto& path : launch.python_path) {
      spec.args.push_back("--python-path");
      spec.args.push_back(path.string());
    }
    spec.args.insert(spec.args.end(), launch.args_after.begin(), launch.args_after.end());
    spec.cwd = launch.attempt_dir;
    spec.env.emplace_back("GATEHOUSE_LOCAL_RUN", launch.local_run);
    spec.env.emplace_back("GATEHOUSE_BUILD", launch.build_evidence);
    if (launch.slurm == nullptr) {
      spec.cgroups = launch.cgroup_dirs;
      if (!launch.cgroup_evidence.empty()) {
        spec.env.emplace_back("GATEHOUSE_CGROUP", launch.cgroup_evidence);
      }
    }
    if (launch.sandbox != nullptr && launch.slurm == nullptr) {
      launch.sandbox->Wrap(spec, launch.sandbox_paths);
    }
  }
  if (launch.slurm != nullptr) {
    // Slurm starts the ranks and gives them their numbers (gatehouse-slurm-rank); they get the
    // spec's env, and a cpu cell no GPU (Slurm gives a cuda cell its node's GPUs).
    SlurmRun run;
    run.attempt_id = id;
    run.worker = specs[0];
    run.worker.env.assign(launch.spec.env.begin(), launch.spec.env.end());
    run.worker.env.emplace_back("GATEHOUSE_LOCAL_RUN", launch.local_run);
    run.worker.env.emplace_back("GATEHOUSE_BUILD", launch.build_evidence);
    run.cuda = launch.spec.runtime.device == "cuda";
    if (!run.cuda) run.worker.env.emplace_back("CUDA_VISIBLE_DEVICES", "");
    run.worker.env.emplace_back(
        "GATEHOUSE_CGROUP",
        "none: a Slurm step runs in the cgroups Slurm makes for it (slurm.conf's "
        "TaskPlugin/ProctrackType), not in one of the agent's");
    if (launch.sandbox != nullptr) {
      launch.sandbox->WrapSlurmTask(run.worker, launch.sandbox_paths);
      run.sandboxed = true;
    }
    run.job_name = SlurmJobName(launch.agent_name, id);
    run.shape = *shape;
    return RunSlurmRanks(*launch.slurm, run, sink, cancel, crash);
  }
  WorkerGroup group(launch.attempt_id, sink, cancel, std::move(specs));
  AttemptEndReport end = group.Run();
  if (crash != nullptr) *crash = group.crash();
  return end;
}

}  // namespace gatehouse::agent
