// Test fixtures for the gates: a seeded fake model written as an HF-style checkpoint, a
// reference bundle computed from that same model, and a run spec pointing at both.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fake_family.h"
#include "gatehouse/worker/gates.h"
#include "tests/common/temp_dir.h"

namespace gatehouse::worker::testing {

using gatehouse::test_util::TempDir;

struct FixtureOptions {
  bool tie = true;
  FakeOptions fake;
  std::vector<int64_t> prompt_lengths = {5, 7, 4};
  int64_t max_new_tokens = 6;
  uint64_t seed = 1;
  /// reference.json "device" (where the reference forwards ran); "cpu" when empty.
  std::string reference_device;
  /// reference.json "num_threads"; this process's count when 0.
  int64_t reference_threads = 0;
};

/// One seeded fake model and everything made from it. Layout under a temp dir:
///   checkpoint/{config.json, model.safetensors}, reference/{reference.json,
///   reference.safetensors}, attempt/ (the attempt directory).
/// Constructing it writes nothing; call Write() after editing `tensors`/`config` (or use
/// Written()).
class Fixture {
 public:
  explicit Fixture(FixtureOptions options = {});

  /// Writes the checkpoint (`tensors`, `config`) and the reference (from `model`).
  void Write();
  /// Writes only the checkpoint.
  void WriteCheckpoint();
  /// Writes the reference bundle (format gatehouse-reference/2) computed from `source` and from
  /// a bf16 copy of it, standing in for upstream: greedy ids by full recomputation per step (as
  /// an uncached generate would), decode logits through the KV cache along them, the
  /// teacher-forced continuation, and a training trace of four steps of the training gate's
  /// own procedure (UpstreamAdamW, lr 1e-3) on copies of the source; decode and training floors
  /// 0.
  void WriteReference(CausalLM& source);

  /// A fresh model of the fixture's family in `dtype` holding `source`'s weights.
  std::shared_ptr<CausalLM> CopyOf(CausalLM& source, torch::Dtype dtype) const;

  /// The run spec (protocols.md §3) over this fixture's paths, all default phases.
  nlohmann::json SpecJson() const;
  /// A gate context over SpecJson(), the fixture's registry, and the probed runtime.
  GateContext Context() const;

  FixtureOptions options;
  TempDir dir;
  std::filesystem::path checkpoint_dir, reference_dir, attempt_dir;
  FamilyRegistry registry;                  // holds FakeFamily(options.fake)
  std::shared_ptr<const ModelArgs> args;    // the model's args, parsed from the first config
  std::shared_ptr<CausalLM> model;          // the seeded source model, fp32 CPU
  std::map<std::string, torch::Tensor> tensors;  // checkpoint tensors by HF name
  nlohmann::json config;
  std::vector<torch::Tensor> prompts;       // int64 [T] each
};

/// Runs DefaultGates() in order up to and including `last`; returns the outcome of `last`.
/// Records a test failure (and returns that outcome) if an earlier gate ends FAIL, BLOCKED or
/// UNKNOWN.
GateOutcome RunThrough(GateContext& ctx, std::string_view last);

}  // namespace gatehouse::worker::testing
