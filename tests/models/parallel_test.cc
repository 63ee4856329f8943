// The parallel gate on the transformers-saved fixtures: every family at TP=2 and the 8-head /
// 4-KV-head fixtures at TP=4, one thread per rank over a real gloo group on 127.0.0.1, against
// the TP=1 control (logits, one training step's loss and gathered gradients, save bit for
// bit). Plus what must fail: a plan that disagrees with the model, a missing all-reduce, a TP
// size that does not divide the heads, and a worker not started as a rank group.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/models/family_test_util.h"
#include "tests/models/parallel_ranks.h"

namespace gatehouse {
namespace {

using ::testing::HasSubstr;
using worker::GateOutcome;
using gatehouse::GateStatus;

using TpRun = test_util::RankOutcomes;

/// Runs config, construct, load and the parallel gate on `tp` in-process ranks for a fixture.
/// `family_override` replaces the registry's family (to inject faults).
TpRun RunParallelGate(const std::string& variant, const std::string& family, int tp,
                      const std::string& precision,
                      const worker::ModelFamily* family_override = nullptr) {
  CellSpec::Topology topology;
  topology.tp = tp;
  return test_util::RunParallelRanks(variant, family, topology, precision, family_override);
}

/// Expects every rank to PASS and rank 0's figures to meet the fp32 bars.
void ExpectParity(const std::string& variant, const std::string& family, int tp,
                  const std::string& precision = "fp32") {
  SCOPED_TRACE(variant + " tp=" + std::to_string(tp) + " " + precision);
  const TpRun run = RunParallelGate(variant, family, tp, precision);
  for (int r = 0; r < tp; ++r) {
    ASSERT_EQ(run.errors[r], "") << "rank " << r;
    ASSERT_EQ(run.early[r], "") << "rank " << r;
    EXPECT_EQ(run.outcomes[r].status, GateStatus::kPass) << "rank " << r << ": " << run.outcomes[r].reason;
  }
  const GateOutcome& out = run.outcomes[0];
  test_util::PrintFigures(variant + " tp=" + std::to_string(tp) + " " + precision, out,
                          {"kl_mean_vs_tp1", "top1_agreement_vs_tp1", "loss_rel_diff",
                           "grad_max_rel_diff", "save_tensors_equal"});
  auto real = [&](const char* name) {
    const worker::Figure* f = out.Find(name);
    EXPECT_NE(f, nullptr) << name;
    return f ? std::get<double>(f->value) : -1.0;
  };
  // The judged figures lead (a report shows the first few).
  ASSERT_FALSE(out.figures.empty());
  EXPECT_EQ(out.figures[0].name, "kl_mean_vs_tp1");
  if (precision == "fp32") {
    EXPECT_LT(real("kl_mean_vs_tp1"), 1e-6);
    EXPECT_EQ(real("top1_agreement_vs_tp1"), 100.0);
    EXPECT_LT(real("grad_max_rel_diff"), 1e-4);
    EXPECT_LT(real("loss_rel_diff"), 1e-5);
  } else {
    // bf16: the rounding spread each gradient bar may widen to was measured, not assumed.
    EXPECT_GT(real("grad_bf16_floor_max_rel"), 0.0);
    EXPECT_LT(real("grad_nearest_bar_rel_diff"), real("grad_nearest_bar"));
    EXPECT_LE(real("grad_nearest_bar_rel_diff"), real("grad_max_rel_diff"));
  }
  EXPECT_EQ(test_util::FigureText(out, "save_sha256_tp"), test_util::FigureText(out, "save_sha256_tp1"));
  EXPECT_NE(test_util::FigureText(out, "save_sha256_tp"), "-");
  for (int r = 0; r < tp; ++r) {
    EXPECT_NE(out.Find("param_elements_rank" + std::to_string(r)), nullptr) << r;
  }
}

// Verifies TP=2 parity on one fixture per family (GQA, tied and untied lm_head, q/k/v and o
// biases, q/k norms, fused qkv / gate_up, MoE experts, sandwich norms and soft-capping).
TEST(ParallelGateTest, Tp2EveryFamily) {
  ExpectParity("llama-tiny-untied", "llama", 2);
  ExpectParity("llama-tiny-tied", "llama", 2);
  ExpectParity("qwen2-tiny-untied", "qwen2", 2);
  ExpectParity("qwen3-tiny-bias", "qwen3", 2);
  ExpectParity("mistral-tiny-untied", "mistral", 2);
  ExpectParity("phi3-tiny-untied", "phi3", 2);
  ExpectParity("qwen3_moe-tiny-untied", "qwen3_moe", 2);
  ExpectParity("gemma-tiny-attn-bias", "gemma", 2);
  ExpectParity("gemma2-tiny-untied", "gemma2", 2);
  ExpectParity("gemma3-tiny-tied", "gemma3", 2);
}

// Verifies TP=4 parity on the fixtures with 8 query heads over 4 KV heads.
TEST(ParallelGateTest, Tp4) {
  ExpectParity("llama-tiny-kv4", "llama", 4);
  ExpectParity("qwen3-tiny-kv4", "qwen3", 4);
  ExpectParity("phi3-tiny-kv4", "phi3", 4);
  ExpectParity("qwen3_moe-tiny-kv4", "qwen3_moe", 4);
  ExpectParity("gemma2-tiny-kv4", "gemma2", 4);
}

// Verifies bf16 runs under TP too (bf16 bars: top-1 over the decided tokens, gradients within
// their measured rounding spread) and the save stays bit-equal. The sliding-window MoE fixture
// failed a fixed 5 % gradient bar on rounding alone (experts.w2 at 0.40 of its max at TP=2).
TEST(ParallelGateTest, Bf16) {
  ExpectParity("qwen3-tiny-untied", "qwen3", 2, "bf16");
  ExpectParity("phi3-tiny-kv4", "phi3", 4, "bf16");
  ExpectParity("qwen3_moe-tiny-sliding", "qwen3_moe", 2, "bf16");
}

/// A family that delegates to a real one, with a fault: a wrong plan, or a communicator that
/// drops all-reduces inside the model (the gate's own collectives are untouched).
class FaultyFamily : public test_util::DelegatingFamily {
 public:
  enum class Fault { kWrongPlan, kNoAllReduce };
  FaultyFamily(const worker::ModelFamily& real, Fault fault) : DelegatingFamily(real), fault_(fault) {}
  Result<worker::TpPlan> Parallelize(const worker::ModelArgs& a, int64_t tp) const override {
    GH_ASSIGN_OR_RETURN(worker::TpPlan plan, real_.Parallelize(a, tp));
    if (fault_ != Fault::kWrongPlan) return plan;
    std::vector<worker::ShardRule> rules = plan.rules();
    for (auto& r : rules) {
      if (r.pattern == "layers.{i}.attention.wo.weight") r.dim = 0;  // split the wrong way
    }
    return worker::TpPlan(tp, rules);
  }
  Result<std::shared_ptr<worker::CausalLM>> ConstructParallel(const worker::ModelArgs& a, torch::Dtype d,
                                                              torch::Device dev,
                                                              const worker::TensorParallel& tp) const override {
    if (fault_ != Fault::kNoAllReduce) return real_.ConstructParallel(a, d, dev, tp);
    worker::TensorParallel broken = tp;
    broken.comm = std::make_shared<NoAllReduce>(tp.comm);
    return real_.ConstructParallel(a, d, dev, broken);
  }

 private:
  struct NoAllReduce : worker::TpCommunicator {
    explicit NoAllReduce(std::shared_ptr<worker::TpCommunicator> c) : inner(std::move(c)) {}
    int64_t rank() const override { return inner->rank(); }
    int64_t world_size() const override { return inner->world_size(); }
    void AllReduceSum(torch::Tensor&) override {}
    std::vector<torch::Tensor> AllGather(const torch::Tensor& t) override { return inner->AllGather(t); }
    std::shared_ptr<worker::TpCommunicator> inner;
  };
  Fault fault_;
};

// Verifies a plan that splits wo along the wrong dimension FAILs adapter_contract on the
// sharded load, naming the parameter, on every rank.
TEST(ParallelGateTest, WrongPlanFails) {
  const FaultyFamily faulty(test_util::FamilyByName("llama"), FaultyFamily::Fault::kWrongPlan);
  const TpRun run = RunParallelGate("llama-tiny-untied", "llama", 2, "fp32", &faulty);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(run.errors[r], "");
    EXPECT_EQ(run.outcomes[r].status, GateStatus::kFail) << r;
  }
  EXPECT_EQ(run.outcomes[0].classification, FailureClass::kAdapterContract);
  EXPECT_THAT(run.outcomes[0].reason, HasSubstr("attention.wo.weight"));
}

// Verifies a model whose row-parallel outputs are never summed FAILs on the logits against
// the TP=1 control.
TEST(ParallelGateTest, MissingAllReduceFails) {
  const FaultyFamily faulty(test_util::FamilyByName("llama"), FaultyFamily::Fault::kNoAllReduce);
  const TpRun run = RunParallelGate("llama-tiny-untied", "llama", 2, "fp32", &faulty);
  ASSERT_EQ(run.errors[0], "");
  EXPECT_EQ(run.outcomes[0].status, GateStatus::kFail);
  EXPECT_THAT(run.outcomes[0].reason, HasSubstr("kl_mean_vs_tp1"));
}

// Verifies the plan names the config field a TP size does not divide, and the config gate
// already FAILs such a cell.
TEST(ParallelGateTest, IndivisibleHeadsAreNamed) {
  const worker::ModelFamily& llama = test_util::FamilyByName("llama");
  auto parsed = llama.ParseConfig(test_util::FixtureConfig("llama-tiny-untied"));
  ASSERT_TRUE(parsed.ok());
  auto plan = llama.Parallelize(*parsed->args, 4);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(),
              HasSubstr("'num_key_value_heads' = 2 is not divisible by the tensor-parallel size 4"));
  const TpRun run = RunParallelGate("llama-tiny-untied", "llama", 4, "fp32");
  EXPECT_THAT(run.early[0], HasSubstr("config: tensor-parallel size tp=4 does not divide"));
}

// Verifies the gate is SKIPPED at world size 1 and BLOCKED when the topology asks for ranks
// the worker was not started with.
TEST(ParallelGateTest, SkippedAloneBlockedWithoutGroup) {
  test_util::TempDir attempt("gatehouse-parallel");
  worker::GateContext ctx = test_util::FixtureContext(test_util::FixtureDir("llama-tiny-untied"),
                                                      "llama", "fp32", attempt.path());
  EXPECT_EQ(worker::ParallelGate(ctx).status, GateStatus::kSkipped);
  ctx.spec.topology.tp = 2;
  const GateOutcome out = worker::ParallelGate(ctx);
  EXPECT_EQ(out.status, GateStatus::kBlocked);
  EXPECT_THAT(out.reason, HasSubstr("needs 2 worker ranks, but this worker runs as rank 0 of 1"));
}

// Verifies the backend must follow the device: a CPU cell whose rank joined no gloo group (or
// an NCCL one) is BLOCKED naming both, before any collective.
TEST(ParallelGateTest, BlockedWhenTheBackendDoesNotFitTheDevice) {
  test_util::TempDir attempt("gatehouse-parallel");
  worker::GateContext ctx = test_util::FixtureContext(test_util::FixtureDir("llama-tiny-untied"),
                                                      "llama", "fp32", attempt.path());
  ctx.spec.topology.tp = 2;
  ctx.world_size = 2;
  struct Unused : worker::TpCommunicator {
    int64_t rank() const override { return 0; }
    int64_t world_size() const override { return 2; }
    void AllReduceSum(torch::Tensor&) override { ADD_FAILURE() << "no collective may run"; }
    std::vector<torch::Tensor> AllGather(const torch::Tensor&) override {
      ADD_FAILURE() << "no collective may run";
      return {};
    }
  };
  ctx.comm = std::make_shared<Unused>();
  ctx.comm_backend = "nccl";
  const GateOutcome out = worker::ParallelGate(ctx);
  EXPECT_EQ(out.status, GateStatus::kBlocked);
  EXPECT_THAT(out.reason, HasSubstr("device cpu needs a gloo group but this rank joined nccl"));
}

// Verifies every parameter of every family's model at TP=2 has a plan rule and the plan is
// the same table at TP=1 (every split trivial).
TEST(ParallelGateTest, PlanCoversEveryParameter) {
  for (const auto& [variant, family] : std::vector<std::pair<std::string, std::string>>{
           {"phi3-tiny-untied", "phi3"}, {"qwen3_moe-tiny-untied", "qwen3_moe"},
           {"gemma2-tiny-untied", "gemma2"}, {"qwen3-tiny-bias", "qwen3"}}) {
    const worker::ModelFamily& f = test_util::FamilyByName(family);
    auto parsed = f.ParseConfig(test_util::FixtureConfig(variant));
    ASSERT_TRUE(parsed.ok()) << variant;
    auto model = f.Construct(*parsed->args, torch::kFloat32, torch::kCPU);
    ASSERT_TRUE(model.ok());
    auto plan = f.Parallelize(*parsed->args, 2);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (const auto& item : (*model)->named_parameters()) {
      EXPECT_NE(plan->Find(item.key()), nullptr) << variant << ": " << item.key();
    }
  }
}

}  // namespace
}  // namespace gatehouse
