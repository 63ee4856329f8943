// Tests of StateDictAdapter's stacked rows (TensorNameRule::num_experts: one HF tensor per
// expert, one [E, ...] parameter inside) and of how LoadStateDict and the save gate use them:
// each expert's tensor goes into its slice, a missing expert is named by its key, and the
// saved checkpoint holds the same per-expert keys and reloads bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "gatehouse/worker/checkpoint.h"
#include "gatehouse/worker/gates.h"
#include "gatehouse/worker/model_family.h"
#include "gatehouse/worker/safetensors_torch.h"
#include "gatehouse/worker/state_dict_adapter.h"
#include "tests/common/temp_dir.h"

namespace gatehouse::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using test_util::TempDir;

// --- the adapter --------------------------------------------------------------------------

/// A MoE-like table: one unstacked per-layer row, one stacked per-layer row (3 experts), one
/// stacked model-wide row (2 experts), and a tied lm_head.
std::vector<TensorNameRule> MoeRules() {
  return {
      {"model.embed_tokens.weight", "tok_embeddings.weight", false},
      {"model.layers.{layer}.mlp.gate.weight", "layers.{layer}.moe.router.weight", true},
      {"model.layers.{layer}.mlp.experts.{expert}.up_proj.weight", "layers.{layer}.moe.experts.w3",
       true, 3},
      {"shared.{expert}.weight", "shared.w", false, 2},
      {"lm_head.weight", "output.weight", false},
  };
}

// "{layer}" then "{expert}" expand in table order; every HF name resolves to its slot.
TEST(StateDictAdapterTest, StackedRowsExpandPerExpert) {
  auto a = StateDictAdapter::Create(MoeRules(), 2, /*tie_word_embeddings=*/false, "lm_head.weight");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_THAT(a->ExpectedHfNames(),
              ElementsAre("model.embed_tokens.weight", "model.layers.0.mlp.gate.weight",
                          "model.layers.1.mlp.gate.weight",
                          "model.layers.0.mlp.experts.0.up_proj.weight",
                          "model.layers.0.mlp.experts.1.up_proj.weight",
                          "model.layers.0.mlp.experts.2.up_proj.weight",
                          "model.layers.1.mlp.experts.0.up_proj.weight",
                          "model.layers.1.mlp.experts.1.up_proj.weight",
                          "model.layers.1.mlp.experts.2.up_proj.weight", "shared.0.weight",
                          "shared.1.weight", "lm_head.weight"));

  auto slot = a->Resolve("model.layers.1.mlp.experts.2.up_proj.weight");
  ASSERT_TRUE(slot.ok()) << slot.status().ToString();
  EXPECT_EQ(slot->internal, "layers.1.moe.experts.w3");
  EXPECT_EQ(slot->slice, 2);
  auto whole = a->Resolve("model.layers.0.mlp.gate.weight");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->internal, "layers.0.moe.router.weight");
  EXPECT_EQ(whole->slice, -1);

  // ToInternal names the stacked parameter an expert belongs to.
  auto internal = a->ToInternal("shared.1.weight");
  ASSERT_TRUE(internal.ok());
  EXPECT_EQ(*internal, "shared.w");
}

// HfSlices lists a stacked parameter's HF names in slice order, an unstacked one's single name
// with slice -1; ToHf works for unstacked names and refuses stacked ones.
TEST(StateDictAdapterTest, InverseLookups) {
  auto a = StateDictAdapter::Create(MoeRules(), 2, false, "lm_head.weight");
  ASSERT_TRUE(a.ok());
  auto slices = a->HfSlices("layers.0.moe.experts.w3");
  ASSERT_TRUE(slices.ok()) << slices.status().ToString();
  ASSERT_EQ(slices->size(), 3u);
  for (int64_t e = 0; e < 3; ++e) {
    EXPECT_EQ((*slices)[e].hf, "model.layers.0.mlp.experts." + std::to_string(e) + ".up_proj.weight");
    EXPECT_EQ((*slices)[e].slice, e);
  }
  auto single = a->HfSlices("layers.1.moe.router.weight");
  ASSERT_TRUE(single.ok());
  ASSERT_EQ(single->size(), 1u);
  EXPECT_EQ((*single)[0].hf, "model.layers.1.mlp.gate.weight");
  EXPECT_EQ((*single)[0].slice, -1);

  auto hf = a->ToHf("output.weight");
  ASSERT_TRUE(hf.ok());
  EXPECT_EQ(*hf, "lm_head.weight");
  auto stacked = a->ToHf("shared.w");
  EXPECT_EQ(stacked.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(stacked.status().message(), HasSubstr("'shared.w' is stacked over 2"));

  EXPECT_EQ(a->Resolve("model.layers.0.mlp.experts.3.up_proj.weight").status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(a->HfSlices("layers.2.moe.experts.w3").status().code(), StatusCode::kNotFound);
  EXPECT_THAT(a->HfSlices("nope").status().message(), HasSubstr("'nope'"));
}

// A tied model drops the lm_head row and reports the name as the tied alias.
TEST(StateDictAdapterTest, TiedAliasDropped) {
  auto a = StateDictAdapter::Create(MoeRules(), 1, /*tie_word_embeddings=*/true, "lm_head.weight");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ExpectedHfNames().back(), "shared.1.weight");
  EXPECT_TRUE(a->IsTiedAlias("lm_head.weight"));
  EXPECT_EQ(a->Resolve("lm_head.weight").status().code(), StatusCode::kNotFound);
}

// Every way a table can map a name twice, or misuse {expert}, is INVALID_ARGUMENT naming it.
TEST(StateDictAdapterTest, MalformedTablesRejected) {
  struct Case {
    std::vector<TensorNameRule> rules;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {{{"a.weight", "x", false}, {"a.weight", "y", false}}, "HF name 'a.weight' twice"},
      {{{"a.weight", "x", false}, {"b.weight", "x", false}}, "internal name 'x' twice"},
      {{{"e.{expert}.w", "x", false, 2}, {"f.{expert}.w", "x", false, 2}},
       "internal name 'x[0]' twice"},
      {{{"e.{expert}.w", "x", false, 2}, {"b.weight", "x", false}},
       "'x' both as a stacked parameter and as a whole one"},
      {{{"e.{expert}.w", "x", false, 2}, {"e.1.w", "y", false}}, "HF name 'e.1.w' twice"},
      {{{"e.{expert}.w", "x", false, 0}}, "has {expert} but num_experts is 0"},
      {{{"e.w", "x", false, 2}}, "num_experts > 0 but the HF name has no {expert}"},
      {{{"e.{expert}.w", "x.{expert}", false, 2}}, "{expert} in the internal name"},
      {{{"e.{expert}.w", "x", false, -1}}, "num_experts = -1"},
  };
  for (const Case& c : cases) {
    auto a = StateDictAdapter::Create(c.rules, 1, false, "lm_head.weight");
    ASSERT_FALSE(a.ok()) << c.needle;
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(a.status().message(), HasSubstr(c.needle));
  }
}

// --- loading and saving stacked parameters ------------------------------------------------

constexpr int64_t kVocab = 8, kHidden = 4, kInter = 3, kExperts = 4;

/// A tiny model with one unstacked parameter and one stacked [E, I, H] parameter; its forward
/// uses both so it is a real CausalLM, but only loading and saving matter here.
class StackedLM : public CausalLM {
 public:
  StackedLM() {
    embed_ = register_parameter("embed", torch::zeros({kVocab, kHidden}));
    experts_ = register_parameter("experts", torch::zeros({kExperts, kInter, kHidden}));
  }
  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor&, KVCache*) override {
    auto h = torch::embedding(embed_, tokens);                       // [B, T, H]
    auto mixed = torch::einsum("bth,eih->bti", {h, experts_});       // [B, T, I]
    return torch::matmul(mixed.sum(-1, true).expand({-1, -1, kHidden}), embed_.t());
  }
  std::unique_ptr<KVCache> NewKVCache(int64_t batch, int64_t max_len) const override {
    return std::make_unique<KVCache>(1, batch, 1, max_len, kHidden, torch::kFloat32, torch::kCPU);
  }

 private:
  torch::Tensor embed_, experts_;
};

class StackedArgs : public ModelArgs {
 public:
  nlohmann::json ToJson() const override { return nlohmann::json::object(); }
  int64_t vocab_size() const override { return kVocab; }
  int64_t num_hidden_layers() const override { return 1; }
  int64_t num_key_value_heads() const override { return 1; }
  int64_t head_dim() const override { return kHidden; }
  int64_t max_position_embeddings() const override { return 16; }
  bool tie_word_embeddings() const override { return true; }
};

std::vector<TensorNameRule> StackedRules(int64_t experts) {
  return {{"model.embed.weight", "embed", false},
          {"model.experts.{expert}.w", "experts", false, experts}};
}

Result<StateDictAdapter> StackedAdapter(int64_t experts = kExperts) {
  return StateDictAdapter::Create(StackedRules(experts), 1, true, "lm_head.weight");
}

/// Construct gives a fresh StackedLM (the save gate reloads into one).
class StackedFamily : public ModelFamily {
 public:
  std::string_view name() const override { return "stacked"; }
  std::vector<std::string> model_types() const override { return {"stacked"}; }
  Result<ParsedConfig> ParseConfig(const nlohmann::json&) const override {
    return ParsedConfig{std::make_shared<StackedArgs>(), {}};
  }
  Result<std::shared_ptr<CausalLM>> Construct(const ModelArgs&, torch::Dtype dtype,
                                              torch::Device device) const override {
    auto m = std::make_shared<StackedLM>();
    m->to(device, dtype);
    return std::shared_ptr<CausalLM>(m);
  }
  Result<StateDictAdapter> Adapter(const ModelArgs&) const override { return StackedAdapter(); }
};

/// The HF tensors of a checkpoint: the embedding and one [I, H] tensor per expert, each with
/// distinct values.
std::map<std::string, torch::Tensor> CheckpointTensors() {
  std::map<std::string, torch::Tensor> t;
  t["model.embed.weight"] = torch::arange(kVocab * kHidden, torch::kFloat32).view({kVocab, kHidden});
  for (int64_t e = 0; e < kExperts; ++e) {
    t["model.experts." + std::to_string(e) + ".w"] =
        torch::full({kInter, kHidden}, 0.0f) + torch::arange(kInter * kHidden).view({kInter, kHidden}) +
        100.0f * static_cast<float>(e + 1);
  }
  return t;
}

void WriteCheckpoint(const std::filesystem::path& dir,
                     const std::map<std::string, torch::Tensor>& tensors) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "stacked"})";
  std::vector<std::pair<std::string, torch::Tensor>> list(tensors.begin(), tensors.end());
  ASSERT_TRUE(safetensors::WriteTensors(dir / "model.safetensors", list, {}).ok());
}

Result<LoadReport> LoadInto(const std::map<std::string, torch::Tensor>& tensors,
                            const StateDictAdapter& adapter, StackedLM& model, TempDir& dir) {
  WriteCheckpoint(dir.path() / "ckpt", tensors);
  auto ckpt = Checkpoint::Open(dir.path() / "ckpt");
  if (!ckpt.ok()) return ckpt.status();
  return LoadStateDict(*ckpt, adapter, model);
}

torch::Tensor Param(StackedLM& model, const std::string& name) {
  return model.named_parameters()[name];
}

// Each expert's tensor lands in its slice; the stacked parameter counts once, as loaded.
TEST(LoadStackedTest, ExpertsLoadIntoSlices) {
  TempDir dir;
  auto adapter = StackedAdapter();
  ASSERT_TRUE(adapter.ok());
  StackedLM model;
  const auto tensors = CheckpointTensors();
  auto rep = LoadInto(tensors, *adapter, model, dir);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_TRUE(rep->ok()) << ::testing::PrintToString(rep->missing);
  EXPECT_EQ(rep->keys_total, 1 + kExperts);
  EXPECT_EQ(rep->keys_used, 1 + kExperts);
  EXPECT_EQ(rep->params_total, 2);
  EXPECT_EQ(rep->params_loaded, 2);
  const torch::Tensor w = Param(model, "experts");
  for (int64_t e = 0; e < kExperts; ++e) {
    EXPECT_TRUE(torch::equal(w[e], tensors.at("model.experts." + std::to_string(e) + ".w"))) << e;
  }
}

// A missing expert is named as a missing key (with its slice), and the stacked parameter is
// then not counted as loaded (nor named a second time as a parameter).
TEST(LoadStackedTest, MissingExpertNamedByKey) {
  TempDir dir;
  auto adapter = StackedAdapter();
  StackedLM model;
  auto tensors = CheckpointTensors();
  tensors.erase("model.experts.2.w");
  auto rep = LoadInto(tensors, *adapter, model, dir);
  ASSERT_TRUE(rep.ok());
  EXPECT_FALSE(rep->ok());
  EXPECT_THAT(rep->missing, ElementsAre("model.experts.2.w (-> experts[2])"));
  EXPECT_EQ(rep->params_loaded, 1);
}

// A model with more experts than the table names: the unloaded slices are named.
TEST(LoadStackedTest, UnnamedSlicesReported) {
  TempDir dir;
  auto adapter = StackedAdapter(kExperts - 1);
  StackedLM model;
  auto tensors = CheckpointTensors();
  tensors.erase("model.experts.3.w");
  auto rep = LoadInto(tensors, *adapter, model, dir);
  ASSERT_TRUE(rep.ok());
  ASSERT_EQ(rep->missing.size(), 1u);
  EXPECT_THAT(rep->missing[0], HasSubstr("parameter experts: slice(s) 3 of 4 along dim 0"));
  EXPECT_EQ(rep->params_loaded, 1);
}

// Shapes are checked against the slice; an expert index past dim 0 is a shape mismatch too;
// a non-finite expert is reported, and its parameter does not count as loaded.
TEST(LoadStackedTest, SliceShapeAndValueChecks) {
  {
    TempDir dir;
    auto adapter = StackedAdapter();
    StackedLM model;
    auto tensors = CheckpointTensors();
    tensors["model.experts.1.w"] = torch::zeros({kHidden, kInter});
    auto rep = LoadInto(tensors, *adapter, model, dir);
    ASSERT_TRUE(rep.ok());
    EXPECT_THAT(rep->shape_mismatches,
                ElementsAre("model.experts.1.w (-> experts[1]): checkpoint [4, 3] vs model "
                            "[3, 4] (slice of [4, 3, 4])"));
    EXPECT_TRUE(rep->missing.empty()) << ::testing::PrintToString(rep->missing);
    EXPECT_EQ(rep->params_loaded, 1);
  }
  {
    TempDir dir;
    auto adapter = StackedAdapter(kExperts + 1);
    StackedLM model;
    auto tensors = CheckpointTensors();
    tensors["model.experts.4.w"] = torch::zeros({kInter, kHidden});
    auto rep = LoadInto(tensors, *adapter, model, dir);
    ASSERT_TRUE(rep.ok());
    EXPECT_THAT(rep->shape_mismatches,
                ElementsAre("model.experts.4.w (-> experts[4]): model [4, 3, 4] has no slice "
                            "4 along dim 0"));
    // The four real slices loaded: the parameter is complete.
    EXPECT_EQ(rep->params_loaded, 2);
  }
  {
    TempDir dir;
    auto adapter = StackedAdapter();
    StackedLM model;
    auto tensors = CheckpointTensors();
    tensors["model.experts.0.w"][1][2] = std::numeric_limits<float>::quiet_NaN();
    auto rep = LoadInto(tensors, *adapter, model, dir);
    ASSERT_TRUE(rep.ok());
    EXPECT_THAT(rep->nonfinite, ElementsAre("model.experts.0.w (-> experts[0]): 1 NaN, 0 Inf"));
    EXPECT_EQ(rep->params_loaded, 1);
  }
}

// --- adopting the mapped file as a parameter ------------------------------------------------

// A whole CPU parameter of the stored dtype becomes the checkpoint's mapped bytes: counted as
// adopted, still holding the values after the Checkpoint is gone (the view keeps the mapping),
// and writable without changing the file (private copy-on-write). The stacked parameter is
// loaded slice by slice, so it is copied.
TEST(LoadAdoptTest, WholeParameterOfTheStoredDtypeIsTheMappedFile) {
  TempDir dir;
  auto adapter = StackedAdapter();
  ASSERT_TRUE(adapter.ok());
  StackedLM model;
  const auto tensors = CheckpointTensors();
  auto rep = LoadInto(tensors, *adapter, model, dir);  // the Checkpoint is destroyed inside
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_TRUE(rep->ok());
  EXPECT_EQ(rep->bytes_adopted, static_cast<uint64_t>(kVocab * kHidden * 4));
  EXPECT_LT(rep->bytes_adopted, rep->bytes_loaded);
  torch::Tensor embed = Param(model, "embed");
  EXPECT_TRUE(torch::equal(embed, tensors.at("model.embed.weight")));
  {
    torch::NoGradGuard no_grad;
    embed.add_(1.0f);
  }
  EXPECT_TRUE(torch::equal(embed, tensors.at("model.embed.weight") + 1.0f));
  // The model's forward reads the adopted bytes too (its own handle shares the parameter).
  EXPECT_TRUE(model.Forward(torch::tensor({{1, 2}}), torch::Tensor(), nullptr).isfinite().all().item<bool>());
  auto reopened = Checkpoint::Open(dir.path() / "ckpt");
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  auto stored = reopened->View("model.embed.weight");
  ASSERT_TRUE(stored.ok());
  EXPECT_TRUE(torch::equal(*stored, tensors.at("model.embed.weight")));
}

// A parameter of another dtype, or one whose storage another tensor views, gets a copy, and
// the view sees the loaded values.
TEST(LoadAdoptTest, ConvertedOrViewedParametersAreCopied) {
  const auto tensors = CheckpointTensors();
  auto adapter = StackedAdapter();
  ASSERT_TRUE(adapter.ok());
  {
    TempDir dir;
    StackedLM model;
    model.to(torch::kDouble);
    auto rep = LoadInto(tensors, *adapter, model, dir);
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    EXPECT_EQ(rep->bytes_adopted, 0u);
    EXPECT_TRUE(torch::equal(Param(model, "embed"),
                             tensors.at("model.embed.weight").to(torch::kDouble)));
  }
  {
    TempDir dir;
    StackedLM model;
    const torch::Tensor alias = Param(model, "embed").view({-1});
    auto rep = LoadInto(tensors, *adapter, model, dir);
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    EXPECT_EQ(rep->bytes_adopted, 0u);
    EXPECT_TRUE(torch::equal(alias, tensors.at("model.embed.weight").view({-1})));
  }
}

/// A loaded StackedLM in a gate context whose attempt dir is `dir`/attempt.
struct SaveSetup {
  TempDir dir;
  StackedFamily family;
  std::map<std::string, torch::Tensor> tensors = CheckpointTensors();
  GateContext ctx;

  SaveSetup() {
    WriteCheckpoint(dir.path() / "ckpt", tensors);
    auto ckpt = Checkpoint::Open(dir.path() / "ckpt");
    EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    ctx.checkpoint.emplace(std::move(ckpt).value());
    ctx.family = &family;
    ctx.args = std::make_shared<StackedArgs>();
    ctx.model = std::make_shared<StackedLM>();
    auto adapter = StackedAdapter();
    ctx.adapter.emplace(*adapter);
    auto rep = LoadStateDict(*ctx.checkpoint, *ctx.adapter, *ctx.model);
    EXPECT_TRUE(rep.ok() && rep->ok());
    ctx.model_loaded = true;
    ctx.spec.attempt.dir = (dir.path() / "attempt").string();
  }
};

// The save gate writes each expert slice under its own HF name: the saved key set equals the
// checkpoint's, each saved expert equals its slice, and the reload is bit-equal.
TEST(SaveStackedTest, SavesOneKeyPerExpertAndReloads) {
  SaveSetup s;
  GateOutcome out = SaveGate(s.ctx);
  ASSERT_EQ(out.status, GateStatus::kPass) << out.reason;
  const Figure* saved = out.Find("tensors_saved");
  const Figure* equal = out.Find("tensors_equal");
  ASSERT_TRUE(saved != nullptr && equal != nullptr);
  EXPECT_EQ(std::get<int64_t>(saved->value), 1 + kExperts);
  EXPECT_EQ(std::get<int64_t>(equal->value), 2);

  auto reopened = Checkpoint::Open(std::filesystem::path(s.ctx.spec.attempt.dir) / "save");
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  EXPECT_EQ(reopened->Keys(), s.ctx.checkpoint->Keys());
  for (const auto& [key, tensor] : s.tensors) {
    auto t = reopened->Load(key);
    ASSERT_TRUE(t.ok()) << key;
    EXPECT_TRUE(torch::equal(*t, tensor)) << key;
  }
}

// A table that splits a stacked parameter into a different number of HF tensors than its
// dim 0 fails the save gate naming the parameter and both counts.
TEST(SaveStackedTest, WrongExpertCountFails) {
  SaveSetup s;
  auto wrong = StackedAdapter(kExperts - 1);
  ASSERT_TRUE(wrong.ok());
  s.ctx.adapter.emplace(*wrong);
  GateOutcome out = SaveGate(s.ctx);
  EXPECT_EQ(out.status, GateStatus::kFail);
  EXPECT_THAT(out.reason, HasSubstr("stacked parameter split wrongly: experts (shape [4, 3, 4], but the name table splits it "
                                    "into 3 HF tensors along dim 0)"));
}

}  // namespace
}  // namespace gatehouse::worker
