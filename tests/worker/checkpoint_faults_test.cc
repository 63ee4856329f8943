// Checkpoint and config faults that must be caught, over REAL transformers-saved checkpoints.
//
// Each test copies one fixture of tools/refgen/make_checkpoint.py (llama-tiny-untied,
// llama-tiny-tied, llama-tiny-sharded, made by the `testdata` ctest fixture) into a temp dir,
// damages it in one specific way, and runs the real gate runner (RunGates) with the in-tree
// llama plugin, reached only through its entry point and the SDK interfaces (model_family.h).
// Each asserts the gate that stopped the run, its status and failure class, that the reason
// names the tensor or field and the values, and that every later requested phase is SKIPPED
// naming that gate. Which gate reports what: docs/protocols.md §4.
//
// The damage is done on raw bytes and JSON (RawSafetensors below), not with our own
// safetensors reader or writer, so a bug there cannot hide in the fixture.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/phases.h"
#include "common/sha256.h"
#include "gatehouse/worker/checkpoint.h"
#include "gatehouse/worker/events.h"
#include "gatehouse/worker/gates.h"
#include "gatehouse/worker/model_family.h"
#include "tests/common/temp_dir.h"
#include "tests/models/family_test_util.h"

namespace gatehouse::worker {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kUntied = "llama-tiny-untied";
constexpr const char* kTied = "llama-tiny-tied";
constexpr const char* kSharded = "llama-tiny-sharded";
constexpr const char* kIndex = "model.safetensors.index.json";

/// Phases requested by default: up to inference, where a fault would otherwise first show.
const std::vector<std::string> kThroughInference = {"identity", "config", "construct", "load",
                                                    "inference"};

/// The in-tree plugin's registry, filled once through its exported entry point.
using test_util::Registry;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

json ReadJson(const fs::path& path) { return json::parse(ReadText(path)); }
void WriteJson(const fs::path& path, const json& j) { WriteText(path, j.dump(2)); }

/// A safetensors file as its header JSON and data buffer (format: huggingface/safetensors
/// README), edited directly. Offsets are relative to the buffer; end is exclusive.
struct RawSafetensors {
  json header;       // as stored, __metadata__ included
  std::string data;  // the data buffer

  static RawSafetensors Read(const fs::path& path) {
    const std::string bytes = ReadText(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), sizeof(n));  // little-endian host
    return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
  }

  /// Writes the file, the header padded with spaces to a multiple of 8 (as upstream).
  void Write(const fs::path& path) const {
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t n = text.size();
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &n, sizeof(n));
    WriteText(path, bytes + text + data);
  }

  uint64_t Begin(const std::string& name) const { return header.at(name).at("data_offsets")[0]; }
  uint64_t End(const std::string& name) const { return header.at(name).at("data_offsets")[1]; }
  std::string Bytes(const std::string& name) const {
    return data.substr(Begin(name), End(name) - Begin(name));
  }
  /// Element `i` of an F32 tensor.
  float F32(const std::string& name, size_t i) const {
    float v;
    std::memcpy(&v, data.data() + Begin(name) + 4 * i, 4);
    return v;
  }
  void SetF32(const std::string& name, size_t i, float v) {
    std::memcpy(data.data() + Begin(name) + 4 * i, &v, 4);
  }

  /// Appends a tensor at the end of the buffer.
  void Append(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
              const std::string& bytes) {
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }

  /// Removes a tensor and its bytes; later tensors move down.
  void Remove(const std::string& name) {
    const uint64_t begin = Begin(name), end = End(name);
    header.erase(name);
    data.erase(begin, end - begin);
    for (auto& [key, entry] : header.items()) {
      if (key == "__metadata__") continue;
      auto& offsets = entry["data_offsets"];
      if (offsets[0].get<uint64_t>() >= end) {
        offsets = {offsets[0].get<uint64_t>() - (end - begin), offsets[1].get<uint64_t>() - (end - begin)};
      }
    }
  }

  /// Tensor names in data_offsets order.
  std::vector<std::string> InOffsetOrder() const {
    std::map<uint64_t, std::string> by_begin;
    for (const auto& [key, entry] : header.items()) {
      if (key != "__metadata__") by_begin[entry["data_offsets"][0].get<uint64_t>()] = key;
    }
    std::vector<std::string> names;
    for (const auto& [begin, name] : by_begin) names.push_back(name);
    return names;
  }
};

std::string Offsets(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

/// What one run reported.
struct RunResult {
  GateStatus overall = GateStatus::kUnknown;
  std::map<std::string, json> ends;                        // phase -> phase_end event
  std::map<std::string, std::map<std::string, json>> figures;  // phase -> name -> value
  std::string Reason(const std::string& phase) const {
    auto it = ends.find(phase);
    return it == ends.end() ? std::string("<no phase_end>") : it->second.value("reason", "");
  }
};

/// One damaged copy of a fixture, with a run spec over it.
struct Case {
  explicit Case(const std::string& variant)
      : source(test_util::FixtureDir(variant)),
        checkpoint(dir.path() / "checkpoint"),
        attempt_dir(dir.path() / "attempt") {
    if (!fs::is_directory(source / "checkpoint")) {
      ADD_FAILURE() << "fixture " << source << " is missing: run the make_testdata test first";
      return;
    }
    fs::copy(source / "checkpoint", checkpoint, fs::copy_options::recursive);
    fs::create_directories(attempt_dir);
  }

  fs::path File(const std::string& name) const { return checkpoint / name; }
  fs::path Single() const { return File("model.safetensors"); }
  json Config() const { return ReadJson(File("config.json")); }
  void SetConfig(const json& config) const { WriteJson(File("config.json"), config); }
  /// tensor -> shard file, from the index of a sharded fixture.
  std::map<std::string, std::string> WeightMap() const {
    return ReadJson(File(kIndex))["weight_map"].get<std::map<std::string, std::string>>();
  }

  /// The run spec (docs/protocols.md §3) over the damaged copy, digests taken now, so the
  /// identity gate accepts it and the fault is met where it belongs.
  json SpecJson(const std::vector<std::string>& phases) const {
    const std::string sha(40, 'a');
    auto digest = [](const fs::path& dir) {
      Result<std::string> d = DirectoryDigest(dir);
      return d.ok() ? *d : std::string("sha256:missing");
    };
    const fs::path reference = source / "reference";
    return {
        {"spec_version", 1},
        {"repository", "/tmp/adaptation"},
        {"commit", sha},
        {"model_family", "llama"},
        {"checkpoint", {{"path", checkpoint.string()}, {"digest", digest(checkpoint)}}},
        {"reference", {{"path", reference.string()}, {"digest", digest(reference)}}},
        {"runtime", {{"torch", StripLocalVersion(TORCH_VERSION)}, {"device", "cpu"}}},
        {"launch", {{"runner", "gatehouse-worker"}, {"processes_per_rank", 1}}},
        {"topology", {{"tp", tp}, {"dp", 1}, {"pp", 1}, {"ep", 1}}},
        {"precision", "fp32"},
        {"mode", "eager"},
        {"decode", {{"max_new_tokens", 32}, {"sampling", "greedy"}}},
        {"training", {{"steps", 2}, {"lr", 0.001}, {"seed", 1234}}},
        {"env", json::object()},
        {"phases", phases},
        {"attempt",
         {{"id", 1},
          {"dir", attempt_dir.string()},
          {"checkout", {{"head", sha}, {"clean", true}, {"path", "/tmp/adaptation"}}},
          {"agent", "test-agent"}}},
    };
  }

  /// Runs the default gates over the copy, in process, collecting the events.
  RunResult Run(const std::vector<std::string>& phases = kThroughInference) const {
    RunResult result;
    GateContext ctx;
    Result<RunSpec> spec = ParseRunSpec(SpecJson(phases));
    if (!spec.ok()) {
      ADD_FAILURE() << spec.status().ToString();
      return result;
    }
    ctx.spec = *spec;
    ctx.registry = &Registry();
    ctx.runtime = ProbeRuntime();
    MemoryEventSink sink;
    EventWriter events(sink);
    result.overall = RunGates(ctx, events);
    for (const json& e : sink.events()) {
      if (e["event"] == "phase_end") result.ends[e["phase"]] = e;
      if (e["event"] == "figure") result.figures[e["phase"]][e["name"]] = e["value"];
    }
    return result;
  }

  test_util::TempDir dir{"gatehouse-faults"};
  fs::path source;       // the fixture variant (its reference is used in place)
  fs::path checkpoint;   // the damaged copy
  fs::path attempt_dir;
  int64_t tp = 1;        // topology.tp of the run spec
};

/// Checks that the run stopped at `phase` with `status` (and `classification`, "" unless
/// FAIL): every requested phase before it PASSed, every requested phase after it is SKIPPED
/// naming it, and run_end carries the stopping status.
void ExpectStoppedAt(const RunResult& r, const std::vector<std::string>& phases,
                     const std::string& phase, GateStatus status,
                     const std::string& classification) {
  const std::string status_name(GateStatusName(status));
  bool after = false;
  for (const std::string& p : phases) {
    ASSERT_TRUE(r.ends.count(p)) << "no phase_end for " << p;
    const json& end = r.ends.at(p);
    if (p == phase) {
      EXPECT_EQ(end["status"], status_name) << end.dump();
      EXPECT_EQ(end["classification"], classification) << end.dump();
      after = true;
    } else if (!after) {
      EXPECT_EQ(end["status"], "PASS") << end.dump();
    } else {
      EXPECT_EQ(end["status"], "SKIPPED") << end.dump();
      EXPECT_EQ(end["reason"], "skipped: earlier phase " + phase + " ended " + status_name);
    }
  }
  EXPECT_TRUE(after) << "phase " << phase << " was not requested";
  EXPECT_EQ(GateStatusName(r.overall), status_name);
}

// --- the split: config reads config.json only -------------------------------------------

// Verifies Checkpoint::ReadConfig reads config.json of a checkpoint whose shard is missing
// (the config gate's view), while Checkpoint::Open refuses it naming the shard (the load
// gate's view).
TEST(CheckpointReadConfigTest, ReadsConfigWithoutTouchingShards) {
  Case c(kSharded);
  fs::remove(c.File("model-00002-of-00005.safetensors"));
  Result<json> config = Checkpoint::ReadConfig(c.checkpoint);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ((*config)["model_type"], "llama");
  EXPECT_EQ((*config)["hidden_size"], 64);
  Result<Checkpoint> opened = Checkpoint::Open(c.checkpoint);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(opened.status().message(), HasSubstr("'model-00002-of-00005.safetensors'"));
}

// Verifies ReadConfig's errors name the path: a missing directory, a config.json that is not
// JSON.
TEST(CheckpointReadConfigTest, ErrorsNameThePath) {
  Case c(kUntied);
  Result<json> absent = Checkpoint::ReadConfig(c.dir.path() / "absent");
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(), HasSubstr("absent' does not exist"));
  WriteText(c.File("config.json"), "{\"model_type\": \"llama\",");
  Result<json> bad = Checkpoint::ReadConfig(c.checkpoint);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr(c.File("config.json").string()));
}

// Verifies the undamaged fixtures pass every phase through inference (the control: each
// fault below is then the only cause of its verdict), with the load figures.
TEST(CheckpointFaultsTest, UndamagedFixturesPass) {
  for (const char* variant : {kUntied, kTied, kSharded}) {
    SCOPED_TRACE(variant);
    Case c(variant);
    RunResult r = c.Run();
    for (const std::string& p : kThroughInference) {
      EXPECT_EQ(r.ends[p]["status"], "PASS") << r.ends[p].dump();
    }
    EXPECT_EQ(r.figures["load"]["checkpoint_files"], variant == std::string(kSharded) ? 5 : 1);
    EXPECT_EQ(r.figures["load"]["keys_missing"], 0);
    EXPECT_EQ(r.figures["load"]["tied"], variant == std::string(kTied) ? "true" : "false");
  }
}

// --- tensor files: BLOCKED at load ----------------------------------------------------------

// Verifies a shard the index names but that is absent passes config and construct (config
// reads config.json only) and BLOCKs load naming the shard and a tensor the index puts in it;
// later phases are SKIPPED naming load.
TEST(CheckpointFaultsTest, MissingShardBlocksLoad) {
  Case c(kSharded);
  const std::string shard = "model-00003-of-00005.safetensors";
  std::string first_key;  // the index's first tensor (by name) in that shard
  for (const auto& [key, file] : c.WeightMap()) {
    if (file == shard && first_key.empty()) first_key = key;
  }
  ASSERT_FALSE(first_key.empty());
  fs::remove(c.File(shard));
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kBlocked, "");
  EXPECT_THAT(r.Reason("load"), HasSubstr("names shard '" + shard + "' (for tensor '" +
                                          first_key + "' and others), which does not exist"));
  EXPECT_THAT(r.Reason("load"), HasSubstr(c.checkpoint.string()));
}

// Verifies a tensor the index lists but its shard lacks BLOCKs load naming tensor and shard.
TEST(CheckpointFaultsTest, IndexKeyAbsentFromShardBlocksLoad) {
  Case c(kSharded);
  const std::string key = "model.layers.0.self_attn.q_proj.weight";
  const std::string shard = c.WeightMap().at(key);
  RawSafetensors raw = RawSafetensors::Read(c.File(shard));
  raw.Remove(key);
  raw.Write(c.File(shard));
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kBlocked, "");
  EXPECT_THAT(r.Reason("load"), HasSubstr("lists tensor '" + key + "' in shard '" + shard +
                                          "', but that shard does not hold it"));
}

// Verifies a shard holding a tensor the index does not list BLOCKs load naming both (the
// checkpoint contradicts itself; no adapter is involved yet).
TEST(CheckpointFaultsTest, ShardKeyNotInIndexBlocksLoad) {
  Case c(kSharded);
  const std::string shard = "model-00002-of-00005.safetensors";
  const std::string key = "model.layers.0.mlp.extra_proj.weight";
  RawSafetensors raw = RawSafetensors::Read(c.File(shard));
  raw.Append(key, "F32", {4}, std::string(16, '\0'));
  raw.Write(c.File(shard));
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kBlocked, "");
  EXPECT_THAT(r.Reason("load"), HasSubstr("shard '" + shard + "' holds tensor '" + key + "'"));
  EXPECT_THAT(r.Reason("load"), HasSubstr("does not list"));
}

// Verifies a file cut short in its data passes config and construct and BLOCKs load naming
// the file, the last tensor, its offsets and the sizes actually there.
TEST(CheckpointFaultsTest, TruncatedFileBlocksLoad) {
  Case c(kUntied);
  const RawSafetensors raw = RawSafetensors::Read(c.Single());
  const std::string last = raw.InOffsetOrder().back();
  const std::string bytes = ReadText(c.Single());
  WriteText(c.Single(), bytes.substr(0, bytes.size() - 100));
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kBlocked, "");
  const std::string reason = r.Reason("load");
  EXPECT_THAT(reason, HasSubstr("safetensors file '" + c.Single().string() + "' (" +
                                std::to_string(bytes.size() - 100) + " bytes"));
  EXPECT_THAT(reason, HasSubstr("tensor '" + last + "': data_offsets " +
                                Offsets(raw.Begin(last), raw.End(last)) +
                                " run past the end of the data buffer, which holds " +
                                std::to_string(raw.data.size() - 100) + " bytes"));
}

// Verifies a file cut inside its header BLOCKs load naming the file, the header length and
// the file size.
TEST(CheckpointFaultsTest, FileTruncatedInHeaderBlocksLoad) {
  Case c(kUntied);
  const std::string bytes = ReadText(c.Single());
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  WriteText(c.Single(), bytes.substr(0, 40));
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kBlocked, "");
  EXPECT_THAT(r.Reason("load"), HasSubstr(c.Single().string()));
  EXPECT_THAT(r.Reason("load"), HasSubstr("header length " + std::to_string(header_bytes) +
                                          " runs past the end of the file (40 bytes"));
}

// Verifies a truncated shard of a sharded checkpoint BLOCKs load naming that shard's file.
TEST(CheckpointFaultsTest, TruncatedShardBlocksLoad) {
  Case c(kSharded);
  const fs::path shard = c.File("model-00004-of-00005.safetensors");
  const std::string bytes = ReadText(shard);
  WriteText(shard, bytes.substr(0, bytes.size() - 4));
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kBlocked, "");
  EXPECT_THAT(r.Reason("load"), HasSubstr("safetensors file '" + shard.string() + "'"));
  EXPECT_THAT(r.Reason("load"), HasSubstr("run past the end of the data buffer"));
}

// Verifies a header whose offsets overlap BLOCKs load naming both tensors and the offsets.
TEST(CheckpointFaultsTest, OverlappingOffsetsBlockLoad) {
  Case c(kUntied);
  RawSafetensors raw = RawSafetensors::Read(c.Single());
  const std::vector<std::string> order = raw.InOffsetOrder();
  const std::string first = order[0], second = order[1];
  const uint64_t begin = raw.Begin(second) - 4, end = raw.End(second) - 4;
  raw.header[second]["data_offsets"] = {begin, end};
  raw.Write(c.Single());
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kBlocked, "");
  EXPECT_THAT(r.Reason("load"), HasSubstr("tensor '" + second + "': data_offsets " +
                                          Offsets(begin, end) + " overlap tensor '" + first +
                                          "' ending at " + std::to_string(raw.End(first))));
}

// Verifies NaN and Inf in weights BLOCK load (the checkpoint's data, not the adapter's
// mapping), naming each tensor and its counts.
TEST(CheckpointFaultsTest, NonFiniteWeightsBlockLoad) {
  Case c(kUntied);
  RawSafetensors raw = RawSafetensors::Read(c.Single());
  raw.SetF32("model.layers.1.mlp.down_proj.weight", 7, std::nanf(""));
  raw.SetF32("model.layers.0.post_attention_layernorm.weight", 0, INFINITY);
  raw.SetF32("model.layers.0.post_attention_layernorm.weight", 63, -INFINITY);
  raw.Write(c.Single());
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kBlocked, "");
  const std::string reason = r.Reason("load");
  EXPECT_THAT(reason, HasSubstr("2 tensor(s) with NaN/Inf"));
  EXPECT_THAT(reason, HasSubstr("model.layers.1.mlp.down_proj.weight"));
  EXPECT_THAT(reason, HasSubstr("1 NaN, 0 Inf"));
  EXPECT_THAT(reason, HasSubstr("model.layers.0.post_attention_layernorm.weight"));
  EXPECT_THAT(reason, HasSubstr("0 NaN, 2 Inf"));
}

// --- tied embeddings -----------------------------------------------------------------------

// Verifies a tied checkpoint that also ships lm_head.weight equal to the embedding (as a
// converted .bin checkpoint does) loads, says which weight was used, and matches upstream's
// logits: transformers 5.24 ties equal weights (PreTrainedModel.tie_weights).
TEST(CheckpointFaultsTest, TiedWithEqualLmHeadAcceptedAndSaysWhich) {
  Case c(kTied);
  RawSafetensors raw = RawSafetensors::Read(c.Single());
  const int64_t keys = static_cast<int64_t>(raw.InOffsetOrder().size());
  raw.Append("lm_head.weight", "F32", {256, 64}, raw.Bytes("model.embed_tokens.weight"));
  raw.Write(c.Single());
  RunResult r = c.Run();
  for (const std::string& p : kThroughInference) {
    EXPECT_EQ(r.ends[p]["status"], "PASS") << r.ends[p].dump();
  }
  EXPECT_EQ(r.figures["load"]["keys_total"], keys + 1);
  EXPECT_EQ(r.figures["load"]["keys_used"], keys);
  EXPECT_EQ(r.figures["load"]["tied_lm_head"],
            "checkpoint ships lm_head.weight (equal to model.embed_tokens.weight); "
            "tie_word_embeddings=true: model.embed_tokens.weight used (as upstream)");
}

// Verifies a tied checkpoint shipping an lm_head.weight that differs from the embedding
// BLOCKs load: upstream would untie them, which a tied model cannot; the reason names both
// tensors, how many elements differ and by how much.
TEST(CheckpointFaultsTest, TiedWithDifferentLmHeadBlocksLoad) {
  Case c(kTied);
  RawSafetensors raw = RawSafetensors::Read(c.Single());
  raw.Append("lm_head.weight", "F32", {256, 64}, raw.Bytes("model.embed_tokens.weight"));
  const float was = raw.F32("lm_head.weight", 5);
  raw.SetF32("lm_head.weight", 5, 3.0f);
  raw.Write(c.Single());
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kBlocked, "");
  char diff[32];
  std::snprintf(diff, sizeof(diff), "%.4g", static_cast<double>(std::fabs(3.0f - was)));
  EXPECT_THAT(r.Reason("load"),
              HasSubstr("tie_word_embeddings=true but the checkpoint ships lm_head.weight "
                        "different from model.embed_tokens.weight (1 of 16384 elements differ "
                        "in Float, max abs diff " + std::string(diff) + ")"));
  EXPECT_THAT(r.Reason("load"), HasSubstr("tie_word_embeddings=false"));
}

// Verifies an untied checkpoint without lm_head.weight FAILs load naming the key and the
// tie setting that makes it required.
TEST(CheckpointFaultsTest, UntiedWithoutLmHeadFailsLoad) {
  Case c(kUntied);
  RawSafetensors raw = RawSafetensors::Read(c.Single());
  raw.Remove("lm_head.weight");
  raw.Write(c.Single());
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kFail, "adapter_contract");
  EXPECT_THAT(r.Reason("load"), HasSubstr("1 missing key(s) (tie_word_embeddings=false): "
                                          "lm_head.weight"));
  EXPECT_EQ(r.figures["load"]["keys_missing"], 1);
  EXPECT_EQ(r.figures["load"]["tied"], "false");
}

// --- names and shapes: FAIL adapter_contract at load ---------------------------------------

// Verifies a key no row of the adapter's table maps FAILs load naming it.
TEST(CheckpointFaultsTest, UnexpectedKeyFailsLoad) {
  Case c(kUntied);
  const std::string key = "model.layers.0.mlp.extra_proj.weight";
  RawSafetensors raw = RawSafetensors::Read(c.Single());
  raw.Append(key, "F32", {64}, raw.Bytes("model.norm.weight"));
  raw.Write(c.Single());
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kFail, "adapter_contract");
  EXPECT_THAT(r.Reason("load"), HasSubstr("1 unexpected key(s): " + key));
  EXPECT_EQ(r.figures["load"]["keys_unexpected"], 1);
}

// Verifies a tensor stored with another shape (same bytes) FAILs load naming it and both
// shapes.
TEST(CheckpointFaultsTest, ShapeMismatchFailsLoad) {
  Case c(kUntied);
  RawSafetensors raw = RawSafetensors::Read(c.Single());
  raw.header["model.norm.weight"]["shape"] = {2, 32};
  raw.Write(c.Single());
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "load", GateStatus::kFail, "adapter_contract");
  EXPECT_THAT(r.Reason("load"), HasSubstr("model.norm.weight"));
  EXPECT_THAT(r.Reason("load"), HasSubstr("checkpoint [2, 32] vs model [64]"));
}

// --- config faults ---------------------------------------------------------------------------

// Verifies an unreadable config.json BLOCKs config (an input fault) naming the file.
TEST(ConfigFaultsTest, UnreadableConfigBlocksConfig) {
  Case c(kUntied);
  const std::string text = ReadText(c.File("config.json"));
  WriteText(c.File("config.json"), text.substr(0, text.size() / 2));
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "config", GateStatus::kBlocked, "");
  EXPECT_THAT(r.Reason("config"), HasSubstr(c.File("config.json").string() + "' is not valid JSON"));
}

// Verifies TP sizes that do not divide the head counts BLOCK config (the layout does not fit the
// checkpoint; the adapter is not at fault) naming the size and each count it does not divide
// (4 attention heads, 2 KV heads), and one that divides both passes.
TEST(ConfigFaultsTest, TpNotDividingHeadsBlocksConfig) {
  Case c(kUntied);
  c.tp = 3;
  RunResult r3 = c.Run();
  ExpectStoppedAt(r3, kThroughInference, "config", GateStatus::kBlocked, "");
  EXPECT_THAT(r3.Reason("config"), HasSubstr("tp=3"));
  EXPECT_THAT(r3.Reason("config"), HasSubstr("num_attention_heads=4"));
  EXPECT_THAT(r3.Reason("config"), HasSubstr("num_key_value_heads=2"));

  c.tp = 4;
  RunResult r4 = c.Run();
  ExpectStoppedAt(r4, kThroughInference, "config", GateStatus::kBlocked, "");
  EXPECT_THAT(r4.Reason("config"), HasSubstr("tp=4 does not divide num_key_value_heads=2"));
  EXPECT_THAT(r4.Reason("config"), Not(HasSubstr("num_attention_heads")));

  c.tp = 2;
  RunResult r2 = c.Run({"identity", "config"});
  EXPECT_EQ(r2.ends["config"]["status"], "PASS") << r2.ends["config"].dump();
  EXPECT_EQ(r2.figures["config"]["num_attention_heads"], 4);
  EXPECT_EQ(r2.figures["config"]["num_key_value_heads"], 2);
}

// Verifies a RoPE type the family does not implement FAILs config naming field and value.
TEST(ConfigFaultsTest, UnknownRopeTypeFailsConfig) {
  Case c(kUntied);
  json config = c.Config();
  config["rope_parameters"]["rope_type"] = "frobnicate";
  c.SetConfig(config);
  RunResult r = c.Run();
  ExpectStoppedAt(r, kThroughInference, "config", GateStatus::kFail, "adapter_contract");
  EXPECT_THAT(r.Reason("config"), HasSubstr("rope_type"));
  EXPECT_THAT(r.Reason("config"), HasSubstr("frobnicate"));
}

// Verifies a missing required field FAILs config naming it: hidden_size (required by the
// family's ParseConfig) and model_type (the gate's own check, before the family is asked).
TEST(ConfigFaultsTest, MissingRequiredFieldFailsConfig) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"hidden_size", "'hidden_size' is required but missing"},
      {"model_type", "config.json has no string model_type"}};
  for (const auto& [field, expected] : cases) {
    SCOPED_TRACE(field);
    Case c(kUntied);
    json config = c.Config();
    config.erase(field);
    c.SetConfig(config);
    RunResult r = c.Run();
    ExpectStoppedAt(r, kThroughInference, "config", GateStatus::kFail, "adapter_contract");
    EXPECT_THAT(r.Reason("config"), HasSubstr(expected));
  }
}

// --- the worker process ----------------------------------------------------------------------

// Verifies the gatehouse-worker executable with the real plugin survives a truncated
// checkpoint: exit 0, only JSON lines on stdout, load BLOCKED naming the file, run_end BLOCKED.
TEST(CheckpointFaultsTest, WorkerProcessSurvivesTruncatedCheckpoint) {
  Case c(kUntied);
  const std::string bytes = ReadText(c.Single());
  WriteText(c.Single(), bytes.substr(0, bytes.size() - 1000));
  const fs::path run_json = c.dir.path() / "run.json";
  WriteJson(run_json, c.SpecJson(kThroughInference));
  const fs::path out = c.dir.path() / "worker.stdout", err = c.dir.path() / "worker.stderr";
  const std::string cmd = std::string(GATEHOUSE_WORKER_BIN) + " --run-spec " + run_json.string() +
                          " --plugin " + GATEHOUSE_MODELS_PLUGIN + " > " + out.string() + " 2> " +
                          err.string();
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc)) << "worker died: status " << rc << "\n" << ReadText(err);
  EXPECT_EQ(WEXITSTATUS(rc), 0) << ReadText(err);
  std::istringstream lines(ReadText(out));
  std::map<std::string, json> ends;
  json last;
  for (std::string line; std::getline(lines, line);) {
    last = json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(last.is_object() && last.contains("event")) << line;
    if (last["event"] == "phase_end") ends[last["phase"]] = last;
  }
  EXPECT_EQ(ends["config"]["status"], "PASS");
  EXPECT_EQ(ends["load"]["status"], "BLOCKED");
  EXPECT_THAT(ends["load"]["reason"].get<std::string>(), HasSubstr(c.Single().string()));
  EXPECT_EQ(ends["inference"]["reason"], "skipped: earlier phase load ended BLOCKED");
  EXPECT_EQ(last["event"], "run_end");
  EXPECT_EQ(last["status"], "BLOCKED");
}

}  // namespace
}  // namespace gatehouse::worker
