// The data-parallel check's shared state and steps (parallel_internal.h DataParallelParity):
// dp_parity.cc forms the groups, builds the replicas, compares the parameters and gives the
// verdict; dp_train.cc runs the optimizer steps against the control; dp_shard.cc holds the
// optimizer over this rank's slices of the parameters (dp_shard). Internal to the SDK.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/mesh.h"
#include "gatehouse/worker/adamw.h"
#include "gatehouse/worker/gates.h"
#include "parallel_internal.h"
#include "tp_run.h"

namespace gatehouse::worker::parallel {

/// Optimizer steps the check trains.
inline constexpr int kDpSteps = 2;

/// What the check's steps share.
struct DpRun {
  GateContext& ctx;
  TpCommunicator& comm;  // the world: agreement on problems
  const Mesh& mesh;
  int64_t replicate;  // dp_replicate
  int64_t shard;      // dp_shard
  int64_t dp;         // replicate x shard: the data-parallel ranks the batch is split over
  int64_t dp_index;   // this rank's index among them: which share of the batch
  int64_t tp;
  bool rank0;  // holds the single-rank control and judges (rank 0, unless measure_only)
  TpThresholds thr;
  DpReduction reduction;
  // The flattened data-parallel group (dp_replicate x dp_shard), and its two parts (null when
  // the part has one rank; one of them is dp_comm itself when the other has one rank).
  std::shared_ptr<TpCommunicator> dp_comm, replicate_comm, shard_comm;
  std::shared_ptr<TpCommunicator> tp_comm;  // null when tp is 1
  // Expert parallelism: the EP group (null when ep is 1) and the data-parallel ranks that hold
  // the same experts (null when this rank alone does), over which expert gradients are reduced.
  int64_t ep = 1;
  std::shared_ptr<TpCommunicator> ep_comm, expert_dp_comm;
  // Of those, the dp_shard ranks (not across replicas): the experts' optimizer state is
  // sharded over them. Null when this rank alone.
  std::shared_ptr<TpCommunicator> expert_shard_comm;
  std::vector<bool> expert;  // per params: a stacked (expert) parameter, split over ep
  // The world's EP and expert-replica groups, handed to a family that shards by its own code
  // (ModelFamily::ShardLoaded); empty otherwise.
  ExpertGroups expert_groups;
  // Context parallelism: each data-parallel share packed into one row and split over the cp
  // group (null when cp is 1). Parameters are the same on its ranks; their gradients are
  // summed over dp x cp (dp_comm), the optimizer state sharded over dp_shard x cp (shard_comm).
  int64_t cp = 1;
  std::shared_ptr<TpCommunicator> cp_comm;
  int64_t cp_tokens_trimmed = 0;  // cut from the batch so each share's packing divides by cp
  // Rank 0, before training: share 0's logits under cp, gathered over its cp group, against
  // the control's packed forward of the same packing.
  LogitComparison cp_vs_packed;
  std::optional<TpPlan> plan;               // the family's, when tp > 1
  // The replica sharded by the family's own code (ModelFamily::ShardLoaded: the Python lane's
  // parallelize for tp > 1, its expert_parallel and data_parallel) instead of a plan; its
  // clipping norm is the model's own (CausalLM::ClippingGradNorm).
  bool by_code = false;
  // The model reduces its own gradients over the data-parallel ranks and holds its parameters
  // sharded over them (CausalLM::ReducesDataParallelGradients: the adapter's FSDP2): the check
  // neither reduces nor slices, and compares replicas through their full tensors.
  bool model_reduces = false;
  int64_t full_elements = 0;  // by_code, rank 0: the control's (whole model's) parameter elements
  std::vector<torch::Tensor> batch;         // the global batch: token ids [T] int64, CPU
  int64_t batch_splits = 0;                 // prompts cut in two to make it (GlobalBatch)
  double global_tokens = 0;                 // predicted tokens of the whole batch
  std::shared_ptr<CausalLM> model, control;
  std::vector<ParamGroup> params, control_params;  // UniqueParameters, the same order
  StepTrace trace;  // per step, here and on the control
  // Step 1: each tensor's reduction-order spread (relative to its max) and its bar.
  std::vector<double> floor;
  double floor_max = 0;
  int64_t grads_bit_equal_to_grouping = 0;
  double replica_max_abs = 0, replica_max_rel = 0;
  double params_after_max_abs = 0, params_after_max_rel = 0;
  // MoE: tokens routed to each expert at step 1 ([MoE layers, E]), summed over the
  // data-parallel ranks, and the control's; undefined for a dense model.
  torch::Tensor expert_tokens, control_expert_tokens;
  // The control's routings at step 1 decided by a near tie (CausalLM::ExpertNearTies).
  int64_t control_near_ties = 0;
  // Before the steps: the gathered save's tensors, those bit-equal to the control's, and the
  // problems (rank 0).
  int64_t save_tensors = 0, save_tensors_equal = 0;
  std::vector<std::string> save_problems;
  // Optimizer state elements (exp_avg and exp_avg_sq) this rank holds, and unsharded.
  int64_t optimizer_state_elements = 0, optimizer_state_elements_unsharded = 0;
  // Each step's wall time on this rank (its forward, backward, reduction and optimizer step),
  // in ms: under GateContext::parallel_measure_only (no control, no save, nothing gathered or
  // compared).
  std::vector<double> step_ms;
};

/// The global batch the data-parallel ranks split: every reference prompt of 2 tokens or more,
/// in bundle order; while there are fewer sequences than `dp`, the longest (the first of
/// equals) is cut in two, its first ceil(T/2) tokens and the rest, each a sequence of its own
/// (positions from 0), as long as both parts keep 2 tokens. The control trains the same batch.
/// `splits` counts the cuts. With `equal_shares` the cuts go on until dp divides the count
/// (expert parallelism: the ranks of an EP group must run as many forwards, each one
/// all-to-all). Fewer than `dp` sequences (or a count dp does not divide) come back only when
/// no cut is possible.
std::vector<torch::Tensor> GlobalBatch(const std::vector<ReferencePrompt>& prompts, int64_t dp,
                                       int64_t& splits, bool equal_shares = false);

/// One data-parallel share packed as a trainer packs it (sequence after sequence in one row;
/// each sequence's inputs are its tokens but the last, its labels the tokens after them):
/// tokens, positions (restarting at 0 per sequence) [1, T] int64, labels [T] int64 and
/// cu_seqlens [S + 1] int64, on `device` (cp_batch.cc).
struct Packing {
  torch::Tensor tokens, positions, labels, cu_seqlens;
};
Packing PackShare(const std::vector<torch::Tensor>& share, torch::Device device);

/// Shortens, for each data-parallel share of `batch` (sequences d, d + dp, ...), its longest
/// sequence until the share's packing (its predicted tokens) divides by `cp`, so every cp rank
/// holds as many columns and no padding enters the comparison; with one share (dp 1) a
/// sequence too short to give up the excess is left out whole. The control trains the same
/// batch. Returns the tokens cut, or -1 with `why` naming the share when one cannot be cut.
int64_t TrimForContextParallel(std::vector<torch::Tensor>& batch, int64_t dp, int64_t cp,
                               std::string& why);

/// Context parallelism: this rank's columns of its share's packing forward
/// (CausalLM::ForwardPackedContextParallel over run.cp_comm) and backward, the cross entropy
/// summed over its columns divided by `normalizer`. Returns that loss (cp_batch.cc).
double ContextParallelBackward(DpRun& run, const std::vector<torch::Tensor>& share,
                               double normalizer);

/// Before training, every rank: its share's logits under context parallelism; on rank 0 those
/// of its cp group gathered against the control's ForwardPacked of the same packing, into
/// run.cp_vs_packed (cp_batch.cc). Returns this rank's problem.
std::string CompareContextParallelLogits(DpRun& run);

/// The enabled dimensions the parameters are replicated over and their gradients summed
/// over: dp_replicate, dp_shard and cp (torchtitan's dp_cp; at least one) (dp_groups.cc).
std::vector<Mesh::Dim> DataDims(const DpRun& run);
/// Those the optimizer state is sharded over: dp_shard and cp (torchtitan's dp_shard_cp, the
/// mesh FSDP shards over) (dp_groups.cc).
std::vector<Mesh::Dim> ShardDims(const DpRun& run);

/// Joins the data-parallel groups (flattened, then dp_replicate and dp_shard apart when both
/// are enabled), the cp, EP and tp groups and, for dp x tp, takes the family's plan (or marks
/// run.by_code for a family that shards by its own code). Every rank joins in the same order,
/// so no group waits on a rank that is joining another (dp_groups.cc). Returns this rank's
/// problem; `blocked` when the cell cannot run this layout whatever happens.
std::string FormGroups(DpRun& run, bool& blocked);

/// Builds and loads this rank's replica (the full model, or its tp shard through the plan) on
/// every rank and the control on rank 0 (dp_parity.cc). Returns this rank's problem.
std::string BuildReplicas(DpRun& run);

/// A family that shards by its own code, under ep > 1, before ShardByCode: the experts its
/// loaded replica has, from its MoE blocks (CausalLM::ExpertTokenCounts). Returns the problem,
/// `blocked` set, when it has none or ep does not divide them; "" otherwise (dp_parity.cc).
std::string ExpertsToSplit(DpRun& run, bool& blocked);

/// A family that shards by its own code: the loaded replica sharded over its tp group, its
/// experts over the EP groups, and by the family's own data parallelism when it has one, by
/// ModelFamily::ShardLoaded, a collective over the world (dp_parity.cc). Returns this rank's
/// problem.
std::string ShardByCode(DpRun& run);

/// After the replicas are built (and sharded): run.params, which of them are experts (ep, the
/// C++ lane's plans), and, on rank 0, the control's parameters, paired by position
/// (dp_parity.cc). Returns this rank's problem.
std::string IndexParameters(DpRun& run);

/// Before the steps: every rank's parameters gathered (Full) and, on rank 0, named as the
/// checkpoint names them and compared with the control's save bit for bit, into
/// run.save_tensors / save_tensors_equal / save_problems (dp_save.cc). A collective over the
/// tp and EP groups. Returns this rank's problem (a gather that failed).
std::string CompareSave(DpRun& run);

/// The optimizer steps, each compared on rank 0 (dp_train.cc). Returns this rank's problem.
std::string Train(DpRun& run);

/// The full tensors of this rank's tp shards `local` (in run.params order): gathered over the
/// tp group and put together through the plan, then an expert parameter's experts gathered
/// over the EP group (along dim 0); `local` itself when tp and ep are 1. A collective over the
/// tp and EP groups. Throws std::runtime_error naming the parameter when a shard does not fit its
/// rule (dp_train.cc).
std::vector<torch::Tensor> Full(const DpRun& run, const std::vector<torch::Tensor>& local);

/// The global grad norm from this rank's gradients `local` (in run.params order), as a trainer
/// holding shards computes it: the expert parameters' squares summed over the EP group, with
/// the tp-sharded parameters' summed over the tp group, the tp-replicated ones counted once
/// (run.reduction's norm mutations change exactly that). A collective over the EP and tp groups.
double ShardedNorm(const DpRun& run, const std::vector<torch::Tensor>& local);

/// AdamW over this rank's slice of each parameter along dim 0, as FSDP2's fully_shard lays a
/// parameter out (Shard(0), torch.chunk's sizes: ceil(rows / S) rows per rank, the last ranks
/// holding fewer or none); a 0-dimensional parameter is held whole by every rank. After each
/// step the full parameters are put back together by an all-gather over the shard group
/// (dp_shard.cc).
class ShardedAdamW {
 public:
  /// `params`: this rank's full (or tp-shard) parameters, the same on every rank of `shard`.
  ShardedAdamW(const std::vector<torch::Tensor>& params, TpCommunicator& shard,
               UpstreamAdamW::Options options);
  /// One step: each parameter's .grad() (the reduced gradient; undefined counts as zeros) is
  /// cut to this rank's slice, the slice stepped, and every rank's slices gathered back into
  /// the parameter. A collective over the shard group.
  void Step();
  /// exp_avg and exp_avg_sq elements this rank holds (after the first step).
  int64_t StateElements() const;

 private:
  struct Slice {
    torch::Tensor param;   // the full parameter
    int64_t start = 0;     // first row of this rank's slice
    int64_t rows = 0;      // rows of this rank's slice (0 .. chunk)
    int64_t chunk = 0;     // rows per rank (ceil(rows / S)); 0 for a 0-dimensional parameter
    torch::Tensor master;  // this rank's slice (a view of param's rows), the tensor the optimizer steps
  };
  std::vector<Slice> slices_;
  TpCommunicator& comm_;
  std::unique_ptr<UpstreamAdamW> optimizer_;
};

}  // namespace gatehouse::worker::parallel
