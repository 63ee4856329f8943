// The static decode step CUDA graphs capture (CausalLM::DecodeStep, KVCache::WriteAt) against
// the eager KV-cache decode, token for token, on the CPU: buffers allocated once and updated in
// place, one cache reused across prompts of different lengths (stale slots must be masked).
// The CUDA-graph runner itself needs a GPU: here it must say why it cannot run; on a GPU node
// the last test captures and replays it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "gatehouse/worker/cuda_graph.h"
#include "gatehouse/worker/reference.h"
#include "tests/common/temp_dir.h"
#include "tests/models/family_test_util.h"

namespace gatehouse {
namespace {

using ::testing::HasSubstr;

/// A fixture's model loaded through the real gates (config, construct, load), and its
/// reference prompts.
struct Loaded {
  worker::GateContext ctx;
  std::vector<torch::Tensor> prompts;
};

Loaded Load(const std::string& variant, const std::string& family, const std::string& precision,
            const std::filesystem::path& attempt, const std::string& device = "cpu") {
  Loaded l{test_util::FixtureContext(test_util::FixtureDir(variant), family, precision, attempt), {}};
  l.ctx.spec.runtime.device = device;
  for (const auto& g : test_util::GatesThrough("load")) {
    const worker::GateOutcome out = g.run(l.ctx);
    EXPECT_EQ(out.status, GateStatus::kPass) << variant << " " << g.phase << ": " << out.reason;
  }
  auto bundle = worker::LoadReference(test_util::FixtureDir(variant) / "reference");
  EXPECT_TRUE(bundle.ok()) << bundle.status().ToString();
  if (bundle.ok()) {
    for (const auto& p : bundle->prompts) l.prompts.push_back(p.input_ids);
  }
  return l;
}

/// Greedy decode through DecodeStep with static token / position buffers updated in place,
/// after an eager prefill into `cache` (which may hold another prompt's stale entries).
torch::Tensor StaticGreedy(worker::CausalLM& model, worker::KVCache& cache,
                           const torch::Tensor& prompt, int64_t n) {
  torch::NoGradGuard no_grad;
  const int64_t t = prompt.size(0);
  cache.Reset();
  torch::Tensor logits = model.Forward(prompt.unsqueeze(0),
                                       torch::arange(t, torch::kLong).unsqueeze(0), &cache);
  torch::Tensor next = logits.select(1, t - 1).argmax(-1);
  std::vector<torch::Tensor> ids{next};
  torch::Tensor tokens = torch::zeros({1, 1}, torch::kLong);
  torch::Tensor positions = torch::zeros({1, 1}, torch::kLong);
  for (int64_t step = 1; step < n; ++step) {
    tokens.copy_(next.view({1, 1}));
    positions.fill_(t + step - 1);
    next = model.DecodeStep(tokens, positions, cache).select(1, 0).argmax(-1);
    ids.push_back(next);
  }
  return torch::cat(ids);
}

// Verifies the static step decodes exactly the eager tokens (32 per prompt, every prompt of
// the fixture, one cache shared by all) across attention kinds: GQA, sliding windows,
// soft-capping, fused projections, q/k norms, llama3 RoPE.
TEST(StaticDecodeTest, EqualsEagerDecode) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"llama-tiny-untied", "llama"},         {"qwen2-tiny-sliding", "qwen2"},
      {"gemma2-tiny-untied", "gemma2"},       {"mistral-tiny-untied", "mistral"},
      {"phi3-tiny-sliding", "phi3"},          {"qwen3-tiny-bias", "qwen3"},
      {"llama-tiny-rope-llama3", "llama"}};
  constexpr int64_t kNew = 32;
  for (const auto& [variant, family] : cases) {
    test_util::TempDir attempt("gatehouse-static");
    Loaded l = Load(variant, family, "fp32", attempt.path());
    ASSERT_TRUE(l.ctx.model) << variant;
    worker::CausalLM& model = *l.ctx.model;
    ASSERT_TRUE(model.SupportsStaticDecode()) << variant;
    int64_t longest = 0;
    for (const auto& p : l.prompts) longest = std::max(longest, p.size(0));
    auto cache = model.NewKVCache(1, longest + kNew);
    // Longest prompt first, so shorter ones run over its stale slots.
    std::vector<torch::Tensor> order = l.prompts;
    std::sort(order.begin(), order.end(),
              [](const torch::Tensor& a, const torch::Tensor& b) { return a.size(0) > b.size(0); });
    for (const auto& prompt : order) {
      const torch::Tensor eager = worker::GreedyDecode(model, prompt, kNew, torch::kCPU);
      const torch::Tensor stat = StaticGreedy(model, *cache, prompt, kNew);
      EXPECT_TRUE(torch::equal(eager, stat))
          << variant << " prompt of " << prompt.size(0) << " tokens:\n" << eager << "\n" << stat;
    }
  }
}

// Verifies dynamic RoPE (frequencies depend on the running length) and MoE (experts chosen on
// the host) have no static step.
TEST(StaticDecodeTest, DynamicRopeAndMoeHaveNoStaticStep) {
  for (const auto& [variant, family] : std::vector<std::pair<std::string, std::string>>{
           {"llama-tiny-rope-dynamic", "llama"}, {"qwen3_moe-tiny-untied", "qwen3_moe"}}) {
    test_util::TempDir attempt("gatehouse-static");
    Loaded l = Load(variant, family, "fp32", attempt.path());
    ASSERT_TRUE(l.ctx.model) << variant;
    EXPECT_FALSE(l.ctx.model->SupportsStaticDecode()) << variant;
  }
}

// Verifies the CUDA-graph runner refuses to start without CUDA, saying why (CI has no GPU),
// and the cuda_graph gate is SKIPPED with the reason.
TEST(CudaGraphTest, WithoutCudaSaysWhy) {
  if (worker::CudaAvailable()) GTEST_SKIP() << "a CUDA device is present; CudaGraphOnGpu covers it";
  test_util::TempDir attempt("gatehouse-static");
  Loaded l = Load("llama-tiny-untied", "llama", "fp32", attempt.path());
  ASSERT_TRUE(l.ctx.model);
  auto dec = worker::CudaGraphDecoder::Create(*l.ctx.model, 1, 64);
  ASSERT_FALSE(dec.ok());
  EXPECT_EQ(dec.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(dec.status().message(), HasSubstr("no CUDA device"));
  l.ctx.spec.mode = "cuda_graph";
  l.ctx.runtime = worker::ProbeRuntime();
  const worker::GateOutcome out = worker::CudaGraphGate(l.ctx);
  EXPECT_EQ(out.status, GateStatus::kSkipped);
  EXPECT_THAT(out.reason, HasSubstr("no CUDA device"));
}

// On a GPU: the captured graph decodes the eager tokens for every prompt, in fp32 and bf16.
TEST(CudaGraphTest, CudaGraphOnGpu) {
  if (!worker::CudaAvailable()) GTEST_SKIP() << "no CUDA device: torch::cuda::is_available() is false";
  for (const std::string precision : {"fp32", "bf16"}) {
    test_util::TempDir attempt("gatehouse-graph");
    Loaded l = Load("qwen2-tiny-sliding", "qwen2", precision, attempt.path(), "cuda");
    ASSERT_TRUE(l.ctx.model);
    l.ctx.spec.mode = "cuda_graph";
    l.ctx.runtime = worker::ProbeRuntime();
    const worker::GateOutcome out = worker::CudaGraphGate(l.ctx);
    EXPECT_EQ(out.status, GateStatus::kPass) << precision << ": " << out.reason;
    EXPECT_EQ(test_util::FigureText(out, "tokens_matched"), test_util::FigureText(out, "tokens_total"));
  }
}

}  // namespace
}  // namespace gatehouse
