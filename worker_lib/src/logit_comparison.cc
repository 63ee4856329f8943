// LogitComparison (gates.h): the per-position reductions the inference, decode, parallel and
// cuda_graph gates compare logits with: max and mean absolute difference, KL(upstream || ours)
// in float64 on log-softmax, top-1 agreement. docs/gate-facts.md "Comparing logits".
#include "gatehouse/worker/gates.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gates_internal.h"

namespace gatehouse::worker {

using internal::ShapeString;

namespace {

// Positions compared at a time. Every reduction is per position, so the figures do not depend
// on it; it bounds the float64 temporaries (about eight of [rows, V]) to some 40 MB each at
// V = 151936, instead of eight of the whole [T, V] (3 GB for 300 positions).
constexpr int64_t kRowsPerChunk = 32;

}  // namespace

torch::Tensor LogitComparison::Add(const torch::Tensor& ref, const torch::Tensor& ours) {
  TORCH_CHECK(ref.dim() == 2 && ref.sizes() == ours.sizes(), "LogitComparison: reference ",
              ShapeString(ref.sizes()), " vs ours ", ShapeString(ours.sizes()),
              "; both must be [T, V]");
  std::vector<torch::Tensor> kl;
  for (int64_t begin = 0; begin < ref.size(0); begin += kRowsPerChunk) {
    const int64_t end = std::min(begin + kRowsPerChunk, ref.size(0));
    kl.push_back(AddRows(ref.slice(0, begin, end), ours.slice(0, begin, end)));
  }
  return kl.empty() ? torch::zeros({0}, torch::kDouble) : torch::cat(kl);
}

torch::Tensor LogitComparison::AddRows(const torch::Tensor& ref, const torch::Tensor& ours) {
  torch::NoGradGuard no_grad;
  const torch::Tensor r = ref.detach().to(torch::kCPU, torch::kDouble);
  const torch::Tensor o = ours.detach().to(torch::kCPU, torch::kDouble);
  const torch::Tensor log_p = torch::log_softmax(r, -1);
  const torch::Tensor log_q = torch::log_softmax(o, -1);
  const torch::Tensor p = log_p.exp();
  // 0 * log(0 / q) = 0: reference entries of probability 0 (masked logits) contribute nothing.
  const torch::Tensor terms = torch::where(p > 0, p * (log_p - log_q), torch::zeros_like(p));
  const torch::Tensor kl = terms.sum(-1);  // [T] nats
  kl_sum_ += kl.sum().item<double>();
  const double kl_max = kl.max().item<double>();
  if (std::isnan(kl_max) || kl_max > kl_max_) kl_max_ = kl_max;
  tokens_ += r.size(0);
  const torch::Tensor ref_top = r.argmax(-1, /*keepdim=*/true), our_top = o.argmax(-1, true);
  const torch::Tensor same = (ref_top == our_top).squeeze(1);
  top1_equal_ += same.sum().item<int64_t>();
  if (!same.all().item<bool>()) {
    // log_p[ref top-1] - log_p[our top-1]: how close the reference was to a tie there.
    const torch::Tensor gaps = (log_p.gather(1, ref_top) - log_p.gather(1, our_top)).squeeze(1)
                                   .index({same.logical_not()})
                                   .contiguous();
    flip_gaps_.insert(flip_gaps_.end(), gaps.data_ptr<double>(),
                      gaps.data_ptr<double>() + gaps.numel());
  }
  const torch::Tensor diff = (r - o).abs();
  const double max_abs = diff.max().item<double>();
  if (std::isnan(max_abs) || max_abs > max_abs_) max_abs_ = max_abs;
  abs_sum_ += diff.sum().item<double>();
  elements_ += diff.numel();
  return kl;
}

double LogitComparison::kl_mean() const {
  return tokens_ ? kl_sum_ / static_cast<double>(tokens_) : std::numeric_limits<double>::quiet_NaN();
}

double LogitComparison::top1_agreement_percent() const {
  return tokens_ ? 100.0 * static_cast<double>(top1_equal_) / static_cast<double>(tokens_)
                 : std::numeric_limits<double>::quiet_NaN();
}

int64_t LogitComparison::near_tie_flips(double near_tie_gap) const {
  return std::count_if(flip_gaps_.begin(), flip_gaps_.end(),
                       [&](double gap) { return gap <= near_tie_gap; });
}

double LogitComparison::top1_agreement_percent(double near_tie_gap) const {
  return tokens_ ? 100.0 * static_cast<double>(top1_equal_ + near_tie_flips(near_tie_gap)) /
                       static_cast<double>(tokens_)
                 : std::numeric_limits<double>::quiet_NaN();
}

double LogitComparison::mean_abs_diff() const {
  return elements_ ? abs_sum_ / static_cast<double>(elements_)
                   : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace gatehouse::worker
