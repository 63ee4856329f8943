// The tensor-parallel check's last steps (tp_run.h): the save gathered under TP against the
// TP=1 control's, the figures, and the verdict against the bars.
#include <algorithm>
#include <filesystem>
#include <map>

#include "../gates_internal.h"
#include "common/artifacts.h"
#include "gatehouse/worker/bars.h"
#include "tp_run.h"

namespace gatehouse::worker::parallel {

using internal::JoinFew;
using internal::Num;
using internal::NumVs;

// 5. Rank 0: the gathered parameters saved under HF names against the control's save, both
// written as artifacts with the KL along the position (plot data, never the verdict).
bool CompareSaves(TpRun& run, GateOutcome& out) {
  torch::NoGradGuard no_grad;
  GateContext& ctx = run.ctx;
  const std::filesystem::path attempt_dir(ctx.spec.attempt.dir);
  const std::string tp_dir = "parallel/tp" + std::to_string(run.tp_size);
  run.control_groups = UniqueParameters(*run.control);
  HfTensors hf_n = internal::HfNamesOf(ctx, run.gathered);
  HfTensors hf_1 = internal::HfNamesOf(ctx, run.control_groups);
  if (!hf_n.ok() || !hf_1.ok()) {
    run.save_problems.push_back(hf_n.ok() ? hf_1.Problems() : hf_n.Problems());
    return true;
  }
  run.save_equal += CompareHfSaves(hf_n, hf_1, "TP=1", run.save_problems);
  Result<Artifact> a = WriteCheckpoint(attempt_dir, tp_dir, hf_n.tensors, "tp_saved_checkpoint");
  Result<Artifact> b = WriteCheckpoint(attempt_dir, "parallel/tp1", hf_1.tensors, "tp1_saved_checkpoint");
  if (!a.ok() || !b.ok()) {
    out.Fail(FailureClass::kResource,
             "writing the TP saves: " + (a.ok() ? b.status() : a.status()).ToString());
    return false;
  }
  run.art_n = *a;
  run.art_1 = *b;
  out.artifacts.push_back(*a);
  out.artifacts.push_back(*b);
  // Plot data (TP=N against the TP=1 control along the position), never the verdict.
  Result<Artifact> kl = internal::WriteJsonArtifact(
      attempt_dir, std::string(kParallelKlArtifact), "kl_by_position_vs_tp1",
      {{"unit", "nats"}, {"reference", "tp1"}, {"prompts", run.kl_vs_tp1}});
  if (kl.ok()) out.artifacts.push_back(*kl);
  else out.Text("kl_by_position", "not written: " + kl.status().ToString());
  if (a->sha256 != b->sha256) run.save_problems.push_back("model.safetensors SHA-256 differs from TP=1's");
  return true;
}

// 6. Rank 0: the figures, then each bar in turn; the reason names every bar missed.
void RecordFigures(const TpRun& run, GateOutcome& out) {
  const GateContext& ctx = run.ctx;
  const TpThresholds& thr = run.thr;
  out.Real("kl_mean_vs_tp1", run.vs_tp1.kl_mean(), "nats");
  out.Real("kl_max_vs_tp1", run.vs_tp1.kl_max(), "nats");
  out.Real("top1_agreement_vs_tp1", run.vs_tp1.top1_agreement_percent(), "percent");
  out.Real("max_abs_diff_vs_tp1", run.vs_tp1.max_abs_diff(), "logits");
  out.Real("kl_mean_vs_upstream", run.vs_upstream.kl_mean(), "nats");
  out.Real("top1_agreement_vs_upstream", run.vs_upstream.top1_agreement_percent(), "percent");
  out.Count("tokens_compared", run.vs_tp1.tokens());
  out.Real("kl_max_across_ranks", run.vs_ranks.kl_max(), "nats");
  out.Real("max_abs_diff_across_ranks", run.vs_ranks.max_abs_diff(), "logits");
  if (run.judge_decided) {
    const double decided_top1 =
        run.decided ? 100.0 * double(run.decided_equal) / double(run.decided) : 0.0;
    out.Count("tokens_decided", run.decided);
    out.Real("top1_agreement_decided_vs_tp1", decided_top1, "percent");
  }
  if (run.train_prompt != nullptr) {
    out.Real("loss_tp", run.loss_n, "nats");
    out.Real("loss_tp1", run.loss_1, "nats");
    out.Real("loss_rel_diff",
             std::abs(run.loss_n - run.loss_1) / std::max(std::abs(run.loss_1), 1e-30), "ratio");
    out.Real("grad_max_rel_diff", run.max_grad_rel, "ratio");
    if (!run.worst_grad.empty()) {
      // The tensor nearest its own bar (in fp32 every bar is the same, so it is the one with the
      // largest difference; in bf16 each tensor's bar is its own rounding floor, and the largest
      // difference, grad_max_rel_diff, may be another tensor's, well inside its bar).
      out.Text("grad_nearest_bar_tensor", run.worst_grad);
      out.Real("grad_nearest_bar_rel_diff", run.worst_grad_rel, "ratio");
      out.Real("grad_nearest_bar", run.worst_grad_bar, "ratio");
    }
    if (ctx.dtype == torch::kBFloat16) {
      double widest = 0;
      for (const auto& [name, f] : run.bf16_floor) widest = std::max(widest, f);
      if (run.floor_note.empty()) out.Real("grad_bf16_floor_max_rel", widest, "ratio");
      else out.Text("grad_bf16_floor", run.floor_note);
    }
    out.Real("replicated_grad_max_rank_diff", run.replicated_rank_diff, "gradient");
  }
  out.Count("save_tensors_equal", run.save_equal);
  if (run.art_n) out.Text("save_sha256_tp", run.art_n->sha256);
  if (run.art_1) out.Text("save_sha256_tp1", run.art_1->sha256);
  out.Text("thresholds", ctx.spec.precision + ": kl_mean < " + Num(thr.kl_mean_below) +
                             " nats, top1 >= " + Num(thr.top1_at_least) +
                             (run.judge_decided ? "% of decided tokens" : "%") + ", loss rel < " +
                             Num(thr.loss_rel_below) + ", grad rel < " + Num(thr.grad_rel_below) +
                             (ctx.dtype == torch::kBFloat16
                                  ? " or " + Num(kFloorMargin) +
                                        "x the tensor's bf16-vs-fp32 spread at TP=1, if wider"
                                  : "") +
                             ", save bit-equal");
}

void Verdict(const TpRun& run, GateOutcome& out) {
  const TpThresholds& thr = run.thr;
  std::vector<std::string> failed;
  if (!(run.vs_tp1.kl_mean() < thr.kl_mean_below)) {
    failed.push_back("kl_mean_vs_tp1 " + Num(run.vs_tp1.kl_mean()) + " nats is not below " +
                     Num(thr.kl_mean_below));
  }
  if (!(run.vs_ranks.kl_mean() < thr.kl_mean_below) ||
      !(run.vs_ranks.top1_agreement_percent() >= thr.top1_at_least)) {
    failed.push_back("ranks disagree on the logits: kl_mean " + Num(run.vs_ranks.kl_mean()) +
                     " nats, top1 " + Num(run.vs_ranks.top1_agreement_percent()) +
                     "% against rank 0's (every rank must get the same full logits)");
  }
  const double decided_top1 =
      run.decided ? 100.0 * double(run.decided_equal) / double(run.decided) : 0.0;
  if (!(decided_top1 >= thr.top1_at_least)) {
    failed.push_back(std::string(run.judge_decided ? "top1_agreement_decided_vs_tp1 "
                                                   : "top1_agreement_vs_tp1 ") +
                     Num(decided_top1) + "% is below " + Num(thr.top1_at_least) + "%");
  }
  if (run.train_prompt == nullptr) {
    failed.push_back("no reference prompt has 2 or more tokens for the training step");
  } else {
    const double loss_rel = std::abs(run.loss_n - run.loss_1) / std::max(std::abs(run.loss_1), 1e-30);
    if (!(loss_rel < thr.loss_rel_below)) {
      failed.push_back("loss " + NumVs(run.loss_n, run.loss_1, " vs TP=1 ") + " (relative " +
                       Num(loss_rel) + ")");
    }
    if (!(run.replicated_rank_rel < thr.grad_rel_below)) {
      failed.push_back("a replicated parameter's gradient differs between ranks by " +
                       Num(run.replicated_rank_rel) + " of its max");
    }
    if (!(run.worst_grad_rel < run.worst_grad_bar)) {
      failed.push_back("gradient of " + run.worst_grad + " differs from TP=1 by " +
                       Num(run.worst_grad_rel) + " of its max (bar " + Num(run.worst_grad_bar) + ")");
    }
  }
  if (!run.plan) {
    // A parallelize that shards nothing leaves every rank holding the whole model: the TP
    // comparisons would pass without testing any tensor parallelism.
    int64_t control_elements = 0;
    for (const auto& g : run.control_groups) control_elements += g.tensor.numel();
    out.Count("param_elements_tp1", control_elements);
    bool any_sharded = false;
    for (const auto& c : run.counts) any_sharded |= c.item<int64_t>() < control_elements;
    if (!any_sharded) {
      failed.push_back("parallelize sharded no parameter: every rank holds all " +
                       std::to_string(control_elements) + " elements of the TP=1 model");
    }
  }
  if (!run.grad_problems.empty()) failed.push_back("gradients: " + JoinFew(run.grad_problems));
  if (!run.save_problems.empty()) failed.push_back("save under TP: " + JoinFew(run.save_problems));
  if (!failed.empty()) {
    std::string reason = "TP=" + std::to_string(run.tp_size) + " vs TP=1: ";
    for (size_t i = 0; i < failed.size(); ++i) reason += (i ? "; " : "") + failed[i];
    out.Fail(FailureClass::kAdapterContract, reason);
  }
  // The judged figures first: a report shows the first few (ParallelGate's bookkeeping,
  // world_size, mesh, process_group, came before them).
  out.Lead({"kl_mean_vs_tp1", "top1_agreement_vs_tp1", "loss_rel_diff",
            "grad_nearest_bar_rel_diff", "save_tensors_equal", "max_abs_diff_across_ranks"});
}

}  // namespace gatehouse::worker::parallel
