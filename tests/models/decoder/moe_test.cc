// The sparse MoE block (models/decoder/moe.cc) under expert parallelism against the plain block
// on the same weights and tokens: two EP ranks, one thread each over a real gloo group on
// 127.0.0.1, each holding four of the eight experts and routing tokens of its own. Also the
// near-tie count the parallel gate allows routing flips by.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decoder/model.h"
#include "tests/models/decoder/tiny_spec.h"
#include "tests/worker/gloo_ranks.h"

namespace gatehouse::models {
namespace {

constexpr int kRanks = 2;

DecoderSpec MoeSpec() {
  DecoderSpec spec = test_util::TinySpec();
  spec.num_experts = 8;
  spec.num_experts_per_tok = 2;
  spec.moe_intermediate_size = 16;
  spec.norm_topk_prob = true;
  return spec;
}

/// Copies `from`'s router and experts [first, first + n) into `to` (n = to's local experts).
void CopyExperts(MoE& from, MoE& to, int64_t first) {
  torch::NoGradGuard no_grad;
  auto src = from->named_parameters();
  auto dst = to->named_parameters();
  dst["router.weight"].copy_(src["router.weight"]);
  for (const char* w : {"experts.w1", "experts.w2", "experts.w3"}) {
    dst[w].copy_(src[w].narrow(0, first, dst[w].size(0)));
  }
}

/// Runs the plain block and the two-rank expert-parallel one on each rank's tokens `x[r]`
/// ([1, 3, 32], positive) and loss weights `g[r]`, and expects the outputs, the input
/// gradients and each rank's expert gradients to match the plain block's.
void ExpectExpertParallelMatches(MoE& plain, const std::vector<torch::Tensor>& x,
                                 const std::vector<torch::Tensor>& g) {
  // The plain block on each rank's tokens in turn, its expert gradients accumulating.
  std::vector<torch::Tensor> plain_out, plain_grad;
  for (int r = 0; r < kRanks; ++r) {
    torch::Tensor xr = x[r].clone().requires_grad_(true);
    torch::Tensor out = plain->forward(xr);
    (out * g[r]).sum().backward();
    plain_out.push_back(out.detach());
    plain_grad.push_back(xr.grad());
  }
  auto plain_params = plain->named_parameters();
  std::vector<torch::Tensor> out(kRanks), grad(kRanks), w1_grad(kRanks), w2_grad(kRanks);
  std::vector<int64_t> rows(kRanks);
  const std::vector<std::string> errors = test_util::RunGlooRanks(
      kRanks, [&](int r, std::shared_ptr<worker::TpCommunicator> comm) {
        MoE ep(MoeSpec(), TensorParallel{}, ParamOptions{}, ExpertParallel{r, kRanks, comm});
        CopyExperts(plain, ep, r * 4);
        torch::Tensor xr = x[r].clone().requires_grad_(true);
        torch::Tensor y = ep->forward(xr);
        (y * g[r]).sum().backward();
        out[r] = y.detach();
        grad[r] = xr.grad();
        auto params = ep->named_parameters();
        w1_grad[r] = params["experts.w1"].grad();
        w2_grad[r] = params["experts.w2"].grad();
      });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(torch::allclose(out[r], plain_out[r], 1e-6, 1e-7)) << "rank " << r;
    EXPECT_TRUE(torch::allclose(grad[r], plain_grad[r], 1e-6, 1e-7)) << "rank " << r;
    // This rank's experts saw both ranks' tokens: their gradients are the plain block's over
    // every token (zeros for an expert no token chose).
    const auto w1 = plain_params["experts.w1"].grad().narrow(0, r * 4, 4);
    const auto w2 = plain_params["experts.w2"].grad().narrow(0, r * 4, 4);
    // (Experts no token reached have no gradient: zeros, as the gates read them.)
    const auto ours1 = w1_grad[r].defined() ? w1_grad[r] : torch::zeros_like(w1);
    const auto ours2 = w2_grad[r].defined() ? w2_grad[r] : torch::zeros_like(w2);
    EXPECT_TRUE(torch::allclose(ours1, w1, 1e-6, 1e-7)) << "rank " << r;
    EXPECT_TRUE(torch::allclose(ours2, w2, 1e-6, 1e-7)) << "rank " << r;
  }
}

// Verifies the expert-parallel block (tokens sent to the rank holding their expert and back)
// equals the plain block: outputs, input gradients and every expert's gradient.
TEST(MoETest, ExpertParallelMatchesThePlainBlock) {
  torch::manual_seed(11);
  MoE plain(MoeSpec(), TensorParallel{});
  const std::vector<torch::Tensor> x = {torch::randn({1, 3, 32}), torch::randn({1, 3, 32})};
  const std::vector<torch::Tensor> g = {torch::randn({1, 3, 32}), torch::randn({1, 3, 32})};
  ExpectExpertParallelMatches(plain, x, g);
}

// Verifies a rank whose experts no token chooses (the router sends every positive input to
// experts 0..3, on rank 0) still takes part in every all-to-all, forward and backward: without
// it the other rank waits in the dispatch's backward until the group times out.
TEST(MoETest, ARankWhoseExpertsGetNoTokensStillJoinsTheBackward) {
  torch::manual_seed(12);
  MoE plain(MoeSpec(), TensorParallel{});
  {
    torch::NoGradGuard no_grad;
    auto router = plain->named_parameters()["router.weight"];  // [8, 32]
    router.abs_();
    router.narrow(0, 4, 4).neg_();  // experts 4..7: negative logits on positive inputs
  }
  const std::vector<torch::Tensor> x = {torch::rand({1, 3, 32}) + 0.1, torch::rand({1, 3, 32}) + 0.1};
  const std::vector<torch::Tensor> g = {torch::randn({1, 3, 32}), torch::randn({1, 3, 32})};
  ExpectExpertParallelMatches(plain, x, g);
  EXPECT_EQ(plain->counts().narrow(0, 4, 4).sum().item<int64_t>(), 0);
}

// Verifies the near-tie count: a token whose second and third router logits are equal (a tie
// a rounding difference could break either way) is counted, one with a clear gap is not.
TEST(MoETest, NearTiesCountTokensRoutedByATie) {
  DecoderSpec spec = MoeSpec();
  MoE moe(spec, TensorParallel{});
  {
    torch::NoGradGuard no_grad;
    auto router = moe->named_parameters()["router.weight"];
    router.zero_();
    // Token 0 (x = e0): logits 3, 2, 2, 0...: experts 1 and 2 tie for the second place.
    // Token 1 (x = e1): logits 3, 2, 1, 0...: a clear gap.
    router[0][0] = 3;
    router[1][0] = 2;
    router[2][0] = 2;
    router[0][1] = 3;
    router[1][1] = 2;
    router[2][1] = 1;
  }
  torch::Tensor x = torch::zeros({1, 2, 32});
  x[0][0][0] = 1;
  x[0][1][1] = 1;
  torch::NoGradGuard no_grad;
  moe->forward(x);
  EXPECT_EQ(moe->near_ties(), 1);
  EXPECT_EQ(moe->counts().sum().item<int64_t>(), 4);  // 2 tokens x top-2
  moe->ResetCounts();
  EXPECT_EQ(moe->near_ties(), 0);
  EXPECT_EQ(moe->counts().sum().item<int64_t>(), 0);
}

}  // namespace
}  // namespace gatehouse::models
