// The device mesh of a parallel layout: how a cell's worker ranks are arranged along the
// parallel dimensions, which ranks form each dimension's group, and where a rank sits.
//
// Names and order follow torchtitan's ParallelDims (torchtitan/distributed/parallel_dims.py),
// which AReaL's Archon shares: the world is laid out row-major over
//     pp x dp_replicate x dp_shard x cp x tp        (tp varies fastest)
// and world_size is their product. Expert parallelism adds no ranks: the ep ranks that share
// one MoE layer's experts are borrowed from the data-parallel shard and context dimensions
// (dp_shard x cp) when the experts are tensor-parallel like the dense layers (etp = tp), or
// from dp_shard x cp x tp when they are not (etp = 1); ep takes the innermost ranks of that
// run. Torch-free: the controller validates a topology with it, the worker forms its groups.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gatehouse {

/// The degree of each parallel dimension. Every field is at least 1.
struct MeshShape {
  int64_t pp = 1;            // pipeline stages
  int64_t dp_replicate = 1;  // data-parallel replicas (DDP; HSDP's replicate dimension)
  int64_t dp_shard = 1;      // data-parallel shards (FSDP; HSDP's shard dimension)
  int64_t cp = 1;            // context parallelism (each rank holds a part of the sequence)
  int64_t tp = 1;            // tensor parallelism
  int64_t ep = 1;            // expert parallelism (borrowed ranks, see above)
  int64_t etp = 1;           // tensor parallelism inside the experts: 1 or tp (when ep > 1)
  bool operator==(const MeshShape&) const = default;
};

/// A validated MeshShape with the arithmetic of ranks, coordinates and groups.
class Mesh {
 public:
  /// The dimensions that hold ranks, in rank order (tp fastest).
  enum class Dim { kPp = 0, kDpReplicate, kDpShard, kCp, kTp };
  static constexpr int kDims = 5;
  using Coordinates = std::array<int64_t, kDims>;  // indexed by Dim

  /// Validates `shape`: every degree in 1..max_world_size, their product (the world size) at
  /// most max_world_size, and, when ep > 1, etp is 1 or tp, ep a multiple of cp (etp = tp) or
  /// of cp x tp (etp = 1), and ep dividing dp_shard x cp (x tp). Errors: INVALID_ARGUMENT
  /// naming the field as `field_prefix` + its name ("topology.ep") and the values.
  static Result<Mesh> Make(const MeshShape& shape, int64_t max_world_size,
                           std::string_view field_prefix = "topology.");

  const MeshShape& shape() const { return shape_; }
  int64_t world_size() const { return world_size_; }
  int64_t Size(Dim d) const { return sizes_[static_cast<int>(d)]; }
  /// True when the dimension has more than one rank (ep: more than one expert group member).
  bool Enabled(Dim d) const { return Size(d) > 1; }
  bool ExpertParallel() const { return shape_.ep > 1; }

  /// rank (0..world_size-1) -> its coordinate along each dimension, and back.
  Coordinates CoordinatesOf(int64_t rank) const;
  int64_t RankOf(const Coordinates& c) const;

  /// The ranks that share `rank`'s coordinates on every dimension but `dims`, ordered
  /// row-major over `dims` (in rank order): the group of one dimension ({kTp}: its TP group,
  /// the TP rank being its index in it), or of several flattened into one ({kDpShard, kCp}:
  /// torchtitan's dp_shard_cp, over which FSDP shards). Empty dims: {rank}.
  std::vector<int64_t> GroupOf(int64_t rank, const std::vector<Dim>& dims) const;
  /// Every group along `dims`: a partition of the world, ordered by smallest rank. Process
  /// groups are created collectively over the world, so every rank creates all of them, in
  /// this order.
  std::vector<std::vector<int64_t>> GroupsAlong(const std::vector<Dim>& dims) const;

  /// The ranks that share `rank`'s MoE experts (its EP group, ep ranks in order; the EP rank
  /// is the index in it): the ep innermost ranks of the dp_shard x cp (etp = tp) or
  /// dp_shard x cp x tp (etp = 1) run that hold `rank`, as torchtitan's ep mesh dimension.
  /// {rank} when ep is 1.
  std::vector<int64_t> ExpertGroupOf(int64_t rank) const;
  /// Every EP group, a partition of the world ordered by smallest rank.
  std::vector<std::vector<int64_t>> ExpertGroups() const;

  /// "pp=2 dp_replicate=1 dp_shard=2 cp=1 tp=2 ep=1" (ep's etp when ep > 1), every dimension.
  std::string ToString() const;
  /// The enabled dimensions' names, in rank order, then "ep" when enabled: {"dp_shard", "tp"}.
  std::vector<std::string> EnabledNames() const;

  static std::string_view DimName(Dim d);

 private:
  explicit Mesh(const MeshShape& shape);
  /// The dims expert groups are carved from, in rank order.
  std::vector<Dim> ExpertRun() const;

  MeshShape shape_;
  std::array<int64_t, kDims> sizes_{};
  std::array<int64_t, kDims> strides_{};
  int64_t world_size_ = 1;
};

}  // namespace gatehouse
