// gatehouse-worker: runs the gates of one attempt (docs/protocols.md §3, §4).
//
//   gatehouse-worker --run-spec run.json --plugin libgatehouse_models.so [--plugin ...]
//   gatehouse-worker --print-runtime   (one JSON object: the runtime the agent reports)
//   gatehouse-worker --check-reference DIR
//       validates a reference bundle (docs/protocols.md §6) as the gates read it: one JSON
//       summary on stdout and exit 0, or the error naming the tensor or field and exit 2.
//
// Standard output carries only the JSON-lines events; the log (spdlog) goes to standard error.
// Exit status: 0 when the run completed, whatever the verdict (run_end says it); 2 for a bad
// rank environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; distributed.h), or a bad
// command line or run spec; 3 when the rank could not join its process group (no events are
// written then).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/phases.h"
#include "gatehouse/worker/cuda_graph.h"
#include "gatehouse/worker/distributed.h"
#include "gatehouse/worker/events.h"
#include "gatehouse/worker/gates.h"
#include "gatehouse/worker/log.h"
#include "gatehouse/worker/model_family.h"
#include "gatehouse/worker/plugin_loader.h"
#include "gatehouse/worker/reference.h"
#include "gatehouse/worker/run_spec.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitNoGroup = 3;
/// How long a rank waits for the group to form and for each collective (GATEHOUSE_GROUP_TIMEOUT_S
/// overrides it), in seconds.
constexpr int kDefaultGroupTimeoutSeconds = 1800;

}  // namespace

int main(int argc, char** argv) {
  using namespace gatehouse;
  using namespace gatehouse::worker;
  log::UseStderr();

  CLI::App app{"Gatehouse worker: runs the gates of one attempt and writes JSON-lines events"};
  std::string run_spec_path;
  std::vector<std::string> plugins;
  bool print_runtime = false;
  std::string check_reference;
  auto* run_spec_option = app.add_option("--run-spec", run_spec_path, "run.json written by the agent")
      ->check(CLI::ExistingFile);
  app.add_flag("--print-runtime", print_runtime,
               "print the runtime (torch, CUDA, cuDNN, NCCL, driver versions; devices) as JSON and exit")
      ->excludes(run_spec_option);
  app.add_option("--check-reference", check_reference,
                 "validate the reference bundle in this directory and exit (0: valid, 2: not)")
      ->excludes(run_spec_option);
  app.add_option("--plugin", plugins, "model-family plugin shared library (repeatable)");
  std::vector<std::string> python_entries, python_path;
  std::string python_lane = GATEHOUSE_PYTHON_LANE_LIB;
  app.add_option("--python-entry", python_entries,
                 "Python-lane adapter, package.module:SPEC (repeatable; docs/protocols.md §9)");
  // An existing directory: a mistyped path, or a flag taken for one, is refused, not put on
  // sys.path unseen.
  app.add_option("--python-path", python_path,
                 "directory put in front of the Python lane's sys.path (repeatable)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--python-lane", python_lane, "the Python lane's library")
      ->capture_default_str();
  bool parallel_measure_only = false;
  app.add_flag("--parallel-measure-only", parallel_measure_only,
               "benchmarks only: the parallel gate trains the layout without its control, "
               "compares nothing and ends SKIPPED with each rank's step times (a group is "
               "joined at world size 1 too)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help or the error to the right stream
    return e.get_exit_code() == 0 ? rc : kExitBadInput;
  }
  if (print_runtime) {
    std::printf("%s\n", RuntimeJson(ProbeRuntime()).dump().c_str());
    return 0;
  }
  if (!check_reference.empty()) {
    Result<ReferenceBundle> bundle = LoadReference(check_reference);
    if (!bundle.ok()) {
      log::Error("reference bundle " + check_reference + ": " + bundle.status().ToString());
      return kExitBadInput;
    }
    nlohmann::json lengths = nlohmann::json::array();
    for (const auto& p : bundle->prompts) lengths.push_back(p.input_ids.size(0));
    std::printf("%s\n", nlohmann::json{{"format", kReferenceFormat},
                                       {"prompt_lengths", lengths},
                                       {"vocab_size", bundle->vocab_size},
                                       {"max_new_tokens", bundle->max_new_tokens},
                                       {"training_steps", bundle->training.steps},
                                       {"device", bundle->device}}
                             .dump()
                             .c_str());
    return 0;
  }
  if (run_spec_path.empty()) {
    log::Error("--run-spec is required (or --print-runtime, --check-reference)");
    return kExitBadInput;
  }

  Result<RunSpec> spec = LoadRunSpec(run_spec_path);
  if (!spec.ok()) {
    log::Error(spec.status().ToString());
    return kExitBadInput;
  }
  if (parallel_measure_only) {
    // The parallel gate releases the loaded model before it measures: nothing may run after.
    for (const std::string& phase : spec->phases) {
      if (PhaseIndex(phase).value_or(0) > PhaseIndex("parallel").value_or(0)) {
        log::Error("--parallel-measure-only: phase " + phase + " runs after parallel, which " +
                   "releases the loaded model; request the phases up to parallel only");
        return kExitBadInput;
      }
    }
  }

  try {
    if (const char* threads = std::getenv("OMP_NUM_THREADS")) {
      const int n = std::atoi(threads);
      if (n > 0) torch::set_num_threads(n);
    }
    torch::manual_seed(static_cast<uint64_t>(spec->training.seed));

    FamilyRegistry registry;
    GateContext ctx;
    ctx.spec = *spec;
    ctx.registry = &registry;
    ctx.parallel_measure_only = parallel_measure_only;
    for (const std::string& path : plugins) {
      Status loaded = LoadPlugin(path, registry);
      if (!loaded.ok()) {
        log::Error(loaded.message());
        ctx.plugin_errors.push_back(loaded.message());
      } else {
        log::Info("plugin " + path + " loaded");
      }
    }
    if (!python_entries.empty()) {
      Status loaded = LoadPythonLane(python_lane, python_entries, python_path, registry);
      if (!loaded.ok()) {
        log::Error(loaded.message());
        ctx.plugin_errors.push_back(loaded.message());
      } else {
        log::Info("python lane loaded: " + nlohmann::json(python_entries).dump());
      }
    }
    if (plugins.empty() && python_entries.empty()) {
      ctx.plugin_errors.push_back("no --plugin or --python-entry given: no model family is registered");
    }
    ctx.runtime = ProbeRuntime();

    // A group of ranks (the agent starts one worker per rank with torchrun's variables):
    // join it before any gate runs. Ranks > 0 wait in the parallel gate's first collective
    // while rank 0 runs the phases only it runs, hence the long default timeout.
    Result<RankEnv> rank_env = ReadRankEnv();
    if (!rank_env.ok()) {
      log::Error(rank_env.status().ToString());
      return kExitBadInput;
    }
    ctx.rank = rank_env->rank;
    ctx.world_size = rank_env->world_size;
    if (rank_env->world_size > 1 || parallel_measure_only) {
      std::chrono::seconds timeout(kDefaultGroupTimeoutSeconds);
      if (const char* t = std::getenv("GATEHOUSE_GROUP_TIMEOUT_S")) {
        if (std::atoi(t) > 0) timeout = std::chrono::seconds(std::atoi(t));
      }
      // The Python lane's torch.distributed group (python_lane.cc ShardLoaded) waits as long.
      ::setenv("GATEHOUSE_GROUP_TIMEOUT_S", std::to_string(timeout.count()).c_str(), /*overwrite=*/1);
      // The device chooses the backend: NCCL for a CUDA cell on a worker that has CUDA and
      // NCCL, each rank on device LOCAL_RANK of the GPUs the agent made visible; gloo
      // otherwise (a CUDA cell without them then meets identity's and parallel's BLOCKED).
      const bool nccl = spec->runtime.device == "cuda" && ctx.runtime.cuda_available &&
                        NcclGroupsAvailable();
      ctx.comm_backend = nccl ? "nccl" : "gloo";
      log::Info("rank " + std::to_string(ctx.rank) + " of " + std::to_string(ctx.world_size) +
                ": joining the " + ctx.comm_backend + " group at " + rank_env->master_addr + ":" +
                std::to_string(rank_env->master_port) +
                (nccl ? " on cuda:" + std::to_string(rank_env->local_rank) : ""));
      Result<JoinedGroup> group = nccl ? JoinNcclGroup(*rank_env, rank_env->local_rank, timeout)
                                       : JoinGlooGroup(*rank_env, timeout);
      if (!group.ok()) {
        // Without its group this rank cannot take part; it exits before any event, so the
        // agent stops the other ranks and names this one.
        log::Error(group.status().ToString());
        return kExitNoGroup;
      }
      if (nccl) ctx.device_index = rank_env->local_rank;
      ctx.subgroups = group->subgroups;
      ctx.comm = MakeC10dCommunicator(
          group->group,
          nccl ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank_env->local_rank))
               : torch::Device(torch::kCPU));
    }
    log::Info("attempt " + std::to_string(spec->attempt.id) + ": torch " +
              ctx.runtime.torch_version + ", device " + spec->runtime.device + ", " +
              std::to_string(spec->phases.size()) + " phase(s) requested");

    JsonlEventSink sink(stdout);
    EventWriter events(sink);
    if (ctx.world_size > 1) events.SetRank(ctx.rank);
    const GateStatus verdict = RunGates(ctx, events);
    log::Info("run_end " + std::string(GateStatusName(verdict)));
  } catch (const std::exception& e) {
    // Gates catch their own errors; this is the last line of defence (e.g. a failed probe).
    log::Error(std::string("worker error outside the gates: ") + e.what());
    PythonLaneBeforeExit();
    return 1;
  }
  PythonLaneBeforeExit();
  return 0;
}
