// Tests of Checkpoint::Open (worker_lib/include/gatehouse/worker/checkpoint.h) over single-file
// and sharded checkpoint directories built here.
#include "gatehouse/worker/checkpoint.h"

#include <gtest/gtest.h>

#include "tests/common/temp_dir.h"
#include <stdlib.h>

#include <fstream>
#include <string>
#include <vector>

namespace gatehouse::worker {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;

testing::AssertionResult Contains(const std::string& message, const std::string& part) {
  if (message.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << part << "\"";
}

using ScratchDir = gatehouse::test_util::TempDir;

class CheckpointTest : public testing::Test {
 protected:
  void SetUp() override {
    WriteText("config.json", R"({"model_type": "llama", "hidden_size": 4})");
  }

  void WriteText(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << text;
  }

  // Writes a shard of F32 tensors, each of shape [2] holding {first, first + 1} where `first`
  // is the tensor's position in `names` times 10.
  void WriteShard(const std::string& file, const std::vector<std::string>& names) {
    std::vector<std::vector<float>> values;
    std::vector<st::TensorBytes> tensors;
    values.reserve(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      float first = static_cast<float>(i * 10);
      values.push_back({first, first + 1});
      tensors.push_back({names[i], st::Dtype::kF32, {2},
                         {reinterpret_cast<const char*>(values.back().data()), 8}});
    }
    ASSERT_TRUE(st::WriteFile(dir_ / file, tensors, {{"format", "pt"}}).ok());
  }

  // Writes model.safetensors.index.json mapping each tensor to its shard.
  void WriteIndex(const std::map<std::string, std::string>& weight_map) {
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
    WriteText("model.safetensors.index.json", index.dump(2));
  }

  // The two-shard layout most tests start from.
  void WriteTwoShards() {
    WriteShard("model-00001-of-00002.safetensors", {"embed.weight", "layers.0.weight"});
    WriteShard("model-00002-of-00002.safetensors", {"layers.1.weight", "norm.weight"});
    WriteIndex({{"embed.weight", "model-00001-of-00002.safetensors"},
                {"layers.0.weight", "model-00001-of-00002.safetensors"},
                {"layers.1.weight", "model-00002-of-00002.safetensors"},
                {"norm.weight", "model-00002-of-00002.safetensors"}});
  }

  ScratchDir scratch_{"checkpoint_test"};
  const fs::path dir_ = scratch_.path();
};

// A single model.safetensors opens: keys, info, config, total bytes and loaded values.
TEST_F(CheckpointTest, SingleFileHappyPath) {
  WriteShard("model.safetensors", {"a", "b"});
  Result<Checkpoint> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ(ckpt->Keys(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ckpt->files(), (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(ckpt->config().at("model_type"), "llama");
  EXPECT_EQ(ckpt->total_bytes(), 16u);
  ASSERT_NE(ckpt->Info("b"), nullptr);
  EXPECT_EQ(ckpt->Info("b")->shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(ckpt->Info("c"), nullptr);
  Result<torch::Tensor> b = ckpt->Load("b");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(torch::equal(*b, torch::tensor({10.0f, 11.0f})));
}

// A sharded checkpoint opens every shard; each key loads from the shard the index names.
TEST_F(CheckpointTest, ShardedHappyPath) {
  WriteTwoShards();
  Result<Checkpoint> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ(ckpt->Keys(), (std::vector<std::string>{"embed.weight", "layers.0.weight",
                                                    "layers.1.weight", "norm.weight"}));
  EXPECT_EQ(ckpt->files(), (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                     "model-00002-of-00002.safetensors"}));
  EXPECT_EQ(ckpt->total_bytes(), 32u);
  Result<torch::Tensor> norm = ckpt->Load("norm.weight");
  ASSERT_TRUE(norm.ok()) << norm.status().ToString();
  EXPECT_TRUE(torch::equal(*norm, torch::tensor({10.0f, 11.0f})));
  Result<torch::Tensor> embed = ckpt->Load("embed.weight");
  ASSERT_TRUE(embed.ok()) << embed.status().ToString();
  EXPECT_TRUE(torch::equal(*embed, torch::tensor({0.0f, 1.0f})));
}

// A moved Checkpoint keeps valid tensor infos (they point into the mapped files).
TEST_F(CheckpointTest, MovedCheckpointStaysUsable) {
  WriteTwoShards();
  Result<Checkpoint> opened = Checkpoint::Open(dir_);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Checkpoint ckpt = std::move(opened).value();
  ASSERT_NE(ckpt.Info("layers.1.weight"), nullptr);
  EXPECT_EQ(ckpt.Info("layers.1.weight")->name, "layers.1.weight");
  EXPECT_TRUE(ckpt.Load("layers.1.weight").ok());
}

// A shard named by the index but absent is NOT_FOUND naming the shard.
TEST_F(CheckpointTest, MissingShard) {
  WriteTwoShards();
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  Status s = Checkpoint::Open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s.message(), "names shard 'model-00002-of-00002.safetensors' (for tensor "
                                    "'layers.1.weight' and others), which does not exist"));
}

// A key the index places in a shard that lacks it is DATA_LOSS naming key and shard.
TEST_F(CheckpointTest, IndexedKeyAbsentFromItsShard) {
  WriteShard("model-00001-of-00002.safetensors", {"embed.weight"});
  WriteShard("model-00002-of-00002.safetensors", {"norm.weight"});
  WriteIndex({{"embed.weight", "model-00001-of-00002.safetensors"},
              {"lm_head.weight", "model-00002-of-00002.safetensors"},
              {"norm.weight", "model-00002-of-00002.safetensors"}});
  Status s = Checkpoint::Open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "lists tensor 'lm_head.weight' in shard "
                                    "'model-00002-of-00002.safetensors', but that shard does "
                                    "not hold it"));
}

// A key held by a shard but missing from the index is DATA_LOSS naming key and shard.
TEST_F(CheckpointTest, ExtraKeyInShardNotInIndex) {
  WriteShard("model-00001-of-00002.safetensors", {"embed.weight", "stray.weight"});
  WriteShard("model-00002-of-00002.safetensors", {"norm.weight"});
  WriteIndex({{"embed.weight", "model-00001-of-00002.safetensors"},
              {"norm.weight", "model-00002-of-00002.safetensors"}});
  Status s = Checkpoint::Open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "shard 'model-00001-of-00002.safetensors' holds tensor "
                                    "'stray.weight', which"));
  EXPECT_TRUE(Contains(s.message(), "does not list"));
}

// A key held by two shards is DATA_LOSS naming the key and both shards.
TEST_F(CheckpointTest, KeyInTwoShards) {
  WriteShard("model-00001-of-00002.safetensors", {"embed.weight", "norm.weight"});
  WriteShard("model-00002-of-00002.safetensors", {"norm.weight"});
  WriteIndex({{"embed.weight", "model-00001-of-00002.safetensors"},
              {"norm.weight", "model-00002-of-00002.safetensors"}});
  Status s = Checkpoint::Open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "tensor 'norm.weight' is in two files: shard "
                                    "'model-00002-of-00002.safetensors'"));
  EXPECT_TRUE(Contains(s.message(), "and shard 'model-00001-of-00002.safetensors'"));
}

// A corrupt shard fails with the shard's own DATA_LOSS, naming its path and the tensor.
TEST_F(CheckpointTest, CorruptShardNamesItsPath) {
  WriteTwoShards();
  const fs::path shard = dir_ / "model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 4);
  Status s = Checkpoint::Open(dir_).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), shard.string()));
  EXPECT_TRUE(Contains(s.message(), "tensor 'norm.weight'"));
}

// config.json must exist (NOT_FOUND) and hold a JSON object (INVALID_ARGUMENT), named in both.
TEST_F(CheckpointTest, ConfigMustBeAnObject) {
  WriteShard("model.safetensors", {"a"});
  WriteText("config.json", "[1, 2]");
  Status array = Checkpoint::Open(dir_).status();
  EXPECT_EQ(array.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(array.message(), "config.json' holds array, expected a JSON object"));

  WriteText("config.json", "{\"a\": ");
  Status bad = Checkpoint::Open(dir_).status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.message(), "config.json' is not valid JSON"));

  fs::remove(dir_ / "config.json");
  Status missing = Checkpoint::Open(dir_).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.message(), "config.json' does not exist"));
}

// A directory with neither weights file, or no directory at all, is NOT_FOUND naming it.
TEST_F(CheckpointTest, MissingWeightsOrDirectory) {
  Status none = Checkpoint::Open(dir_).status();
  EXPECT_EQ(none.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(none.message(), "has neither model.safetensors nor "
                                       "model.safetensors.index.json"));
  Status nodir = Checkpoint::Open(dir_ / "absent").status();
  EXPECT_EQ(nodir.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(nodir.message(), "absent' does not exist"));
}

// An index whose weight_map is malformed or points outside the directory is INVALID_ARGUMENT.
TEST_F(CheckpointTest, MalformedIndex) {
  WriteText("model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  Status number = Checkpoint::Open(dir_).status();
  EXPECT_EQ(number.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(number.message(), "weight_map['a'] is number, expected a shard file name"));

  WriteIndex({{"a", "../model.safetensors"}});
  Status escape = Checkpoint::Open(dir_).status();
  EXPECT_EQ(escape.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(escape.message(), "weight_map['a'] = '../model.safetensors' is not a file "
                                         "name in the checkpoint directory"));
}

// Loading a key the checkpoint lacks is NOT_FOUND naming the key.
TEST_F(CheckpointTest, LoadUnknownKey) {
  WriteShard("model.safetensors", {"a"});
  Result<Checkpoint> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  Status s = ckpt->Load("lm_head.weight").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s.message(), "has no tensor 'lm_head.weight'"));
}

}  // namespace
}  // namespace gatehouse::worker
