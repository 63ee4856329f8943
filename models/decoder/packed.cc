// The decoder's packed forwards (model.h DecoderModel::ForwardPacked,
// ForwardPackedContextParallel): sequences back to back in one row, bounded by cu_seqlens
// (flash-attention's varlen convention), no attention across a bound; and the same packing
// split over a context-parallel group, Ulysses' exchanges inside attention (model.cc
// AttentionImpl::forward).
#include <map>
#include <vector>

#include "decoder/model.h"

namespace gatehouse::models {

torch::Tensor DecoderModel::ForwardPacked(const torch::Tensor& tokens,
                                          const torch::Tensor& positions,
                                          const torch::Tensor& cu_seqlens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == 1 && tokens.scalar_type() == torch::kLong,
              "packed: tokens must be int64 [1, T], got ", tokens.scalar_type(), " ",
              tokens.sizes());
  TORCH_CHECK(positions.sizes() == tokens.sizes() && positions.scalar_type() == torch::kLong,
              "packed: positions must be int64 with the shape of tokens ", tokens.sizes(),
              ", got ", positions.scalar_type(), " ", positions.sizes());
  torch::Tensor h = Embed(tokens);
  std::vector<RotaryTables> ropes;
  std::map<int64_t, torch::Tensor> masks;
  PackedTables(positions, cu_seqlens, h.scalar_type(), ropes, masks);
  return Run(std::move(h), ropes, masks, /*cache=*/nullptr);
}

torch::Tensor DecoderModel::ForwardPackedContextParallel(const torch::Tensor& tokens,
                                                         const torch::Tensor& positions,
                                                         const torch::Tensor& cu_seqlens,
                                                         const ContextParallel& cp) {
  TORCH_CHECK(cp.enabled() && cp.comm, "context parallel: cp=", cp.size, " needs a communicator");
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == 1 && tokens.scalar_type() == torch::kLong,
              "context parallel: tokens must be int64 [1, T / cp], got ", tokens.scalar_type(),
              " ", tokens.sizes());
  TORCH_CHECK(positions.sizes() == tokens.sizes() && positions.scalar_type() == torch::kLong,
              "context parallel: positions must be int64 with the shape of tokens ",
              tokens.sizes(), ", got ", positions.scalar_type(), " ", positions.sizes());
  // The masks and RoPE tables are the whole packing's: attention runs over every column.
  const torch::Tensor whole_positions = torch::cat(cp.comm->AllGather(positions), 1);
  torch::Tensor h = Embed(tokens);
  std::vector<RotaryTables> ropes;
  std::map<int64_t, torch::Tensor> masks;
  PackedTables(whole_positions, cu_seqlens, h.scalar_type(), ropes, masks);
  return Run(std::move(h), ropes, masks, /*cache=*/nullptr, &cp);
}

void DecoderModel::PackedTables(const torch::Tensor& positions, const torch::Tensor& cu_seqlens,
                                torch::ScalarType dtype, std::vector<RotaryTables>& ropes,
                                std::map<int64_t, torch::Tensor>& masks) const {
  const int64_t t = positions.size(1);
  const torch::Tensor bounds = cu_seqlens.to(torch::kCPU, torch::kLong).contiguous();
  TORCH_CHECK(bounds.dim() == 1 && bounds.size(0) >= 2,
              "packed: cu_seqlens must be [S + 1] with S >= 1, got ", cu_seqlens.sizes());
  const int64_t* b = bounds.data_ptr<int64_t>();
  const int64_t sequences = bounds.size(0) - 1;
  TORCH_CHECK(b[0] == 0 && b[sequences] == t, "packed: cu_seqlens must run from 0 to T = ", t,
              ", got ", b[0], " .. ", b[sequences]);
  for (int64_t s = 0; s < sequences; ++s) {
    TORCH_CHECK(b[s] <= b[s + 1], "packed: cu_seqlens must not decrease, got ", b[s], " then ",
                b[s + 1]);
  }
  const auto device = positions.device();
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  // The sequence of each column, and the block-diagonal causal mask [T, T]: column j is
  // visible to row i when both lie in one sequence, j <= i, and (with a window) i - j < window.
  const torch::Tensor lengths = (bounds.slice(0, 1) - bounds.slice(0, 0, sequences)).to(device);
  const torch::Tensor sequence =
      torch::repeat_interleave(torch::arange(sequences, long_opts), lengths);
  const torch::Tensor query = torch::arange(t, long_opts).unsqueeze(1);
  const torch::Tensor key = query.view({1, -1});
  const torch::Tensor same = sequence.unsqueeze(1) == sequence.unsqueeze(0);
  for (const auto& l : spec_.layers) {
    if (masks.count(l.sliding_window)) continue;
    torch::Tensor mask = same.logical_and(key <= query);
    if (l.sliding_window > 0) mask = mask.logical_and(key > query - l.sliding_window);
    masks.emplace(l.sliding_window, mask);
  }
  ropes.reserve(spec_.ropes.size());
  for (const auto& r : spec_.ropes) {
    if (r.rope_type != "dynamic") {
      auto inv_freq = RopeInverseFrequencies(r, spec_.head_dim, spec_.max_position_embeddings,
                                             /*seq_len=*/0, device);
      ropes.push_back(RopeTables(positions, inv_freq, dtype));
      continue;
    }
    // Dynamic NTK scaling depends on the sequence's own length: each sequence gets the tables
    // its own forward would (the largest of its positions + 1, as Forward).
    std::vector<torch::Tensor> cos, sin;
    for (int64_t s = 0; s < sequences; ++s) {
      if (b[s] == b[s + 1]) continue;
      const torch::Tensor p = positions.slice(1, b[s], b[s + 1]);
      auto inv_freq = RopeInverseFrequencies(r, spec_.head_dim, spec_.max_position_embeddings,
                                             p.max().item<int64_t>() + 1, device);
      RotaryTables part = RopeTables(p, inv_freq, dtype);
      cos.push_back(part.cos);
      sin.push_back(part.sin);
    }
    ropes.push_back({torch::cat(cos, 1), torch::cat(sin, 1)});
  }
}

}  // namespace gatehouse::models
