// What the decoder's modules share (model.cc, moe.cc): how a parameter is made and
// initialised, the local size of a tensor-parallel dimension, the MLP activation. Internal to
// models/decoder.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "decoder/model.h"

namespace gatehouse::models {

/// Standard deviation of upstream's fresh-weight init (initializer_range default).
inline constexpr double kInitStd = 0.02;

/// A parameter of `shape` as `po` says: `fill` draws its init, or it is left uninitialised.
template <typename Fill>
torch::Tensor NewParameter(torch::IntArrayRef shape, const ParamOptions& po, Fill fill) {
  torch::Tensor t = torch::empty(shape, po.options);
  if (po.init) {
    torch::NoGradGuard no_grad;
    fill(t);
  }
  return t;
}

inline void InitNormal(torch::Tensor& t) { t.normal_(0.0, kInitStd); }

/// The size of a dimension split over the TP ranks (the plan checked divisibility).
inline int64_t Local(int64_t n, const TensorParallel& tp) {
  TORCH_CHECK(n % tp.size == 0, "tensor-parallel size ", tp.size, " does not divide ", n);
  return n / tp.size;
}

/// The MLP activation: SiLU, or GELU with the tanh approximation (gelu_pytorch_tanh).
inline torch::Tensor Activate(Activation act, const torch::Tensor& x) {
  return act == Activation::kSilu ? torch::silu(x) : torch::gelu(x, "tanh");
}

}  // namespace gatehouse::models
