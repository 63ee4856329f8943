// The parallel gate's tensor-parallel check (parallel_internal.h TensorParallelParity;
// docs/gate-facts.md "Tensor parallelism"): the model sharded over the TP group against the
// TP=1 control on rank 0. Its steps, in order (tp_run.h): agree on a plan, build and load the
// shards (and the control), compare the logits, train one step and compare every gradient
// gathered (here), then compare the saves and give the verdict (tp_save_verdict.cc).
#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include "../gates_internal.h"
#include "common/artifacts.h"
#include "gatehouse/worker/bars.h"
#include "gatehouse/worker/gates.h"
#include "tp_run.h"

namespace gatehouse::worker::parallel {

using internal::JoinFew;
using internal::Num;
using internal::NumVs;
using internal::Positions;

namespace {

// 4a. bf16 only, rank 0: each tensor's gradient spread from rounding alone, the TP=1 control's
// bf16 gradient against the same model's in fp32. Between collectives: a failure here keeps
// the fixed bar and says why, so the other ranks are never left waiting.
void MeasureBf16Floor(TpRun& run) {
  GateContext& ctx = run.ctx;
  try {
    Result<std::shared_ptr<CausalLM>> f32 = [&] {
      const SkipWeightInit loaded_next;  // LoadFull overwrites every parameter
      return ctx.family->Construct(*ctx.args, torch::kFloat32, ctx.device);
    }();
    Result<LoadReport> loaded =
        f32.ok() && *f32 ? run.LoadFull(**f32)
                         : Result<LoadReport>(f32.ok() ? Status::Internal("no model") : f32.status());
    if (!loaded.ok() || !loaded->ok()) {
      run.floor_note = "not measured: the fp32 model did not load (" +
                       (loaded.ok() ? LoadProblems(*loaded) : loaded.status().ToString()) + ")";
      return;
    }
    (*f32)->train();
    NextTokenLoss(**f32, run.train_prompt->input_ids, ctx.device).backward();
    std::unordered_map<std::string, torch::Tensor> g32;
    for (const auto& item : (*f32)->named_parameters(/*recurse=*/true)) {
      if (item.value().grad().defined()) g32.emplace(item.key(), item.value().grad());
    }
    torch::NoGradGuard no_grad;
    for (const auto& [name, p] : run.control_params) {
      auto it = g32.find(name);
      if (it == g32.end() || !p.grad().defined()) continue;
      const torch::Tensor ref = it->second.to(torch::kDouble);
      const double scale = ref.abs().max().item<double>();
      const double d = (p.grad().to(torch::kDouble) - ref).abs().max().item<double>();
      run.bf16_floor[name] = scale > 0 ? d / scale : 0.0;
    }
  } catch (const std::exception& e) {
    run.floor_note = std::string("not measured: ") + e.what();
  }
}

}  // namespace

// 1. Each rank checks what it needs, then all agree before any other collective.
bool AgreeOnPlan(TpRun& run, GateOutcome& out) {
  GateContext& ctx = run.ctx;
  run.by_code = ctx.family != nullptr && ctx.family->MapsWeightsByCode();
  const bool sharded_by_code = ctx.family != nullptr && ctx.family->ShardsLoadedModel();
  bool blocked = false;
  const std::string not_ready = NotReady(ctx, blocked);
  Status plan_status = Status::Ok();
  if (not_ready.empty() && !sharded_by_code) {
    if (run.by_code) {
      plan_status = Status::FailedPrecondition(
          "the adapter's ModelSpec gives no parallelize (docs/protocols.md, the Python adapter "
          "contract)");
    } else if (Result<TpPlan> p = ctx.family->Parallelize(*ctx.args, run.tp_size); p.ok()) {
      run.plan = std::move(p).value();
    } else {
      plan_status = p.status();
    }
  }
  const std::string plan_problem =
      plan_status.ok() ? ""
                       : "tensor-parallel plan (" +
                             std::string(run.by_code ? "parallelize" : "Parallelize") + ", tp=" +
                             std::to_string(run.tp_size) + "): " + plan_status.message();
  const std::string every_rank =
      RankProblems(run.comm, not_ready.empty() ? plan_problem : not_ready);
  if (!not_ready.empty()) {
    if (blocked) out.Blocked(not_ready);
    else out.Unknown(not_ready);
    return false;
  }
  if (!plan_problem.empty()) {
    out.Fail(FailureClass::kAdapterContract, plan_problem);
    return false;
  }
  if (!every_rank.empty()) {
    out.Unknown("not ready for the parallel gate: " + every_rank);
    return false;
  }
  if (run.plan) {
    int64_t n_sharded = 0, n_replicated = 0;
    for (const ShardRule& r : run.plan->rules()) {
      (r.style == ShardStyle::kReplicated ? n_replicated : n_sharded)++;
    }
    out.Count("plan_rules_sharded", n_sharded);
    out.Count("plan_rules_replicated", n_replicated);
  } else {
    out.Text("sharded_by", "the adapter's parallelize (torch.distributed DTensor)");
  }
  return true;
}

// 2. This rank's shard, loaded through the plan or sharded by the adapter after a full load;
// the TP=1 control on rank 0.
bool BuildShards(TpRun& run, GateOutcome& out) {
  GateContext& ctx = run.ctx;
  const TensorParallel tp{ctx.rank, run.tp_size, ctx.comm};
  std::string problem;
  FailureClass problem_class = FailureClass::kAdapterContract;
  // Exceptions (e.g. out of memory) become this rank's problem, so the agreement below still
  // runs on every rank and no rank is left waiting in a collective.
  try {
    Result<std::shared_ptr<CausalLM>> built = [&] {
      const SkipWeightInit loaded_next;  // the load below overwrites every parameter
      return run.plan ? ctx.family->ConstructParallel(*ctx.args, ctx.dtype, ctx.device, tp)
                      : ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
    }();
    const char* construct_name = run.plan ? "ConstructParallel" : "Construct";
    if (!built.ok() || !*built) {
      problem = std::string(construct_name) + ": " +
                (built.ok() ? std::string("returned no model") : built.status().ToString());
    } else {
      run.model = *built;
      const ShardedLoad shard{run.plan ? &*run.plan : nullptr, ctx.rank};
      Result<LoadReport> loaded = run.plan
                                      ? LoadStateDict(*ctx.checkpoint, *ctx.adapter, *run.model, &shard)
                                      : run.LoadFull(*run.model);
      const char* what = run.plan ? "sharded load" : "full load before parallelize";
      if (!loaded.ok()) {
        problem = std::string(what) + ": " + loaded.status().ToString();
        problem_class = FailureClass::kUnknown;
      } else if (!loaded->ok()) {
        problem = std::string(what) + " on rank " + std::to_string(ctx.rank) + ": " +
                  LoadProblems(*loaded);
      } else {
        out.Count("keys_loaded_rank" + std::to_string(ctx.rank), loaded->keys_used);
      }
    }
    if (problem.empty() && run.rank0) {
      Result<std::shared_ptr<CausalLM>> c = [&] {
        const SkipWeightInit loaded_next;  // the load below overwrites every parameter
        return ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
      }();
      Result<LoadReport> loaded =
          c.ok() && *c ? run.LoadFull(**c)
                       : Result<LoadReport>(c.ok() ? Status::Internal("no model") : c.status());
      if (!loaded.ok() || !loaded->ok()) {
        problem = "TP=1 control: " + (loaded.ok() ? LoadProblems(*loaded) : loaded.status().ToString());
      } else {
        run.control = *c;
      }
    }
  } catch (const c10::Error& e) {
    problem = std::string("building or loading the shard: LibTorch error: ") + e.what_without_backtrace();
    problem_class = FailureClass::kNativeRuntime;
  } catch (const std::exception& e) {
    problem = std::string("building or loading the shard: ") + e.what();
    problem_class = FailureClass::kUnknown;
  }
  if (const std::string all = RankProblems(run.comm, problem); !all.empty()) {
    out.Fail(problem.empty() ? FailureClass::kAdapterContract : problem_class, all);
    return false;
  }
  if (!run.plan) {
    // Every rank holds the loaded full model: the adapter shards it (a collective).
    Result<std::shared_ptr<CausalLM>> sharded =
        ShardLoadedModel(*ctx.family, run.model, tp, ctx.rank, ctx.world_size);
    if (!sharded.ok()) {
      problem = sharded.status().message();
      problem_class = sharded.status().code() == StatusCode::kInvalidArgument
                          ? FailureClass::kAdapterContract
                          : FailureClass::kNativeRuntime;
    } else {
      run.model = *sharded;
    }
    // A rank whose parallelize raised closed its torch.distributed group (lane.py), so the
    // others' collectives failed too; every rank reports every rank's reason, the cause
    // among them.
    if (const std::string all = RankProblems(run.comm, problem); !all.empty()) {
      out.Fail(problem.empty() ? FailureClass::kAdapterContract : problem_class,
               "parallelize (tp=" + std::to_string(run.tp_size) + ") failed: " + all);
      return false;
    }
  }

  // What each rank holds (every shard's shape was checked against the plan by the sharded
  // load; a model sharded by code registers its local shards), gathered.
  run.groups = UniqueParameters(*run.model);
  int64_t elements = 0;
  for (const auto& g : run.groups) elements += g.tensor.numel();
  run.counts = run.comm.AllGather(torch::tensor({elements}));
  for (size_t r = 0; r < run.counts.size(); ++r) {
    out.Count("param_elements_rank" + std::to_string(r), run.counts[r].item<int64_t>());
  }
  out.Count("param_tensors_per_rank", static_cast<int64_t>(run.groups.size()));
  return true;
}

// 3. Logits on the reference prompts: every rank's against the control's, upstream's and
// rank 0's.
bool CompareLogits(TpRun& run, GateOutcome& out) {
  GateContext& ctx = run.ctx;
  const ReferenceBundle& ref = *ctx.reference;
  // In bf16 a token whose upstream fp32 top-1 margin is within twice upstream's own bf16
  // rounding of that token's logits (reference logits_bf16 vs logits) has no decided argmax:
  // any reduction order may flip it. Top-1 is judged on the decided tokens.
  run.judge_decided = ctx.spec.precision == "bf16";
  torch::NoGradGuard no_grad;
  run.model->eval();
  if (run.control) run.control->eval();
  const int64_t vocab = ctx.args->vocab_size();
  std::string shape_problem;
  std::vector<torch::Tensor> mine;  // this rank's logits per prompt, [T, V] float CPU
  for (const ReferencePrompt& p : ref.prompts) {
    const int64_t t = p.input_ids.size(0);
    const torch::Tensor tokens = p.input_ids.unsqueeze(0).to(ctx.device);
    // Every rank runs every forward (they are collectives), whatever its shapes.
    const torch::Tensor ours = run.model->Forward(tokens, Positions(0, t, ctx.device), nullptr);
    if (ours.dim() != 3 || ours.size(0) != 1 || ours.size(1) != t || ours.size(2) != vocab) {
      if (shape_problem.empty()) {
        shape_problem = "the sharded model's forward returned logits " +
                        internal::ShapeString(ours.sizes()) + ", not the full [1, " +
                        std::to_string(t) + ", " + std::to_string(vocab) +
                        "] (every rank must get the full logits: vocab_size " +
                        std::to_string(vocab) + ")";
      }
      continue;
    }
    mine.push_back(ours[0].to(torch::kFloat).cpu());
    if (!run.rank0) continue;
    const torch::Tensor base = run.control->Forward(tokens, Positions(0, t, ctx.device), nullptr);
    const torch::Tensor base_cpu = base[0].to(torch::kFloat).cpu();
    const torch::Tensor ours_cpu = ours[0].to(torch::kFloat).cpu();
    const torch::Tensor kl = run.vs_tp1.Add(base_cpu, ours_cpu);
    run.kl_vs_tp1.push_back({{"prompt", run.kl_vs_tp1.size()}, {"kl", internal::DoublesOf(kl)}});
    run.vs_upstream.Add(p.fp32.logits, ours_cpu);
    torch::Tensor is_decided = torch::ones({t}, torch::kBool);
    if (run.judge_decided) {
      const torch::Tensor top2 = std::get<0>(p.fp32.logits.topk(2, -1));
      const torch::Tensor margin = top2.select(-1, 0) - top2.select(-1, 1);
      const torch::Tensor noise = (p.bf16.logits - p.fp32.logits).abs().amax(-1);
      is_decided = margin > 2 * noise;
    }
    run.decided += is_decided.sum().item<int64_t>();
    run.decided_equal +=
        (is_decided & base_cpu.argmax(-1).eq(ours_cpu.argmax(-1))).sum().item<int64_t>();
  }
  if (const std::string all = RankProblems(run.comm, shape_problem); !all.empty()) {
    out.Fail(FailureClass::kAdapterContract, all);
    return false;
  }
  for (const torch::Tensor& logits : mine) {
    const std::vector<torch::Tensor> every = run.comm.AllGather(logits);
    if (!run.rank0) continue;
    for (size_t r = 1; r < every.size(); ++r) run.vs_ranks.Add(every[0], every[r]);
  }
  return true;
}

// 4b. One training step on the first prompt of 2 or more tokens: the sharded model's loss and
// every gradient, and the control's.
void TrainOneStep(TpRun& run) {
  GateContext& ctx = run.ctx;
  for (const auto& p : ctx.reference->prompts) {
    if (p.input_ids.size(0) >= 2) {
      run.train_prompt = &p;
      break;
    }
  }
  if (run.control) {
    for (const auto& item : run.control->named_parameters(/*recurse=*/true)) {
      run.control_params.emplace(item.key(), item.value());
    }
  }
  if (run.train_prompt == nullptr) return;
  run.model->train();
  run.model->zero_grad();
  torch::Tensor loss = NextTokenLoss(*run.model, run.train_prompt->input_ids, ctx.device);
  loss.backward();
  run.loss_n = loss.item<double>();
  run.model->eval();
  if (!run.control) return;
  run.control->train();
  run.control->zero_grad();
  torch::Tensor l1 = NextTokenLoss(*run.control, run.train_prompt->input_ids, ctx.device);
  l1.backward();
  run.loss_1 = l1.item<double>();
  run.control->eval();
  if (ctx.dtype == torch::kBFloat16) MeasureBf16Floor(run);
}

// 4c. Every parameter and gradient gathered in full (through the plan, or from the adapter's
// DTensors), then each gradient against the control's on rank 0.
bool CompareGradients(TpRun& run, GateOutcome& out) {
  torch::NoGradGuard no_grad;
  run.worst_grad_bar = run.thr.grad_rel_below;
  std::vector<std::pair<std::string, torch::Tensor>> full_grads;  // rank 0, gathered
  if (run.plan) {
    for (const auto& g : run.groups) {
      const std::string& name = g.names[0];
      const ShardRule* rule = run.plan->Find(name);  // the sharded load proved every parameter has one
      const torch::Tensor param = g.tensor.detach();
      Result<torch::Tensor> full = run.plan->Unshard(*rule, run.comm.AllGather(param));
      if (!full.ok()) {
        run.grad_problems.push_back(name + ": " + full.status().message());
        continue;
      }
      if (run.rank0) run.gathered.push_back({g.names, *full});
      if (run.train_prompt == nullptr) continue;
      const torch::Tensor grad = g.tensor.grad().defined() ? g.tensor.grad() : torch::zeros_like(param);
      const std::vector<torch::Tensor> shards = run.comm.AllGather(grad);
      if (rule->style == ShardStyle::kReplicated) {
        // Every rank computes a replicated parameter's gradient in full: the copies must agree.
        RankSpread(shards, run.replicated_rank_diff, run.replicated_rank_rel);
      }
      if (!run.rank0) continue;
      Result<torch::Tensor> full_grad = run.plan->Unshard(*rule, shards);
      if (!full_grad.ok()) {
        run.grad_problems.push_back(name + ": " + full_grad.status().message());
        continue;
      }
      full_grads.emplace_back(name, *full_grad);
    }
  } else {
    // Sharded by the adapter: full parameters and gradients come from its DTensors (every
    // rank gathers, in the same order). Each rank's full gradient must then agree with every
    // other rank's: a replicated parameter's gradient is computed in full on each rank.
    Result<NamedTensors> params = run.model->FullTensors(/*gradients=*/false);
    Result<NamedTensors> grads = run.train_prompt != nullptr
                                     ? run.model->FullTensors(/*gradients=*/true)
                                     : Result<NamedTensors>(NamedTensors{});
    const std::string gather_problem =
        !params.ok() ? params.status().message() : !grads.ok() ? grads.status().message() : "";
    if (const std::string all = RankProblems(run.comm, gather_problem); !all.empty()) {
      out.Fail(FailureClass::kNativeRuntime, "gathering the DTensors: " + all);
      return false;
    }
    if (run.rank0) {
      for (auto& [name, t] : *params) run.gathered.push_back({{name}, t});
    }
    for (auto& [name, g] : *grads) {
      RankSpread(run.comm.AllGather(g), run.replicated_rank_diff, run.replicated_rank_rel);
      if (run.rank0) full_grads.emplace_back(name, g);
    }
  }
  for (const auto& [name, full_grad] : full_grads) {
    auto c = run.control_params.find(name);
    if (c == run.control_params.end() || !c->second.grad().defined()) {
      run.grad_problems.push_back(name + ": no TP=1 gradient");
      continue;
    }
    const torch::Tensor g1 = c->second.grad().to(torch::kDouble);
    const torch::Tensor gn = full_grad.to(torch::kDouble);
    if (g1.sizes() != gn.sizes()) {
      run.grad_problems.push_back(name + ": gathered gradient " + internal::ShapeString(gn.sizes()) +
                                  " vs TP=1 " + internal::ShapeString(g1.sizes()));
      continue;
    }
    const double scale = g1.abs().max().item<double>();
    const double diff = (gn - g1).abs().max().item<double>();
    const double rel = scale > 0 ? diff / scale
                                 : (diff > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    auto floor = run.bf16_floor.find(name);
    const double bar = std::max(run.thr.grad_rel_below,
                                floor == run.bf16_floor.end() ? 0.0 : kFloorMargin * floor->second);
    run.max_grad_rel = std::max(run.max_grad_rel, rel);
    if (run.worst_grad.empty() || rel / bar > run.worst_grad_rel / run.worst_grad_bar) {
      run.worst_grad_rel = rel;
      run.worst_grad_bar = bar;
      run.worst_grad = name;
    }
  }
  return true;
}

GateOutcome TensorParallelParity(GateContext& ctx, int64_t tp_size, GateOutcome out) {
  TpRun run{.ctx = ctx,
            .comm = *ctx.comm,
            .tp_size = tp_size,
            .rank0 = ctx.rank == 0,
            .thr = TpThresholdsFor(ctx.spec.precision)};
  if (!AgreeOnPlan(run, out) || !BuildShards(run, out) || !CompareLogits(run, out)) return out;
  TrainOneStep(run);
  if (!CompareGradients(run, out)) return out;
  if (!run.rank0) {
    out.Text("comparison", "made on rank 0 (the TP=1 control lives there)");
    if (!run.grad_problems.empty()) {
      return out.Fail(FailureClass::kNativeRuntime, "gathering shards: " + JoinFew(run.grad_problems));
    }
    return out;
  }
  if (!CompareSaves(run, out)) return out;
  RecordFigures(run, out);
  Verdict(run, out);
  return out;
}

}  // namespace gatehouse::worker::parallel
