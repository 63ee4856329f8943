// What the parallel gate's checks share (parallel_internal.h).
#include <algorithm>
#include <cstring>

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

}  // namespace gatehouse::worker::parallel
