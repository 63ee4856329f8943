// The attempt lifecycle, in order: spec, checkout, recipe, build, worker, end.
#include "agent/attempt_runner.h"

#include <unistd.h>

#include <chrono>
#include <optional>

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "agent/worker_crash.h"
#include "agent/worker_launcher.h"
#include "common/artifacts.h"
#include "common/phases.h"
#include "common/recipe.h"
#include "common/sha256.h"

namespace gatehouse::agent {
namespace {

// A tool's cache directory as the tool finds it: $<variable>, else $XDG_CACHE_HOME/<name>, else
// $HOME/.cache/<name> (ccache 4, pip).
std::filesystem::path CacheDir(const char* variable, const char* name) {
  if (const char* set = std::getenv(variable); set != nullptr && *set != '\0') return set;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::filesystem::path(xdg) / name;
  }
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home != nullptr ? home : "/") / ".cache" / name;
}

// An attempt's cgroup (RunnerConfig::cgroup) and the line its evidence records (the ranks'
// GATEHOUSE_CGROUP): its description, or "none: <why>" when the agent has none; both empty when
// the agent was given no cgroup config at all.
struct CgroupSlot {
  std::unique_ptr<AttemptCgroup> cgroup;
  std::string evidence;
  std::vector<std::filesystem::path> Join() const {
    return cgroup ? cgroup->Join() : std::vector<std::filesystem::path>{};
  }
};

Result<CgroupSlot> OpenCgroup(const CgroupConfig* config, int64_t attempt_id) {
  CgroupSlot slot;
  if (config == nullptr) return slot;
  if (config->version == 0) {
    slot.evidence = "none: " + config->none_reason;
    return slot;
  }
  // The agent's pid in the name: two agents sharing a cgroup never collide.
  GH_ASSIGN_OR_RETURN(slot.cgroup,
                      AttemptCgroup::Create(*config, "gatehouse-a" + std::to_string(attempt_id) +
                                                         "-p" + std::to_string(::getpid())));
  slot.evidence = slot.cgroup->Describe();
  return slot;
}

// Without an operator's limit (--attempt-memory-limit), holds the attempt's processes to the
// controller's estimate plus a margin (MemoryLimitFor), so a wrong estimate ends as a named
// OOM kill inside the attempt, not as a node out of memory.
void LimitToEstimate(const CgroupConfig* config, CgroupSlot& slot, int64_t attempt_id,
                     int64_t estimate_bytes, const std::string& estimate, int64_t node_bytes) {
  if (!slot.cgroup || config == nullptr || config->memory_limit_bytes > 0) return;
  const int64_t limit = MemoryLimitFor(estimate_bytes, node_bytes);
  if (limit <= 0) return;
  const std::string why = "the controller's estimate " + FormatBytes(estimate_bytes) +
                          (estimate.empty() ? "" : ", " + estimate) + ", plus a margin";
  if (Status s = slot.cgroup->LimitMemory(limit, why); !s.ok()) {
    spdlog::warn("attempt {}: {} (it runs without a memory limit)", attempt_id, s.message());
    return;
  }
  slot.evidence = slot.cgroup->Describe();
}

// Adds to a failed attempt's end reason that its cgroup hit the memory limit, logs its peak,
// and kills what the attempt left running in it.
void CloseCgroup(CgroupSlot& slot, AttemptEndReport& end) {
  if (!slot.cgroup) return;
  const std::string note = slot.cgroup->OomNote();
  if (!note.empty() && end.outcome != kOutcomeFinished) {
    end.reason = end.reason.empty() ? note : end.reason + "; " + note;
  }
  if (!note.empty()) end.oom_limit_bytes = slot.cgroup->memory_limit();
  if (const int64_t peak = slot.cgroup->PeakBytes(); peak >= 0) {
    spdlog::info("attempt {}: peak memory {} ({})", end.attempt_id, FormatBytes(peak),
                 slot.cgroup->Describe());
  }
  if (const int left = slot.cgroup->KillAll(); left > 0) {
    spdlog::warn("attempt {}: killed {} process(es) it left running", end.attempt_id, left);
  }
  slot.cgroup.reset();
}

// What a rerun writes: its output on log streams "rerun.<stream>" ("rerun.worker"), its events
// kept from the controller (the attempt's evidence is the first run's).
class RerunSink : public AttemptSink {
 public:
  explicit RerunSink(AttemptSink& sink) : sink_(sink) {}
  void Event(int64_t, int64_t, std::string_view) override {}
  void Log(int64_t attempt_id, std::string_view stream, int64_t offset,
           std::string_view data) override {
    sink_.Log(attempt_id, "rerun." + std::string(stream), offset, data);
  }
  void End(const AttemptEndReport&) override {}

 private:
  AttemptSink& sink_;
};

// A crash worth a rerun (WorthARerun): the worker runs again on the same inputs with the phases
// up to the crashing one (RerunSpec), in <attempt dir>/rerun, through a RerunSink. The same
// crash again (SameCrash) is the adapter's: the attempt's evidence is closed with the FAIL
// CrashFailEvents makes and the attempt ends "finished". Otherwise the first end stands, its
// reason saying what the rerun did: an error that a retry may clear.
AttemptEndReport JudgeCrash(WorkerLaunch launch, const WorkerCrash& crash, AttemptEndReport first,
                            AttemptSink& sink, CancelToken cancel, std::vector<int>& used_ports) {
  const CellSpec spec = launch.spec;
  launch.spec = RerunSpec(spec, crash);
  launch.attempt_dir /= "rerun";
  spdlog::info("attempt {}: rank {} crashed in phase {}; rerunning phases up to it",
               first.attempt_id, crash.rank, crash.phase);
  RerunSink quiet(sink);
  std::optional<WorkerCrash> again;
  const AttemptEndReport second = RunWorker(launch, quiet, cancel, &used_ports, &again);
  const std::string rerun = "; a rerun of the phases up to " + crash.phase + " on the same inputs ";
  if (cancel.requested()) {
    first.reason += rerun + "was cancelled";
    return first;
  }
  if (!again || !SameCrash(crash, *again)) {
    first.reason += rerun + (second.outcome == kOutcomeFinished ? std::string("did not crash")
                                                                 : "ended otherwise: " + second.reason);
    return first;
  }
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  AttemptEndReport end;
  end.attempt_id = first.attempt_id;
  end.seq = first.seq;
  for (const std::string& event : CrashFailEvents(crash, spec, now_ms)) {
    sink.Event(end.attempt_id, end.seq++, event);
  }
  end.outcome = std::string(kOutcomeFinished);
  end.exit_code = first.exit_code;
  return end;
}

AttemptEndReport Error(int64_t attempt_id, std::string reason) {
  AttemptEndReport end;
  end.attempt_id = attempt_id;
  end.seq = 1;  // no event was sent before the worker ran
  end.outcome = std::string(kOutcomeError);
  end.reason = std::move(reason);
  return end;
}

// The end of an attempt whose reference bundle could not be fetched: the bundle is an input
// from outside the adapter, so the attempt is BLOCKED (identity) naming the file, with no
// worker run (the agent writes the events a worker would have).
AttemptEndReport BlockedOnInput(int64_t attempt_id, AttemptSink& sink, const std::string& reason,
                                const CellSpec& spec) {
  using nlohmann::json;
  int64_t seq = 0;
  sink.Event(attempt_id, ++seq,
             json{{"event", "phase_end"}, {"phase", "identity"}, {"status", "BLOCKED"},
                  {"reason", reason}, {"classification", ""}, {"duration_ms", 0}}
                 .dump());
  for (const std::string& phase : spec.phases) {
    if (phase == "identity") continue;
    sink.Event(attempt_id, ++seq,
               json{{"event", "phase_end"}, {"phase", phase}, {"status", "SKIPPED"},
                    {"reason", "phase 'identity' ended BLOCKED"}, {"classification", ""},
                    {"duration_ms", 0}}
                   .dump());
  }
  sink.Event(attempt_id, ++seq, json{{"event", "run_end"}, {"status", "BLOCKED"}}.dump());
  AttemptEndReport end;
  end.attempt_id = attempt_id;
  end.seq = seq + 1;
  end.outcome = std::string(kOutcomeFinished);
  return end;
}

}  // namespace

AttemptRunner::AttemptRunner(RunnerConfig config)
    : config_(std::move(config)), git_(config_.work_dir / "repos") {}

void AttemptRunner::Run(const AttemptAssignment& assignment, AttemptSink& transport,
                        CancelToken cancel) {
  RedactingSink redacting(transport, config_.redactor);
  AttemptSink& sink = config_.redactor.empty() ? transport : redacting;
  spdlog::info("attempt {}: start (cell {})", assignment.attempt_id, assignment.cell_id);
  std::vector<int> used_ports;
  const AttemptEndReport end = RunSteps(assignment, sink, cancel, used_ports);
  if (end.outcome == kOutcomeFinished) {
    spdlog::info("attempt {}: finished, worker exit code {}", end.attempt_id, end.exit_code);
  } else {
    spdlog::warn("attempt {}: error: {}", end.attempt_id, end.reason);
  }
  if (config_.cleanup != nullptr) {
    const auto dir = config_.work_dir / "attempts" / std::to_string(end.attempt_id);
    const CleanupReport report = config_.cleanup->Check(dir, used_ports);
    LogStream(sink, end.attempt_id, kCleanupStream).Write(report.ToJson().dump() + "\n");
    if (!report.healthy()) {
      drain_reason_ =
          "cleanup after attempt " + std::to_string(end.attempt_id) + ": " + report.Summary();
      unhealthy_attempt_ = end.attempt_id;
      unhealthy_dir_ = dir;
      unhealthy_ports_ = used_ports;
      spdlog::error("draining: {}", drain_reason_);
    }
  }
  sink.End(end);
}

bool AttemptRunner::Recheck() {
  if (healthy() || config_.cleanup == nullptr) return true;
  const CleanupReport report = config_.cleanup->Check(unhealthy_dir_, unhealthy_ports_);
  if (report.healthy()) {
    spdlog::info("cleanup after attempt {} is clean now: taking work again", unhealthy_attempt_);
    drain_reason_.clear();
  } else {
    drain_reason_ =
        "cleanup after attempt " + std::to_string(unhealthy_attempt_) + ": " + report.Summary();
  }
  return healthy();
}

AttemptEndReport AttemptRunner::RunSteps(const AttemptAssignment& assignment, AttemptSink& sink,
                                         CancelToken cancel, std::vector<int>& used_ports) {
  const int64_t id = assignment.attempt_id;
  Result<CellSpec> parsed = ParseCellSpecJson(assignment.spec_json);
  if (!parsed.ok()) return Error(id, "invalid spec: " + parsed.status().message());
  CellSpec spec = std::move(parsed).value();
  if (spec.IsReference()) {
    return RunReference(id, std::move(spec), assignment, sink, cancel, used_ports);
  }

  if (!spec.reference.cell.empty()) {
    // The reference cell's bundle, fetched by digest: the worker compares with exactly it.
    const auto dir = config_.work_dir / "attempts" / std::to_string(id) / "reference";
    auto digest = FetchReference(assignment.inputs, dir);
    const StatusCode code = digest.status().code();
    if (!digest.ok() && (code == StatusCode::kUnavailable || code == StatusCode::kInternal ||
                         code == StatusCode::kDeadlineExceeded ||
                         code == StatusCode::kUnauthenticated ||
                         code == StatusCode::kPermissionDenied)) {
      // The controller or this node failed, not the bundle: no evidence either way.
      return Error(id, "fetching the reference bundle of reference cell " + spec.reference.cell +
                           " failed: " + digest.status().message());
    }
    if (!digest.ok()) {
      return BlockedOnInput(id, sink,
                            "the reference bundle of reference cell " + spec.reference.cell +
                                " could not be fetched: " + digest.status().message(),
                            spec);
    }
    spec.reference.path = dir.string();
    spec.reference.digest = *digest;
  }

  Result<CheckoutResult> checkout = Status::Internal("no checkout");
  if (assignment.local_tree.empty()) {
    checkout = git_.Checkout(spec.repository, spec.commit);
    if (!checkout.ok()) return Error(id, "checkout failed: " + checkout.status().message());
    spdlog::info("attempt {}: checked out {} at {}", id, spec.repository, checkout->head);
  } else {
    // The tree as its owner left it: the identity gate still holds HEAD to spec.commit.
    auto tree = InspectWorkingTree(assignment.local_tree);
    if (!tree.ok()) return Error(id, "local tree: " + tree.status().message());
    checkout = tree->checkout;
  }
  if (cancel.requested()) return Error(id, "cancelled: after checkout");

  auto recipe = LoadRecipe(checkout->path, spec.commit);
  if (!recipe.ok()) return Error(id, recipe.status().message());

  BuildConfig build_config;
  build_config.work_dir = config_.work_dir;
  build_config.sdk_dir = config_.sdk_dir;
  build_config.cmake_prefix_path = config_.cmake_prefix_path;
  build_config.cmake = config_.cmake;
  build_config.log_flush_timeout = config_.log_flush_timeout;
  build_config.python = config_.python;
  BuildRequest request{checkout->path, RepoKey(spec.repository), std::move(recipe).value()};
  namespace fs = std::filesystem;
  const fs::path attempt_dir = config_.work_dir / "attempts" / std::to_string(id);
  // The sandbox (when configured) holds the build and the ranks: the submitter's CMake, pip
  // and adapter code all run in it (a Slurm step's tasks in a bwrap of their own, on their
  // node); the cgroup (when the agent has one) counts and limits them.
  auto cgroup = OpenCgroup(config_.cgroup, id);
  if (!cgroup.ok()) return Error(id, cgroup.status().message());
  std::unique_ptr<AttemptSandbox> sandbox;
  SandboxPaths build_paths;
  if (config_.sandbox != nullptr) {
    auto opened = AttemptSandbox::Open(*config_.sandbox);
    if (!opened.ok()) return Error(id, opened.status().message());
    sandbox = std::move(opened).value();
    build_paths.attempt_dir = attempt_dir;
    build_paths.read_only.push_back(checkout->path);
    build_paths.writable = {config_.work_dir / "build" / request.repo_key,
                            config_.work_dir / "python-deps", CacheDir("CCACHE_DIR", "ccache"),
                            CacheDir("PIP_CACHE_DIR", "pip")};
    std::error_code ec;
    for (const fs::path& dir : build_paths.writable) fs::create_directories(dir, ec);
    fs::create_directories(attempt_dir, ec);
  }
  if (sandbox || cgroup->cgroup) {
    build_config.wrap = [&sandbox, build_paths, dirs = cgroup->Join()](ProcessSpec& step,
                                                                       bool needs_network) {
      step.cgroups = dirs;
      if (sandbox) sandbox->Wrap(step, build_paths, /*loopback_only=*/!needs_network);
    };
  }
  LogStream build_log(sink, id, kBuildStream);
  auto built = RunBuild(
      build_config, request, [&](std::string_view bytes) { build_log.Write(bytes); }, cancel);
  if (cancel.requested()) return Error(id, "cancelled: during the build");
  if (!built.ok()) {
    const std::string message = built.status().message();
    AttemptEndReport end =
        Error(id, message.rfind("build failed", 0) == 0 ? message : "build failed: " + message);
    CloseCgroup(*cgroup, end);
    return end;
  }

  LimitToEstimate(config_.cgroup, *cgroup, id, assignment.memory_estimate_bytes,
                  assignment.memory_estimate, config_.node_memory_bytes);
  WorkerLaunch launch;
  launch.attempt_id = id;
  launch.attempt_dir = attempt_dir;
  launch.spec = std::move(spec);
  launch.checkout = *checkout;
  launch.plugins = built->plugins;
  launch.python_entries = built->python_entries;
  launch.python_path = built->python_path;
  launch.worker = config_.worker;
  launch.agent_name = config_.agent_name;
  launch.gpu_indices = config_.gpu_indices;
  launch.gpu_models = config_.gpu_models;
  launch.log_flush_timeout = config_.log_flush_timeout;
  launch.slurm = config_.slurm;
  if (sandbox) {
    launch.sandbox = sandbox.get();
    launch.sandbox_paths.attempt_dir = attempt_dir;
    launch.sandbox_paths.read_only.push_back(launch.checkout.path);
    for (const fs::path& plugin : launch.plugins) {
      launch.sandbox_paths.read_only.push_back(plugin.parent_path());
    }
    for (const fs::path& dir : launch.python_path) launch.sandbox_paths.read_only.push_back(dir);
  }
  launch.cgroup_dirs = cgroup->Join();
  launch.cgroup_evidence = cgroup->evidence;
  launch.local_run = assignment.local_run;
  launch.build_evidence = BuildEvidence(*built);
  std::optional<WorkerCrash> crash;
  AttemptEndReport end = RunWorker(launch, sink, cancel, &used_ports, &crash);
  const bool oom_killed = cgroup->cgroup && !cgroup->cgroup->OomNote().empty();
  if (crash && !cancel.requested() && WorthARerun(*crash, oom_killed)) {
    end = JudgeCrash(launch, *crash, std::move(end), sink, cancel, used_ports);
  }
  CloseCgroup(*cgroup, end);
  sandbox.reset();
  // The gates' plot data become the attempt's artifacts (common/artifacts.h) before the end is
  // reported. They are not evidence the verdict rests on: a failed upload is logged, and the
  // dashboard shows the plot as missing.
  for (std::string_view name : kValidationArtifacts) {
    if (artifacts_ == nullptr) break;
    std::error_code ec;
    const fs::path path = attempt_dir / name;
    if (!fs::is_regular_file(path, ec)) continue;
    if (Status stored = artifacts_->Put(id, std::string(name), path); !stored.ok()) {
      spdlog::warn("attempt {}: artifact '{}' not stored: {}", id, name, stored.ToString());
    }
  }
  return end;
}

Result<std::string> AttemptRunner::FetchReference(const std::vector<InputFile>& inputs,
                                                  const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  if (artifacts_ == nullptr) return Status::Unavailable("this agent has no artifact channel");
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return Status::Internal("cannot create " + dir.string() + ": " + ec.message());
  int files = 0;
  for (const InputFile& in : inputs) {
    if (in.role != "reference") continue;
    if (in.name.empty() || in.name.find('/') != std::string::npos || in.name[0] == '.' ||
        in.digest.size() != 71 || in.digest.rfind("sha256:", 0) != 0) {
      return Status::InvalidArgument("input '" + in.name + "' (" + in.digest +
                                     "): not a bundle file name and digest");
    }
    const fs::path target = dir / in.name;
    if (fs::exists(target, ec)) {
      return Status::InvalidArgument("input '" + in.name + "' is listed twice");
    }
    // The node's cache: one copy per digest, shared by later attempts and checked against its
    // digest every time it is used (a copy goes to the attempt, so its worker cannot change it).
    const fs::path cached = config_.work_dir / "artifacts" / "sha256" / in.digest.substr(7);
    auto cached_hex = fs::is_regular_file(cached, ec) ? Sha256FileHex(cached)
                                                      : Result<std::string>(Status::NotFound(""));
    if (!cached_hex.ok() || "sha256:" + *cached_hex != in.digest) {
      fs::create_directories(cached.parent_path(), ec);
      if (Status s = artifacts_->Get(in.digest, in.size, cached); !s.ok()) {
        return Status(s.code(), "'" + in.name + "' (" + in.digest + "): " + s.message());
      }
    }
    fs::copy_file(cached, target, fs::copy_options::overwrite_existing, ec);
    if (ec) return Status::Internal("cannot place '" + in.name + "': " + ec.message());
    ++files;
  }
  if (files == 0) return Status::NotFound("the assignment lists no reference bundle file");
  return DirectoryDigest(dir);
}

AttemptEndReport AttemptRunner::RunReference(int64_t id, CellSpec spec,
                                             const AttemptAssignment& assignment,
                                             AttemptSink& sink, CancelToken cancel,
                                             std::vector<int>& used_ports) {
  namespace fs = std::filesystem;
  if (config_.reference_python.empty()) {
    return Error(id, "this agent runs no reference cells (no --reference-python)");
  }
  if (artifacts_ == nullptr) return Error(id, "this agent cannot store artifacts");
  WorkerLaunch launch;
  launch.attempt_id = id;
  launch.attempt_dir = config_.work_dir / "attempts" / std::to_string(id);
  const fs::path out = launch.attempt_dir / "reference";
  std::error_code ec;
  fs::remove_all(out, ec);
  launch.spec = std::move(spec);
  launch.worker = config_.reference_python;
  launch.args_before = {config_.reference_script.string()};
  launch.args_after = {"--out", out.string()};
  launch.agent_name = config_.agent_name;
  launch.gpu_indices = config_.gpu_indices;
  launch.gpu_models = config_.gpu_models;
  launch.log_flush_timeout = config_.log_flush_timeout;
  launch.slurm = config_.slurm;
  // The reference runs upstream's code, not the submitter's: no sandbox, but the same cgroup
  // (a 70 GB checkpoint loaded twice would take the node down as surely).
  auto cgroup = OpenCgroup(config_.cgroup, id);
  if (!cgroup.ok()) return Error(id, cgroup.status().message());
  LimitToEstimate(config_.cgroup, *cgroup, id, assignment.memory_estimate_bytes,
                  assignment.memory_estimate, config_.node_memory_bytes);
  launch.cgroup_dirs = cgroup->Join();
  launch.cgroup_evidence = cgroup->evidence;
  AttemptEndReport end = RunWorker(launch, sink, cancel, &used_ports);
  CloseCgroup(*cgroup, end);
  if (end.outcome != kOutcomeFinished || !fs::is_directory(out, ec)) return end;
  // The bundle becomes the reference cell's artifacts before the end is reported, so a cell
  // waiting for it finds them once it has passed.
  constexpr const char* kFiles[] = {"reference.json", "reference.safetensors"};
  for (const char* file : kFiles) {
    if (!fs::is_regular_file(out / file, ec)) {
      // The runner writes the bundle whole or not at all: half of one is not a reference.
      end.outcome = std::string(kOutcomeError);
      end.reason = "the reference runner's bundle " + out.string() + " has no " + file;
      return end;
    }
  }
  for (const char* file : kFiles) {
    const fs::path path = out / file;
    Status stored = artifacts_->Put(id, std::string("reference/") + file, path);
    if (!stored.ok()) {
      end.outcome = std::string(kOutcomeError);
      end.reason = "storing artifact 'reference/" + std::string(file) +
                   "' failed: " + stored.message();
      return end;
    }
  }
  return end;
}

int64_t MemoryLimitFor(int64_t estimate_bytes, int64_t node_bytes) {
  if (estimate_bytes <= 0) return 0;
  constexpr int64_t kGiB = int64_t{1} << 30;  // the least margin; the node's reserve
  int64_t limit = estimate_bytes + std::max(estimate_bytes / 4, kGiB);
  if (node_bytes > 0) limit = std::min(limit, node_bytes - kGiB);
  return std::max(limit, estimate_bytes);
}

}  // namespace gatehouse::agent
