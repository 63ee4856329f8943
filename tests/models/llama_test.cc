// Tests of the llama family (models/llama), reached only through the plugin entry point and
// the SDK interfaces, as the worker reaches it. Parity against transformers is checked by the
// integration tests; these check the family's own contracts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "gatehouse/worker/model_family.h"
#include "tests/models/family_test_util.h"

extern "C" int gatehouse_plugin_abi_version();

namespace gatehouse::worker {
namespace {

using nlohmann::json;
using test_util::ParamNames;

// config.json exactly as transformers 5.24 LlamaForCausalLM.save_pretrained wrote it for the
// llama-tiny-tied fixture (tools/refgen/make_checkpoint.py).
constexpr const char* kSavedTiedConfig = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "dtype": "float32",
  "eos_token_id": 2,
  "head_dim": 16,
  "hidden_act": "silu",
  "hidden_size": 64,
  "initializer_range": 0.02,
  "intermediate_size": 128,
  "max_position_embeddings": 512,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "pad_token_id": null,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
  "tie_word_embeddings": true,
  "transformers_version": "5.24.0",
  "use_cache": true,
  "vocab_size": 256
})";

/// The llama family, registered once through the plugin's exported entry point.
const ModelFamily& Llama() { return test_util::FamilyByName("llama"); }

json SavedConfig(bool tied) {
  json c = json::parse(kSavedTiedConfig);
  c["tie_word_embeddings"] = tied;
  return c;
}

std::shared_ptr<const ModelArgs> ParseOk(const json& config) {
  auto parsed = Llama().ParseConfig(config);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? parsed->args : nullptr;
}

std::shared_ptr<CausalLM> Build(const json& config) {
  auto args = ParseOk(config);
  auto model = Llama().Construct(*args, torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return *model;
}

/// Re-draws every weight at unit activation scale (norms away from 1.0), so logits are far from
/// uniform and comparisons are meaningful.
void Randomize(CausalLM& model, uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.dim() == 1) {
      p.uniform_(0.5, 1.5);
    } else {
      p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(1))));
    }
  }
}

Status ParseError(const json& config) { return Llama().ParseConfig(config).status(); }

// --- registration -------------------------------------------------------------------------

// The plugin's entry points register a family named "llama" serving model_type "llama".
TEST(LlamaPlugin, RegistersLlamaFamily) {
  EXPECT_EQ(gatehouse_plugin_abi_version(), kPluginAbiVersion);
  EXPECT_EQ(Llama().name(), "llama");
  EXPECT_EQ(Llama().model_types(), std::vector<std::string>{"llama"});
}

// --- config -------------------------------------------------------------------------------

// Every field of a real saved config is mapped or ignored; the values land in the args.
TEST(LlamaConfig, SavedConfigFullyAccounted) {
  const json config = SavedConfig(true);
  auto parsed = Llama().ParseConfig(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  test_util::ExpectConfigFullyAccounted(parsed->report, config, "llama-tiny-tied");

  const ModelArgs& args = *parsed->args;
  EXPECT_EQ(args.vocab_size(), 256);
  EXPECT_EQ(args.num_hidden_layers(), 2);
  EXPECT_EQ(args.num_key_value_heads(), 2);
  EXPECT_EQ(args.head_dim(), 16);
  EXPECT_EQ(args.max_position_embeddings(), 512);
  EXPECT_TRUE(args.tie_word_embeddings());
  const json j = args.ToJson();
  EXPECT_EQ(j["ropes"][0]["rope_theta"].get<double>(), 50000.0);
  EXPECT_EQ(j["ropes"][0]["rope_theta_source"], "rope_parameters.rope_theta");
  EXPECT_EQ(j["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_EQ(j["hidden_size"], 64);
  EXPECT_EQ(j["intermediate_size"], 128);
}

// The configs the testdata fixture wrote with the venv's transformers parse with nothing
// unmapped (guards against a transformers upgrade adding a field).
TEST(LlamaConfig, FixtureConfigsFullyAccounted) {
  for (const char* name : {"llama-tiny-tied", "llama-tiny-untied", "llama-tiny-sharded"}) {
    const std::filesystem::path path = test_util::FixtureCheckpointDir(name) / "config.json";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " absent: run through ctest";
    const json config = test_util::FixtureConfig(name);
    auto parsed = Llama().ParseConfig(config);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().ToString();
    EXPECT_TRUE(parsed->report.unmapped.empty()) << name << ": " << json(parsed->report.unmapped);
    EXPECT_EQ(parsed->report.mapped.size() + parsed->report.ignored.size(), config.size());
    EXPECT_EQ(parsed->args->ToJson()["ropes"][0]["rope_theta"].get<double>(), 50000.0) << name;
  }
}

// A missing required field is INVALID_ARGUMENT naming the field.
TEST(LlamaConfig, MissingRequiredFieldIsNamed) {
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "max_position_embeddings", "rms_norm_eps"}) {
    json config = SavedConfig(false);
    config.erase(field);
    const Status s = ParseError(config);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(std::string("'") + field + "'"), std::string::npos) << s.ToString();
  }
}

// Optional fields take LlamaConfig's defaults: kv heads = heads, head_dim = hidden / heads,
// rope_theta = 10000 when no spelling of it is present.
TEST(LlamaConfig, UpstreamDefaults) {
  json config = SavedConfig(false);
  config.erase("num_key_value_heads");
  config.erase("head_dim");
  config.erase("rope_parameters");
  auto args = ParseOk(config);
  ASSERT_NE(args, nullptr);
  EXPECT_EQ(args->num_key_value_heads(), 4);
  EXPECT_EQ(args->head_dim(), 16);
  EXPECT_EQ(args->ToJson()["ropes"][0]["rope_theta"].get<double>(), 10000.0);
  EXPECT_EQ(args->ToJson()["ropes"][0]["rope_theta_source"], "default");
}

// The legacy spelling (top-level rope_theta, rope_scaling null or {"type": "default"}) parses
// to the same theta and is fully accounted for.
TEST(LlamaConfig, LegacyRopeSpelling) {
  for (const json& scaling : {json(nullptr), json{{"type", "default"}}}) {
    json config = SavedConfig(false);
    config.erase("rope_parameters");
    config["rope_theta"] = 50000.0;
    config["rope_scaling"] = scaling;
    auto parsed = Llama().ParseConfig(config);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_TRUE(parsed->report.unmapped.empty());
    EXPECT_EQ(parsed->args->ToJson()["ropes"][0]["rope_theta"].get<double>(), 50000.0);
  }
}

// An unknown or not-yet-implemented rope type is rejected naming the field and the value.
TEST(LlamaConfig, UnknownRopeTypeRejected) {
  json config = SavedConfig(false);
  config["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 500000.0}, {"factor", 8.0}};
  Status s = ParseError(config);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rope_parameters.rope_type"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("yarn"), std::string::npos) << s.ToString();

  config.erase("rope_parameters");
  config["rope_scaling"] = {{"type", "no-such-rope"}, {"factor", 2.0}};
  s = ParseError(config);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rope_scaling.type"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("no-such-rope"), std::string::npos) << s.ToString();
}

// A field the family does not know lands in report.unmapped (the config gate fails on it);
// so does an unknown key inside rope_parameters.
TEST(LlamaConfig, UnknownFieldIsUnmapped) {
  json config = SavedConfig(false);
  config["sliding_window"] = 128;
  config["rope_parameters"]["beta_fast"] = 32;
  auto parsed = Llama().ParseConfig(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  std::set<std::string> unmapped(parsed->report.unmapped.begin(), parsed->report.unmapped.end());
  EXPECT_EQ(unmapped, (std::set<std::string>{"sliding_window", "rope_parameters.beta_fast"}));
}

// The scaled RoPE types parse with their parameters; a missing parameter is named.
TEST(LlamaConfig, RopeScalingParsedAndChecked) {
  json config = SavedConfig(false);
  config["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0},
                               {"factor", 8.0}, {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0},
                               {"original_max_position_embeddings", 64}};
  auto args = ParseOk(config);
  ASSERT_NE(args, nullptr);
  const json rope = args->ToJson()["ropes"][0];
  EXPECT_EQ(rope["rope_type"], "llama3");
  EXPECT_EQ(rope["factor"].get<double>(), 8.0);
  EXPECT_EQ(rope["original_max_position_embeddings"], 64);

  config["rope_parameters"].erase("low_freq_factor");
  Status s = ParseError(config);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rope_parameters.low_freq_factor"), std::string::npos)
      << s.ToString();

  config["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 500000.0}};
  s = ParseError(config);
  EXPECT_NE(s.message().find("rope_parameters.factor"), std::string::npos) << s.ToString();
}

// Values the family cannot honour are INVALID_ARGUMENT naming field and value.
TEST(LlamaConfig, UnsupportedValuesRejected) {
  struct Case {
    const char* field;
    json value;
    const char* needle;
  };
  for (const Case& c : {Case{"hidden_act", "gelu", "gelu"}, Case{"pretraining_tp", 2, "2"},
                        Case{"num_key_value_heads", 3, "num_key_value_heads"},
                        Case{"hidden_size", "64", "expected an integer"},
                        Case{"num_hidden_layers", 0, "must be positive"},
                        Case{"tie_word_embeddings", 1, "expected true or false"}}) {
    json config = SavedConfig(false);
    config[c.field] = c.value;
    const Status s = ParseError(config);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.ToString();
  }
}

// partial_rotary_factor as modeling_llama.py treats it: the default RoPE ignores it (the whole
// head rotates: equal logits with and without it); a scaled type would fail upstream.
TEST(LlamaConfig, PartialRotaryFactorAsUpstream) {
  json plain = SavedConfig(false);
  json partial = plain;
  partial["partial_rotary_factor"] = 0.5;
  auto a = Build(plain);
  auto b = Build(partial);
  Randomize(*a, 7);
  torch::NoGradGuard no_grad;
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) pb[item.key()].copy_(item.value());
  const auto tokens = torch::arange(1, 12, torch::kLong).unsqueeze(0);
  const auto positions = torch::arange(0, 11, torch::kLong).unsqueeze(0);
  EXPECT_TRUE(torch::equal(a->Forward(tokens, positions, nullptr),
                           b->Forward(tokens, positions, nullptr)));
  partial["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 50000.0}};
  const Status s = ParseError(partial);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'partial_rotary_factor' = 0.5"), std::string::npos) << s.ToString();
}

// --- name table ---------------------------------------------------------------------------

// Every parameter of a constructed model maps to HF and back, and the HF side equals the
// table's expected names exactly: tied, untied, and with attention/MLP biases.
TEST(LlamaAdapter, NameTableRoundTrip) {
  for (const bool tied : {true, false}) {
    for (const bool bias : {false, true}) {
      json config = SavedConfig(tied);
      config["attention_bias"] = bias;
      config["mlp_bias"] = bias;
      auto args = ParseOk(config);
      auto model = Llama().Construct(*args, torch::kFloat32, torch::kCPU);
      ASSERT_TRUE(model.ok()) << model.status().ToString();
      auto adapter = Llama().Adapter(*args);
      ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();

      std::set<std::string> hf_names;
      const std::set<std::string> params = ParamNames(**model);
      for (const auto& name : params) {
        auto hf = adapter->ToHf(name);
        ASSERT_TRUE(hf.ok()) << hf.status().ToString();
        auto back = adapter->ToInternal(*hf);
        ASSERT_TRUE(back.ok()) << back.status().ToString();
        EXPECT_EQ(*back, name);
        hf_names.insert(*hf);
      }
      const auto& expected = adapter->ExpectedHfNames();
      EXPECT_EQ(hf_names, std::set<std::string>(expected.begin(), expected.end()))
          << "tied=" << tied << " bias=" << bias;
      EXPECT_EQ(expected.size(), params.size());
      EXPECT_EQ(hf_names.count("lm_head.weight"), tied ? 0u : 1u);
      EXPECT_EQ(hf_names.count("model.layers.1.self_attn.k_proj.bias"), bias ? 1u : 0u);
      EXPECT_EQ(hf_names.count("model.layers.0.mlp.down_proj.bias"), bias ? 1u : 0u);
      EXPECT_EQ(adapter->IsTiedAlias("lm_head.weight"), tied);
    }
  }
}

// Spot checks of the table against transformers' names.
TEST(LlamaAdapter, KnownNames) {
  auto args = ParseOk(SavedConfig(false));
  auto adapter = Llama().Adapter(*args);
  ASSERT_TRUE(adapter.ok());
  const std::pair<const char*, const char*> kPairs[] = {
      {"model.embed_tokens.weight", "tok_embeddings.weight"},
      {"model.layers.1.input_layernorm.weight", "layers.1.attention_norm.weight"},
      {"model.layers.0.self_attn.q_proj.weight", "layers.0.attention.wq.weight"},
      {"model.layers.0.self_attn.o_proj.weight", "layers.0.attention.wo.weight"},
      {"model.layers.1.post_attention_layernorm.weight", "layers.1.ffn_norm.weight"},
      {"model.layers.1.mlp.gate_proj.weight", "layers.1.feed_forward.w1.weight"},
      {"model.layers.1.mlp.down_proj.weight", "layers.1.feed_forward.w2.weight"},
      {"model.layers.1.mlp.up_proj.weight", "layers.1.feed_forward.w3.weight"},
      {"model.norm.weight", "norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  for (const auto& [hf, internal] : kPairs) {
    auto got = adapter->ToInternal(hf);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, internal);
  }
}

// A tied model registers no lm_head parameter and computes logits with the embedding.
TEST(LlamaModel, TiedModelHasNoLmHead) {
  auto tied = Build(SavedConfig(true));
  auto untied = Build(SavedConfig(false));
  const auto tied_names = ParamNames(*tied);
  EXPECT_EQ(tied_names.count("output.weight"), 0u);
  EXPECT_EQ(ParamNames(*untied).count("output.weight"), 1u);
  EXPECT_EQ(tied_names.size() + 1, ParamNames(*untied).size());

  // Zeroing one embedding row zeroes that token's logit column: the embedding is the head.
  Randomize(*tied, 3);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : tied->named_parameters()) {
      if (item.key() == "tok_embeddings.weight") item.value()[7].zero_();
    }
  }
  auto tokens = torch::tensor({{1, 2, 3}}, torch::kLong);
  auto positions = torch::arange(3, torch::kLong).unsqueeze(0);
  torch::NoGradGuard no_grad;
  auto logits = tied->Forward(tokens, positions, nullptr);
  EXPECT_EQ(logits.select(-1, 7).abs().max().item<float>(), 0.0f);
  EXPECT_GT(logits.select(-1, 8).abs().max().item<float>(), 0.0f);
}

// --- forward ------------------------------------------------------------------------------

// Forward maps [B, T] tokens to [B, T, vocab] logits in the model dtype.
TEST(LlamaModel, ForwardShapes) {
  auto model = Build(SavedConfig(false));
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, 256, {2, 5}, torch::kLong);
  auto positions = torch::arange(5, torch::kLong).unsqueeze(0).expand({2, 5}).contiguous();
  auto logits = model->Forward(tokens, positions, nullptr);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 5, 256}));
  EXPECT_EQ(logits.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());

  auto cache = model->NewKVCache(2, 32);
  EXPECT_EQ(cache->max_len(), 32);
  EXPECT_EQ(cache->length(), 0);
}

// Attention is causal: changing a later token leaves earlier logits unchanged.
TEST(LlamaModel, CausalWithoutCache) {
  auto model = Build(SavedConfig(false));
  Randomize(*model, 5);
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, 256, {1, 9}, torch::kLong);
  auto positions = torch::arange(9, torch::kLong).unsqueeze(0);
  auto a = model->Forward(tokens, positions, nullptr);
  auto changed = tokens.clone();
  changed[0][8] = (tokens[0][8].item<int64_t>() + 1) % 256;
  auto b = model->Forward(changed, positions, nullptr);
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 8), b.narrow(1, 0, 8)));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 8, 1), b.narrow(1, 8, 1)));
}

// Prefill + one-token steps (and a multi-token chunk) through the KV cache give the logits of
// one full forward pass (fp32, atol = rtol = 1e-5), for tied and untied models and batch 2.
TEST(LlamaModel, KVCacheDecodeMatchesFullForward) {
  for (const bool tied : {true, false}) {
    auto model = Build(SavedConfig(tied));
    Randomize(*model, 11);
    test_util::ExpectKVCacheDecodeMatchesFullForward(
        *model, {.batch = 2, .prefill = 7, .steps = 4, .chunk = 3, .cache_capacity = 64},
        "tied=" + std::to_string(tied));
  }
}

// Construct honours the requested dtype.
TEST(LlamaModel, ConstructsInRequestedDtype) {
  auto args = ParseOk(SavedConfig(true));
  auto model = Llama().Construct(*args, torch::kBFloat16, torch::kCPU);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  for (const auto& p : (*model)->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  torch::NoGradGuard no_grad;
  auto logits = (*model)->Forward(torch::tensor({{4, 5}}, torch::kLong),
                                  torch::tensor({{0, 1}}, torch::kLong), nullptr);
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
}

}  // namespace
}  // namespace gatehouse::worker
