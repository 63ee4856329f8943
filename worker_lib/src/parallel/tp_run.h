// The tensor-parallel check's shared state and steps (tp_parity.cc: plan, shards, logits,
// gradients; tp_save_verdict.cc: saves, figures, verdict). Internal to the SDK.
#pragma once

#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../figure_pair.h"
#include "gatehouse/worker/gates.h"
#include "parallel_internal.h"

namespace gatehouse::worker::parallel {

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

inline TpThresholds TpThresholdsFor(std::string_view precision) {
  if (precision == "bf16") return {1e-3, 99.0, 1e-2, 5e-2};
  return {1e-6, 100.0, 1e-5, 1e-4};
}

/// What the steps of one TP check share, filled in step order.
struct TpRun {
  GateContext& ctx;
  TpCommunicator& comm;
  int64_t tp_size;
  bool rank0;
  TpThresholds thr;
  // Step 1: how the family shards. A plan the gates load shards through (Parallelize,
  // ConstructParallel), or none: the family shards a model loaded in full by its own code
  // (ShardLoaded, the Python lane's parallelize over torch.distributed).
  bool by_code = false;  // weights mapped by code (the Python lane)
  std::optional<TpPlan> plan;
  // Step 2: this rank's shard; the control on rank 0.
  std::shared_ptr<CausalLM> model, control;
  std::vector<ParamGroup> groups;      // UniqueParameters(*model)
  std::vector<torch::Tensor> counts;   // parameter elements per rank
  // Step 3: logits.
  LogitComparison vs_tp1, vs_upstream, vs_ranks;  // vs_ranks: every rank against rank 0's
  nlohmann::json kl_vs_tp1 = nlohmann::json::array();  // per prompt, along the position
  bool judge_decided = false;
  int64_t decided = 0, decided_equal = 0;
  // Step 4: one training step.
  const ReferencePrompt* train_prompt = nullptr;
  double loss_n = std::numeric_limits<double>::quiet_NaN(), loss_1 = loss_n;
  std::unordered_map<std::string, torch::Tensor> control_params;
  /// bf16: each tensor's gradient spread from rounding alone (rank 0), parameter name -> max
  /// |g_bf16 - g_fp32| / max |g_fp32| of the TP=1 control against the same model in fp32.
  std::unordered_map<std::string, double> bf16_floor;
  std::string floor_note;
  std::vector<ParamGroup> gathered;  // rank 0: full parameters, for the save
  double worst_grad_rel = 0, replicated_rank_diff = 0, replicated_rank_rel = 0;
  // The tensor nearest its bar (worst_grad: its difference and bar), and the largest difference.
  double worst_grad_bar = 0, max_grad_rel = 0;
  std::string worst_grad;
  std::vector<std::string> grad_problems;
  // Step 5: the saves.
  std::vector<ParamGroup> control_groups;
  std::vector<std::string> save_problems;
  int64_t save_equal = 0;
  std::optional<Artifact> art_n, art_1;

  Result<LoadReport> LoadFull(CausalLM& m) const { return parallel::LoadFull(ctx, m); }
};

// The steps, in order; each returns false once it has ended the gate (out holds the verdict).
bool AgreeOnPlan(TpRun& run, GateOutcome& out);
bool BuildShards(TpRun& run, GateOutcome& out);
bool CompareLogits(TpRun& run, GateOutcome& out);
void TrainOneStep(TpRun& run);
bool CompareGradients(TpRun& run, GateOutcome& out);
bool CompareSaves(TpRun& run, GateOutcome& out);
void RecordFigures(const TpRun& run, GateOutcome& out);
void Verdict(const TpRun& run, GateOutcome& out);

}  // namespace gatehouse::worker::parallel
