// CUDA-graph greedy decode (issue 4; the cuda_graph gate).
//
// One decode step of a model (CausalLM::DecodeStep: static shapes, no host reads) is captured
// once per batch size with LibTorch's CUDA graph API (at::cuda::CUDAGraph) over static input
// buffers (token ids and positions) and a static KV cache, then replayed once per token with
// the buffers updated in place. docs/gate-facts.md "CUDA graphs": a buffer reallocated after
// capture leaves the graph reading a stale pointer, and outputs go wrong from the second token
// on; here every buffer the graph touches is allocated before capture and never replaced.
//
// The code compiles and links on machines without a GPU (CI); Create reports
// FAILED_PRECONDITION there.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "gatehouse/worker/kv_cache.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::worker {

/// True when LibTorch sees a CUDA device.
bool CudaAvailable();

/// Peak bytes held by LibTorch's CUDA caching allocator on `device` since the last
/// CudaResetPeakMemory (allocated_bytes, aggregate). 0 without CUDA.
int64_t CudaPeakAllocatedBytes(int device);
/// Starts a new peak for CudaPeakAllocatedBytes. No-op without CUDA.
void CudaResetPeakMemory(int device);

/// Versions of the CUDA stack this worker runs, as "major.minor[.patch]" strings; empty when
/// the part is absent. `cuda` is the CUDA runtime LibTorch was built with (what
/// torch.version.cuda reports, e.g. "13.0"), `cudnn` likewise ("9.19.0"), `nccl` the NCCL
/// library LibTorch loaded (ncclGetVersion through torch::cuda::nccl::version(), "2.28.9"),
/// `driver` the newest CUDA version the installed driver supports (cudaDriverGetVersion,
/// "13.0"; empty without a driver). None of them needs a GPU.
struct CudaVersions {
  std::string cuda, cudnn, nccl, driver;
};
CudaVersions ProbeCudaVersions();

/// Makes CUDA device `index` current for this process (c10::cuda::set_device): a rank of a
/// group on a GPU node uses device LOCAL_RANK of those the agent made visible. Errors:
/// FAILED_PRECONDITION without CUDA or when `index` is outside [0, device count).
Status SetCudaDevice(int index);

/// A captured decode step for `batch` rows and a cache of `max_len` positions.
class CudaGraphDecoder {
 public:
  /// Allocates the static buffers and the cache on the model's CUDA device, warms the step up
  /// on a side stream and captures it. Errors: FAILED_PRECONDITION when CUDA is unavailable,
  /// the model is not on a CUDA device or has no static decode step
  /// (CausalLM::SupportsStaticDecode); INTERNAL with LibTorch's message when capture fails.
  static Result<std::unique_ptr<CudaGraphDecoder>> Create(CausalLM& model, int64_t batch,
                                                          int64_t max_len);
  ~CudaGraphDecoder();

  /// Greedy decode of `prompts` [batch, T] int64 (all rows T tokens, T + max_new_tokens <=
  /// max_len): eager prefill through CausalLM::Forward into the static cache, then one graph
  /// replay per new token. Returns the new ids [batch, max_new_tokens] int64 on the CPU;
  /// `ms_per_token` (optional) receives the mean wall time of the replayed steps (ms).
  /// Errors: INVALID_ARGUMENT for a wrong shape or a prompt too long for the cache.
  Result<torch::Tensor> Generate(const torch::Tensor& prompts, int64_t max_new_tokens,
                                 double* ms_per_token = nullptr);

  /// Teacher-forced decode through the graph (the decode gate's ForcedDecodeLogits, replayed):
  /// eager prefill of `prompts` [batch, T], then forced[:, 0..N-2] fed one replay per step.
  /// Returns the logits that predict forced[:, k] as [batch, N, V] float32 on the CPU.
  /// Errors: as Generate, and INVALID_ARGUMENT unless forced is int64 [batch, N], N >= 1.
  Result<torch::Tensor> ForcedLogits(const torch::Tensor& prompts, const torch::Tensor& forced);

  int64_t batch() const { return batch_; }

 private:
  CudaGraphDecoder() = default;
  struct Graph;  // holds the at::cuda::CUDAGraph (CUDA headers stay out of this header)

  /// Generate (forced undefined: each step feeds the argmax) and ForcedLogits (each step feeds
  /// forced[:, k - 1]): eager prefill, then n - 1 replays. Returns ids [B, n] or logits
  /// [B, n, V] float32, on the CPU.
  Result<torch::Tensor> Decode(const torch::Tensor& prompts, int64_t n,
                               const torch::Tensor& forced, double* ms_per_token);

  CausalLM* model_ = nullptr;
  int64_t batch_ = 0;
  std::unique_ptr<KVCache> cache_;
  torch::Tensor tokens_;     // [B, 1] int64, static input
  torch::Tensor positions_;  // [B, 1] int64, static input
  torch::Tensor logits_;     // [B, 1, V], static output
  std::unique_ptr<Graph> graph_;
};

}  // namespace gatehouse::worker
