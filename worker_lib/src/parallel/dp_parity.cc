// The parallel gate's data-parallel check (parallel_internal.h DataParallelParity): the mesh's
// data-parallel dimensions (dp_replicate, dp_shard, both: HSDP), alone or with tensor
// parallelism inside each replica and experts split over ranks of dp_shard, trained against
// the single-rank control on rank 0. Its steps: form the groups (dp_groups.cc), build the
// replicas (here; on the Python lane under dp x tp the adapter's parallelize shards each),
// compare the gathered save (dp_save.cc), train (dp_train.cc, dp_shard.cc), compare the
// parameters and judge (here); dp_run.h holds what they share.
//
// The global batch is the reference prompts of 2 tokens or more (the longest cut in two until
// every data-parallel rank has one: GlobalBatch); the ranks at data-parallel index d (over
// dp_replicate x dp_shard) take sequences d, d + dp, d + 2 dp, ... Each replica holds the
// whole model: on every rank alone, or sharded over the replica's tp group through the
// family's plan (dp x tp, the tp ranks of a replica running the same sequences). Under
// dp_shard each rank keeps the optimizer state of its own dim-0 slice of every parameter and
// the slices are gathered after each step (FSDP2's layout; the parameters are held in full
// between steps). The loss is the global token mean, as a
// trainer that packs variable-length sequences must compute it: each replica's loss is the
// sum of its prompts' next-token cross entropies divided by the global count of predicted
// tokens (all-reduced first), and the gradients (each rank's shard) are all-reduced over the
// data-parallel group as a SUM (over dp_shard, then over dp_replicate), in fp32 (FSDP2's reduce_dtype), then cast back to the parameter dtype.
// Two optimizer steps (the training gate's AdamW, the cell's lr) follow, on every rank and on
// the control.
//
// What is compared, per step: the global loss, the global gradient norm (what a trainer clips
// with, over the full gradients gathered from the tp shards), every gradient (rank 0's reduced
// one, gathered over its tp group, against the control's); after the steps, every rank's
// parameters against those of the other replicas (they must be bit-equal) and rank 0's,
// gathered, against the control's. The gradient bars come from the reduction-order spread measured in the same run:
// at step 1 the control computes the global batch twice, once in prompt order and once in the
// ranks' grouping (each rank's share summed, then the shares added in fp32), and each tensor's
// bar is kFloorMargin times that spread, never below the TP bar (TpThresholds): under dp x tp
// the TP bar holds the tp group's partial sums.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "../gates_internal.h"
#include "dp_run.h"
#include "gatehouse/worker/bars.h"

namespace gatehouse::worker::parallel {

using internal::Num;

std::string BuildReplicas(DpRun& run) {
  GateContext& ctx = run.ctx;
  for (int copy = 0; copy < (run.rank0 ? 2 : 1); ++copy) {
    const bool sharded = copy == 0 && run.plan.has_value();
    // A family sharding by its own code splits the experts itself (ShardByCode).
    const bool experts = copy == 0 && run.ep > 1 && !run.by_code;
    const TensorParallel tp{run.tp_comm ? run.tp_comm->rank() : 0, run.tp, run.tp_comm};
    const ExpertParallel ep{run.ep_comm ? run.ep_comm->rank() : 0, run.ep, run.ep_comm};
    // kExpertOffsetShifted: the experts of the next EP rank loaded here (a dispatch offset
    // that is not the load's).
    const int64_t load_ep_rank =
        run.reduction.mode == DpReduction::Mode::kExpertOffsetShifted ? (ep.rank + 1) % ep.size : ep.rank;
    const ShardedLoad shard{sharded ? &*run.plan : nullptr, tp.rank, load_ep_rank, ep.size};
    Result<std::shared_ptr<CausalLM>> built = TrainableModel(
        ctx,
        copy == 0 ? (sharded || experts ? "the replica's shard" : "the replica")
                  : "the single-rank control",
        [&] {
          if (experts) {
            return ctx.family->ConstructExpertParallel(*ctx.args, ctx.dtype, ctx.device, tp, ep);
          }
          return sharded ? ctx.family->ConstructParallel(*ctx.args, ctx.dtype, ctx.device, tp)
                         : ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
        },
        [&](CausalLM& m) {
          return sharded || experts ? LoadStateDict(*ctx.checkpoint, *ctx.adapter, m, &shard)
                                    : LoadFull(ctx, m);
        });
    if (!built.ok()) return built.status().message();
    (copy == 0 ? run.model : run.control) = *built;
  }
  return "";
}

std::string ExpertsToSplit(DpRun& run, bool& blocked) {
  if (run.ep == 1 || !run.by_code) return "";
  // The adapter's MoE blocks say what experts the model has (their tokens_per_expert buffers,
  // [moe_layers, E]) before the adapter is asked to split them.
  const torch::Tensor counts = run.model->ExpertTokenCounts();
  blocked = true;
  if (!counts.defined() || counts.dim() != 2 || counts.size(1) == 0) {
    return "ep=" + std::to_string(run.ep) + ": this model shows no experts to split (no module "
           "keeps a tokens_per_expert buffer, the contract's record of a MoE block's experts)";
  }
  if (counts.size(1) % run.ep != 0) {
    return "ep=" + std::to_string(run.ep) + " does not divide the model's " +
           std::to_string(counts.size(1)) + " experts";
  }
  blocked = false;
  return "";
}

std::string ShardByCode(DpRun& run) {
  GateContext& ctx = run.ctx;
  const TensorParallel tp{run.tp_comm ? run.tp_comm->rank() : 0, run.tp, run.tp_comm};
  Result<std::shared_ptr<CausalLM>> sharded =
      ShardLoadedModel(*ctx.family, run.model, tp, ctx.rank, ctx.world_size, run.expert_groups);
  if (!sharded.ok()) return sharded.status().message();
  run.model = *sharded;
  run.model_reduces = run.model->ReducesDataParallelGradients();
  if (run.ep > 1 && !run.model_reduces) {
    return "ep=" + std::to_string(run.ep) + ": the adapter's expert_parallel left the gradient " +
           "reduction to the gate (ModelSpec.data_parallel), which reduces only the C++ " +
           "lane's expert plans";
  }
  return "";
}

std::string IndexParameters(DpRun& run) {
  GateContext& ctx = run.ctx;
  run.params = UniqueParameters(*run.model);
  for (const ParamGroup& g : run.params) {
    bool stacked = false;
    if (run.ep > 1 && !run.by_code) {
      Result<std::vector<HfSlice>> slices = ctx.adapter->HfSlices(g.names[0]);
      stacked = slices.ok() && !slices->empty() && slices->front().slice >= 0;
    }
    run.expert.push_back(stacked);
  }
  if (run.control) run.control_params = UniqueParameters(*run.control);
  if (run.by_code) {
    // The whole model's size (the control's), for the optimizer state it would hold unsharded.
    for (const ParamGroup& g : run.control_params) run.full_elements += g.tensor.numel();
  }
  if (!run.control) return "";
  // The checks pair a replica's parameters with the control's by position.
  for (size_t i = 0; i < std::max(run.params.size(), run.control_params.size()); ++i) {
    const std::string ours = i < run.params.size() ? run.params[i].names[0] : "(none)";
    const std::string control = i < run.control_params.size() ? run.control_params[i].names[0] : "(none)";
    if (ours != control) {
      return "parameter " + std::to_string(i) + " of the replica is " + ours +
             " but the control's is " + control + " (the sharded and the full model must " +
             "register the same parameters in the same order)";
    }
  }
  return "";
}

namespace {

/// After the steps: every rank's parameters against those of the other replicas (its dp
/// group; the largest spread of any group comes to rank 0), and rank 0's, gathered, against
/// the control's. Returns this rank's problem.
std::string CompareParameters(DpRun& run) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> local;
  for (const ParamGroup& g : run.params) local.push_back(g.tensor.detach());
  std::vector<torch::Tensor> full;
  try {
    full = Full(run, local);
  } catch (const std::exception& e) {
    return std::string("gathering the parameters: ") + e.what();
  }
  // A model that shards its parameters over the data-parallel ranks (model_reduces) holds a
  // different slice on each: its replicas are compared whole.
  const std::vector<torch::Tensor>& held = run.model_reduces ? full : local;
  for (size_t i = 0; i < held.size(); ++i) {
    // An expert is the same on the data-parallel ranks that hold it, not on the others.
    TpCommunicator* replicas = run.expert[i] ? run.expert_dp_comm.get() : run.dp_comm.get();
    if (replicas) RankSpread(replicas->AllGather(held[i]), run.replica_max_abs, run.replica_max_rel);
  }
  const std::vector<torch::Tensor> spreads =
      run.comm.AllGather(torch::tensor({run.replica_max_abs, run.replica_max_rel}, torch::kDouble));
  for (const torch::Tensor& s : spreads) {
    run.replica_max_abs = std::max(run.replica_max_abs, s[0].item<double>());
    run.replica_max_rel = std::max(run.replica_max_rel, s[1].item<double>());
  }
  if (!run.rank0) return "";
  for (size_t i = 0; i < full.size(); ++i) {
    const torch::Tensor& p = full[i];
    const torch::Tensor c = run.control_params[i].tensor.detach();
    const double diff = (p.to(torch::kDouble) - c.to(torch::kDouble)).abs().max().item<double>();
    run.params_after_max_abs = std::max(run.params_after_max_abs, diff);
    run.params_after_max_rel = std::max(run.params_after_max_rel, RelDiff(p, c).first);
  }
  return "";
}

/// "dp_replicate=2 x dp_shard=2 x tp=2", the enabled dimensions of the check.
std::string DataText(const DpRun& run) {
  std::string text;
  for (const auto& [name, size] : {std::pair<const char*, int64_t>{"dp", run.replicate},
                                   {"dp_shard", run.shard}, {"cp", run.cp}, {"tp", run.tp},
                                   {"ep", run.ep}}) {
    if (size > 1) text += (text.empty() ? "" : " x ") + std::string(name) + "=" + std::to_string(size);
  }
  return text;
}

/// "ep [0,2] [1,3]": the EP groups.
std::string ExpertGroupsText(const Mesh& mesh) {
  std::string text = "ep";
  for (const std::vector<int64_t>& g : mesh.ExpertGroups()) {
    text += " [";
    for (size_t i = 0; i < g.size(); ++i) text += (i ? "," : "") + std::to_string(g[i]);
    text += "]";
  }
  return text;
}

/// MoE: the tokens routed to each expert at step 1, summed over the data-parallel ranks,
/// against the control's on the whole batch. The router is replicated, so they are equal
/// unless rounding upstream of the router differs (a sharded layout in bf16) and swaps the
/// k-th and (k+1)-th choice of a token that the control routed by a near tie: each such flip
/// moves one routing to another expert. Flips up to the control's near ties are rounding (the
/// tokens' gradients then come from another expert, so step 1's gradients are a figure and
/// the step is judged by its loss and grad norm); more flips FAIL, naming the first layer
/// and expert that differ.
void RecordExpertTokens(DpRun& run, GateOutcome& out, std::vector<std::string>& fails) {
  if (!run.expert_tokens.defined() || !run.control_expert_tokens.defined()) return;
  const torch::Tensor diff = (run.expert_tokens - run.control_expert_tokens).abs();
  const int64_t total = run.control_expert_tokens.sum().item<int64_t>();
  const int64_t max_diff = diff.max().item<int64_t>();
  const int64_t flips = (diff.sum().item<int64_t>() + 1) / 2;  // a flip: -1 here, +1 there
  out.Count("expert_tokens_step1", run.expert_tokens.sum().item<int64_t>());
  out.Count("expert_tokens_step1_control", total);
  out.Count("expert_tokens_max_abs_diff", max_diff);
  out.Count("expert_routings_flipped", flips);
  out.Count("expert_routings_near_ties_control", run.control_near_ties);
  if (flips == 0) return;
  if (flips <= run.control_near_ties) {
    run.trace.grads_not_judged =
        std::to_string(flips) + " routing(s) flipped at step 1, within the control's " +
        std::to_string(run.control_near_ties) +
        " near ties (rounding decides which expert sees those tokens); step 1 judged by its "
        "loss and grad norm";
    return;
  }
  const torch::Tensor first = diff.flatten().gt(0).nonzero().flatten();
  const int64_t at = first[0].item<int64_t>(), experts = diff.size(1);
  const int64_t ours = run.expert_tokens.flatten()[at].item<int64_t>();
  const int64_t control = run.control_expert_tokens.flatten()[at].item<int64_t>();
  fails.push_back(
      "tokens routed per expert at step 1, summed over the data-parallel ranks, differ from "
      "the control's by " + std::to_string(flips) + " routing(s) of " + std::to_string(total) +
      ", more than the control's " + std::to_string(run.control_near_ties) +
      " near ties; first at MoE layer " + std::to_string(at / experts) +
      " (of the MoE layers, in order) expert " + std::to_string(at % experts) + ": " +
      std::to_string(ours) + " here, " + std::to_string(control) + " on the control");
}

/// When step 1's global grad norm is 1/dp of the control's (within 1e-4), what that says: the
/// gradients were averaged over the data-parallel ranks where the loss is already divided by
/// the global token count (DDP's and FSDP2's default division). "" otherwise.
std::string AveragedHint(const DpRun& run) {
  const StepTrace& t = run.trace;
  if (run.dp < 2 || t.grad_norm.empty() || t.control_grad_norm.empty() || t.control_grad_norm[0] <= 0) {
    return "";
  }
  const double ratio = t.grad_norm[0] / t.control_grad_norm[0];
  if (std::abs(ratio * static_cast<double>(run.dp) - 1.0) > 1e-4) return "";
  return "the step-1 grad norm is 1/" + std::to_string(run.dp) + " of the control's: the "
         "gradients were averaged over the " + std::to_string(run.dp) + " data-parallel ranks, "
         "but each rank's loss is already divided by the global token count, so they must be "
         "summed (FSDP2: set_gradient_divide_factor(1.0))";
}

/// Context parallelism: share 0's logits under cp (its cp group's columns gathered) against
/// the control's packed forward of the same packing, judged by the TP bars (KL mean; top-1
/// in fp32), and the batch tokens trimmed to make each packing divide by cp.
void RecordContextParallel(DpRun& run, GateOutcome& out, std::vector<std::string>& fails) {
  const LogitComparison& c = run.cp_vs_packed;
  out.Count("cp_tokens_trimmed", run.cp_tokens_trimmed);
  out.Count("cp_logits_tokens", c.tokens());
  out.Real("cp_logits_kl_mean", c.kl_mean(), "nats");
  out.Real("cp_logits_max_abs_diff", c.max_abs_diff(), "logit");
  out.Real("cp_logits_top1_percent", c.top1_agreement_percent(), "percent");
  const bool fp32 = run.ctx.spec.precision != "bf16";
  if (!(c.kl_mean() < run.thr.kl_mean_below) ||
      (fp32 && c.top1_agreement_percent() < run.thr.top1_at_least)) {
    fails.push_back("share 0's logits under cp=" + std::to_string(run.cp) +
                    " (its columns gathered over the cp group) differ from the single-rank "
                    "packed forward of the same packing: KL mean " + Num(c.kl_mean()) +
                    " nats (bar " + Num(run.thr.kl_mean_below) + "), top-1 " +
                    Num(c.top1_agreement_percent()) + " %, max abs " + Num(c.max_abs_diff()));
  }
}

void RecordAndJudge(DpRun& run, GateOutcome& out) {
  out.Count("data_parallel_ranks", run.dp);  // dp x dp_shard
  out.Text("dp_groups", GroupsText(run.mesh, DataDims(run)));
  if (run.replicate > 1 && run.shard * run.cp > 1) {
    out.Text("dp_shard_groups", GroupsText(run.mesh, ShardDims(run)));
  }
  if (run.cp > 1) out.Text("cp_groups", GroupsText(run.mesh, {Mesh::Dim::kCp}));
  if (run.tp > 1) out.Text("tp_groups", GroupsText(run.mesh, {Mesh::Dim::kTp}));
  if (run.ep > 1) out.Text("ep_groups", ExpertGroupsText(run.mesh));
  out.Count("global_batch_sequences", static_cast<int64_t>(run.batch.size()));
  out.Count("global_batch_splits", run.batch_splits);
  out.Count("global_batch_tokens", static_cast<int64_t>(run.global_tokens));
  out.Count("optimizer_state_elements_rank0", run.optimizer_state_elements);
  out.Count("optimizer_state_elements_unsharded", run.optimizer_state_elements_unsharded);
  out.Text("replicated_by",
           std::string(run.tp == 1  ? "gatehouse: every rank holds the whole model; "
                       : run.by_code ? "gatehouse: each replica sharded over its tp group by the "
                                       "family's own code (the adapter's parallelize); "
                                     : "gatehouse: each replica sharded over its tp group by the "
                                       "family's plan; ") +
               (run.model_reduces
                    ? "the adapter's data_parallel (FSDP2) shards every parameter over the "
                      "data-parallel ranks and reduces the gradients itself; "
                : run.shard > 1 ? "optimizer state sharded on dim 0 over the dp_shard group, the "
                                  "parameters gathered after each step; "
                                : "") +
               (run.ep > 1 && run.by_code
                    ? "the adapter's expert_parallel splits the experts over the EP group (tokens "
                      "dispatched all-to-all) and sums their gradients over the ranks holding the "
                      "same experts; "
                : run.ep > 1 ? "experts split over the EP group, tokens dispatched all-to-all, "
                               "expert gradients reduced over the ranks holding the same experts; "
                             : "") +
               (run.cp > 1 ? "each share packed into one row and its columns split over the "
                             "cp group (Ulysses all-to-all in attention, positions of the whole "
                             "packing), the optimizer state sharded over dp_shard x cp; "
                           : "") +
               "gradients reduced " +
               (run.model_reduces ? std::string("by the model")
                : run.reduction.mode == DpReduction::Mode::kSum
                    ? std::string(run.shard > 1 && run.replicate > 1
                                      ? "(SUM in fp32) over dp_shard, then over dp_replicate"
                                      : "(SUM in fp32) over the data-parallel group")
                    : "(mutated: " + run.reduction.Name() + ")"));
  std::vector<std::string> fails;
  // The save first: compared before any step, a slice held at the wrong place explains
  // everything after it, and it names the checkpoint keys.
  out.Count("save_tensors", run.save_tensors);
  out.Count("save_tensors_bit_equal", run.save_tensors_equal);
  if (!run.save_problems.empty()) {
    fails.push_back("the save gathered from the ranks (before training) is not the single-rank "
                    "save: " + internal::JoinFew(run.save_problems));
  }
  if (run.cp > 1) RecordContextParallel(run, out, fails);
  RecordExpertTokens(run, out, fails);  // before the trace: flipped routings leave gradients unjudged
  const size_t before_trace = fails.size();
  run.trace.Record(run.thr.loss_rel_below, out, fails,
                   CheckpointKeys(run.ctx, run.control_params));
  if (const std::string hint = AveragedHint(run); !hint.empty() && fails.size() > before_trace) {
    out.Text("grad_norm_hint", hint);
    fails.insert(fails.begin() + static_cast<std::ptrdiff_t>(before_trace), hint);
  }
  out.Real("grad_order_floor_max_rel", run.floor_max, "ratio");
  out.Count("grads_step1_bit_equal_to_grouping", run.grads_bit_equal_to_grouping);
  const StepTrace& t = run.trace;
  out.Text("grads_agree", !t.grads_not_judged.empty() ? "not judged (see grads_judged)"
                          : t.worst_grad_ratio >= 1 ? "no: above its bar (see grad_nearest_bar_tensor)"
                          : t.grads_bit_equal == t.grads_compared
                              ? "bit-equal to the control"
                              : t.grad_max_rel <= kFloorMargin * run.floor_max
                                    ? "within the measured reduction-order spread"
                                    : "within the TP bar (above the measured spread)");
  out.Real("replica_max_abs_diff", run.replica_max_abs, "parameter");
  out.Real("params_after_max_abs_diff", run.params_after_max_abs, "parameter");
  out.Real("params_after_max_rel_diff", run.params_after_max_rel, "ratio");
  if (run.replica_max_abs != 0) {
    fails.push_back("replicas differ after " + std::to_string(kDpSteps) +
                    " steps: parameters up to " + Num(run.replica_max_abs) +
                    " apart across ranks (they must be bit-equal)");
  }
  if (!fails.empty()) {
    out.Fail(FailureClass::kAdapterContract,
             "data parallel (" + DataText(run) +
                 ") against the single-rank control: " + internal::JoinFew(fails));
  }
  // The judged figures first: a report shows the first few.
  out.Lead({"loss_step_1_rel_diff", "grad_norm_step_1_rel_diff", "grad_nearest_bar_rel_diff",
            "cp_logits_kl_mean",
            "replica_max_abs_diff", "expert_tokens_max_abs_diff", "grad_norm_sharded_step_1_rel_diff",
            "loss_step_2_rel_diff", "grad_norm_step_2_rel_diff"});
}

/// GateContext::parallel_measure_only: the layout's steps without the control, nothing
/// compared; SKIPPED with this rank's step times (MeasuredOnly).
GateOutcome TrainMeasuredOnly(DpRun& run, GateOutcome out) {
  if (run.cp > 1 && !run.model->SupportsContextParallel()) {
    return out.Blocked("cp=" + std::to_string(run.cp) + ": the family's model has no " +
                       "context-parallel forward (CausalLM::SupportsContextParallel)");
  }
  if (const std::string all = RankProblems(run.comm, Train(run)); !all.empty()) {
    return out.Fail(FailureClass::kNativeRuntime, all);
  }
  out.Count("optimizer_state_elements_unsharded", run.optimizer_state_elements_unsharded);
  const std::string layout = run.ctx.world_size == 1 ? "the whole model on one rank" : DataText(run);
  return MeasuredOnly(std::move(out), layout,
                      {run.step_ms, run.trace.loss, run.batch, run.global_tokens,
                       run.optimizer_state_elements},
                      run.params);
}

}  // namespace

std::string DpReduction::Name() const {
  switch (mode) {
    case Mode::kSum: return "sum";
    case Mode::kAverage: return "averaged over dp";
    case Mode::kLocalMean: return "each rank's own token mean, averaged over dp";
    case Mode::kNone: return "not reduced";
    case Mode::kWholeWorld: return "summed over every rank, not the dp group";
    case Mode::kShardGroupOnly: return "summed over the dp_shard group only, not across replicas";
    case Mode::kExpertsOverDp: return "expert gradients summed over the data-parallel group";
    case Mode::kEpNormAveraged: return "the grad norm's expert part averaged over ep";
    case Mode::kReplicatedCountedTp: return "the grad norm counting tp-replicated tensors tp times";
    case Mode::kExpertCountsNotReduced: return "tokens per expert not summed over the ranks";
    case Mode::kCpLocalPositions: return "each cp rank's positions restarted at its first column";
    case Mode::kBf16Reduction: return "gradients reduced in bf16, not fp32";
    case Mode::kEpNormLocal: return "each EP rank clipping with its own experts' norm";
    case Mode::kExpertOffsetShifted: return "each EP rank's experts loaded at the next rank's offset";
  }
  return "?";
}

GateOutcome DataParallelParity(GateContext& ctx, const Mesh& mesh, GateOutcome out,
                               const DpReduction& reduction) {
  DpRun run{.ctx = ctx,
            .comm = *ctx.comm,
            .mesh = mesh,
            .replicate = mesh.Size(Mesh::Dim::kDpReplicate),
            .shard = mesh.Size(Mesh::Dim::kDpShard),
            .dp = mesh.Size(Mesh::Dim::kDpReplicate) * mesh.Size(Mesh::Dim::kDpShard),
            .dp_index = 0,
            .tp = mesh.Size(Mesh::Dim::kTp),
            .rank0 = ctx.rank == 0 && !ctx.parallel_measure_only,
            .thr = TpThresholdsFor(ctx.spec.precision),
            .reduction = reduction};
  run.ep = mesh.shape().ep;
  run.cp = mesh.Size(Mesh::Dim::kCp);
  bool blocked = false;  // an input the cell cannot change by running again
  std::string not_ready = NotReady(ctx, blocked);
  if (not_ready.empty()) {
    // Under ep every rank of an EP group must run as many forwards (each one all-to-all):
    // equal shares, unless cp packs each share into one forward.
    const bool equal_shares = run.ep > 1 && run.cp == 1;
    run.batch = GlobalBatch(ctx.reference->prompts, run.dp, run.batch_splits, equal_shares);
    const auto n = static_cast<int64_t>(run.batch.size());
    if (n < run.dp || (equal_shares && n % run.dp != 0)) {
      not_ready = "the reference bundle's prompts make " + std::to_string(n) +
                  " sequence(s) of 2 tokens or more, cut as far as they go; " +
                  std::to_string(run.dp) + " data-parallel ranks need one each at least" +
                  (equal_shares ? " and, under expert parallelism, as many each" : "");
      blocked = true;
    } else if (run.cp > 1) {
      std::string why;
      run.cp_tokens_trimmed = TrimForContextParallel(run.batch, run.dp, run.cp, why);
      if (run.cp_tokens_trimmed < 0) {
        not_ready = "the reference bundle's prompts cannot make each data-parallel share's "
                    "packing a multiple of cp=" + std::to_string(run.cp) + " columns, at " +
                    "least cp: " + why;
        blocked = true;
      }
    }
  }
  if (const std::string all = RankProblems(run.comm, not_ready); !all.empty()) {
    if (blocked) return out.Blocked(not_ready);
    return out.Unknown("not ready for the parallel gate: " + all);
  }
  bool layout_blocked = false;
  const std::string groups = FormGroups(run, layout_blocked);
  if (const std::string all = RankProblems(run.comm, groups); !all.empty()) {
    if (layout_blocked) return out.Blocked(groups);
    return out.Fail(groups.rfind("tensor-parallel plan", 0) == 0 ? FailureClass::kAdapterContract
                                                                 : FailureClass::kNativeRuntime,
                    all);
  }
  // Measured only at world size 1 there is nothing to shard and no group to hand the
  // adapter: the family's model trains as it loaded, its gradients read as any model's.
  if (ctx.world_size == 1) run.by_code = false;
  for (const torch::Tensor& ids : run.batch) run.global_tokens += static_cast<double>(ids.size(0) - 1);
  if (const std::string all = RankProblems(run.comm, BuildReplicas(run)); !all.empty()) {
    return out.Fail(FailureClass::kAdapterContract, all);
  }
  if (run.by_code) {
    bool no_experts = false;
    const std::string experts = ExpertsToSplit(run, no_experts);
    if (const std::string all = RankProblems(run.comm, experts); !all.empty()) {
      return no_experts ? out.Blocked(experts) : out.Unknown("not ready for the parallel gate: " + all);
    }
    // Every rank holds its loaded replica: the adapter's parallelize shards it over the
    // replica's tp group, its expert_parallel over the EP groups, its data_parallel over the
    // data-parallel ranks (a collective over the world).
    if (const std::string all = RankProblems(run.comm, ShardByCode(run)); !all.empty()) {
      return out.Fail(FailureClass::kAdapterContract,
                      "parallelize (tp=" + std::to_string(run.tp) + ") failed: " + all);
    }
    if (run.model_reduces && static_cast<int64_t>(run.batch.size()) % run.dp != 0) {
      // The model's own data parallelism runs collectives in every forward and backward:
      // every data-parallel rank must run as many sequences.
      run.batch = GlobalBatch(ctx.reference->prompts, run.dp, run.batch_splits, /*equal_shares=*/true);
      if (static_cast<int64_t>(run.batch.size()) % run.dp != 0) {
        return out.Blocked("the reference bundle's prompts cannot be cut into as many sequences "
                           "for each of the " + std::to_string(run.dp) + " data-parallel ranks, "
                           "which the adapter's own data parallelism needs");
      }
      run.global_tokens = 0;
      for (const torch::Tensor& ids : run.batch) run.global_tokens += static_cast<double>(ids.size(0) - 1);
    }
  }
  if (const std::string all = RankProblems(run.comm, IndexParameters(run)); !all.empty()) {
    return out.Fail(FailureClass::kAdapterContract, all);
  }
  if (ctx.parallel_measure_only) return TrainMeasuredOnly(run, std::move(out));
  if (const std::string all = RankProblems(run.comm, CompareSave(run)); !all.empty()) {
    return out.Fail(FailureClass::kAdapterContract, all);
  }
  if (run.cp > 1) {
    if (!run.model->SupportsContextParallel()) {
      return out.Blocked("cp=" + std::to_string(run.cp) + ": the family's model has no " +
                         "context-parallel forward (CausalLM::SupportsContextParallel)");
    }
    if (const std::string all = RankProblems(run.comm, CompareContextParallelLogits(run)); !all.empty()) {
      return out.Fail(FailureClass::kNativeRuntime, all);
    }
  }
  if (const std::string all = RankProblems(run.comm, Train(run)); !all.empty()) {
    return out.Fail(FailureClass::kNativeRuntime, all);
  }
  if (const std::string all = RankProblems(run.comm, CompareParameters(run)); !all.empty()) {
    return out.Fail(FailureClass::kAdapterContract, all);
  }
  if (!run.rank0) {
    out.Text("comparison", "made on rank 0 (the single-rank control lives there)");
    return out;
  }
  RecordAndJudge(run, out);
  return out;
}

}  // namespace gatehouse::worker::parallel
