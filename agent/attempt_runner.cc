// The attempt lifecycle, in order: spec, checkout, recipe, build, worker, end.
#include "agent/attempt_runner.h"

#include <spdlog/spdlog.h>

#include "agent/recipe.h"
#include "agent/worker_launcher.h"

namespace gatehouse::agent {
namespace {

AttemptEndReport Error(int64_t attempt_id, std::string reason) {
  AttemptEndReport end;
  end.attempt_id = attempt_id;
  end.seq = 1;  // no event was sent before the worker ran
  end.outcome = std::string(kOutcomeError);
  end.reason = std::move(reason);
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

  auto checkout = git_.Checkout(spec.repository, spec.commit);
  if (!checkout.ok()) return Error(id, "checkout failed: " + checkout.status().message());
  spdlog::info("attempt {}: checked out {} at {}", id, spec.repository, checkout->head);
  if (cancel.requested()) return Error(id, "cancelled: after checkout");

  auto recipe = LoadRecipe(checkout->path, spec.commit);
  if (!recipe.ok()) return Error(id, recipe.status().message());

  BuildConfig build_config;
  build_config.work_dir = config_.work_dir;
  build_config.sdk_dir = config_.sdk_dir;
  build_config.cmake_prefix_path = config_.cmake_prefix_path;
  build_config.cmake = config_.cmake;
  build_config.log_flush_timeout = config_.log_flush_timeout;
  BuildRequest request{checkout->path, RepoKey(spec.repository), std::move(recipe).value()};
  LogStream build_log(sink, id, kBuildStream);
  auto built = RunBuild(
      build_config, request, [&](std::string_view bytes) { build_log.Write(bytes); }, cancel);
  if (cancel.requested()) return Error(id, "cancelled: during the build");
  if (!built.ok()) {
    const std::string message = built.status().message();
    return Error(id, message.rfind("build failed", 0) == 0 ? message : "build failed: " + message);
  }

  WorkerLaunch launch;
  launch.attempt_id = id;
  launch.attempt_dir = config_.work_dir / "attempts" / std::to_string(id);
  launch.spec = std::move(spec);
  launch.checkout = *checkout;
  launch.plugins = built->plugins;
  launch.worker = config_.worker;
  launch.agent_name = config_.agent_name;
  launch.gpu_indices = config_.gpu_indices;
  launch.gpu_models = config_.gpu_models;
  launch.log_flush_timeout = config_.log_flush_timeout;
  return RunWorker(launch, sink, cancel, &used_ports);
}

}  // namespace gatehouse::agent
