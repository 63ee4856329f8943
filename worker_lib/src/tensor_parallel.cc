// Tensor-parallel mappings and plans (tensor_parallel.h).
#include "gatehouse/worker/tensor_parallel.h"

#include <algorithm>
#include <cctype>
#include <numeric>

namespace gatehouse::worker {

std::function<void()> TpCommunicator::Send(const torch::Tensor& t, int64_t dst, int64_t tag) {
  (void)t;
  TORCH_CHECK(false, "this communicator has no point-to-point send (to rank ", dst, ", tag ", tag, ")");
}

void TpCommunicator::Recv(torch::Tensor& t, int64_t src, int64_t tag) {
  (void)t;
  TORCH_CHECK(false, "this communicator has no point-to-point receive (from rank ", src, ", tag ", tag, ")");
}
std::vector<torch::Tensor> TpCommunicator::AllToAll(const std::vector<torch::Tensor>& send) {
  const int64_t size = world_size();
  TORCH_CHECK(static_cast<int64_t>(send.size()) == size, "all-to-all: ", send.size(),
              " tensors to send over a group of ", size);
  // Every rank's row counts, then every rank's sends padded to the largest and gathered.
  torch::Tensor rows = torch::empty({size}, torch::kLong);
  for (int64_t r = 0; r < size; ++r) rows[r] = send[static_cast<size_t>(r)].size(0);
  const std::vector<torch::Tensor> all_rows = AllGather(rows);
  int64_t widest = 0;
  for (const torch::Tensor& t : all_rows) widest = std::max(widest, t.max().item<int64_t>());
  const torch::Tensor& first = send.front();
  std::vector<int64_t> padded_shape = first.sizes().vec();
  padded_shape[0] = widest;
  padded_shape.insert(padded_shape.begin(), size);
  torch::Tensor padded = torch::zeros(padded_shape, first.options());
  for (int64_t r = 0; r < size; ++r) {
    const torch::Tensor& t = send[static_cast<size_t>(r)];
    if (t.size(0) > 0) padded[r].slice(0, 0, t.size(0)).copy_(t);
  }
  const std::vector<torch::Tensor> gathered = AllGather(padded);
  std::vector<torch::Tensor> received;
  for (int64_t r = 0; r < size; ++r) {
    const int64_t n = all_rows[static_cast<size_t>(r)][rank()].item<int64_t>();
    received.push_back(gathered[static_cast<size_t>(r)][rank()].slice(0, 0, n).clone());
  }
  return received;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Forward: sum over ranks; backward: identity.
struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, TpCommunicator* comm) {
    torch::Tensor sum = x.clone(at::MemoryFormat::Contiguous);
    comm->AllReduceSum(sum);
    return sum;
  }
  static variable_list backward(AutogradContext*, variable_list grad) {
    return {grad[0], torch::Tensor()};
  }
};

/// Forward: all-gather along the last dimension; backward: this rank's slice.
struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TpCommunicator* comm) {
    ctx->saved_data["rank"] = comm->rank();
    ctx->saved_data["size"] = comm->world_size();
    return torch::cat(comm->AllGather(x.contiguous()), -1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const int64_t rank = ctx->saved_data["rank"].toInt();
    const int64_t size = ctx->saved_data["size"].toInt();
    return {grad[0].chunk(size, -1)[rank].contiguous(), torch::Tensor()};
  }
};

/// Forward: rows sent by count to each rank; backward: the gradient rows sent back.
struct AllToAllRowsFn : torch::autograd::Function<AllToAllRowsFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const std::vector<int64_t>& send_rows,
                               const std::vector<int64_t>& recv_rows, TpCommunicator* comm) {
    ctx->saved_data["send"] = c10::IValue(send_rows);
    ctx->saved_data["recv"] = c10::IValue(recv_rows);
    ctx->saved_data["comm"] = c10::IValue(reinterpret_cast<int64_t>(comm));
    return Exchange(x, send_rows, recv_rows, comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto* comm = reinterpret_cast<TpCommunicator*>(ctx->saved_data["comm"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    return {Exchange(grad[0], recv, send, comm), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
  static torch::Tensor Exchange(const torch::Tensor& x, const std::vector<int64_t>& send_rows,
                                const std::vector<int64_t>& recv_rows, TpCommunicator* comm) {
    std::vector<torch::Tensor> parts;
    int64_t start = 0;
    const torch::Tensor c = x.contiguous();
    for (int64_t n : send_rows) {
      parts.push_back(c.slice(0, start, start + n));
      start += n;
    }
    TORCH_CHECK(start == x.size(0), "all-to-all: send rows sum to ", start, " but x has ",
                x.size(0), " rows");
    std::vector<torch::Tensor> got = comm->AllToAll(parts);
    TORCH_CHECK(got.size() == send_rows.size(), "all-to-all over ", comm->world_size(),
                " ranks returned ", got.size(), " parts for ", parts.size(), " sent");
    for (size_t r = 0; r < got.size(); ++r) {
      TORCH_CHECK(got[r].size(0) == recv_rows[r], "all-to-all: expected ", recv_rows[r],
                  " rows from rank ", r, ", got ", got[r].size(0));
    }
    return torch::cat(got, 0);
  }
};

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// The blocks of `rule` along a dimension of `extent` elements, each checked divisible by size.
Result<std::vector<int64_t>> Blocks(const ShardRule& rule, int64_t extent, int64_t size) {
  std::vector<int64_t> blocks = rule.blocks.empty() ? std::vector<int64_t>{extent} : rule.blocks;
  const int64_t total = std::accumulate(blocks.begin(), blocks.end(), int64_t{0});
  if (total != extent) {
    return Status::InvalidArgument("TP plan rule '" + rule.pattern + "': blocks sum to " +
                                   std::to_string(total) + " but dim " + std::to_string(rule.dim) +
                                   " has " + std::to_string(extent));
  }
  for (int64_t b : blocks) {
    if (b % size != 0) {
      return Status::InvalidArgument(
          "TP plan rule '" + rule.pattern + "': dim " + std::to_string(rule.dim) + " (" +
          std::string(ShardStyleName(rule.style)) + ") " +
          (rule.blocks.empty() ? "of size " : "has a block of size ") + std::to_string(b) +
          ", not divisible by the tensor-parallel size " + std::to_string(size));
    }
  }
  return blocks;
}

Result<int64_t> SplitDim(const ShardRule& rule, int64_t rank_of_tensor, int64_t leading) {
  const int64_t d = rule.dim - leading;
  if (d < 0 || d >= rank_of_tensor) {
    return Status::InvalidArgument("TP plan rule '" + rule.pattern + "': dim " +
                                   std::to_string(rule.dim) + " does not exist in a " +
                                   std::to_string(rank_of_tensor + leading) + "-d parameter");
  }
  return d;
}

}  // namespace

torch::Tensor CopyToTensorParallelRegion(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.enabled() || !x.requires_grad() || !torch::GradMode::is_enabled()) return x;
  torch::Tensor y = x.view_as(x);
  std::shared_ptr<TpCommunicator> comm = tp.comm;
  y.register_hook([comm](torch::Tensor grad) {
    torch::Tensor sum = grad.clone(at::MemoryFormat::Contiguous);
    comm->AllReduceSum(sum);
    return sum;
  });
  return y;
}

torch::Tensor AllToAllRows(const torch::Tensor& x, const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows, const ExpertParallel& ep) {
  if (!ep.enabled()) return x;
  TORCH_CHECK(static_cast<int64_t>(send_rows.size()) == ep.size &&
                  static_cast<int64_t>(recv_rows.size()) == ep.size,
              "all-to-all over ", ep.size, " expert-parallel ranks needs as many row counts, got ",
              send_rows.size(), " to send and ", recv_rows.size(), " to receive");
  return AllToAllRowsFn::apply(x, send_rows, recv_rows, ep.comm.get());
}

torch::Tensor SequenceToHeads(const torch::Tensor& x, const ContextParallel& cp) {
  if (!cp.enabled()) return x;
  TORCH_CHECK(x.dim() == 4 && x.size(2) % cp.size == 0, "context parallel: expected [B, T / ",
              cp.size, ", H, D] with H divisible by ", cp.size, ", got ", x.sizes());
  const int64_t b = x.size(0), t = x.size(1), heads = x.size(2) / cp.size, d = x.size(3);
  // Rows grouped by destination: rank j gets heads [j H / size, (j + 1) H / size).
  const torch::Tensor rows =
      x.view({b, t, cp.size, heads, d}).permute({2, 0, 1, 3, 4}).contiguous().view({-1, d});
  const std::vector<int64_t> counts(static_cast<size_t>(cp.size), b * t * heads);
  const torch::Tensor got = AllToAllRowsFn::apply(rows, counts, counts, cp.comm.get());
  // From rank r: its columns, in rank order (the ranks hold the sequence in order).
  return got.view({cp.size, b, t, heads, d}).permute({1, 0, 2, 3, 4}).reshape({b, cp.size * t, heads, d});
}

torch::Tensor HeadsToSequence(const torch::Tensor& x, const ContextParallel& cp) {
  if (!cp.enabled()) return x;
  TORCH_CHECK(x.dim() == 4 && x.size(1) % cp.size == 0, "context parallel: expected [B, T, H / ",
              cp.size, ", D] with T divisible by ", cp.size, ", got ", x.sizes());
  const int64_t b = x.size(0), t = x.size(1) / cp.size, heads = x.size(2), d = x.size(3);
  // Rows grouped by destination: rank j gets its own columns.
  const torch::Tensor rows =
      x.view({b, cp.size, t, heads, d}).permute({1, 0, 2, 3, 4}).contiguous().view({-1, d});
  const std::vector<int64_t> counts(static_cast<size_t>(cp.size), b * t * heads);
  const torch::Tensor got = AllToAllRowsFn::apply(rows, counts, counts, cp.comm.get());
  // From rank r: heads [r H / size, (r + 1) H / size) of this rank's columns.
  return got.view({cp.size, b, t, heads, d}).permute({1, 2, 0, 3, 4}).reshape({b, t, cp.size * heads, d});
}

torch::Tensor ReduceFromTensorParallelRegion(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.enabled()) return x;
  return ReduceFromRegion::apply(x, tp.comm.get());
}

torch::Tensor GatherFromTensorParallelRegion(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.enabled()) return x;
  return GatherFromRegion::apply(x, tp.comm.get());
}

std::string_view ShardStyleName(ShardStyle style) {
  switch (style) {
    case ShardStyle::kReplicated: return "replicated";
    case ShardStyle::kColwise: return "colwise";
    case ShardStyle::kRowwise: return "rowwise";
    case ShardStyle::kVocab: return "vocab";
  }
  return "?";
}

bool MatchesParamPattern(std::string_view pattern, std::string_view name) {
  size_t p = 0, n = 0;
  while (p < pattern.size()) {
    if (pattern.compare(p, 3, "{i}") == 0) {
      const size_t start = n;
      while (n < name.size() && std::isdigit(static_cast<unsigned char>(name[n]))) ++n;
      if (n == start) return false;
      p += 3;
      continue;
    }
    if (n >= name.size() || pattern[p] != name[n]) return false;
    ++p;
    ++n;
  }
  return n == name.size();
}

const ShardRule* TpPlan::Find(std::string_view param) const {
  for (const ShardRule& r : rules_) {
    if (MatchesParamPattern(r.pattern, param)) return &r;
  }
  return nullptr;
}

Result<std::vector<int64_t>> TpPlan::LocalShape(const ShardRule& rule, std::vector<int64_t> full,
                                                int64_t leading) const {
  if (rule.style == ShardStyle::kReplicated || size_ == 1) return full;
  GH_ASSIGN_OR_RETURN(int64_t d, SplitDim(rule, static_cast<int64_t>(full.size()), leading));
  GH_ASSIGN_OR_RETURN(std::vector<int64_t> blocks, Blocks(rule, full[d], size_));
  (void)blocks;
  full[d] /= size_;
  return full;
}

Result<torch::Tensor> TpPlan::Shard(const ShardRule& rule, const torch::Tensor& full, int64_t rank,
                                    int64_t leading) const {
  if (rule.style == ShardStyle::kReplicated || size_ == 1) return full.contiguous();
  GH_ASSIGN_OR_RETURN(int64_t d, SplitDim(rule, full.dim(), leading));
  GH_ASSIGN_OR_RETURN(std::vector<int64_t> blocks, Blocks(rule, full.size(d), size_));
  std::vector<torch::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t b : blocks) {
    const int64_t piece = b / size_;
    pieces.push_back(full.narrow(d, offset + rank * piece, piece));
    offset += b;
  }
  return torch::cat(pieces, d).contiguous();
}

Result<torch::Tensor> TpPlan::Unshard(const ShardRule& rule, const std::vector<torch::Tensor>& shards,
                                      int64_t leading) const {
  if (static_cast<int64_t>(shards.size()) != size_ || shards.empty()) {
    return Status::InvalidArgument("TP plan rule '" + rule.pattern + "': " +
                                   std::to_string(shards.size()) + " shard(s) for size " +
                                   std::to_string(size_));
  }
  if (rule.style == ShardStyle::kReplicated || size_ == 1) return shards[0];
  const auto local = shards[0].sizes().vec();
  for (const auto& s : shards) {
    if (s.sizes().vec() != local) {
      return Status::InvalidArgument("TP plan rule '" + rule.pattern + "': shards of shapes " +
                                     ShapeText(local) + " and " + ShapeText(s.sizes().vec()));
    }
  }
  GH_ASSIGN_OR_RETURN(int64_t d, SplitDim(rule, shards[0].dim(), leading));
  std::vector<int64_t> full_blocks;
  if (rule.blocks.empty()) {
    full_blocks = {local[d] * size_};
  } else {
    full_blocks = rule.blocks;
  }
  GH_ASSIGN_OR_RETURN(std::vector<int64_t> blocks,
                      Blocks(rule, std::accumulate(full_blocks.begin(), full_blocks.end(), int64_t{0}),
                             size_));
  if (std::accumulate(blocks.begin(), blocks.end(), int64_t{0}) != local[d] * size_) {
    return Status::InvalidArgument("TP plan rule '" + rule.pattern + "': shard shape " +
                                   ShapeText(local) + " does not fit the blocks");
  }
  std::vector<torch::Tensor> parts;
  int64_t offset = 0;  // within a shard
  for (int64_t b : blocks) {
    const int64_t piece = b / size_;
    for (const auto& s : shards) parts.push_back(s.narrow(d, offset, piece));
    offset += piece;
  }
  return torch::cat(parts, d);
}

nlohmann::json TpPlan::ToJson() const {
  nlohmann::json rules = nlohmann::json::array();
  for (const ShardRule& r : rules_) {
    nlohmann::json j{{"pattern", r.pattern}, {"style", ShardStyleName(r.style)}};
    if (r.style != ShardStyle::kReplicated) j["dim"] = r.dim;
    if (!r.blocks.empty()) j["blocks"] = r.blocks;
    if (!r.note.empty()) j["note"] = r.note;
    rules.push_back(std::move(j));
  }
  return {{"tp", size_}, {"rules", std::move(rules)}};
}

}  // namespace gatehouse::worker
