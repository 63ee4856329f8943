// A Hugging Face checkpoint directory: config.json plus either model.safetensors or a sharded
// set named by model.safetensors.index.json (docs/gate-facts.md "Sharded checkpoints and tied
// weights").
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
///
/// Two ways in, for two gates (docs/protocols.md §4, "Which gate reports a checkpoint fault"):
/// ReadConfig reads config.json alone (the config gate), Open reads and validates every
/// tensor file too (the load gate). A missing shard or a corrupt file is thus a load fault.
class Checkpoint {
 public:
  /// Reads `dir`/config.json alone; opens no index and no tensor file.
  /// Errors: NOT_FOUND (missing directory or config.json, naming the path), INVALID_ARGUMENT
  /// (not valid JSON, or not a JSON object, naming the path).
  static Result<nlohmann::json> ReadConfig(const std::filesystem::path& dir);

  /// Opens `dir`: config.json (as ReadConfig), then the tensor files. With
  /// model.safetensors.index.json: every shard it names must exist and open, every key it
  /// lists must be present in the shard it names, and no shard may hold a key the index does
  /// not list. Without one: model.safetensors. Each file is validated by
  /// safetensors::File::Open (header, offsets tiling the data buffer, file length).
  /// Errors: NOT_FOUND (missing dir/config/shard, naming it and a tensor the index puts
  /// there), DATA_LOSS (truncated or lying file, naming the file, the tensor, its offsets and
  /// the buffer size; key absent from its shard or a shard key the index does not list, naming
  /// key and shard), INVALID_ARGUMENT (bad JSON, naming the file and field).
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
  /// The tensor as a view of the mapped file, without a copy (safetensors::ViewTensor): it
  /// holds its file's mapping, so it outlives this Checkpoint. Errors as Load.
  Result<torch::Tensor> View(const std::string& key) const;
  /// True when writing the key's View is private copy-on-write (safetensors::File::
  /// copy_on_write), so the view may become a parameter that training updates; false for a
  /// read-only mapping or an unknown key.
  bool CopyOnWrite(const std::string& key) const;
  /// Drops the tensor's pages from this process's resident set (safetensors::File::Release).
  void Release(const std::string& key) const;
  /// The name of the file that holds `key` ("model-00001-of-00002.safetensors"); empty for an
  /// unknown key.
  std::string FileOf(const std::string& key) const;
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
