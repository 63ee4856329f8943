// Tests of the phi3 family (models/phi3), reached only through the plugin entry point and the
// SDK interfaces, as the worker reaches it. Parity against transformers is checked by
// families_test and tools/parity; these check the family's own contracts: config accounting
// (partial rotary, sliding window, the ignored dropout / LongRoPE fields), rejection of rope
// types other than "default", the fused name table against the transformers-saved
// checkpoints, the split order of the fused projections, and KV-cache decoding.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "gatehouse/worker/model_family.h"
#include "tests/models/family_test_util.h"

extern "C" int gatehouse_plugin_abi_version();

namespace gatehouse::worker {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_util::FixtureConfig;
using test_util::FixtureDir;

// config.json as transformers 5.24 Phi3ForCausalLM.save_pretrained wrote it for the
// phi3-tiny-untied fixture (tools/refgen/families/phi3.py).
constexpr const char* kSaved = R"({
  "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "dtype": "float32", "embd_pdrop": 0.0, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
  "max_position_embeddings": 512, "model_type": "phi3", "num_attention_heads": 4,
  "num_hidden_layers": 2, "num_key_value_heads": 2, "original_max_position_embeddings": 4096,
  "pad_token_id": 0, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
  "rope_parameters": {"partial_rotary_factor": 0.5, "rope_theta": 50000.0,
                      "rope_type": "default"},
  "sliding_window": null, "tie_word_embeddings": false, "transformers_version": "5.24.0",
  "use_cache": true, "vocab_size": 256
})";

// The same model as a llama config (full rotary): the twin for the fused-split test.
constexpr const char* kLlamaTwin = R"({
  "model_type": "llama", "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128,
  "max_position_embeddings": 512, "num_attention_heads": 4, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
  "tie_word_embeddings": false, "vocab_size": 256
})";

const std::vector<std::string> kFixtures = {"phi3-tiny-untied", "phi3-tiny-tied",
                                            "phi3-tiny-sharded", "phi3-tiny-sliding"};

const ModelFamily& Family() { return test_util::FamilyByModelType("phi3"); }

json Saved() { return json::parse(kSaved); }

json SpecOf(const json& config) {
  auto parsed = Family().ParseConfig(config);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? parsed->args->ToJson() : json();
}

void ExpectRejected(const json& config, const std::string& field, const std::string& needle) {
  const Status s = Family().ParseConfig(config).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
  EXPECT_NE(s.message().find("'" + field + "'"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
}

std::shared_ptr<CausalLM> Build(const ModelFamily& family, const json& config) {
  auto parsed = family.ParseConfig(config);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  if (!parsed.ok()) return nullptr;
  auto model = family.Construct(*parsed->args, torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? *model : nullptr;
}

/// Re-draws every weight at unit activation scale (norms U(0.5, 1.5)).
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

// --- registration -------------------------------------------------------------------------

// The plugin registers a family named "phi3" serving model_type "phi3".
TEST(Phi3Plugin, Registered) {
  EXPECT_EQ(gatehouse_plugin_abi_version(), kPluginAbiVersion);
  EXPECT_EQ(Family().name(), "phi3");
  EXPECT_EQ(Family().model_types(), std::vector<std::string>{"phi3"});
}

// --- config -------------------------------------------------------------------------------

// Every field of the saved config is mapped or ignored (dropout and LongRoPE-only fields
// ignored with reasons); fused projections, partial rotary and theta land in the spec.
TEST(Phi3Config, SavedConfigFullyAccounted) {
  const json config = Saved();
  auto parsed = Family().ParseConfig(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const ConfigReport& report = parsed->report;
  const std::set<std::string> ignored = test_util::ExpectConfigFullyAccounted(report, config);
  for (const char* f : {"resid_pdrop", "embd_pdrop", "original_max_position_embeddings"}) {
    EXPECT_TRUE(ignored.count(f)) << f;
  }
  const json spec = parsed->args->ToJson();
  EXPECT_EQ(spec["fused_qkv"], true);
  EXPECT_EQ(spec["fused_gate_up"], true);
  EXPECT_EQ(spec["qkv_bias"], false);
  EXPECT_EQ(spec["head_dim"], 16);
  EXPECT_EQ(spec["pad_token_id"], 0);
  EXPECT_EQ(spec["ropes"][0]["partial_rotary_factor"].get<double>(), 0.5);
  EXPECT_EQ(spec["ropes"][0]["rope_theta"].get<double>(), 50000.0);
  for (const auto& l : spec["layers"]) EXPECT_EQ(l["sliding_window"], 0);
}

// The configs the testdata fixture wrote parse with nothing unmapped, with each variant's
// rotary factor and window.
TEST(Phi3Config, FixtureConfigsFullyAccounted) {
  const std::map<std::string, std::pair<double, int64_t>> expect = {
      {"phi3-tiny-untied", {0.5, 0}}, {"phi3-tiny-tied", {1.0, 0}},
      {"phi3-tiny-sharded", {0.5, 0}}, {"phi3-tiny-sliding", {0.75, 16}}};
  for (const std::string& name : kFixtures) {
    if (!fs::exists(FixtureDir(name))) GTEST_SKIP() << name << " absent: run through ctest";
    const json config = FixtureConfig(name);
    auto parsed = Family().ParseConfig(config);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().ToString();
    EXPECT_TRUE(parsed->report.unmapped.empty()) << name << ": " << json(parsed->report.unmapped);
    EXPECT_EQ(parsed->report.mapped.size() + parsed->report.ignored.size(), config.size()) << name;
    const json spec = parsed->args->ToJson();
    EXPECT_EQ(spec["ropes"][0]["partial_rotary_factor"].get<double>(), expect.at(name).first);
    for (const auto& l : spec["layers"]) EXPECT_EQ(l["sliding_window"], expect.at(name).second);
  }
}

// The legacy spelling: a top-level partial_rotary_factor and rope_theta (Phi3Config copies
// them into rope_parameters); a window on every layer when sliding_window is set.
TEST(Phi3Config, LegacyRopeFieldsAndWindow) {
  json c = Saved();
  c.erase("rope_parameters");
  c["rope_theta"] = 20000.0;
  c["partial_rotary_factor"] = 0.25;
  c["sliding_window"] = 24;
  const json spec = SpecOf(c);
  EXPECT_EQ(spec["ropes"][0]["partial_rotary_factor"].get<double>(), 0.25);
  EXPECT_EQ(spec["ropes"][0]["rope_theta"].get<double>(), 20000.0);
  for (const auto& l : spec["layers"]) EXPECT_EQ(l["sliding_window"], 24);
}

// pad_token_id: absent means Phi3Config's 32000 (the embedding padding_idx), which a
// 256-token vocabulary cannot hold (upstream's nn.Embedding refuses it too); null means none.
TEST(Phi3Config, PadTokenDefault) {
  json c = Saved();
  c.erase("pad_token_id");
  ExpectRejected(c, "pad_token_id", "32000");
  c["vocab_size"] = 32064;
  EXPECT_EQ(SpecOf(c)["pad_token_id"], 32000);
  c["pad_token_id"] = nullptr;
  EXPECT_TRUE(SpecOf(c)["pad_token_id"].is_null());
}

// LongRoPE (and its legacy names) is rejected as not implemented, naming the field and the
// value; other types are rejected because Phi3Config does not accept them.
TEST(Phi3Config, RopeTypesOtherThanDefaultRejected) {
  json c = Saved();
  c["rope_parameters"] = {{"rope_type", "longrope"},
                          {"rope_theta", 10000.0},
                          {"short_factor", json::array()},
                          {"long_factor", json::array()}};
  ExpectRejected(c, "rope_parameters.rope_type", "LongRoPE");
  ExpectRejected(c, "rope_parameters.rope_type", "not implemented");
  c.erase("rope_parameters");
  c["rope_scaling"] = {{"type", "su"}, {"short_factor", json::array()}};
  ExpectRejected(c, "rope_scaling.type", "\"su\"");
  c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  ExpectRejected(c, "rope_scaling.rope_type", "accepts only \"default\" and \"longrope\"");
}

// A missing required field is INVALID_ARGUMENT naming it.
TEST(Phi3Config, MissingRequiredFieldIsNamed) {
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "max_position_embeddings", "rms_norm_eps"}) {
    json c = Saved();
    c.erase(field);
    const Status s = Family().ParseConfig(c).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(std::string("'") + field + "'"), std::string::npos) << s.ToString();
  }
}

// Values the family cannot honour are rejected naming the field and value.
TEST(Phi3Config, UnsupportedValuesRejected) {
  json c = Saved();
  c["hidden_act"] = "gelu_new";
  ExpectRejected(c, "hidden_act", "gelu_new");
  c = Saved();
  c["sliding_window"] = -4;
  ExpectRejected(c, "sliding_window", "must be positive");
  c = Saved();
  c["rope_parameters"]["partial_rotary_factor"] = 1.5;
  ExpectRejected(c, "rope_parameters.partial_rotary_factor", "(0, 1]");
}

// A field Phi-3 does not have (attention_bias is a Llama field) is unmapped.
TEST(Phi3Config, UnknownFieldIsUnmapped) {
  json c = Saved();
  c["mlp_bias"] = true;
  auto parsed = Family().ParseConfig(c);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->report.unmapped, std::vector<std::string>{"mlp_bias"});
}

// attention_bias is a field Phi3Attention never reads (docs/config-fields.md): false, as
// Phi-3-mini ships it, is ignored with that reason; true claims biases upstream never builds
// and is refused naming the field.
TEST(Phi3Config, AttentionBiasIsAnUnreadFlag) {
  json c = Saved();
  c["attention_bias"] = false;
  auto parsed = Family().ParseConfig(c);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->report.unmapped.empty());
  bool ignored = false;
  for (const auto& [field, why] : parsed->report.ignored) {
    if (field == "attention_bias") ignored = why.find("never builds") == std::string::npos &&
                                             why.find("without biases") != std::string::npos;
  }
  EXPECT_TRUE(ignored);
  c["attention_bias"] = true;
  auto refused = Family().ParseConfig(c);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("'attention_bias' = true"), std::string::npos)
      << refused.status().ToString();
}

// --- name table ---------------------------------------------------------------------------

// The adapter's expected HF names equal each transformers-saved checkpoint's keys exactly.
TEST(Phi3Adapter, ExpectedNamesEqualFixtureKeys) {
  for (const std::string& name : kFixtures) {
    if (!fs::exists(FixtureDir(name))) GTEST_SKIP() << name << " absent: run through ctest";
    test_util::ExpectAdapterNamesEqualFixtureKeys(Family(), name);
  }
}

// Every parameter maps to one HF name and back; the fused rows are qkv_proj and gate_up_proj.
TEST(Phi3Adapter, NameTableRoundTrip) {
  for (const bool tied : {false, true}) {
    json c = Saved();
    c["tie_word_embeddings"] = tied;
    auto parsed = Family().ParseConfig(c);
    ASSERT_TRUE(parsed.ok());
    auto model = Family().Construct(*parsed->args, torch::kFloat32, torch::kCPU);
    ASSERT_TRUE(model.ok());
    auto adapter = Family().Adapter(*parsed->args);
    ASSERT_TRUE(adapter.ok());
    std::set<std::string> hf_names;
    for (const auto& item : (*model)->named_parameters()) {
      auto hf = adapter->ToHf(item.key());
      ASSERT_TRUE(hf.ok()) << hf.status().ToString();
      auto back = adapter->ToInternal(*hf);
      ASSERT_TRUE(back.ok());
      EXPECT_EQ(*back, item.key());
      hf_names.insert(*hf);
    }
    const auto& expected = adapter->ExpectedHfNames();
    EXPECT_EQ(hf_names, std::set<std::string>(expected.begin(), expected.end()));
    EXPECT_EQ(hf_names.count("lm_head.weight"), tied ? 0u : 1u);
    EXPECT_EQ(*adapter->ToInternal("model.layers.1.self_attn.qkv_proj.weight"),
              "layers.1.attention.wqkv.weight");
    EXPECT_EQ(*adapter->ToInternal("model.layers.0.mlp.gate_up_proj.weight"),
              "layers.0.feed_forward.w13.weight");
    EXPECT_EQ(*adapter->ToInternal("model.layers.0.mlp.down_proj.weight"),
              "layers.0.feed_forward.w2.weight");
    EXPECT_FALSE(adapter->ToInternal("model.layers.0.self_attn.q_proj.weight").ok());
  }
}

// --- the model ----------------------------------------------------------------------------

// The fused projections split as Phi3Attention / Phi3MLP do: qkv rows are q (heads x
// head_dim), then k, then v; gate_up rows are gate, then up. A llama model given those row
// blocks as wq/wk/wv and w1/w3 computes the same logits.
TEST(Phi3Model, FusedSplitOrderMatchesSeparateProjections) {
  json c = Saved();
  c["rope_parameters"]["partial_rotary_factor"] = 1.0;
  c["pad_token_id"] = nullptr;
  auto phi3 = Build(Family(), c);
  const ModelFamily* llama_family = test_util::Registry().FindByName("llama");
  ASSERT_NE(llama_family, nullptr);
  auto llama = Build(*llama_family, json::parse(kLlamaTwin));
  ASSERT_TRUE(phi3 && llama);
  Randomize(*phi3, 5);
  {
    torch::NoGradGuard no_grad;
    auto src = phi3->named_parameters();
    constexpr int64_t kQ = 64, kKv = 32, kInter = 128;
    for (auto& item : llama->named_parameters()) {
      const std::string& name = item.key();
      torch::Tensor from;
      auto replace = [&](const std::string& part, const std::string& by) {
        std::string n = name;
        n.replace(n.find(part), part.size(), by);
        return src[n];
      };
      if (name.find("attention.wq.") != std::string::npos) {
        from = replace("wq.", "wqkv.").narrow(0, 0, kQ);
      } else if (name.find("attention.wk.") != std::string::npos) {
        from = replace("wk.", "wqkv.").narrow(0, kQ, kKv);
      } else if (name.find("attention.wv.") != std::string::npos) {
        from = replace("wv.", "wqkv.").narrow(0, kQ + kKv, kKv);
      } else if (name.find("feed_forward.w1.") != std::string::npos) {
        from = replace("w1.", "w13.").narrow(0, 0, kInter);
      } else if (name.find("feed_forward.w3.") != std::string::npos) {
        from = replace("w3.", "w13.").narrow(0, kInter, kInter);
      } else {
        from = src[name];
      }
      item.value().copy_(from);
    }
  }
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(3, 256, {2, 12}, torch::kLong);
  auto positions = torch::arange(12, torch::kLong).unsqueeze(0).expand({2, 12}).contiguous();
  auto a = phi3->Forward(tokens, positions, nullptr);
  auto b = llama->Forward(tokens, positions, nullptr);
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-5)) << (a - b).abs().max().item<float>();
}

// Partial rotary: with factor 0.5 only the first 8 of 16 channels of each head rotate, so the
// logits differ from full rotary with the same weights.
TEST(Phi3Model, PartialRotaryMatters) {
  json c = Saved();
  auto partial = Build(Family(), c);
  c["rope_parameters"]["partial_rotary_factor"] = 1.0;
  auto full = Build(Family(), c);
  ASSERT_TRUE(partial && full);
  Randomize(*partial, 9);
  {
    torch::NoGradGuard no_grad;
    auto src = partial->named_parameters();
    for (auto& item : full->named_parameters()) item.value().copy_(src[item.key()]);
  }
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(3, 256, {1, 20}, torch::kLong);
  auto positions = torch::arange(20, torch::kLong).unsqueeze(0);
  auto a = partial->Forward(tokens, positions, nullptr);
  auto b = full->Forward(tokens, positions, nullptr);
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 1), b.narrow(1, 0, 1)));  // position 0: no rotation
  EXPECT_GT((a - b).abs().max().item<float>(), 1e-3);
}

// Prefill + one-token steps + a chunk through the KV cache give the logits of one full
// forward pass (fp32, 1e-5): full attention with partial rotary, and a 16-token window over
// 40 tokens with factor 0.75.
TEST(Phi3Model, KVCacheDecodeMatchesFullForward) {
  for (const bool sliding : {false, true}) {
    json c = Saved();
    if (sliding) {
      c["sliding_window"] = 16;
      c["rope_parameters"]["partial_rotary_factor"] = 0.75;
    }
    auto model = Build(Family(), c);
    ASSERT_NE(model, nullptr);
    Randomize(*model, 11);
    test_util::ExpectKVCacheDecodeMatchesFullForward(
        *model,
        {.batch = 2, .prefill = 30, .steps = 6, .chunk = 4, .token_low = 3, .cache_capacity = 64},
        "sliding=" + std::to_string(sliding));
  }
}

}  // namespace
}  // namespace gatehouse::worker
