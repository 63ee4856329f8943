// models/decoder/model: DecoderSpec validation and the decoder's modules one switch at a time:
// RMSNorm (both upstream forms, against transformers' LlamaRMSNorm / GemmaRMSNorm), the
// initialisation, grouped KV heads (repeat_kv), fused projections, the sliding window's
// receptive field, MoE routing, attention and final logit soft-capping, tied embeddings and which specs support a static decode step.
// Whole models against transformers' forward run in families_test on transformers-saved
// checkpoints.

#include "decoder/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/models/decoder/tiny_spec.h"
#include "tests/models/decoder/upstream.h"

namespace gatehouse::models {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

torch::Tensor Logits(DecoderModel& model, const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  const auto positions = torch::arange(tokens.size(1), torch::kLong).unsqueeze(0);
  return model.Forward(tokens, positions.expand({tokens.size(0), -1}).contiguous(), nullptr);
}

/// The parameter `name` (a handle sharing its storage); undefined, failing the test, if absent.
torch::Tensor Param(DecoderModel& model, const std::string& name) {
  const auto params = model.named_parameters();
  const auto* p = params.find(name);
  EXPECT_NE(p, nullptr) << name;
  return p != nullptr ? *p : torch::Tensor();
}

TEST(DecoderSpecValidate, EachBrokenFieldIsNamed) {
  const std::vector<std::pair<std::function<void(DecoderSpec&)>, std::string>> cases = {
      {[](DecoderSpec& s) { s.hidden_size = 0; }, "hidden_size"},
      {[](DecoderSpec& s) { s.num_key_value_heads = 3; },
       "'num_attention_heads' = 4 is not a multiple of 'num_key_value_heads' = 3"},
      {[](DecoderSpec& s) { s.rms_norm_eps = -1e-6; }, "rms_norm_eps"},
      {[](DecoderSpec& s) { s.ropes[0].partial_rotary_factor = 0.1; },
       "'head_dim' = 8 with partial_rotary_factor 0.1 gives rotary dim 0"},
      {[](DecoderSpec& s) { s.layers.pop_back(); },
       "layer_types has 1 entries but num_hidden_layers = 2"},
      {[](DecoderSpec& s) { s.layers[1].sliding_window = -4; }, "'sliding_window' = -4"},
      {[](DecoderSpec& s) { s.layers[1].rope = 1; }, "RoPE index out of range"},
      {[](DecoderSpec& s) { s.pad_token_id = 64; }, "'pad_token_id' = 64: must be in [0, vocab_size)"},
      {[](DecoderSpec& s) { s.final_logit_softcapping = 0.0; }, "final_logit_softcapping"},
      {[](DecoderSpec& s) {
         s.layers[0].moe = true;
         s.num_experts = 4;
         s.moe_intermediate_size = 8;
         s.num_experts_per_tok = 5;
       },
       "'num_experts_per_tok' = 5: must be in [1, num_experts = 4]"},
  };
  ASSERT_TRUE(test_util::TinySpec().Validate().ok());
  for (const auto& [mutate, expected] : cases) {
    DecoderSpec spec = test_util::TinySpec();
    mutate(spec);
    EXPECT_THAT(spec.Validate().message(), HasSubstr(expected));
  }
}

TEST(RMSNorm, BothFormsEqualTransformersBitwiseInFp32AndBf16) {
  torch::manual_seed(1);
  // Row 0 of a typical scale, row 1 small enough that eps moves the result.
  const auto x = torch::randn({2, 3, 64}) * torch::tensor({3.0f, 0.01f}).view({2, 1, 1});
  const auto weight = torch::randn({64}) * 0.1;
  struct Case {
    NormKind kind;
    std::string model_type;
    torch::Dtype dtype;
    std::string dtype_name;
  };
  const std::vector<Case> cases = {{NormKind::kLlama, "llama", torch::kFloat32, "float32"},
                                   {NormKind::kLlama, "llama", torch::kBFloat16, "bfloat16"},
                                   {NormKind::kGemma, "gemma", torch::kFloat32, "float32"},
                                   {NormKind::kGemma, "gemma", torch::kBFloat16, "bfloat16"}};
  json requests = json::array();
  for (const auto& c : cases) {
    requests.push_back({{"model_type", c.model_type}, {"dtype", c.dtype_name}, {"eps", 1e-5},
                        {"x", test_util::TensorJson(x.to(c.dtype))},
                        {"weight", test_util::TensorJson(weight.to(c.dtype))}});
  }
  const json results = test_util::RunUpstream("rmsnorm", requests);
  ASSERT_EQ(results.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].model_type + " " + cases[i].dtype_name);
    RMSNorm norm(64, 1e-5, cases[i].kind);
    torch::NoGradGuard no_grad;
    norm->named_parameters()["weight"].copy_(weight);
    norm->to(cases[i].dtype);
    const auto ours = norm->forward(x.to(cases[i].dtype));
    EXPECT_EQ(ours.scalar_type(), cases[i].dtype);
    const auto upstream = test_util::TensorFromJson(results[i]["y"]);
    EXPECT_TRUE(torch::equal(ours.to(torch::kFloat32), upstream))
        << "max |ours - upstream| = "
        << (ours.to(torch::kFloat32) - upstream).abs().max().item<double>();
  }
}

TEST(DecoderModel, InitialisedLikeUpstream) {
  DecoderSpec spec = test_util::TinySpec();
  spec.vocab_size = 512;
  spec.qkv_bias = true;
  DecoderModel llama(spec);
  // normal(0, 0.02) for embeddings and linears, zero biases, norms at identity.
  EXPECT_NEAR(Param(llama, "tok_embeddings.weight").std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(Param(llama, "layers.0.feed_forward.w1.weight").std().item<double>(), 0.02, 0.002);
  EXPECT_TRUE(torch::equal(Param(llama, "layers.0.attention.wq.bias"), torch::zeros({32})));
  EXPECT_TRUE(torch::equal(Param(llama, "norm.weight"), torch::ones({32})));
  spec.norm = NormKind::kGemma;
  DecoderModel gemma(spec);
  EXPECT_TRUE(torch::equal(Param(gemma, "norm.weight"), torch::zeros({32})));
}

TEST(DecoderModel, GroupedKvHeadsServeConsecutiveQueryHeads) {
  // repeat_kv: KV head j serves query heads j * g .. j * g + g - 1 (g = 2 here). A GQA model
  // must equal the multi-head model whose k/v heads are those KV heads, each repeated g times.
  torch::manual_seed(2);
  DecoderSpec gqa = test_util::TinySpec();
  DecoderSpec mha = gqa;
  mha.num_key_value_heads = 4;
  DecoderModel small(gqa), big(mha);
  {
    torch::NoGradGuard no_grad;
    auto big_params = big.named_parameters();
    for (const auto& p : small.named_parameters()) {
      const std::string& name = p.key();
      if (name.find(".wk.") != std::string::npos || name.find(".wv.") != std::string::npos) {
        // [2 heads x 8, hidden] -> [4 heads x 8, hidden], heads 0 0 1 1.
        big_params[name].copy_(
            p.value().view({2, 1, 8, 32}).expand({2, 2, 8, 32}).reshape({32, 32}));
      } else {
        big_params[name].copy_(p.value());
      }
    }
  }
  const auto tokens = torch::randint(0, 64, {2, 9}, torch::kLong);
  EXPECT_TRUE(torch::allclose(Logits(small, tokens), Logits(big, tokens), 1e-5, 1e-6));
}

TEST(DecoderModel, SlidingWindowBoundsWhatAPositionSees) {
  // One layer with window 3: position q sees keys q-2 .. q. Changing tokens 0..4 must not move
  // the logits at position 7; it must move those at position 4.
  DecoderSpec spec = test_util::TinySpec();
  spec.num_hidden_layers = 1;
  spec.layers = {LayerSpec{.sliding_window = 3}};
  torch::manual_seed(3);
  DecoderModel model(spec);
  const auto a = torch::randint(0, 64, {1, 8}, torch::kLong);
  auto b = a.clone();
  b.narrow(1, 0, 5).copy_((a.narrow(1, 0, 5) + 1) % 64);
  const auto la = Logits(model, a), lb = Logits(model, b);
  EXPECT_TRUE(torch::equal(la.select(1, 7), lb.select(1, 7)));
  EXPECT_FALSE(torch::allclose(la.select(1, 4), lb.select(1, 4)));
  // Without the window position 7 sees them all.
  spec.layers = {LayerSpec{}};
  torch::manual_seed(3);
  DecoderModel full(spec);
  EXPECT_FALSE(torch::allclose(Logits(full, a).select(1, 7), Logits(full, b).select(1, 7)));
}

// Each sequence of a packed row gets the logits of its own forward: with a sliding window and
// with dynamic NTK RoPE (whose tables depend on the sequence's own length, past
// max_position_embeddings here), in fp32 within rounding of the order of sums.
TEST(DecoderModel, PackedRowGivesEachSequenceItsOwnForward) {
  for (const bool dynamic : {false, true}) {
    SCOPED_TRACE(dynamic ? "dynamic RoPE" : "plain RoPE, window 3");
    DecoderSpec spec = test_util::TinySpec();
    spec.layers = {LayerSpec{.sliding_window = dynamic ? 0 : 3}, LayerSpec{}};
    spec.num_hidden_layers = 2;
    if (dynamic) {
      spec.max_position_embeddings = 6;
      spec.ropes[0].rope_type = "dynamic";
      spec.ropes[0].factor = 2.0;
    }
    ASSERT_TRUE(spec.Validate().ok());
    torch::manual_seed(6);
    DecoderModel model(spec);
    model.eval();
    torch::NoGradGuard no_grad;
    const std::vector<int64_t> lengths = {9, 4, 7};
    std::vector<torch::Tensor> seqs, positions;
    std::vector<int64_t> bounds = {0};
    for (int64_t n : lengths) {
      seqs.push_back(torch::randint(0, 64, {n}, torch::kLong));
      positions.push_back(torch::arange(n, torch::kLong));
      bounds.push_back(bounds.back() + n);
    }
    const torch::Tensor packed = model.ForwardPacked(
        torch::cat(seqs).unsqueeze(0), torch::cat(positions).unsqueeze(0), torch::tensor(bounds));
    ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{1, bounds.back(), 64}));
    for (size_t i = 0; i < seqs.size(); ++i) {
      const torch::Tensor alone = model.Forward(
          seqs[i].unsqueeze(0), torch::arange(lengths[i], torch::kLong).unsqueeze(0), nullptr);
      const torch::Tensor in_pack = packed.slice(1, bounds[i], bounds[i + 1]);
      EXPECT_TRUE(torch::allclose(alone, in_pack, 0, 1e-5)) << "sequence " << i;
    }
    // The same row forwarded as one sequence differs after the first sequence.
    const torch::Tensor as_one = model.Forward(torch::cat(seqs).unsqueeze(0),
                                               torch::arange(bounds.back()).unsqueeze(0), nullptr);
    EXPECT_FALSE(torch::allclose(as_one.slice(1, bounds[1], bounds[2]),
                                 packed.slice(1, bounds[1], bounds[2]), 0, 1e-3));
  }
}

// cu_seqlens that do not run from 0 to T without decreasing are refused, naming the values.
TEST(DecoderModel, PackedRefusesBadCuSeqlens) {
  torch::manual_seed(7);
  DecoderModel model(test_util::TinySpec());
  torch::NoGradGuard no_grad;
  const auto tokens = torch::zeros({1, 5}, torch::kLong);
  const auto positions = torch::zeros({1, 5}, torch::kLong);
  auto message = [&](std::vector<int64_t> cu) {
    try {
      model.ForwardPacked(tokens, positions, torch::tensor(cu));
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("(accepted)");
  };
  EXPECT_THAT(message({0, 3, 4}), HasSubstr("must run from 0 to T = 5, got 0 .. 4"));
  EXPECT_THAT(message({1, 5}), HasSubstr("must run from 0 to T = 5, got 1 .. 5"));
  EXPECT_THAT(message({0, 4, 2, 5}), HasSubstr("must not decrease, got 4 then 2"));
  EXPECT_THAT(message({5}), HasSubstr("must be [S + 1] with S >= 1"));
  EXPECT_EQ(message({0, 2, 2, 5}), "(accepted)");  // an empty sequence is allowed
}

TEST(DecoderModel, TopOneMoeIsTheChosenExpertAlone) {
  // num_experts_per_tok 1 with norm_topk_prob: the routing weight is 1, so each token's MoE
  // output is exactly the SwiGLU output of the expert its router logit ranks first.
  DecoderSpec spec = test_util::TinySpec();
  spec.num_experts = 4;
  spec.num_experts_per_tok = 1;
  spec.moe_intermediate_size = 16;
  spec.norm_topk_prob = true;
  torch::manual_seed(4);
  MoE moe(spec, TensorParallel{});
  const auto x = torch::randn({1, 5, 32});
  torch::NoGradGuard no_grad;
  const auto out = moe->forward(x);
  auto params = moe->named_parameters();
  const auto chosen = torch::linear(x, params["router.weight"]).argmax(-1);  // [1, 5]
  for (int64_t t = 0; t < 5; ++t) {
    const int64_t e = chosen[0][t].item<int64_t>();
    const auto h = x[0][t];
    const auto w1 = params["experts.w1"][e], w2 = params["experts.w2"][e],
               w3 = params["experts.w3"][e];
    const auto expert = torch::matmul(w2, torch::silu(torch::matmul(w1, h)) * torch::matmul(w3, h));
    EXPECT_TRUE(torch::allclose(out[0][t], expert, 1e-5, 1e-6)) << "token " << t;
  }
}

TEST(DecoderModel, FinalSoftcappingBoundsTheLogits) {
  DecoderSpec spec = test_util::TinySpec();
  spec.final_logit_softcapping = 0.5;
  torch::manual_seed(5);
  DecoderModel model(spec);
  {
    torch::NoGradGuard no_grad;
    Param(model, "output.weight").mul_(100);  // raw logits far beyond the cap
  }
  const auto logits = Logits(model, torch::randint(0, 64, {1, 6}, torch::kLong));
  EXPECT_LE(logits.abs().max().item<double>(), 0.5);
  EXPECT_GT(logits.abs().max().item<double>(), 0.45);
}

TEST(DecoderModel, TiedHeadIsTheEmbeddingMatrix) {
  DecoderSpec spec = test_util::TinySpec();
  spec.tie_word_embeddings = true;
  DecoderModel model(spec);
  EXPECT_EQ(model.named_parameters().find("output.weight"), nullptr);
  // Training the head trains the embeddings: a loss on the logits alone reaches every row.
  const auto tokens = torch::zeros({1, 1}, torch::kLong);
  model.Forward(tokens, torch::zeros({1, 1}, torch::kLong), nullptr).sum().backward();
  const auto grad = Param(model, "tok_embeddings.weight").grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_GT(grad.narrow(0, 1, 63).abs().sum().item<double>(), 0.0);
}

// Training a tied model on the CPU takes the decoder's own backward for the shared weight
// (TiedHead, TiedEmbeddingLookup: no vocabulary-sized temporaries). Its gradient must be, bit
// for bit, upstream's: the lm_head's gradient plus the lookup's dense gradient, which an
// untied twin with the same weights computes with torch's own backward (then summed as
// autograd sums them). Repeated ids and the padding row (no gradient) included, fp32 and bf16.
TEST(DecoderModel, TiedGradientIsTheUntiedTwinsSumBitForBit) {
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::manual_seed(3);
    DecoderSpec spec = test_util::TinySpec();
    spec.pad_token_id = 5;
    spec.tie_word_embeddings = true;
    DecoderModel tied(spec);
    spec.tie_word_embeddings = false;
    DecoderModel untied(spec);
    {
      torch::NoGradGuard no_grad;
      auto from = tied.named_parameters();
      for (auto& to : untied.named_parameters()) {
        to.value().copy_(from[to.key() == "output.weight" ? "tok_embeddings.weight" : to.key()]);
      }
    }
    tied.to(dtype);
    untied.to(dtype);
    const auto tokens = torch::tensor({{7, 5, 7, 1, 63, 7, 5, 2, 1}}, torch::kLong);
    const auto positions = torch::arange(tokens.size(1), torch::kLong).unsqueeze(0);
    const auto labels = torch::tensor({5, 7, 1, 63, 7, 5, 2, 1, 9}, torch::kLong);
    for (DecoderModel* m : {&tied, &untied}) {
      const auto logits = m->Forward(tokens, positions, nullptr).to(torch::kFloat);
      torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), labels).backward();
    }
    const auto grad = Param(tied, "tok_embeddings.weight").grad();
    ASSERT_TRUE(grad.defined());
    EXPECT_EQ(grad.layout(), torch::kStrided);
    const auto want = Param(untied, "output.weight").grad() + Param(untied, "tok_embeddings.weight").grad();
    EXPECT_TRUE(torch::equal(grad, want)) << dtype << ": max abs diff "
                                          << (grad.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>();
    EXPECT_EQ(Param(untied, "tok_embeddings.weight").grad()[5].abs().sum().item<double>(), 0.0);
    // Every other parameter's gradient is the twin's too.
    auto theirs = untied.named_parameters();
    for (const auto& ours : tied.named_parameters()) {
      if (ours.key() == "tok_embeddings.weight") continue;
      EXPECT_TRUE(torch::equal(ours.value().grad(), theirs[ours.key()].grad())) << ours.key();
    }
  }
}

/// Copies every parameter of `from` into `to` (same names otherwise), fusing wq/wk/wv into wqkv and w1/w3 into w13
/// where `to` has the fused projection (rows q, k, v and gate, up: upstream's layout).
void CopyFusing(DecoderModel& from, DecoderModel& to) {
  torch::NoGradGuard no_grad;
  auto src = from.named_parameters();
  for (auto& dst : to.named_parameters()) {
    const std::string& name = dst.key();
    auto fuse = [&](const std::string& fused, std::vector<std::string> parts) {
      const auto at = name.find(fused);
      if (at == std::string::npos) return false;
      std::vector<torch::Tensor> pieces;
      for (const auto& part : parts) {
        pieces.push_back(src[name.substr(0, at) + part + name.substr(at + fused.size())]);
      }
      dst.value().copy_(torch::cat(pieces));
      return true;
    };
    if (fuse("wqkv", {"wq", "wk", "wv"}) || fuse("w13", {"w1", "w3"})) continue;
    dst.value().copy_(src[name]);
  }
}

TEST(DecoderModel, FusedProjectionsEqualTheSplitOnes) {
  // Phi-3's qkv_proj holds rows q, then k, then v, and gate_up_proj rows gate, then up: the
  // fused model must compute what the split model with those rows computes.
  DecoderSpec split = test_util::TinySpec();
  split.qkv_bias = true;
  DecoderSpec fused = split;
  fused.fused_qkv = fused.fused_gate_up = true;
  torch::manual_seed(6);
  DecoderModel a(split), b(fused);
  CopyFusing(a, b);
  const auto tokens = torch::randint(0, 64, {2, 7}, torch::kLong);
  EXPECT_TRUE(torch::allclose(Logits(a, tokens), Logits(b, tokens), 1e-5, 1e-6));
}

TEST(DecoderModel, AttentionSoftcappingCapsTheScores) {
  // cap * tanh(scores / cap): a cap far above every score changes nothing measurable; a cap
  // below them flattens the attention and moves the logits.
  DecoderSpec spec = test_util::TinySpec();
  torch::manual_seed(7);
  DecoderModel plain(spec);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : plain.named_parameters()) {
      if (p.key().find(".wq.") != std::string::npos) p.value().mul_(30);  // large scores
    }
  }
  const auto tokens = torch::randint(0, 64, {1, 8}, torch::kLong);
  auto capped_logits = [&](double cap) {
    DecoderSpec s = spec;
    s.attn_logit_softcapping = cap;
    DecoderModel m(s);
    CopyFusing(plain, m);
    return Logits(m, tokens);
  };
  const auto base = Logits(plain, tokens);
  EXPECT_TRUE(torch::allclose(capped_logits(1e6), base, 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(capped_logits(0.5), base, 1e-3, 1e-3));
}

TEST(DecoderModel, StaticDecodeOnlyWhereNothingIsDecidedOnTheHost) {
  DecoderSpec spec = test_util::TinySpec();
  EXPECT_TRUE(DecoderModel(spec).SupportsStaticDecode());
  DecoderSpec dynamic = spec;
  dynamic.ropes[0].rope_type = "dynamic";
  dynamic.ropes[0].factor = 2.0;
  EXPECT_FALSE(DecoderModel(dynamic).SupportsStaticDecode());
  DecoderSpec moe = spec;
  moe.num_experts = 2;
  moe.num_experts_per_tok = 1;
  moe.moe_intermediate_size = 8;
  moe.layers[1].moe = true;
  EXPECT_FALSE(DecoderModel(moe).SupportsStaticDecode());
}

}  // namespace
}  // namespace gatehouse::models
