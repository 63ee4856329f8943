// Hugging Face checkpoint directories (docs/gate-facts.md "Sharded checkpoints and tied weights").
#include "gatehouse/worker/checkpoint.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "gatehouse/worker/safetensors_torch.h"

namespace gatehouse::worker {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kConfigName = "config.json";
constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// stat(2) rather than std::filesystem: the LibTorch wheel exports its own, partly broken, copy
// of libstdc++'s filesystem functions (pytorch/pytorch#133437), and it wins symbol lookup.
bool IsFile(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsDirectory(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Reads and parses a JSON file that must hold an object.
// Errors: NOT_FOUND (missing/unreadable), INVALID_ARGUMENT (bad JSON or not an object).
Result<json> ReadJsonObject(const fs::path& path) {
  const std::string where = Quote(path.string());
  if (!IsFile(path)) return Status::NotFound(where + " does not exist");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(where + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  json value;
  try {
    value = json::parse(text.str());
  } catch (const json::exception& e) {
    return Status::InvalidArgument(where + " is not valid JSON: " + e.what());
  }
  if (!value.is_object()) {
    return Status::InvalidArgument(where + " holds " + std::string(value.type_name()) +
                                   ", expected a JSON object");
  }
  return value;
}

// Shard names from an index's weight_map: tensor -> plain file name in the directory.
Result<std::map<std::string, std::string>> ReadWeightMap(const json& index,
                                                          const std::string& where) {
  auto it = index.find("weight_map");
  if (it == index.end()) return Status::InvalidArgument(where + ": field 'weight_map' is missing");
  if (!it->is_object()) {
    return Status::InvalidArgument(where + ": field 'weight_map' is " +
                                   std::string(it->type_name()) + ", expected an object");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [key, value] : it->items()) {
    if (!value.is_string()) {
      return Status::InvalidArgument(where + ": weight_map[" + Quote(key) + "] is " +
                                     std::string(value.type_name()) +
                                     ", expected a shard file name");
    }
    std::string shard = value.get<std::string>();
    if (shard.empty() || shard == "." || shard == ".." ||
        shard.find('/') != std::string::npos) {
      return Status::InvalidArgument(where + ": weight_map[" + Quote(key) + "] = " +
                                     Quote(shard) +
                                     " is not a file name in the checkpoint directory");
    }
    weight_map[key] = std::move(shard);
  }
  return weight_map;
}

}  // namespace

Result<nlohmann::json> Checkpoint::ReadConfig(const std::filesystem::path& dir) {
  if (!IsDirectory(dir)) {
    return Status::NotFound("checkpoint directory " + Quote(dir.string()) + " does not exist");
  }
  return ReadJsonObject(dir / kConfigName);
}

Result<Checkpoint> Checkpoint::Open(const std::filesystem::path& dir) {
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  GH_ASSIGN_OR_RETURN(ckpt.config_, ReadConfig(dir));

  const fs::path index_path = dir / kIndexName;
  if (!IsFile(index_path)) {
    const fs::path single = dir / kSingleName;
    if (!IsFile(single)) {
      return Status::NotFound("checkpoint directory " + Quote(dir.string()) + " has neither " +
                              kSingleName + " nor " + kIndexName);
    }
    GH_ASSIGN_OR_RETURN(safetensors::File file, safetensors::File::Open(single));
    ckpt.files_.push_back(std::move(file));
    for (const safetensors::TensorInfo& info : ckpt.files_[0].tensors()) {
      ckpt.index_[info.name] = {0, &info};
    }
    return ckpt;
  }

  const std::string where = Quote(index_path.string());
  GH_ASSIGN_OR_RETURN(json index, ReadJsonObject(index_path));
  GH_ASSIGN_OR_RETURN(auto weight_map, ReadWeightMap(index, where));

  // Open each shard once, in name order.
  std::map<std::string, size_t> shard_slot;
  std::map<std::string, std::string> first_key;  // shard -> its first tensor, for messages
  for (const auto& [key, shard] : weight_map) {
    shard_slot.emplace(shard, 0);
    first_key.emplace(shard, key);
  }
  for (auto& [shard, slot] : shard_slot) {
    const fs::path shard_path = dir / shard;
    if (!IsFile(shard_path)) {
      return Status::NotFound(where + " names shard " + Quote(shard) +
                              " (for tensor " + Quote(first_key.at(shard)) +
                              " and others), which does not exist in " + Quote(dir.string()));
    }
    GH_ASSIGN_OR_RETURN(safetensors::File file, safetensors::File::Open(shard_path));
    slot = ckpt.files_.size();
    ckpt.files_.push_back(std::move(file));
  }

  // Every indexed key is in the shard the index names.
  for (const auto& [key, shard] : weight_map) {
    const size_t slot = shard_slot.at(shard);
    const safetensors::TensorInfo* info = ckpt.files_[slot].Find(key);
    if (info == nullptr) {
      return Status::DataLoss(where + " lists tensor " + Quote(key) + " in shard " +
                              Quote(shard) + ", but that shard does not hold it");
    }
    ckpt.index_[key] = {slot, info};
  }
  // No shard holds a key the index does not list there.
  for (const auto& [shard, slot] : shard_slot) {
    for (const safetensors::TensorInfo& info : ckpt.files_[slot].tensors()) {
      auto it = weight_map.find(info.name);
      if (it == weight_map.end()) {
        return Status::DataLoss("shard " + Quote(shard) + " holds tensor " + Quote(info.name) +
                                ", which " + where + " does not list");
      }
      if (it->second != shard) {
        return Status::DataLoss("tensor " + Quote(info.name) + " is in two files: shard " +
                                Quote(it->second) + " (as " + where + " lists) and shard " +
                                Quote(shard));
      }
    }
  }
  return ckpt;
}

std::vector<std::string> Checkpoint::Keys() const {
  std::vector<std::string> keys;
  keys.reserve(index_.size());
  for (const auto& [key, entry] : index_) keys.push_back(key);
  return keys;
}

const safetensors::TensorInfo* Checkpoint::Info(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : it->second.second;
}

Result<torch::Tensor> Checkpoint::Load(const std::string& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) {
    return Status::NotFound("checkpoint " + Quote(dir_.string()) + " has no tensor " +
                            Quote(key));
  }
  const auto& [slot, info] = it->second;
  return safetensors::ReadTensor(files_[slot], *info);
}

Result<torch::Tensor> Checkpoint::View(const std::string& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) {
    return Status::NotFound("checkpoint " + Quote(dir_.string()) + " has no tensor " +
                            Quote(key));
  }
  const auto& [slot, info] = it->second;
  return safetensors::ViewTensor(files_[slot], *info);
}

bool Checkpoint::CopyOnWrite(const std::string& key) const {
  auto it = index_.find(key);
  return it != index_.end() && files_[it->second.first].copy_on_write();
}

void Checkpoint::Release(const std::string& key) const {
  auto it = index_.find(key);
  if (it != index_.end()) files_[it->second.first].Release(*it->second.second);
}

std::string Checkpoint::FileOf(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? std::string() : files_[it->second.first].path().filename().string();
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [key, entry] : index_) total += entry.second->end - entry.second->begin;
  return total;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> names;
  names.reserve(files_.size());
  for (const safetensors::File& f : files_) names.push_back(f.path().filename().string());
  return names;
}

}  // namespace gatehouse::worker
