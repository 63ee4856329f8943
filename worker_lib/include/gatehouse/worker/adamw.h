// AdamW as upstream's training runs it, so the training gate's optimizer steps can be compared
// with upstream's trace to the last bit.
//
// torch.optim.AdamW on CPU tensors takes the single-tensor path (torch/optim/adam.py
// _single_tensor_adam with decoupled weight decay; torch 2.11): per parameter
//   step += 1
//   param.mul_(1 - lr * weight_decay)
//   exp_avg.lerp_(grad, 1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   step_size = lr / (1 - beta1 ** step)
//   denom = (exp_avg_sq.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
//   param.addcdiv_(exp_avg, denom, value=-step_size)
// with the scalars computed in Python floats (IEEE doubles). LibTorch's C++ torch::optim::AdamW
// updates exp_avg with mul_ and add_ instead of lerp_ and computes the bias correction with
// sqrt, which rounds differently (bf16 losses after step 1 moved by ~1e-4 relative). This class
// is the Python sequence, op for op, in LibTorch.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace gatehouse::worker {

class UpstreamAdamW {
 public:
  /// torch.optim.AdamW's defaults but lr.
  struct Options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 1e-2;
  };

  /// `params`: leaf tensors that require grad; the state (exp_avg, exp_avg_sq) is allocated
  /// like each parameter on its first step.
  UpstreamAdamW(std::vector<torch::Tensor> params, Options options);

  /// Sets every gradient to undefined (optimizer.zero_grad(set_to_none=True)).
  void ZeroGrad();
  /// One step over every parameter that has a gradient (one without is skipped, as upstream
  /// skips p.grad is None).
  void Step();
  /// exp_avg and exp_avg_sq elements allocated so far (0 before the first step; a parameter
  /// that never had a gradient holds none): the optimizer state this instance holds.
  int64_t StateElements() const;

 private:
  struct State {
    int64_t step = 0;
    torch::Tensor exp_avg, exp_avg_sq;
  };
  std::vector<torch::Tensor> params_;
  std::vector<State> state_;
  Options options_;
};

}  // namespace gatehouse::worker
