// The optimizer of the data-parallel check's dp_shard dimension (dp_run.h ShardedAdamW): each
// rank steps its own dim-0 slice of every parameter, as FSDP2 shards a parameter and its
// optimizer state, and the slices are gathered back into the full parameters after each step.
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
    if (p.dim() == 0) {
      s.master = p.detach().clone();
    } else {
      const int64_t rows = p.size(0);
      s.chunk = (rows + ranks - 1) / ranks;
      s.start = std::min(rows, me * s.chunk);
      s.rows = std::min(rows, s.start + s.chunk) - s.start;
      s.master = p.detach().narrow(0, s.start, s.rows).clone();
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
    s.master.mutable_grad() = s.chunk == 0 ? grad.clone() : grad.narrow(0, s.start, s.rows).clone();
  }
  optimizer_->Step();
  for (Slice& s : slices_) {
    if (s.chunk == 0) {
      s.param.copy_(s.master);
      continue;
    }
    // Every rank sends chunk rows (its slice, padded), as FSDP2 pads dim 0 for its all-gather.
    std::vector<int64_t> shape = s.param.sizes().vec();
    shape[0] = s.chunk;
    torch::Tensor padded = torch::zeros(shape, s.param.options());
    padded.narrow(0, 0, s.rows).copy_(s.master);
    const torch::Tensor whole = torch::cat(comm_.AllGather(padded), 0);
    s.param.copy_(whole.narrow(0, 0, s.param.size(0)));
  }
}

int64_t ShardedAdamW::StateElements() const {
  int64_t n = 0;
  for (const Slice& s : slices_) n += 2 * s.master.numel();
  return n;
}

}  // namespace gatehouse::worker::parallel
