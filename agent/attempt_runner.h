// One attempt from assignment to end: checkout, recipe, build, worker (DESIGN.md "Run").
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/attempt_sink.h"
#include "agent/build.h"
#include "agent/checkout.h"
#include "agent/process.h"

namespace gatehouse::agent {

/// An Assignment as the domain sees it (no protobuf).
struct AttemptAssignment {
  int64_t attempt_id = 0;
  std::string cell_id;
  std::string spec_json;  // the frozen cell spec (docs/protocols.md §2)
};

struct RunnerConfig {
  /// Absolute. Clones under repos/, build trees under build/, attempts under attempts/<id>/.
  std::filesystem::path work_dir;
  std::filesystem::path sdk_dir;
  std::string cmake_prefix_path;
  std::filesystem::path cmake = "cmake";
  std::filesystem::path worker;  // gatehouse-worker
  std::string agent_name;
  std::vector<int> gpu_indices;  // this node's GPUs (nvidia-smi index); worker_launcher.h VisibleDevices
};

/// Runs attempts one after another, reporting to an AttemptSink.
///
/// Threading: not thread-safe; Run() is called from a single runner thread. Cancellation comes
/// through the CancelToken, whose flag any thread may set.
class AttemptRunner {
 public:
  explicit AttemptRunner(RunnerConfig config);

  /// Runs `assignment` to its end and calls sink.End() exactly once, last. Failures before the
  /// worker runs end the attempt with outcome "error" and a reason that says which step failed:
  /// "invalid spec: ...", "checkout failed: ...", "gatehouse.recipe.json ...", "build failed: ...",
  /// "cancelled: ...".
  void Run(const AttemptAssignment& assignment, AttemptSink& sink, CancelToken cancel = {});

 private:
  AttemptEndReport RunSteps(const AttemptAssignment& assignment, AttemptSink& sink,
                            CancelToken cancel);

  RunnerConfig config_;
  GitCheckout git_;
};

}  // namespace gatehouse::agent
