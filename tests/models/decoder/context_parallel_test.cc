// The decoder's packed forward over a context-parallel group (models/decoder/packed.cc
// ForwardPackedContextParallel, Ulysses' exchanges in model.cc's attention) against the plain
// ForwardPacked on the same weights and packing: cp ranks, one thread each over a real gloo
// group on 127.0.0.1, each holding a contiguous part of the packed row.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decoder/model.h"
#include "tests/models/decoder/tiny_spec.h"
#include "tests/worker/gloo_ranks.h"

namespace gatehouse::models {
namespace {

/// Three sequences of 5, 7 and 4 tokens back to back (16 columns), positions restarting at 0
/// for each: the middle one crosses the columns of two ranks at cp=2, and of three at cp=4.
struct Packed {
  torch::Tensor tokens = torch::randint(0, 64, {1, 16}, torch::kLong);
  torch::Tensor positions = torch::cat({torch::arange(5), torch::arange(7), torch::arange(4)})
                                .to(torch::kLong)
                                .unsqueeze(0);
  torch::Tensor cu_seqlens = torch::tensor({0, 5, 12, 16}, torch::kLong);
};

/// Runs `spec` plainly and over `cp` ranks on one packing, with the loss sum(logits * g), and
/// expects each rank's logits to be its columns of the plain ones and the parameter
/// gradients summed over the ranks to be the plain gradients. `local_positions`: each rank
/// passes positions restarted at its first column (the bug) instead.
void ExpectContextParallelMatches(const DecoderSpec& spec, int cp, bool local_positions = false,
                                  bool* logits_matched = nullptr) {
  torch::manual_seed(7);
  DecoderModel plain(spec);
  const Packed p;
  const torch::Tensor g = torch::randn({1, 16, spec.vocab_size});
  const torch::Tensor plain_logits = plain.ForwardPacked(p.tokens, p.positions, p.cu_seqlens);
  (plain_logits * g).sum().backward();
  const int64_t columns = 16 / cp;
  std::vector<torch::Tensor> logits(static_cast<size_t>(cp));
  std::vector<std::map<std::string, torch::Tensor>> grads(static_cast<size_t>(cp));
  const std::vector<std::string> errors = test_util::RunGlooRanks(
      cp, [&](int r, std::shared_ptr<worker::TpCommunicator> comm) {
        DecoderModel model(spec);
        {
          torch::NoGradGuard no_grad;
          auto src = plain.named_parameters();
          for (auto& item : model.named_parameters()) item.value().copy_(src[item.key()]);
        }
        const auto cols = [&](const torch::Tensor& t) { return t.slice(1, r * columns, (r + 1) * columns); };
        torch::Tensor positions = cols(p.positions);
        if (local_positions) positions = torch::minimum(positions, torch::arange(columns).unsqueeze(0));
        const torch::Tensor y = model.ForwardPackedContextParallel(
            cols(p.tokens), positions, p.cu_seqlens, worker::ContextParallel{r, cp, comm});
        (y * cols(g)).sum().backward();
        logits[static_cast<size_t>(r)] = y.detach();
        for (const auto& item : model.named_parameters()) {
          grads[static_cast<size_t>(r)][item.key()] = item.value().grad().clone();
        }
      });
  for (int r = 0; r < cp; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  const torch::Tensor ours = torch::cat(logits, 1);
  const bool matched = torch::allclose(ours, plain_logits, 1e-5, 1e-6);
  if (logits_matched != nullptr) {
    *logits_matched = matched;
    return;
  }
  EXPECT_TRUE(matched) << "max abs diff " << (ours - plain_logits).abs().max().item<double>();
  for (const auto& item : plain.named_parameters()) {
    torch::Tensor sum = torch::zeros_like(item.value());
    for (int r = 0; r < cp; ++r) sum += grads[static_cast<size_t>(r)][item.key()];
    EXPECT_TRUE(torch::allclose(sum, item.value().grad(), 1e-4, 1e-5))
        << item.key() << ": max abs diff " << (sum - item.value().grad()).abs().max().item<double>();
  }
}

// Verifies cp=2 (two KV heads: each rank gets one) and cp=4 (KV heads repeated to the four
// query heads first) give the plain packed logits, and gradients that sum to the plain ones.
TEST(ContextParallelTest, MatchesThePlainPackedForward) {
  ExpectContextParallelMatches(test_util::TinySpec(), 2);
  ExpectContextParallelMatches(test_util::TinySpec(), 4);
}

// Verifies the features that act over the sequence keep their meaning under cp: a sliding
// window and q/k norms, attention soft-capping.
TEST(ContextParallelTest, SlidingWindowAndQkNormMatch) {
  DecoderSpec spec = test_util::TinySpec();
  spec.layers[0].sliding_window = 3;
  spec.qk_norm = true;
  spec.attn_logit_softcapping = 50.0;
  ExpectContextParallelMatches(spec, 2);
}

// Verifies positions restarted at each rank's first column (a sequence crossing into the
// second rank's columns renumbered from 0) change the logits: the test can see the bug the
// parallel gate's kCpLocalPositions mutation plants.
TEST(ContextParallelTest, LocalPositionsDiffer) {
  bool matched = true;
  ExpectContextParallelMatches(test_util::TinySpec(), 2, /*local_positions=*/true, &matched);
  EXPECT_FALSE(matched);
}

// Verifies a cp that does not divide the query heads is refused naming the heads.
TEST(ContextParallelTest, RefusesACpNotDividingTheHeads) {
  DecoderSpec spec = test_util::TinySpec();
  spec.num_attention_heads = 3;
  spec.num_key_value_heads = 1;
  spec.hidden_size = 24;
  const std::vector<std::string> errors = test_util::RunGlooRanks(
      2, [&](int r, std::shared_ptr<worker::TpCommunicator> comm) {
        DecoderModel model(spec);
        const Packed p;
        model.ForwardPackedContextParallel(p.tokens.slice(1, r * 8, (r + 1) * 8),
                                           p.positions.slice(1, r * 8, (r + 1) * 8), p.cu_seqlens,
                                           worker::ContextParallel{r, 2, comm});
      });
  EXPECT_NE(errors[0].find("does not divide the 3 query heads"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace gatehouse::models
