// Tests of the qwen2, qwen3 and mistral families (models/qwen2, models/qwen3, models/mistral),
// reached only through the plugin entry point and the SDK interfaces, as the worker reaches
// them. Parity against transformers is checked by families_test and tools/parity; these check
// each family's own contracts: config accounting, sliding-window and head_dim semantics, the
// name table against the transformers-saved checkpoints, and KV-cache decoding under a window.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "gatehouse/worker/checkpoint.h"
#include "gatehouse/worker/model_family.h"
#include "tests/models/family_test_util.h"

namespace gatehouse::worker {
namespace {

using nlohmann::json;

// config.json as transformers 5.24 Qwen2ForCausalLM.save_pretrained wrote it for the
// qwen2-tiny-sliding fixture (tools/refgen/families/qwen2.py).
constexpr const char* kQwen2Sliding = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "dtype": "float32", "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 64,
  "initializer_range": 0.02, "intermediate_size": 128,
  "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
  "max_position_embeddings": 512, "max_window_layers": 1, "model_type": "qwen2",
  "num_attention_heads": 4, "num_hidden_layers": 3, "num_key_value_heads": 2,
  "pad_token_id": null, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
  "sliding_window": 16, "tie_word_embeddings": false, "transformers_version": "5.24.0",
  "use_cache": true, "use_sliding_window": true, "vocab_size": 256
})";

// ... Qwen3ForCausalLM, qwen3-tiny-sliding (head_dim 32 != hidden 64 / 4 heads).
constexpr const char* kQwen3Sliding = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "dtype": "float32", "eos_token_id": 2, "head_dim": 32, "hidden_act": "silu",
  "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
  "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
  "max_position_embeddings": 512, "max_window_layers": 1, "model_type": "qwen3",
  "num_attention_heads": 4, "num_hidden_layers": 3, "num_key_value_heads": 2,
  "pad_token_id": null, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
  "sliding_window": 32, "tie_word_embeddings": false, "transformers_version": "5.24.0",
  "use_cache": true, "use_sliding_window": true, "vocab_size": 256
})";

// ... MistralForCausalLM, mistral-tiny-untied (sliding_window 16 on every layer).
constexpr const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "dtype": "float32", "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu",
  "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
  "max_position_embeddings": 512, "model_type": "mistral", "num_attention_heads": 4,
  "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": null,
  "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
  "sliding_window": 16, "tie_word_embeddings": false, "transformers_version": "5.24.0",
  "use_cache": true, "vocab_size": 256
})";

using test_util::ParamNames;
using test_util::Registry;

const ModelFamily& Family(const std::string& name) { return test_util::FamilyByName(name); }

/// The saved config of `family`'s sliding fixture.
json Saved(const std::string& family) {
  if (family == "qwen2") return json::parse(kQwen2Sliding);
  if (family == "qwen3") return json::parse(kQwen3Sliding);
  return json::parse(kMistral);
}

const std::vector<std::string> kFamilies = {"qwen2", "qwen3", "mistral"};

Result<ParsedConfig> Parse(const std::string& family, const json& config) {
  return Family(family).ParseConfig(config);
}

/// The parsed spec as JSON (DecoderSpec::ToJson); fails the test on a parse error.
json SpecOf(const std::string& family, const json& config) {
  auto parsed = Parse(family, config);
  EXPECT_TRUE(parsed.ok()) << family << ": " << parsed.status().ToString();
  return parsed.ok() ? parsed->args->ToJson() : json();
}

/// Per-layer sliding windows of the parsed spec (0 = full attention).
std::vector<int64_t> Windows(const std::string& family, const json& config) {
  std::vector<int64_t> out;
  const json spec = SpecOf(family, config);
  if (!spec.contains("layers")) return out;
  for (const auto& l : spec["layers"]) out.push_back(l["sliding_window"].get<int64_t>());
  return out;
}

Status ParseError(const std::string& family, const json& config) {
  return Parse(family, config).status();
}

void ExpectRejected(const std::string& family, const json& config, const std::string& field,
                    const std::string& needle) {
  const Status s = ParseError(family, config);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << family << " " << field;
  EXPECT_NE(s.message().find("'" + field + "'"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
}

std::shared_ptr<CausalLM> Build(const std::string& family, const json& config) {
  auto parsed = Parse(family, config);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  if (!parsed.ok()) return nullptr;
  auto model = Family(family).Construct(*parsed->args, torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? *model : nullptr;
}

/// Re-draws every weight at unit activation scale (norms and biases away from identity/zero).
void Randomize(CausalLM& model, uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    auto& p = item.value();
    if (p.dim() == 1 && item.key().find("norm") != std::string::npos) {
      p.uniform_(0.5, 1.5);
    } else if (p.dim() == 1) {
      p.normal_(0.0, 0.1);
    } else {
      p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(1))));
    }
  }
}

/// Copies every parameter of `from` into the same-named parameter of `to`.
void CopyWeights(const CausalLM& from, CausalLM& to) {
  torch::NoGradGuard no_grad;
  auto src = from.named_parameters();
  for (auto& item : to.named_parameters()) item.value().copy_(src[item.key()]);
}

struct Fixture {
  const char* variant;
  const char* family;
  int64_t head_dim;
  std::vector<int64_t> windows;  // per layer, 0 = full attention
  bool tied;
};

// Every fixture of tools/refgen/families/{qwen2,qwen3,mistral}.py with what it must parse to.
const std::vector<Fixture> kFixtures = {
    {"qwen2-tiny-tied", "qwen2", 16, {0, 0}, true},
    {"qwen2-tiny-untied", "qwen2", 16, {0, 0}, false},
    {"qwen2-tiny-sharded", "qwen2", 16, {0, 0}, false},
    {"qwen2-tiny-sliding", "qwen2", 16, {0, 16, 16}, false},
    {"qwen2-tiny-sliding-off", "qwen2", 16, {0, 0, 0}, true},
    {"qwen3-tiny-tied", "qwen3", 32, {0, 0}, true},
    {"qwen3-tiny-untied", "qwen3", 32, {0, 0}, false},
    {"qwen3-tiny-sharded", "qwen3", 32, {0, 0}, false},
    {"qwen3-tiny-bias", "qwen3", 32, {0, 0}, true},
    {"qwen3-tiny-sliding", "qwen3", 32, {0, 32, 32}, false},
    {"mistral-tiny-tied", "mistral", 16, {16, 16}, true},
    {"mistral-tiny-untied", "mistral", 16, {16, 16}, false},
    {"mistral-tiny-sharded", "mistral", 16, {16, 16}, false},
    {"mistral-tiny-full", "mistral", 16, {0, 0}, false},
    {"mistral-tiny-headdim", "mistral", 32, {16, 16}, true},
};

// --- registration -------------------------------------------------------------------------

// The plugin registers each family under its name for exactly its HF model_type.
TEST(QwenMistralPlugin, RegistersFamilies) {
  for (const auto& name : kFamilies) {
    EXPECT_EQ(Family(name).name(), name);
    EXPECT_EQ(Family(name).model_types(), std::vector<std::string>{name});
    EXPECT_EQ(Registry().FindByModelType(name), &Family(name));
  }
  // A config of another model_type is rejected naming the field.
  json config = Saved("qwen2");
  config["model_type"] = "qwen3";
  ExpectRejected("qwen2", config, "model_type", "qwen3");
}

// --- config -------------------------------------------------------------------------------

// Every field of each transformers-saved fixture config is mapped or ignored (with a reason),
// never both, and the spec holds the fixture's head_dim, per-layer windows and tying.
TEST(QwenMistralConfig, FixtureConfigsFullyAccountedAndParsed) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.variant);
    auto config = Checkpoint::ReadConfig(test_util::FixtureCheckpointDir(f.variant));
    if (!config.ok()) GTEST_SKIP() << config.status().ToString() << ": run through ctest";
    auto parsed = Parse(f.family, *config);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    test_util::ExpectConfigFullyAccounted(parsed->report, *config, f.variant);

    const json spec = parsed->args->ToJson();
    EXPECT_EQ(spec["head_dim"], f.head_dim);
    EXPECT_EQ(spec["tie_word_embeddings"], f.tied);
    EXPECT_EQ(spec["ropes"][0]["rope_theta"].get<double>(), 50000.0);
    EXPECT_EQ(Windows(f.family, *config), f.windows);
    const std::string family = f.family;
    EXPECT_EQ(spec["qkv_bias"], family == "qwen2" || std::string(f.variant) == "qwen3-tiny-bias");
    EXPECT_EQ(spec["o_bias"], std::string(f.variant) == "qwen3-tiny-bias");
    EXPECT_EQ(spec["qk_norm"], family == "qwen3");
    EXPECT_FALSE(spec["mlp_bias"].get<bool>());
  }
}

// A missing required field is INVALID_ARGUMENT naming the field.
TEST(QwenMistralConfig, MissingRequiredFieldIsNamed) {
  for (const auto& family : kFamilies) {
    for (const char* field : {"vocab_size", "hidden_size", "intermediate_size",
                              "num_hidden_layers", "num_attention_heads",
                              "max_position_embeddings", "rms_norm_eps"}) {
      json config = Saved(family);
      config.erase(field);
      const Status s = ParseError(family, config);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << family << " " << field;
      EXPECT_NE(s.message().find(std::string("'") + field + "'"), std::string::npos)
          << s.ToString();
    }
  }
}

// Values the families cannot honour are INVALID_ARGUMENT naming field and value.
TEST(QwenMistralConfig, UnsupportedValuesRejected) {
  for (const auto& family : kFamilies) {
    SCOPED_TRACE(family);
    json config = Saved(family);
    config["hidden_act"] = "gelu";
    ExpectRejected(family, config, "hidden_act", "gelu");

    config = Saved(family);
    config["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}};
    ExpectRejected(family, config, "rope_parameters.rope_type", "yarn");

    for (const json& bad : {json(0), json(-8)}) {
      config = Saved(family);
      config["sliding_window"] = bad;
      ExpectRejected(family, config, "sliding_window", "must be positive");
    }
    config = Saved(family);
    config["sliding_window"] = "16";
    ExpectRejected(family, config, "sliding_window", "expected an integer");

    config = Saved(family);
    config["num_key_value_heads"] = 3;
    ExpectRejected(family, config, "num_key_value_heads", "3");
  }
  for (const std::string family : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(family);
    json config = Saved(family);
    config["layer_types"] = {"full_attention", "sliding_attention"};
    ExpectRejected(family, config, "layer_types", "num_hidden_layers = 3");
    config["layer_types"] = {"full_attention", "chunked_attention", "full_attention"};
    ExpectRejected(family, config, "layer_types[1]", "chunked_attention");
    config = Saved(family);
    config["use_sliding_window"] = "yes";
    ExpectRejected(family, config, "use_sliding_window", "expected true or false");
    config = Saved(family);
    config["max_window_layers"] = 1.5;
    ExpectRejected(family, config, "max_window_layers", "expected an integer");
    // Sliding layers without a window: transformers raises at the first forward.
    config = Saved(family);
    config["use_sliding_window"] = false;
    ExpectRejected(family, config, "layer_types[1]", "use_sliding_window is false");
    config = Saved(family);
    config["sliding_window"] = nullptr;
    ExpectRejected(family, config, "layer_types[1]", "sliding_window is null");
  }
  // transformers' AutoConfig loads a mistral config with layer_types as ministral.
  json config = Saved("mistral");
  config["layer_types"] = {"sliding_attention", "full_attention"};
  ExpectRejected("mistral", config, "layer_types", "ministral");
  // Qwen2Attention / Qwen3Attention fail on a null head_dim (getattr returns None).
  for (const std::string family : {"qwen2", "qwen3"}) {
    config = Saved(family);
    config["head_dim"] = nullptr;
    ExpectRejected(family, config, "head_dim", "null");
  }
}

// Fields a family does not read land in report.unmapped: qwen2 and mistral have no
// attention_bias (their projections' biases are fixed), mistral no use_sliding_window.
TEST(QwenMistralConfig, UnknownFieldIsUnmapped) {
  for (const std::string family : {"qwen2", "mistral"}) {
    json config = Saved(family);
    config["attention_bias"] = true;
    config["mlp_bias"] = false;
    auto parsed = Parse(family, config);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(std::set<std::string>(parsed->report.unmapped.begin(), parsed->report.unmapped.end()),
              (std::set<std::string>{"attention_bias", "mlp_bias"}))
        << family;
  }
  json config = Saved("mistral");
  config["use_sliding_window"] = false;
  config["max_window_layers"] = 1;
  auto parsed = Parse("mistral", config);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(std::set<std::string>(parsed->report.unmapped.begin(), parsed->report.unmapped.end()),
            (std::set<std::string>{"use_sliding_window", "max_window_layers"}));
}

// Qwen2 / Qwen3 sliding flags follow Qwen2Config.__post_init__: the window applies only with
// use_sliding_window, layer_types is derived from max_window_layers when absent (default 28),
// an explicit layer_types wins, and an absent sliding_window is the default 4096.
TEST(QwenMistralConfig, QwenSlidingWindowSemantics) {
  for (const std::string family : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(family);
    json config = Saved(family);
    config.erase("layer_types");
    const int64_t w = Saved(family)["sliding_window"].get<int64_t>();
    EXPECT_EQ(Windows(family, config), (std::vector<int64_t>{0, w, w}));
    config["max_window_layers"] = 2;
    EXPECT_EQ(Windows(family, config), (std::vector<int64_t>{0, 0, w}));
    config["max_window_layers"] = 0;
    config["sliding_window"] = 8;
    EXPECT_EQ(Windows(family, config), (std::vector<int64_t>{8, 8, 8}));
    config.erase("max_window_layers");  // default 28 > 3 layers: nothing slides
    EXPECT_EQ(Windows(family, config), (std::vector<int64_t>{0, 0, 0}));
    config["num_hidden_layers"] = 30;
    config.erase("sliding_window");  // default 4096 on layers 28 and 29
    std::vector<int64_t> expected(30, 0);
    expected[28] = expected[29] = 4096;
    EXPECT_EQ(Windows(family, config), expected);

    // use_sliding_window false: no window anywhere, whatever sliding_window says.
    config = Saved(family);
    config.erase("layer_types");
    config["use_sliding_window"] = false;
    EXPECT_EQ(Windows(family, config), (std::vector<int64_t>{0, 0, 0}));
    config.erase("use_sliding_window");  // default false
    EXPECT_EQ(Windows(family, config), (std::vector<int64_t>{0, 0, 0}));

    // Explicit layer_types overrides max_window_layers.
    config = Saved(family);
    config["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
    config["sliding_window"] = 5;
    EXPECT_EQ(Windows(family, config), (std::vector<int64_t>{5, 0, 5}));
  }
}

// Mistral: one window on every layer; null = full attention; absent = the default 4096.
TEST(QwenMistralConfig, MistralSlidingWindowSemantics) {
  json config = Saved("mistral");
  EXPECT_EQ(Windows("mistral", config), (std::vector<int64_t>{16, 16}));
  config["sliding_window"] = nullptr;
  EXPECT_EQ(Windows("mistral", config), (std::vector<int64_t>{0, 0}));
  config.erase("sliding_window");
  EXPECT_EQ(Windows("mistral", config), (std::vector<int64_t>{4096, 4096}));
}

// head_dim: Qwen3 takes its own field (absent: 128, Qwen3Config's default), Qwen2 and Mistral
// derive hidden / heads when absent (Mistral also when null); the scaling is head_dim^-0.5.
TEST(QwenMistralConfig, HeadDimDefaults) {
  json config = Saved("qwen3");
  EXPECT_EQ(SpecOf("qwen3", config)["head_dim"], 32);
  EXPECT_DOUBLE_EQ(SpecOf("qwen3", config)["attention_scaling"].get<double>(),
                   1.0 / std::sqrt(32.0));
  config.erase("head_dim");
  EXPECT_EQ(SpecOf("qwen3", config)["head_dim"], 128);
  EXPECT_DOUBLE_EQ(SpecOf("qwen3", config)["attention_scaling"].get<double>(),
                   1.0 / std::sqrt(128.0));

  for (const std::string family : {"qwen2", "mistral"}) {
    config = Saved(family);
    config["head_dim"] = 32;
    EXPECT_EQ(SpecOf(family, config)["head_dim"], 32) << family;
    config.erase("head_dim");
    EXPECT_EQ(SpecOf(family, config)["head_dim"], 16) << family;
  }
  config = Saved("mistral");
  config["head_dim"] = nullptr;  // MistralAttention: head_dim or hidden // heads
  EXPECT_EQ(SpecOf("mistral", config)["head_dim"], 16);
}

// num_key_value_heads takes the config class's default when absent (Qwen2Config and
// Qwen3Config 32, MistralConfig 8, not num_attention_heads) and num_attention_heads when null.
TEST(QwenMistralConfig, KeyValueHeadsDefaults) {
  for (const auto& [family, absent] :
       std::vector<std::pair<std::string, int>>{{"qwen2", 32}, {"qwen3", 32}, {"mistral", 8}}) {
    json config = Saved(family);
    config["num_attention_heads"] = 64;
    config["head_dim"] = 16;
    config.erase("num_key_value_heads");
    EXPECT_EQ(SpecOf(family, config)["num_key_value_heads"], absent) << family;
    config["num_key_value_heads"] = nullptr;
    EXPECT_EQ(SpecOf(family, config)["num_key_value_heads"], 64) << family;
  }
}

// --- name table ---------------------------------------------------------------------------

// The adapter's expected HF names equal the keys transformers saved, exactly, for every
// fixture (tied: no lm_head.weight; qwen2: q/k/v biases, no o_proj bias; qwen3: q_norm /
// k_norm; sharded: keys over several files), and every model parameter maps to one of them.
TEST(QwenMistralAdapter, ExpectedNamesEqualCheckpointKeys) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.variant);
    auto checkpoint = Checkpoint::Open(test_util::FixtureCheckpointDir(f.variant));
    if (!checkpoint.ok()) GTEST_SKIP() << checkpoint.status().ToString() << ": run through ctest";
    auto parsed = Parse(f.family, checkpoint->config());
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    auto adapter = Family(f.family).Adapter(*parsed->args);
    ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();
    const auto keys = checkpoint->Keys();
    test_util::ExpectNamesEqualKeys(adapter->ExpectedHfNames(), keys, f.variant);
    if (std::string(f.variant).find("sharded") != std::string::npos) {
      EXPECT_GE(checkpoint->files().size(), 2u);
    }

    auto model = Family(f.family).Construct(*parsed->args, torch::kFloat32, torch::kCPU);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    std::set<std::string> mapped;
    for (const auto& name : ParamNames(**model)) {
      auto hf = adapter->ToHf(name);
      ASSERT_TRUE(hf.ok()) << hf.status().ToString();
      mapped.insert(*hf);
      // Shapes agree with what transformers saved.
      const auto* info = checkpoint->Info(*hf);
      ASSERT_NE(info, nullptr) << *hf;
      EXPECT_EQ(info->shape, (*model)->named_parameters()[name].sizes().vec()) << *hf;
    }
    EXPECT_EQ(mapped, std::set<std::string>(keys.begin(), keys.end()));
  }
}

// --- forward ------------------------------------------------------------------------------

// The window reaches the computation: with the same weights, a windowed model equals the
// full-attention one on the first `window` positions and differs after them.
TEST(QwenMistralModel, SlidingWindowChangesOnlyLaterPositions) {
  for (const auto& family : kFamilies) {
    SCOPED_TRACE(family);
    json windowed = Saved(family);
    windowed["sliding_window"] = 4;
    json full = windowed;
    if (family == "mistral") {
      full["sliding_window"] = nullptr;
    } else {
      full["use_sliding_window"] = false;
      full["layer_types"] = {"full_attention", "full_attention", "full_attention"};
    }
    auto a = Build(family, windowed);
    auto b = Build(family, full);
    ASSERT_TRUE(a && b);
    Randomize(*a, 7);
    CopyWeights(*a, *b);
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(0, 256, {1, 12}, torch::kLong);
    auto positions = torch::arange(12, torch::kLong).unsqueeze(0);
    auto la = a->Forward(tokens, positions, nullptr);
    auto lb = b->Forward(tokens, positions, nullptr);
    EXPECT_TRUE(torch::allclose(la.narrow(1, 0, 4), lb.narrow(1, 0, 4), 1e-6, 1e-6));
    for (int64_t t = 4; t < 12; ++t) {
      EXPECT_FALSE(torch::allclose(la.narrow(1, t, 1), lb.narrow(1, t, 1), 1e-4, 1e-4)) << t;
    }
  }
}

// Prefill + one-token steps + a multi-token chunk through the KV cache give the logits of one
// full forward pass (fp32, atol = rtol = 1e-5), with a window (4) shorter than the sequence so
// cached keys fall out of it, for tied and untied models and batch 2.
TEST(QwenMistralModel, KVCacheDecodeMatchesFullForward) {
  for (const auto& family : kFamilies) {
    for (const bool tied : {true, false}) {
      SCOPED_TRACE(family + (tied ? " tied" : " untied"));
      json config = Saved(family);
      config["tie_word_embeddings"] = tied;
      config["sliding_window"] = 4;
      if (family == "qwen3") config["attention_bias"] = true;
      auto model = Build(family, config);
      ASSERT_TRUE(model);
      Randomize(*model, 11);
      test_util::ExpectKVCacheDecodeMatchesFullForward(
          *model, {.batch = 2, .prefill = 7, .steps = 4, .chunk = 3, .cache_capacity = 64}, "");
    }
  }
}

// Qwen3's q_norm / k_norm act per head over head_dim: the parameters are [head_dim] = [32], and
// scaling a k_norm weight changes the logits (the norm is applied, not just loaded).
TEST(QwenMistralModel, Qwen3QkNormIsApplied) {
  auto model = Build("qwen3", Saved("qwen3"));
  ASSERT_TRUE(model);
  Randomize(*model, 13);
  auto params = model->named_parameters();
  ASSERT_TRUE(params.contains("layers.0.attention.q_norm.weight"));
  EXPECT_EQ(params["layers.0.attention.q_norm.weight"].sizes().vec(), std::vector<int64_t>{32});
  EXPECT_EQ(params["layers.2.attention.k_norm.weight"].sizes().vec(), std::vector<int64_t>{32});
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, 256, {1, 6}, torch::kLong);
  auto positions = torch::arange(6, torch::kLong).unsqueeze(0);
  auto before = model->Forward(tokens, positions, nullptr);
  params["layers.0.attention.k_norm.weight"].mul_(2.0);
  auto after = model->Forward(tokens, positions, nullptr);
  EXPECT_FALSE(torch::allclose(before, after, 1e-4, 1e-4));
}

}  // namespace
}  // namespace gatehouse::worker
