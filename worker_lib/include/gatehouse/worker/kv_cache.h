// KVCache: a static key/value cache for greedy decode, one pair of buffers per layer.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace gatehouse::worker {

/// Preallocated keys and values for every layer: k and v are [B, num_key_value_heads,
/// max_len, head_dim] in the model's dtype. Buffers are allocated once and updated in place
/// (the same addresses for the whole decode, as a CUDA graph needs).
///
/// Use per forward: for each layer call Append(layer, k_new, v_new, start) with the keys and
/// values of the new positions [B, H_kv, T_new, D]; it returns views [B, H_kv, start + T_new, D]
/// of everything cached so far. After the last layer the caller advances length() with
/// Advance(T_new). Not thread-safe.
class KVCache {
 public:
  KVCache(int64_t num_layers, int64_t batch, int64_t num_key_value_heads, int64_t max_len,
          int64_t head_dim, torch::Dtype dtype, torch::Device device);

  /// Writes positions [length(), length() + T_new) of `layer` and returns the filled prefix.
  /// Throws c10::Error if the cache would overflow max_len (the caller checks capacity first).
  std::pair<torch::Tensor, torch::Tensor> Append(int64_t layer, const torch::Tensor& k_new,
                                                 const torch::Tensor& v_new);
  /// The static-shape write a captured decode step uses (CUDA graphs): row b's new key and
  /// value (k_new, v_new [B, H_kv, 1, D]) go to slot slots[b] (slots: [B] int64 on the cache's
  /// device; no host read). Returns the whole buffers [B, H_kv, max_len, D]; slots beyond a
  /// row's position hold stale values the caller must mask. length() is not used or changed.
  std::pair<torch::Tensor, torch::Tensor> WriteAt(int64_t layer, const torch::Tensor& k_new,
                                                  const torch::Tensor& v_new,
                                                  const torch::Tensor& slots);
  /// Number of positions already cached.
  int64_t length() const { return length_; }
  int64_t max_len() const { return max_len_; }
  void Advance(int64_t t_new) { length_ += t_new; }
  void Reset() { length_ = 0; }

 private:
  std::vector<torch::Tensor> k_;
  std::vector<torch::Tensor> v_;
  int64_t max_len_;
  int64_t length_ = 0;
};

}  // namespace gatehouse::worker
