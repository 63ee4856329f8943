// The parallel gate's data-parallel check (parallel_internal.h DataParallelParity): the mesh's
// dp_replicate dimension trained against the single-rank control on rank 0.
//
// The global batch is the reference prompts of 2 tokens or more; rank r takes prompts r,
// r + dp, r + 2 dp, ... Every rank holds the whole model. The loss is the global token mean,
// as a trainer that packs variable-length sequences must compute it: each rank's loss is the
// sum of its prompts' next-token cross entropies divided by the global count of predicted
// tokens (all-reduced first), and the gradients are all-reduced as a SUM, in fp32 (FSDP2's
// reduce_dtype), then cast back to the parameter dtype. Two optimizer steps (the training
// gate's AdamW, the cell's lr) follow, on every rank and on the control.
//
// What is compared, per step: the global loss, the global gradient norm (what a trainer clips
// with), every gradient (rank 0's reduced one against the control's); after the steps, every
// rank's parameters against rank 0's (replicas must be bit-equal) and rank 0's against the
// control's. The gradient bars come from the reduction-order spread measured in the same run:
// at step 1 the control computes the global batch twice, once in prompt order and once in the
// ranks' grouping (each rank's share summed, then the shares added in fp32), and each tensor's
// bar is kFloorMargin times that spread, never below the TP bar (TpThresholds).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>

#include "../gates_internal.h"
#include "gatehouse/worker/adamw.h"
#include "gatehouse/worker/bars.h"
#include "parallel_internal.h"
#include "tp_run.h"

namespace gatehouse::worker::parallel {

using internal::Num;
using internal::Positions;

namespace {

constexpr int kSteps = 2;

/// Sum of the next-token cross entropies of `ids` [T] int64 (T >= 2), in fp32.
torch::Tensor TokenLossSum(CausalLM& model, const torch::Tensor& ids, torch::Device device) {
  const int64_t t = ids.size(0);
  const torch::Tensor d = ids.to(device);
  const torch::Tensor logits =
      model.Forward(d.slice(0, 0, t - 1).unsqueeze(0), Positions(0, t - 1, device), nullptr)
          .to(torch::kFloat);
  return torch::nn::functional::cross_entropy(
      logits.view({-1, logits.size(-1)}), d.slice(0, 1, t),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

/// What the check's steps share.
struct DpRun {
  GateContext& ctx;
  TpCommunicator& comm;
  int64_t dp;
  bool rank0;
  TpThresholds thr;
  DpReduction reduction;
  std::vector<const ReferencePrompt*> batch;  // the global batch, in bundle order
  double global_tokens = 0;                   // predicted tokens of the whole batch
  std::shared_ptr<CausalLM> model, control;
  std::vector<ParamGroup> params, control_params;  // UniqueParameters, the same order
  // Per step: the global loss and gradient norm, here and on the control.
  std::vector<double> loss, control_loss, grad_norm, control_grad_norm;
  // Step 1: each tensor's reduction-order spread (relative to its max) and its bar.
  std::vector<double> floor;
  double floor_max = 0;
  int64_t grads_bit_equal = 0, grads_compared = 0, grads_bit_equal_to_grouping = 0;
  double grad_max_rel = 0, worst_grad_ratio = 0, worst_grad_rel = 0, worst_grad_bar = 0;
  std::string worst_grad;
  double replica_max_abs = 0, replica_max_rel = 0;
  double params_after_max_abs = 0, params_after_max_rel = 0;
  std::vector<std::string> problems;
};

/// This rank's prompts (r, r + dp, ...) of the global batch.
std::vector<const ReferencePrompt*> ShareOf(const DpRun& run, int64_t rank) {
  std::vector<const ReferencePrompt*> share;
  for (size_t i = static_cast<size_t>(rank); i < run.batch.size(); i += static_cast<size_t>(run.dp)) {
    share.push_back(run.batch[i]);
  }
  return share;
}

double Tokens(const std::vector<const ReferencePrompt*>& prompts) {
  double n = 0;
  for (const ReferencePrompt* p : prompts) n += static_cast<double>(p->input_ids.size(0) - 1);
  return n;
}

/// Forward and backward over `prompts` on `model`, gradients accumulating; each prompt's loss
/// sum divided by `normalizer`. Returns the sum of those losses.
double Backward(CausalLM& model, const std::vector<const ReferencePrompt*>& prompts,
                double normalizer, torch::Device device) {
  double total = 0;
  for (const ReferencePrompt* p : prompts) {
    const torch::Tensor loss = TokenLossSum(model, p->input_ids, device) / normalizer;
    loss.backward();
    total += loss.item<double>();
  }
  return total;
}

/// Each parameter's gradient (zeros where it has none), in `groups` order.
std::vector<torch::Tensor> GradsOf(const std::vector<ParamGroup>& groups) {
  std::vector<torch::Tensor> out;
  out.reserve(groups.size());
  for (const ParamGroup& g : groups) {
    out.push_back(g.tensor.grad().defined() ? g.tensor.grad().detach().clone()
                                            : torch::zeros_like(g.tensor));
  }
  return out;
}

/// sqrt of the sum of squares of every gradient, in float64 (clip_grad_norm_'s total norm).
double GlobalNorm(const std::vector<torch::Tensor>& grads) {
  double sq = 0;
  for (const torch::Tensor& g : grads) sq += g.to(torch::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sq);
}

/// max |a - b| / max |b|, and whether a equals b bit for bit.
std::pair<double, bool> RelDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor da = a.to(torch::kDouble), db = b.to(torch::kDouble);
  const double scale = db.abs().max().item<double>();
  const double diff = (da - db).abs().max().item<double>();
  const double rel = scale > 0 ? diff / scale : (diff > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  return {rel, torch::equal(a, b)};
}

void SetGrads(const std::vector<ParamGroup>& groups, const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < groups.size(); ++i) groups[i].tensor.mutable_grad() = grads[i].clone();
}

void ZeroGrads(const std::vector<ParamGroup>& groups) {
  for (const ParamGroup& g : groups) g.tensor.mutable_grad() = torch::Tensor();
}

/// This rank's share, forward and backward, then the gradients reduced over the group as
/// `run.reduction` says (kSum is the correct one). Returns the global loss.
double DataParallelStep(DpRun& run) {
  GateContext& ctx = run.ctx;
  const std::vector<const ReferencePrompt*> share = ShareOf(run, ctx.rank);
  const bool local_mean = run.reduction.mode == DpReduction::Mode::kLocalMean;
  ZeroGrads(run.params);
  double local = Backward(*run.model, share, local_mean ? Tokens(share) : run.global_tokens, ctx.device);
  torch::Tensor loss = torch::tensor({local}, torch::kDouble);
  run.comm.AllReduceSum(loss);
  torch::NoGradGuard no_grad;
  for (const ParamGroup& g : run.params) {
    torch::Tensor grad = g.tensor.grad().defined() ? g.tensor.grad() : torch::zeros_like(g.tensor);
    if (run.reduction.mode == DpReduction::Mode::kNone) {
      g.tensor.mutable_grad() = grad;
      continue;
    }
    torch::Tensor wide = grad.to(torch::kFloat).contiguous();
    run.comm.AllReduceSum(wide);
    if (run.reduction.mode != DpReduction::Mode::kSum) wide.div_(static_cast<double>(run.dp));
    g.tensor.mutable_grad() = wide.to(grad.scalar_type());
  }
  const double global = loss.item<double>();
  return local_mean ? global / static_cast<double>(run.dp) : global;
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

/// Rank 0: the reduced gradients of one step against the control's.
void CompareStepGradients(DpRun& run, int step, const std::vector<torch::Tensor>& ours,
                          const std::vector<torch::Tensor>& control) {
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto [rel, equal] = RelDiff(ours[i], control[i]);
    ++run.grads_compared;
    if (equal) ++run.grads_bit_equal;
    run.grad_max_rel = std::max(run.grad_max_rel, rel);
    const double bar = std::max(run.thr.grad_rel_below, kFloorMargin * run.floor[i]);
    if (run.worst_grad.empty() || rel / bar > run.worst_grad_ratio) {
      run.worst_grad_ratio = rel / bar;
      run.worst_grad_rel = rel;
      run.worst_grad_bar = bar;
      run.worst_grad = run.params[i].names[0] + " (step " + std::to_string(step) + ")";
    }
  }
}

/// Builds and loads the full model on every rank and the control on rank 0. Returns this
/// rank's problem ("" when none).
std::string BuildReplicas(DpRun& run) {
  GateContext& ctx = run.ctx;
  try {
    for (int copy = 0; copy < (run.rank0 ? 2 : 1); ++copy) {
      Result<std::shared_ptr<CausalLM>> built = [&] {
        const SkipWeightInit loaded_next;  // the load below overwrites every parameter
        return ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
      }();
      if (!built.ok() || !*built) {
        return "Construct: " + (built.ok() ? std::string("returned no model") : built.status().ToString());
      }
      Result<LoadReport> loaded = LoadFull(ctx, **built);
      if (!loaded.ok() || !loaded->ok()) {
        return std::string(copy == 0 ? "full load" : "single-rank control") + " on rank " +
               std::to_string(ctx.rank) + ": " +
               (loaded.ok() ? LoadProblems(*loaded) : loaded.status().ToString());
      }
      // A parameter adopted from the checkpoint's mapping is the file's pages, the same ones
      // for every model of this process: each copy trains on memory of its own.
      torch::NoGradGuard no_grad;
      for (const ParamGroup& g : UniqueParameters(**built)) g.tensor.set_data(g.tensor.detach().clone());
      (copy == 0 ? run.model : run.control) = *built;
    }
  } catch (const std::exception& e) {
    return std::string("building or loading the replica: ") + e.what();
  }
  run.params = UniqueParameters(*run.model);
  if (run.control) run.control_params = UniqueParameters(*run.control);
  return "";
}

/// The two optimizer steps, each compared on rank 0. Returns this rank's problem.
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
    UpstreamAdamW optimizer(tensors(run.params), options);
    std::optional<UpstreamAdamW> control_optimizer;
    if (run.control) {
      run.control->train();
      control_optimizer.emplace(tensors(run.control_params), options);
    }
    for (int step = 1; step <= kSteps; ++step) {
      run.loss.push_back(DataParallelStep(run));
      const std::vector<torch::Tensor> ours = GradsOf(run.params);
      run.grad_norm.push_back(GlobalNorm(ours));
      if (run.control) {
        ZeroGrads(run.control_params);
        run.control_loss.push_back(
            Backward(*run.control, run.batch, run.global_tokens, ctx.device));
        const std::vector<torch::Tensor> control = GradsOf(run.control_params);
        run.control_grad_norm.push_back(GlobalNorm(control));
        if (step == 1) MeasureOrderFloor(run, control, ours);
        CompareStepGradients(run, step, ours, control);
        control_optimizer->Step();
      }
      optimizer.Step();
    }
    run.model->eval();
    if (run.control) run.control->eval();
  } catch (const std::exception& e) {
    return std::string("training: ") + e.what();
  }
  return "";
}

/// After the steps: every rank's parameters against rank 0's, and rank 0's against the control's.
void CompareParameters(DpRun& run) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < run.params.size(); ++i) {
    const torch::Tensor p = run.params[i].tensor.detach();
    const std::vector<torch::Tensor> copies = run.comm.AllGather(p);
    if (!run.rank0) continue;
    RankSpread(copies, run.replica_max_abs, run.replica_max_rel);
    const torch::Tensor c = run.control_params[i].tensor.detach();
    const double diff = (p.to(torch::kDouble) - c.to(torch::kDouble)).abs().max().item<double>();
    run.params_after_max_abs = std::max(run.params_after_max_abs, diff);
    run.params_after_max_rel = std::max(run.params_after_max_rel, RelDiff(p, c).first);
  }
}

double Rel(double a, double b) { return b != 0 ? std::abs(a - b) / std::abs(b) : std::abs(a - b); }

void RecordAndJudge(const DpRun& run, GateOutcome& out) {
  out.Count("dp", run.dp);
  out.Count("global_batch_prompts", static_cast<int64_t>(run.batch.size()));
  out.Count("global_batch_tokens", static_cast<int64_t>(run.global_tokens));
  out.Text("replicated_by", "gatehouse: every rank holds the whole model; gradients all-reduced " +
                                std::string(run.reduction.mode == DpReduction::Mode::kSum
                                                ? "(SUM in fp32) over the dp group"
                                                : "(mutated: " + run.reduction.Name() + ")"));
  std::vector<std::string> fails = run.problems;
  for (size_t s = 0; s < run.loss.size() && s < run.control_loss.size(); ++s) {
    const std::string k = std::to_string(s + 1);
    const double loss_rel = Rel(run.loss[s], run.control_loss[s]);
    const double norm_rel = Rel(run.grad_norm[s], run.control_grad_norm[s]);
    out.Real("loss_step_" + k, run.loss[s], "nats");
    out.Real("loss_step_" + k + "_control", run.control_loss[s], "nats");
    out.Real("loss_step_" + k + "_rel_diff", loss_rel, "ratio");
    out.Real("grad_norm_step_" + k, run.grad_norm[s], "gradient");
    out.Real("grad_norm_step_" + k + "_control", run.control_grad_norm[s], "gradient");
    out.Real("grad_norm_step_" + k + "_rel_diff", norm_rel, "ratio");
    if (!(loss_rel < run.thr.loss_rel_below)) {
      fails.push_back("step " + k + " loss " + Num(run.loss[s]) + " vs the control's " +
                      Num(run.control_loss[s]) + " (rel diff " + Num(loss_rel) + ", bar " +
                      Num(run.thr.loss_rel_below) + ")");
    }
    if (!(norm_rel < run.thr.loss_rel_below)) {
      fails.push_back("step " + k + " global grad norm " + Num(run.grad_norm[s]) +
                      " vs the control's " + Num(run.control_grad_norm[s]) + " (rel diff " +
                      Num(norm_rel) + ", bar " + Num(run.thr.loss_rel_below) + ")");
    }
  }
  out.Real("grad_order_floor_max_rel", run.floor_max, "ratio");
  out.Real("grad_max_rel_diff", run.grad_max_rel, "ratio");
  out.Count("grads_bit_equal", run.grads_bit_equal);
  out.Count("grads_compared", run.grads_compared);
  out.Count("grads_step1_bit_equal_to_grouping", run.grads_bit_equal_to_grouping);
  out.Text("grad_nearest_bar_tensor", run.worst_grad);
  out.Real("grad_nearest_bar_rel_diff", run.worst_grad_rel, "ratio");
  out.Real("grad_nearest_bar_bar", run.worst_grad_bar, "ratio");
  out.Text("grads_agree", run.grads_bit_equal == run.grads_compared
                              ? "bit-equal to the control"
                              : run.grad_max_rel <= kFloorMargin * run.floor_max
                                    ? "within the measured reduction-order spread"
                                    : "within the TP bar (above the measured spread)");
  if (run.worst_grad_ratio >= 1) {
    fails.push_back("gradient " + run.worst_grad + " differs from the control's by " +
                    Num(run.worst_grad_rel) + " of its max (bar " + Num(run.worst_grad_bar) + ")");
  }
  out.Real("replica_max_abs_diff", run.replica_max_abs, "parameter");
  out.Real("params_after_max_abs_diff", run.params_after_max_abs, "parameter");
  out.Real("params_after_max_rel_diff", run.params_after_max_rel, "ratio");
  if (run.replica_max_abs != 0) {
    fails.push_back("replicas differ after " + std::to_string(kSteps) +
                    " steps: parameters up to " + Num(run.replica_max_abs) +
                    " apart across ranks (they must be bit-equal)");
  }
  if (!fails.empty()) {
    out.Fail(FailureClass::kAdapterContract, "data parallel (dp=" + std::to_string(run.dp) +
                                                 ") against the single-rank control: " +
                                                 internal::JoinFew(fails));
  }
}

}  // namespace

std::string DpReduction::Name() const {
  switch (mode) {
    case Mode::kSum: return "sum";
    case Mode::kAverage: return "averaged over dp";
    case Mode::kLocalMean: return "each rank's own token mean, averaged over dp";
    case Mode::kNone: return "not reduced";
  }
  return "?";
}

GateOutcome DataParallelParity(GateContext& ctx, int64_t dp, GateOutcome out,
                               const DpReduction& reduction) {
  DpRun run{.ctx = ctx,
            .comm = *ctx.comm,
            .dp = dp,
            .rank0 = ctx.rank == 0,
            .thr = TpThresholdsFor(ctx.spec.precision),
            .reduction = reduction};
  bool blocked = false;  // an input the cell cannot change by running again
  std::string not_ready = NotReady(ctx, blocked);
  if (not_ready.empty()) {
    for (const ReferencePrompt& p : ctx.reference->prompts) {
      if (p.input_ids.size(0) >= 2) run.batch.push_back(&p);
    }
    if (static_cast<int64_t>(run.batch.size()) < dp) {
      not_ready = "the reference bundle has " + std::to_string(run.batch.size()) +
                  " prompt(s) of 2 tokens or more; dp=" + std::to_string(dp) +
                  " needs one per rank at least";
      blocked = true;
    }
  }
  if (const std::string all = RankProblems(run.comm, not_ready); !all.empty()) {
    if (blocked) return out.Blocked(not_ready);
    return out.Unknown("not ready for the parallel gate: " + all);
  }
  run.global_tokens = Tokens(run.batch);
  if (const std::string all = RankProblems(run.comm, BuildReplicas(run)); !all.empty()) {
    return out.Fail(FailureClass::kAdapterContract, all);
  }
  if (const std::string all = RankProblems(run.comm, Train(run)); !all.empty()) {
    return out.Fail(FailureClass::kNativeRuntime, all);
  }
  CompareParameters(run);
  if (!run.rank0) {
    out.Text("comparison", "made on rank 0 (the single-rank control lives there)");
    return out;
  }
  RecordAndJudge(run, out);
  return out;
}

}  // namespace gatehouse::worker::parallel
