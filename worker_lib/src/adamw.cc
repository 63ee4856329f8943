// UpstreamAdamW: torch.optim.AdamW's single-tensor step (adamw.h).
#include "gatehouse/worker/adamw.h"

#include <cmath>

namespace gatehouse::worker {

UpstreamAdamW::UpstreamAdamW(std::vector<torch::Tensor> params, Options options)
    : params_(std::move(params)), state_(params_.size()), options_(options) {}

void UpstreamAdamW::ZeroGrad() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

void UpstreamAdamW::Step() {
  torch::NoGradGuard no_grad;
  const Options& o = options_;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& param = params_[i];
    const torch::Tensor& grad = param.grad();
    if (!grad.defined()) continue;
    State& s = state_[i];
    if (s.step == 0) {
      s.exp_avg = torch::zeros_like(param, torch::MemoryFormat::Preserve);
      s.exp_avg_sq = torch::zeros_like(param, torch::MemoryFormat::Preserve);
    }
    s.step += 1;
    param.mul_(1 - o.lr * o.weight_decay);
    s.exp_avg.lerp_(grad, 1 - o.beta1);
    s.exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
    const double step = static_cast<double>(s.step);
    const double bias_correction1 = 1 - std::pow(o.beta1, step);
    const double bias_correction2 = 1 - std::pow(o.beta2, step);
    const double step_size = o.lr / bias_correction1;
    const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);
    // Upstream's (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) with the division in
    // place: the same values, one parameter-sized temporary instead of two.
    const torch::Tensor denom = s.exp_avg_sq.sqrt().div_(bias_correction2_sqrt).add_(o.eps);
    param.addcdiv_(s.exp_avg, denom, -step_size);
  }
}

}  // namespace gatehouse::worker
