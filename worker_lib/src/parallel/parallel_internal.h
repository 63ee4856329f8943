// What the parallel gate's checks share (worker_lib/src/parallel): collectives that let every
// rank agree on a problem before the next collective, the spread of one tensor across ranks,
// and the pieces of a save comparison. Internal to the SDK.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/artifacts.h"
#include "common/mesh.h"
#include "common/status.h"
#include "gatehouse/worker/gates.h"

namespace gatehouse::worker::parallel {

/// Every rank's `problem` ("" when none) gathered, the same on every rank: "" when no rank has
/// one, else "rank r: <problem>; ..." in rank order. Each is cut to 600 bytes (an adapter's
/// traceback can be long). A collective: every rank calls it, so a rank's failure is never
/// left for the others to wait on, and rank 0's verdict names every rank's cause.
std::string RankProblems(TpCommunicator& comm, const std::string& problem);

/// Folds into (max_diff, max_rel) how far each rank's copy in `copies` (one per rank, same
/// shape) is from rank 0's: max abs difference, and that relative to rank 0's max abs.
void RankSpread(const std::vector<torch::Tensor>& copies, double& max_diff, double& max_rel);

/// A load report's problems (missing, unexpected, unknown, shape, non-finite, loaded twice),
/// the first few joined.
std::string LoadProblems(const LoadReport& rep);

/// Writes `tensors` to `attempt_dir`/`rel_dir`/model.safetensors as the artifact `name`
/// (its path relative to the attempt). Errors: INTERNAL when the directory cannot be made,
/// or the writer's.
Result<Artifact> WriteCheckpoint(const std::filesystem::path& attempt_dir,
                                 const std::string& rel_dir,
                                 const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                 const std::string& name);

/// Compares a save gathered from the ranks (`ours`, HF-named) with the single-rank control's
/// (`control`) tensor by tensor, bit for bit (dtype, shape, values): appends to `problems`
/// "key (differs)", "key (not in the <control_label> save)" and "key (missing from the
/// gathered save)". Returns the count of keys that are equal.
int64_t CompareHfSaves(const HfTensors& ours, const HfTensors& control,
                       const std::string& control_label, std::vector<std::string>& problems);

/// Cross entropy of next-token prediction on `ids` [T] int64 (T >= 2), in fp32: the loss the
/// parallel checks train one step on.
torch::Tensor NextTokenLoss(CausalLM& model, const torch::Tensor& ids, torch::Device device);

/// Sum of the next-token cross entropies of `ids` [T] int64 (T >= 2) on `model`, in fp32:
/// the loss the training checks divide by the global token count.
torch::Tensor TokenLossSum(CausalLM& model, const torch::Tensor& ids, torch::Device device);

/// Forward and backward over `sequences` (token ids [T] each) on `model`, gradients
/// accumulating in sequence order; each sequence's TokenLossSum divided by `normalizer`.
/// Returns the sum of those losses.
double Backward(CausalLM& model, const std::vector<torch::Tensor>& sequences, double normalizer,
                torch::Device device);

/// Each parameter's gradient (a copy; zeros where it has none), in `groups` order.
std::vector<torch::Tensor> GradsOf(const std::vector<ParamGroup>& groups);

/// sqrt of the sum of squares of every element of `grads`, in float64 (the total norm
/// clip_grad_norm_ computes and a trainer clips with).
double GlobalNorm(const std::vector<torch::Tensor>& grads);

/// max |a - b| / max |b| (infinite when b is all zeros and a is not), and whether a equals b
/// bit for bit.
std::pair<double, bool> RelDiff(const torch::Tensor& a, const torch::Tensor& b);

/// What a training check (data or pipeline parallel) records per optimizer step, here and on
/// the single-rank control, and how its gradients compared. Each gradient is judged at step
/// 1, where the parameters are the control's. Later steps start from parameters the first
/// update moved by its rounding (AdamW divides by the root of the second moment, so an
/// element whose gradient is within rounding of zero moves by up to 2 lr either way): their
/// gradients are a figure, and those steps are judged by their loss and global grad norm.
struct StepTrace {
  std::vector<double> loss, control_loss, grad_norm, control_grad_norm;  // per step
  /// Per step, when the check computes it: the global grad norm from what each rank holds
  /// (each shard counted once, replicated tensors once), as a sharded trainer clips with.
  std::vector<double> sharded_grad_norm;
  int64_t grads_bit_equal = 0, grads_compared = 0;  // step 1
  double grad_max_rel = 0;                          // step 1
  // Step 1's gradient nearest its bar: its name, its difference and bar.
  double worst_grad_ratio = 0, worst_grad_rel = 0, worst_grad_bar = 0;
  std::string worst_grad;
  // Later steps: the largest difference and its gradient (a figure).
  double later_max_rel = 0;
  std::string later_worst;
  /// Empty when step 1's gradients are judged tensor by tensor; else why they are a figure
  /// only (MoE routings that rounding flipped: another expert saw those tokens).
  std::string grads_not_judged;

  /// Folds gradient `name` of step `step` (ours against the control's) with bar `bar` (a
  /// relative difference, RelDiff's), judged at step 1 only.
  void AddGradient(const std::string& name, int step, const torch::Tensor& ours,
                   const torch::Tensor& control, double bar);
  /// Records loss_step_k, loss_step_k_control, loss_step_k_rel_diff, grad_norm_step_k (same
  /// three), grad_norm_sharded_step_k (and its _rel_diff, when computed), step 1's grad_max_rel_diff, grads_bit_equal, grads_compared and
  /// grad_nearest_bar_tensor / _rel_diff / _bar (and _checkpoint_key: `checkpoint_key`, when
  /// given, names an internal parameter as the checkpoint does, CheckpointKeyOf), and
  /// grad_later_max_rel_diff (+ _tensor);
  /// appends to `fails` each step's loss or grad norm whose relative difference is not below
  /// `loss_bar`, and step 1's nearest gradient when it reached its bar (unless
  /// grads_not_judged says why not: then `grads_judged` records it).
  void Record(double loss_bar, GateOutcome& out, std::vector<std::string>& fails,
              const std::function<std::string(const std::string&)>& checkpoint_key = {}) const;
};

/// The full tensor of parameter `name` from this rank's tp shard `local`: every rank's shard
/// gathered over `tp` and put together by the plan's rule for it. A collective over `tp`.
/// Throws std::runtime_error naming the parameter when it has no rule or a shard does not fit.
torch::Tensor UnshardOverTp(const TpPlan& plan, TpCommunicator& tp, const std::string& name,
                            const torch::Tensor& local);

/// What a check measured only (GateContext::parallel_measure_only) trained.
struct Measured {
  const std::vector<double>& step_ms;         // per step: this rank's wall time (forward,
                                              // backward, reduction, optimizer step), ms
  const std::vector<double>& losses;          // per step: the global loss, nats
  const std::vector<torch::Tensor>& batch;    // the global batch the check trained
  double global_tokens;                       // its predicted tokens
  int64_t optimizer_state_elements;           // what this rank's optimizers hold
};

/// The end of a check run measured only: `layout` trained without its control. Records
/// measured_step_<k>_ms, loss_step_<k>, global_batch_sequences, global_batch_tokens,
/// optimizer_state_elements and parameter_elements_held (this rank's `params`), and returns
/// `out` SKIPPED, saying that nothing was compared.
GateOutcome MeasuredOnly(GateOutcome out, const std::string& layout, const Measured& measured,
                         const std::vector<ParamGroup>& params);

/// The checkpoint key of internal parameter `internal` through the cell's name table
/// ("model.layers.0.self_attn.k_proj.weight"; for a stacked expert parameter its first and
/// last expert's keys) or, for a family that maps weights by code (the Python lane), through
/// its ToHf of `value`, the parameter's full tensor (a mapping that splits it gives "first ..
/// last (N tensors)"). "" when nothing maps it, or the family maps by code and `value` is
/// undefined.
std::string CheckpointKeyOf(const GateContext& ctx, const std::string& internal,
                            const torch::Tensor& value = {});

/// CheckpointKeyOf as StepTrace::Record's `checkpoint_key`, the value of a parameter being the
/// control's tensor of that name in `control` (which must outlive the function).
std::function<std::string(const std::string&)> CheckpointKeys(const GateContext& ctx,
                                                              const std::vector<ParamGroup>& control);

/// The whole checkpoint into `model` (every parameter, unsharded): through the adapter's code
/// when the family maps weights by code (the Python lane), else through its name table.
Result<LoadReport> LoadFull(const GateContext& ctx, CausalLM& model);

/// `model`, loaded whole on this rank, sharded by the family's own code
/// (ModelFamily::ShardLoaded over `tp`, this rank being `rank` of `world_size`, the experts
/// over `experts` when enabled: the Python lane's parallelize, expert_parallel and
/// data_parallel; a collective). An exception becomes INTERNAL with its
/// text, a null model INTERNAL "returned no model"; the family's own errors as they are
/// (INVALID_ARGUMENT: the adapter's contract).
Result<std::shared_ptr<CausalLM>> ShardLoadedModel(const ModelFamily& family,
                                                   std::shared_ptr<CausalLM> model,
                                                   const TensorParallel& tp, int64_t rank,
                                                   int64_t world_size,
                                                   const ExpertGroups& experts = {});

/// A model a check trains: made by `construct` (Construct or ConstructParallel, under
/// SkipWeightInit: `load` overwrites every parameter), loaded by `load`, then each parameter
/// moved to memory of its own (one adopted from the checkpoint's mapping shares the file's
/// pages with every model of this process). Errors: INTERNAL naming `what` and this rank with
/// the construct or load problem (exceptions included).
Result<std::shared_ptr<CausalLM>> TrainableModel(
    const GateContext& ctx, const std::string& what,
    const std::function<Result<std::shared_ptr<CausalLM>>()>& construct,
    const std::function<Result<LoadReport>(CausalLM&)>& load);

/// What every parallel check needs before its first collective: model args (config), a
/// checkpoint and a name table or weights mapped by code (load), the reference bundle. Returns
/// "" when all are there, else why not; `blocked` is set when the reason is an input the cell
/// cannot change by running again (RequireReference's BLOCKED).
std::string NotReady(GateContext& ctx, bool& blocked);

/// This rank's group along `dims` of `mesh`: the world's communicator (ctx.comm) when the
/// group is the whole world, else the sub-group of Mesh::GroupOf joined through
/// ctx.subgroups, named after the dims ("dp_replicate", "tp", "dp_shard.cp"). Every rank calls
/// it with the same dims, in the same order. Errors: FAILED_PRECONDITION when a sub-group is
/// needed and the rank has no factory; the factory's.
Result<std::shared_ptr<TpCommunicator>> MeshGroup(const GateContext& ctx, const Mesh& mesh,
                                                  const std::vector<Mesh::Dim>& dims);

/// "tp [0,1] [2,3]": the groups along `dims`, for the evidence.
std::string GroupsText(const Mesh& mesh, const std::vector<Mesh::Dim>& dims);

/// The tensor-parallel check: the mesh's TP group (the whole world: no other dimension is
/// enabled) against the TP=1 control on rank 0, on the reference prompts (tp_parity.cc).
/// `out` holds the figures ParallelGate recorded; every rank calls it together.
GateOutcome TensorParallelParity(GateContext& ctx, int64_t tp_size, GateOutcome out);

/// How the data-parallel check reduces gradients over the dp group (and numbers a cp rank's
/// positions). The gate runs kSum; the others are the bugs the check must catch, run by its tests (tests/models/parallel_dp_test.cc).
struct DpReduction {
  enum class Mode {
    kSum,        // each rank's loss divided by the global token count, gradients summed in fp32
    kAverage,    // as kSum, then the gradients divided by dp
    kLocalMean,  // each rank's own token mean, gradients averaged over dp (DDP's default)
    kNone,       // no all-reduce: each rank steps on its own gradients
    kWholeWorld, // as kSum, but over every rank (the TP ranks too), not the dp group
    kShardGroupOnly,  // as kSum over dp_shard, the all-reduce across replicas left out (HSDP)
    kExpertsOverDp,   // expert gradients reduced over the data-parallel group like dense ones
                      // (summing different experts of the EP ranks)
    kEpNormAveraged,  // the sharded grad norm's expert part averaged over ep, not summed
    kReplicatedCountedTp,  // the sharded grad norm counting tp-replicated tensors tp times
    kExpertCountsNotReduced,  // router counts per expert taken from rank 0 alone
    kCpLocalPositions,  // each cp rank numbers its columns' positions from its own first
                        // column (a sequence begun on an earlier rank restarts at 0)
    kBf16Reduction,     // gradients reduced in bf16 where fp32 was asked (FSDP2's
                        // reduce_dtype not applied)
    kEpNormLocal,       // each EP rank clips with its own experts' norm (the expert part of
                        // the sharded grad norm not summed over ep: per-group clipping)
    kExpertOffsetShifted,  // each EP rank loads the experts at the next EP rank's offset, so
                           // tokens dispatched to expert e run through another expert's weights
  };
  Mode mode = Mode::kSum;
  /// In words, for the evidence.
  std::string Name() const;
};

/// The data-parallel check: the mesh's data-parallel dimensions (dp_replicate, dp_shard: each
/// rank stepping the optimizer state of its slice of every parameter, or both: HSDP), alone or
/// with tensor parallelism inside each replica (the model sharded over its tp group through the
/// family's plan) and expert parallelism over ranks of dp_shard (ep, etp = tp: each MoE layer's
/// experts split over the EP group, tokens dispatched to them all-to-all) and context
/// parallelism (cp: each data-parallel share packed into one row, its columns split over the
/// cp group, Ulysses in attention; cp_batch.cc), trained two AdamW steps on the reference
/// prompts split over the data-parallel ranks, against the single-rank control on the whole
/// batch on rank 0 (dp_parity.cc). A family that shards by code (the Python lane) gets each
/// replica's tp group from ModelFamily::ShardLoaded and its shards put together by
/// CausalLM::FullOfLocal. BLOCKED when the prompts cannot make one sequence per
/// data-parallel rank, or for ep and cp when the family shards by code. `out` holds the
/// figures ParallelGate recorded; every rank calls it together.
GateOutcome DataParallelParity(GateContext& ctx, const Mesh& mesh, GateOutcome out,
                               const DpReduction& reduction = {});

/// How the pipeline-parallel check computes each microbatch's loss and syncs the stages. The
/// gate runs kNone; the others are the bugs the check must catch, run by its tests
/// (tests/models/parallel_pp_test.cc).
struct PpFault {
  enum class Mode {
    kNone,            // each microbatch's token sum over the global token count
    kMicrobatchMean,  // each microbatch's own token mean, averaged over the microbatches
    kRawTokenSum,     // the token sum, never divided
    kTiedNotSynced,   // a parameter two stages own (a tied embedding): each steps its own part
    kStageReinit,     // the first stage re-initialised before its last microbatch's backward:
                      // the gradients it accumulated over the earlier microbatches are lost
  };
  Mode mode = Mode::kNone;
  /// In words, for the evidence.
  std::string Name() const;
};

/// The pipeline-parallel check: the mesh's pp dimension (alone, or with tp: each stage's model
/// its tp shard through the family's plan), the decoder layers cut into
/// pp stages (CausalLM::ForwardStage), two AdamW steps of the reference prompts as
/// microbatches through a 1F1B schedule, against the single-rank control on rank 0
/// (pp_parity.cc). BLOCKED when the model has fewer layers than stages, the bundle no prompt,
/// or the family's model does not run in stages. `out` holds the figures ParallelGate
/// recorded; every rank calls it together.
GateOutcome PipelineParallelParity(GateContext& ctx, const Mesh& mesh, GateOutcome out,
                                   const PpFault& fault = {});

}  // namespace gatehouse::worker::parallel
