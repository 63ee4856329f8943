// Reference bundle reader (format in reference.h).
#include "gatehouse/worker/reference.h"

#include <fstream>
#include <sstream>

#include "gatehouse/worker/safetensors.h"
#include "gatehouse/worker/safetensors_torch.h"

namespace gatehouse::worker {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Reads tensor `name` of `file` and checks its dtype and rank.
Result<torch::Tensor> ReadChecked(const safetensors::File& file, const std::string& name,
                                  safetensors::Dtype dtype, size_t rank) {
  const safetensors::TensorInfo* info = file.Find(name);
  if (info == nullptr) {
    return Status::NotFound(file.path().string() + " has no tensor '" + name + "'");
  }
  if (info->dtype != dtype || info->shape.size() != rank) {
    return Status::InvalidArgument(
        file.path().string() + ": tensor '" + name + "' is " +
        std::string(safetensors::DtypeName(info->dtype)) + " " + ShapeString(info->shape) +
        "; expected " + std::string(safetensors::DtypeName(dtype)) + " of rank " +
        std::to_string(rank));
  }
  return safetensors::ReadTensor(file, *info);
}

}  // namespace

Result<ReferenceBundle> LoadReference(const std::filesystem::path& dir) {
  ReferenceBundle bundle;
  bundle.dir = dir;
  if (!std::filesystem::is_directory(dir)) {
    return Status::NotFound("reference bundle " + dir.string() + " is not a directory");
  }
  const auto meta_path = dir / "reference.json";
  {
    std::ifstream in(meta_path, std::ios::binary);
    if (!in) return Status::NotFound("reference bundle lacks " + meta_path.string());
    std::stringstream buf;
    buf << in.rdbuf();
    bundle.meta = nlohmann::json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  }
  if (bundle.meta.is_discarded() || !bundle.meta.is_object()) {
    return Status::InvalidArgument(meta_path.string() + " is not a JSON object");
  }
  auto format = bundle.meta.find("format");
  if (format == bundle.meta.end() || !format->is_string() ||
      format->get<std::string>() != kReferenceFormat) {
    return Status::InvalidArgument(
        meta_path.string() + ": field 'format' is " +
        (format == bundle.meta.end() ? std::string("missing") : format->dump()) +
        "; expected \"" + std::string(kReferenceFormat) + "\"");
  }

  GH_ASSIGN_OR_RETURN(safetensors::File file, safetensors::File::Open(dir / "reference.safetensors"));

  int64_t count = -1;
  if (auto p = bundle.meta.find("prompts"); p != bundle.meta.end() && p->is_array()) {
    count = static_cast<int64_t>(p->size());
  } else if (auto n = bundle.meta.find("num_prompts"); n != bundle.meta.end()) {
    if (!n->is_number_integer() || n->get<int64_t>() < 0) {
      return Status::InvalidArgument(meta_path.string() + ": field 'num_prompts' is " +
                                     n->dump() + "; expected a non-negative integer");
    }
    count = n->get<int64_t>();
  } else {
    count = 0;
    while (file.Find("prompts." + std::to_string(count) + ".input_ids") != nullptr) ++count;
  }
  if (count == 0) {
    return Status::InvalidArgument("reference bundle " + dir.string() +
                                   " holds no prompt (no tensor 'prompts.0.input_ids')");
  }

  for (int64_t i = 0; i < count; ++i) {
    const std::string prefix = "prompts." + std::to_string(i) + ".";
    ReferencePrompt p;
    GH_ASSIGN_OR_RETURN(p.input_ids,
                        ReadChecked(file, prefix + "input_ids", safetensors::Dtype::kI64, 1));
    GH_ASSIGN_OR_RETURN(p.logits, ReadChecked(file, prefix + "logits", safetensors::Dtype::kF32, 2));
    GH_ASSIGN_OR_RETURN(p.greedy_ids,
                        ReadChecked(file, prefix + "greedy_ids", safetensors::Dtype::kI64, 1));
    const int64_t t = p.input_ids.size(0);
    if (t < 1) {
      return Status::InvalidArgument("reference tensor '" + prefix + "input_ids' is empty");
    }
    if (p.logits.size(0) != t) {
      return Status::InvalidArgument("reference tensor '" + prefix + "logits' has " +
                                     std::to_string(p.logits.size(0)) + " rows but '" + prefix +
                                     "input_ids' has " + std::to_string(t) + " tokens");
    }
    const int64_t v = p.logits.size(1);
    if (v < 1) {
      return Status::InvalidArgument("reference tensor '" + prefix + "logits' has no column");
    }
    if (bundle.vocab_size != 0 && v != bundle.vocab_size) {
      return Status::InvalidArgument("reference tensor '" + prefix + "logits' has vocabulary " +
                                     std::to_string(v) + "; prompt 0 has " +
                                     std::to_string(bundle.vocab_size));
    }
    if (file.Find(prefix + "logits_bf16") != nullptr) {
      GH_ASSIGN_OR_RETURN(p.logits_bf16, ReadChecked(file, prefix + "logits_bf16",
                                                     safetensors::Dtype::kF32, 2));
      if (p.logits_bf16.sizes() != p.logits.sizes()) {
        return Status::InvalidArgument(
            "reference tensor '" + prefix + "logits_bf16' has shape " +
            ShapeString(p.logits_bf16.sizes().vec()) + " but '" + prefix + "logits' has " +
            ShapeString(p.logits.sizes().vec()));
      }
    }
    if (file.Find(prefix + "greedy_ids_bf16") != nullptr) {
      GH_ASSIGN_OR_RETURN(p.greedy_ids_bf16, ReadChecked(file, prefix + "greedy_ids_bf16",
                                                         safetensors::Dtype::kI64, 1));
    }
    bundle.vocab_size = v;
    bundle.prompts.push_back(std::move(p));
  }
  return bundle;
}

}  // namespace gatehouse::worker
