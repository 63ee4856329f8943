// LibTorch bridge for safetensors. Dtype names follow the Python package's mapping
// (huggingface/safetensors bindings/python/py_src/safetensors/torch.py `_TYPES`).
#include "gatehouse/worker/safetensors_torch.h"

#include <array>
#include <cstring>
#include <exception>

namespace gatehouse::worker::safetensors {
namespace {

struct TorchRow {
  Dtype dtype;
  torch::Dtype torch_dtype;
};

constexpr std::array<TorchRow, 19> kTorchDtypes = {{
    {Dtype::kBool, torch::kBool},
    {Dtype::kU8, torch::kUInt8},
    {Dtype::kI8, torch::kInt8},
    {Dtype::kI16, torch::kInt16},
    {Dtype::kU16, torch::kUInt16},
    {Dtype::kF16, torch::kFloat16},
    {Dtype::kBF16, torch::kBFloat16},
    {Dtype::kI32, torch::kInt32},
    {Dtype::kU32, torch::kUInt32},
    {Dtype::kF32, torch::kFloat32},
    {Dtype::kF64, torch::kFloat64},
    {Dtype::kI64, torch::kInt64},
    {Dtype::kU64, torch::kUInt64},
    {Dtype::kC64, torch::kComplexFloat},
    {Dtype::kF8_E5M2, c10::ScalarType::Float8_e5m2},
    {Dtype::kF8_E4M3, c10::ScalarType::Float8_e4m3fn},
    {Dtype::kF8_E8M0, c10::ScalarType::Float8_e8m0fnu},
    {Dtype::kF8_E4M3FNUZ, c10::ScalarType::Float8_e4m3fnuz},
    {Dtype::kF8_E5M2FNUZ, c10::ScalarType::Float8_e5m2fnuz},
}};

std::string ShapeString(c10::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace

Result<torch::Dtype> ToTorchDtype(Dtype dtype) {
  for (const TorchRow& row : kTorchDtypes) {
    if (row.dtype == dtype) return row.torch_dtype;
  }
  return Status::InvalidArgument("dtype " + std::string(DtypeName(dtype)) +
                                 " has no LibTorch equivalent");
}

Result<Dtype> FromTorchDtype(torch::Dtype dtype) {
  for (const TorchRow& row : kTorchDtypes) {
    if (row.torch_dtype == dtype) return row.dtype;
  }
  return Status::InvalidArgument(std::string("torch dtype ") + c10::toString(dtype) +
                                 " has no safetensors equivalent");
}

Result<torch::Tensor> ReadTensor(const File& file, const TensorInfo& info) {
  const std::string where =
      "safetensors file '" + file.path().string() + "': tensor '" + info.name + "'";
  Result<torch::Dtype> dtype = ToTorchDtype(info.dtype);
  if (!dtype.ok()) return dtype.status().WithContext(where);
  std::string_view bytes = file.Bytes(info);
  if (bytes.size() != info.end - info.begin) {
    return Status::InvalidArgument(where + ": data_offsets [" + std::to_string(info.begin) +
                                   ", " + std::to_string(info.end) +
                                   "] lie outside this file's data buffer");
  }
  try {
    torch::Tensor t = torch::empty(info.shape, torch::TensorOptions().dtype(*dtype));
    if (static_cast<uint64_t>(t.nbytes()) != bytes.size()) {
      return Status::Internal(where + ": tensor of shape " + ShapeString(t.sizes()) + " has " +
                              std::to_string(t.nbytes()) + " bytes but the file holds " +
                              std::to_string(bytes.size()));
    }
    if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    return t;
  } catch (const std::exception& e) {
    return Status::Internal(where + ": cannot allocate the tensor: " + e.what());
  }
}

Result<torch::Tensor> ViewTensor(const File& file, const TensorInfo& info) {
  const std::string where =
      "safetensors file '" + file.path().string() + "': tensor '" + info.name + "'";
  Result<torch::Dtype> dtype = ToTorchDtype(info.dtype);
  if (!dtype.ok()) return dtype.status().WithContext(where);
  const std::string_view bytes = file.Bytes(info);
  const size_t element = c10::elementSize(*dtype);
  if (bytes.size() != info.end - info.begin || bytes.empty() ||
      reinterpret_cast<uintptr_t>(bytes.data()) % element != 0) {
    return ReadTensor(file, info);  // its errors name the offsets; empty and unaligned copy
  }
  try {
    // The deleter holds the mapping, so the view outlives `file` (a parameter adopted from it).
    std::shared_ptr<void> mapping = file.SharedMapping();
    torch::Tensor t = torch::from_blob(
        const_cast<char*>(bytes.data()), info.shape,
        [mapping = std::move(mapping)](void*) mutable { mapping.reset(); },
        torch::TensorOptions().dtype(*dtype));
    if (static_cast<uint64_t>(t.nbytes()) != bytes.size()) {
      return Status::Internal(where + ": tensor of shape " + ShapeString(t.sizes()) + " has " +
                              std::to_string(t.nbytes()) + " bytes but the file holds " +
                              std::to_string(bytes.size()));
    }
    return t;
  } catch (const std::exception& e) {
    return Status::Internal(where + ": cannot view the tensor: " + e.what());
  }
}

Status WriteTensors(const std::filesystem::path& path,
                    const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                    const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> cpu;  // keeps the bytes alive until WriteFile returns
  std::vector<TensorBytes> out;
  cpu.reserve(tensors.size());
  out.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const std::string where = "tensor '" + name + "'";
    if (!tensor.defined()) return Status::InvalidArgument(where + ": undefined tensor");
    Result<Dtype> dtype = FromTorchDtype(tensor.scalar_type());
    if (!dtype.ok()) return dtype.status().WithContext(where);
    try {
      torch::Tensor t = tensor.detach();
      if (t.layout() != torch::kStrided) t = t.to_dense();
      // Conjugate and negative views are lazy bits; materialise them before taking bytes.
      t = t.to(torch::kCPU).resolve_conj().resolve_neg().contiguous();
      cpu.push_back(t);
    } catch (const std::exception& e) {
      return Status::InvalidArgument(where + ": cannot copy to a contiguous CPU tensor: " +
                                     e.what());
    }
    const torch::Tensor& t = cpu.back();
    out.push_back({name, *dtype, t.sizes().vec(),
                   std::string_view(static_cast<const char*>(t.data_ptr()), t.nbytes())});
  }
  return WriteFile(path, out, metadata);
}

}  // namespace gatehouse::worker::safetensors
