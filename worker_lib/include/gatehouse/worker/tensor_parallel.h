// Tensor parallelism for model families (issue 4): the group a model is built for, the
// autograd-aware mappings between replicated and sharded activations, and the TP plan as data.
//
// Semantics follow Megatron-LM's tensor-parallel layers (megatron/core/tensor_parallel/
// layers.py, mappings.py) and torchtitan's plans (ColwiseParallel / RowwiseParallel keyed by
// module path):
//   column-parallel linear  W [out, in] split along out (dim 0); the input is replicated, the
//                           output stays sharded (heads, intermediate features);
//   row-parallel linear     W [out, in] split along in (dim 1); partial outputs are summed over
//                           the ranks (all-reduce), then the bias (replicated) is added once;
//   vocabulary-parallel     embedding rows / lm_head rows split along the vocabulary; lookups
//                           outside a rank's range give 0 and are summed; logits are gathered.
// The collectives are c10d's (distributed.h); nothing here talks to the network itself.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gatehouse::worker {

/// The collectives tensor-parallel modules need. Implementations wrap a c10d process group
/// (MakeC10dCommunicator in distributed.h); tests may use their own. Collectives block until
/// every rank of the group took part and throw c10::Error when the group fails (a peer gone,
/// the group timeout).
class TpCommunicator {
 public:
  virtual ~TpCommunicator() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  /// Sums `t` over the ranks, in place (every rank ends with the sum).
  virtual void AllReduceSum(torch::Tensor& t) = 0;
  /// Every rank's `t` (same shape and dtype on every rank), in rank order.
  virtual std::vector<torch::Tensor> AllGather(const torch::Tensor& t) = 0;
  /// Point to point (pipeline stages): sends `t` to rank `dst` under `tag` without waiting
  /// for it to arrive, and returns the wait (call it before the communicator goes away). The
  /// default throws c10::Error: a communicator without point-to-point.
  virtual std::function<void()> Send(const torch::Tensor& t, int64_t dst, int64_t tag);
  /// Receives into `t` (the sender's shape and dtype) what rank `src` sent under `tag`,
  /// waiting for it. The default throws c10::Error.
  virtual void Recv(torch::Tensor& t, int64_t src, int64_t tag);
  /// All-to-all (expert-parallel dispatch and combine): `send[r]` goes to rank r; returns what
  /// each rank sent to this one, in rank order. Tensors agree on dtype and on every dimension
  /// but dim 0, which may differ per pair (0 included); every rank must pass world_size()
  /// tensors. The default goes through AllGather (every rank's sends padded to the largest);
  /// the c10d communicator calls the group's alltoall.
  virtual std::vector<torch::Tensor> AllToAll(const std::vector<torch::Tensor>& send);
};

/// Forms process groups over subsets of the world's ranks (a mesh dimension's groups:
/// common/mesh.h Mesh::GroupOf), sharing the world's rendezvous. Implementations:
/// distributed.h (c10d gloo and NCCL).
class SubgroupFactory {
 public:
  virtual ~SubgroupFactory() = default;
  /// Joins the group `name` of `ranks` (world ranks, ascending, holding this rank): this
  /// rank's index in `ranks` is its rank in the group. Every member calls it with the same
  /// name and ranks; ranks outside the group need not call. Blocks until every member joined.
  /// Errors: INVALID_ARGUMENT when `ranks` is empty, unsorted or lacks this rank; UNAVAILABLE
  /// naming the group when a member does not join in time.
  virtual Result<std::shared_ptr<TpCommunicator>> Join(const std::string& name,
                                                       const std::vector<int64_t>& ranks) = 0;
};

/// The tensor-parallel group a model is built for. size 1 (the default) is the plain model.
struct TensorParallel {
  int64_t rank = 0;
  int64_t size = 1;
  /// Required when size > 1.
  std::shared_ptr<TpCommunicator> comm;
  bool enabled() const { return size > 1; }
};

/// The expert-parallel group a MoE model is built for (common/mesh.h Mesh::ExpertGroupOf):
/// size ranks share each MoE layer's experts, rank r holding experts
/// [r * E / size, (r + 1) * E / size). size 1 (the default) holds every expert.
struct ExpertParallel {
  int64_t rank = 0;
  int64_t size = 1;
  /// Required when size > 1.
  std::shared_ptr<TpCommunicator> comm;
  bool enabled() const { return size > 1; }
};

/// The expert-parallel layout of the whole world, for a family that shards a loaded model by
/// its own code (ModelFamily::ShardLoaded): every EP group (common/mesh.h Mesh::ExpertGroups)
/// and every group of data-parallel ranks that hold the same experts (the experts' replicas,
/// whose expert gradients are summed), each a partition of the world, each group's ranks in
/// order (its EP rank or replica index). Both empty when ep is 1.
struct ExpertGroups {
  std::vector<std::vector<int64_t>> ep;
  std::vector<std::vector<int64_t>> replicas;
  bool enabled() const { return !ep.empty() && ep.front().size() > 1; }
};

/// The rows of `x` [N, ...] sent over the expert-parallel group: the first send_rows[0] rows
/// to rank 0, the next send_rows[1] to rank 1, ...; returns the rows received, recv_rows[r]
/// from rank r in rank order ([sum(recv_rows), ...]). Backward sends the gradient rows back
/// the same way reversed. send_rows and recv_rows have ep.size entries; send_rows sums to N,
/// and each rank's recv_rows[r] must equal rank r's send_rows[this rank]. A collective: every
/// rank of the group calls it together. (torchtitan's expert-parallel all_to_all_single
/// dispatch and combine.) Returns x when ep is not enabled.
torch::Tensor AllToAllRows(const torch::Tensor& x, const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows, const ExpertParallel& ep);

/// The context-parallel group a forward runs over (common/mesh.h's cp dimension): size ranks
/// each hold a contiguous part of one packed sequence, rank r the columns [r T / size,
/// (r + 1) T / size) of T. size 1 (the default) holds the whole sequence. The parameters are
/// the same on every rank; only the sequence is split.
struct ContextParallel {
  int64_t rank = 0;
  int64_t size = 1;
  /// Required when size > 1.
  std::shared_ptr<TpCommunicator> comm;
  bool enabled() const { return size > 1; }
};

/// Ulysses sequence parallelism's first exchange (DeepSpeed-Ulysses; Archon's Ulysses context
/// parallelism): `x` [B, T / size, H, D] (this rank's columns of every head) becomes [B, T,
/// H / size, D] (every column of heads [rank H / size, (rank + 1) H / size)), so attention
/// sees the whole sequence for a share of the heads. Backward is the inverse exchange. H must
/// divide by cp.size. A collective over cp.comm; returns x when cp is not enabled. Throws
/// c10::Error on a shape that does not split.
torch::Tensor SequenceToHeads(const torch::Tensor& x, const ContextParallel& cp);

/// The inverse of SequenceToHeads: [B, T, H / size, D] -> [B, T / size, H, D] (every head of
/// this rank's columns). A collective over cp.comm; returns x when cp is not enabled.
torch::Tensor HeadsToSequence(const torch::Tensor& x, const ContextParallel& cp);

/// Identity forward; the gradient is summed over the ranks backward. Put at the input of a
/// column-parallel region: every rank's partial gradient of a replicated activation adds up to
/// the full one. (Megatron: copy_to_tensor_model_parallel_region.) Returns x itself when TP is
/// off or x needs no gradient.
torch::Tensor CopyToTensorParallelRegion(const torch::Tensor& x, const TensorParallel& tp);

/// Sums x over the ranks forward (a new tensor); identity backward. Put at the output of a
/// row-parallel region. (Megatron: reduce_from_tensor_model_parallel_region.)
torch::Tensor ReduceFromTensorParallelRegion(const torch::Tensor& x, const TensorParallel& tp);

/// Concatenates every rank's x along the last dimension forward ([..., n] -> [..., n * size]);
/// backward keeps this rank's slice of the gradient. (Megatron:
/// gather_from_tensor_model_parallel_region.)
torch::Tensor GatherFromTensorParallelRegion(const torch::Tensor& x, const TensorParallel& tp);

/// How one parameter is laid out across the ranks.
enum class ShardStyle {
  kReplicated,  // every rank holds the whole tensor
  kColwise,     // split along `dim`, the output features of a column-parallel layer
  kRowwise,     // split along `dim`, the input features of a row-parallel layer
  kVocab,       // split along `dim` (0), the vocabulary rows of an embedding / lm_head
};
std::string_view ShardStyleName(ShardStyle style);

/// One row of a TP plan: which parameters it covers and how they are split.
struct ShardRule {
  /// Internal parameter name; "{i}" stands for a layer index (any run of digits), e.g.
  /// "layers.{i}.attention.wq.weight".
  std::string pattern;
  ShardStyle style = ShardStyle::kReplicated;
  /// The dimension that is split (ignored when replicated). For a stacked parameter (MoE
  /// experts [E, ...]) it counts the expert dimension: w1 [E, I, H] is split along dim 1.
  int64_t dim = 0;
  /// Sizes along `dim` of blocks that are split independently, for fused projections: each
  /// block is cut in `size` equal pieces and rank r holds piece r of every block, in block
  /// order (Phi-3 qkv_proj [q | k | v] -> {q_out, kv_out, kv_out}). Empty: one block.
  std::vector<int64_t> blocks;
  /// Why this layout (always set for replicated rules, e.g. "RMSNorm weight over hidden").
  std::string note;
};

/// A family's tensor-parallel plan: one rule per parameter pattern, for one TP size.
class TpPlan {
 public:
  TpPlan() = default;
  TpPlan(int64_t size, std::vector<ShardRule> rules) : size_(size), rules_(std::move(rules)) {}

  int64_t size() const { return size_; }
  const std::vector<ShardRule>& rules() const { return rules_; }
  /// The first rule whose pattern matches `param`, or nullptr.
  const ShardRule* Find(std::string_view param) const;

  /// The local shape on one rank of a tensor of `full` shape under `rule`. `leading` is 1 for
  /// one slice of a stacked parameter (its shape lacks the expert dimension), else 0.
  /// Errors: INVALID_ARGUMENT naming the pattern, the dimension and its size when it (or a
  /// block) is not divisible by the TP size, or the dimension does not exist.
  Result<std::vector<int64_t>> LocalShape(const ShardRule& rule, std::vector<int64_t> full,
                                          int64_t leading = 0) const;
  /// Rank `rank`'s shard of `full` (a contiguous copy). Errors as LocalShape.
  Result<torch::Tensor> Shard(const ShardRule& rule, const torch::Tensor& full, int64_t rank,
                              int64_t leading = 0) const;
  /// The full tensor from every rank's shard, in rank order (inverse of Shard). Errors:
  /// INVALID_ARGUMENT when the count or shapes do not fit the rule.
  Result<torch::Tensor> Unshard(const ShardRule& rule, const std::vector<torch::Tensor>& shards,
                                int64_t leading = 0) const;

  /// [{"pattern", "style", "dim", "blocks", "note"}...] for the evidence.
  nlohmann::json ToJson() const;

 private:
  int64_t size_ = 1;
  std::vector<ShardRule> rules_;
};

/// True when `name` matches `pattern` ("{i}" matches one or more digits).
bool MatchesParamPattern(std::string_view pattern, std::string_view name);

}  // namespace gatehouse::worker
