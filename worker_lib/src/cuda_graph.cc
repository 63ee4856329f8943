// CUDA-graph greedy decode (cuda_graph.h), through at::cuda::CUDAGraph.
#include "gatehouse/worker/cuda_graph.h"

#include <ATen/cuda/CUDAGraph.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/nccl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <vector>

namespace gatehouse::worker {
namespace {

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Warm-up steps before capture (allocator and library handles settle on the side stream).
constexpr int kWarmupSteps = 3;

}  // namespace

struct CudaGraphDecoder::Graph {
  at::cuda::CUDAGraph graph;
};

bool CudaAvailable() { return torch::cuda::is_available(); }

int64_t CudaPeakAllocatedBytes(int device) {
  if (!CudaAvailable()) return 0;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}

void CudaResetPeakMemory(int device) {
  if (CudaAvailable()) c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

namespace {
// 13000 -> "13.0" (CUDART_VERSION / cudaDriverGetVersion encoding: 1000 * major + 10 * minor).
std::string CudaVersionText(long v) {
  if (v <= 0) return "";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
}  // namespace

CudaVersions ProbeCudaVersions() {
  CudaVersions v;
  const auto& hooks = at::detail::getCUDAHooks();
  try {
    v.cuda = CudaVersionText(hooks.versionCUDART());
  } catch (const c10::Error&) {
    // LibTorch built without CUDA: no CUDA runtime version.
  }
  try {
    const long cudnn = hooks.versionCuDNN();  // 91900 -> 9.19.0
    if (cudnn > 0) {
      v.cudnn = std::to_string(cudnn / 10000) + "." + std::to_string((cudnn % 10000) / 100) +
                "." + std::to_string(cudnn % 100);
    }
  } catch (const c10::Error&) {
  }
  try {
    const std::uint64_t nccl = torch::cuda::nccl::version();  // major << 32 | minor << 16 | patch
    if (nccl != 0) {
      v.nccl = std::to_string(nccl >> 32) + "." + std::to_string((nccl >> 16) & 0xffff) + "." +
               std::to_string(nccl & 0xffff);
    }
  } catch (const std::exception&) {
  }
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) v.driver = CudaVersionText(driver);
  return v;
}

Status SetCudaDevice(int index) {
  if (!CudaAvailable()) {
    return Status::FailedPrecondition("no CUDA device: torch::cuda::is_available() is false");
  }
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (index < 0 || index >= count) {
    return Status::FailedPrecondition("CUDA device " + std::to_string(index) + " requested but " +
                                      std::to_string(count) + " visible (CUDA_VISIBLE_DEVICES)");
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
  return Status::Ok();
}

CudaGraphDecoder::~CudaGraphDecoder() = default;

Result<std::unique_ptr<CudaGraphDecoder>> CudaGraphDecoder::Create(CausalLM& model, int64_t batch,
                                                                   int64_t max_len) {
  if (!CudaAvailable()) {
    return Status::FailedPrecondition("no CUDA device: torch::cuda::is_available() is false");
  }
  if (!model.SupportsStaticDecode()) {
    return Status::FailedPrecondition(
        "the model has no static decode step (CausalLM::SupportsStaticDecode is false)");
  }
  const auto params = model.parameters();
  if (params.empty()) return Status::FailedPrecondition("the model has no parameters");
  const torch::Device device = params.front().device();
  if (!device.is_cuda()) {
    return Status::FailedPrecondition("the model is on " + device.str() + ", not a CUDA device");
  }
  if (batch < 1 || max_len < 2) {
    return Status::InvalidArgument("CUDA-graph decode needs batch >= 1 and max_len >= 2, got " +
                                   std::to_string(batch) + " and " + std::to_string(max_len));
  }
  try {
    torch::NoGradGuard no_grad;
    model.eval();
    std::unique_ptr<CudaGraphDecoder> d(new CudaGraphDecoder());
    d->model_ = &model;
    d->batch_ = batch;
    d->cache_ = model.NewKVCache(batch, max_len);
    const auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
    d->tokens_ = torch::zeros({batch, 1}, opts);
    d->positions_ = torch::zeros({batch, 1}, opts);

    c10::cuda::CUDAGuard device_guard(device);
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    side.synchronize();
    torch::cuda::synchronize(device.index());
    {
      c10::cuda::CUDAStreamGuard stream_guard(side);
      for (int i = 0; i < kWarmupSteps; ++i) {
        d->logits_ = model.DecodeStep(d->tokens_, d->positions_, *d->cache_);
      }
      side.synchronize();
      d->graph_ = std::make_unique<Graph>();
      d->graph_->graph.capture_begin();
      d->logits_ = model.DecodeStep(d->tokens_, d->positions_, *d->cache_);
      d->graph_->graph.capture_end();
    }
    torch::cuda::synchronize(device.index());
    return d;
  } catch (const c10::Error& e) {
    return Status::Internal(std::string("capturing the decode step: ") + e.what_without_backtrace());
  }
}

Result<torch::Tensor> CudaGraphDecoder::Generate(const torch::Tensor& prompts,
                                                 int64_t max_new_tokens, double* ms_per_token) {
  return Decode(prompts, max_new_tokens, torch::Tensor(), ms_per_token);
}

Result<torch::Tensor> CudaGraphDecoder::ForcedLogits(const torch::Tensor& prompts,
                                                     const torch::Tensor& forced) {
  if (forced.dim() != 2 || forced.size(0) != batch_ || forced.size(1) < 1 ||
      forced.scalar_type() != torch::kLong) {
    return Status::InvalidArgument("forced must be int64 [" + std::to_string(batch_) +
                                   ", N >= 1], got " +
                                   std::string(c10::toString(forced.scalar_type())) + " with " +
                                   std::to_string(forced.dim()) + " dims");
  }
  return Decode(prompts, forced.size(1), forced, nullptr);
}

Result<torch::Tensor> CudaGraphDecoder::Decode(const torch::Tensor& prompts, int64_t n,
                                               const torch::Tensor& forced, double* ms_per_token) {
  if (prompts.dim() != 2 || prompts.size(0) != batch_ || prompts.scalar_type() != torch::kLong) {
    return Status::InvalidArgument("prompts must be int64 [" + std::to_string(batch_) +
                                   ", T], got " + std::string(c10::toString(prompts.scalar_type())) +
                                   " with " + std::to_string(prompts.dim()) + " dims");
  }
  const int64_t t = prompts.size(1);
  if (t < 1 || n < 1 || t + n > cache_->max_len()) {
    return Status::InvalidArgument("prompt of " + std::to_string(t) + " tokens + " +
                                   std::to_string(n) + " new ones does not fit the cache of " +
                                   std::to_string(cache_->max_len()));
  }
  const bool teacher_forced = forced.defined();
  try {
    torch::NoGradGuard no_grad;
    const torch::Device device = tokens_.device();
    const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device);
    // Eager prefill into the same static cache buffers the graph reads; entries a previous
    // prompt left beyond this prompt's positions are masked by the step (slot <= position).
    cache_->Reset();
    const torch::Tensor positions = torch::arange(t, long_opts).unsqueeze(0).expand({batch_, t});
    torch::Tensor logits = model_->Forward(prompts.to(device), positions.contiguous(), cache_.get());
    const torch::Tensor feed = teacher_forced ? forced.to(device) : torch::Tensor();
    std::vector<torch::Tensor> out;  // ids [B] per step, or logits [B, V] on the CPU
    torch::Tensor last = logits.select(1, t - 1);
    torch::Tensor next = last.argmax(-1);  // [B]
    out.push_back(teacher_forced ? last.to(torch::kFloat).cpu() : next);
    torch::cuda::synchronize(device.index());
    const double t0 = NowMs();
    for (int64_t step = 1; step < n; ++step) {
      tokens_.copy_(teacher_forced ? feed.slice(1, step - 1, step) : next.view({batch_, 1}));
      positions_.fill_(t + step - 1);
      graph_->graph.replay();
      last = logits_.select(1, 0);
      next = last.argmax(-1);
      out.push_back(teacher_forced ? last.to(torch::kFloat).cpu() : next);
    }
    torch::cuda::synchronize(device.index());
    if (ms_per_token != nullptr) *ms_per_token = n > 1 ? (NowMs() - t0) / double(n - 1) : 0.0;
    return teacher_forced ? torch::stack(out, 1) : torch::stack(out, 1).cpu();
  } catch (const c10::Error& e) {
    return Status::Internal(std::string("CUDA-graph decode: ") + e.what_without_backtrace());
  }
}

}  // namespace gatehouse::worker
