// The parallel gate: tensor-parallel parity against the TP=1 control (gates.h ParallelGate;
// docs/gate-facts.md "Tensor parallelism").
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <unordered_map>

#include "common/sha256.h"
#include "gatehouse/worker/bars.h"
#include "gatehouse/worker/gates.h"
#include "gatehouse/worker/safetensors_torch.h"
#include "gatehouse/worker/distributed.h"
#include "common/artifacts.h"
#include "figure_pair.h"
#include "gates_internal.h"

namespace gatehouse::worker {

using internal::JoinFew;
using internal::Num;
using internal::NumVs;
using internal::Positions;

namespace {

/// Bars on TP=N against TP=1, its control (not against upstream: docs/bars.md covers those).
/// Logits: fp32 at the torchtitan conversion bar (KL < 1e-6), bf16 KL < 1e-3 and top-1 >= 99 %
/// of the decided tokens. Gradients: max |g_N - g_1| over a tensor divided by max
/// |g_1| of that tensor. Summation order differs under TP (partial sums all-reduced), so fp32
/// agrees to ~1e-6 relative, bf16 to its 8-bit mantissa. In bf16 a tensor's bar is widened to
/// kFloorMargin times its own rounding spread, measured in the same run (the TP=1 control's
/// bf16 gradient against an fp32 one, GradFloor): on a tiny Qwen3-MoE with a sliding window,
/// bf16 alone moves the router's gradient by 5-7 % of its max, so a fixed 5 % bar failed TP=2
/// on rounding.
struct TpThresholds {
  double kl_mean_below;   // nats per token
  double top1_at_least;   // percent
  double loss_rel_below;  // |loss_N - loss_1| / |loss_1|
  double grad_rel_below;  // per tensor, see above
};

TpThresholds TpThresholdsFor(std::string_view precision) {
  if (precision == "bf16") return {1e-3, 99.0, 1e-2, 5e-2};
  return {1e-6, 100.0, 1e-5, 1e-4};
}

/// Every rank's `problem` ("" when none) gathered, the same on every rank: "" when no rank has
/// one, else "rank r: <problem>; ..." in rank order. Each is cut to 600 bytes (an adapter's
/// traceback can be long). A collective: every rank calls it, so a rank's failure is never
/// left for the others to wait on, and rank 0's verdict names every rank's cause.
std::string RankProblems(TpCommunicator& comm, const std::string& problem) {
  constexpr int64_t kBytes = 600;
  torch::Tensor mine = torch::zeros({kBytes}, torch::kUInt8);
  const int64_t n = std::min<int64_t>(kBytes, static_cast<int64_t>(problem.size()));
  std::memcpy(mine.data_ptr(), problem.data(), static_cast<size_t>(n));
  const std::vector<torch::Tensor> every = comm.AllGather(mine);
  std::string out;
  for (size_t r = 0; r < every.size(); ++r) {
    const torch::Tensor c = every[r].contiguous();
    const char* bytes = static_cast<const char*>(c.data_ptr());
    const std::string reason(bytes, strnlen(bytes, kBytes));
    if (!reason.empty()) out += (out.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + reason);
  }
  return out;
}

/// Folds into (max_diff, max_rel) how far each rank's copy in `copies` (one per rank, same
/// shape) is from rank 0's: max abs difference, and that relative to rank 0's max abs.
void RankSpread(const std::vector<torch::Tensor>& copies, double& max_diff, double& max_rel) {
  const torch::Tensor first = copies[0].to(torch::kDouble);
  const double scale = first.abs().max().item<double>();
  for (const auto& s : copies) {
    const double d = (s.to(torch::kDouble) - first).abs().max().item<double>();
    max_diff = std::max(max_diff, d);
    max_rel = std::max(max_rel, scale > 0 ? d / scale : d);
  }
}

std::string LoadProblems(const LoadReport& rep) {
  std::vector<std::string> all;
  for (const auto* l : {&rep.missing, &rep.unexpected, &rep.unknown_params, &rep.shape_mismatches,
                        &rep.nonfinite, &rep.loaded_twice}) {
    all.insert(all.end(), l->begin(), l->end());
  }
  return JoinFew(all);
}

/// Writes `tensors` to `dir`/model.safetensors; the artifact path is relative to the attempt.
Result<Artifact> WriteCheckpoint(const std::filesystem::path& attempt_dir,
                                 const std::string& rel_dir,
                                 const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                 const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(attempt_dir / rel_dir, ec);
  if (ec) return Status::Internal("cannot create " + (attempt_dir / rel_dir).string() + ": " + ec.message());
  const std::string rel = rel_dir + "/model.safetensors";
  const fs::path file = attempt_dir / rel;
  GH_RETURN_IF_ERROR(safetensors::WriteTensors(file, tensors, {{"format", "pt"}}));
  return internal::ArtifactOf(attempt_dir, rel, name);
}

/// Cross entropy of next-token prediction on `ids` [T] (T >= 2), in fp32.
torch::Tensor NextTokenLoss(CausalLM& model, const torch::Tensor& ids, torch::Device device) {
  const int64_t t = ids.size(0);
  const torch::Tensor d = ids.to(device);
  const torch::Tensor logits =
      model.Forward(d.slice(0, 0, t - 1).unsqueeze(0), Positions(0, t - 1, device), nullptr)
          .to(torch::kFloat);
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}),
                                              d.slice(0, 1, t));
}

}  // namespace

GateOutcome ParallelGate(GateContext& ctx) {
  GateOutcome out;
  const auto& topo = ctx.spec.topology;
  out.Count("world_size", topo.world_size());
  out.Count("tp", topo.tp);
  const std::string topo_text = "topology tp=" + std::to_string(topo.tp) + " dp=" +
                                std::to_string(topo.dp) + " pp=" + std::to_string(topo.pp) +
                                " ep=" + std::to_string(topo.ep);
  if (topo.world_size() == 1) {
    return out.Skipped(topo_text + ": world size 1, nothing to compare against TP=1");
  }
  if (topo.dp != 1 || topo.pp != 1 || topo.ep != 1) {
    return out.Blocked(topo_text +
                       ": only tensor parallelism is implemented; data, pipeline and expert "
                       "parallelism are not");
  }
  if (ctx.world_size != topo.world_size()) {
    return out.Blocked(topo_text + " needs " + std::to_string(topo.world_size()) +
                       " worker ranks, but this worker runs as rank " + std::to_string(ctx.rank) +
                       " of " + std::to_string(ctx.world_size) +
                       " (WORLD_SIZE; the agent starts one worker per rank)");
  }
  if (!ctx.comm) {
    return out.Blocked("rank " + std::to_string(ctx.rank) + " of " +
                       std::to_string(ctx.world_size) + " has no process group (joining it failed)");
  }
  // The backend follows the device (worker_main): gloo for CPU tensors, NCCL for CUDA ones.
  const std::string want_backend = ctx.device.is_cuda() ? "nccl" : "gloo";
  if (ctx.comm_backend != want_backend) {
    return out.Blocked("device " + ctx.device.str() + " needs a " + want_backend +
                       " group but this rank joined " +
                       (ctx.comm_backend.empty() ? std::string("none") : ctx.comm_backend) +
                       (ctx.device.is_cuda() && !NcclGroupsAvailable()
                            ? " (this worker was built without c10d's NCCL backend)"
                            : ""));
  }
  out.Text("process_group", ctx.comm_backend);
  TpCommunicator& comm = *ctx.comm;
  const bool rank0 = ctx.rank == 0;
  const int64_t tp_size = topo.tp;

  // 1. Each rank checks what it needs, then all agree before any other collective. A family
  // shards either through a plan the gates load shards by (Parallelize, ConstructParallel) or,
  // mapping weights by code (the Python lane), by its own code on a model loaded in full
  // (ShardLoaded: the adapter's parallelize over torch.distributed).
  std::string not_ready;
  GateOutcome scratch;
  const bool by_code = ctx.family != nullptr && ctx.family->MapsWeightsByCode();
  const bool sharded_by_code = ctx.family != nullptr && ctx.family->ShardsLoadedModel();
  if (!ctx.family || !ctx.args) {
    not_ready = "no model args: phase config did not pass";
  } else if (!ctx.checkpoint || (!by_code && !ctx.adapter)) {
    not_ready = "no checkpoint or name table: phase load did not pass";
  } else if (!internal::RequireReference(ctx, scratch)) {
    not_ready = scratch.reason;
  }
  std::optional<TpPlan> plan;
  Status plan_status = Status::Ok();
  if (not_ready.empty() && !sharded_by_code) {
    if (by_code) {
      plan_status = Status::FailedPrecondition(
          "the adapter's ModelSpec gives no parallelize (docs/protocols.md, the Python adapter "
          "contract)");
    } else if (Result<TpPlan> p = ctx.family->Parallelize(*ctx.args, tp_size); p.ok()) {
      plan = std::move(p).value();
    } else {
      plan_status = p.status();
    }
  }
  const std::string plan_problem =
      plan_status.ok() ? "" : "tensor-parallel plan (" + std::string(by_code ? "parallelize" : "Parallelize") +
                                  ", tp=" + std::to_string(tp_size) + "): " + plan_status.message();
  const std::string every_rank = RankProblems(comm, not_ready.empty() ? plan_problem : not_ready);
  if (!not_ready.empty()) {
    return scratch.status == GateStatus::kBlocked ? out.Blocked(not_ready) : out.Unknown(not_ready);
  }
  if (!plan_problem.empty()) return out.Fail(FailureClass::kAdapterContract, plan_problem);
  if (!every_rank.empty()) return out.Unknown("not ready for the parallel gate: " + every_rank);
  if (plan) {
    int64_t n_sharded = 0, n_replicated = 0;
    for (const ShardRule& r : plan->rules()) (r.style == ShardStyle::kReplicated ? n_replicated : n_sharded)++;
    out.Count("plan_rules_sharded", n_sharded);
    out.Count("plan_rules_replicated", n_replicated);
  } else {
    out.Text("sharded_by", "the adapter's parallelize (torch.distributed DTensor)");
  }

  // 2. This rank's shard, loaded through the plan or sharded by the adapter after a full load;
  // the TP=1 control on rank 0.
  const TensorParallel tp{ctx.rank, tp_size, ctx.comm};
  std::string problem;
  FailureClass problem_class = FailureClass::kAdapterContract;
  std::shared_ptr<CausalLM> model, control;
  const auto load_full = [&](CausalLM& m) {
    return by_code ? LoadStateDictByCode(*ctx.checkpoint, *ctx.family, *ctx.args, m)
                   : LoadStateDict(*ctx.checkpoint, *ctx.adapter, m);
  };
  // Exceptions (e.g. out of memory) become this rank's problem, so the agreement below still
  // runs on every rank and no rank is left waiting in a collective.
  try {
    Result<std::shared_ptr<CausalLM>> built = [&] {
      const SkipWeightInit loaded_next;  // the load below overwrites every parameter
      return plan ? ctx.family->ConstructParallel(*ctx.args, ctx.dtype, ctx.device, tp)
                  : ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
    }();
    const char* construct_name = plan ? "ConstructParallel" : "Construct";
    if (!built.ok() || !*built) {
      problem = std::string(construct_name) + ": " +
                (built.ok() ? std::string("returned no model") : built.status().ToString());
    } else {
      model = *built;
      const ShardedLoad shard{plan ? &*plan : nullptr, ctx.rank};
      Result<LoadReport> loaded = plan ? LoadStateDict(*ctx.checkpoint, *ctx.adapter, *model, &shard)
                                       : load_full(*model);
      const char* what = plan ? "sharded load" : "full load before parallelize";
      if (!loaded.ok()) {
        problem = std::string(what) + ": " + loaded.status().ToString();
        problem_class = FailureClass::kUnknown;
      } else if (!loaded->ok()) {
        problem = std::string(what) + " on rank " + std::to_string(ctx.rank) + ": " + LoadProblems(*loaded);
      } else {
        out.Count("keys_loaded_rank" + std::to_string(ctx.rank), loaded->keys_used);
      }
    }
    if (problem.empty() && rank0) {
      Result<std::shared_ptr<CausalLM>> c = [&] {
        const SkipWeightInit loaded_next;  // the load below overwrites every parameter
        return ctx.family->Construct(*ctx.args, ctx.dtype, ctx.device);
      }();
      Result<LoadReport> loaded = c.ok() && *c ? load_full(**c)
                                               : Result<LoadReport>(c.ok() ? Status::Internal("no model") : c.status());
      if (!loaded.ok() || !loaded->ok()) {
        problem = "TP=1 control: " + (loaded.ok() ? LoadProblems(*loaded) : loaded.status().ToString());
      } else {
        control = *c;
      }
    }
  } catch (const c10::Error& e) {
    problem = std::string("building or loading the shard: LibTorch error: ") + e.what_without_backtrace();
    problem_class = FailureClass::kNativeRuntime;
  } catch (const std::exception& e) {
    problem = std::string("building or loading the shard: ") + e.what();
    problem_class = FailureClass::kUnknown;
  }
  if (const std::string all = RankProblems(comm, problem); !all.empty()) {
    return out.Fail(problem.empty() ? FailureClass::kAdapterContract : problem_class, all);
  }
  if (!plan) {
    // Every rank holds the loaded full model: the adapter shards it (a collective).
    Result<std::shared_ptr<CausalLM>> sharded = Status::Internal("not run");
    try {
      sharded = ctx.family->ShardLoaded(model, tp);
    } catch (const std::exception& e) {
      sharded = Status::Internal(e.what());
    }
    if (!sharded.ok() || !*sharded) {
      problem = sharded.ok() ? std::string("returned no model") : sharded.status().message();
      problem_class = !sharded.ok() && sharded.status().code() == StatusCode::kInvalidArgument
                          ? FailureClass::kAdapterContract
                          : FailureClass::kNativeRuntime;
    } else {
      model = *sharded;
    }
    // A rank whose parallelize raised closed its torch.distributed group (lane.py), so the
    // others' collectives failed too; every rank reports every rank's reason, the cause
    // among them.
    if (const std::string all = RankProblems(comm, problem); !all.empty()) {
      return out.Fail(problem.empty() ? FailureClass::kAdapterContract : problem_class,
                      "parallelize (tp=" + std::to_string(tp_size) + ") failed: " + all);
    }
  }

  // What each rank holds (every shard's shape was checked against the plan by the sharded
  // load; a model sharded by code registers its local shards), gathered.
  const std::vector<ParamGroup> groups = UniqueParameters(*model);
  int64_t elements = 0;
  for (const auto& g : groups) elements += g.tensor.numel();
  const auto counts = comm.AllGather(torch::tensor({elements}));
  for (size_t r = 0; r < counts.size(); ++r) {
    out.Count("param_elements_rank" + std::to_string(r), counts[r].item<int64_t>());
  }
  out.Count("param_tensors_per_rank", static_cast<int64_t>(groups.size()));

  // 3. Logits on the reference prompts.
  const TpThresholds thr = TpThresholdsFor(ctx.spec.precision);
  const ReferenceBundle& ref = *ctx.reference;
  // vs_ranks: every rank's logits against rank 0's (each rank must get the full logits).
  LogitComparison vs_tp1, vs_upstream, vs_ranks;
  nlohmann::json kl_vs_tp1 = nlohmann::json::array();  // per prompt, along the position
  // In bf16 a token whose upstream fp32 top-1 margin is within twice upstream's own bf16
  // rounding of that token's logits (reference logits_bf16 vs logits) has no decided argmax:
  // any reduction order may flip it. Top-1 is judged on the decided tokens.
  const bool judge_decided = ctx.spec.precision == "bf16";
  int64_t decided = 0, decided_equal = 0;
  {
    torch::NoGradGuard no_grad;
    model->eval();
    if (control) control->eval();
    const int64_t vocab = ctx.args->vocab_size();
    std::string shape_problem;
    std::vector<torch::Tensor> mine;  // this rank's logits per prompt, [T, V] float CPU
    for (const ReferencePrompt& p : ref.prompts) {
      const int64_t t = p.input_ids.size(0);
      const torch::Tensor tokens = p.input_ids.unsqueeze(0).to(ctx.device);
      // Every rank runs every forward (they are collectives), whatever its shapes.
      const torch::Tensor ours = model->Forward(tokens, Positions(0, t, ctx.device), nullptr);
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
      if (!rank0) continue;
      const torch::Tensor base = control->Forward(tokens, Positions(0, t, ctx.device), nullptr);
      const torch::Tensor base_cpu = base[0].to(torch::kFloat).cpu();
      const torch::Tensor ours_cpu = ours[0].to(torch::kFloat).cpu();
      const torch::Tensor kl = vs_tp1.Add(base_cpu, ours_cpu);
      kl_vs_tp1.push_back({{"prompt", kl_vs_tp1.size()}, {"kl", internal::DoublesOf(kl)}});
      vs_upstream.Add(p.fp32.logits, ours_cpu);
      torch::Tensor is_decided = torch::ones({t}, torch::kBool);
      if (judge_decided) {
        const torch::Tensor top2 = std::get<0>(p.fp32.logits.topk(2, -1));
        const torch::Tensor margin = top2.select(-1, 0) - top2.select(-1, 1);
        const torch::Tensor noise = (p.bf16.logits - p.fp32.logits).abs().amax(-1);
        is_decided = margin > 2 * noise;
      }
      decided += is_decided.sum().item<int64_t>();
      decided_equal +=
          (is_decided & base_cpu.argmax(-1).eq(ours_cpu.argmax(-1))).sum().item<int64_t>();
    }
    if (const std::string all = RankProblems(comm, shape_problem); !all.empty()) {
      return out.Fail(FailureClass::kAdapterContract, all);
    }
    for (const torch::Tensor& logits : mine) {
      const std::vector<torch::Tensor> every = comm.AllGather(logits);
      if (!rank0) continue;
      for (size_t r = 1; r < every.size(); ++r) vs_ranks.Add(every[0], every[r]);
    }
  }

  // 4. One training step: loss and every gradient, gathered.
  const ReferencePrompt* train_prompt = nullptr;
  for (const auto& p : ref.prompts) {
    if (p.input_ids.size(0) >= 2) {
      train_prompt = &p;
      break;
    }
  }
  double loss_n = std::numeric_limits<double>::quiet_NaN(), loss_1 = loss_n;
  double worst_grad_rel = 0, replicated_rank_diff = 0, replicated_rank_rel = 0;
  // The tensor nearest its bar (worst_grad: its difference and bar), and the largest difference.
  double worst_grad_bar = thr.grad_rel_below, max_grad_rel = 0;
  std::string worst_grad;
  std::vector<std::string> grad_problems;
  std::vector<ParamGroup> gathered;  // full parameters, for the save
  std::unordered_map<std::string, torch::Tensor> control_params;
  if (control) {
    for (const auto& item : control->named_parameters(/*recurse=*/true)) {
      control_params.emplace(item.key(), item.value());
    }
  }
  // bf16: each tensor's gradient spread from rounding alone (rank 0), parameter name -> max
  // |g_bf16 - g_fp32| / max |g_fp32| of the TP=1 control against the same model in fp32.
  std::unordered_map<std::string, double> bf16_floor;
  std::string floor_note;
  if (train_prompt != nullptr) {
    model->train();
    model->zero_grad();
    torch::Tensor loss = NextTokenLoss(*model, train_prompt->input_ids, ctx.device);
    loss.backward();
    loss_n = loss.item<double>();
    model->eval();
    if (control) {
      control->train();
      control->zero_grad();
      torch::Tensor l1 = NextTokenLoss(*control, train_prompt->input_ids, ctx.device);
      l1.backward();
      loss_1 = l1.item<double>();
      control->eval();
      if (ctx.dtype == torch::kBFloat16) {
        // Rank 0 only, between collectives: a failure here keeps the fixed bar and says why,
        // so the other ranks are never left waiting.
        try {
          Result<std::shared_ptr<CausalLM>> f32 = [&] {
            const SkipWeightInit loaded_next;  // load_full overwrites every parameter
            return ctx.family->Construct(*ctx.args, torch::kFloat32, ctx.device);
          }();
          Result<LoadReport> loaded = f32.ok() && *f32 ? load_full(**f32)
                                                       : Result<LoadReport>(f32.ok() ? Status::Internal("no model") : f32.status());
          if (!loaded.ok() || !loaded->ok()) {
            floor_note = "not measured: the fp32 model did not load (" +
                         (loaded.ok() ? LoadProblems(*loaded) : loaded.status().ToString()) + ")";
          } else {
            (*f32)->train();
            NextTokenLoss(**f32, train_prompt->input_ids, ctx.device).backward();
            std::unordered_map<std::string, torch::Tensor> g32;
            for (const auto& item : (*f32)->named_parameters(/*recurse=*/true)) {
              if (item.value().grad().defined()) g32.emplace(item.key(), item.value().grad());
            }
            torch::NoGradGuard no_grad;
            for (const auto& [name, p] : control_params) {
              auto it = g32.find(name);
              if (it == g32.end() || !p.grad().defined()) continue;
              const torch::Tensor ref = it->second.to(torch::kDouble);
              const double scale = ref.abs().max().item<double>();
              const double d = (p.grad().to(torch::kDouble) - ref).abs().max().item<double>();
              bf16_floor[name] = scale > 0 ? d / scale : 0.0;
            }
          }
        } catch (const std::exception& e) {
          floor_note = std::string("not measured: ") + e.what();
        }
      }
    }
  }
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> full_grads;  // rank 0, gathered
  if (plan) {
    for (const auto& g : groups) {
      const std::string& name = g.names[0];
      const ShardRule* rule = plan->Find(name);  // the sharded load proved every parameter has one
      const torch::Tensor param = g.tensor.detach();
      Result<torch::Tensor> full = plan->Unshard(*rule, comm.AllGather(param));
      if (!full.ok()) {
        grad_problems.push_back(name + ": " + full.status().message());
        continue;
      }
      if (rank0) gathered.push_back({g.names, *full});
      if (train_prompt == nullptr) continue;
      const torch::Tensor grad = g.tensor.grad().defined() ? g.tensor.grad() : torch::zeros_like(param);
      const std::vector<torch::Tensor> shards = comm.AllGather(grad);
      if (rule->style == ShardStyle::kReplicated) {
        // Every rank computes a replicated parameter's gradient in full: the copies must agree.
        RankSpread(shards, replicated_rank_diff, replicated_rank_rel);
      }
      if (!rank0) continue;
      Result<torch::Tensor> full_grad = plan->Unshard(*rule, shards);
      if (!full_grad.ok()) {
        grad_problems.push_back(name + ": " + full_grad.status().message());
        continue;
      }
      full_grads.emplace_back(name, *full_grad);
    }
  } else {
    // Sharded by the adapter: full parameters and gradients come from its DTensors (every
    // rank gathers, in the same order). Each rank's full gradient must then agree with every
    // other rank's: a replicated parameter's gradient is computed in full on each rank.
    Result<NamedTensors> params = model->FullTensors(/*gradients=*/false);
    Result<NamedTensors> grads = train_prompt != nullptr ? model->FullTensors(/*gradients=*/true)
                                                         : Result<NamedTensors>(NamedTensors{});
    const std::string gather_problem =
        !params.ok() ? params.status().message() : !grads.ok() ? grads.status().message() : "";
    if (const std::string all = RankProblems(comm, gather_problem); !all.empty()) {
      return out.Fail(FailureClass::kNativeRuntime, "gathering the DTensors: " + all);
    }
    if (rank0) {
      for (auto& [name, t] : *params) gathered.push_back({{name}, t});
    }
    for (auto& [name, g] : *grads) {
      RankSpread(comm.AllGather(g), replicated_rank_diff, replicated_rank_rel);
      if (rank0) full_grads.emplace_back(name, g);
    }
  }
  for (const auto& [name, full_grad] : full_grads) {
    auto c = control_params.find(name);
    if (c == control_params.end() || !c->second.grad().defined()) {
      grad_problems.push_back(name + ": no TP=1 gradient");
      continue;
    }
    const torch::Tensor g1 = c->second.grad().to(torch::kDouble);
    const torch::Tensor gn = full_grad.to(torch::kDouble);
    if (g1.sizes() != gn.sizes()) {
      grad_problems.push_back(name + ": gathered gradient " + internal::ShapeString(gn.sizes()) +
                              " vs TP=1 " + internal::ShapeString(g1.sizes()));
      continue;
    }
    const double scale = g1.abs().max().item<double>();
    const double diff = (gn - g1).abs().max().item<double>();
    const double rel = scale > 0 ? diff / scale : (diff > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    auto floor = bf16_floor.find(name);
    const double bar = std::max(thr.grad_rel_below,
                                floor == bf16_floor.end() ? 0.0 : kFloorMargin * floor->second);
    max_grad_rel = std::max(max_grad_rel, rel);
    if (worst_grad.empty() || rel / bar > worst_grad_rel / worst_grad_bar) {
      worst_grad_rel = rel;
      worst_grad_bar = bar;
      worst_grad = name;
    }
  }
  if (!rank0) {
    out.Text("comparison", "made on rank 0 (the TP=1 control lives there)");
    if (!grad_problems.empty()) {
      return out.Fail(FailureClass::kNativeRuntime, "gathering shards: " + JoinFew(grad_problems));
    }
    return out;
  }

  // 5. Save under TP: gathered parameters under HF names, against the control's save.
  const std::filesystem::path attempt_dir(ctx.spec.attempt.dir);
  const std::string tp_dir = "parallel/tp" + std::to_string(tp_size);
  const std::vector<ParamGroup> control_groups = UniqueParameters(*control);
  HfTensors hf_n = internal::HfNamesOf(ctx, gathered);
  HfTensors hf_1 = internal::HfNamesOf(ctx, control_groups);
  std::vector<std::string> save_problems;
  int64_t save_equal = 0;
  std::optional<Artifact> art_n, art_1;
  if (!hf_n.ok() || !hf_1.ok()) {
    save_problems.push_back(hf_n.ok() ? hf_1.Problems() : hf_n.Problems());
  } else {
    std::map<std::string, torch::Tensor> by_name(hf_1.tensors.begin(), hf_1.tensors.end());
    for (const auto& [hf, tensor] : hf_n.tensors) {
      auto it = by_name.find(hf);
      if (it == by_name.end()) {
        save_problems.push_back(hf + " (not in the TP=1 save)");
      } else if (tensor.scalar_type() != it->second.scalar_type() ||
                 tensor.sizes() != it->second.sizes() || !torch::equal(tensor, it->second)) {
        save_problems.push_back(hf + " (differs)");
      } else {
        ++save_equal;
      }
    }
    if (hf_n.tensors.size() != hf_1.tensors.size()) {
      save_problems.push_back(std::to_string(hf_n.tensors.size()) + " tensors vs " +
                              std::to_string(hf_1.tensors.size()) + " at TP=1");
    }
    Result<Artifact> a = WriteCheckpoint(attempt_dir, tp_dir, hf_n.tensors, "tp_saved_checkpoint");
    Result<Artifact> b = WriteCheckpoint(attempt_dir, "parallel/tp1", hf_1.tensors, "tp1_saved_checkpoint");
    if (!a.ok() || !b.ok()) {
      return out.Fail(FailureClass::kResource,
                      "writing the TP saves: " + (a.ok() ? b.status() : a.status()).ToString());
    }
    art_n = *a;
    art_1 = *b;
    out.artifacts.push_back(*a);
    out.artifacts.push_back(*b);
    // Plot data (TP=N against the TP=1 control along the position), never the verdict.
    Result<Artifact> kl = internal::WriteJsonArtifact(
        attempt_dir, std::string(kParallelKlArtifact), "kl_by_position_vs_tp1",
        {{"unit", "nats"}, {"reference", "tp1"}, {"prompts", kl_vs_tp1}});
    if (kl.ok()) out.artifacts.push_back(*kl);
    else out.Text("kl_by_position", "not written: " + kl.status().ToString());
    if (a->sha256 != b->sha256) save_problems.push_back("model.safetensors SHA-256 differs from TP=1's");
  }

  // 6. Figures and verdict.
  out.Real("kl_mean_vs_tp1", vs_tp1.kl_mean(), "nats");
  out.Real("kl_max_vs_tp1", vs_tp1.kl_max(), "nats");
  out.Real("top1_agreement_vs_tp1", vs_tp1.top1_agreement_percent(), "percent");
  out.Real("max_abs_diff_vs_tp1", vs_tp1.max_abs_diff(), "logits");
  out.Real("kl_mean_vs_upstream", vs_upstream.kl_mean(), "nats");
  out.Real("top1_agreement_vs_upstream", vs_upstream.top1_agreement_percent(), "percent");
  out.Count("tokens_compared", vs_tp1.tokens());
  out.Real("kl_max_across_ranks", vs_ranks.kl_max(), "nats");
  out.Real("max_abs_diff_across_ranks", vs_ranks.max_abs_diff(), "logits");
  const double decided_top1 = decided ? 100.0 * double(decided_equal) / double(decided) : 0.0;
  if (judge_decided) {
    out.Count("tokens_decided", decided);
    out.Real("top1_agreement_decided_vs_tp1", decided_top1, "percent");
  }
  if (train_prompt != nullptr) {
    out.Real("loss_tp", loss_n, "nats");
    out.Real("loss_tp1", loss_1, "nats");
    out.Real("loss_rel_diff", std::abs(loss_n - loss_1) / std::max(std::abs(loss_1), 1e-30), "ratio");
    out.Real("grad_max_rel_diff", max_grad_rel, "ratio");
    if (!worst_grad.empty()) {
      // The tensor nearest its own bar (in fp32 every bar is the same, so it is the one with the
      // largest difference; in bf16 each tensor's bar is its own rounding floor, and the largest
      // difference, grad_max_rel_diff, may be another tensor's, well inside its bar).
      out.Text("grad_nearest_bar_tensor", worst_grad);
      out.Real("grad_nearest_bar_rel_diff", worst_grad_rel, "ratio");
      out.Real("grad_nearest_bar", worst_grad_bar, "ratio");
    }
    if (ctx.dtype == torch::kBFloat16) {
      double widest = 0;
      for (const auto& [name, f] : bf16_floor) widest = std::max(widest, f);
      if (floor_note.empty()) out.Real("grad_bf16_floor_max_rel", widest, "ratio");
      else out.Text("grad_bf16_floor", floor_note);
    }
    out.Real("replicated_grad_max_rank_diff", replicated_rank_diff, "gradient");
  }
  out.Count("save_tensors_equal", save_equal);
  if (art_n) out.Text("save_sha256_tp", art_n->sha256);
  if (art_1) out.Text("save_sha256_tp1", art_1->sha256);
  out.Text("thresholds", ctx.spec.precision + ": kl_mean < " + Num(thr.kl_mean_below) +
                             " nats, top1 >= " + Num(thr.top1_at_least) +
                             (judge_decided ? "% of decided tokens" : "%") + ", loss rel < " +
                             Num(thr.loss_rel_below) + ", grad rel < " + Num(thr.grad_rel_below) +
                             (ctx.dtype == torch::kBFloat16
                                  ? " or " + Num(kFloorMargin) +
                                        "x the tensor's bf16-vs-fp32 spread at TP=1, if wider"
                                  : "") +
                             ", save bit-equal");

  std::vector<std::string> failed;
  if (!(vs_tp1.kl_mean() < thr.kl_mean_below)) {
    failed.push_back("kl_mean_vs_tp1 " + Num(vs_tp1.kl_mean()) + " nats is not below " + Num(thr.kl_mean_below));
  }
  if (!(vs_ranks.kl_mean() < thr.kl_mean_below) ||
      !(vs_ranks.top1_agreement_percent() >= thr.top1_at_least)) {
    failed.push_back("ranks disagree on the logits: kl_mean " + Num(vs_ranks.kl_mean()) +
                     " nats, top1 " + Num(vs_ranks.top1_agreement_percent()) +
                     "% against rank 0's (every rank must get the same full logits)");
  }
  if (!(decided_top1 >= thr.top1_at_least)) {
    failed.push_back(std::string(judge_decided ? "top1_agreement_decided_vs_tp1 " : "top1_agreement_vs_tp1 ") +
                     Num(decided_top1) + "% is below " + Num(thr.top1_at_least) + "%");
  }
  if (train_prompt == nullptr) {
    failed.push_back("no reference prompt has 2 or more tokens for the training step");
  } else {
    const double loss_rel = std::abs(loss_n - loss_1) / std::max(std::abs(loss_1), 1e-30);
    if (!(loss_rel < thr.loss_rel_below)) {
      failed.push_back("loss " + NumVs(loss_n, loss_1, " vs TP=1 ") + " (relative " + Num(loss_rel) + ")");
    }
    if (!(replicated_rank_rel < thr.grad_rel_below)) {
      failed.push_back("a replicated parameter's gradient differs between ranks by " +
                       Num(replicated_rank_rel) + " of its max");
    }
    if (!(worst_grad_rel < worst_grad_bar)) {
      failed.push_back("gradient of " + worst_grad + " differs from TP=1 by " + Num(worst_grad_rel) +
                       " of its max (bar " + Num(worst_grad_bar) + ")");
    }
  }
  if (!plan) {
    // A parallelize that shards nothing leaves every rank holding the whole model: the TP
    // comparisons would pass without testing any tensor parallelism.
    int64_t control_elements = 0;
    for (const auto& g : control_groups) control_elements += g.tensor.numel();
    out.Count("param_elements_tp1", control_elements);
    bool any_sharded = false;
    for (const auto& c : counts) any_sharded |= c.item<int64_t>() < control_elements;
    if (!any_sharded) {
      failed.push_back("parallelize sharded no parameter: every rank holds all " +
                       std::to_string(control_elements) + " elements of the TP=1 model");
    }
  }
  if (!grad_problems.empty()) failed.push_back("gradients: " + JoinFew(grad_problems));
  if (!save_problems.empty()) failed.push_back("save under TP: " + JoinFew(save_problems));
  if (!failed.empty()) {
    std::string reason = "TP=" + std::to_string(tp_size) + " vs TP=1: ";
    for (size_t i = 0; i < failed.size(); ++i) reason += (i ? "; " : "") + failed[i];
    return out.Fail(FailureClass::kAdapterContract, reason);
  }
  return out;
}

}  // namespace gatehouse::worker
