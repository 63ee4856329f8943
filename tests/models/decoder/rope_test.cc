// models/decoder/rope: parsing the RoPE settings of a config.json (rope_parameters, the legacy
// rope_scaling, partial rotary), and the inverse frequencies, cos/sin tables and rotation
// against transformers' own RotaryEmbedding and apply_rotary_pos_emb on the same configs.

#include "decoder/rope.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "decoder/config_reader.h"
#include "tests/models/decoder/upstream.h"

namespace gatehouse::models {
namespace {

using nlohmann::json;

/// ParseRope over `config` with the llama family's default theta (10000).
Result<RopeConfig> Parse(const json& config) {
  ConfigReader reader(config);
  return ParseRope(reader, 10000.0);
}

std::string ErrorOf(const json& config) {
  auto rope = Parse(config);
  EXPECT_FALSE(rope.ok()) << config.dump();
  return rope.ok() ? "" : rope.status().message();
}

TEST(RopeParse, PlainRopeTakesTheTopLevelThetaOrTheFamilyDefault) {
  auto given = Parse({{"rope_theta", 500000.0}});
  ASSERT_TRUE(given.ok()) << given.status().ToString();
  EXPECT_EQ(given->rope_type, "default");
  EXPECT_EQ(given->rope_theta, 500000.0);
  EXPECT_EQ(given->rope_theta_source, "rope_theta");

  auto absent = Parse(json::object());
  ASSERT_TRUE(absent.ok());
  EXPECT_EQ(absent->rope_theta, 10000.0);
  EXPECT_EQ(absent->rope_theta_source, "default");
}

TEST(RopeParse, RopeParametersAndLegacyRopeScalingSpellTheSameSetting) {
  auto current = Parse({{"rope_parameters", {{"rope_type", "linear"}, {"factor", 4.0},
                                             {"rope_theta", 1e6}}}});
  auto legacy = Parse({{"rope_scaling", {{"type", "linear"}, {"factor", 4.0}}},
                       {"rope_theta", 1e6}});
  ASSERT_TRUE(current.ok()) << current.status().ToString();
  ASSERT_TRUE(legacy.ok()) << legacy.status().ToString();
  EXPECT_EQ(current->rope_type, "linear");
  EXPECT_EQ(legacy->rope_type, "linear");
  EXPECT_EQ(current->factor, legacy->factor);
  EXPECT_EQ(current->rope_theta, legacy->rope_theta);
  EXPECT_EQ(current->rope_theta_source, "rope_parameters.rope_theta");
  EXPECT_EQ(legacy->rope_theta_source, "rope_theta");
}

TEST(RopeParse, UnsupportedOrIncompleteSettingsAreNamed) {
  EXPECT_NE(ErrorOf({{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}}})
                .find("'rope_parameters.rope_type' = \"yarn\""),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"rope_scaling", {{"type", "longrope"}}}}).find("'rope_scaling.type'"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"rope_parameters", {{"rope_type", "linear"}}}})
                .find("'rope_parameters.factor' is required for rope_type \"linear\""),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"rope_parameters", {{"rope_type", "dynamic"}, {"factor", 0.5}}}})
                .find("must be >= 1"),
            std::string::npos);
  const json llama3 = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
                       {"high_freq_factor", 1.0}, {"original_max_position_embeddings", 8192}};
  EXPECT_NE(ErrorOf({{"rope_parameters", llama3}}).find("'rope_parameters.high_freq_factor'"),
            std::string::npos);
  json no_context = llama3;
  no_context.erase("original_max_position_embeddings");
  no_context["high_freq_factor"] = 8.0;
  EXPECT_NE(ErrorOf({{"rope_parameters", no_context}})
                .find("'rope_parameters.original_max_position_embeddings' is required"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"rope_theta", -1.0}}).find("'rope_theta'"), std::string::npos);
  EXPECT_NE(ErrorOf({{"partial_rotary_factor", 1.5}}).find("'partial_rotary_factor' = 1.5"),
            std::string::npos);
  EXPECT_NE(ErrorOf({{"rope_parameters", "linear"}}).find("'rope_parameters' = \"linear\""),
            std::string::npos);
}

TEST(RopeParse, DisagreeingSpellingsAreRefused) {
  const std::string error =
      ErrorOf({{"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}}},
               {"rope_scaling", {{"rope_type", "linear"}, {"factor", 4.0}}}});
  EXPECT_NE(error.find("'rope_parameters'"), std::string::npos) << error;
  EXPECT_NE(error.find("'rope_scaling'"), std::string::npos) << error;
  // The same dict under both names is what transformers' own save writes: accepted.
  const json dict = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_TRUE(Parse({{"rope_parameters", dict}, {"rope_scaling", dict}}).ok());
}

TEST(RopeParse, UnknownKeysAreReportedUnmapped) {
  const json config = {{"rope_parameters", {{"rope_type", "default"}, {"beta_fast", 32}}}};
  ConfigReader reader(config);
  ASSERT_TRUE(ParseRope(reader, 10000.0).ok());
  const auto report = reader.Report();
  EXPECT_EQ(report.mapped, std::vector<std::string>{"rope_parameters"});
  EXPECT_EQ(report.unmapped, std::vector<std::string>{"rope_parameters.beta_fast"});
}

TEST(RopeParse, RotaryDimTruncatesLikeUpstream) {
  RopeConfig rope;
  rope.partial_rotary_factor = 0.4;
  EXPECT_EQ(RotaryDim(rope, 96), 38);  // int(96 * 0.4) = int(38.400000000000006)
  rope.partial_rotary_factor = 1.0;
  EXPECT_EQ(RotaryDim(rope, 96), 96);
}

// A scaled RoPE type with a partial factor is a config llama-like upstream files cannot run
// (cos/sin narrower than head_dim); "default" ignores the factor; 1 passes either way.
TEST(RopeParse, PartialRotaryAsLlamaLikeUpstream) {
  auto linear = Parse({{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}},
                       {"partial_rotary_factor", 0.5}});
  ASSERT_TRUE(linear.ok());
  const Status refused = FullRotaryAsUpstream(*linear);
  EXPECT_NE(refused.message().find("'partial_rotary_factor' = 0.5"), std::string::npos)
      << refused.ToString();
  auto plain = Parse({{"partial_rotary_factor", 0.25}});
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(FullRotaryAsUpstream(*plain).ok());
  EXPECT_EQ(RotaryDim(*plain, 64), 64);
  auto full = Parse({{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}});
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(FullRotaryAsUpstream(*full).ok());
}

/// One upstream comparison: a config (as transformers reads it), the positions of one forward
/// pass, and what ParseRope / RopeInverseFrequencies / RopeTables / ApplyRotary make of it.
struct RopeCase {
  std::string name;
  std::string model_type;
  json config;
  std::vector<int64_t> positions;
};

std::vector<RopeCase> Cases() {
  auto llama = [](json extra) {
    json config = {{"hidden_size", 256}, {"num_attention_heads", 4}, {"head_dim", 64},
                   {"max_position_embeddings", 64}};
    config.update(extra);
    return config;
  };
  std::vector<int64_t> short_run = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int64_t> long_run = {60, 61, 62, 63, 64, 65, 200, 201};
  return {
      {"default", "llama", llama({{"rope_parameters", {{"rope_type", "default"},
                                                        {"rope_theta", 10000.0}}}}),
       short_run},
      {"default_theta_500000_far_positions", "llama", llama({{"rope_theta", 500000.0}}),
       long_run},
      {"linear_legacy_spelling", "llama",
       llama({{"rope_scaling", {{"type", "linear"}, {"factor", 4.0}}}, {"rope_theta", 1e6}}),
       long_run},
      // Llama 3.1's setting: the wavelengths of head_dim 64 at theta 500000 cross all three
      // regions (kept, interpolated, divided by factor).
      {"llama3", "llama",
       llama({{"rope_parameters", {{"rope_type", "llama3"}, {"factor", 8.0},
                                   {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                   {"original_max_position_embeddings", 8192},
                                   {"rope_theta", 500000.0}}}}),
       long_run},
      // Within max_position_embeddings (64) the base stays; beyond it the NTK base grows.
      {"dynamic_within_context", "llama",
       llama({{"rope_parameters", {{"rope_type", "dynamic"}, {"factor", 2.0},
                                   {"rope_theta", 10000.0}}}}),
       short_run},
      {"dynamic_beyond_context", "llama",
       llama({{"rope_parameters", {{"rope_type", "dynamic"}, {"factor", 2.0},
                                   {"rope_theta", 10000.0}}}}),
       long_run},
      // Llama's own default RoPE reads head_dim only: a partial_rotary_factor is ignored and
      // the whole head rotates (FullRotaryAsUpstream).
      {"partial_rotary_factor_ignored_by_llama_default", "llama",
       llama({{"partial_rotary_factor", 0.5}, {"rope_theta", 10000.0}}), short_run},
      // Phi-3 rotates the first half of head_dim (64 / 4 = 16) and passes the rest through.
      {"partial_rotary", "phi3",
       {{"hidden_size", 64}, {"num_attention_heads", 4}, {"max_position_embeddings", 64},
        {"partial_rotary_factor", 0.5}, {"rope_theta", 10000.0}, {"pad_token_id", nullptr}},
       short_run},
  };
}

int64_t HeadDim(const json& config) {
  if (config.contains("head_dim")) return config["head_dim"].get<int64_t>();
  return config["hidden_size"].get<int64_t>() / config["num_attention_heads"].get<int64_t>();
}

/// Bitwise equality, with the largest difference in the message when it fails.
::testing::AssertionResult SameTensor(const torch::Tensor& ours, const torch::Tensor& upstream) {
  if (ours.sizes() != upstream.sizes()) {
    return ::testing::AssertionFailure() << "shape " << ours.sizes() << " vs upstream "
                                         << upstream.sizes();
  }
  if (torch::equal(ours, upstream)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |ours - upstream| = " << (ours - upstream).abs().max().item<double>();
}

TEST(RopeUpstream, FrequenciesTablesAndRotationEqualTransformersBitwise) {
  torch::manual_seed(0);
  const auto cases = Cases();
  json requests = json::array();
  std::vector<torch::Tensor> inputs;
  for (const auto& c : cases) {
    const int64_t t = static_cast<int64_t>(c.positions.size());
    inputs.push_back(torch::randn({1, 2, t, HeadDim(c.config)}));
    requests.push_back({{"model_type", c.model_type}, {"config", c.config},
                        {"positions", {c.positions}}, {"x", test_util::TensorJson(inputs.back())}});
  }
  const json results = test_util::RunUpstream("rope", requests);
  ASSERT_EQ(results.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const RopeCase& c = cases[i];
    SCOPED_TRACE(c.name);
    auto rope = Parse(c.config);
    ASSERT_TRUE(rope.ok()) << rope.status().ToString();
    if (c.model_type != "phi3") ASSERT_TRUE(FullRotaryAsUpstream(*rope).ok());
    const auto positions = torch::tensor(c.positions, torch::kLong).unsqueeze(0);
    const int64_t seq_len = positions.max().item<int64_t>() + 1;
    const auto inv_freq =
        RopeInverseFrequencies(*rope, HeadDim(c.config),
                               c.config["max_position_embeddings"].get<int64_t>(), seq_len,
                               torch::kCPU);
    const RotaryTables tables = RopeTables(positions, inv_freq, torch::kFloat32);
    const auto rotated = ApplyRotary(inputs[i], tables);
    EXPECT_TRUE(SameTensor(inv_freq, test_util::TensorFromJson(results[i]["inv_freq"])));
    EXPECT_TRUE(SameTensor(tables.cos, test_util::TensorFromJson(results[i]["cos"])));
    EXPECT_TRUE(SameTensor(tables.sin, test_util::TensorFromJson(results[i]["sin"])));
    EXPECT_TRUE(SameTensor(rotated, test_util::TensorFromJson(results[i]["rotated"])));
  }
}

TEST(RopeTables, CastToTheModelDtypeAfterComputingInFp32) {
  const auto positions = torch::arange(0, 300, torch::kLong).unsqueeze(0);
  RopeConfig rope;
  const auto inv_freq = RopeInverseFrequencies(rope, 64, 4096, 300, torch::kCPU);
  const auto bf16 = RopeTables(positions, inv_freq, torch::kBFloat16);
  const auto fp32 = RopeTables(positions, inv_freq, torch::kFloat32);
  EXPECT_EQ(bf16.cos.scalar_type(), torch::kBFloat16);
  // Rounding the fp32 table gives the bf16 one; computing the angles in bf16 would not (at
  // position 299 the angle itself would lose about one radian).
  EXPECT_TRUE(torch::equal(bf16.cos, fp32.cos.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(bf16.sin, fp32.sin.to(torch::kBFloat16)));
}

}  // namespace
}  // namespace gatehouse::models
