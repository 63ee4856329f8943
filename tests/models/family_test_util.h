// Helpers shared by the model-family tests (tests/models/*_test.cc) and the checkpoint-fault
// tests (tests/worker/checkpoint_faults_test.cc): the in-tree plugin's registry, reached only
// through its exported entry point as the worker reaches it; the transformers-saved fixtures
// under GATEHOUSE_TESTDATA_DIR (made by the `testdata` ctest fixture); and the checks every
// family repeats (adapter names vs checkpoint keys, KV-cache decode vs full forward).
//
// Inline, header-only: each test executable defines GATEHOUSE_TESTDATA_DIR itself and links
// gatehouse_models (which exports gatehouse_plugin_register) and GTest.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "gatehouse/worker/checkpoint.h"
#include "gatehouse/worker/gates.h"
#include "gatehouse/worker/model_family.h"
#include "gatehouse/worker/run_spec.h"

#ifndef GATEHOUSE_TESTDATA_DIR
#error "GATEHOUSE_TESTDATA_DIR must be defined by the test target (tests/models/CMakeLists.txt)"
#endif

extern "C" int gatehouse_plugin_register(gatehouse::worker::FamilyRegistry* registry, char* error,
                                         int error_size);

namespace gatehouse::test_util {

/// The in-tree plugin's registry, filled once through its exported entry point
/// gatehouse_plugin_register; a non-zero return fails the calling test with the plugin's error.
inline const worker::FamilyRegistry& Registry() {
  static worker::FamilyRegistry* registry = [] {
    auto* r = new worker::FamilyRegistry();
    char error[512] = {0};
    const int rc = gatehouse_plugin_register(r, error, sizeof(error));
    EXPECT_EQ(rc, 0) << "plugin registration failed: " << error;
    return r;
  }();
  return *registry;
}

/// The registered family named `name` (e.g. "gemma2"); an unknown name fails the calling test.
inline const worker::ModelFamily& FamilyByName(const std::string& name) {
  const worker::ModelFamily* family = Registry().FindByName(name);
  EXPECT_NE(family, nullptr) << name;
  return *family;
}

/// The registered family serving HF `model_type`; an unknown one fails the calling test.
inline const worker::ModelFamily& FamilyByModelType(const std::string& model_type) {
  const worker::ModelFamily* family = Registry().FindByModelType(model_type);
  EXPECT_NE(family, nullptr) << model_type;
  return *family;
}

/// The folder the `testdata` fixture writes every variant into (GATEHOUSE_TESTDATA_DIR).
inline std::filesystem::path TestdataDir() { return std::filesystem::path(GATEHOUSE_TESTDATA_DIR); }

/// One fixture variant's folder (holds checkpoint/ and reference/), e.g. "llama-tiny-tied".
inline std::filesystem::path FixtureDir(const std::string& variant) {
  return TestdataDir() / variant;
}

/// The transformers-saved checkpoint folder of a fixture variant.
inline std::filesystem::path FixtureCheckpointDir(const std::string& variant) {
  return FixtureDir(variant) / "checkpoint";
}

/// The variant's checkpoint/config.json as saved by transformers; throws
/// nlohmann::json::parse_error (failing the test) when it is absent or not JSON.
inline nlohmann::json FixtureConfig(const std::string& variant) {
  std::ifstream in(FixtureCheckpointDir(variant) / "config.json");
  return nlohmann::json::parse(in);
}

/// The JSON of a CPU run spec over a fixture folder (`variant_dir`/checkpoint and /reference,
/// digests unchecked) for `family` in `precision` ("fp32" / "bf16"): every phase from config
/// to save, 32 greedy tokens, 2 training steps, topology tp=1. Callers may edit it (phases,
/// topology) before writing it for the worker executable.
inline nlohmann::json FixtureRunSpecJson(const std::filesystem::path& variant_dir,
                                         const std::string& family, const std::string& precision,
                                         const std::filesystem::path& attempt_dir) {
  return {
      {"spec_version", 1},
      {"repository", "/tmp/unused"},
      {"commit", std::string(40, '0')},
      {"model_family", family},
      {"checkpoint", {{"path", (variant_dir / "checkpoint").string()}, {"digest", "unchecked"}}},
      {"reference", {{"path", (variant_dir / "reference").string()}, {"digest", "unchecked"}}},
      {"runtime", {{"torch", "2.11.0"}, {"device", "cpu"}}},
      {"launch", {{"runner", "gatehouse-worker"}, {"processes_per_rank", 1}}},
      {"topology", {{"tp", 1}, {"dp", 1}, {"pp", 1}, {"ep", 1}}},
      {"precision", precision},
      {"mode", "eager"},
      {"decode", {{"max_new_tokens", 32}, {"sampling", "greedy"}}},
      {"training", {{"steps", 2}, {"lr", 0.001}, {"seed", 1234}}},
      {"env", nlohmann::json::object()},
      {"phases",
       {"config", "construct", "load", "inference", "decode", "packing", "logprob_parity",
        "training", "save"}},
      {"attempt",
       {{"id", 1},
        {"dir", attempt_dir.string()},
        {"checkout", {{"head", std::string(40, '0')}, {"clean", true}, {"path", "/tmp"}}},
        {"agent", "families-test"}}},
  };
}

/// FixtureRunSpecJson parsed. A spec that does not parse fails the calling test.
inline worker::RunSpec FixtureRunSpec(const std::filesystem::path& variant_dir,
                                      const std::string& family, const std::string& precision,
                                      const std::filesystem::path& attempt_dir) {
  auto spec = worker::ParseRunSpec(FixtureRunSpecJson(variant_dir, family, precision, attempt_dir));
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return spec.ok() ? *spec : worker::RunSpec{};
}

/// A gate in the fixed phase order, with its phase name.
struct NamedGate {
  const char* phase;
  worker::GateOutcome (*run)(worker::GateContext&);
};

/// The gates from config up to and including `last` ("inference", "save", ...), in order.
inline std::vector<NamedGate> GatesThrough(std::string_view last) {
  const NamedGate all[] = {
      {"config", worker::ConfigGate},       {"construct", worker::ConstructGate},
      {"load", worker::LoadGate},           {"inference", worker::InferenceGate},
      {"decode", worker::DecodeGate},       {"packing", worker::PackingGate},
      {"logprob_parity", worker::LogprobParityGate},
      {"training", worker::TrainingGate},   {"save", worker::SaveGate}};
  std::vector<NamedGate> out;
  for (const NamedGate& g : all) {
    out.push_back(g);
    if (g.phase == last) break;
  }
  return out;
}

/// A gate context over FixtureRunSpec(...) and the in-tree plugin's registry.
inline worker::GateContext FixtureContext(const std::filesystem::path& variant_dir,
                                          const std::string& family, const std::string& precision,
                                          const std::filesystem::path& attempt_dir) {
  worker::GateContext ctx;
  ctx.spec = FixtureRunSpec(variant_dir, family, precision, attempt_dir);
  ctx.registry = &Registry();
  return ctx;
}

/// Outcomes by phase of one fixture run.
using PhaseOutcomes = std::vector<std::pair<std::string, worker::GateOutcome>>;

/// One fixture in one precision through config .. `last` with the families of `registry`
/// (seeded as the worker seeds, training.seed 1234); stops at the first phase that does not
/// PASS.
inline PhaseOutcomes RunFixtureGates(const worker::FamilyRegistry& registry,
                                     const std::string& variant, const std::string& family,
                                     const std::string& precision,
                                     const std::filesystem::path& attempt_dir,
                                     std::string_view last = "save") {
  torch::manual_seed(1234);
  worker::GateContext ctx;
  ctx.spec = FixtureRunSpec(FixtureDir(variant), family, precision, attempt_dir);
  ctx.registry = &registry;
  PhaseOutcomes outcomes;
  for (const auto& [phase, gate] : GatesThrough(last)) {
    outcomes.emplace_back(std::string(phase), gate(ctx));
    if (outcomes.back().second.status != GateStatus::kPass) break;
  }
  return outcomes;
}

/// {phase: {"status", "reason", "figures": {name: value}}}: what tools/parity reads from
/// GATEHOUSE_FIGURES_JSON.
inline nlohmann::json OutcomesJson(const PhaseOutcomes& outcomes) {
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [phase, out] : outcomes) {
    nlohmann::json figures = nlohmann::json::object();
    for (const worker::Figure& f : out.figures) {
      std::visit([&](const auto& v) { figures[f.name] = v; }, f.value);
    }
    phases[phase] = {{"status", std::string(GateStatusName(out.status))},
                     {"reason", out.reason}, {"figures", figures}};
  }
  return phases;
}

/// A gate figure as text (numbers through std::to_string), or "-" when the gate did not report
/// `name`.
inline std::string FigureText(const worker::GateOutcome& out, std::string_view name) {
  const worker::Figure* f = out.Find(name);
  if (f == nullptr) return "-";
  return std::visit([](const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) return v;
    else return std::to_string(v);
  }, f->value);
}

/// Expects the config report to account for every field of `config` exactly once: nothing
/// unmapped, every ignored field with a reason, no field both mapped and ignored, and every
/// config field either mapped or ignored (counts equal). Returns the ignored fields for
/// family-specific checks. `label` names the case in failures.
inline std::set<std::string> ExpectConfigFullyAccounted(const worker::ConfigReport& report,
                                                        const nlohmann::json& config,
                                                        const std::string& label = "") {
  EXPECT_TRUE(report.unmapped.empty()) << label << ": " << nlohmann::json(report.unmapped).dump();
  std::set<std::string> accounted(report.mapped.begin(), report.mapped.end());
  std::set<std::string> ignored;
  for (const auto& [field, reason] : report.ignored) {
    EXPECT_FALSE(reason.empty()) << label << ": " << field;
    EXPECT_TRUE(accounted.insert(field).second) << label << ": " << field
                                                << " both mapped and ignored";
    ignored.insert(field);
  }
  for (const auto& [field, value] : config.items()) {
    EXPECT_TRUE(accounted.count(field)) << label << ": " << field;
  }
  EXPECT_EQ(accounted.size(), config.size()) << label;
  return ignored;
}

/// The internal (torchtitan-style) names of every parameter of `model`.
inline std::set<std::string> ParamNames(const worker::CausalLM& model) {
  std::set<std::string> names;
  for (const auto& item : model.named_parameters()) names.insert(item.key());
  return names;
}

/// Expects an adapter's ExpectedHfNames() to equal a checkpoint's tensor keys exactly: the same
/// set and the same count (no duplicates on either side). `label` names the fixture in failures.
inline void ExpectNamesEqualKeys(const std::vector<std::string>& expected,
                                 const std::vector<std::string>& keys, const std::string& label) {
  EXPECT_EQ(std::set<std::string>(expected.begin(), expected.end()),
            std::set<std::string>(keys.begin(), keys.end()))
      << label;
  EXPECT_EQ(expected.size(), keys.size()) << label;
}

/// Opens the fixture checkpoint `variant`, parses its config.json with `family`, builds the
/// adapter and expects its ExpectedHfNames() to equal the checkpoint's keys
/// (ExpectNamesEqualKeys). Returns the opened checkpoint for further checks, or an empty
/// optional after a failed assertion. The caller skips variants that are absent.
inline std::optional<worker::Checkpoint> ExpectAdapterNamesEqualFixtureKeys(
    const worker::ModelFamily& family, const std::string& variant) {
  auto checkpoint = worker::Checkpoint::Open(FixtureCheckpointDir(variant));
  EXPECT_TRUE(checkpoint.ok()) << variant << ": " << checkpoint.status().ToString();
  if (!checkpoint.ok()) return std::nullopt;
  auto parsed = family.ParseConfig(checkpoint->config());
  EXPECT_TRUE(parsed.ok()) << variant << ": " << parsed.status().ToString();
  if (!parsed.ok()) return std::nullopt;
  auto adapter = family.Adapter(*parsed->args);
  EXPECT_TRUE(adapter.ok()) << variant << ": " << adapter.status().ToString();
  if (!adapter.ok()) return std::nullopt;
  ExpectNamesEqualKeys(adapter->ExpectedHfNames(), checkpoint->Keys(), variant);
  return std::move(*checkpoint);
}

/// How ExpectKVCacheDecodeMatchesFullForward splits a sequence: a prefill of `prefill` tokens,
/// `steps` one-token steps, then one chunk of `chunk` tokens, over `batch` rows of token ids
/// drawn uniformly from [token_low, vocab), into a cache of `cache_capacity` positions.
struct DecodePlan {
  int64_t batch = 2;
  int64_t prefill = 7;
  int64_t steps = 4;
  int64_t chunk = 3;
  int64_t token_low = 0;
  int64_t vocab = 256;
  int64_t cache_capacity = 64;
};

/// Expects prefill + one-token steps + a multi-token chunk through a fresh KV cache to give the
/// logits [batch, seq, vocab] of one full forward pass without a cache (fp32, rtol = atol =
/// 1e-5; transformers' generate-with-cache contract), and the cache length to grow by each
/// piece's length. Draws the tokens with torch's global generator, so call it right after the
/// test seeds it (Randomize). `label` names the case in failures.
inline void ExpectKVCacheDecodeMatchesFullForward(worker::CausalLM& model, const DecodePlan& plan,
                                                  const std::string& label) {
  torch::NoGradGuard no_grad;
  const int64_t total = plan.prefill + plan.steps + plan.chunk;
  auto tokens = torch::randint(plan.token_low, plan.vocab, {plan.batch, total}, torch::kLong);
  auto positions =
      torch::arange(total, torch::kLong).unsqueeze(0).expand({plan.batch, total}).contiguous();
  auto full = model.Forward(tokens, positions, nullptr);

  auto cache = model.NewKVCache(plan.batch, plan.cache_capacity);
  std::vector<torch::Tensor> pieces;
  auto run = [&](int64_t start, int64_t len) {
    pieces.push_back(model.Forward(tokens.narrow(1, start, len).contiguous(),
                                   positions.narrow(1, start, len).contiguous(), cache.get()));
    EXPECT_EQ(cache->length(), start + len) << label;
  };
  run(0, plan.prefill);
  for (int64_t i = 0; i < plan.steps; ++i) run(plan.prefill + i, 1);
  run(plan.prefill + plan.steps, plan.chunk);
  auto incremental = torch::cat(pieces, 1);
  ASSERT_EQ(incremental.sizes(), full.sizes()) << label;
  EXPECT_TRUE(torch::allclose(incremental, full, /*rtol=*/1e-5, /*atol=*/1e-5))
      << label << " max abs diff " << (incremental - full).abs().max().item<float>();
}

}  // namespace gatehouse::test_util
