#include "gatehouse/worker/kv_cache.h"

namespace gatehouse::worker {

KVCache::KVCache(int64_t num_layers, int64_t batch, int64_t num_key_value_heads, int64_t max_len,
                 int64_t head_dim, torch::Dtype dtype, torch::Device device)
    : max_len_(max_len) {
  auto opts = torch::TensorOptions().dtype(dtype).device(device);
  k_.reserve(num_layers);
  v_.reserve(num_layers);
  for (int64_t i = 0; i < num_layers; ++i) {
    k_.push_back(torch::zeros({batch, num_key_value_heads, max_len, head_dim}, opts));
    v_.push_back(torch::zeros({batch, num_key_value_heads, max_len, head_dim}, opts));
  }
}

std::pair<torch::Tensor, torch::Tensor> KVCache::Append(int64_t layer, const torch::Tensor& k_new,
                                                        const torch::Tensor& v_new) {
  const int64_t t_new = k_new.size(2);
  TORCH_CHECK(length_ + t_new <= max_len_, "KVCache overflow: length ", length_, " + ", t_new,
              " > max_len ", max_len_);
  auto& k = k_.at(layer);
  auto& v = v_.at(layer);
  k.narrow(2, length_, t_new).copy_(k_new);
  v.narrow(2, length_, t_new).copy_(v_new);
  return {k.narrow(2, 0, length_ + t_new), v.narrow(2, 0, length_ + t_new)};
}

std::pair<torch::Tensor, torch::Tensor> KVCache::WriteAt(int64_t layer, const torch::Tensor& k_new,
                                                         const torch::Tensor& v_new,
                                                         const torch::Tensor& slots) {
  auto& k = k_.at(layer);
  auto& v = v_.at(layer);
  TORCH_CHECK(k_new.dim() == 4 && k_new.size(2) == 1 && slots.dim() == 1 &&
                  slots.size(0) == k_new.size(0),
              "KVCache::WriteAt: k_new must be [B, H, 1, D] and slots [B], got ", k_new.sizes(),
              " and ", slots.sizes());
  const auto index = slots.view({-1, 1, 1, 1}).expand(k_new.sizes());
  k.scatter_(2, index, k_new);
  v.scatter_(2, index, v_new);
  return {k, v};
}

}  // namespace gatehouse::worker
