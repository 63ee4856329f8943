// models/decoder/family: DecoderFamily (model_type check, the family's parser, spec validation,
// the config report, construction, adapter and TP plan from the parsed args) and the parsing
// every decoder family shares (ParseCoreFields, ReadLayerTypes).

#include "decoder/family.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/models/decoder/tiny_spec.h"

namespace gatehouse::models {
namespace {

using nlohmann::json;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Key;

/// The smallest family parser: the shared core fields and plain RoPE.
Result<DecoderSpec> ParseTiny(ConfigReader& reader) {
  DecoderSpec spec;
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, CoreDefaults{}, spec));
  GH_ASSIGN_OR_RETURN(RopeConfig rope, ParseRope(reader, 10000.0));
  spec.ropes = {rope};
  return spec;
}

const DecoderFamily& Tiny() {
  static const DecoderFamily family("tiny", {"tiny", "tiny_text"}, &ParseTiny);
  return family;
}

json Config() {
  json config = test_util::TinyConfig();
  config["model_type"] = "tiny";
  return config;
}

/// ParseCoreFields over `config` with `defaults`.
Result<DecoderSpec> Core(const json& config, CoreDefaults defaults = {}) {
  ConfigReader reader(config);
  DecoderSpec spec;
  GH_RETURN_IF_ERROR(ParseCoreFields(reader, defaults, spec));
  return spec;
}

TEST(DecoderFamily, ParsesValidatesAndAccountsForTheConfig) {
  json config = Config();
  config["transformers_version"] = "5.0.0";
  config["my_scale"] = 2.0;
  auto parsed = Tiny().ParseConfig(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->args->num_hidden_layers(), 2);
  EXPECT_EQ(parsed->args->head_dim(), 8);
  EXPECT_EQ(parsed->args->ToJson()["hidden_size"], 32);
  EXPECT_THAT(parsed->report.mapped, Contains("num_key_value_heads"));
  EXPECT_THAT(parsed->report.ignored, Contains(Key("transformers_version")));
  EXPECT_EQ(parsed->report.unmapped, std::vector<std::string>{"my_scale"});
}

TEST(DecoderFamily, RefusesOtherModelTypesAndInvalidSpecsNamingTheField) {
  json other = Config();
  other["model_type"] = "gpt2";
  EXPECT_EQ(Tiny().ParseConfig(other).status().message(),
            "config field 'model_type' = \"gpt2\": the tiny family serves \"tiny\", \"tiny_text\"");
  json second = Config();
  second["model_type"] = "tiny_text";
  EXPECT_TRUE(Tiny().ParseConfig(second).ok());
  json groups = Config();
  groups["num_key_value_heads"] = 3;
  EXPECT_THAT(Tiny().ParseConfig(groups).status().message(),
              HasSubstr("'num_attention_heads' = 4 is not a multiple of 'num_key_value_heads' = 3"));
  EXPECT_THAT(Tiny().ParseConfig(json::array()).status().message(),
              HasSubstr("must be a JSON object"));
}

TEST(DecoderFamily, ConstructsAdaptsAndPlansFromItsOwnArgs) {
  auto parsed = Tiny().ParseConfig(Config());
  ASSERT_TRUE(parsed.ok());
  auto model = Tiny().Construct(*parsed->args, torch::kBFloat16, torch::kCPU);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  for (const auto& p : (*model)->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  auto adapter = Tiny().Adapter(*parsed->args);
  ASSERT_TRUE(adapter.ok());
  EXPECT_EQ(*adapter->ToInternal("model.layers.1.self_attn.o_proj.weight"),
            "layers.1.attention.wo.weight");
  EXPECT_TRUE(Tiny().Parallelize(*parsed->args, 2).ok());
  EXPECT_THAT(Tiny().Parallelize(*parsed->args, 3).status().message(),
              HasSubstr("'num_attention_heads' = 4 is not divisible"));
  EXPECT_EQ(Tiny().ConstructParallel(*parsed->args, torch::kFloat32, torch::kCPU,
                                     worker::TensorParallel{0, 2, nullptr})
                .status()
                .message(),
            "tensor-parallel size > 1 without a communicator");
}

// Under SkipWeightInit the family builds the parameters in the requested dtype without drawing
// any init (the RNG stream is untouched); without it, the init draws from the stream.
TEST(DecoderFamily, SkipWeightInitDrawsNoInit) {
  auto parsed = Tiny().ParseConfig(Config());
  ASSERT_TRUE(parsed.ok());
  torch::manual_seed(7);
  const torch::Tensor first_draw = torch::rand({8});
  torch::manual_seed(7);
  {
    const worker::SkipWeightInit skip;
    EXPECT_TRUE(worker::WeightInitSkipped());
    auto model = Tiny().Construct(*parsed->args, torch::kBFloat16, torch::kCPU);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    for (const auto& p : (*model)->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(worker::WeightInitSkipped());
  EXPECT_TRUE(torch::equal(torch::rand({8}), first_draw));
  torch::manual_seed(7);
  ASSERT_TRUE(Tiny().Construct(*parsed->args, torch::kBFloat16, torch::kCPU).ok());
  EXPECT_FALSE(torch::equal(torch::rand({8}), first_draw));
}

TEST(DecoderFamily, RefusesArgsOfAnotherFamily) {
  class OtherArgs : public worker::ModelArgs {
   public:
    json ToJson() const override { return json::object(); }
    int64_t vocab_size() const override { return 1; }
    int64_t num_hidden_layers() const override { return 1; }
    int64_t num_key_value_heads() const override { return 1; }
    int64_t head_dim() const override { return 2; }
    int64_t max_position_embeddings() const override { return 1; }
    bool tie_word_embeddings() const override { return false; }
  } other;
  const std::string error = "the tiny family was given model args of another family";
  EXPECT_EQ(Tiny().Construct(other, torch::kFloat32, torch::kCPU).status().message(), error);
  EXPECT_EQ(Tiny().Adapter(other).status().message(), error);
  EXPECT_EQ(Tiny().Parallelize(other, 1).status().message(), error);
}

TEST(ParseCoreFields, DefaultsAreTheConfigClassDefaults) {
  json config = Config();
  config.erase("num_key_value_heads");
  config.erase("head_dim");
  config.erase("tie_word_embeddings");
  auto spec = Core(config, CoreDefaults{.tie_word_embeddings = true});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->num_key_value_heads, 4);  // = num_attention_heads (multi-head attention)
  EXPECT_EQ(spec->head_dim, 8);             // = hidden_size / num_attention_heads
  EXPECT_TRUE(spec->tie_word_embeddings);
  EXPECT_EQ(spec->hidden_act, Activation::kSilu);
  EXPECT_DOUBLE_EQ(spec->attention_scaling, 1.0 / std::sqrt(8.0));
  EXPECT_EQ(spec->layers.size(), 2u);
  EXPECT_FALSE(spec->pad_token_id.has_value());
  EXPECT_EQ(spec->model_type, "tiny");
}

TEST(ParseCoreFields, GivenHeadDimWinsOverHiddenSizeOverHeads) {
  json config = Config();
  config["head_dim"] = 16;  // hidden 32 / 4 heads would give 8 (Qwen3 and Gemma do this)
  auto spec = Core(config);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->head_dim, 16);
  EXPECT_DOUBLE_EQ(spec->attention_scaling, 0.25);
}

TEST(ParseCoreFields, MissingOrImpossibleFieldsAreNamed) {
  json no_head_dim = Config();
  no_head_dim.erase("head_dim");
  EXPECT_EQ(Core(no_head_dim, CoreDefaults{.head_dim_optional = false}).status().message(),
            "config field 'head_dim' is required but missing");
  json uneven = no_head_dim;
  uneven["num_attention_heads"] = 5;
  EXPECT_EQ(Core(uneven).status().message(),
            "config field 'hidden_size' = 32: is not a multiple of num_attention_heads = 5 and "
            "head_dim is not given");
  json zero_heads = Config();
  zero_heads["num_attention_heads"] = 0;
  EXPECT_EQ(Core(zero_heads).status().message(),
            "config field 'num_attention_heads' = 0: must be positive");
  json no_vocab = Config();
  no_vocab.erase("vocab_size");
  EXPECT_EQ(Core(no_vocab).status().message(), "config field 'vocab_size' is required but missing");
}

TEST(ParseCoreFields, ActivationFieldAndValueFollowTheFamily) {
  const CoreDefaults gemma{.activation_field = "hidden_activation",
                           .activation = Activation::kGeluTanh};
  json config = Config();
  auto absent = Core(config, gemma);
  ASSERT_TRUE(absent.ok());
  EXPECT_EQ(absent->hidden_act, Activation::kGeluTanh);
  config["hidden_activation"] = "silu";
  EXPECT_THAT(Core(config, gemma).status().message(),
              HasSubstr("'hidden_activation' = \"silu\": unsupported value"));
  json llama = Config();
  llama["hidden_act"] = "gelu";
  EXPECT_THAT(Core(llama).status().message(), HasSubstr("'hidden_act' = \"gelu\""));
}

TEST(ReadLayerTypes, GivenListOrTheDerivedOne) {
  const std::vector<std::string> derived = {"full_attention", "sliding_attention"};
  json config = Config();
  {
    ConfigReader reader(config);
    EXPECT_EQ(*ReadLayerTypes(reader, 2, derived), derived);
  }
  config["layer_types"] = {"sliding_attention", "sliding_attention"};
  {
    ConfigReader reader(config);
    EXPECT_EQ(*ReadLayerTypes(reader, 2, derived),
              (std::vector<std::string>{"sliding_attention", "sliding_attention"}));
    EXPECT_THAT(reader.Report().mapped, Contains("layer_types"));
  }
  config["layer_types"] = {"full_attention"};
  {
    ConfigReader reader(config);
    EXPECT_THAT(ReadLayerTypes(reader, 2, derived).status().message(),
                HasSubstr("expected a list of num_hidden_layers = 2 layer types"));
  }
  config["layer_types"] = {"full_attention", "chunked_attention"};
  {
    ConfigReader reader(config);
    EXPECT_EQ(ReadLayerTypes(reader, 2, derived).status().message(),
              "config field 'layer_types[1]' = \"chunked_attention\": expected "
              "\"full_attention\" or \"sliding_attention\"");
  }
}

}  // namespace
}  // namespace gatehouse::models
