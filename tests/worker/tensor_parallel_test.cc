// Tensor-parallel building blocks (tensor_parallel.h): plan rules as data (pattern matching,
// shard / unshard with fused blocks and stacked experts, divisibility errors) and the Megatron
// mappings' forward and backward over real gloo groups of 2 and 4 in-process ranks.
#include "gatehouse/worker/tensor_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "tests/worker/gloo_ranks.h"

namespace gatehouse::worker {
namespace {

using ::testing::HasSubstr;

// Verifies "{i}" matches one or more digits and nothing else, and the whole name must match.
TEST(TpPlanTest, PatternMatchesLayerIndex) {
  EXPECT_TRUE(MatchesParamPattern("layers.{i}.attention.wq.weight", "layers.0.attention.wq.weight"));
  EXPECT_TRUE(MatchesParamPattern("layers.{i}.attention.wq.weight", "layers.17.attention.wq.weight"));
  EXPECT_FALSE(MatchesParamPattern("layers.{i}.attention.wq.weight", "layers..attention.wq.weight"));
  EXPECT_FALSE(MatchesParamPattern("layers.{i}.attention.wq.weight", "layers.x.attention.wq.weight"));
  EXPECT_FALSE(MatchesParamPattern("layers.{i}.attention.wq.weight", "layers.0.attention.wq.bias"));
  EXPECT_FALSE(MatchesParamPattern("norm.weight", "norm.weight2"));
  EXPECT_TRUE(MatchesParamPattern("norm.weight", "norm.weight"));
}

// Verifies a fused [q | k | v] weight is split block by block: rank r holds piece r of q, of
// k and of v, in that order, and Unshard restores the full tensor exactly.
TEST(TpPlanTest, FusedBlocksShardAndUnshard) {
  const ShardRule rule{"wqkv.weight", ShardStyle::kColwise, 0, {8, 4, 4}, ""};
  const TpPlan plan(2, {rule});
  const torch::Tensor full = torch::arange(16 * 3, torch::kFloat).view({16, 3});
  std::vector<torch::Tensor> shards;
  for (int64_t r = 0; r < 2; ++r) {
    auto s = plan.Shard(rule, full, r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_EQ(s->sizes(), (std::vector<int64_t>{8, 3}));
    shards.push_back(*s);
  }
  // Rank 1: q rows 4..7, k rows 10..11, v rows 14..15.
  const torch::Tensor want1 = torch::cat({full.slice(0, 4, 8), full.slice(0, 10, 12), full.slice(0, 14, 16)});
  EXPECT_TRUE(torch::equal(shards[1], want1));
  auto back = plan.Unshard(rule, shards);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(torch::equal(*back, full));
}

// Verifies a stacked expert parameter [E, I, H] split along dim 1 shards each expert's slice
// [I, H] along its dim 0 (leading = 1), and that the local shape follows.
TEST(TpPlanTest, StackedExpertSliceUsesLeadingOffset) {
  const ShardRule rule{"moe.experts.w1", ShardStyle::kColwise, 1, {}, ""};
  const TpPlan plan(4, {rule});
  auto whole = plan.LocalShape(rule, {3, 8, 5});
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*whole, (std::vector<int64_t>{3, 2, 5}));
  auto slice = plan.LocalShape(rule, {8, 5}, /*leading=*/1);
  ASSERT_TRUE(slice.ok());
  EXPECT_EQ(*slice, (std::vector<int64_t>{2, 5}));
  const torch::Tensor expert = torch::arange(40, torch::kFloat).view({8, 5});
  auto s = plan.Shard(rule, expert, 3, /*leading=*/1);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(torch::equal(*s, expert.slice(0, 6, 8)));
}

// Verifies row-wise splits run along dim 1 and replicated rules leave the tensor whole.
TEST(TpPlanTest, RowwiseAndReplicated) {
  const ShardRule row{"wo.weight", ShardStyle::kRowwise, 1, {}, ""};
  const ShardRule rep{"norm.weight", ShardStyle::kReplicated, 0, {}, "replicated"};
  const TpPlan plan(2, {row, rep});
  const torch::Tensor w = torch::arange(12, torch::kFloat).view({3, 4});
  auto s0 = plan.Shard(row, w, 0), s1 = plan.Shard(row, w, 1);
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_TRUE(torch::equal(*s1, w.slice(1, 2, 4)));
  EXPECT_TRUE(torch::equal(*plan.Unshard(row, {*s0, *s1}), w));
  const torch::Tensor n = torch::ones({4});
  EXPECT_TRUE(torch::equal(*plan.Shard(rep, n, 1), n));
  EXPECT_EQ(plan.Find("wo.weight"), &plan.rules()[0]);
  EXPECT_EQ(plan.Find("nothing"), nullptr);
}

// Verifies a dimension (or block) the TP size does not divide is INVALID_ARGUMENT naming the
// rule and the size, and a missing dimension is named too.
TEST(TpPlanTest, IndivisibleIsNamed) {
  const TpPlan plan(4, {});
  const ShardRule rule{"layers.{i}.attention.wk.weight", ShardStyle::kColwise, 0, {}, ""};
  auto bad = plan.LocalShape(rule, {6, 8});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("layers.{i}.attention.wk.weight"));
  EXPECT_THAT(bad.status().message(), HasSubstr("of size 6, not divisible by the tensor-parallel size 4"));
  const ShardRule fused{"wqkv.weight", ShardStyle::kColwise, 0, {8, 2, 2}, ""};
  EXPECT_THAT(plan.LocalShape(fused, {12, 8}).status().message(), HasSubstr("block of size 2"));
  const ShardRule deep{"x", ShardStyle::kRowwise, 3, {}, ""};
  EXPECT_THAT(plan.LocalShape(deep, {4, 4}).status().message(), HasSubstr("dim 3 does not exist"));
}

// Verifies the mappings over real gloo groups: Reduce sums forward and passes the gradient
// through; Copy passes forward and sums the gradient; Gather concatenates forward and hands
// each rank its own slice of the gradient.
void ExpectMappings(int world) {
  std::vector<torch::Tensor> reduced(world), reduce_grad(world), copy_grad(world), gathered(world),
      gather_grad(world);
  auto errors = test_util::RunGlooRanks(world, [&](int r, std::shared_ptr<TpCommunicator> comm) {
    const TensorParallel tp{r, world, comm};
    const double k = r + 1;
    // Reduce: y = sum_r x_r; dL/dx_r = dL/dy = 1 * weight.
    auto x = torch::full({2, 3}, k, torch::kDouble).requires_grad_();
    auto y = ReduceFromTensorParallelRegion(x, tp);
    (y * torch::arange(6, torch::kDouble).view({2, 3})).sum().backward();
    reduced[r] = y.detach();
    reduce_grad[r] = x.grad();
    // Copy: y = x; dL/dx = sum over ranks of each rank's dL/dy = (r + 1).
    auto a = torch::ones({4}, torch::kDouble).requires_grad_();
    auto b = CopyToTensorParallelRegion(a, tp);
    (b * k).sum().backward();
    copy_grad[r] = a.grad();
    // Gather along the last dim, then a weighted sum; rank r's gradient is its slice.
    auto g = torch::full({1, 2}, k, torch::kDouble).requires_grad_();
    auto all = GatherFromTensorParallelRegion(g, tp);
    (all * torch::arange(2 * world, torch::kDouble)).sum().backward();
    gathered[r] = all.detach();
    gather_grad[r] = g.grad();
  });
  const double sum = world * (world + 1) / 2.0;
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(torch::equal(reduced[r], torch::full({2, 3}, sum, torch::kDouble)));
    EXPECT_TRUE(torch::equal(reduce_grad[r], torch::arange(6, torch::kDouble).view({2, 3})));
    EXPECT_TRUE(torch::equal(copy_grad[r], torch::full({4}, sum, torch::kDouble)));
    std::vector<double> want;
    for (int q = 0; q < world; ++q) want.insert(want.end(), {q + 1.0, q + 1.0});
    EXPECT_TRUE(torch::equal(gathered[r], torch::tensor(want, torch::kDouble).view({1, -1})));
    EXPECT_TRUE(torch::equal(gather_grad[r],
                             torch::tensor({2.0 * r, 2.0 * r + 1}, torch::kDouble).view({1, 2})));
  }
}

TEST(TpMappingsTest, TwoRanks) { ExpectMappings(2); }
TEST(TpMappingsTest, FourRanks) { ExpectMappings(4); }

// Verifies TP size 1 leaves tensors untouched and needs no communicator.
TEST(TpMappingsTest, SizeOneIsIdentity) {
  const TensorParallel tp;
  auto x = torch::randn({2, 2}).requires_grad_();
  EXPECT_TRUE(ReduceFromTensorParallelRegion(x, tp).is_same(x));
  EXPECT_TRUE(CopyToTensorParallelRegion(x, tp).is_same(x));
  EXPECT_TRUE(GatherFromTensorParallelRegion(x, tp).is_same(x));
}

}  // namespace
}  // namespace gatehouse::worker
