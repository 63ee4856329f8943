// One attempt's ranks as a Slurm job step (docs/protocols.md §3.5).
#include "agent/slurm_launcher.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "agent/output_relay.h"
#include "agent/worker_launcher.h"

namespace gatehouse::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Job states in which the job has not ended yet (squeue(1), "JOB STATE CODES").
bool StillActive(const std::string& state) {
  return state == "PENDING" || state == "CONFIGURING" || state == "RUNNING" ||
         state == "COMPLETING" || state == "SUSPENDED" || state == "STOPPED" ||
         state == "RESIZING" || state == "REQUEUED" || state == "SIGNALING" ||
         state == "STAGE_OUT" || state == "RESV_DEL_HOLD" || state == "REQUEUE_FED" ||
         state == "REQUEUE_HOLD" || state == "SPECIAL_EXIT";
}

// Runs a Slurm client command to its end; its standard output, or why it failed.
Result<std::string> RunClient(const std::filesystem::path& exe, std::vector<std::string> args) {
  ProcessSpec spec;
  spec.exe = exe;
  spec.args = std::move(args);
  return RunForOutput(spec);
}

Result<std::optional<SlurmJob>> QueryJob(const SlurmConfig& config, const std::string& name) {
  GH_ASSIGN_OR_RETURN(std::string out,
                      RunClient(config.squeue, {"--noheader", "--states=all", "--name=" + name,
                                                "--format=%i|%T|%r|%N"}));
  return ParseSqueueJob(out);
}

// Splits a byte stream into lines; `line` gets each line without its newline.
class Lines {
 public:
  template <typename F>
  void Feed(std::string_view bytes, F&& line) {
    partial_.append(bytes);
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      line(std::string_view(partial_).substr(start, nl - start));
    }
    partial_.erase(0, start);
  }
  template <typename F>
  void Finish(F&& line) {
    if (!partial_.empty()) line(std::string_view(partial_));
    partial_.clear();
  }

 private:
  std::string partial_;
};

// "12: text" -> (12, "text"); srun --label pads the number with spaces to the width of the
// largest task number. nullopt for a line without a label (srun's own).
std::optional<std::pair<int, std::string_view>> SplitLabel(std::string_view line) {
  size_t i = 0;
  while (i < line.size() && line[i] == ' ') ++i;
  const size_t digits = i;
  int task = 0;
  while (i < line.size() && line[i] >= '0' && line[i] <= '9' && i - digits < 7) {
    task = task * 10 + (line[i] - '0');
    ++i;
  }
  if (i == digits || line.substr(i, 2) != ": ") return std::nullopt;
  return std::make_pair(task, line.substr(i + 2));
}

}  // namespace

AttemptEndReport RunSlurmRanks(const SlurmConfig& config, const SlurmRun& run, AttemptSink& sink,
                               CancelToken cancel, std::optional<WorkerCrash>* crash) {
  if (crash != nullptr) crash->reset();
  const int world_size = run.shape.nodes * run.shape.ranks_per_node;
  int64_t next_seq = 1;
  std::vector<std::unique_ptr<WorkerStdoutRelay>> relays;
  std::vector<std::unique_ptr<LogStream>> stderr_logs;
  for (int r = 0; r < world_size; ++r) {
    relays.push_back(std::make_unique<WorkerStdoutRelay>(
        sink, run.attempt_id, &next_seq, RankLogStream(kWorkerStdoutStream, r)));
    stderr_logs.push_back(
        std::make_unique<LogStream>(sink, run.attempt_id, RankLogStream(kWorkerStream, r)));
  }
  LogStream slurm_log(sink, run.attempt_id, kSlurmStream);
  std::string last_srun_line;

  ProcessSpec srun;
  srun.exe = config.srun;
  srun.args = SrunArgs(config, run.shape, run.cuda, run.job_name, run.worker.cwd);
  srun.args.push_back(config.rank_exe.string());
  if (run.sandboxed) srun.args.push_back("--sandboxed");
  srun.args.push_back("--");
  srun.args.push_back(run.worker.exe.string());
  srun.args.insert(srun.args.end(), run.worker.args.begin(), run.worker.args.end());
  srun.cwd = run.worker.cwd;
  srun.env = run.worker.env;
  srun.log_flush_timeout = run.worker.log_flush_timeout;
  {
    std::string command = "$ " + config.srun.string();
    for (const std::string& a : srun.args) command += " " + a;
    slurm_log.Write(command + "\n");
  }

  // The cancel watcher: scancel at the first request, then srun's own SIGTERM/SIGKILL if it has
  // not ended a grace later.
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  std::atomic<bool> kill_srun{false};
  std::atomic<bool> cancelled{false};
  std::string scancel_error;
  std::thread watcher([&] {
    std::unique_lock lock(mu);
    while (!done && !cancel.requested()) done_cv.wait_for(lock, milliseconds(50));
    if (done) return;
    cancelled = true;
    lock.unlock();
    Result<std::string> sent = RunClient(config.scancel, {"--name=" + run.job_name});
    lock.lock();
    if (!sent.ok()) scancel_error = sent.status().message();
    done_cv.wait_for(lock, cancel.grace, [&] { return done; });
    if (!done) kill_srun = true;
  });

  // RunProcess calls the handlers on this thread only, so the relays need no lock.
  Lines out_lines, err_lines;
  std::vector<TailLines> tails(static_cast<size_t>(world_size));  // each task's last stderr
  // A labelled line goes to its task's relay (stdout) or stderr stream; srun's own to "slurm".
  const auto route = [&](std::string_view line, bool is_stdout) {
    auto label = SplitLabel(line);
    if (!label || label->first >= world_size) {
      slurm_log.Write(std::string(line) + "\n");
      if (!is_stdout && !line.empty()) last_srun_line = std::string(line);
      return;
    }
    const std::string text = std::string(label->second) + "\n";
    const auto r = static_cast<size_t>(label->first);
    if (is_stdout) {
      relays[r]->Feed(text);
    } else {
      stderr_logs[r]->Write(text);
      tails[r].Feed(text);
    }
  };
  const auto on_out = [&](std::string_view line) { route(line, true); };
  const auto on_err = [&](std::string_view line) { route(line, false); };
  Result<ProcessExit> exit = RunProcess(
      srun, [&](std::string_view b) { out_lines.Feed(b, on_out); },
      [&](std::string_view b) { err_lines.Feed(b, on_err); },
      CancelToken{&kill_srun, milliseconds(5000)});
  out_lines.Finish(on_out);
  err_lines.Finish(on_err);
  for (auto& relay : relays) relay->Finish();
  {
    std::lock_guard lock(mu);
    done = true;
  }
  done_cv.notify_all();
  watcher.join();

  AttemptEndReport end;
  end.attempt_id = run.attempt_id;
  end.seq = next_seq;
  std::vector<int> silent;
  for (int r = 0; r < world_size; ++r) {
    if (!relays[static_cast<size_t>(r)]->saw_run_end()) silent.push_back(r);
  }

  // The job's final state (squeue lists it for MinJobAge after it ends); one still active
  // after srun ended is cancelled, so no attempt leaves a job behind.
  std::optional<SlurmJob> job;
  std::string query_error;
  const auto deadline = steady_clock::now() + std::chrono::seconds(30);
  bool cancelled_leftover = false;
  while (true) {
    Result<std::optional<SlurmJob>> queried = QueryJob(config, run.job_name);
    if (!queried.ok()) {
      query_error = queried.status().message();
      job.reset();
    } else {
      job = *queried;
    }
    if (!job || !StillActive(job->state) || steady_clock::now() > deadline) break;
    if (!cancelled_leftover && job->state != "COMPLETING") {
      (void)RunClient(config.scancel, {"--name=" + run.job_name});
      cancelled_leftover = true;
    }
    std::this_thread::sleep_for(milliseconds(200));
  }
  if (job) slurm_log.Write("slurm job " + job->id + " ended " + job->state + "\n");

  const std::string srun_exit =
      exit.ok() ? "srun " + exit->Describe() : "cannot start srun: " + exit.status().message();
  if (silent.empty() && exit.ok()) {
    end.outcome = std::string(kOutcomeFinished);
    end.exit_code = exit->exit_code;
    return end;
  }
  std::string ranks;
  for (const int r : silent) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  std::string detail = (silent.size() == 1 ? "rank " : "ranks ") + ranks + " of " +
                       std::to_string(world_size) + " ended before run_end; " + srun_exit;
  if (!last_srun_line.empty()) detail += " (" + last_srun_line + ")";
  // Where and why the first silent rank that wrote to its stderr died (srun stops the others).
  int blamed = silent.empty() ? -1 : silent.front();
  for (const int r : silent) {
    if (!tails[static_cast<size_t>(r)].Summary().empty()) {
      blamed = r;
      break;
    }
  }
  if (blamed >= 0) {
    const std::string& phase = relays[static_cast<size_t>(blamed)]->current_phase();
    if (!phase.empty()) detail += "; rank " + std::to_string(blamed) + " was in phase " + phase;
    const std::string tail = tails[static_cast<size_t>(blamed)].Summary();
    if (!tail.empty()) {
      detail += "; rank " + std::to_string(blamed) + "'s last stderr lines: " + tail;
    }
  }
  if (!scancel_error.empty()) detail += "; scancel failed: " + scancel_error;
  if (exit.ok()) end.exit_code = exit->exit_code;
  if (!exit.ok()) {
    end.outcome = std::string(kOutcomeError);
    end.reason = srun_exit;
  } else if (!job) {
    end.outcome = std::string(kOutcomeError);
    end.reason = "no slurm job " + run.job_name + (query_error.empty() ? "" : " (" + query_error + ")") +
                 "; " + detail;
  } else {
    auto [outcome, reason] = SlurmEnd(*job, cancelled);
    end.outcome = outcome;
    end.reason = reason + "; " + detail;
  }
  if (cancelled) end.reason += " (cancelled)";
  if (crash != nullptr && !cancelled && blamed >= 0 && exit.ok() && job &&
      end.outcome == kOutcomeError) {
    WorkerCrash c;  // srun's exit stands for the task's: it ends with the highest task code
    c.rank = blamed;
    c.world_size = world_size;
    c.phase = relays[static_cast<size_t>(blamed)]->current_phase();
    c.evidence_phase = relays[0]->current_phase();
    c.exit_code = exit->exit_code;
    c.signal = exit->signal;
    c.tail = tails[static_cast<size_t>(blamed)].Summary();
    c.last_line = tails[static_cast<size_t>(blamed)].Last();
    *crash = std::move(c);
  }
  return end;
}

Result<std::vector<std::string>> CancelLeftoverJobs(const SlurmConfig& config,
                                                    std::string_view agent_name) {
  GH_ASSIGN_OR_RETURN(std::string out,
                      RunClient(config.squeue, {"--noheader", "--format=%i|%j"}));
  std::vector<std::string> ids = JobsOfAgent(out, agent_name);
  if (ids.empty()) return ids;
  GH_RETURN_IF_ERROR(RunClient(config.scancel, ids).status());
  return ids;
}

}  // namespace gatehouse::agent
