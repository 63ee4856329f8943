// The sparse MoE block (model.h MoEImpl): Qwen3MoeSparseMoeBlock's routing and experts, with
// tensor parallelism inside every expert and expert parallelism across ranks (tokens sent to
// the rank that holds their expert and back, AllToAllRows).
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "decoder/model.h"
#include "decoder/model_parts.h"

namespace gatehouse::models {

MoEImpl::MoEImpl(const DecoderSpec& spec, const TensorParallel& tp, const ParamOptions& po,
                 const ExpertParallel& ep)
    : tp_(tp),
      ep_(ep),
      num_experts_(spec.num_experts),
      top_k_(spec.num_experts_per_tok),
      norm_topk_prob_(spec.norm_topk_prob),
      act_(spec.hidden_act) {
  TORCH_CHECK(!ep.enabled() || (ep.comm && spec.num_experts % ep.size == 0),
              "expert parallelism over ", ep.size, " ranks needs a communicator and num_experts (",
              spec.num_experts, ") divisible by it");
  const int64_t e = spec.num_experts / ep.size, h = spec.hidden_size;
  const int64_t i = Local(spec.moe_intermediate_size, tp);
  router_ = register_module("router", Linear(h, spec.num_experts, false, po));
  auto experts = register_module("experts", std::make_shared<torch::nn::Module>());
  w1_ = experts->register_parameter("w1", NewParameter({e, i, h}, po, InitNormal));
  w2_ = experts->register_parameter("w2", NewParameter({e, h, i}, po, InitNormal));
  w3_ = experts->register_parameter("w3", NewParameter({e, i, h}, po, InitNormal));
}

torch::Tensor MoEImpl::Expert(int64_t e, const torch::Tensor& state) const {
  // One GEMM over gate and up together, as upstream's experts hold them fused (gate_up_proj
  // [E, 2I, H]): the input's gradient is then one bf16 accumulation over 2I, not two
  // rounded halves added (which moved bf16 gradient norms by ~0.7 %).
  auto gate_up = torch::linear(state, torch::cat({w1_[e], w3_[e]}, 0)).chunk(2, -1);
  auto hidden = Activate(act_, gate_up[0]) * gate_up[1];
  return torch::linear(hidden, w2_[e]);
}

void MoEImpl::CountRoutings(const torch::Tensor& logits, const torch::Tensor& top_i) {
  torch::NoGradGuard no_grad;
  // Accumulated where the routing lives: no host sync on the forward's path.
  if (!counts_.defined() || counts_.device() != top_i.device()) {
    counts_ = torch::zeros({num_experts_}, top_i.options());
    near_ties_ = torch::zeros({}, top_i.options());
  }
  counts_ += torch::bincount(top_i.reshape(-1), {}, num_experts_);
  if (top_k_ == num_experts_) return;  // every expert chosen: no (k+1)-th to tie with
  // Tokens whose k-th and (k+1)-th logits lie within 2 ulps of the logits' dtype (ties
  // included): where rounding upstream of the router decides the choice.
  const torch::Tensor top = std::get<0>(torch::topk(logits.to(torch::kFloat32), top_k_ + 1, -1));
  const torch::Tensor kth = top.select(-1, top_k_ - 1), next = top.select(-1, top_k_);
  const auto dtype = logits.scalar_type();
  const double ulp =
      dtype == torch::kBFloat16 ? static_cast<double>(std::numeric_limits<c10::BFloat16>::epsilon())
      : dtype == torch::kHalf   ? static_cast<double>(std::numeric_limits<c10::Half>::epsilon())
                                : static_cast<double>(std::numeric_limits<float>::epsilon());
  near_ties_ += (kth - next).le(torch::maximum(kth.abs(), next.abs()) * (2 * ulp)).sum();
}

torch::Tensor MoEImpl::counts() const {
  return counts_.defined() ? counts_.cpu() : torch::zeros({num_experts_}, torch::kLong);
}

int64_t MoEImpl::near_ties() const { return near_ties_.defined() ? near_ties_.item<int64_t>() : 0; }

void MoEImpl::ResetCounts() {
  counts_ = torch::Tensor();
  near_ties_ = torch::Tensor();
}

torch::Tensor MoEImpl::forward(const torch::Tensor& x) {
  const auto shape = x.sizes().vec();
  auto flat = x.reshape({-1, shape.back()});                       // [N, H]
  auto logits = router_(flat);                                      // [N, E]
  auto probs = torch::softmax(logits, -1, torch::kFloat32);
  auto [top_p, top_i] = torch::topk(probs, top_k_, -1);            // [N, k]
  if (norm_topk_prob_) top_p = top_p / top_p.sum(-1, /*keepdim=*/true);
  top_p = top_p.to(logits.scalar_type());
  CountRoutings(logits, top_i);
  // Under TP each rank computes every expert on its share of the intermediate features: the
  // experts' input and the routing weights are replicated (their gradients summed over the
  // ranks) and the weighted expert outputs are summed over the ranks at the end.
  top_p = worker::CopyToTensorParallelRegion(top_p, tp_);
  const torch::Tensor expert_in = worker::CopyToTensorParallelRegion(flat, tp_);
  if (ep_.enabled()) {
    return worker::ReduceFromTensorParallelRegion(ExpertParallelForward(expert_in, top_i, top_p),
                                                  tp_)
        .reshape(shape);
  }

  auto out = torch::zeros_like(flat);
  // Which (token, slot) pairs chose each expert; experts in index order, as upstream.
  auto hits = torch::one_hot(top_i, num_experts_).permute({2, 1, 0});  // [E, k, N]
  auto used = hits.sum({1, 2}).gt(0).nonzero().flatten().cpu();
  for (int64_t n = 0; n < used.size(0); ++n) {
    const int64_t e = used[n].item<int64_t>();
    auto where = torch::where(hits[e]);  // (slot, token)
    const auto& slot = where[0];
    const auto& token = where[1];
    auto hidden = Expert(e, expert_in.index_select(0, token));
    hidden = hidden * top_p.index({token, slot}).unsqueeze(-1);
    out.index_add_(0, token, hidden.to(out.scalar_type()));
  }
  return worker::ReduceFromTensorParallelRegion(out, tp_).reshape(shape);
}

torch::Tensor MoEImpl::ExpertParallelForward(const torch::Tensor& expert_in,
                                             const torch::Tensor& top_i,
                                             const torch::Tensor& top_p) {
  const int64_t tokens = expert_in.size(0);
  const int64_t local = w1_.size(0);  // experts per rank
  const int64_t first = ep_.rank * local;
  // The (slot, token) pairs ordered by expert, then slot, then token: the order upstream's
  // loop adds them in (a stable sort of index slot * N + token by expert).
  const torch::Tensor expert = top_i.t().reshape(-1);  // [k * N]
  const torch::Tensor order = std::get<1>(torch::sort(expert, std::optional<bool>(true), /*dim=*/0, /*descending=*/false));
  const torch::Tensor token = order.remainder(tokens);
  const torch::Tensor slot = order.div(tokens, "floor");
  // Rows per expert here, and on every rank of the group: what each rank sends where.
  const torch::Tensor per_expert = torch::bincount(expert, {}, num_experts_).cpu();
  const std::vector<torch::Tensor> all = ep_.comm->AllGather(per_expert);
  std::vector<int64_t> send_rows, recv_rows;
  for (int64_t r = 0; r < ep_.size; ++r) {
    send_rows.push_back(per_expert.slice(0, r * local, (r + 1) * local).sum().item<int64_t>());
    recv_rows.push_back(all[r].slice(0, first, first + local).sum().item<int64_t>());
  }
  const torch::Tensor received =
      worker::AllToAllRows(expert_in.index_select(0, token), send_rows, recv_rows, ep_);
  // Rows arrive by source rank, each sorted by expert: run each local expert over its rows
  // from every source at once, and put the outputs back where the rows arrived.
  std::vector<torch::Tensor> where, outputs;
  for (int64_t e = 0; e < local; ++e) {
    std::vector<torch::Tensor> rows;
    int64_t source_start = 0;
    for (int64_t r = 0; r < ep_.size; ++r) {
      const auto counts = all[r].slice(0, first, first + local);
      const int64_t before = counts.slice(0, 0, e).sum().item<int64_t>();
      const int64_t n = counts[e].item<int64_t>();
      if (n > 0) rows.push_back(torch::arange(source_start + before, source_start + before + n));
      source_start += recv_rows[r];
    }
    if (rows.empty()) continue;
    const torch::Tensor idx = torch::cat(rows).to(received.device());
    where.push_back(idx);
    outputs.push_back(Expert(e, received.index_select(0, idx)));
  }
  // No rows here: the empty `received` itself goes back, so this rank still takes part in the
  // dispatch's backward all-to-all (a zeros tensor would cut it off and leave the others
  // waiting).
  torch::Tensor computed = received;
  if (!where.empty()) {
    computed = torch::zeros_like(received).index_copy(0, torch::cat(where), torch::cat(outputs));
  }
  torch::Tensor back = worker::AllToAllRows(computed, recv_rows, send_rows, ep_);  // [k * N, H]
  back = back * top_p.index({token, slot}).unsqueeze(-1);
  return torch::zeros_like(expert_in).index_add(0, token, back.to(expert_in.scalar_type()));
}

}  // namespace gatehouse::models
