// models/decoder/name_table: for every feature a DecoderSpec switches on, the HF names the table
// expects equal the names transformers' save_pretrained writes for the same config (upstream
// builds and saves a tiny model), and the internal names equal DecoderModel's parameters.

#include "decoder/name_table.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "decoder/model.h"
#include "tests/models/decoder/tiny_spec.h"
#include "tests/models/decoder/upstream.h"

namespace gatehouse::models {
namespace {

using nlohmann::json;

/// One model shape, spelled twice: as a DecoderSpec and as the upstream config.json.
struct NameCase {
  std::string name;
  std::string model_type;
  json config;  // merged over TinyConfig()
  std::function<void(DecoderSpec&)> features;
};

std::vector<NameCase> Cases() {
  return {
      {"llama", "llama", json::object(), [](DecoderSpec&) {}},
      {"llama_tied", "llama", {{"tie_word_embeddings", true}},
       [](DecoderSpec& s) { s.tie_word_embeddings = true; }},
      {"llama_attention_and_mlp_bias", "llama", {{"attention_bias", true}, {"mlp_bias", true}},
       [](DecoderSpec& s) { s.qkv_bias = s.o_bias = s.mlp_bias = true; }},
      {"qwen2_qkv_bias", "qwen2", json::object(), [](DecoderSpec& s) { s.qkv_bias = true; }},
      {"qwen3_qk_norm", "qwen3", json::object(), [](DecoderSpec& s) { s.qk_norm = true; }},
      {"gemma2_sandwich_norms", "gemma2", {{"tie_word_embeddings", true}},
       [](DecoderSpec& s) {
         s.sandwich_norm = true;
         s.tie_word_embeddings = true;
       }},
      {"gemma3_sandwich_and_qk_norm", "gemma3_text", {{"tie_word_embeddings", true}},
       [](DecoderSpec& s) {
         s.sandwich_norm = s.qk_norm = s.tie_word_embeddings = true;
       }},
      {"phi3_fused", "phi3", json::object(),
       [](DecoderSpec& s) { s.fused_qkv = s.fused_gate_up = true; }},
      // Layer 0 dense, layer 1 sparse (decoder_sparse_step 2): both row kinds in one model.
      {"qwen3_moe_mixed_layers", "qwen3_moe",
       {{"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16},
        {"decoder_sparse_step", 2}},
       [](DecoderSpec& s) {
         s.qk_norm = true;
         s.num_experts = 4;
         s.num_experts_per_tok = 2;
         s.moe_intermediate_size = 16;
         s.layers[1].moe = true;
       }},
  };
}

DecoderSpec SpecOf(const NameCase& c) {
  DecoderSpec spec = test_util::TinySpec();
  spec.model_type = c.model_type;
  c.features(spec);
  return spec;
}

std::vector<std::string> Sorted(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  return names;
}

TEST(DecoderNameTable, ExpectedNamesEqualWhatTransformersSaves) {
  const auto cases = Cases();
  json requests = json::array();
  for (const auto& c : cases) {
    json config = test_util::TinyConfig();
    config.update(c.config);
    requests.push_back({{"model_type", c.model_type}, {"config", config}});
  }
  const json results = test_util::RunUpstream("keys", requests);
  ASSERT_EQ(results.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const DecoderSpec spec = SpecOf(cases[i]);
    ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
    auto adapter = MakeDecoderAdapter(spec);
    ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();
    EXPECT_EQ(Sorted(adapter->ExpectedHfNames()),
              results[i]["keys"].get<std::vector<std::string>>());
  }
}

TEST(DecoderNameTable, InternalNamesAreTheModelsParameters) {
  for (const auto& c : Cases()) {
    SCOPED_TRACE(c.name);
    const DecoderSpec spec = SpecOf(c);
    auto adapter = MakeDecoderAdapter(spec);
    ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();
    std::set<std::string> from_table;
    for (const auto& hf : adapter->ExpectedHfNames()) {
      auto internal = adapter->ToInternal(hf);
      ASSERT_TRUE(internal.ok()) << internal.status().ToString();
      from_table.insert(*internal);
    }
    DecoderModel model(spec);
    std::set<std::string> parameters;
    for (const auto& p : model.named_parameters()) parameters.insert(p.key());
    EXPECT_EQ(from_table, parameters);
  }
}

TEST(DecoderNameTable, EveryExpertIsOneSliceOfTheStackedParameter) {
  const auto cases = Cases();
  const auto& moe = cases.back();
  ASSERT_EQ(moe.name, "qwen3_moe_mixed_layers");
  auto adapter = MakeDecoderAdapter(SpecOf(moe));
  ASSERT_TRUE(adapter.ok());
  auto slices = adapter->HfSlices("layers.1.moe.experts.w3");
  ASSERT_TRUE(slices.ok()) << slices.status().ToString();
  ASSERT_EQ(slices->size(), 4u);
  for (int64_t e = 0; e < 4; ++e) {
    EXPECT_EQ((*slices)[e].hf, "model.layers.1.mlp.experts." + std::to_string(e) +
                                   ".up_proj.weight");
    EXPECT_EQ((*slices)[e].slice, e);
  }
  // The dense layer 0 keeps its plain MLP rows.
  EXPECT_EQ(*adapter->ToInternal("model.layers.0.mlp.up_proj.weight"),
            "layers.0.feed_forward.w3.weight");
}

TEST(DecoderNameTable, TiedModelsExpectNoLmHeadButAcceptOne) {
  DecoderSpec spec = test_util::TinySpec();
  spec.tie_word_embeddings = true;
  auto adapter = MakeDecoderAdapter(spec);
  ASSERT_TRUE(adapter.ok());
  const auto& names = adapter->ExpectedHfNames();
  EXPECT_EQ(std::count(names.begin(), names.end(), kLmHeadHfName), 0);
  EXPECT_TRUE(adapter->IsTiedAlias(kLmHeadHfName));
  // Sandwich norms: post_attention_layernorm is a real post-norm there, the pre-MLP norm
  // elsewhere.
  spec.sandwich_norm = true;
  auto sandwich = MakeDecoderAdapter(spec);
  ASSERT_TRUE(sandwich.ok());
  EXPECT_EQ(*sandwich->ToInternal("model.layers.0.post_attention_layernorm.weight"),
            "layers.0.attention_post_norm.weight");
  EXPECT_EQ(*adapter->ToInternal("model.layers.0.post_attention_layernorm.weight"),
            "layers.0.ffn_norm.weight");
}

}  // namespace
}  // namespace gatehouse::models
