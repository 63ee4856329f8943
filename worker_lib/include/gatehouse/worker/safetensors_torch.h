// LibTorch bridge for safetensors: tensors in and out.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "gatehouse/worker/safetensors.h"

namespace gatehouse::worker::safetensors {

/// Torch dtype for a safetensors dtype. Errors: INVALID_ARGUMENT for one LibTorch lacks.
Result<torch::Dtype> ToTorchDtype(Dtype dtype);
/// Safetensors dtype for a torch dtype. Errors: INVALID_ARGUMENT.
Result<Dtype> FromTorchDtype(torch::Dtype dtype);

/// Copies a tensor's bytes out of a file into an owned, contiguous CPU tensor.
Result<torch::Tensor> ReadTensor(const File& file, const TensorInfo& info);

/// A contiguous CPU tensor over the file's mapped bytes, without a copy: reading it reads the
/// page cache. It holds the mapping (File::SharedMapping), so it stays valid after `file` is
/// gone. Writing it is private copy-on-write when file.copy_on_write() (the file never
/// changes) and faults otherwise. Two uses: copying into a destination (`dest.copy_(view)`,
/// which converts dtype and device in the same pass), or becoming a CPU parameter of the same
/// dtype as it is (LoadStateDict). Bytes not aligned to the element size are copied instead
/// (ReadTensor), since kernels may assume aligned elements. Errors as ReadTensor.
Result<torch::Tensor> ViewTensor(const File& file, const TensorInfo& info);

/// Writes CPU-copied, contiguous tensors (any device/layout accepted) with WriteFile.
Status WriteTensors(const std::filesystem::path& path,
                    const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                    const std::map<std::string, std::string>& metadata = {});

}  // namespace gatehouse::worker::safetensors
