#include "llama/args.h"

#include <array>
#include <string_view>
#include <utility>

namespace gatehouse::models::llama {
namespace {

using nlohmann::json;

/// Top-level config.json fields that do not change the computation, with the reason. Every
/// field transformers 5 writes for a LlamaConfig is either parsed below or listed here; the
/// generic PreTrainedConfig flags older transformers versions wrote are listed too.
struct IgnoredField {
  std::string_view name;
  std::string_view reason;
};
constexpr std::array kIgnoredFields = {
    IgnoredField{"architectures",
                 "transformers auto-class names; the family is chosen by model_type"},
    IgnoredField{"transformers_version", "provenance of the writer; no effect on computation"},
    IgnoredField{"dtype",
                 "storage dtype of the saved weights; the cell's precision sets the compute dtype"},
    IgnoredField{"torch_dtype",
                 "storage dtype of the saved weights (older spelling of dtype); the cell's "
                 "precision sets the compute dtype"},
    IgnoredField{"use_cache",
                 "transformers generate() runtime flag; the decode gate always uses a KV cache, "
                 "which does not change results"},
    IgnoredField{"bos_token_id", "tokenizer/generation metadata; not used by the forward pass"},
    IgnoredField{"eos_token_id",
                 "generation stop token; the decode gate runs exactly max_new_tokens greedy steps"},
    IgnoredField{"initializer_range",
                 "only initialises fresh weights; every weight is loaded from the checkpoint"},
    IgnoredField{"attention_dropout",
                 "dropout probability; Gatehouse inference and training run without dropout "
                 "(upstream applies none in eval mode either)"},
    IgnoredField{"pretraining_tp",
                 "1 = no pretraining tensor-parallel slicing of the linears (transformers 5 does "
                 "not use it); any other value is rejected"},
    IgnoredField{"output_attentions", "transformers output-format flag; no effect on logits"},
    IgnoredField{"output_hidden_states", "transformers output-format flag; no effect on logits"},
    IgnoredField{"return_dict", "transformers output-format flag; no effect on logits"},
    IgnoredField{"_name_or_path", "where the config was loaded from; provenance only"},
};

/// Top-level fields parsed into LlamaArgs (all of them land in report.mapped when present).
constexpr std::array<std::string_view, 18> kMappedFields = {
    "vocab_size",        "hidden_size",           "intermediate_size",
    "num_hidden_layers", "num_attention_heads",   "num_key_value_heads",
    "head_dim",          "hidden_act",            "max_position_embeddings",
    "rms_norm_eps",      "rope_theta",            "rope_parameters",
    "rope_scaling",      "tie_word_embeddings",   "attention_bias",
    "mlp_bias",          "pad_token_id",          "model_type",
};

/// Keys understood inside rope_parameters / rope_scaling for rope_type "default".
constexpr std::array<std::string_view, 3> kRopeKeys = {"rope_type", "type", "rope_theta"};

/// transformers' RotaryEmbeddingConfigMixin.default_theta.
constexpr double kDefaultRopeTheta = 10000.0;

Status FieldError(std::string_view field, const json& value, std::string_view what) {
  return Status::InvalidArgument("config field '" + std::string(field) + "' = " + value.dump() +
                                 ": " + std::string(what));
}

Status Missing(std::string_view field) {
  return Status::InvalidArgument("config field '" + std::string(field) +
                                 "' is required but missing");
}

/// The value of `field`, or nullptr when it is absent or JSON null.
const json* Find(const json& obj, std::string_view field) {
  auto it = obj.find(std::string(field));
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Result<std::optional<int64_t>> OptionalInt(const json& obj, std::string_view field) {
  const json* v = Find(obj, field);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) return FieldError(field, *v, "expected an integer");
  return std::optional<int64_t>(v->get<int64_t>());
}

Result<int64_t> RequiredInt(const json& obj, std::string_view field) {
  GH_ASSIGN_OR_RETURN(auto v, OptionalInt(obj, field));
  if (!v.has_value()) return Missing(field);
  return *v;
}

Result<std::optional<double>> OptionalDouble(const json& obj, std::string_view field) {
  const json* v = Find(obj, field);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return FieldError(field, *v, "expected a number");
  return std::optional<double>(v->get<double>());
}

Result<bool> BoolOr(const json& obj, std::string_view field, bool fallback) {
  const json* v = Find(obj, field);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return FieldError(field, *v, "expected true or false");
  return v->get<bool>();
}

Result<std::optional<std::string>> OptionalString(const json& obj, std::string_view field) {
  const json* v = Find(obj, field);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return FieldError(field, *v, "expected a string");
  return std::optional<std::string>(v->get<std::string>());
}

/// RoPE settings as transformers 5 standardises them (RotaryEmbeddingConfigMixin): the dict is
/// rope_parameters (what save_pretrained writes now) or the legacy rope_scaling; its rope_type
/// (or legacy "type") defaults to "default"; rope_theta comes from the dict, else the top-level
/// rope_theta, else 10000. Unknown keys inside the dict are reported as "<field>.<key>" in
/// `unmapped`.
Status ParseRope(const json& config, LlamaArgs& args, std::vector<std::string>& unmapped) {
  const json* params = Find(config, "rope_parameters");
  const json* scaling = Find(config, "rope_scaling");
  if (params != nullptr && scaling != nullptr && *params != *scaling) {
    return Status::InvalidArgument(
        "config fields 'rope_parameters' = " + params->dump() + " and 'rope_scaling' = " +
        scaling->dump() + " disagree; transformers 5 reads only one of them");
  }
  const std::string_view dict_field = params != nullptr ? "rope_parameters" : "rope_scaling";
  const json* dict = params != nullptr ? params : scaling;

  GH_ASSIGN_OR_RETURN(auto top_theta, OptionalDouble(config, "rope_theta"));
  args.rope_theta_ = top_theta.value_or(kDefaultRopeTheta);
  args.rope_theta_source_ = top_theta.has_value() ? "rope_theta" : "default";
  args.rope_type_ = "default";
  if (dict == nullptr) return Status::Ok();

  if (!dict->is_object()) return FieldError(dict_field, *dict, "expected an object");
  const std::string prefix = std::string(dict_field) + ".";
  for (const auto& [key, value] : dict->items()) {
    bool known = false;
    for (auto k : kRopeKeys) known = known || key == k;
    if (!known) unmapped.push_back(prefix + key);
  }
  GH_ASSIGN_OR_RETURN(auto rope_type, OptionalString(*dict, "rope_type"));
  GH_ASSIGN_OR_RETURN(auto legacy_type, OptionalString(*dict, "type"));
  std::string type_field = prefix + (rope_type.has_value() ? "rope_type" : "type");
  args.rope_type_ = rope_type.value_or(legacy_type.value_or("default"));
  if (args.rope_type_ != "default") {
    return Status::InvalidArgument("config field '" + type_field + "' = \"" + args.rope_type_ +
                                   "\": unsupported RoPE type (the llama family implements "
                                   "only \"default\")");
  }
  GH_ASSIGN_OR_RETURN(auto dict_theta, OptionalDouble(*dict, "rope_theta"));
  if (dict_theta.has_value()) {
    args.rope_theta_ = *dict_theta;
    args.rope_theta_source_ = prefix + "rope_theta";
  }
  return Status::Ok();
}

}  // namespace

Status LlamaArgs::Validate() const {
  auto positive = [](std::string_view field, auto value) -> Status {
    if (value > 0) return Status::Ok();
    return FieldError(field, json(value), "must be positive");
  };
  GH_RETURN_IF_ERROR(positive("vocab_size", vocab_size_));
  GH_RETURN_IF_ERROR(positive("hidden_size", hidden_size_));
  GH_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size_));
  GH_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers_));
  GH_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads_));
  GH_RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads_));
  GH_RETURN_IF_ERROR(positive("head_dim", head_dim_));
  GH_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings_));
  GH_RETURN_IF_ERROR(positive("rms_norm_eps", rms_norm_eps_));
  GH_RETURN_IF_ERROR(positive("rope_theta", rope_theta_));
  if (num_attention_heads_ % num_key_value_heads_ != 0) {
    return Status::InvalidArgument(
        "config field 'num_attention_heads' = " + std::to_string(num_attention_heads_) +
        " is not a multiple of 'num_key_value_heads' = " + std::to_string(num_key_value_heads_));
  }
  if (head_dim_ % 2 != 0) {
    return FieldError("head_dim", json(head_dim_), "must be even (RoPE rotates half-dims)");
  }
  if (pad_token_id_.has_value() && (*pad_token_id_ < 0 || *pad_token_id_ >= vocab_size_)) {
    return FieldError("pad_token_id", json(*pad_token_id_), "must be in [0, vocab_size)");
  }
  if (rope_type_ != "default") {
    return FieldError("rope_type", json(rope_type_), "only \"default\" is implemented");
  }
  return Status::Ok();
}

nlohmann::json LlamaArgs::ToJson() const {
  return json{
      {"vocab_size", vocab_size_},
      {"hidden_size", hidden_size_},
      {"intermediate_size", intermediate_size_},
      {"num_hidden_layers", num_hidden_layers_},
      {"num_attention_heads", num_attention_heads_},
      {"num_key_value_heads", num_key_value_heads_},
      {"head_dim", head_dim_},
      {"max_position_embeddings", max_position_embeddings_},
      {"rms_norm_eps", rms_norm_eps_},
      {"rope_type", rope_type_},
      {"rope_theta", rope_theta_},
      {"rope_theta_source", rope_theta_source_},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", tie_word_embeddings_},
      {"attention_bias", attention_bias_},
      {"mlp_bias", mlp_bias_},
      {"pad_token_id", pad_token_id_.has_value() ? json(*pad_token_id_) : json(nullptr)},
  };
}

Result<worker::ParsedConfig> ParseLlamaConfig(const nlohmann::json& config) {
  if (!config.is_object()) {
    return Status::InvalidArgument("config.json must be a JSON object, got " +
                                   std::string(config.type_name()));
  }
  auto args = std::make_shared<LlamaArgs>();
  worker::ConfigReport report;

  GH_ASSIGN_OR_RETURN(auto model_type, OptionalString(config, "model_type"));
  if (model_type.has_value() && *model_type != "llama") {
    return FieldError("model_type", config["model_type"], "the llama family serves \"llama\"");
  }
  GH_ASSIGN_OR_RETURN(args->vocab_size_, RequiredInt(config, "vocab_size"));
  GH_ASSIGN_OR_RETURN(args->hidden_size_, RequiredInt(config, "hidden_size"));
  GH_ASSIGN_OR_RETURN(args->intermediate_size_, RequiredInt(config, "intermediate_size"));
  GH_ASSIGN_OR_RETURN(args->num_hidden_layers_, RequiredInt(config, "num_hidden_layers"));
  GH_ASSIGN_OR_RETURN(args->num_attention_heads_, RequiredInt(config, "num_attention_heads"));
  GH_ASSIGN_OR_RETURN(args->max_position_embeddings_,
                      RequiredInt(config, "max_position_embeddings"));
  GH_ASSIGN_OR_RETURN(auto eps, OptionalDouble(config, "rms_norm_eps"));
  if (!eps.has_value()) return Missing("rms_norm_eps");
  args->rms_norm_eps_ = *eps;
  if (args->num_attention_heads_ <= 0) {
    return FieldError("num_attention_heads", config["num_attention_heads"], "must be positive");
  }

  // Defaults as LlamaConfig.__post_init__ sets them.
  GH_ASSIGN_OR_RETURN(auto kv_heads, OptionalInt(config, "num_key_value_heads"));
  args->num_key_value_heads_ = kv_heads.value_or(args->num_attention_heads_);
  GH_ASSIGN_OR_RETURN(auto head_dim, OptionalInt(config, "head_dim"));
  if (!head_dim.has_value() && args->hidden_size_ % args->num_attention_heads_ != 0) {
    return FieldError("hidden_size", config["hidden_size"],
                      "is not a multiple of num_attention_heads = " +
                          std::to_string(args->num_attention_heads_) +
                          " and head_dim is not given");
  }
  args->head_dim_ = head_dim.value_or(args->hidden_size_ / args->num_attention_heads_);

  GH_ASSIGN_OR_RETURN(auto act, OptionalString(config, "hidden_act"));
  if (act.value_or("silu") != "silu") {
    return FieldError("hidden_act", config["hidden_act"],
                      "unsupported activation (the llama family implements only \"silu\")");
  }
  GH_ASSIGN_OR_RETURN(args->tie_word_embeddings_, BoolOr(config, "tie_word_embeddings", false));
  GH_ASSIGN_OR_RETURN(args->attention_bias_, BoolOr(config, "attention_bias", false));
  GH_ASSIGN_OR_RETURN(args->mlp_bias_, BoolOr(config, "mlp_bias", false));
  GH_ASSIGN_OR_RETURN(args->pad_token_id_, OptionalInt(config, "pad_token_id"));

  GH_ASSIGN_OR_RETURN(auto pretraining_tp, OptionalInt(config, "pretraining_tp"));
  if (pretraining_tp.value_or(1) != 1) {
    return FieldError("pretraining_tp", config["pretraining_tp"],
                      "only 1 is supported (no pretraining tensor-parallel slicing)");
  }

  GH_RETURN_IF_ERROR(ParseRope(config, *args, report.unmapped));
  GH_RETURN_IF_ERROR(args->Validate());

  // Account for every top-level field.
  for (const auto& [field, value] : config.items()) {
    bool done = false;
    for (auto name : kMappedFields) {
      if (field == name) {
        report.mapped.push_back(field);
        done = true;
        break;
      }
    }
    for (const auto& ignored : kIgnoredFields) {
      if (done) break;
      if (field == ignored.name) {
        report.ignored.emplace_back(field, std::string(ignored.reason));
        done = true;
      }
    }
    if (!done) report.unmapped.push_back(field);
  }
  return worker::ParsedConfig{std::move(args), std::move(report)};
}

}  // namespace gatehouse::models::llama
