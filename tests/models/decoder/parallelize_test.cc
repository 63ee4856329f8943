// models/decoder/parallelize: the decoder's tensor-parallel plan. Every parameter of the full
// model has a rule, the local shapes it gives are the shapes DecoderModel builds on each rank,
// fused projections are split per block (q / k / v, gate / up), and what cannot be split is
// refused naming the config field.

#include "decoder/parallelize.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "decoder/model.h"
#include "tests/models/decoder/tiny_spec.h"

namespace gatehouse::models {
namespace {

/// Building a rank's model needs a communicator, but construction never calls it.
class UnusedCommunicator : public worker::TpCommunicator {
 public:
  explicit UnusedCommunicator(int64_t size) : size_(size) {}
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return size_; }
  void AllReduceSum(torch::Tensor&) override { ADD_FAILURE() << "AllReduceSum at construction"; }
  std::vector<torch::Tensor> AllGather(const torch::Tensor& t) override {
    ADD_FAILURE() << "AllGather at construction";
    return {t};
  }

 private:
  int64_t size_;
};

std::map<std::string, std::vector<int64_t>> Shapes(DecoderModel& model) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : model.named_parameters()) shapes[p.key()] = p.value().sizes().vec();
  return shapes;
}

/// A spec with every kind of parameter the plan covers: biases everywhere, q/k norms, sandwich
/// norms, one dense and one MoE layer.
DecoderSpec EveryParameterKind() {
  DecoderSpec spec = test_util::TinySpec();
  spec.qkv_bias = spec.o_bias = spec.mlp_bias = true;
  spec.qk_norm = spec.sandwich_norm = true;
  spec.num_experts = 4;
  spec.num_experts_per_tok = 2;
  spec.moe_intermediate_size = 16;
  spec.layers[1].moe = true;
  return spec;
}

void ExpectPlanGivesTheRankShapes(const DecoderSpec& spec, int64_t tp) {
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  auto plan = DecoderTpPlan(spec, tp);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  DecoderModel full(spec);
  const auto full_shapes = Shapes(full);
  for (int64_t rank = 0; rank < tp; ++rank) {
    DecoderModel local(spec, TensorParallel{rank, tp, std::make_shared<UnusedCommunicator>(tp)});
    const auto local_shapes = Shapes(local);
    ASSERT_EQ(local_shapes.size(), full_shapes.size());
    for (const auto& [name, shape] : full_shapes) {
      SCOPED_TRACE(name + " at tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const worker::ShardRule* rule = plan->Find(name);
      ASSERT_NE(rule, nullptr) << "no rule covers " << name;
      auto expected = plan->LocalShape(*rule, shape);
      ASSERT_TRUE(expected.ok()) << expected.status().ToString();
      ASSERT_TRUE(local_shapes.count(name));
      EXPECT_EQ(local_shapes.at(name), *expected);
    }
  }
}

TEST(DecoderTpPlan, EveryParameterHasARuleGivingTheShapeEachRankBuilds) {
  for (int64_t tp : {1, 2}) ExpectPlanGivesTheRankShapes(EveryParameterKind(), tp);
  DecoderSpec fused = test_util::TinySpec();
  fused.fused_qkv = fused.fused_gate_up = true;
  fused.qkv_bias = true;
  ExpectPlanGivesTheRankShapes(fused, 2);
  DecoderSpec mha = test_util::TinySpec();
  mha.num_key_value_heads = 4;
  ExpectPlanGivesTheRankShapes(mha, 4);
}

TEST(DecoderTpPlan, FusedQkvIsSplitPerBlock) {
  // wqkv rows are [q (4 heads x 8) | k (2 x 8) | v (2 x 8)]. Rank r must hold its q heads, its
  // k heads and its v heads, in that order: exactly the rows of the three split projections.
  DecoderSpec spec = test_util::TinySpec();
  spec.fused_qkv = true;
  auto plan = DecoderTpPlan(spec, 2);
  ASSERT_TRUE(plan.ok());
  const int64_t q = 32, kv = 16;
  const auto fused = torch::arange(q + 2 * kv, torch::kFloat32).unsqueeze(1).repeat({1, 32});
  const auto wq = fused.narrow(0, 0, q), wk = fused.narrow(0, q, kv),
             wv = fused.narrow(0, q + kv, kv);
  const worker::ShardRule* rule = plan->Find("layers.0.attention.wqkv.weight");
  const worker::ShardRule* split = plan->Find("layers.0.attention.wq.weight");
  ASSERT_NE(rule, nullptr);
  ASSERT_NE(split, nullptr);
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto shard = plan->Shard(*rule, fused, rank);
    ASSERT_TRUE(shard.ok()) << shard.status().ToString();
    const auto expected = torch::cat({*plan->Shard(*split, wq, rank), *plan->Shard(*split, wk, rank),
                                      *plan->Shard(*split, wv, rank)});
    EXPECT_TRUE(torch::equal(*shard, expected)) << "rank " << rank;
  }
}

TEST(DecoderTpPlan, FusedGateUpIsSplitPerBlock) {
  DecoderSpec spec = test_util::TinySpec();
  spec.fused_gate_up = true;
  auto plan = DecoderTpPlan(spec, 2);
  ASSERT_TRUE(plan.ok());
  const auto fused = torch::arange(2 * 64, torch::kFloat32).unsqueeze(1).repeat({1, 32});
  const worker::ShardRule* rule = plan->Find("layers.1.feed_forward.w13.weight");
  ASSERT_NE(rule, nullptr);
  auto shard = plan->Shard(*rule, fused, 1);
  ASSERT_TRUE(shard.ok());
  // Rank 1 holds gate rows 32..63 then up rows 96..127.
  const auto expected = torch::cat({fused.narrow(0, 32, 32), fused.narrow(0, 96, 32)});
  EXPECT_TRUE(torch::equal(*shard, expected));
}

TEST(DecoderTpPlan, VocabularySplitOnlyWhenTpDividesVocabSize) {
  DecoderSpec spec = test_util::TinySpec();
  EXPECT_FALSE(VocabParallel(spec, 1));
  EXPECT_TRUE(VocabParallel(spec, 2));
  spec.vocab_size = 65;
  EXPECT_FALSE(VocabParallel(spec, 2));
  auto plan = DecoderTpPlan(spec, 2);
  ASSERT_TRUE(plan.ok());
  const worker::ShardRule* embeddings = plan->Find("tok_embeddings.weight");
  ASSERT_NE(embeddings, nullptr);
  EXPECT_EQ(embeddings->style, worker::ShardStyle::kReplicated);
  EXPECT_NE(embeddings->note.find("vocab_size 65 is not divisible by tp 2"), std::string::npos)
      << embeddings->note;
}

TEST(DecoderTpPlan, WhatCannotBeSplitIsNamed) {
  DecoderSpec spec = test_util::TinySpec();
  EXPECT_EQ(DecoderTpPlan(spec, 4).status().message(),
            "config field 'num_key_value_heads' = 2 is not divisible by the tensor-parallel "
            "size 4");
  EXPECT_EQ(DecoderTpPlan(spec, 3).status().message(),
            "config field 'num_attention_heads' = 4 is not divisible by the tensor-parallel "
            "size 3");
  EXPECT_EQ(DecoderTpPlan(spec, 0).status().message(),
            "tensor-parallel size 0 must be at least 1");
  spec.intermediate_size = 65;
  EXPECT_EQ(DecoderTpPlan(spec, 2).status().message(),
            "config field 'intermediate_size' = 65 is not divisible by the tensor-parallel "
            "size 2");
  DecoderSpec moe = EveryParameterKind();
  moe.moe_intermediate_size = 15;
  moe.layers[0].moe = true;  // no dense layer left: intermediate_size is not split
  moe.intermediate_size = 65;
  EXPECT_EQ(DecoderTpPlan(moe, 2).status().message(),
            "config field 'moe_intermediate_size' = 15 is not divisible by the tensor-parallel "
            "size 2");
}

}  // namespace
}  // namespace gatehouse::models
