// A Hugging Face checkpoint directory: config.json plus either model.safetensors or a sharded
// set named by model.safetensors.index.json (GATES-NOTES.md "Sharded checkpoints").
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "gatehouse/worker/safetensors.h"

namespace gatehouse::worker {

/// The tensors of a checkpoint, each in exactly one file, opened and validated up front.
class Checkpoint {
 public:
  /// Opens `dir`. With model.safetensors.index.json: every shard it names must exist and open,
  /// every key it lists must be present in the shard it names, and no shard may hold a key the
  /// index does not list. Without one: model.safetensors. config.json must parse as an object.
  /// Errors: NOT_FOUND (missing dir/config/shard, naming it), DATA_LOSS (corrupt file, key
  /// absent from its shard, naming key and shard), INVALID_ARGUMENT (bad JSON).
  static Result<Checkpoint> Open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  /// All tensor names, sorted.
  std::vector<std::string> Keys() const;
  /// nullptr when absent.
  const safetensors::TensorInfo* Info(const std::string& key) const;
  /// Copies the tensor into an owned CPU tensor of its stored dtype.
  /// Errors: NOT_FOUND naming the key; INVALID_ARGUMENT for a dtype LibTorch lacks.
  Result<torch::Tensor> Load(const std::string& key) const;
  /// Sum of tensor byte lengths.
  uint64_t total_bytes() const;
  /// Shard file names (one entry for an unsharded checkpoint).
  std::vector<std::string> files() const;

 private:
  std::filesystem::path dir_;
  nlohmann::json config_;
  std::vector<safetensors::File> files_;
  std::map<std::string, std::pair<size_t, const safetensors::TensorInfo*>> index_;
};

}  // namespace gatehouse::worker
