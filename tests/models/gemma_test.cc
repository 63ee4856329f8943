// Tests of the gemma, gemma2 and gemma3 (text) families (models/gemma*), reached only through
// the plugin entry point and the SDK interfaces, as the worker reaches them. Logit parity with
// transformers is checked by families_test and tools/parity/parity_table.py on the fixtures of
// tools/refgen/families/gemma*.py; these check each family's own contracts: config accounting,
// upstream defaults, rejected values, the name table against real checkpoints, sliding windows,
// soft-capping and the KV cache.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "gatehouse/worker/model_family.h"
#include "tests/models/family_test_util.h"

namespace gatehouse::worker {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// config.json as transformers 5.24 save_pretrained wrote it for the gemma-tiny-tied fixture.
constexpr const char* kGemmaConfig = R"({
  "architectures": ["GemmaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 2,
  "dtype": "float32",
  "eos_token_id": 1,
  "head_dim": 32,
  "hidden_act": "gelu_pytorch_tanh",
  "hidden_size": 16,
  "initializer_range": 0.02,
  "intermediate_size": 64,
  "max_position_embeddings": 512,
  "model_type": "gemma",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "pad_token_id": 0,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
  "tie_word_embeddings": true,
  "transformers_version": "5.24.0",
  "use_bidirectional_attention": null,
  "use_cache": true,
  "vocab_size": 256
})";

// ... for the gemma2-tiny-tied fixture.
constexpr const char* kGemma2Config = R"({
  "architectures": ["Gemma2ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": 2.0,
  "bos_token_id": 2,
  "dtype": "float32",
  "eos_token_id": 1,
  "final_logit_softcapping": 3.0,
  "head_dim": 32,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 16,
  "initializer_range": 0.02,
  "intermediate_size": 64,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 512,
  "model_type": "gemma2",
  "num_attention_heads": 4,
  "num_hidden_layers": 4,
  "num_key_value_heads": 2,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 24,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
  "sliding_window": 16,
  "tie_word_embeddings": true,
  "transformers_version": "5.24.0",
  "use_bidirectional_attention": null,
  "use_cache": true,
  "vocab_size": 256
})";

// ... for the gemma3-tiny-tied fixture (Gemma3ForCausalLM).
constexpr const char* kGemma3Config = R"({
  "_sliding_window_pattern": 6,
  "architectures": ["Gemma3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": 2.0,
  "bos_token_id": 2,
  "dtype": "float32",
  "eos_token_id": 1,
  "final_logit_softcapping": 3.0,
  "head_dim": 32,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 16,
  "initializer_range": 0.02,
  "intermediate_size": 64,
  "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                  "sliding_attention", "sliding_attention", "full_attention",
                  "sliding_attention"],
  "max_position_embeddings": 512,
  "model_type": "gemma3_text",
  "num_attention_heads": 4,
  "num_hidden_layers": 7,
  "num_key_value_heads": 2,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 24,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {
    "full_attention": {"rope_theta": 200000.0, "rope_type": "default"},
    "sliding_attention": {"rope_theta": 5000.0, "rope_type": "default"}
  },
  "sliding_window": 16,
  "tie_word_embeddings": true,
  "transformers_version": "5.24.0",
  "use_bidirectional_attention": false,
  "use_cache": true,
  "vocab_size": 256
})";

/// The fixtures tools/refgen/families/gemma*.py define, per family.
const std::vector<std::pair<std::string, std::vector<std::string>>>& Fixtures() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kFixtures = {
      {"gemma",
       {"gemma-tiny-tied", "gemma-tiny-untied", "gemma-tiny-sharded", "gemma-tiny-attn-bias"}},
      {"gemma2",
       {"gemma2-tiny-tied", "gemma2-tiny-untied", "gemma2-tiny-sharded", "gemma2-tiny-nocap",
        "gemma2-tiny-layer-types"}},
      {"gemma3",
       {"gemma3-tiny-tied", "gemma3-tiny-untied", "gemma3-tiny-sharded",
        "gemma3-tiny-layer-types"}},
  };
  return kFixtures;
}

using test_util::Registry;

const ModelFamily& Family(const std::string& name) { return test_util::FamilyByName(name); }

json SavedConfig(const std::string& family) {
  if (family == "gemma") return json::parse(kGemmaConfig);
  if (family == "gemma2") return json::parse(kGemma2Config);
  return json::parse(kGemma3Config);
}

const std::vector<std::string> kFamilies = {"gemma", "gemma2", "gemma3"};

Status ParseError(const std::string& family, const json& config) {
  return Family(family).ParseConfig(config).status();
}

/// The parsed spec as JSON (DecoderSpec::ToJson), or null after a test failure.
json Spec(const std::string& family, const json& config) {
  auto parsed = Family(family).ParseConfig(config);
  EXPECT_TRUE(parsed.ok()) << family << ": " << parsed.status().ToString();
  if (!parsed.ok()) return json();
  EXPECT_TRUE(parsed->report.unmapped.empty()) << family << ": " << json(parsed->report.unmapped);
  return parsed->args->ToJson();
}

std::shared_ptr<CausalLM> Build(const std::string& family, const json& config) {
  auto parsed = Family(family).ParseConfig(config);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  if (!parsed.ok()) return nullptr;
  auto model = Family(family).Construct(*parsed->args, torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? *model : nullptr;
}

/// Re-draws every weight: matrices at unit activation scale, 1-D tensors (norm offsets around
/// 0, biases) from U(-0.5, 0.5), so logits are far from uniform and caps bite.
void Randomize(CausalLM& model, uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    auto& p = item.value();
    if (p.dim() == 1) {
      p.uniform_(-0.5, 0.5);
    } else if (item.key() == "tok_embeddings.weight") {
      p.normal_(0.0, 0.5);
    } else {
      p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(1))));
    }
  }
}

/// Copies every parameter of `from` into `to` (same names and shapes).
void CopyWeights(CausalLM& from, CausalLM& to) {
  torch::NoGradGuard no_grad;
  auto src = from.named_parameters();
  for (auto& item : to.named_parameters()) item.value().copy_(src[item.key()]);
}

torch::Tensor Positions(int64_t batch, int64_t len) {
  return torch::arange(len, torch::kLong).unsqueeze(0).expand({batch, len}).contiguous();
}

// --- registration -------------------------------------------------------------------------

// The plugin registers gemma, gemma2 and gemma3 for model_types gemma, gemma2, gemma3_text.
TEST(GemmaPlugin, RegistersThreeFamilies) {
  const std::vector<std::pair<std::string, std::string>> kTypes = {
      {"gemma", "gemma"}, {"gemma2", "gemma2"}, {"gemma3", "gemma3_text"}};
  for (const auto& [name, model_type] : kTypes) {
    EXPECT_EQ(Family(name).name(), name);
    EXPECT_EQ(Family(name).model_types(), std::vector<std::string>{model_type});
    const ModelFamily* by_type = Registry().FindByModelType(model_type);
    ASSERT_NE(by_type, nullptr) << model_type;
    EXPECT_EQ(by_type->name(), name);
  }
  // A config of another Gemma generation is refused by model_type.
  const Status s = ParseError("gemma2", SavedConfig("gemma3"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("gemma3_text"), std::string::npos) << s.ToString();
}

// --- config -------------------------------------------------------------------------------

// Every field of each saved config is mapped or ignored (with a reason), exactly once.
TEST(GemmaConfig, SavedConfigsFullyAccounted) {
  for (const auto& family : kFamilies) {
    const json config = SavedConfig(family);
    auto parsed = Family(family).ParseConfig(config);
    ASSERT_TRUE(parsed.ok()) << family << ": " << parsed.status().ToString();
    test_util::ExpectConfigFullyAccounted(parsed->report, config, family);
    EXPECT_EQ(parsed->args->head_dim(), 32) << family;  // not hidden / heads = 4
    EXPECT_TRUE(parsed->args->tie_word_embeddings()) << family;
  }
}

// The saved configs map onto the Gemma computation of each generation.
TEST(GemmaConfig, SavedConfigsGiveUpstreamComputation) {
  const json g1 = Spec("gemma", SavedConfig("gemma"));
  EXPECT_EQ(g1["norm"], "x * (1 + weight), fp32");
  EXPECT_EQ(g1["hidden_act"], "gelu_pytorch_tanh");
  EXPECT_EQ(g1["scale_embeddings"], true);
  EXPECT_EQ(g1["sandwich_norm"], false);
  EXPECT_EQ(g1["qk_norm"], false);
  EXPECT_DOUBLE_EQ(g1["attention_scaling"].get<double>(), 1.0 / std::sqrt(32.0));
  EXPECT_TRUE(g1["attn_logit_softcapping"].is_null());
  EXPECT_TRUE(g1["final_logit_softcapping"].is_null());
  EXPECT_EQ(g1["ropes"][0]["rope_theta"].get<double>(), 50000.0);
  for (const auto& l : g1["layers"]) EXPECT_EQ(l["sliding_window"], 0);

  const json g2 = Spec("gemma2", SavedConfig("gemma2"));
  EXPECT_EQ(g2["sandwich_norm"], true);
  EXPECT_EQ(g2["qk_norm"], false);
  EXPECT_EQ(g2["scale_embeddings"], true);
  EXPECT_DOUBLE_EQ(g2["attention_scaling"].get<double>(), std::pow(24.0, -0.5));
  EXPECT_EQ(g2["attn_logit_softcapping"].get<double>(), 2.0);
  EXPECT_EQ(g2["final_logit_softcapping"].get<double>(), 3.0);
  const std::vector<int64_t> kG2Windows = {16, 0, 16, 0};
  for (size_t i = 0; i < kG2Windows.size(); ++i) {
    EXPECT_EQ(g2["layers"][i]["sliding_window"], kG2Windows[i]) << i;
  }

  const json g3 = Spec("gemma3", SavedConfig("gemma3"));
  EXPECT_EQ(g3["qk_norm"], true);
  EXPECT_EQ(g3["sandwich_norm"], true);
  EXPECT_DOUBLE_EQ(g3["attention_scaling"].get<double>(), std::pow(24.0, -0.5));
  // Gemma3Attention never applies attn_logit_softcapping; the final cap is applied.
  EXPECT_TRUE(g3["attn_logit_softcapping"].is_null());
  EXPECT_EQ(g3["final_logit_softcapping"].get<double>(), 3.0);
  ASSERT_EQ(g3["ropes"].size(), 2u);
  EXPECT_EQ(g3["ropes"][0]["rope_theta"].get<double>(), 200000.0);  // full_attention
  EXPECT_EQ(g3["ropes"][1]["rope_theta"].get<double>(), 5000.0);    // sliding_attention
  for (int i = 0; i < 7; ++i) {
    const bool sliding = i != 5;
    EXPECT_EQ(g3["layers"][i]["sliding_window"], sliding ? 16 : 0) << i;
    EXPECT_EQ(g3["layers"][i]["rope"], sliding ? 1 : 0) << i;
  }
}

// The configs the testdata fixture wrote with the venv's transformers parse with nothing
// unmapped (guards against a transformers upgrade adding a field).
TEST(GemmaConfig, FixtureConfigsFullyAccounted) {
  for (const auto& [family, variants] : Fixtures()) {
    for (const auto& name : variants) {
      const fs::path path = test_util::FixtureCheckpointDir(name) / "config.json";
      if (!fs::exists(path)) GTEST_SKIP() << path << " absent: run through ctest";
      const json config = test_util::FixtureConfig(name);
      auto parsed = Family(family).ParseConfig(config);
      ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().ToString();
      EXPECT_TRUE(parsed->report.unmapped.empty()) << name << ": " << json(parsed->report.unmapped);
      EXPECT_EQ(parsed->report.mapped.size() + parsed->report.ignored.size(), config.size())
          << name;
    }
  }
}

// A missing required field is INVALID_ARGUMENT naming it; head_dim and num_key_value_heads are
// required because upstream defaults them to model-size constants (256; 16 or 4), not to
// values derived from other fields.
TEST(GemmaConfig, MissingRequiredFieldIsNamed) {
  for (const auto& family : kFamilies) {
    for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "head_dim",
                              "max_position_embeddings", "rms_norm_eps"}) {
      json config = SavedConfig(family);
      config.erase(field);
      const Status s = ParseError(family, config);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << family << " " << field;
      EXPECT_NE(s.message().find(std::string("'") + field + "'"), std::string::npos)
          << s.ToString();
    }
  }
}

// Gemma: the lm_head is tied by default; "gelu" is GemmaConfig's legacy spelling of the tanh
// GELU; an absent activation means the tanh GELU; rope_theta defaults to 10000.
TEST(GemmaConfig, GemmaDefaultsAndLegacySpellings) {
  json config = SavedConfig("gemma");
  config.erase("tie_word_embeddings");
  config.erase("hidden_act");
  config.erase("rope_parameters");
  json spec = Spec("gemma", config);
  EXPECT_EQ(spec["tie_word_embeddings"], true);
  EXPECT_EQ(spec["hidden_act"], "gelu_pytorch_tanh");
  EXPECT_EQ(spec["ropes"][0]["rope_theta"].get<double>(), 10000.0);

  // A 4.x-era config: hidden_act "gelu", hidden_activation the tanh GELU (or null), top-level
  // rope_theta with rope_scaling null.
  for (const json& legacy : {json("gelu_pytorch_tanh"), json(nullptr)}) {
    config = SavedConfig("gemma");
    config["hidden_act"] = "gelu";
    config["hidden_activation"] = legacy;
    config.erase("rope_parameters");
    config["rope_theta"] = 20000.0;
    config["rope_scaling"] = nullptr;
    spec = Spec("gemma", config);
    EXPECT_EQ(spec["hidden_act"], "gelu_pytorch_tanh");
    EXPECT_EQ(spec["ropes"][0]["rope_theta"].get<double>(), 20000.0);
  }
}

// Gemma 2: absent soft-capping fields take Gemma2Config's defaults (50 / 30), explicit nulls
// disable capping; query_pre_attn_scalar defaults to 256, sliding_window to 4096, layer_types
// to sliding/full alternation; hidden_act (in Hub configs) is ignored, not read.
TEST(GemmaConfig, Gemma2Defaults) {
  json config = SavedConfig("gemma2");
  for (const char* f : {"attn_logit_softcapping", "final_logit_softcapping",
                        "query_pre_attn_scalar", "sliding_window", "layer_types"}) {
    config.erase(f);
  }
  config["num_hidden_layers"] = 3;
  config["hidden_act"] = "gelu_pytorch_tanh";
  config["cache_implementation"] = "hybrid";
  json spec = Spec("gemma2", config);
  EXPECT_EQ(spec["attn_logit_softcapping"].get<double>(), 50.0);
  EXPECT_EQ(spec["final_logit_softcapping"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(spec["attention_scaling"].get<double>(), 1.0 / 16.0);
  ASSERT_EQ(spec["layers"].size(), 3u);
  EXPECT_EQ(spec["layers"][0]["sliding_window"], 4096);
  EXPECT_EQ(spec["layers"][1]["sliding_window"], 0);
  EXPECT_EQ(spec["layers"][2]["sliding_window"], 4096);

  config = SavedConfig("gemma2");
  config["attn_logit_softcapping"] = nullptr;
  config["final_logit_softcapping"] = nullptr;
  spec = Spec("gemma2", config);
  EXPECT_TRUE(spec["attn_logit_softcapping"].is_null());
  EXPECT_TRUE(spec["final_logit_softcapping"].is_null());

  // A null sliding_window is fine while no layer slides.
  config = SavedConfig("gemma2");
  config["sliding_window"] = nullptr;
  config["layer_types"] = json(std::vector<std::string>(4, "full_attention"));
  spec = Spec("gemma2", config);
  for (const auto& l : spec["layers"]) EXPECT_EQ(l["sliding_window"], 0);

  // Legacy RoPE spelling.
  config = SavedConfig("gemma2");
  config.erase("rope_parameters");
  config["rope_theta"] = 1234.0;
  config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  spec = Spec("gemma2", config);
  EXPECT_EQ(spec["ropes"][0]["rope_type"], "linear");
  EXPECT_EQ(spec["ropes"][0]["rope_theta"].get<double>(), 1234.0);
}

// Gemma 3: no soft-capping by default; layer_types from sliding_window_pattern (default 6);
// RoPE per layer type from the legacy spellings as convert_rope_params_to_dict builds it.
TEST(GemmaConfig, Gemma3DefaultsAndLegacyRope) {
  json config = SavedConfig("gemma3");
  for (const char* f : {"final_logit_softcapping", "attn_logit_softcapping", "layer_types",
                        "rope_parameters", "_sliding_window_pattern"}) {
    config.erase(f);
  }
  json spec = Spec("gemma3", config);
  EXPECT_TRUE(spec["final_logit_softcapping"].is_null());
  EXPECT_EQ(spec["ropes"][0]["rope_theta"].get<double>(), 1e6);
  EXPECT_EQ(spec["ropes"][1]["rope_theta"].get<double>(), 1e4);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(spec["layers"][i]["sliding_window"], i == 5 ? 0 : 16);

  // A Hub-style (4.50) config: sliding_window_pattern instead of layer_types, rope_theta and
  // rope_local_base_freq, linear rope_scaling for the global layers only.
  config["sliding_window_pattern"] = 2;
  config["rope_theta"] = 1e6;
  config["rope_local_base_freq"] = 1e4;
  config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  config["cache_implementation"] = "hybrid";
  spec = Spec("gemma3", config);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(spec["layers"][i]["sliding_window"], i % 2 == 0 ? 16 : 0) << i;
    EXPECT_EQ(spec["layers"][i]["rope"], i % 2 == 0 ? 1 : 0) << i;
  }
  EXPECT_EQ(spec["ropes"][0]["rope_type"], "linear");
  EXPECT_EQ(spec["ropes"][0]["factor"].get<double>(), 8.0);
  EXPECT_EQ(spec["ropes"][0]["rope_theta"].get<double>(), 1e6);
  EXPECT_EQ(spec["ropes"][1]["rope_type"], "default");
  EXPECT_EQ(spec["ropes"][1]["rope_theta"].get<double>(), 1e4);
  EXPECT_EQ(spec["ropes"][1]["rope_theta_source"], "rope_local_base_freq");

  // A legacy {"type": ...} rope_scaling merges under the default entry's "rope_type", which
  // wins upstream: the global layers stay unscaled.
  config.erase("rope_scaling");
  config["rope_scaling"] = {{"type", "linear"}, {"factor", 8.0}};
  spec = Spec("gemma3", config);
  EXPECT_EQ(spec["ropes"][0]["rope_type"], "default");

  // A rope_parameters entry without rope_theta takes the legacy field, then the default.
  config = SavedConfig("gemma3");
  config["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
  config["rope_theta"] = 3e5;
  spec = Spec("gemma3", config);
  EXPECT_EQ(spec["ropes"][0]["rope_theta"].get<double>(), 3e5);
  EXPECT_EQ(spec["ropes"][1]["rope_theta"].get<double>(), 1e4);
}

// Gemma 3's attn_logit_softcapping is reported as ignored (with the reason), not mapped.
TEST(GemmaConfig, Gemma3AttnSoftcapIsIgnored) {
  auto parsed = Family("gemma3").ParseConfig(SavedConfig("gemma3"));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  bool found = false;
  for (const auto& [field, reason] : parsed->report.ignored) {
    if (field != "attn_logit_softcapping") continue;
    found = true;
    EXPECT_NE(reason.find("Gemma3Attention"), std::string::npos) << reason;
  }
  EXPECT_TRUE(found);
  for (const auto& field : parsed->report.mapped) EXPECT_NE(field, "attn_logit_softcapping");
}

// Values the families cannot honour are INVALID_ARGUMENT naming the field and the value.
TEST(GemmaConfig, UnsupportedValuesRejected) {
  struct Case {
    std::string family;
    std::string field;
    json value;
    std::string needle;
  };
  const std::vector<Case> kCases = {
      {"gemma", "hidden_act", "silu", "silu"},
      {"gemma", "hidden_act", "gelu_new", "gelu_new"},
      {"gemma", "hidden_activation", "silu", "silu"},
      {"gemma", "hidden_activation", "gelu", "gelu"},
      {"gemma", "use_bidirectional_attention", true, "true"},
      {"gemma", "partial_rotary_factor", 0.5, "0.5"},
      {"gemma", "rope_parameters", {{"rope_type", "yarn"}, {"factor", 2.0}}, "yarn"},
      {"gemma", "attention_bias", 1, "expected true or false"},
      {"gemma2", "hidden_activation", "gelu", "gelu"},
      {"gemma2", "use_bidirectional_attention", true, "true"},
      {"gemma2", "sliding_window", 0, "must be positive"},
      {"gemma2", "sliding_window", nullptr, "sliding_attention"},
      {"gemma2", "attn_logit_softcapping", 0.0, "must be positive"},
      {"gemma2", "final_logit_softcapping", -3.0, "must be positive"},
      {"gemma2", "final_logit_softcapping", "3", "expected a number"},
      {"gemma2", "query_pre_attn_scalar", 0, "must be positive"},
      {"gemma2",
       "layer_types",
       {"sliding_attention", "chunked_attention", "a", "b"},
       "chunked_attention"},
      {"gemma2", "layer_types", {"full_attention"}, "num_hidden_layers"},
      {"gemma3", "hidden_activation", "silu", "silu"},
      {"gemma3", "use_bidirectional_attention", true, "true"},
      {"gemma3", "rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5.0}}, "rope_type"},
      {"gemma3",
       "rope_parameters",
       {{"full_attention", {{"rope_type", "yarn"}, {"factor", 4.0}}}},
       "yarn"},
      {"gemma3",
       "rope_parameters",
       {{"sliding_attention", {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}}},
       "0.5"},
      {"gemma3", "partial_rotary_factor", 0.25, "0.25"},
      {"gemma3", "final_logit_softcapping", 0.0, "must be positive"},
      {"gemma3", "sliding_window", -1, "must be positive"},
  };
  for (const Case& c : kCases) {
    json config = SavedConfig(c.family);
    config[c.field] = c.value;
    const Status s = ParseError(c.family, config);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument)
        << c.family << " " << c.field << " " << c.value.dump();
    const std::string field_root = c.field.substr(0, c.field.find('.'));
    EXPECT_NE(s.message().find(field_root), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.ToString();
  }
  // sliding_window_pattern is read only without layer_types.
  json config = SavedConfig("gemma3");
  config.erase("layer_types");
  config["sliding_window_pattern"] = 0;
  const Status s = ParseError("gemma3", config);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sliding_window_pattern"), std::string::npos) << s.ToString();
}

// A field no Gemma parser knows lands in report.unmapped (the config gate fails on it).
TEST(GemmaConfig, UnknownFieldIsUnmapped) {
  for (const auto& family : kFamilies) {
    json config = SavedConfig(family);
    config["mlp_bias"] = false;
    auto parsed = Family(family).ParseConfig(config);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(parsed->report.unmapped, std::vector<std::string>{"mlp_bias"}) << family;
  }
  // Gemma 1 has no sliding window or soft-capping.
  json config = SavedConfig("gemma");
  config["sliding_window"] = 16;
  config["final_logit_softcapping"] = 30.0;
  auto parsed = Family("gemma").ParseConfig(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(std::set<std::string>(parsed->report.unmapped.begin(), parsed->report.unmapped.end()),
            (std::set<std::string>{"sliding_window", "final_logit_softcapping"}));
}

// --- name table ---------------------------------------------------------------------------

// The adapter's expected HF names equal the tensor names transformers saved, exactly, for every
// fixture (tied ones have no lm_head.weight; gemma2/3 have the sandwich norms, gemma3 q/k norms).
TEST(GemmaAdapter, ExpectedNamesEqualCheckpointKeys) {
  for (const auto& [family, variants] : Fixtures()) {
    for (const auto& name : variants) {
      const fs::path dir = test_util::FixtureCheckpointDir(name);
      if (!fs::exists(dir)) GTEST_SKIP() << dir << " absent: run through ctest";
      test_util::ExpectAdapterNamesEqualFixtureKeys(Family(family), name);
    }
  }
}

// Every parameter of a constructed model maps to HF and back; spot checks of the layer norms,
// whose HF meaning differs between Gemma 1 and Gemma 2/3.
TEST(GemmaAdapter, NameTableRoundTripAndNorms) {
  const std::map<std::string, std::vector<std::pair<std::string, std::string>>> kPairs = {
      {"gemma",
       {{"model.layers.1.post_attention_layernorm.weight", "layers.1.ffn_norm.weight"},
        {"model.layers.0.input_layernorm.weight", "layers.0.attention_norm.weight"}}},
      {"gemma2",
       {{"model.layers.1.post_attention_layernorm.weight", "layers.1.attention_post_norm.weight"},
        {"model.layers.1.pre_feedforward_layernorm.weight", "layers.1.ffn_norm.weight"},
        {"model.layers.3.post_feedforward_layernorm.weight", "layers.3.ffn_post_norm.weight"}}},
      {"gemma3",
       {{"model.layers.6.post_attention_layernorm.weight", "layers.6.attention_post_norm.weight"},
        {"model.layers.2.self_attn.q_norm.weight", "layers.2.attention.q_norm.weight"},
        {"model.layers.5.self_attn.k_norm.weight", "layers.5.attention.k_norm.weight"},
        {"model.layers.0.post_feedforward_layernorm.weight", "layers.0.ffn_post_norm.weight"}}},
  };
  for (const auto& family : kFamilies) {
    for (const bool tied : {true, false}) {
      json config = SavedConfig(family);
      config["tie_word_embeddings"] = tied;
      auto parsed = Family(family).ParseConfig(config);
      ASSERT_TRUE(parsed.ok());
      auto model = Family(family).Construct(*parsed->args, torch::kFloat32, torch::kCPU);
      ASSERT_TRUE(model.ok()) << model.status().ToString();
      auto adapter = Family(family).Adapter(*parsed->args);
      ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();
      std::set<std::string> hf_names;
      size_t params = 0;
      for (const auto& item : (*model)->named_parameters()) {
        ++params;
        auto hf = adapter->ToHf(item.key());
        ASSERT_TRUE(hf.ok()) << hf.status().ToString();
        auto back = adapter->ToInternal(*hf);
        ASSERT_TRUE(back.ok()) << back.status().ToString();
        EXPECT_EQ(*back, item.key());
        hf_names.insert(*hf);
      }
      const auto& expected = adapter->ExpectedHfNames();
      EXPECT_EQ(hf_names, std::set<std::string>(expected.begin(), expected.end()));
      EXPECT_EQ(expected.size(), params);
      EXPECT_EQ(hf_names.count("lm_head.weight"), tied ? 0u : 1u) << family;
      for (const auto& [hf, internal] : kPairs.at(family)) {
        auto got = adapter->ToInternal(hf);
        ASSERT_TRUE(got.ok()) << family << " " << hf << ": " << got.status().ToString();
        EXPECT_EQ(*got, internal);
      }
    }
  }
}

// --- forward ------------------------------------------------------------------------------

// Prefill, one-token steps and a multi-token chunk through the KV cache give the logits of one
// full forward pass (fp32, 1e-5), for each family tied and untied, with a window (4) shorter
// than the sequence so sliding layers drop keys during decoding, and batch 2.
TEST(GemmaModel, KVCacheDecodeMatchesFullForward) {
  for (const auto& family : kFamilies) {
    for (const bool tied : {true, false}) {
      json config = SavedConfig(family);
      config["tie_word_embeddings"] = tied;
      if (family != "gemma") config["sliding_window"] = 4;
      auto model = Build(family, config);
      ASSERT_NE(model, nullptr);
      Randomize(*model, 11);
      test_util::ExpectKVCacheDecodeMatchesFullForward(
          *model,
          {.batch = 2, .prefill = 7, .steps = 4, .chunk = 3, .token_low = 3, .cache_capacity = 32},
          family + " tied=" + std::to_string(tied));
    }
  }
}

// Sliding layers see only the last sliding_window keys: with every layer sliding (window 4, 4
// layers) a token reaches at most 3 * 4 = 12 positions ahead, so changing token 0 changes the
// logits at position 12 but not at 13 or later. With full layers it reaches everything.
TEST(GemmaModel, SlidingWindowBoundsTheReceptiveField) {
  for (const auto& family : {std::string("gemma2"), std::string("gemma3")}) {
    for (const bool all_sliding : {true, false}) {
      json config = SavedConfig(family);
      config["num_hidden_layers"] = 4;
      config["sliding_window"] = 4;
      config["layer_types"] =
          json(std::vector<std::string>(4, all_sliding ? "sliding_attention" : "full_attention"));
      auto model = Build(family, config);
      ASSERT_NE(model, nullptr);
      Randomize(*model, 5);
      torch::NoGradGuard no_grad;
      constexpr int64_t kLen = 20;
      auto tokens = torch::randint(3, 256, {1, kLen}, torch::kLong);
      auto changed = tokens.clone();
      changed[0][0] = (tokens[0][0].item<int64_t>() + 1) % 256;
      auto a = model->Forward(tokens, Positions(1, kLen), nullptr);
      auto b = model->Forward(changed, Positions(1, kLen), nullptr);
      EXPECT_FALSE(torch::equal(a.select(1, 12), b.select(1, 12))) << family;
      EXPECT_EQ(torch::equal(a.narrow(1, 13, kLen - 13), b.narrow(1, 13, kLen - 13)), all_sliding)
          << family << " all_sliding=" << all_sliding;
    }
  }
}

// final_logit_softcapping bounds the logits by cap * tanh: |logits| < 3, while the same weights
// without the cap give logits beyond 3 (the cap bites), and capped == 3 * tanh(uncapped / 3).
TEST(GemmaModel, FinalLogitSoftcapping) {
  for (const auto& family : {std::string("gemma2"), std::string("gemma3")}) {
    json config = SavedConfig(family);
    auto capped = Build(family, config);
    config["final_logit_softcapping"] = nullptr;
    auto plain = Build(family, config);
    ASSERT_TRUE(capped && plain);
    Randomize(*capped, 7);
    CopyWeights(*capped, *plain);
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(3, 256, {1, 24}, torch::kLong);
    auto c = capped->Forward(tokens, Positions(1, 24), nullptr);
    auto p = plain->Forward(tokens, Positions(1, 24), nullptr);
    EXPECT_LT(c.abs().max().item<float>(), 3.0f) << family;
    EXPECT_GT(p.abs().max().item<float>(), 3.0f) << family;
    EXPECT_TRUE(torch::allclose(c, torch::tanh(p / 3.0) * 3.0, 1e-5, 1e-5)) << family;
  }
}

// Attention soft-capping changes Gemma 2's logits (scores beyond the cap are squashed) but not
// Gemma 3's: Gemma3Attention never applies attn_logit_softcapping.
TEST(GemmaModel, AttentionSoftcappingOnlyInGemma2) {
  for (const auto& family : {std::string("gemma2"), std::string("gemma3")}) {
    json config = SavedConfig(family);
    config["attn_logit_softcapping"] = 1.0;  // tight, so it bites in Gemma 2
    auto capped = Build(family, config);
    config["attn_logit_softcapping"] = nullptr;
    auto plain = Build(family, config);
    ASSERT_TRUE(capped && plain);
    Randomize(*capped, 9);
    CopyWeights(*capped, *plain);
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(3, 256, {1, 24}, torch::kLong);
    auto c = capped->Forward(tokens, Positions(1, 24), nullptr);
    auto p = plain->Forward(tokens, Positions(1, 24), nullptr);
    EXPECT_EQ(torch::equal(c, p), family == "gemma3") << family;
  }
}

// Construct honours the requested dtype, and the scaled embeddings and (1 + w) norms run in it.
TEST(GemmaModel, ConstructsInRequestedDtype) {
  for (const auto& family : kFamilies) {
    auto parsed = Family(family).ParseConfig(SavedConfig(family));
    ASSERT_TRUE(parsed.ok());
    auto model = Family(family).Construct(*parsed->args, torch::kBFloat16, torch::kCPU);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    for (const auto& p : (*model)->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
    torch::NoGradGuard no_grad;
    auto logits =
        (*model)->Forward(torch::tensor({{4, 5, 6}}, torch::kLong), Positions(1, 3), nullptr);
    EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  }
}

}  // namespace
}  // namespace gatehouse::worker
