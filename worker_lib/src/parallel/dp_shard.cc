// The optimizer of the data-parallel check's dp_shard dimension (dp_run.h ShardedAdamW): each
// rank steps its own dim-0 slice of every parameter, as FSDP2 shards a parameter and its
// optimizer state, and the slices are gathered back into the full parameters after each step.
// A slice is a view of its parameter's rows, stepped in place: only the optimizer state is
// sharded (the gate's replicas hold each full parameter and gradient between steps).
#include <algorithm>

#include "dp_run.h"

namespace gatehouse::worker::parallel {

ShardedAdamW::ShardedAdamW(const std::vector<torch::Tensor>& params, TpCommunicator& shard,
                           UpstreamAdamW::Options options)
    : comm_(shard) {
  const int64_t ranks = shard.world_size();
  const int64_t me = shard.rank();
  std::vector<torch::Tensor> masters;
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& p : params) {
    Slice s;
    s.param = p;
    // The slice is a view of the parameter's own rows (no copy: the rank holds the full
    // parameter and its gradient between steps, and only the optimizer state is sharded).
    if (p.dim() == 0) {
      s.master = p.detach();
    } else {
      const int64_t rows = p.size(0);
      s.chunk = (rows + ranks - 1) / ranks;
      s.start = std::min(rows, me * s.chunk);
      s.rows = std::min(rows, s.start + s.chunk) - s.start;
      s.master = p.detach().narrow(0, s.start, s.rows);
    }
    s.master.set_requires_grad(true);
    masters.push_back(s.master);
    slices_.push_back(std::move(s));
  }
  optimizer_ = std::make_unique<UpstreamAdamW>(masters, options);
}

void ShardedAdamW::Step() {
  torch::NoGradGuard no_grad;
  for (Slice& s : slices_) {
    const torch::Tensor grad = s.param.grad().defined() ? s.param.grad() : torch::zeros_like(s.param);
    s.master.mutable_grad() = s.chunk == 0 ? grad : grad.narrow(0, s.start, s.rows);
  }
  optimizer_->Step();  // in place: this rank's rows of each parameter
  for (Slice& s : slices_) {
    s.master.mutable_grad() = torch::Tensor();  // a view of the parameter's gradient
    if (s.chunk == 0) continue;
    // Every rank sends chunk rows (its slice, padded when shorter), as FSDP2 pads dim 0 for
    // its all-gather; the other ranks' rows are copied into the parameter one part at a time
    // (no concatenated copy of the whole parameter).
    torch::Tensor sent = s.master;
    if (s.rows < s.chunk) {
      std::vector<int64_t> shape = s.param.sizes().vec();
      shape[0] = s.chunk;
      sent = torch::zeros(shape, s.param.options());
      sent.narrow(0, 0, s.rows).copy_(s.master);
    }
    const std::vector<torch::Tensor> parts = comm_.AllGather(sent);
    const int64_t rows = s.param.size(0);
    for (size_t r = 0; r < parts.size(); ++r) {
      const int64_t start = std::min(rows, static_cast<int64_t>(r) * s.chunk);
      const int64_t n = std::min(rows, start + s.chunk) - start;
      if (n > 0 && start != s.start) s.param.narrow(0, start, n).copy_(parts[r].narrow(0, 0, n));
    }
  }
}

int64_t ShardedAdamW::StateElements() const { return optimizer_->StateElements(); }

}  // namespace gatehouse::worker::parallel
