// A tiny fake model family for the gate tests: a few matrices with a causal running mean, a
// name table of its own, a KV cache path, and switches that break it on purpose.
//
// Model (hidden size H, vocabulary V, L layers):
//   x = embed[tokens] + 0.1 sin(position * f)            [B, T, H]
//   per layer: c_t = mean_{s <= t} x_s (over the cached prefix too); x += tanh(c W_l^T)
//   logits = (x * norm) E^T, E = embed (tied) or output   [B, T, V]
// HF names: model.embed_tokens.weight, model.layers.{layer}.proj.weight, model.norm.weight,
// lm_head.weight (absent when tied), model.unused.weight (only with unused_param).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gatehouse/worker/model_family.h"

namespace gatehouse::worker::testing {

/// Switches that make the fake family misbehave.
struct FakeOptions {
  /// Registers a parameter "unused.weight" that Forward never reads (it gets no gradient).
  bool unused_param = false;
  /// The packed forward: absent (SupportsPacked false), running means that cross sequence
  /// boundaries, or positions counted along the whole row instead of the given ones.
  bool no_packed_forward = false;
  bool packed_crosses_sequences = false;
  bool packed_ignores_positions = false;
  /// The cached (decode) path scales its position term by 1 + decode_position_drift, the full
  /// forward does not: rollout and training log-probs drift apart (the logprob_parity gate's
  /// bug class: a decode path that computes RoPE in another order or precision).
  double decode_position_drift = 0;
  /// The packed forward scales each sequence's last column of logits by 1 + this (a bug that
  /// hits one token per packed sequence: the logprob_parity gate's max bar catches it where
  /// the mean over all sampled tokens stays small).
  double packed_last_column_scale = 0;
};

class FakeArgs : public ModelArgs {
 public:
  int64_t vocab = 32;
  int64_t hidden = 16;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t max_pos = 128;
  bool tie = true;

  nlohmann::json ToJson() const override {
    return {{"vocab_size", vocab},         {"hidden_size", hidden}, {"num_hidden_layers", layers},
            {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
            {"max_position_embeddings", max_pos}, {"tie_word_embeddings", tie}};
  }
  int64_t vocab_size() const override { return vocab; }
  int64_t num_hidden_layers() const override { return layers; }
  int64_t num_key_value_heads() const override { return kv_heads; }
  int64_t head_dim() const override { return hidden / heads; }
  int64_t max_position_embeddings() const override { return max_pos; }
  bool tie_word_embeddings() const override { return tie; }
};

/// Holds one parameter named "weight".
struct FakeWeight : torch::nn::Module {
  explicit FakeWeight(torch::Tensor init) { weight = register_parameter("weight", init); }
  torch::Tensor weight;
};

struct FakeLayer : torch::nn::Module {
  FakeLayer(int64_t hidden, const torch::TensorOptions& o) {
    proj = register_module("proj", std::make_shared<FakeWeight>(torch::randn({hidden, hidden}, o) * 0.3));
  }
  std::shared_ptr<FakeWeight> proj;
};

class FakeLM : public CausalLM {
 public:
  FakeLM(const FakeArgs& args, const FakeOptions& options, torch::Dtype dtype, torch::Device device)
      : args_(args), options_(options) {
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    embed_ = register_module("embed", std::make_shared<FakeWeight>(torch::randn({args.vocab, args.hidden}, f32)));
    layers_ = register_module("layers", torch::nn::ModuleList());
    for (int64_t l = 0; l < args.layers; ++l) layers_->push_back(std::make_shared<FakeLayer>(args.hidden, f32));
    norm_ = register_module("norm", std::make_shared<FakeWeight>(1 + 0.1 * torch::randn({args.hidden}, f32)));
    if (!args.tie) {
      output_ = register_module("output", std::make_shared<FakeWeight>(torch::randn({args.vocab, args.hidden}, f32) * 0.5));
    }
    if (options.unused_param) {
      unused_ = register_module("unused", std::make_shared<FakeWeight>(torch::ones({args.hidden}, f32)));
    }
    to(device, dtype);
    dtype_ = dtype;
    device_ = device;
  }

  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& positions,
                        KVCache* cache) override {
    const int64_t t = tokens.size(1);
    torch::Tensor x = torch::embedding(embed_->weight, tokens);  // [B, T, H]
    const auto o = x.options();
    const torch::Tensor freq = torch::arange(args_.hidden, o) / double(args_.hidden) + 0.1;
    torch::Tensor position_term = torch::sin(positions.unsqueeze(-1).to(x.scalar_type()) * freq);
    if (cache != nullptr && options_.decode_position_drift != 0) {
      position_term = position_term * (1 + options_.decode_position_drift);
    }
    x = x + 0.1 * position_term;
    for (int64_t l = 0; l < args_.layers; ++l) {
      const torch::Tensor kv = x.unsqueeze(1);  // [B, 1, T, H]
      const torch::Tensor full = cache ? cache->Append(l, kv, kv).first : kv;
      const int64_t s = full.size(2), start = s - t;
      const torch::Tensor csum = full.squeeze(1).cumsum(1).slice(1, start, s);  // [B, T, H]
      const torch::Tensor count = torch::arange(start + 1, s + 1, o).view({1, t, 1});
      const auto& proj = layers_[l]->as<FakeLayer>()->proj->weight;
      x = x + torch::tanh(torch::matmul(csum / count, proj.t()));
    }
    x = x * norm_->weight;
    if (cache) cache->Advance(t);
    const torch::Tensor& out = args_.tie ? embed_->weight : output_->weight;
    return torch::matmul(x, out.t());
  }

  std::unique_ptr<KVCache> NewKVCache(int64_t batch, int64_t max_len) const override {
    return std::make_unique<KVCache>(args_.layers, batch, 1, max_len, args_.hidden, dtype_, device_);
  }

  bool SupportsPacked() const override { return !options_.no_packed_forward; }

  /// Each sequence's own Forward, concatenated (unless an option breaks it).
  torch::Tensor ForwardPacked(const torch::Tensor& tokens, const torch::Tensor& positions,
                              const torch::Tensor& cu_seqlens) override {
    if (options_.packed_crosses_sequences) return Forward(tokens, positions, nullptr);
    const torch::Tensor along_row =
        torch::arange(tokens.size(1), positions.options()).unsqueeze(0);
    const torch::Tensor& pos = options_.packed_ignores_positions ? along_row : positions;
    const torch::Tensor b = cu_seqlens.to(torch::kCPU);
    std::vector<torch::Tensor> parts;
    for (int64_t s = 0; s + 1 < b.size(0); ++s) {
      const int64_t begin = b[s].item<int64_t>(), end = b[s + 1].item<int64_t>();
      parts.push_back(Forward(tokens.slice(1, begin, end), pos.slice(1, begin, end), nullptr));
      if (options_.packed_last_column_scale != 0) {
        torch::Tensor& part = parts.back();
        part = torch::cat({part.slice(1, 0, end - begin - 1),
                           part.slice(1, end - begin - 1) * (1 + options_.packed_last_column_scale)},
                          1);
      }
    }
    return torch::cat(parts, 1);
  }

 private:
  FakeArgs args_;
  FakeOptions options_;
  torch::Dtype dtype_ = torch::kFloat32;
  torch::Device device_ = torch::kCPU;
  std::shared_ptr<FakeWeight> embed_, norm_, output_, unused_;
  torch::nn::ModuleList layers_{nullptr};
};

/// The fake family: name "fake", model_type "fake_lm".
class FakeFamily : public ModelFamily {
 public:
  explicit FakeFamily(FakeOptions options = {}) : options_(options) {}

  std::string_view name() const override { return "fake"; }
  std::vector<std::string> model_types() const override { return {"fake_lm"}; }

  Result<ParsedConfig> ParseConfig(const nlohmann::json& config) const override {
    auto args = std::make_shared<FakeArgs>();
    ParsedConfig out;
    auto need_int = [&](const char* key, int64_t& dst) -> Status {
      auto it = config.find(key);
      if (it == config.end()) return Status::InvalidArgument(std::string("config.json lacks ") + key);
      if (!it->is_number_integer()) {
        return Status::InvalidArgument(std::string("config.json ") + key + " must be an integer, got " + it->dump());
      }
      dst = it->get<int64_t>();
      out.report.mapped.push_back(key);
      return Status::Ok();
    };
    GH_RETURN_IF_ERROR(need_int("vocab_size", args->vocab));
    GH_RETURN_IF_ERROR(need_int("hidden_size", args->hidden));
    GH_RETURN_IF_ERROR(need_int("num_hidden_layers", args->layers));
    GH_RETURN_IF_ERROR(need_int("num_attention_heads", args->heads));
    GH_RETURN_IF_ERROR(need_int("num_key_value_heads", args->kv_heads));
    GH_RETURN_IF_ERROR(need_int("max_position_embeddings", args->max_pos));
    if (auto it = config.find("tie_word_embeddings"); it != config.end()) {
      if (!it->is_boolean()) return Status::InvalidArgument("config.json tie_word_embeddings must be a boolean");
      args->tie = it->get<bool>();
      out.report.mapped.push_back("tie_word_embeddings");
    }
    const std::vector<std::pair<std::string, std::string>> ignorable = {
        {"model_type", "family selector"},
        {"architectures", "HF class name"},
        {"torch_dtype", "storage dtype; the cell's precision decides"},
        {"use_cache", "runtime flag"}};
    for (auto it = config.begin(); it != config.end(); ++it) {
      const std::string& k = it.key();
      bool known = std::find(out.report.mapped.begin(), out.report.mapped.end(), k) != out.report.mapped.end();
      for (const auto& [field, why] : ignorable) {
        if (field == k) {
          out.report.ignored.emplace_back(field, why);
          known = true;
        }
      }
      if (!known) out.report.unmapped.push_back(k);
    }
    out.args = args;
    return out;
  }

  Result<std::shared_ptr<CausalLM>> Construct(const ModelArgs& args, torch::Dtype dtype,
                                              torch::Device device) const override {
    const auto& a = dynamic_cast<const FakeArgs&>(args);
    return std::shared_ptr<CausalLM>(std::make_shared<FakeLM>(a, options_, dtype, device));
  }

  Result<StateDictAdapter> Adapter(const ModelArgs& args) const override {
    std::vector<TensorNameRule> rules = {
        {"model.embed_tokens.weight", "embed.weight", false},
        {"model.layers.{layer}.proj.weight", "layers.{layer}.proj.weight", true},
        {"model.norm.weight", "norm.weight", false},
        {"lm_head.weight", "output.weight", false},
    };
    if (options_.unused_param) rules.push_back({"model.unused.weight", "unused.weight", false});
    return StateDictAdapter::Create(std::move(rules), args.num_hidden_layers(),
                                    args.tie_word_embeddings(), "lm_head.weight");
  }

 private:
  FakeOptions options_;
};

/// config.json of a small fake model.
inline nlohmann::json FakeConfig(bool tie = true) {
  return {{"model_type", "fake_lm"},           {"architectures", {"FakeForCausalLM"}},
          {"vocab_size", 32},                  {"hidden_size", 16},
          {"num_hidden_layers", 2},            {"num_attention_heads", 4},
          {"num_key_value_heads", 2},          {"max_position_embeddings", 128},
          {"tie_word_embeddings", tie},        {"torch_dtype", "float32"}};
}

}  // namespace gatehouse::worker::testing
