#include "common/mesh.h"

#include <algorithm>

namespace gatehouse {
namespace {

std::string Field(std::string_view prefix, std::string_view name) {
  return "field '" + std::string(prefix) + std::string(name) + "'";
}

}  // namespace

std::string_view Mesh::DimName(Dim d) {
  switch (d) {
    case Dim::kPp: return "pp";
    case Dim::kDpReplicate: return "dp_replicate";
    case Dim::kDpShard: return "dp_shard";
    case Dim::kCp: return "cp";
    case Dim::kTp: return "tp";
  }
  return "?";
}

Mesh::Mesh(const MeshShape& shape)
    : shape_(shape),
      sizes_{shape.pp, shape.dp_replicate, shape.dp_shard, shape.cp, shape.tp} {
  int64_t stride = 1;
  for (int d = kDims - 1; d >= 0; --d) {
    strides_[d] = stride;
    stride *= sizes_[d];
  }
  world_size_ = stride;
}

Result<Mesh> Mesh::Make(const MeshShape& s, int64_t max_world_size, std::string_view prefix) {
  const std::pair<const char*, int64_t> degrees[] = {
      {"pp", s.pp}, {"dp_replicate", s.dp_replicate}, {"dp_shard", s.dp_shard}, {"cp", s.cp},
      {"tp", s.tp}, {"ep", s.ep},                     {"etp", s.etp}};
  for (const auto& [name, v] : degrees) {
    if (v < 1 || v > max_world_size) {
      return Status::InvalidArgument(Field(prefix, name) + ": expected a degree from 1 to " +
                                     std::to_string(max_world_size) + ", got " +
                                     std::to_string(v));
    }
  }
  // Each factor is at most max_world_size (<= 2^31), so a running product checked at every
  // step cannot overflow int64.
  int64_t world = 1;
  for (int64_t v : {s.pp, s.dp_replicate, s.dp_shard, s.cp, s.tp}) {
    world *= v;
    if (world > max_world_size) {
      return Status::InvalidArgument(
          "topology: pp x dp_replicate x dp_shard x cp x tp = " +
          std::to_string(s.pp) + " x " + std::to_string(s.dp_replicate) + " x " +
          std::to_string(s.dp_shard) + " x " + std::to_string(s.cp) + " x " + std::to_string(s.tp) +
          " is more than " + std::to_string(max_world_size) + " worker ranks");
    }
  }
  if (s.ep == 1) {
    if (s.etp != 1) {
      return Status::InvalidArgument(Field(prefix, "etp") + ": " + std::to_string(s.etp) +
                                     " without expert parallelism (ep is 1); leave it at 1");
    }
    return Mesh(s);
  }
  if (s.etp != 1 && s.etp != s.tp) {
    return Status::InvalidArgument(Field(prefix, "etp") + ": " + std::to_string(s.etp) +
                                   " must be 1 (experts not tensor-parallel) or tp (" +
                                   std::to_string(s.tp) + ")");
  }
  // ep borrows all of cp (and tp when etp = 1) and part of dp_shard: torchtitan's rule.
  const bool experts_tp = s.etp == s.tp;
  const int64_t must_divide = experts_tp ? s.cp : s.cp * s.tp;
  const int64_t pool = s.dp_shard * must_divide;
  const std::string pool_text = experts_tp ? "dp_shard x cp = " : "dp_shard x cp x tp = ";
  if (s.ep % must_divide != 0 || pool % s.ep != 0) {
    return Status::InvalidArgument(
        Field(prefix, "ep") + ": " + std::to_string(s.ep) +
        " ranks must be borrowed from " + pool_text + std::to_string(pool) +
        (experts_tp ? "" : " (etp = 1)") + ": ep must divide it and be a multiple of " +
        (experts_tp ? "cp (" : "cp x tp (") + std::to_string(must_divide) + ")");
  }
  return Mesh(s);
}

Mesh::Coordinates Mesh::CoordinatesOf(int64_t rank) const {
  Coordinates c{};
  for (int d = 0; d < kDims; ++d) c[d] = (rank / strides_[d]) % sizes_[d];
  return c;
}

int64_t Mesh::RankOf(const Coordinates& c) const {
  int64_t rank = 0;
  for (int d = 0; d < kDims; ++d) rank += c[d] * strides_[d];
  return rank;
}

std::vector<int64_t> Mesh::GroupOf(int64_t rank, const std::vector<Dim>& dims) const {
  std::vector<Dim> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  Coordinates c = CoordinatesOf(rank);
  for (Dim d : sorted) c[static_cast<int>(d)] = 0;
  std::vector<int64_t> ranks{RankOf(c)};
  // Row-major over the chosen dims: the last one (fastest in rank order) varies fastest.
  for (Dim d : sorted) {
    const int i = static_cast<int>(d);
    std::vector<int64_t> next;
    next.reserve(ranks.size() * static_cast<size_t>(sizes_[i]));
    for (int64_t base : ranks) {
      for (int64_t k = 0; k < sizes_[i]; ++k) next.push_back(base + k * strides_[i]);
    }
    ranks = std::move(next);
  }
  return ranks;
}

std::vector<std::vector<int64_t>> Mesh::GroupsAlong(const std::vector<Dim>& dims) const {
  std::vector<std::vector<int64_t>> groups;
  std::vector<bool> placed(static_cast<size_t>(world_size_), false);
  for (int64_t r = 0; r < world_size_; ++r) {
    if (placed[static_cast<size_t>(r)]) continue;
    groups.push_back(GroupOf(r, dims));
    for (int64_t member : groups.back()) placed[static_cast<size_t>(member)] = true;
  }
  return groups;
}

std::vector<Mesh::Dim> Mesh::ExpertRun() const {
  if (shape_.etp == shape_.tp) return {Dim::kDpShard, Dim::kCp};
  return {Dim::kDpShard, Dim::kCp, Dim::kTp};
}

std::vector<int64_t> Mesh::ExpertGroupOf(int64_t rank) const {
  if (shape_.ep == 1) return {rank};
  // The run's ranks in row-major order; `rank`'s block of ep consecutive entries is its group
  // (ep is the run's innermost part: torchtitan unflattens the run as dp_shard_in_ep x ep).
  const std::vector<int64_t> run = GroupOf(rank, ExpertRun());
  const auto at = std::find(run.begin(), run.end(), rank) - run.begin();
  const auto first = at / shape_.ep * shape_.ep;
  return {run.begin() + first, run.begin() + first + shape_.ep};
}

std::vector<std::vector<int64_t>> Mesh::ExpertGroups() const {
  std::vector<std::vector<int64_t>> groups;
  std::vector<bool> placed(static_cast<size_t>(world_size_), false);
  for (int64_t r = 0; r < world_size_; ++r) {
    if (placed[static_cast<size_t>(r)]) continue;
    groups.push_back(ExpertGroupOf(r));
    for (int64_t member : groups.back()) placed[static_cast<size_t>(member)] = true;
  }
  return groups;
}

std::string Mesh::ToString() const {
  std::string out;
  for (int d = 0; d < kDims; ++d) {
    out += (d ? " " : "") + std::string(DimName(static_cast<Dim>(d))) + "=" +
           std::to_string(sizes_[d]);
  }
  out += " ep=" + std::to_string(shape_.ep);
  if (shape_.ep > 1) out += " etp=" + std::to_string(shape_.etp);
  return out;
}

std::vector<std::string> Mesh::EnabledNames() const {
  std::vector<std::string> names;
  for (int d = 0; d < kDims; ++d) {
    if (sizes_[d] > 1) names.emplace_back(DimName(static_cast<Dim>(d)));
  }
  if (shape_.ep > 1) names.emplace_back("ep");
  return names;
}

}  // namespace gatehouse
