// What the parallel gate's checks share (parallel_internal.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <map>

#include "../gates_internal.h"
#include "gatehouse/worker/safetensors_torch.h"
#include "parallel_internal.h"

namespace gatehouse::worker::parallel {

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

void RankSpread(const std::vector<torch::Tensor>& copies, double& max_diff, double& max_rel) {
  const torch::Tensor first = copies[0].to(torch::kDouble);
  const double scale = first.abs().max().item<double>();
  for (const auto& s : copies) {
    const double d = (s.to(torch::kDouble) - first).abs().max().item<double>();
    max_diff = std::max(max_diff, d);
    max_rel = std::max(max_rel, scale > 0 ? d / scale : d);
  }
}

int64_t CompareHfSaves(const HfTensors& ours, const HfTensors& control,
                       const std::string& control_label, std::vector<std::string>& problems) {
  std::map<std::string, torch::Tensor> by_name(control.tensors.begin(), control.tensors.end());
  int64_t equal = 0;
  for (const auto& [hf, tensor] : ours.tensors) {
    auto it = by_name.find(hf);
    if (it == by_name.end()) {
      problems.push_back(hf + " (not in the " + control_label + " save)");
      continue;
    }
    if (tensor.scalar_type() != it->second.scalar_type() || tensor.sizes() != it->second.sizes() ||
        !torch::equal(tensor, it->second)) {
      problems.push_back(hf + " (differs)");
    } else {
      ++equal;
    }
    by_name.erase(it);
  }
  for (const auto& [hf, tensor] : by_name) problems.push_back(hf + " (missing from the gathered save)");
  return equal;
}

std::string LoadProblems(const LoadReport& rep) {
  std::vector<std::string> all;
  for (const auto* l : {&rep.missing, &rep.unexpected, &rep.unknown_params, &rep.shape_mismatches,
                        &rep.nonfinite, &rep.loaded_twice}) {
    all.insert(all.end(), l->begin(), l->end());
  }
  return internal::JoinFew(all);
}

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

Result<LoadReport> LoadFull(const GateContext& ctx, CausalLM& model) {
  return ctx.family->MapsWeightsByCode()
             ? LoadStateDictByCode(*ctx.checkpoint, *ctx.family, *ctx.args, model)
             : LoadStateDict(*ctx.checkpoint, *ctx.adapter, model);
}

std::string NotReady(GateContext& ctx, bool& blocked) {
  blocked = false;
  if (!ctx.family || !ctx.args) return "no model args: phase config did not pass";
  if (!ctx.checkpoint || (!ctx.family->MapsWeightsByCode() && !ctx.adapter)) {
    return "no checkpoint or name table: phase load did not pass";
  }
  GateOutcome scratch;
  if (!internal::RequireReference(ctx, scratch)) {
    blocked = scratch.status == GateStatus::kBlocked;
    return scratch.reason;
  }
  return "";
}

torch::Tensor NextTokenLoss(CausalLM& model, const torch::Tensor& ids, torch::Device device) {
  const int64_t t = ids.size(0);
  const torch::Tensor d = ids.to(device);
  const torch::Tensor logits =
      model.Forward(d.slice(0, 0, t - 1).unsqueeze(0), internal::Positions(0, t - 1, device), nullptr)
          .to(torch::kFloat);
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}),
                                              d.slice(0, 1, t));
}

Result<std::shared_ptr<CausalLM>> TrainableModel(
    const GateContext& ctx, const std::string& what,
    const std::function<Result<std::shared_ptr<CausalLM>>()>& construct,
    const std::function<Result<LoadReport>(CausalLM&)>& load) {
  const std::string where = what + " on rank " + std::to_string(ctx.rank) + ": ";
  try {
    Result<std::shared_ptr<CausalLM>> built = [&] {
      const SkipWeightInit loaded_next;
      return construct();
    }();
    if (!built.ok() || !*built) {
      return Status::Internal(where + "construct: " +
                              (built.ok() ? std::string("returned no model") : built.status().ToString()));
    }
    Result<LoadReport> loaded = load(**built);
    if (!loaded.ok() || !loaded->ok()) {
      return Status::Internal(where + (loaded.ok() ? LoadProblems(*loaded) : loaded.status().ToString()));
    }
    torch::NoGradGuard no_grad;
    for (const ParamGroup& g : UniqueParameters(**built)) g.tensor.set_data(g.tensor.detach().clone());
    return *built;
  } catch (const std::exception& e) {
    return Status::Internal(where + e.what());
  }
}

torch::Tensor TokenLossSum(CausalLM& model, const torch::Tensor& ids, torch::Device device) {
  const int64_t t = ids.size(0);
  const torch::Tensor d = ids.to(device);
  const torch::Tensor logits =
      model.Forward(d.slice(0, 0, t - 1).unsqueeze(0), internal::Positions(0, t - 1, device), nullptr)
          .to(torch::kFloat);
  return torch::nn::functional::cross_entropy(
      logits.view({-1, logits.size(-1)}), d.slice(0, 1, t),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

double Backward(CausalLM& model, const std::vector<torch::Tensor>& sequences, double normalizer,
                torch::Device device) {
  double total = 0;
  for (const torch::Tensor& ids : sequences) {
    const torch::Tensor loss = TokenLossSum(model, ids, device) / normalizer;
    loss.backward();
    total += loss.item<double>();
  }
  return total;
}

std::vector<torch::Tensor> GradsOf(const std::vector<ParamGroup>& groups) {
  std::vector<torch::Tensor> out;
  out.reserve(groups.size());
  for (const ParamGroup& g : groups) {
    out.push_back(g.tensor.grad().defined() ? g.tensor.grad().detach().clone()
                                            : torch::zeros_like(g.tensor));
  }
  return out;
}

double GlobalNorm(const std::vector<torch::Tensor>& grads) {
  double sq = 0;
  for (const torch::Tensor& g : grads) sq += g.to(torch::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sq);
}

std::pair<double, bool> RelDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor da = a.to(torch::kDouble), db = b.to(torch::kDouble);
  const double scale = db.abs().max().item<double>();
  const double diff = (da - db).abs().max().item<double>();
  const double rel = scale > 0 ? diff / scale : (diff > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  return {rel, torch::equal(a, b)};
}

void StepTrace::AddGradient(const std::string& name, int step, const torch::Tensor& ours,
                            const torch::Tensor& control, double bar) {
  const auto [rel, equal] = RelDiff(ours, control);
  if (step > 1) {
    if (later_worst.empty() || rel > later_max_rel) {
      later_max_rel = rel;
      later_worst = name + " (step " + std::to_string(step) + ")";
    }
    return;
  }
  ++grads_compared;
  if (equal) ++grads_bit_equal;
  grad_max_rel = std::max(grad_max_rel, rel);
  if (worst_grad.empty() || rel / bar > worst_grad_ratio) {
    worst_grad_ratio = rel / bar;
    worst_grad_rel = rel;
    worst_grad_bar = bar;
    worst_grad = name;
  }
}

void StepTrace::Record(double loss_bar, GateOutcome& out, std::vector<std::string>& fails,
                       const std::function<std::string(const std::string&)>& checkpoint_key) const {
  using internal::Num;
  // The gradient that names a tensor leads this trace's failures: a verdict shows the first few.
  const auto first_fail = static_cast<std::ptrdiff_t>(fails.size());
  auto rel = [](double a, double b) { return b != 0 ? std::abs(a - b) / std::abs(b) : std::abs(a - b); };
  for (size_t s = 0; s < loss.size() && s < control_loss.size(); ++s) {
    const std::string k = std::to_string(s + 1);
    const double loss_rel = rel(loss[s], control_loss[s]);
    const double norm_rel = rel(grad_norm[s], control_grad_norm[s]);
    out.Real("loss_step_" + k, loss[s], "nats");
    out.Real("loss_step_" + k + "_control", control_loss[s], "nats");
    out.Real("loss_step_" + k + "_rel_diff", loss_rel, "ratio");
    out.Real("grad_norm_step_" + k, grad_norm[s], "gradient");
    out.Real("grad_norm_step_" + k + "_control", control_grad_norm[s], "gradient");
    out.Real("grad_norm_step_" + k + "_rel_diff", norm_rel, "ratio");
    if (!(loss_rel < loss_bar)) {
      fails.push_back("step " + k + " loss " + Num(loss[s]) + " vs the control's " +
                      Num(control_loss[s]) + " (rel diff " + Num(loss_rel) + ", bar " +
                      Num(loss_bar) + ")");
    }
    if (!(norm_rel < loss_bar)) {
      fails.push_back("step " + k + " global grad norm " + Num(grad_norm[s]) +
                      " vs the control's " + Num(control_grad_norm[s]) + " (rel diff " +
                      Num(norm_rel) + ", bar " + Num(loss_bar) + ")");
    }
    if (s < sharded_grad_norm.size()) {
      const double sharded_rel = rel(sharded_grad_norm[s], control_grad_norm[s]);
      out.Real("grad_norm_sharded_step_" + k, sharded_grad_norm[s], "gradient");
      out.Real("grad_norm_sharded_step_" + k + "_rel_diff", sharded_rel, "ratio");
      if (!(sharded_rel < loss_bar)) {
        fails.push_back("step " + k + " grad norm from the ranks' shards " +
                        Num(sharded_grad_norm[s]) + " vs the control's " +
                        Num(control_grad_norm[s]) + " (rel diff " + Num(sharded_rel) + ", bar " +
                        Num(loss_bar) + ")");
      }
    }
  }
  out.Real("grad_max_rel_diff", grad_max_rel, "ratio");
  out.Count("grads_bit_equal", grads_bit_equal);
  out.Count("grads_compared", grads_compared);
  out.Text("grad_nearest_bar_tensor", worst_grad);
  const std::string key = checkpoint_key && !worst_grad.empty() ? checkpoint_key(worst_grad) : "";
  if (!key.empty()) out.Text("grad_nearest_bar_checkpoint_key", key);
  out.Real("grad_nearest_bar_rel_diff", worst_grad_rel, "ratio");
  out.Real("grad_nearest_bar_bar", worst_grad_bar, "ratio");
  if (!later_worst.empty()) {
    out.Real("grad_later_max_rel_diff", later_max_rel, "ratio");
    out.Text("grad_later_max_rel_diff_tensor", later_worst);
  }
  if (!grads_not_judged.empty()) {
    out.Text("grads_judged", "no: " + grads_not_judged);
  } else if (worst_grad_ratio >= 1) {
    fails.insert(fails.begin() + first_fail,
                 "step 1 gradient " + worst_grad +
                     (key.empty() ? std::string() : " (checkpoint " + key + ")") +
                     " differs from the control's by " + Num(worst_grad_rel) +
                     " of its max (bar " + Num(worst_grad_bar) + ")");
  }
}

torch::Tensor UnshardOverTp(const TpPlan& plan, TpCommunicator& tp, const std::string& name,
                            const torch::Tensor& local) {
  const ShardRule* rule = plan.Find(name);
  if (rule == nullptr) throw std::runtime_error(name + ": no rule in the tensor-parallel plan");
  Result<torch::Tensor> whole = plan.Unshard(*rule, tp.AllGather(local.contiguous()));
  if (!whole.ok()) throw std::runtime_error(name + ": " + whole.status().message());
  return *whole;
}

std::string CheckpointKeyOf(const GateContext& ctx, const std::string& internal,
                            const torch::Tensor& value) {
  if (ctx.family != nullptr && ctx.family->MapsWeightsByCode()) {
    if (!value.defined() || ctx.args == nullptr) return "";
    Result<NamedTensors> hf = ctx.family->ToHf(*ctx.args, {{internal, value}});
    if (!hf.ok() || hf->empty()) return "";
    if (hf->size() == 1) return hf->front().first;
    return hf->front().first + " .. " + hf->back().first + " (" + std::to_string(hf->size()) +
           " tensors)";
  }
  if (!ctx.adapter) return "";
  Result<std::vector<HfSlice>> slices = ctx.adapter->HfSlices(internal);
  if (!slices.ok() || slices->empty()) return "";
  if (slices->size() == 1) return slices->front().hf;
  return slices->front().hf + " .. " + slices->back().hf + " (" + std::to_string(slices->size()) +
         " experts stacked)";
}

std::function<std::string(const std::string&)> CheckpointKeys(const GateContext& ctx,
                                                              const std::vector<ParamGroup>& control) {
  return [&ctx, &control](const std::string& name) {
    torch::Tensor value;
    for (const ParamGroup& g : control) {
      if (g.names[0] == name) value = g.tensor.detach();
    }
    return CheckpointKeyOf(ctx, name, value);
  };
}

namespace {

std::string DimsName(const std::vector<Mesh::Dim>& dims) {
  std::string name;
  for (Mesh::Dim d : dims) name += (name.empty() ? "" : ".") + std::string(Mesh::DimName(d));
  return name;
}

std::string RanksText(const std::vector<int64_t>& ranks) {
  std::string text;
  for (int64_t r : ranks) text += (text.empty() ? "" : ",") + std::to_string(r);
  return "[" + text + "]";
}

}  // namespace

Result<std::shared_ptr<TpCommunicator>> MeshGroup(const GateContext& ctx, const Mesh& mesh,
                                                  const std::vector<Mesh::Dim>& dims) {
  const std::vector<int64_t> ranks = mesh.GroupOf(ctx.rank, dims);
  if (static_cast<int64_t>(ranks.size()) == ctx.world_size && ctx.comm) return ctx.comm;
  if (!ctx.subgroups) {
    return Status::FailedPrecondition("rank " + std::to_string(ctx.rank) +
                                      " cannot form its " + DimsName(dims) + " group " +
                                      RanksText(ranks) + ": its process group has no sub-groups");
  }
  return ctx.subgroups->Join(DimsName(dims), ranks);
}

std::string GroupsText(const Mesh& mesh, const std::vector<Mesh::Dim>& dims) {
  std::string text = DimsName(dims);
  for (const std::vector<int64_t>& g : mesh.GroupsAlong(dims)) text += " " + RanksText(g);
  return text;
}

Result<std::shared_ptr<CausalLM>> ShardLoadedModel(const ModelFamily& family,
                                                   std::shared_ptr<CausalLM> model,
                                                   const TensorParallel& tp, int64_t rank,
                                                   int64_t world_size,
                                                   const ExpertGroups& experts) {
  Result<std::shared_ptr<CausalLM>> sharded = Status::Internal("not run");
  try {
    sharded = family.ShardLoaded(std::move(model), tp, rank, world_size, experts);
  } catch (const std::exception& e) {
    return Status::Internal(e.what());
  }
  if (sharded.ok() && !*sharded) return Status::Internal("returned no model");
  return sharded;
}

GateOutcome MeasuredOnly(GateOutcome out, const std::string& layout, const Measured& measured,
                         const std::vector<ParamGroup>& params) {
  const std::vector<double>& step_ms = measured.step_ms;
  for (size_t k = 0; k < step_ms.size(); ++k) {
    out.Real("measured_step_" + std::to_string(k + 1) + "_ms", step_ms[k], "ms");
  }
  for (size_t k = 0; k < measured.losses.size(); ++k) {
    out.Real("loss_step_" + std::to_string(k + 1), measured.losses[k], "nats");
  }
  out.Count("global_batch_sequences", static_cast<int64_t>(measured.batch.size()));
  out.Count("global_batch_tokens", static_cast<int64_t>(measured.global_tokens));
  out.Count("optimizer_state_elements", measured.optimizer_state_elements);
  int64_t held = 0;
  for (const ParamGroup& g : params) held += g.tensor.numel();
  out.Count("parameter_elements_held", held);
  return out.Skipped("measured only (--parallel-measure-only): " + layout + " trained " +
                     std::to_string(step_ms.size()) + " step(s) without the single-rank "
                     "control; nothing was compared");
}

}  // namespace gatehouse::worker::parallel
