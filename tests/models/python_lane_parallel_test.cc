// The parallel gate on the Python lane: the reference adapters' own parallelize (DTensor tensor
// parallelism), data_parallel (FSDP2) and expert_parallel (torchtitan's ExpertParallel) run by
// worker processes as the agent starts them, each layout against the single-rank control, and
// adapters whose parallelism is broken the ways it breaks, each caught with a reason naming it.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/models/python_lane_util.h"

namespace gatehouse::worker {
namespace {

using namespace lane_test;  // NOLINT(google-build-using-namespace)

/// The parallel gate on the lane: two worker processes, each rank's interpreter joins
/// torch.distributed's gloo group through the worker's rendezvous and runs the reference
/// adapter's own parallelize (DTensor, Megatron style). TP=2 agrees with TP=1 within the bars,
/// each rank holds less than the whole model, and the gathered save is bit-equal.
TEST(PythonLane, ParallelGateRunsTheAdaptersParallelize) {
  const auto fixtures = Fixtures({"llama", "qwen3_moe"});
  for (const auto& [variant, family, precision] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"llama-tiny-untied", "llama", "fp32"},
           {"llama-tiny-tied", "llama", "bf16"},
           {"qwen3_moe-tiny-untied", "qwen3_moe", "fp32"}}) {
    if (!fixtures.count(variant)) {
      ADD_FAILURE() << "no fixture " << variant << ": run through ctest";
      continue;
    }
    const auto ranks = RunWorker("gh_archon." + family + ".spec:SPEC", family, variant, precision,
                                 kParallelPhases, /*world=*/2);
    ASSERT_TRUE(ranks[0].ends.count("parallel")) << variant;
    const json& end = ranks[0].ends.at("parallel");
    EXPECT_EQ(end.value("status", ""), "PASS") << variant << " " << precision << ": " << end.dump();
    EXPECT_EQ(ranks[1].ends.count("parallel") ? ranks[1].ends.at("parallel").value("status", "") : "",
              "PASS")
        << variant;
    // Exit status 0 after run_end: torch's thread-local Python objects (DTensor's caches) are
    // released with the GIL held (gatehouse_python_lane_before_exit).
    EXPECT_EQ(ranks[0].exit_code, 0) << variant;
    EXPECT_EQ(ranks[1].exit_code, 0) << variant;
    EXPECT_EQ(ranks[0].Figure("parallel", "max_abs_diff_across_ranks"), 0.0) << variant;
    EXPECT_EQ(ranks[0].Figure("parallel", "process_group"), "gloo");
    EXPECT_EQ(ranks[0].Figure("parallel", "sharded_by"), "the adapter's parallelize (torch.distributed DTensor)");
    const json full = ranks[0].Figure("parallel", "param_elements_tp1");
    ASSERT_TRUE(full.is_number()) << end.dump();
    for (const char* r : {"param_elements_rank0", "param_elements_rank1"}) {
      EXPECT_LT(ranks[0].Figure("parallel", r).get<int64_t>(), full.get<int64_t>()) << variant << " " << r;
    }
    EXPECT_GT(ranks[0].Figure("parallel", "save_tensors_equal").get<int64_t>(), 0) << variant;
    if (precision == "fp32") {
      EXPECT_LT(ranks[0].Figure("parallel", "kl_mean_vs_tp1").get<double>(), 1e-6) << variant;
    }
  }
}


// Verifies the parallel gate's measure-only mode on the lane (tools/bench/parallel_layouts.py
// --python-entry): at world size 1 the adapter's model trains as it loaded (no group to hand
// parallelize), at dp_shard=2 the adapter's FSDP2 shards it; every rank ends SKIPPED with the
// same step-1 loss as the single rank, FSDP2 holding half the parameters per rank.
TEST(PythonLane, MeasuredOnlyTrainsTheAdaptersLayout) {
  if (!Fixtures({"llama"}).count("llama-tiny-untied")) GTEST_SKIP() << "no fixture";
  const std::vector<std::string> phases = {"config", "construct", "load", "parallel"};
  const std::string entry = "gh_archon.llama.spec:SPEC";
  const auto alone = RunWorker(entry, "llama", "llama-tiny-untied", "fp32", phases, 1, "", "tp",
                               "--parallel-measure-only");
  const auto fsdp = RunWorker(entry, "llama", "llama-tiny-untied", "fp32", phases, 2, "", "dp_shard",
                              "--parallel-measure-only");
  for (const auto* run : {&alone, &fsdp}) {
    for (const WorkerRun& rank : *run) {
      ASSERT_TRUE(rank.ends.count("parallel"));
      const json& end = rank.ends.at("parallel");
      EXPECT_EQ(end.value("status", ""), "SKIPPED") << end.dump();
      EXPECT_NE(end.value("reason", "").find("measured only"), std::string::npos) << end.dump();
      EXPECT_EQ(rank.exit_code, 0);
    }
  }
  // FSDP2 gives each rank as many sequences (the batch cut once more than at world size 1):
  // the losses are the gate's own dp_shard=2 run's, the one the control is compared with.
  const auto gate = RunWorker(entry, "llama", "llama-tiny-untied", "fp32", phases, 2, "", "dp_shard");
  ASSERT_TRUE(gate[0].ends.count("parallel"));
  EXPECT_EQ(gate[0].ends.at("parallel").value("status", ""), "PASS");
  const int64_t params = alone[0].Figure("parallel", "parameter_elements_held").get<int64_t>();
  EXPECT_GT(alone[0].Figure("parallel", "loss_step_1").get<double>(), 0.0);
  for (const WorkerRun& rank : fsdp) {
    EXPECT_EQ(rank.Figure("parallel", "loss_step_1"), gate[0].Figure("parallel", "loss_step_1"));
    EXPECT_LT(rank.Figure("parallel", "parameter_elements_held").get<int64_t>(), params * 6 / 10);
  }
}

/// Data parallelism on the lane: two worker processes, each holding the adapter's model
/// (build_model, from_hf), train two AdamW steps on their share of the reference prompts: with
/// the adapter's own data_parallel (FSDP2 fully_shard: the model reduce-scatters its gradients,
/// each rank holds and steps its dim-0 shards) or, for a SPEC without one, with the gate
/// replicating the model and all-reducing the gradients (dp=2) or also keeping each rank's
/// optimizer state to its dim-0 slices (dp_shard=2). The losses, the global grad norms and
/// every gradient agree with the single-rank control on rank 0, and the replicas stay
/// bit-equal.
TEST(PythonLane, DataParallelTrainsLikeOneRank) {
  const auto fixtures = Fixtures({"llama"});
  if (!fixtures.count("llama-tiny-untied")) GTEST_SKIP() << "no fixture";
  test_util::TempDir dir;
  WriteSpecPackage(dir.path(), "gate_reduces", "llama",
                   "SPEC = dataclasses.replace(_GOOD, data_parallel=None)\n");
  for (const bool adapters_fsdp : {true, false}) {
    for (const std::string dimension : {"dp", "dp_shard"}) {
      const std::string label = std::string(adapters_fsdp ? "the adapter's FSDP2" : "the gate") + " " + dimension;
      SCOPED_TRACE(label);
      const auto ranks = RunWorker(adapters_fsdp ? "gh_archon.llama.spec:SPEC" : "gate_reduces.spec:SPEC",
                                   "llama", "llama-tiny-untied", "fp32", kParallelPhases,
                                   /*world=*/2, dir.path().string(), dimension);
      ASSERT_TRUE(ranks[0].ends.count("parallel"));
      const json& end = ranks[0].ends.at("parallel");
      EXPECT_EQ(end.value("status", ""), "PASS") << end.dump();
      EXPECT_EQ(ranks[1].ends.count("parallel") ? ranks[1].ends.at("parallel").value("status", "") : "", "PASS");
      std::cout << "[parallel figures] python lane llama-tiny-untied " << dimension << "=2 fp32, "
                << (adapters_fsdp ? "reduced by the adapter's FSDP2" : "reduced by the gate");
      for (const char* name : {"loss_step_1", "loss_step_1_rel_diff", "loss_step_2_rel_diff",
                               "grad_norm_step_1", "grad_norm_step_1_rel_diff", "grad_norm_step_2_rel_diff",
                               "grad_norm_sharded_step_1_rel_diff", "grad_max_rel_diff", "grad_order_floor_max_rel", "grads_bit_equal",
                               "grads_compared", "grads_step1_bit_equal_to_grouping",
                               "replica_max_abs_diff", "params_after_max_abs_diff",
                               "save_tensors_bit_equal", "save_tensors", "global_batch_sequences",
                               "optimizer_state_elements_rank0", "optimizer_state_elements_unsharded"}) {
        std::cout << " " << name << "=" << ranks[0].Figure("parallel", name).dump();
      }
      std::cout << std::endl;
      EXPECT_EQ(ranks[0].Figure("parallel", "replica_max_abs_diff"), 0.0);
      EXPECT_LT(ranks[0].Figure("parallel", "loss_step_2_rel_diff").get<double>(), 1e-5);
      EXPECT_LT(ranks[0].Figure("parallel", "grad_norm_step_1_rel_diff").get<double>(), 1e-5);
      if (adapters_fsdp) {
        EXPECT_LT(ranks[0].Figure("parallel", "grad_norm_sharded_step_1_rel_diff").get<double>(), 1e-5);
      }
      EXPECT_EQ(ranks[0].Figure("parallel", "save_tensors_bit_equal"), ranks[0].Figure("parallel", "save_tensors"));
      EXPECT_NE(ranks[0].Figure("parallel", "replicated_by").get<std::string>().find(
                    adapters_fsdp ? "the adapter's data_parallel" : "every rank holds the whole model"),
                std::string::npos)
          << ranks[0].Figure("parallel", "replicated_by");
      const int64_t state = ranks[0].Figure("parallel", "optimizer_state_elements_rank0").get<int64_t>();
      const int64_t unsharded = ranks[0].Figure("parallel", "optimizer_state_elements_unsharded").get<int64_t>();
      if (adapters_fsdp || dimension == "dp_shard") {
        EXPECT_LT(state, unsharded);
      } else {
        EXPECT_EQ(state, unsharded);
      }
      EXPECT_EQ(ranks[0].exit_code, 0);
      EXPECT_EQ(ranks[1].exit_code, 0);
    }
  }
}

/// Data parallelism with the adapter's own tensor parallelism inside each replica (four worker
/// processes): the lane hands the adapter's parallelize the "tp" dimension of a ("dp", "tp")
/// device mesh. llama-tiny-tied dp=2 x tp=2 with a SPEC without data_parallel: the gate
/// reduces each rank's local gradient shards over the data-parallel group; qwen3_moe
/// dp_shard=2 x tp=2 with the reference adapter's FSDP2 over "dp" (2-D DTensors: Shard(0) over
/// dp, the tp plan's placement over tp), the model reducing by itself. Shards are gathered
/// through the model's own placements; the two steps agree with the single-rank control, each
/// rank holds less than half the optimizer state, and the replicas stay bit-equal.
TEST(PythonLane, DataParallelWithTheAdaptersTensorParallelism) {
  const auto fixtures = Fixtures({"llama", "qwen3_moe"});
  test_util::TempDir dir;
  WriteSpecPackage(dir.path(), "gate_reduces", "llama",
                   "SPEC = dataclasses.replace(_GOOD, data_parallel=None)\n");
  for (const auto& [variant, family, layout, entry] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"llama-tiny-tied", "llama", "dp=2,tp=2", "gate_reduces.spec:SPEC"},
           {"qwen3_moe-tiny-untied", "qwen3_moe", "dp_shard=2,tp=2", "gh_archon.qwen3_moe.spec:SPEC"}}) {
    SCOPED_TRACE(variant + " " + layout);
    if (!fixtures.count(variant)) {
      ADD_FAILURE() << "no fixture " << variant << ": run through ctest";
      continue;
    }
    const auto ranks = RunWorker(entry, family, variant, "fp32", kParallelPhases, /*world=*/4,
                                 dir.path().string(), layout);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(ranks[r].ends.count("parallel")) << "rank " << r;
      EXPECT_EQ(ranks[r].ends.at("parallel").value("status", ""), "PASS")
          << "rank " << r << ": " << ranks[r].ends.at("parallel").dump();
      EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r;
    }
    std::cout << "[parallel figures] python lane " << variant << " " << layout << " fp32";
    for (const char* name : {"loss_step_1_rel_diff", "loss_step_2_rel_diff",
                             "grad_norm_step_1_rel_diff", "grad_norm_step_2_rel_diff",
                             "grad_norm_sharded_step_1_rel_diff", "grad_nearest_bar_rel_diff",
                             "grad_max_rel_diff", "grad_order_floor_max_rel",
                             "grads_step1_bit_equal_to_grouping", "grads_compared",
                             "replica_max_abs_diff", "params_after_max_abs_diff",
                             "save_tensors_bit_equal", "save_tensors",
                             "optimizer_state_elements_rank0", "optimizer_state_elements_unsharded"}) {
      std::cout << " " << name << "=" << ranks[0].Figure("parallel", name).dump();
    }
    std::cout << std::endl;
    const json& end = ranks[0].ends.at("parallel");
    EXPECT_EQ(ranks[0].Figure("parallel", "replica_max_abs_diff"), 0.0) << end.dump();
    EXPECT_LT(ranks[0].Figure("parallel", "loss_step_1_rel_diff").get<double>(), 1e-6);
    EXPECT_LT(ranks[0].Figure("parallel", "grad_norm_step_1_rel_diff").get<double>(), 1e-5);
    // The norm the adapter's framework clips with (torch's get_total_norm over its shards).
    EXPECT_LT(ranks[0].Figure("parallel", "grad_norm_sharded_step_1_rel_diff").get<double>(), 1e-5);
    EXPECT_GT(ranks[0].Figure("parallel", "save_tensors").get<int64_t>(), 0);
    EXPECT_EQ(ranks[0].Figure("parallel", "save_tensors_bit_equal"), ranks[0].Figure("parallel", "save_tensors"));
    // Each rank steps its tp shards ("unsharded": the whole of its shards) or, under the
    // adapter's FSDP2, its dim-0 shard of them ("unsharded": the whole model's state).
    const int64_t state = ranks[0].Figure("parallel", "optimizer_state_elements_rank0").get<int64_t>();
    const int64_t unsharded = ranks[0].Figure("parallel", "optimizer_state_elements_unsharded").get<int64_t>();
    if (entry.rfind("gh_archon", 0) == 0) {
      EXPECT_LT(2 * state, unsharded);
    } else {
      EXPECT_EQ(state, unsharded);
    }
  }
}

/// Expert parallelism on the lane (qwen3_moe-tiny-untied: 8 experts, top-2): the reference
/// adapter's expert_parallel (torchtitan's ExpertParallel: the stacked experts Shard(0) over the
/// EP group, tokens dispatched and combined all-to-all) over the worker's EP groups, then its
/// FSDP2 over the data-parallel ranks for everything else. dp_shard=2 x ep=2 (each rank holds
/// half the experts), dp_shard=4 x ep=2 (two ranks hold each half: their expert gradients
/// summed), dp_shard=2 x tp=2 x ep=2 (etp=tp: the EP groups are the ranks of equal tp rank).
/// Every rank PASSes; the tokens routed per expert, summed over the ranks, are the control's;
/// the gathered save is the checkpoint bit for bit; without tp the step-1 loss is the
/// control's bit for bit. In bf16 with tp inside, a routing may flip at a near tie (the
/// adapter's MoE blocks count those: router_near_ties): no more flips than the control's near
/// ties, and the gate PASSes.
TEST(PythonLane, ExpertParallelTrainsLikeOneRank) {
  if (!Fixtures({"qwen3_moe"}).count("qwen3_moe-tiny-untied")) GTEST_SKIP() << "no fixture";
  for (const auto& [layout, world, precision] : std::vector<std::tuple<std::string, int, std::string>>{
           {"dp_shard=2,ep=2", 2, "fp32"}, {"dp_shard=4,ep=2", 4, "fp32"},
           {"dp_shard=2,tp=2,ep=2,etp=2", 4, "fp32"}, {"dp_shard=2,tp=2,ep=2,etp=2", 4, "bf16"}}) {
    SCOPED_TRACE(layout + " " + precision);
    const auto ranks = RunWorker("gh_archon.qwen3_moe.spec:SPEC", "qwen3_moe", "qwen3_moe-tiny-untied",
                                 precision, kParallelPhases, world, "", layout);
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(ranks[r].ends.count("parallel")) << "rank " << r;
      EXPECT_EQ(ranks[r].ends.at("parallel").value("status", ""), "PASS")
          << "rank " << r << ": " << ranks[r].ends.at("parallel").dump();
      EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r;
    }
    std::cout << "[parallel figures] python lane qwen3_moe-tiny-untied " << layout << " " << precision;
    for (const char* name : {"loss_step_1_rel_diff", "loss_step_2_rel_diff",
                             "grad_norm_step_1_rel_diff", "grad_norm_step_2_rel_diff",
                             "grad_norm_sharded_step_1_rel_diff", "grad_nearest_bar_rel_diff",
                             "grad_nearest_bar_tensor", "grad_max_rel_diff",
                             "grad_order_floor_max_rel", "expert_tokens_step1",
                             "expert_tokens_max_abs_diff", "expert_routings_flipped",
                             "expert_routings_near_ties_control",
                             "replica_max_abs_diff", "params_after_max_abs_diff",
                             "save_tensors_bit_equal", "save_tensors", "ep_groups",
                             "optimizer_state_elements_rank0", "optimizer_state_elements_unsharded"}) {
      std::cout << " " << name << "=" << ranks[0].Figure("parallel", name).dump();
    }
    std::cout << std::endl;
    const json& end = ranks[0].ends.at("parallel");
    EXPECT_EQ(ranks[0].Figure("parallel", "expert_tokens_step1"), ranks[0].Figure("parallel", "expert_tokens_step1_control"));
    EXPECT_GT(ranks[0].Figure("parallel", "expert_tokens_step1").get<int64_t>(), 0);
    EXPECT_EQ(ranks[0].Figure("parallel", "save_tensors_bit_equal"), ranks[0].Figure("parallel", "save_tensors"));
    EXPECT_EQ(ranks[0].Figure("parallel", "replica_max_abs_diff"), 0.0);
    if (precision == "bf16") {
      EXPECT_LE(ranks[0].Figure("parallel", "expert_routings_flipped").get<int64_t>(),
                ranks[0].Figure("parallel", "expert_routings_near_ties_control").get<int64_t>());
      continue;
    }
    EXPECT_EQ(ranks[0].Figure("parallel", "expert_tokens_max_abs_diff"), 0) << end.dump();
    EXPECT_LT(ranks[0].Figure("parallel", "grad_norm_sharded_step_1_rel_diff").get<double>(), 1e-5);
    if (layout.find("tp") == std::string::npos) {
      EXPECT_EQ(ranks[0].Figure("parallel", "loss_step_1_rel_diff"), 0.0) << end.dump();
    }
    EXPECT_NE(ranks[0].Figure("parallel", "replicated_by").get<std::string>().find("the adapter's expert_parallel"),
              std::string::npos);
    // At most half the state: the experts over ep, the rest over FSDP2's data-parallel ranks.
    EXPECT_LE(2 * ranks[0].Figure("parallel", "optimizer_state_elements_rank0").get<int64_t>(),
              ranks[0].Figure("parallel", "optimizer_state_elements_unsharded").get<int64_t>());
  }
}

/// Expert parallelism the model cannot take is BLOCKED before the adapter is asked, naming why
/// (the experts come from the MoE blocks' tokens_per_expert buffers): ep=3 not dividing
/// qwen3_moe-tiny-untied's 8 experts; ep=2 on llama, which has none. An expert_parallel that
/// splits nothing FAILs adapter_contract.
TEST(PythonLane, ExpertParallelTheModelCannotTakeIsBlocked) {
  const auto fixtures = Fixtures({"llama", "qwen3_moe"});
  if (!fixtures.count("llama-tiny-untied") || !fixtures.count("qwen3_moe-tiny-untied")) {
    GTEST_SKIP() << "no fixture";
  }
  test_util::TempDir dir;
  WriteSpecPackage(dir.path(), "ep_noop", "qwen3_moe",
                   "SPEC = dataclasses.replace(_GOOD, expert_parallel=lambda m, ep, dp: m)\n");
  struct Case {
    std::string entry, family, variant, layout;
    int world;
    std::string status, reason;
  };
  for (const Case& c : std::vector<Case>{
           {"gh_archon.qwen3_moe.spec:SPEC", "qwen3_moe", "qwen3_moe-tiny-untied", "dp_shard=3,ep=3", 3,
            "BLOCKED", "ep=3 does not divide the model's 8 experts"},
           {"gh_archon.llama.spec:SPEC", "llama", "llama-tiny-untied", "dp_shard=2,ep=2", 2,
            "BLOCKED", "ep=2: this model shows no experts to split"},
           {"ep_noop.spec:SPEC", "qwen3_moe", "qwen3_moe-tiny-untied", "dp_shard=2,ep=2", 2,
            "FAIL", "expert_parallel split no parameter over the ep mesh"}}) {
    SCOPED_TRACE(c.entry + " " + c.layout);
    const auto ranks = RunWorker(c.entry, c.family, c.variant, "fp32", kParallelPhases, c.world,
                                 dir.path().string(), c.layout);
    for (int r = 0; r < c.world; ++r) {
      ASSERT_TRUE(ranks[r].ends.count("parallel")) << "rank " << r;
      const json& end = ranks[r].ends.at("parallel");
      EXPECT_EQ(end.value("status", ""), c.status) << "rank " << r << ": " << end.dump();
      EXPECT_NE(end.value("reason", "").find(c.reason), std::string::npos) << "rank " << r << ": " << end.dump();
      EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r;
    }
  }
}

/// An expert-parallel plan whose ranks hold the next EP rank's experts (tokens for expert e run
/// through expert e + E / ep's weights: a dispatch offset that is not the load's).
constexpr const char* kExpertsOfTheNextRank =
    "from torch import nn\n"
    "from torch.distributed.tensor import DTensor, Shard\n"
    "from gh_archon.common.expert_parallel import ExpertParallel\n"
    "class Shifted(ExpertParallel):\n"
    "    def apply(self, experts):\n"
    "        ep, r = self.mesh.size(), self.mesh.get_local_rank()\n"
    "        for name, p in list(experts.named_parameters(recurse=False)):\n"
    "            chunk = p.data.chunk(ep)[(r + 1) % ep].clone()\n"
    "            experts.register_parameter(name, nn.Parameter(\n"
    "                DTensor.from_local(chunk, self.mesh, [Shard(0)], run_check=False)))\n"
    "        experts.register_forward_pre_hook(self._dispatch)\n"
    "        experts.register_forward_hook(self._combine)\n"
    "        return experts\n"
    "def ep(model, ep_mesh, expert_dp_mesh):\n"
    "    for layer in model.layers.values():\n"
    "        if layer.moe is not None:\n"
    "            Shifted(ep_mesh).apply(layer.moe.experts)\n"
    "    return model\n"
    "SPEC = dataclasses.replace(_GOOD, expert_parallel=ep)\n";

/// A clipping norm whose expert part is each EP rank's own experts' (not summed over the EP
/// group: each group clips with its own norm); the rest as torch computes it.
constexpr const char* kEpNormPerGroup =
    "import torch\n"
    "from torch.distributed.tensor import DTensor\n"
    "def norm(model):\n"
    "    sq = 0.0\n"
    "    for p in model.parameters():\n"
    "        if p.grad is None:\n"
    "            continue\n"
    "        g = p.grad\n"
    "        if isinstance(g, DTensor) and 'ep' in (g.device_mesh.mesh_dim_names or ()):\n"
    "            sq += float(g.to_local().double().pow(2).sum())\n"
    "        else:\n"
    "            n = torch.linalg.vector_norm(g)\n"
    "            sq += float((n.full_tensor() if isinstance(n, DTensor) else n).double()) ** 2\n"
    "    return sq ** 0.5\n"
    "SPEC = dataclasses.replace(_GOOD, grad_norm=norm)\n";

/// A clipping norm summing every rank's local shards over the world: a tensor replicated over
/// tp (norms; the reference plan's experts) counted tp times.
constexpr const char* kLocalShardsSummed =
    "import torch, torch.distributed as dist\n"
    "from torch.distributed.tensor import DTensor\n"
    "def norm(model):\n"
    "    sq = torch.zeros((), dtype=torch.float64)\n"
    "    for p in model.parameters():\n"
    "        if p.grad is not None:\n"
    "            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad\n"
    "            sq += g.double().pow(2).sum()\n"
    "    dist.all_reduce(sq)\n"
    "    return float(sq) ** 0.5\n"
    "SPEC = dataclasses.replace(_GOOD, grad_norm=norm)\n";

/// A llama plan whose attention output projection leaves its output Partial (the row-parallel
/// all-reduce forgotten).
constexpr const char* kRowParallelLeftPartial =
    "from torch.distributed.tensor import Partial\n"
    "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module\n"
    "def par(model, mesh):\n"
    "    for layer in model.layers.values():\n"
    "        parallelize_module(layer, mesh, {\n"
    "            'attention.wq': ColwiseParallel(), 'attention.wk': ColwiseParallel(),\n"
    "            'attention.wv': ColwiseParallel(),\n"
    "            'attention.wo': RowwiseParallel(output_layouts=Partial()),\n"
    "            'feed_forward.w1': ColwiseParallel(), 'feed_forward.w3': ColwiseParallel(),\n"
    "            'feed_forward.w2': RowwiseParallel()})\n"
    "    return model\n"
    "SPEC = dataclasses.replace(_GOOD, parallelize=par)\n";

/// A Qwen3 attention plan without SequenceParallel on q_norm / k_norm (left plain).
constexpr const char* kPerHeadNormsPlain =
    "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module\n"
    "def par(model, mesh):\n"
    "    for layer in model.layers.values():\n"
    "        parallelize_module(layer, mesh, {\n"
    "            'attention.wq': ColwiseParallel(), 'attention.wk': ColwiseParallel(),\n"
    "            'attention.wv': ColwiseParallel(), 'attention.wo': RowwiseParallel()})\n"
    "    return model\n"
    "SPEC = dataclasses.replace(_GOOD, parallelize=par)\n";

/// Adapters whose tensor parallelism is broken the ways it breaks, each caught by the parallel
/// gate with a reason naming it: the row-parallel outputs left partial (the all-reduce
/// forgotten), Qwen3's per-head q_norm / k_norm left plain (each rank keeps a partial gradient
/// of their replicated weight), a parallelize that raises on one rank only (the others' wait
/// ends at once, and every rank reports the cause), logits left sharded over the vocabulary,
/// one rank's logits differing from rank 0's, a parallelize that shards nothing, and a
/// ModelSpec without parallelize; under dp x tp (four ranks), the per-head norms left plain
/// and the row-parallel outputs left partial; the adapter's own FSDP2 averaging its gradients
/// (FSDP2's default division) or reducing them in bf16; under expert parallelism, each rank
/// holding the next EP rank's experts, the replicas' expert gradients never summed, a SPEC
/// without expert_parallel; the adapter's clipping norm taken per EP group or counting
/// tp-replicated tensors tp times. Every worker still exits 0.
TEST(PythonLane, BrokenParallelizeFails) {
  const auto fixtures = Fixtures({"llama", "qwen3_moe"});
  if (!fixtures.count("llama-tiny-untied") || !fixtures.count("qwen3_moe-tiny-untied")) {
    GTEST_SKIP() << "no fixture";
  }
  struct Case {
    const char* name;
    const char* family;  // the reference adapter the package starts from, and its fixture
    const char* spec;    // spec.py of the package, after `_GOOD = <family's SPEC>`
    const char* reason;  // a part of the parallel gate's reason
    const char* layout = "tp";  // the topology (RunWorker's dimension)
    int world = 2;
  };
  const Case cases[] = {
      {"tp_no_all_reduce", "llama",
       kRowParallelLeftPartial,
       "kl_mean_vs_tp1"},
      {"tp_qk_norm_plain", "qwen3_moe",
       kPerHeadNormsPlain,
       "a replicated parameter's gradient differs between ranks"},
      {"tp_raises_on_rank_1", "llama",
       "import torch.distributed as dist\n"
       "def par(model, mesh):\n"
       "    if dist.get_rank() == 1:\n"
       "        raise RuntimeError('parallelize refused on rank 1 only')\n"
       "    return _GOOD.parallelize(model, mesh)\n"
       "SPEC = dataclasses.replace(_GOOD, parallelize=par)\n",
       "rank 1: tp_raises_on_rank_1.spec:SPEC: parallelize: RuntimeError: parallelize: parallelize refused on rank 1 only"},
      {"tp_logits_vocab_sharded", "llama",
       "from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module\n"
       "def par(model, mesh):\n"
       "    model = _GOOD.parallelize(model, mesh)\n"
       "    parallelize_module(model, mesh, {'output': ColwiseParallel()})\n"
       "    return model\n"
       "SPEC = dataclasses.replace(_GOOD, parallelize=par)\n",
       "rank 0: the sharded model's forward returned logits [1, 7, 128], not the full [1, 7, 256]"},
      {"tp_rank_1_logits_differ", "llama",
       "import torch, torch.distributed as dist\n"
       "def par(model, mesh):\n"
       "    model = _GOOD.parallelize(model, mesh)\n"
       "    if dist.get_rank() == 1:\n"
       "        forward = model.forward\n"
       "        def flipped(*args, **kwargs):\n"
       "            out = forward(*args, **kwargs)\n"
       "            return out if torch.is_grad_enabled() else out.flip(-1)\n"
       "        model.forward = flipped\n"
       "    return model\n"
       "SPEC = dataclasses.replace(_GOOD, parallelize=par)\n",
       "ranks disagree on the logits"},
      {"tp_shards_nothing", "llama",
       "SPEC = dataclasses.replace(_GOOD, parallelize=lambda model, mesh: model)\n",
       "parallelize sharded no parameter"},
      {"tp_none", "llama", "SPEC = dataclasses.replace(_GOOD, parallelize=None)\n",
       "gives no parallelize"},
      // Under dp x tp: the per-head norms left plain (each tp rank keeps its partial gradient;
      // the data-parallel sum cannot mend it), and row-parallel outputs left partial.
      {"dp_tp_qk_norm_plain", "qwen3_moe",
       kPerHeadNormsPlain,
       "k_norm.weight (checkpoint model.layers.1.self_attn.k_norm.weight) differs from the control's",
       "dp_shard=2,tp=2", 4},
      {"dp_tp_no_all_reduce", "llama",
       kRowParallelLeftPartial,
       "step 1 loss", "dp=2,tp=2", 4},
      // The adapter's own FSDP2: left with its default gradient division (the gradients
      // averaged over the ranks while the loss is already divided by the global token count),
      // and reducing in bf16 where fp32 was asked.
      {"fsdp_gradients_averaged", "llama",
       "from torch.distributed.fsdp import fully_shard\n"
       "def dp(model, mesh):\n"
       "    for layer in model.layers.values():\n"
       "        fully_shard(layer, mesh=mesh)\n"
       "    return fully_shard(model, mesh=mesh)\n"
       "SPEC = dataclasses.replace(_GOOD, data_parallel=dp)\n",
       "gradients were averaged over the 2 data-parallel ranks", "dp"},
      {"fsdp_reduce_bf16", "llama",
       "import torch\n"
       "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n"
       "def dp(model, mesh):\n"
       "    policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)\n"
       "    for m in [*model.layers.values(), model]:\n"
       "        fully_shard(m, mesh=mesh, mp_policy=policy)\n"
       "        m.set_gradient_divide_factor(1.0)\n"
       "        m.set_force_sum_reduction_for_comms(True)\n"
       "    return model\n"
       "SPEC = dataclasses.replace(_GOOD, data_parallel=dp)\n",
       "step 1 gradient", "dp_shard"},
      // Expert parallelism (qwen3_moe): each rank holding the next EP rank's experts; the
      // experts' gradients never summed over the data-parallel ranks that hold the same
      // experts (dp_shard=4 x ep=2: each keeps its own tokens' part); a SPEC without
      // expert_parallel.
      {"ep_experts_of_the_next_rank", "qwen3_moe", kExpertsOfTheNextRank,
       "is not the single-rank save", "dp_shard=2,ep=2", 2},
      {"ep_replicas_not_summed", "qwen3_moe",
       "SPEC = dataclasses.replace(_GOOD, expert_parallel=lambda m, ep, dp: _GOOD.expert_parallel(m, ep, None))\n",
       "moe.experts.w", "dp_shard=4,ep=2", 4},
      {"ep_none", "qwen3_moe", "SPEC = dataclasses.replace(_GOOD, expert_parallel=None)\n",
       "gives no expert_parallel", "dp_shard=2,ep=2", 2},
      // The adapter's clipping norm (grad_norm): each EP rank's expert part from its own
      // experts only (per-group clipping); every rank's local shards summed over the world (a
      // tp-replicated tensor counted tp times).
      {"norm_ep_per_group", "qwen3_moe", kEpNormPerGroup,
       "grad norm from the ranks' shards", "dp_shard=2,ep=2", 2},
      {"norm_tp_replicated_counted_twice", "qwen3_moe", kLocalShardsSummed,
       "grad norm from the ranks' shards", "dp_shard=2,tp=2", 4},
  };
  for (const Case& c : cases) {
    test_util::TempDir dir;
    WriteSpecPackage(dir.path(), c.name, c.family, c.spec);
    const auto ranks = RunWorker(std::string(c.name) + ".spec:SPEC", c.family,
                                 std::string(c.family) + "-tiny-untied", "fp32", kParallelPhases,
                                 c.world, dir.path().string(), c.layout);
    ASSERT_TRUE(ranks[0].ends.count("parallel")) << c.name;
    const json& end = ranks[0].ends.at("parallel");
    std::cout << "[parallel mutation] python lane " << c.name << " (" << c.layout
              << "): " << end.value("reason", "") << std::endl;
    EXPECT_EQ(end.value("status", ""), "FAIL") << c.name << ": " << end.dump();
    EXPECT_EQ(end.value("classification", ""), "adapter_contract") << c.name << ": " << end.dump();
    EXPECT_NE(end.value("reason", "").find(c.reason), std::string::npos) << c.name << ": " << end.dump();
    EXPECT_EQ(ranks[0].exit_code, 0) << c.name;
    EXPECT_EQ(ranks[1].exit_code, 0) << c.name;
  }
}

}  // namespace
}  // namespace gatehouse::worker
