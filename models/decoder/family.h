// DecoderFamily: a model family made of a config parser over the shared decoder (model.h)
// and the shared name table (name_table.h). Adding a family = one parser function and one
// registration line (docs/adding-a-model-family.md).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "decoder/config_reader.h"
#include "decoder/model.h"
#include "common/status.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models {

/// Maps one family's config.json to a DecoderSpec. Reads every field it honours through
/// `reader` (so it is reported mapped) and declares the others it knows with
/// reader.Ignore(field, reason). Errors: INVALID_ARGUMENT naming the field and value.
using ConfigParser = Result<DecoderSpec> (*)(ConfigReader& reader);

/// A registered decoder family. Stateless and thread-safe; every method returns LibTorch / JSON
/// exceptions as a Status.
class DecoderFamily : public worker::ModelFamily {
 public:
  /// `name`: the family name cells use; `model_types`: the HF model_type strings it serves.
  DecoderFamily(std::string name, std::vector<std::string> model_types, ConfigParser parse)
      : name_(std::move(name)), model_types_(std::move(model_types)), parse_(parse) {}

  std::string_view name() const override { return name_; }
  std::vector<std::string> model_types() const override { return model_types_; }
  /// Checks model_type, runs the parser, validates the spec (DecoderSpec::Validate) and reports
  /// every top-level field as mapped, ignored (with reason) or unmapped.
  Result<worker::ParsedConfig> ParseConfig(const nlohmann::json& config) const override;
  /// `args` must come from a decoder family's ParseConfig. Errors: INVALID_ARGUMENT for other
  /// args or an invalid spec; INTERNAL when LibTorch fails (e.g. no memory).
  Result<std::shared_ptr<worker::CausalLM>> Construct(const worker::ModelArgs& args,
                                                      torch::Dtype dtype,
                                                      torch::Device device) const override;
  Result<worker::StateDictAdapter> Adapter(const worker::ModelArgs& args) const override;
  /// DecoderTpPlan (parallelize.h) for the spec.
  Result<worker::TpPlan> Parallelize(const worker::ModelArgs& args,
                                     int64_t tp_size) const override;
  /// DecoderModel(spec, tp); errors as Construct, plus the plan's INVALID_ARGUMENT.
  Result<std::shared_ptr<worker::CausalLM>> ConstructParallel(
      const worker::ModelArgs& args, torch::Dtype dtype, torch::Device device,
      const worker::TensorParallel& tp) const override;
  /// As ConstructParallel, with each MoE layer's experts split over `ep` (MoEImpl).
  /// INVALID_ARGUMENT naming num_experts when ep.size does not divide it, or the model has no
  /// MoE layer.
  Result<std::shared_ptr<worker::CausalLM>> ConstructExpertParallel(
      const worker::ModelArgs& args, torch::Dtype dtype, torch::Device device,
      const worker::TensorParallel& tp, const worker::ExpertParallel& ep) const override;

 private:
  std::string name_;
  std::vector<std::string> model_types_;
  ConfigParser parse_;
};

/// What ParseCoreFields may assume for fields a family's config class defaults.
struct CoreDefaults {
  /// tie_word_embeddings when absent (the config class's default).
  bool tie_word_embeddings = false;
  /// HF name of the activation field: "hidden_act" (most) or "hidden_activation" (Gemma).
  std::string_view activation_field = "hidden_act";
  /// Activation when the field is absent.
  Activation activation = Activation::kSilu;
  /// Whether head_dim may be absent (then hidden_size / num_attention_heads).
  bool head_dim_optional = true;
  /// num_key_value_heads when the field is absent: the config class's default (Mistral 8,
  /// Qwen2 and Qwen3 32, Qwen3-MoE 4), or num_attention_heads where the class defaults to
  /// None (Llama, Phi-3). A null value is num_attention_heads (the classes that accept None).
  std::optional<int64_t> num_key_value_heads;
};

/// Reads the fields every decoder config has: vocab_size, hidden_size, intermediate_size,
/// num_hidden_layers, num_attention_heads, num_key_value_heads (default: CoreDefaults),
/// head_dim, max_position_embeddings, rms_norm_eps, tie_word_embeddings, pad_token_id and the
/// activation; sets attention_scaling = head_dim^-0.5 and one full-attention layer per
/// num_hidden_layers using RoPE 0 (families override what differs). Also ignores the common
/// PreTrainedConfig fields. Errors: INVALID_ARGUMENT naming the field.
Status ParseCoreFields(ConfigReader& reader, const CoreDefaults& defaults, DecoderSpec& spec);

/// layer_types ("full_attention" / "sliding_attention" per layer) when the config has it, else
/// `derived` (what the config class computes). Errors: INVALID_ARGUMENT naming the entry for a
/// wrong length or an unknown type.
Result<std::vector<std::string>> ReadLayerTypes(ConfigReader& reader, int64_t num_hidden_layers,
                                                std::vector<std::string> derived);

}  // namespace gatehouse::models
