// Every registered model family, through the real gates, on the checkpoints transformers saved
// for it (tools/refgen/families/<family>.py, made by the `testdata` fixture).
//
// This is the test that fails when a family is added without fixtures, or a fixture of a
// family that is no longer registered lingers: the registry and the fixture stamps must name
// the same families. Each fixture then runs config, construct, load, inference, decode,
// training and save in fp32 and in bf16, against upstream's run in the same precision on the
// same CPU kernels, where the bars are bit-exact (docs/bars.md).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <cmath>
#include <cstdlib>
#include <variant>
#include <vector>

#include "tests/common/temp_dir.h"
#include "common/recipe.h"
#include "gatehouse/worker/gates.h"
#include "gatehouse/worker/model_family.h"
#include "gatehouse/worker/run_spec.h"
#include "tests/models/family_test_util.h"

namespace gatehouse::worker {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test_util::Registry;

/// variant name -> family, from the .done stamps the fixture generator writes.
std::map<std::string, std::string> FixtureFamilies() {
  std::map<std::string, std::string> out;
  const fs::path root = test_util::TestdataDir();
  if (!fs::is_directory(root)) return out;
  for (const auto& entry : fs::directory_iterator(root)) {
    const fs::path stamp = entry.path() / ".done";
    if (!fs::is_regular_file(stamp)) continue;
    std::ifstream in(stamp);
    const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("variant") || !j["variant"].contains("family")) continue;
    out[entry.path().filename().string()] = j["variant"]["family"].get<std::string>();
  }
  return out;
}

using test_util::FigureText;

// The registry and the fixtures name the same families: a registered family without a
// transformers-saved checkpoint is untested, a fixture without a family is stale.
TEST(Families, EveryRegisteredFamilyHasFixtures) {
  const auto fixtures = FixtureFamilies();
  if (fixtures.empty()) GTEST_SKIP() << GATEHOUSE_TESTDATA_DIR << " has no fixture: run through ctest";
  std::map<std::string, int> per_family;
  for (const auto& [variant, family] : fixtures) ++per_family[family];
  for (const std::string& name : Registry().Names()) {
    EXPECT_GT(per_family[name], 0) << "family " << name << " is registered but has no fixture in "
                                   << "tools/refgen/families/";
  }
  for (const auto& [variant, family] : fixtures) {
    EXPECT_NE(Registry().FindByName(family), nullptr)
        << "fixture " << variant << " names family " << family << ", which is not registered";
  }
}

// The in-tree plugin's recipe declares exactly the families it registers: the controller
// refuses a cell whose model_family the recipe does not declare (common/recipe.h CheckServes).
TEST(Families, RecipeDeclaresTheRegisteredFamilies) {
  const std::filesystem::path file =
      std::filesystem::path(GATEHOUSE_SOURCE_DIR) / "models" / std::string(kRecipeFileName);
  std::ifstream in(file);
  ASSERT_TRUE(in) << file;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Result<Recipe> recipe = ParseRecipe(text);
  ASSERT_TRUE(recipe.ok()) << recipe.status().ToString();
  std::vector<std::string> declared = recipe->families, registered = Registry().Names();
  std::sort(declared.begin(), declared.end());
  std::sort(registered.begin(), registered.end());
  EXPECT_EQ(declared, registered) << file;
}

/// One fixture in one precision through config .. save with the in-tree plugin's families.
test_util::PhaseOutcomes RunFixture(const std::string& variant, const std::string& family,
                                    const std::string& precision) {
  test_util::TempDir attempt;
  return test_util::RunFixtureGates(Registry(), variant, family, precision, attempt.path());
}

double Real(const GateOutcome& out, const char* name) {
  const Figure* f = out.Find(name);
  return f != nullptr && std::holds_alternative<double>(f->value) ? std::get<double>(f->value)
                                                                   : std::nan("");
}

/// Every fixture of every family, in fp32 and bf16, passes every gate from config to save on
/// the same CPU kernels as the bundle's: the bars there are bit-exact (docs/bars.md), so this
/// is the measurement behind them. Logits (prompt and decode steps), losses and step-1 gradient
/// norms equal transformers' to the last bit; the teacher-forced continuation differs only by
/// upstream's own cached-vs-forced spread. With GATEHOUSE_FIGURES_JSON set, every gate's
/// figures are written there (tools/parity reads them).
TEST(Families, EveryGatePassesOnEveryFixtureInBothPrecisions) {
  const auto fixtures = FixtureFamilies();
  if (fixtures.empty()) GTEST_SKIP() << "no fixture: run through ctest";
  json record = json::object();
  for (const auto& [variant, family] : fixtures) {
    for (const std::string precision : {"fp32", "bf16"}) {
      const auto outcomes = RunFixture(variant, family, precision);
      record[variant][precision] = test_util::OutcomesJson(outcomes);
      ASSERT_FALSE(outcomes.empty());
      const auto& [last_phase, last] = outcomes.back();
      EXPECT_TRUE(last_phase == "save" && last.status == GateStatus::kPass)
          << variant << " (" << family << ") " << precision << " " << last_phase << ": "
          << GateStatusName(last.status) << " " << last.reason;
      for (const auto& [phase, out] : outcomes) {
        if (out.status != GateStatus::kPass) continue;
        if (phase == "inference") {
          EXPECT_EQ(Real(out, "max_abs_diff"), 0.0) << variant << " " << precision;
          EXPECT_EQ(FigureText(out, "reference"),
                    precision == "bf16" ? "transformers bf16 forward (same precision)"
                                        : "transformers fp32 forward");
        }
        if (phase == "decode") {
          // bf16 decode steps equal upstream's; fp32 ones are held by the gate to upstream's
          // own dynamic-vs-static cache spread.
          if (precision == "bf16") {
            EXPECT_EQ(Real(out, "steps_max_abs_diff"), 0.0) << variant;
          }
          const Figure* distinct = out.Find("reference_distinct_tokens_min");
          ASSERT_NE(distinct, nullptr);
          EXPECT_GE(std::get<int64_t>(distinct->value), 3) << variant << " " << precision;
        }
        if (phase == "packing") {
          // Every probe prompt packed, and the packed training step compared.
          const Figure* sequences = out.Find("sequences");
          ASSERT_NE(sequences, nullptr);
          EXPECT_GE(std::get<int64_t>(sequences->value), 2) << variant << " " << precision;
          EXPECT_NE(out.Find("loss_rel_diff"), nullptr) << variant << " " << precision;
          EXPECT_NE(out.Find("grad_rel_diff_max"), nullptr) << variant << " " << precision;
        }
        if (phase == "logprob_parity") {
          // Every probe prompt's sampled tokens scored on both paths, the bar beside them.
          const Figure* tokens = out.Find("sampled_tokens");
          ASSERT_NE(tokens, nullptr);
          EXPECT_GE(std::get<int64_t>(tokens->value), 2 * 32) << variant << " " << precision;
          // A gap upstream's own paths show too (dynamic NTK RoPE) is barred on its greedy
          // tokens against upstream's; any other is barred on the sampled tokens.
          if (out.Find("inherent_gap") != nullptr) {
            EXPECT_LE(Real(out, "greedy_mean_abs_diff"), Real(out, "bar_greedy_mean_abs_diff"))
                << variant << " " << precision;
          } else {
            EXPECT_LE(Real(out, "mean_abs_diff"), Real(out, "bar_mean_abs_diff"))
                << variant << " " << precision;
          }
          EXPECT_GE(Real(out, "k3_kl"), 0.0) << variant << " " << precision;
        }
        if (phase == "training") {
          EXPECT_EQ(Real(out, "loss_rel_diff_step_1"), 0.0) << variant << " " << precision;
          EXPECT_EQ(Real(out, "loss_rel_diff_step_2"), Real(out, "upstream_floor_loss_rel") > 0
                                                           ? Real(out, "loss_rel_diff_step_2")
                                                           : 0.0)
              << variant << " " << precision;
          if (Real(out, "upstream_floor_grad_norm_rel") == 0) {
            EXPECT_EQ(Real(out, "grad_norm_max_rel_diff"), 0.0) << variant << " " << precision;
          }
        }
      }
    }
  }
  if (const char* path = std::getenv("GATEHOUSE_FIGURES_JSON")) {
    std::ofstream(path) << record.dump(1) << "\n";
  }
}

// The performance gate measures transformers in the same run (tools/bench/hf_peer.py through
// GATEHOUSE_PEER_PYTHON) and reports ratios; without a peer it is BLOCKED, keeping our figures.
TEST(Families, PerformanceGateMeasuresThePeer) {
  const std::string variant = "llama-tiny-untied";
  for (const char* python : {GATEHOUSE_PYTHON, "/nonexistent/python"}) {
    test_util::TempDir attempt;
    GateContext ctx =
        test_util::FixtureContext(test_util::FixtureDir(variant), "llama", "fp32", attempt.path());
    for (const auto& [phase, gate] : test_util::GatesThrough("load")) {
      ASSERT_EQ(gate(ctx).status, GateStatus::kPass) << phase;
    }
    ::setenv("GATEHOUSE_PEER_PYTHON", python, 1);
    const GateOutcome out = PerformanceGate(ctx);
    ::unsetenv("GATEHOUSE_PEER_PYTHON");
    auto real = [&](const char* name) {
      const Figure* f = out.Find(name);
      return f ? std::get<double>(f->value) : -1.0;
    };
    EXPECT_GT(real("prefill_tokens_per_s"), 0.0) << python;
    EXPECT_GT(real("train_step_ms"), 0.0) << python;
    if (std::string(python) == GATEHOUSE_PYTHON) {
      ASSERT_EQ(out.status, GateStatus::kPass) << out.reason;
      EXPECT_GT(real("peer_prefill_tokens_per_s"), 0.0);
      EXPECT_GT(real("prefill_speedup"), 0.0);
      EXPECT_GT(real("decode_speedup"), 0.0);
      EXPECT_GT(real("train_step_speedup"), 0.0);
      EXPECT_NE(FigureText(out, "peer").find("transformers"), std::string::npos);
    } else {
      EXPECT_EQ(out.status, GateStatus::kBlocked);
      EXPECT_NE(out.reason.find("transformers peer did not run"), std::string::npos) << out.reason;
    }
  }
}

}  // namespace
}  // namespace gatehouse::worker
