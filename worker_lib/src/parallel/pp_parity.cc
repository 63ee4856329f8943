// The parallel gate's pipeline-parallel check (parallel_internal.h PipelineParallelParity): the
// mesh's pp dimension trained with a 1F1B schedule against the single-rank control on rank 0.
//
// The decoder layers are cut into pp contiguous stages (stage s: layers [s L / pp, (s + 1) L /
// pp), torchtitan's even split); stage 0 also embeds the tokens and the last stage applies the
// head. Every rank builds and loads the whole model but runs only its stage (CausalLM::
// ForwardStage): the parameters a stage owns are the ones its backward reaches (a tied
// embedding is owned by the first and the last stage). The global batch is split into
// microbatches, one sequence each (GlobalBatch, at least kMicrobatches of them), run through
// the stages with the 1F1B schedule (each stage: pp - 1 - s forwards to warm up, then one
// forward and one backward in turn, then the remaining backwards; activations forward and
// their gradients back by point-to-point sends). The loss is the global token mean: each
// microbatch's summed cross entropy divided by the predicted tokens of the whole batch, the
// gradients accumulating over the microbatches. Then each gradient is summed over the pp group
// (a stage's zeros where it does not own the parameter, both halves of a tied embedding's
// gradient where it does) and each stage steps the parameters it owns. Two AdamW steps.
//
// With tp (pp x tp) each stage's model is its tp shard (the family's plan, as the tensor-
// parallel check builds it); activations go between the ranks of equal TP rank (the pp group),
// and the gradients and parameters are gathered over the tp group before they are compared.
//
// Compared per step against the control (the whole model, the same sequences in the same
// order): the global loss, the global gradient norm, every gradient (bars: TpThresholds; the
// per-sequence arithmetic is the control's, so fp32 gradients are bit-equal except where two
// stages' parts add up, the tied embedding); after the steps each parameter of its owning
// stage against the control's, and the copies of a parameter two stages own (a tied
// embedding) against each other, which must be bit-equal.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "../gates_internal.h"
#include "dp_run.h"
#include "gatehouse/worker/adamw.h"
#include "gatehouse/worker/bars.h"
#include "parallel_internal.h"
#include "tp_run.h"

namespace gatehouse::worker::parallel {

using internal::Num;
using internal::Positions;

namespace {

constexpr int kSteps = 2;
constexpr int64_t kMicrobatches = 4;

/// What the check's steps share.
struct PpRun {
  GateContext& ctx;
  TpCommunicator& comm;  // the world: agreement on problems
  int64_t pp;
  int64_t stage;  // this rank's index in its pp group
  int64_t first_layer = 0, end_layer = 0;
  bool rank0;
  TpThresholds thr;
  PpFault fault;
  std::shared_ptr<TpCommunicator> pp_comm;
  // pp x tp: each stage's model sharded over its tp group through the family's plan (null
  // and empty when tp is 1). Activations go between ranks of equal TP rank.
  int64_t tp = 1;
  std::shared_ptr<TpCommunicator> tp_comm;
  std::optional<TpPlan> plan;
  std::vector<torch::Tensor> batch;  // microbatches: token ids [T] int64, CPU
  int64_t batch_splits = 0;
  double global_tokens = 0;
  std::shared_ptr<CausalLM> model, control;
  std::vector<ParamGroup> params, control_params;  // UniqueParameters, the same order
  std::vector<bool> owned;                         // per params entry: this stage's backward reached it
  std::vector<int64_t> owners;                     // per params entry: how many stages own it
  StepTrace trace;  // per step, here and on the control
  double stage_copies_max_abs = 0;  // a parameter two stages own, copy against copy
  double params_after_max_abs = 0, params_after_max_rel = 0;
  int64_t stage_param_elements = 0;  // what this stage owns
  // Each step's wall time on this rank (schedule, shared gradients summed, optimizer step), in
  // ms, and the optimizer state it holds: under GateContext::parallel_measure_only (no control,
  // nothing gathered or compared).
  std::vector<double> step_ms;
  int64_t optimizer_state_elements = 0;
};

/// One microbatch's forward on this stage: its input (token ids on stage 0, else the hidden
/// states received, a leaf whose gradient goes back), its output, and the last stage's loss.
struct InFlight {
  torch::Tensor input, output, loss;
};

torch::Tensor LossOf(const PpRun& run, const torch::Tensor& logits, const torch::Tensor& ids) {
  const int64_t t = ids.size(0);
  const torch::Tensor flat = logits.to(torch::kFloat).view({-1, logits.size(-1)});
  torch::Tensor sum = torch::nn::functional::cross_entropy(
      flat, ids.slice(0, 1, t).to(logits.device()),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  switch (run.fault.mode) {
    case PpFault::Mode::kNone:
    case PpFault::Mode::kTiedNotSynced:
    case PpFault::Mode::kStageReinit:
      return sum / run.global_tokens;
    case PpFault::Mode::kRawTokenSum:
      return sum;
    case PpFault::Mode::kMicrobatchMean:
      return sum / static_cast<double>(t - 1) / static_cast<double>(run.batch.size());
  }
  return sum;
}

/// Runs the 1F1B schedule over every microbatch on this stage; gradients accumulate on the
/// model. Returns the sum of the microbatch losses on the last stage (0 elsewhere).
double Schedule(PpRun& run) {
  GateContext& ctx = run.ctx;
  const int64_t m_count = static_cast<int64_t>(run.batch.size());
  const bool first = run.stage == 0, last = run.stage == run.pp - 1;
  std::vector<InFlight> flight(static_cast<size_t>(m_count));
  std::vector<std::function<void()>> pending;  // sends to wait for before returning
  double total = 0;
  auto forward = [&](int64_t m) {
    const torch::Tensor& ids = run.batch[static_cast<size_t>(m)];
    const int64_t t = ids.size(0) - 1;
    InFlight& f = flight[static_cast<size_t>(m)];
    if (first) {
      f.input = ids.slice(0, 0, t).unsqueeze(0).to(ctx.device);
    } else {
      // The previous stage sends the activation's shape first: a stage knows no hidden size.
      torch::Tensor shape = torch::empty({3}, torch::kLong);
      run.pp_comm->Recv(shape, run.stage - 1, /*tag=*/3 * m);
      torch::Tensor in = torch::empty({shape[0].item<int64_t>(), shape[1].item<int64_t>(),
                                       shape[2].item<int64_t>()},
                                      torch::TensorOptions().dtype(ctx.dtype).device(ctx.device));
      run.pp_comm->Recv(in, run.stage - 1, 3 * m + 1);
      f.input = in.requires_grad_(true);
    }
    f.output = run.model->ForwardStage(f.input, Positions(0, t, ctx.device), run.first_layer,
                                       run.end_layer);
    if (last) {
      f.loss = LossOf(run, f.output, ids);
      total += f.loss.item<double>();
    } else {
      pending.push_back(run.pp_comm->Send(torch::tensor(f.output.sizes().vec(), torch::kLong),
                                          run.stage + 1, 3 * m));
      pending.push_back(run.pp_comm->Send(f.output.detach(), run.stage + 1, 3 * m + 1));
    }
  };
  auto backward = [&](int64_t m) {
    InFlight& f = flight[static_cast<size_t>(m)];
    if (run.fault.mode == PpFault::Mode::kStageReinit && first && m_count > 1 && m == m_count - 1) {
      run.model->zero_grad(/*set_to_none=*/true);
    }
    if (last) {
      f.loss.backward();
    } else {
      torch::Tensor grad = torch::empty_like(f.output);
      run.pp_comm->Recv(grad, run.stage + 1, 3 * m + 2);
      f.output.backward(grad);
    }
    if (!first) pending.push_back(run.pp_comm->Send(f.input.grad(), run.stage - 1, 3 * m + 2));
    f = InFlight{};
  };
  const int64_t warmup = std::min(run.pp - 1 - run.stage, m_count);
  int64_t next_forward = 0, next_backward = 0;
  for (int64_t i = 0; i < warmup; ++i) forward(next_forward++);
  while (next_forward < m_count) {
    forward(next_forward++);
    backward(next_backward++);
  }
  while (next_backward < m_count) backward(next_backward++);
  for (auto& wait : pending) wait();
  return total;
}

/// Builds and loads the whole model on every rank (it runs only its stage; under tp its tp
/// shard through the family's plan) and the control on rank 0. Returns this rank's problem.
std::string BuildStages(PpRun& run) {
  GateContext& ctx = run.ctx;
  for (int copy = 0; copy < (run.rank0 ? 2 : 1); ++copy) {
    const bool sharded = copy == 0 && run.plan.has_value();
    const TensorParallel tp{run.tp_comm ? run.tp_comm->rank() : 0, run.tp, run.tp_comm};
    const ShardedLoad shard{sharded ? &*run.plan : nullptr, tp.rank};
    Result<std::shared_ptr<CausalLM>> built = TrainableModel(
        ctx, copy == 0 ? (sharded ? "the stage's tp shard" : "the stage's model") : "the single-rank control",
        [&] {
          return sharded ? ctx.family->ConstructParallel(*ctx.args, ctx.dtype, ctx.device, tp)
                         : ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
        },
        [&](CausalLM& m) {
          return sharded ? LoadStateDict(*ctx.checkpoint, *ctx.adapter, m, &shard) : LoadFull(ctx, m);
        });
    if (!built.ok()) return built.status().message();
    (copy == 0 ? run.model : run.control) = *built;
  }
  run.params = UniqueParameters(*run.model);
  if (run.control) run.control_params = UniqueParameters(*run.control);
  return "";
}

/// After the first schedule: which parameters this stage's backward reached, and how many
/// stages own each (summed over the pp group).
void FindOwners(PpRun& run) {
  torch::Tensor mine = torch::zeros({static_cast<int64_t>(run.params.size())}, torch::kLong);
  for (size_t i = 0; i < run.params.size(); ++i) {
    run.owned.push_back(run.params[i].tensor.grad().defined());
    if (run.owned.back()) {
      mine[static_cast<int64_t>(i)] = 1;
      run.stage_param_elements += run.params[i].tensor.numel();
    }
  }
  run.pp_comm->AllReduceSum(mine);
  for (int64_t i = 0; i < mine.size(0); ++i) run.owners.push_back(mine[i].item<int64_t>());
}

/// A parameter two stages own (a tied embedding: looked up on the first, the head on the
/// last) has its gradient summed over the pp group, so both stages step on the whole gradient
/// (PpFault kTiedNotSynced leaves each stage its own part).
void SyncSharedGradients(PpRun& run) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < run.params.size(); ++i) {
    if (run.owners[i] < 2 || run.fault.mode == PpFault::Mode::kTiedNotSynced) continue;
    const ParamGroup& g = run.params[i];
    torch::Tensor grad = g.tensor.grad().defined() ? g.tensor.grad() : torch::zeros_like(g.tensor);
    torch::Tensor wide = grad.to(torch::kFloat).contiguous();
    run.pp_comm->AllReduceSum(wide);
    g.tensor.mutable_grad() = wide.to(grad.scalar_type());
  }
}

/// Every parameter's full gradient as its owning stages hold it, on every rank (for the
/// comparison only): the owners' gradients summed over the pp group and divided by the
/// number of owners (the same gradient on each, when they are in sync), then gathered over
/// the tp group. A collective.
std::vector<torch::Tensor> OwnersGradients(const PpRun& run) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < run.params.size(); ++i) {
    const ParamGroup& g = run.params[i];
    torch::Tensor wide = run.owned[i] && g.tensor.grad().defined()
                             ? g.tensor.grad().to(torch::kDouble).contiguous()
                             : torch::zeros(g.tensor.sizes(), torch::kDouble);
    run.pp_comm->AllReduceSum(wide);
    if (run.owners[i] > 1) wide.div_(static_cast<double>(run.owners[i]));
    const torch::Tensor local = wide.to(g.tensor.scalar_type());
    out.push_back(run.plan ? UnshardOverTp(*run.plan, *run.tp_comm, g.names[0], local) : local);
  }
  return out;
}

/// The optimizer steps: the schedule, the reduction over the stages, each stage stepping what
/// it owns; the control on rank 0. Returns this rank's problem.
std::string Train(PpRun& run) {
  GateContext& ctx = run.ctx;
  UpstreamAdamW::Options options;
  options.lr = ctx.spec.training.lr;
  try {
    run.model->train();
    std::optional<UpstreamAdamW> optimizer, control_optimizer;
    if (run.control) {
      run.control->train();
      std::vector<torch::Tensor> all;
      for (const ParamGroup& g : run.control_params) all.push_back(g.tensor);
      control_optimizer.emplace(all, options);
    }
    for (int step = 1; step <= kSteps; ++step) {
      const auto started = std::chrono::steady_clock::now();
      for (const ParamGroup& g : run.params) g.tensor.mutable_grad() = torch::Tensor();
      torch::Tensor loss = torch::tensor({Schedule(run)}, torch::kDouble);
      if (step == 1) {
        FindOwners(run);
        std::vector<torch::Tensor> mine;
        for (size_t i = 0; i < run.params.size(); ++i) {
          if (run.owned[i]) mine.push_back(run.params[i].tensor);
        }
        optimizer.emplace(mine, options);
      }
      run.pp_comm->AllReduceSum(loss);  // the last stage's, to every stage
      const double global = loss.item<double>();
      SyncSharedGradients(run);
      if (ctx.parallel_measure_only) {
        run.trace.loss.push_back(global);
        optimizer->Step();
        run.optimizer_state_elements = optimizer->StateElements();
        run.step_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
        continue;
      }
      const std::vector<torch::Tensor> ours = OwnersGradients(run);
      run.trace.loss.push_back(global);
      run.trace.grad_norm.push_back(GlobalNorm(ours));
      if (run.control) {
        for (const ParamGroup& g : run.control_params) g.tensor.mutable_grad() = torch::Tensor();
        run.trace.control_loss.push_back(
            Backward(*run.control, run.batch, run.global_tokens, ctx.device));
        const std::vector<torch::Tensor> control = GradsOf(run.control_params);
        run.trace.control_grad_norm.push_back(GlobalNorm(control));
        for (size_t i = 0; i < ours.size(); ++i) {
          run.trace.AddGradient(run.params[i].names[0], step, ours[i], control[i],
                                run.thr.grad_rel_below);
        }
        control_optimizer->Step();
      }
      optimizer->Step();
    }
    run.model->eval();
    if (run.control) run.control->eval();
  } catch (const std::exception& e) {
    return std::string("training: ") + e.what();
  }
  return "";
}

/// After the steps: every stage's copy of each parameter it owns gathered to rank 0, against
/// the control's and, for a parameter two stages own, against the other stage's copy (full
/// tensors: tp shards gathered first). Returns this rank's problem.
std::string CompareParameters(PpRun& run) try {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < run.params.size(); ++i) {
    const torch::Tensor local = run.params[i].tensor.detach();
    const std::vector<torch::Tensor> copies = run.pp_comm->AllGather(
        run.plan ? UnshardOverTp(*run.plan, *run.tp_comm, run.params[i].names[0], local) : local);
    const std::vector<torch::Tensor> owned =
        run.pp_comm->AllGather(torch::tensor({run.owned[i] ? 1 : 0}, torch::kLong));
    if (!run.rank0) continue;
    std::optional<torch::Tensor> first;
    for (size_t s = 0; s < copies.size(); ++s) {
      if (owned[s].item<int64_t>() == 0) continue;
      if (!first) {
        first = copies[s];
        const torch::Tensor c = run.control_params[i].tensor.detach();
        const double diff = (first->to(torch::kDouble) - c.to(torch::kDouble)).abs().max().item<double>();
        run.params_after_max_abs = std::max(run.params_after_max_abs, diff);
        run.params_after_max_rel = std::max(run.params_after_max_rel, RelDiff(*first, c).first);
      } else {
        const double d = (copies[s].to(torch::kDouble) - first->to(torch::kDouble)).abs().max().item<double>();
        run.stage_copies_max_abs = std::max(run.stage_copies_max_abs, d);
      }
    }
  }
  return "";
} catch (const std::exception& e) {
  return std::string("gathering the parameters: ") + e.what();
}

/// pp x tp: joins this rank's tp group and takes the family's plan. Returns this rank's
/// problem; `blocked` when the family shards by code (the Python lane).
std::string JoinTensorParallel(PpRun& run, const Mesh& mesh, bool& blocked) {
  GateContext& ctx = run.ctx;
  if (ctx.family->MapsWeightsByCode() || ctx.family->ShardsLoadedModel()) {
    blocked = true;
    return "pp x tp: the family shards by code (the Python lane's parallelize), which has no "
           "stage contract yet";
  }
  Result<std::shared_ptr<TpCommunicator>> tp = MeshGroup(ctx, mesh, {Mesh::Dim::kTp});
  if (!tp.ok()) return "tp group: " + tp.status().message();
  run.tp_comm = *tp;
  Result<TpPlan> plan = ctx.family->Parallelize(*ctx.args, run.tp);
  if (!plan.ok()) {
    return "tensor-parallel plan (Parallelize, tp=" + std::to_string(run.tp) + "): " +
           plan.status().message();
  }
  run.plan = std::move(plan).value();
  return "";
}

void RecordAndJudge(const PpRun& run, GateOutcome& out) {
  std::vector<std::string> fails;
  out.Count("pp", run.pp);
  out.Count("microbatches", static_cast<int64_t>(run.batch.size()));
  out.Count("global_batch_splits", run.batch_splits);
  out.Text("schedule", "1F1B");
  int64_t shared = 0, unowned = 0;
  for (int64_t n : run.owners) {
    if (n > 1) ++shared;
    if (n == 0) ++unowned;
  }
  out.Count("params_owned_by_two_stages", shared);
  if (unowned > 0) {
    fails.push_back(std::to_string(unowned) + " parameter(s) no stage's backward reached");
  }
  run.trace.Record(run.thr.loss_rel_below, out, fails,
                   CheckpointKeys(run.ctx, run.control_params));
  out.Real("stage_copies_max_abs_diff", run.stage_copies_max_abs, "parameter");
  out.Real("params_after_max_abs_diff", run.params_after_max_abs, "parameter");
  out.Real("params_after_max_rel_diff", run.params_after_max_rel, "ratio");
  if (run.stage_copies_max_abs != 0) {
    fails.push_back("the stages' copies of a shared parameter (a tied embedding) differ by " +
                    Num(run.stage_copies_max_abs) + " after " + std::to_string(kSteps) +
                    " steps (they must be bit-equal)");
  }
  if (!fails.empty()) {
    out.Fail(FailureClass::kAdapterContract,
             "pipeline parallel (pp=" + std::to_string(run.pp) +
                 (run.tp > 1 ? " x tp=" + std::to_string(run.tp) : std::string()) +
                 ", 1F1B) against the single-rank control: " + internal::JoinFew(fails));
  }
  out.Lead({"loss_step_1_rel_diff", "grad_norm_step_1_rel_diff", "grad_nearest_bar_rel_diff",
            "stage_copies_max_abs_diff", "loss_step_2_rel_diff", "grad_norm_step_2_rel_diff"});
}

}  // namespace

std::string PpFault::Name() const {
  switch (mode) {
    case Mode::kNone: return "none";
    case Mode::kMicrobatchMean: return "each microbatch's own token mean, averaged over the microbatches";
    case Mode::kRawTokenSum: return "the raw token sum, not divided by the global token count";
    case Mode::kTiedNotSynced: return "a shared parameter's gradient not summed over the stages";
    case Mode::kStageReinit: return "the first stage re-initialised before its last microbatch";
  }
  return "?";
}

GateOutcome PipelineParallelParity(GateContext& ctx, const Mesh& mesh, GateOutcome out,
                                   const PpFault& fault) {
  PpRun run{.ctx = ctx,
            .comm = *ctx.comm,
            .pp = mesh.Size(Mesh::Dim::kPp),
            .stage = 0,
            .rank0 = ctx.rank == 0 && !ctx.parallel_measure_only,
            .thr = TpThresholdsFor(ctx.spec.precision),
            .fault = fault};
  bool blocked = false;
  std::string not_ready = NotReady(ctx, blocked);
  if (not_ready.empty()) {
    const int64_t layers = ctx.args->num_hidden_layers();
    if (layers < run.pp) {
      not_ready = "pp=" + std::to_string(run.pp) + " needs a decoder layer per stage at least; " +
                  "num_hidden_layers is " + std::to_string(layers);
      blocked = true;
    } else {
      run.batch = GlobalBatch(ctx.reference->prompts, kMicrobatches, run.batch_splits);
      if (run.batch.empty()) {
        not_ready = "the reference bundle has no prompt of 2 tokens or more";
        blocked = true;
      }
    }
  }
  if (const std::string all = RankProblems(run.comm, not_ready); !all.empty()) {
    if (blocked) return out.Blocked(not_ready);
    return out.Unknown("not ready for the parallel gate: " + all);
  }
  Result<std::shared_ptr<TpCommunicator>> group = MeshGroup(ctx, mesh, {Mesh::Dim::kPp});
  const std::string group_problem = group.ok() ? "" : "pp group: " + group.status().message();
  if (const std::string all = RankProblems(run.comm, group_problem); !all.empty()) {
    return out.Fail(FailureClass::kNativeRuntime, all);
  }
  run.pp_comm = *group;
  run.stage = run.pp_comm->rank();
  run.tp = mesh.Size(Mesh::Dim::kTp);
  if (run.tp > 1) {
    bool tp_blocked = false;
    const std::string tp_problem = JoinTensorParallel(run, mesh, tp_blocked);
    if (const std::string all = RankProblems(run.comm, tp_problem); !all.empty()) {
      if (tp_blocked) return out.Blocked(tp_problem);
      return out.Fail(FailureClass::kAdapterContract, all);
    }
    out.Text("tp_groups", GroupsText(mesh, {Mesh::Dim::kTp}));
    out.Text("pp_groups", GroupsText(mesh, {Mesh::Dim::kPp}));
  }
  const int64_t layers = ctx.args->num_hidden_layers();
  run.first_layer = run.stage * layers / run.pp;
  run.end_layer = (run.stage + 1) * layers / run.pp;
  for (const torch::Tensor& ids : run.batch) run.global_tokens += static_cast<double>(ids.size(0) - 1);
  if (const std::string all = RankProblems(run.comm, BuildStages(run)); !all.empty()) {
    return out.Fail(FailureClass::kAdapterContract, all);
  }
  // The same family on every rank: each rank reaches the same answer without a collective.
  if (!run.model->SupportsStages()) {
    return out.Blocked("the family's model does not run in stages (CausalLM::SupportsStages; "
                       "the Python lane has no stage contract yet)");
  }
  if (const std::string all = RankProblems(run.comm, Train(run)); !all.empty()) {
    return out.Fail(FailureClass::kNativeRuntime, all);
  }
  if (ctx.parallel_measure_only) {
    out.Count("stage_param_elements", run.stage_param_elements);
    return MeasuredOnly(std::move(out),
                        "pp=" + std::to_string(run.pp) +
                            (run.tp > 1 ? " x tp=" + std::to_string(run.tp) : std::string()) +
                            " (1F1B, " + std::to_string(run.batch.size()) + " microbatches)",
                        {run.step_ms, run.trace.loss, run.batch, run.global_tokens,
                         run.optimizer_state_elements},
                        run.params);
  }
  if (const std::string all = RankProblems(run.comm, CompareParameters(run)); !all.empty()) {
    return out.Fail(FailureClass::kAdapterContract, all);
  }
  const std::vector<torch::Tensor> elements =
      run.pp_comm->AllGather(torch::tensor({run.stage_param_elements}, torch::kLong));
  if (!run.rank0) {
    out.Text("comparison", "made on rank 0 (the single-rank control lives there)");
    return out;
  }
  std::string stages;
  for (int64_t s = 0; s < run.pp; ++s) {
    stages += (s ? ", " : "") + std::to_string(s) + ": layers [" +
              std::to_string(s * layers / run.pp) + ", " + std::to_string((s + 1) * layers / run.pp) + ")";
    out.Count("stage_param_elements_stage" + std::to_string(s), elements[static_cast<size_t>(s)].item<int64_t>());
  }
  out.Text("stages", stages);
  RecordAndJudge(run, out);
  return out;
}

}  // namespace gatehouse::worker::parallel
