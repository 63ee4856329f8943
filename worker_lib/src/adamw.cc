// UpstreamAdamW: torch.optim.AdamW's single-tensor step (adamw.h).
#include "gatehouse/worker/adamw.h"

#include <algorithm>
#include <cmath>

namespace gatehouse::worker {

namespace {
// Bytes of the largest temporary Step makes (the denominator of one slice of a parameter).
constexpr int64_t kDenomChunkBytes = 32 << 20;
}  // namespace

UpstreamAdamW::UpstreamAdamW(std::vector<torch::Tensor> params, Options options)
    : params_(std::move(params)), state_(params_.size()), options_(options) {}

void UpstreamAdamW::ZeroGrad() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

int64_t UpstreamAdamW::StateElements() const {
  int64_t n = 0;
  for (const State& s : state_) {
    if (s.exp_avg.defined()) n += s.exp_avg.numel() + s.exp_avg_sq.numel();
  }
  return n;
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
    // Upstream's (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps), then addcdiv_, with
    // the division in place and by slices of at most kDenomChunkBytes along dim 0: every op is
    // elementwise, so the values are upstream's, and the temporary is one slice, not a second
    // parameter-sized tensor (a 0.5 GB embedding at Qwen2.5-0.5B's vocabulary).
    const int64_t rows = param.dim() == 0 ? 1 : param.size(0);
    const int64_t row_bytes =
        std::max<int64_t>(1, static_cast<int64_t>(param.nbytes()) / std::max<int64_t>(rows, 1));
    const int64_t chunk = param.dim() == 0 ? 1 : std::max<int64_t>(1, kDenomChunkBytes / row_bytes);
    for (int64_t begin = 0; begin < rows; begin += chunk) {
      const int64_t n = std::min(chunk, rows - begin);
      const bool whole = param.dim() == 0 || n == rows;
      torch::Tensor p = whole ? param : param.narrow(0, begin, n);
      const torch::Tensor m = whole ? s.exp_avg : s.exp_avg.narrow(0, begin, n);
      const torch::Tensor v = whole ? s.exp_avg_sq : s.exp_avg_sq.narrow(0, begin, n);
      const torch::Tensor denom = v.sqrt().div_(bias_correction2_sqrt).add_(o.eps);
      p.addcdiv_(m, denom, -step_size);
    }
  }
}

}  // namespace gatehouse::worker
