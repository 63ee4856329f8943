// Tests of the qwen3_moe family (models/qwen3_moe), reached only through the plugin entry
// point and the SDK interfaces, as the worker reaches it. Parity against transformers is
// checked by families_test and tools/parity; these check the family's own contracts: config
// accounting (both spellings of num_experts, the router-loss fields), which layers are sparse,
// the per-expert name table against the transformers-saved checkpoints, and the MoE block's
// computation (one expert = a dense SwiGLU MLP; KV-cache decode = full forward).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
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

// config.json as transformers 5.24 Qwen3MoeForCausalLM.save_pretrained wrote it for the
// qwen3_moe-tiny-untied fixture (tools/refgen/families/qwen3_moe.py): note num_local_experts.
constexpr const char* kSaved = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "decoder_sparse_step": 2, "dtype": "float32", "eos_token_id": 2,
  "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
  "intermediate_size": 128, "max_position_embeddings": 512, "mlp_only_layers": [],
  "model_type": "qwen3_moe", "moe_intermediate_size": 32, "norm_topk_prob": true,
  "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 4,
  "num_key_value_heads": 2, "num_local_experts": 8, "output_router_logits": false,
  "pad_token_id": null, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
  "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
  "transformers_version": "5.24.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 256
})";

const std::vector<std::string> kFixtures = {"qwen3_moe-tiny-untied", "qwen3_moe-tiny-tied",
                                            "qwen3_moe-tiny-sharded", "qwen3_moe-tiny-sliding"};

const ModelFamily& Family() { return test_util::FamilyByModelType("qwen3_moe"); }

json Saved() { return json::parse(kSaved); }

json SpecOf(const json& config) {
  auto parsed = Family().ParseConfig(config);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? parsed->args->ToJson() : json();
}

/// Which layers are sparse MoE blocks.
std::vector<bool> MoeLayers(const json& config) {
  std::vector<bool> out;
  const json spec = SpecOf(config);
  if (!spec.contains("layers")) return out;
  for (const auto& l : spec["layers"]) out.push_back(l["moe"].get<bool>());
  return out;
}

void ExpectRejected(const json& config, const std::string& field, const std::string& needle) {
  const Status s = Family().ParseConfig(config).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
  EXPECT_NE(s.message().find("'" + field + "'"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
}

std::shared_ptr<CausalLM> Build(const json& config) {
  auto parsed = Family().ParseConfig(config);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  if (!parsed.ok()) return nullptr;
  auto model = Family().Construct(*parsed->args, torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? *model : nullptr;
}

/// Re-draws every weight at unit activation scale: norms U(0.5, 1.5), 2-D weights
/// N(0, 1/fan_in), stacked experts [E, out, in] N(0, 1/in).
void Randomize(CausalLM& model, uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.dim() == 1) {
      p.uniform_(0.5, 1.5);
    } else {
      p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(-1))));
    }
  }
}

// --- registration -------------------------------------------------------------------------

// The plugin registers a family named "qwen3_moe" serving model_type "qwen3_moe".
TEST(Qwen3MoePlugin, Registered) {
  EXPECT_EQ(gatehouse_plugin_abi_version(), kPluginAbiVersion);
  EXPECT_EQ(Family().name(), "qwen3_moe");
  EXPECT_EQ(Family().model_types(), std::vector<std::string>{"qwen3_moe"});
}

// --- config -------------------------------------------------------------------------------

// Every field of the saved config is mapped or ignored (the router-loss fields ignored with
// reasons); the MoE settings land in the spec.
TEST(Qwen3MoeConfig, SavedConfigFullyAccounted) {
  const json config = Saved();
  auto parsed = Family().ParseConfig(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const ConfigReport& report = parsed->report;
  const std::set<std::string> ignored = test_util::ExpectConfigFullyAccounted(report, config);
  EXPECT_TRUE(ignored.count("output_router_logits"));
  EXPECT_TRUE(ignored.count("router_aux_loss_coef"));
  for (const char* f : {"num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                        "use_sliding_window", "sliding_window", "attention_bias", "head_dim"}) {
    EXPECT_TRUE(std::find(report.mapped.begin(), report.mapped.end(), f) != report.mapped.end())
        << f;
  }

  const json spec = parsed->args->ToJson();
  EXPECT_EQ(spec["num_experts"], 8);
  EXPECT_EQ(spec["num_experts_per_tok"], 2);
  EXPECT_EQ(spec["moe_intermediate_size"], 32);
  EXPECT_EQ(spec["norm_topk_prob"], true);
  EXPECT_EQ(spec["qk_norm"], true);
  EXPECT_EQ(spec["qkv_bias"], false);
  EXPECT_EQ(spec["ropes"][0]["rope_theta"].get<double>(), 50000.0);
  EXPECT_EQ(MoeLayers(config), (std::vector<bool>{false, true, false, true}));
}

// The configs the testdata fixture wrote parse with nothing unmapped, with the layer pattern
// and window each variant was made with.
TEST(Qwen3MoeConfig, FixtureConfigsFullyAccounted) {
  const std::map<std::string, std::vector<bool>> moe = {
      {"qwen3_moe-tiny-untied", {false, true, false, true}},
      {"qwen3_moe-tiny-tied", {false, true, true, true}},
      {"qwen3_moe-tiny-sharded", {false, true, false, true}},
      {"qwen3_moe-tiny-sliding", {true, true, true, true}}};
  for (const std::string& name : kFixtures) {
    if (!fs::exists(FixtureDir(name))) GTEST_SKIP() << name << " absent: run through ctest";
    const json config = FixtureConfig(name);
    auto parsed = Family().ParseConfig(config);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().ToString();
    EXPECT_TRUE(parsed->report.unmapped.empty()) << name << ": " << json(parsed->report.unmapped);
    EXPECT_EQ(parsed->report.mapped.size() + parsed->report.ignored.size(), config.size()) << name;
    EXPECT_EQ(MoeLayers(config), moe.at(name)) << name;
    for (const auto& l : parsed->args->ToJson()["layers"]) {
      EXPECT_EQ(l["sliding_window"], name == "qwen3_moe-tiny-sliding" ? 16 : 0) << name;
    }
  }
}

// num_experts (hub spelling) and num_local_experts (saved spelling) are the same attribute:
// either alone works, both equal works, both different is rejected naming them.
TEST(Qwen3MoeConfig, NumExpertsSpellings) {
  json hub = Saved();
  hub.erase("num_local_experts");
  hub["num_experts"] = 8;
  EXPECT_EQ(SpecOf(hub)["num_experts"], 8);
  json both = Saved();
  both["num_experts"] = 8;
  EXPECT_EQ(SpecOf(both)["num_experts"], 8);
  both["num_experts"] = 6;
  ExpectRejected(both, "num_local_experts", "disagrees with num_experts = 6");
}

// num_key_value_heads absent is Qwen3MoeConfig's default 4, not num_attention_heads.
TEST(Qwen3MoeConfig, KeyValueHeadsDefault) {
  json config = Saved();
  config["num_attention_heads"] = 8;
  config.erase("num_key_value_heads");
  EXPECT_EQ(SpecOf(config)["num_key_value_heads"], 4);
}

// Layer l is sparse iff l not in mlp_only_layers and num_experts > 0 and
// (l + 1) % decoder_sparse_step == 0 (Qwen3MoeDecoderLayer).
TEST(Qwen3MoeConfig, SparseLayerSelection) {
  json c = Saved();
  c["decoder_sparse_step"] = 1;
  EXPECT_EQ(MoeLayers(c), (std::vector<bool>{true, true, true, true}));
  c["mlp_only_layers"] = {0, 2};
  EXPECT_EQ(MoeLayers(c), (std::vector<bool>{false, true, false, true}));
  c["decoder_sparse_step"] = 3;
  c["mlp_only_layers"] = json::array();
  EXPECT_EQ(MoeLayers(c), (std::vector<bool>{false, false, true, false}));
  c["decoder_sparse_step"] = 2;
  c["mlp_only_layers"] = {3, 17};  // an index past the layers matches nothing, as upstream
  EXPECT_EQ(MoeLayers(c), (std::vector<bool>{false, true, false, false}));
  c["num_local_experts"] = 0;
  EXPECT_EQ(MoeLayers(c), (std::vector<bool>{false, false, false, false}));
  // Absent: Qwen3MoeConfig defaults (128 experts, top-8, step 1).
  json d = Saved();
  for (const char* f : {"num_local_experts", "num_experts_per_tok", "decoder_sparse_step",
                        "mlp_only_layers", "moe_intermediate_size", "norm_topk_prob"}) {
    d.erase(f);
  }
  const json spec = SpecOf(d);
  EXPECT_EQ(spec["num_experts"], 128);
  EXPECT_EQ(spec["num_experts_per_tok"], 8);
  EXPECT_EQ(spec["moe_intermediate_size"], 768);
  EXPECT_EQ(spec["norm_topk_prob"], false);
  EXPECT_EQ(MoeLayers(d), (std::vector<bool>{true, true, true, true}));
}

// The window applies only with use_sliding_window (Qwen3MoeConfig.__post_init__ nulls it).
TEST(Qwen3MoeConfig, SlidingWindowNeedsUseSlidingWindow) {
  json c = Saved();
  c["sliding_window"] = 16;
  for (const auto& l : SpecOf(c)["layers"]) EXPECT_EQ(l["sliding_window"], 0);
  c["use_sliding_window"] = true;
  for (const auto& l : SpecOf(c)["layers"]) EXPECT_EQ(l["sliding_window"], 16);
}

// The router-loss fields are ignored either way; with output_router_logits true the reason
// says the auxiliary loss is not reproduced.
TEST(Qwen3MoeConfig, RouterLossFieldsIgnoredWithReason) {
  json c = Saved();
  c["output_router_logits"] = true;
  auto parsed = Family().ParseConfig(c);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  bool found = false;
  for (const auto& [field, reason] : parsed->report.ignored) {
    if (field != "output_router_logits") continue;
    found = true;
    EXPECT_NE(reason.find("does not reproduce"), std::string::npos) << reason;
  }
  EXPECT_TRUE(found);
}

// A missing required field is INVALID_ARGUMENT naming it.
TEST(Qwen3MoeConfig, MissingRequiredFieldIsNamed) {
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "max_position_embeddings", "rms_norm_eps"}) {
    json c = Saved();
    c.erase(field);
    const Status s = Family().ParseConfig(c).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(std::string("'") + field + "'"), std::string::npos) << s.ToString();
  }
}

// Values the family cannot honour are rejected naming field and value.
TEST(Qwen3MoeConfig, UnsupportedValuesRejected) {
  auto with = [](const char* field, json value) {
    json c = Saved();
    c[field] = std::move(value);
    return c;
  };
  ExpectRejected(with("decoder_sparse_step", 0), "decoder_sparse_step", "must be >= 1");
  ExpectRejected(with("num_experts_per_tok", 9), "num_experts_per_tok", "num_experts = 8");
  ExpectRejected(with("hidden_act", "gelu"), "hidden_act", "gelu");
  ExpectRejected(with("mlp_only_layers", json{0, "x"}), "mlp_only_layers[1]",
                 "expected an integer");
  ExpectRejected(with("mlp_only_layers", 3), "mlp_only_layers", "expected a list");
  ExpectRejected(with("rope_parameters", json{{"rope_type", "yarn"}, {"factor", 4.0}}),
                 "rope_parameters.rope_type", "yarn");
  json window = with("use_sliding_window", true);
  window["sliding_window"] = 0;
  ExpectRejected(window, "sliding_window", "must be positive");
}

// A field the family does not know is unmapped (the config gate fails on it).
TEST(Qwen3MoeConfig, UnknownFieldIsUnmapped) {
  json c = Saved();
  c["shared_expert_intermediate_size"] = 64;  // Qwen2-MoE's shared expert: not in Qwen3-MoE
  auto parsed = Family().ParseConfig(c);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->report.unmapped, std::vector<std::string>{"shared_expert_intermediate_size"});
}

// --- name table ---------------------------------------------------------------------------

// The adapter's expected HF names equal each transformers-saved checkpoint's keys exactly
// (per-expert keys included; no lm_head in the tied one).
TEST(Qwen3MoeAdapter, ExpectedNamesEqualFixtureKeys) {
  for (const std::string& name : kFixtures) {
    if (!fs::exists(FixtureDir(name))) GTEST_SKIP() << name << " absent: run through ctest";
    auto ckpt = test_util::ExpectAdapterNamesEqualFixtureKeys(Family(), name);
    ASSERT_TRUE(ckpt.has_value()) << name;
    const auto keys = ckpt->Keys();
    EXPECT_TRUE(std::count(keys.begin(), keys.end(), "model.layers.1.mlp.experts.7.down_proj.weight"))
        << name;
  }
}

// Every parameter of a constructed model maps to its HF tensors and back: a stacked expert
// parameter to one HF name per slice of its dim 0, everything else to one name; together they
// are exactly the expected names.
TEST(Qwen3MoeAdapter, NameTableRoundTrip) {
  for (const bool tied : {false, true}) {
    json c = Saved();
    c["tie_word_embeddings"] = tied;
    c["attention_bias"] = true;
    auto parsed = Family().ParseConfig(c);
    ASSERT_TRUE(parsed.ok());
    auto model = Family().Construct(*parsed->args, torch::kFloat32, torch::kCPU);
    ASSERT_TRUE(model.ok());
    auto adapter = Family().Adapter(*parsed->args);
    ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();
    std::set<std::string> hf_names;
    int64_t stacked = 0;
    for (const auto& item : (*model)->named_parameters()) {
      auto slices = adapter->HfSlices(item.key());
      ASSERT_TRUE(slices.ok()) << slices.status().ToString();
      if (slices->front().slice >= 0) {
        ++stacked;
        EXPECT_EQ(static_cast<int64_t>(slices->size()), item.value().size(0)) << item.key();
      }
      for (const auto& s : *slices) {
        auto back = adapter->Resolve(s.hf);
        ASSERT_TRUE(back.ok());
        EXPECT_EQ(back->internal, item.key());
        EXPECT_EQ(back->slice, s.slice);
        EXPECT_TRUE(hf_names.insert(s.hf).second) << s.hf;
      }
    }
    EXPECT_EQ(stacked, 2 * 3);  // 2 sparse layers x {w1, w2, w3}
    const auto& expected = adapter->ExpectedHfNames();
    EXPECT_EQ(hf_names, std::set<std::string>(expected.begin(), expected.end()));
    EXPECT_EQ(hf_names.count("lm_head.weight"), tied ? 0u : 1u);
    EXPECT_EQ(hf_names.count("model.layers.2.self_attn.o_proj.bias"), 1u);
  }
}

// Spot checks of the rows against transformers' names: gate/up/down of expert e are slices e
// of w1/w3/w2; the router is mlp.gate; dense layers keep mlp.{gate,up,down}_proj.
TEST(Qwen3MoeAdapter, KnownNames) {
  auto parsed = Family().ParseConfig(Saved());
  ASSERT_TRUE(parsed.ok());
  auto adapter = Family().Adapter(*parsed->args);
  ASSERT_TRUE(adapter.ok());
  struct Row {
    const char* hf;
    const char* internal;
    int64_t slice;
  };
  for (const Row& r : {Row{"model.layers.1.mlp.experts.5.gate_proj.weight", "layers.1.moe.experts.w1", 5},
                       Row{"model.layers.3.mlp.experts.0.up_proj.weight", "layers.3.moe.experts.w3", 0},
                       Row{"model.layers.1.mlp.experts.7.down_proj.weight", "layers.1.moe.experts.w2", 7},
                       Row{"model.layers.3.mlp.gate.weight", "layers.3.moe.router.weight", -1},
                       Row{"model.layers.0.mlp.gate_proj.weight", "layers.0.feed_forward.w1.weight", -1},
                       Row{"model.layers.2.mlp.down_proj.weight", "layers.2.feed_forward.w2.weight", -1},
                       Row{"model.layers.2.self_attn.q_norm.weight", "layers.2.attention.q_norm.weight", -1}}) {
    auto slot = adapter->Resolve(r.hf);
    ASSERT_TRUE(slot.ok()) << r.hf;
    EXPECT_EQ(slot->internal, r.internal) << r.hf;
    EXPECT_EQ(slot->slice, r.slice) << r.hf;
  }
  EXPECT_FALSE(adapter->Resolve("model.layers.0.mlp.experts.0.gate_proj.weight").ok());  // dense
  EXPECT_FALSE(adapter->Resolve("model.layers.1.mlp.experts.8.gate_proj.weight").ok());  // E = 8
}

// --- the model ----------------------------------------------------------------------------

// Parameter shapes: router [E, H], experts w1/w3 [E, I_moe, H] and w2 [E, H, I_moe] on sparse
// layers, dense MLPs of intermediate_size on the others.
TEST(Qwen3MoeModel, ParameterShapes) {
  auto model = Build(Saved());
  ASSERT_NE(model, nullptr);
  auto params = model->named_parameters();
  EXPECT_EQ(params["layers.1.moe.router.weight"].sizes(), (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(params["layers.1.moe.experts.w1"].sizes(), (std::vector<int64_t>{8, 32, 64}));
  EXPECT_EQ(params["layers.3.moe.experts.w3"].sizes(), (std::vector<int64_t>{8, 32, 64}));
  EXPECT_EQ(params["layers.3.moe.experts.w2"].sizes(), (std::vector<int64_t>{8, 64, 32}));
  EXPECT_EQ(params["layers.0.feed_forward.w1.weight"].sizes(), (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(params.find("layers.0.moe.router.weight"), nullptr);
  EXPECT_EQ(params.find("layers.1.feed_forward.w1.weight"), nullptr);
}

// With one expert, top-1 and renormalised probabilities (weight exactly 1), a sparse layer is
// the dense SwiGLU MLP with gate = w1[0], up = w3[0], down = w2[0]: logits equal a model whose
// layers are dense (mlp_only_layers) with the same weights.
TEST(Qwen3MoeModel, SingleExpertEqualsDenseMlp) {
  json c = Saved();
  c["num_local_experts"] = 1;
  c["num_experts_per_tok"] = 1;
  c["norm_topk_prob"] = true;
  c["decoder_sparse_step"] = 1;
  c["intermediate_size"] = 32;  // = moe_intermediate_size, for the dense twin
  auto moe = Build(c);
  c["mlp_only_layers"] = {0, 1, 2, 3};
  auto dense = Build(c);
  ASSERT_TRUE(moe && dense);
  Randomize(*moe, 7);
  {
    torch::NoGradGuard no_grad;
    auto src = moe->named_parameters();
    for (auto& item : dense->named_parameters()) {
      std::string name = item.key();
      torch::Tensor from;
      if (auto* t = src.find(name)) {
        from = *t;
      } else {
        // layers.L.feed_forward.wN.weight <- layers.L.moe.experts.wN[0]
        const auto pos = name.find("feed_forward.");
        ASSERT_NE(pos, std::string::npos) << name;
        const std::string w = name.substr(pos + 13, 2);
        from = src[name.substr(0, pos) + "moe.experts." + w][0];
      }
      item.value().copy_(from);
    }
  }
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(3, 256, {2, 9}, torch::kLong);
  auto positions = torch::arange(9, torch::kLong).unsqueeze(0).expand({2, 9}).contiguous();
  auto a = moe->Forward(tokens, positions, nullptr);
  auto b = dense->Forward(tokens, positions, nullptr);
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-5)) << (a - b).abs().max().item<float>();
}

// norm_topk_prob changes the output (renormalised top-k weights vs raw softmax weights).
TEST(Qwen3MoeModel, NormTopkProbMatters) {
  json c = Saved();
  auto normed = Build(c);
  c["norm_topk_prob"] = false;
  auto raw = Build(c);
  ASSERT_TRUE(normed && raw);
  Randomize(*normed, 3);
  {
    torch::NoGradGuard no_grad;
    auto src = normed->named_parameters();
    for (auto& item : raw->named_parameters()) item.value().copy_(src[item.key()]);
  }
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(3, 256, {1, 6}, torch::kLong);
  auto positions = torch::arange(6, torch::kLong).unsqueeze(0);
  auto a = normed->Forward(tokens, positions, nullptr);
  auto b = raw->Forward(tokens, positions, nullptr);
  EXPECT_GT((a - b).abs().max().item<float>(), 1e-3);
}

// Prefill + one-token steps + a chunk through the KV cache give the logits of one full
// forward pass (fp32, 1e-5), with MoE layers, and with a 16-token window over 40 tokens.
TEST(Qwen3MoeModel, KVCacheDecodeMatchesFullForward) {
  for (const bool sliding : {false, true}) {
    json c = Saved();
    if (sliding) {
      c["use_sliding_window"] = true;
      c["sliding_window"] = 16;
    }
    auto model = Build(c);
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
