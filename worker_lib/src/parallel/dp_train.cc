// The data-parallel check's optimizer steps (dp_run.h Train): each rank's share of the global
// batch forward and backward, the gradients reduced over the data-parallel groups, the step
// (on this rank's slices under dp_shard), and on rank 0 the control on the whole batch, its
// gradients the bar's reference.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>

#include "../gates_internal.h"
#include "dp_run.h"
#include "gatehouse/worker/bars.h"

namespace gatehouse::worker::parallel {

using internal::Positions;

namespace {

/// The sequences (d, d + dp, ...) of the global batch that dp index d takes.
std::vector<torch::Tensor> ShareOf(const DpRun& run, int64_t dp_index) {
  std::vector<torch::Tensor> share;
  for (size_t i = static_cast<size_t>(dp_index); i < run.batch.size(); i += static_cast<size_t>(run.dp)) {
    share.push_back(run.batch[i]);
  }
  return share;
}

/// Tokens predicted on `sequences` (each predicts all but its first).
double Tokens(const std::vector<torch::Tensor>& sequences) {
  double n = 0;
  for (const torch::Tensor& ids : sequences) n += static_cast<double>(ids.size(0) - 1);
  return n;
}

void SetGrads(const std::vector<ParamGroup>& groups, const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < groups.size(); ++i) groups[i].tensor.mutable_grad() = grads[i].clone();
}

void ZeroGrads(const std::vector<ParamGroup>& groups) {
  for (const ParamGroup& g : groups) g.tensor.mutable_grad() = torch::Tensor();
}

/// A model sharded by code keeps its gradients on its own (DTensor) parameters: each
/// registered shard takes this rank's part of its parameter's gradient (the same storage).
void TakeLocalGradients(DpRun& run) {
  Result<NamedTensors> grads = run.model->LocalGradients();
  if (!grads.ok()) throw std::runtime_error("the local gradients: " + grads.status().message());
  std::map<std::string, torch::Tensor> by_name(grads->begin(), grads->end());
  for (const ParamGroup& g : run.params) {
    auto it = by_name.find(g.names[0]);
    if (it == by_name.end()) throw std::runtime_error("no local gradient of " + g.names[0]);
    g.tensor.mutable_grad() = it->second;
  }
}

/// This rank's share, forward and backward, then the gradients reduced over the
/// data-parallel groups as `run.reduction` says (kSum is the correct one). Returns the global
/// loss.
double DataParallelStep(DpRun& run) {
  GateContext& ctx = run.ctx;
  const std::vector<torch::Tensor> share = ShareOf(run, run.dp_index);
  const bool local_mean = run.reduction.mode == DpReduction::Mode::kLocalMean;
  ZeroGrads(run.params);
  // A model sharded by code keeps its gradients on its own (DTensor) parameters too.
  if (run.by_code) run.model->zero_grad(/*set_to_none=*/true);
  const double normalizer = local_mean ? Tokens(share) : run.global_tokens;
  double local = run.cp > 1 ? ContextParallelBackward(run, share, normalizer)
                            : Backward(*run.model, share, normalizer, ctx.device);
  torch::Tensor loss = torch::tensor({local}, torch::kDouble);
  run.dp_comm->AllReduceSum(loss);
  torch::NoGradGuard no_grad;
  if (run.by_code) TakeLocalGradients(run);
  // The adapter's own data parallelism has reduced them already (each rank its shard).
  for (size_t i = 0; i < run.params.size() && !run.model_reduces; ++i) {
    const ParamGroup& g = run.params[i];
    const bool expert = run.expert[i];
    torch::Tensor grad = g.tensor.grad().defined() ? g.tensor.grad() : torch::zeros_like(g.tensor);
    if (run.reduction.mode == DpReduction::Mode::kNone) {
      g.tensor.mutable_grad() = grad;
      continue;
    }
    torch::Tensor wide =
        grad.to(run.reduction.mode == DpReduction::Mode::kBf16Reduction ? torch::kBFloat16 : torch::kFloat)
            .contiguous();
    if (expert && run.reduction.mode != DpReduction::Mode::kExpertsOverDp) {
      // An expert's gradient already holds every EP rank's tokens (the all-to-all's
      // backward); what is left is the sum over the ranks that hold the same experts.
      if (run.expert_dp_comm) run.expert_dp_comm->AllReduceSum(wide);
    } else if (run.reduction.mode == DpReduction::Mode::kWholeWorld) {
      run.comm.AllReduceSum(wide);
    } else {
      // FSDP's reduce-scatter sums over the shard group (each rank keeps its slice at the
      // step: ShardedAdamW); HSDP then all-reduces over the replicas.
      if (run.shard_comm) run.shard_comm->AllReduceSum(wide);
      if (run.replicate_comm && run.reduction.mode != DpReduction::Mode::kShardGroupOnly) {
        run.replicate_comm->AllReduceSum(wide);
      }
    }
    if (run.reduction.mode == DpReduction::Mode::kAverage ||
        run.reduction.mode == DpReduction::Mode::kLocalMean) {
      wide.div_(static_cast<double>(run.dp));
    }
    // In place where there is a gradient: under a model sharded by code it is the model's own
    // (DTensor) gradient's storage, which the model's clipping norm reads.
    if (g.tensor.grad().defined()) {
      if (!wide.is_same(grad)) grad.copy_(wide);
    } else {
      g.tensor.mutable_grad() = wide.to(grad.scalar_type());
    }
  }
  const double global = loss.item<double>();
  return local_mean ? global / static_cast<double>(run.dp) : global;
}

/// Step 1's tokens per expert, summed over the data-parallel ranks (every rank of a tp group
/// routes the same tokens, so the dp group counts each once) into run.expert_tokens.
void ExpertTokens(DpRun& run) {
  torch::Tensor counts = run.model->ExpertTokenCounts();
  if (!counts.defined()) return;
  counts = counts.clone();
  if (run.reduction.mode != DpReduction::Mode::kExpertCountsNotReduced) run.dp_comm->AllReduceSum(counts);
  run.expert_tokens = counts;
}

/// Rank 0, step 1: the control's gradient of the global batch in the ranks' grouping (each
/// share's gradient accumulated alone, the shares added in fp32 in rank order) against the
/// control's own (prompt order): each tensor's reduction-order spread. Leaves the control's
/// own gradients in place.
/// Also counts the tensors whose reduced gradient `ours` equals that grouping bit for bit.
void MeasureOrderFloor(DpRun& run, const std::vector<torch::Tensor>& control_grads,
                       const std::vector<torch::Tensor>& ours) {
  std::vector<torch::Tensor> grouped;
  for (int64_t r = 0; r < run.dp; ++r) {
    ZeroGrads(run.control_params);
    Backward(*run.control, ShareOf(run, r), run.global_tokens, run.ctx.device);
    const std::vector<torch::Tensor> share = GradsOf(run.control_params);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < share.size(); ++i) {
      if (r == 0) grouped.push_back(share[i].to(torch::kFloat));
      else grouped[i].add_(share[i].to(torch::kFloat));
    }
  }
  for (size_t i = 0; i < grouped.size(); ++i) {
    const torch::Tensor same_dtype = grouped[i].to(control_grads[i].scalar_type());
    const double rel = RelDiff(same_dtype, control_grads[i]).first;
    if (torch::equal(same_dtype, ours[i])) ++run.grads_bit_equal_to_grouping;
    run.floor.push_back(rel);
    run.floor_max = std::max(run.floor_max, rel);
  }
  SetGrads(run.control_params, control_grads);
}

/// Rank 0: the reduced gradients of one step against the control's, each with its bar.
void CompareStepGradients(DpRun& run, int step, const std::vector<torch::Tensor>& ours,
                          const std::vector<torch::Tensor>& control) {
  for (size_t i = 0; i < ours.size(); ++i) {
    const double bar = std::max(run.thr.grad_rel_below, kFloorMargin * run.floor[i]);
    run.trace.AddGradient(run.params[i].names[0], step, ours[i], control[i], bar);
  }
}

}  // namespace

std::vector<torch::Tensor> GlobalBatch(const std::vector<ReferencePrompt>& prompts, int64_t dp,
                                       int64_t& splits, bool equal_shares) {
  std::vector<torch::Tensor> batch;
  for (const ReferencePrompt& p : prompts) {
    if (p.input_ids.size(0) >= 2) batch.push_back(p.input_ids);
  }
  splits = 0;
  auto short_of = [&] {
    const auto n = static_cast<int64_t>(batch.size());
    return n < dp || (equal_shares && n % dp != 0);
  };
  while (short_of()) {
    auto longest = std::max_element(batch.begin(), batch.end(), [](const auto& a, const auto& b) {
      return a.size(0) < b.size(0);
    });
    if (longest == batch.end() || (*longest).size(0) < 4) break;
    const int64_t t = (*longest).size(0), first = (t + 1) / 2;
    const torch::Tensor whole = *longest;
    *longest = whole.slice(0, 0, first);
    batch.insert(longest + 1, whole.slice(0, first, t));
    ++splits;
  }
  return batch;
}

std::vector<torch::Tensor> Full(const DpRun& run, const std::vector<torch::Tensor>& local) {
  if (run.by_code) {
    // The family's own sharding puts its shards together (a collective over the mesh).
    NamedTensors named;
    for (size_t i = 0; i < local.size(); ++i) named.emplace_back(run.params[i].names[0], local[i]);
    Result<NamedTensors> full = run.model->FullOfLocal(named);
    if (!full.ok()) throw std::runtime_error(full.status().message());
    std::vector<torch::Tensor> out;
    for (auto& [name, t] : *full) out.push_back(std::move(t));
    return out;
  }
  if (!run.plan && !run.ep_comm) return local;
  std::vector<torch::Tensor> full;
  full.reserve(local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    const std::string& name = run.params[i].names[0];
    torch::Tensor whole = local[i];
    if (run.plan) whole = UnshardOverTp(*run.plan, *run.tp_comm, name, whole);
    if (run.ep_comm && run.expert[i]) whole = torch::cat(run.ep_comm->AllGather(whole), 0);
    full.push_back(whole);
  }
  return full;
}

double ShardedNorm(const DpRun& run, const std::vector<torch::Tensor>& local) {
  using Mode = DpReduction::Mode;
  double experts = 0, sharded = 0, replicated = 0;
  for (size_t i = 0; i < local.size(); ++i) {
    const double sq = local[i].to(torch::kDouble).pow(2).sum().item<double>();
    const ShardRule* rule = run.plan ? run.plan->Find(run.params[i].names[0]) : nullptr;
    const bool split = rule != nullptr && rule->style != ShardStyle::kReplicated;
    if (run.expert[i]) experts += sq;
    else if (split) sharded += sq;
    else replicated += sq;
  }
  torch::Tensor e = torch::tensor({experts}, torch::kDouble);
  if (run.ep_comm && run.reduction.mode != Mode::kEpNormLocal) {
    run.ep_comm->AllReduceSum(e);
    if (run.reduction.mode == Mode::kEpNormAveraged) e.div_(static_cast<double>(run.ep));
  }
  // Experts are tp-sharded too (etp = tp): with the dense shards, summed over the tp group.
  torch::Tensor s = e + sharded;
  torch::Tensor r = torch::tensor({replicated}, torch::kDouble);
  if (run.tp_comm) {
    run.tp_comm->AllReduceSum(s);
    if (run.reduction.mode == Mode::kReplicatedCountedTp) run.tp_comm->AllReduceSum(r);
  }
  return std::sqrt((s + r).item<double>());
}

namespace {

/// True when a trainer of this layout clips with a norm over sharded tensors (tp or ep, or the
/// adapter's own data parallelism).
bool ClipsShards(const DpRun& run) {
  return run.tp > 1 || run.ep > 1 || (run.by_code && run.model_reduces);
}

/// The norm the trainer clips with: a model sharded by code gives its own (the adapter's
/// framework's, CausalLM::ClippingGradNorm, from its DTensor gradients), else ShardedNorm
/// over `local` (the check's plan). Throws std::runtime_error with the model's error.
double ClippingNorm(const DpRun& run, const std::vector<torch::Tensor>& local) {
  if (!run.by_code) return ShardedNorm(run, local);
  Result<double> norm = run.model->ClippingGradNorm();
  if (!norm.ok()) throw std::runtime_error("the clipping grad norm: " + norm.status().message());
  return *norm;
}

}  // namespace

std::string Train(DpRun& run) {
  GateContext& ctx = run.ctx;
  UpstreamAdamW::Options options;
  options.lr = ctx.spec.training.lr;
  auto tensors = [](const std::vector<ParamGroup>& groups) {
    std::vector<torch::Tensor> t;
    for (const ParamGroup& g : groups) t.push_back(g.tensor);
    return t;
  };
  try {
    run.model->train();
    // dp_shard: each rank steps its slices (optimizer state sharded); else the whole tensors.
    // Experts (EP) are stepped apart: sharded over the ranks that hold the same experts.
    std::vector<torch::Tensor> dense, experts;
    for (size_t i = 0; i < run.params.size(); ++i) {
      (run.expert[i] ? experts : dense).push_back(run.params[i].tensor);
    }
    std::optional<UpstreamAdamW> optimizer, expert_optimizer;
    std::optional<ShardedAdamW> sharded, expert_sharded;
    // The adapter's own data parallelism holds each parameter's slice already.
    if (run.shard_comm && !run.model_reduces) sharded.emplace(dense, *run.shard_comm, options);
    else optimizer.emplace(dense, options);
    if (!experts.empty() && run.expert_shard_comm) {
      expert_sharded.emplace(experts, *run.expert_shard_comm, options);
    } else if (!experts.empty()) {
      expert_optimizer.emplace(experts, options);
    }
    std::optional<UpstreamAdamW> control_optimizer;
    if (run.control) {
      run.control->train();
      control_optimizer.emplace(tensors(run.control_params), options);
    }
    auto step_optimizers = [&] {
      if (sharded) sharded->Step();
      else optimizer->Step();
      if (expert_sharded) expert_sharded->Step();
      else if (expert_optimizer) expert_optimizer->Step();
    };
    for (int step = 1; step <= kDpSteps; ++step) {
      const auto started = std::chrono::steady_clock::now();
      run.model->ResetExpertTokenCounts();
      run.trace.loss.push_back(DataParallelStep(run));
      if (ctx.parallel_measure_only) {
        // What a trainer does, timed: the clipping norm and the step, without copying or
        // gathering anything to compare.
        if (ClipsShards(run)) {
          std::vector<torch::Tensor> held;  // the gradients as they are, not copied
          for (const ParamGroup& g : run.params) {
            held.push_back(g.tensor.grad().defined() ? g.tensor.grad() : torch::zeros_like(g.tensor));
          }
          run.trace.sharded_grad_norm.push_back(ClippingNorm(run, held));
        }
        step_optimizers();
        run.step_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
        continue;
      }
      if (step == 1) ExpertTokens(run);
      const std::vector<torch::Tensor> local = GradsOf(run.params);
      if (ClipsShards(run)) run.trace.sharded_grad_norm.push_back(ClippingNorm(run, local));
      const std::vector<torch::Tensor> ours = Full(run, local);
      run.trace.grad_norm.push_back(GlobalNorm(ours));
      if (run.control) {
        ZeroGrads(run.control_params);
        run.control->ResetExpertTokenCounts();
        run.trace.control_loss.push_back(
            Backward(*run.control, run.batch, run.global_tokens, ctx.device));
        if (step == 1) {
          run.control_expert_tokens = run.control->ExpertTokenCounts();
          run.control_near_ties = run.control->ExpertNearTies();
        }
        const std::vector<torch::Tensor> control = GradsOf(run.control_params);
        run.trace.control_grad_norm.push_back(GlobalNorm(control));
        if (step == 1) MeasureOrderFloor(run, control, ours);
        CompareStepGradients(run, step, ours, control);
        control_optimizer->Step();
      }
      step_optimizers();
    }
    int64_t dense_elements = 0, expert_elements = 0;
    for (size_t i = 0; i < run.params.size(); ++i) {
      (run.expert[i] ? expert_elements : dense_elements) += 2 * run.params[i].tensor.numel();
    }
    // Unsharded: every expert of the model, as the single-rank control holds them.
    run.optimizer_state_elements_unsharded =
        run.model_reduces ? 2 * run.full_elements : dense_elements + expert_elements * run.ep;
    run.optimizer_state_elements =
        (sharded ? sharded->StateElements() : optimizer->StateElements()) +
        (expert_sharded ? expert_sharded->StateElements()
                        : expert_optimizer ? expert_optimizer->StateElements() : 0);
    run.model->eval();
    if (run.control) run.control->eval();
  } catch (const std::exception& e) {
    return std::string("training: ") + e.what();
  }
  return "";
}

}  // namespace gatehouse::worker::parallel
