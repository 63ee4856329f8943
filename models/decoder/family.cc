#include "decoder/family.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "decoder/name_table.h"
#include "decoder/parallelize.h"

namespace gatehouse::models {
namespace {

using nlohmann::json;

Result<const DecoderArgs*> AsDecoderArgs(const worker::ModelArgs& args, std::string_view family) {
  const auto* d = dynamic_cast<const DecoderArgs*>(&args);
  if (d == nullptr) {
    return Status::InvalidArgument("the " + std::string(family) +
                                   " family was given model args of another family");
  }
  return d;
}

}  // namespace

Result<worker::ParsedConfig> DecoderFamily::ParseConfig(const json& config) const {
  try {
    ConfigReader reader(config);
    GH_RETURN_IF_ERROR(reader.Check());
    GH_RETURN_IF_ERROR(reader.ExpectModelType(model_types_, name_));
    GH_ASSIGN_OR_RETURN(DecoderSpec spec, parse_(reader));
    GH_RETURN_IF_ERROR(spec.Validate());
    return worker::ParsedConfig{std::make_shared<DecoderArgs>(std::move(spec)), reader.Report()};
  } catch (const std::exception& e) {
    return Status::InvalidArgument(name_ + " config: " + e.what());
  }
}

Result<std::shared_ptr<worker::CausalLM>> DecoderFamily::Construct(const worker::ModelArgs& args,
                                                                    torch::Dtype dtype,
                                                                    torch::Device device) const {
  return ConstructParallel(args, dtype, device, worker::TensorParallel{});
}

Result<worker::TpPlan> DecoderFamily::Parallelize(const worker::ModelArgs& args,
                                                  int64_t tp_size) const {
  GH_ASSIGN_OR_RETURN(const DecoderArgs* d, AsDecoderArgs(args, name_));
  return DecoderTpPlan(d->spec(), tp_size);
}

Result<std::shared_ptr<worker::CausalLM>> DecoderFamily::ConstructParallel(
    const worker::ModelArgs& args, torch::Dtype dtype, torch::Device device,
    const worker::TensorParallel& tp) const {
  return ConstructExpertParallel(args, dtype, device, tp, worker::ExpertParallel{});
}

Result<std::shared_ptr<worker::CausalLM>> DecoderFamily::ConstructExpertParallel(
    const worker::ModelArgs& args, torch::Dtype dtype, torch::Device device,
    const worker::TensorParallel& tp, const worker::ExpertParallel& ep) const {
  GH_ASSIGN_OR_RETURN(const DecoderArgs* d, AsDecoderArgs(args, name_));
  if (ep.enabled()) {
    const DecoderSpec& spec = d->spec();
    const bool moe = std::any_of(spec.layers.begin(), spec.layers.end(),
                                 [](const LayerSpec& l) { return l.moe; });
    if (!moe) {
      return Status::InvalidArgument("expert parallelism (ep=" + std::to_string(ep.size) +
                                     ") needs MoE layers; this " + name_ + " model has none");
    }
    if (spec.num_experts % ep.size != 0) {
      return Status::InvalidArgument("num_experts=" + std::to_string(spec.num_experts) +
                                     " is not divisible by ep=" + std::to_string(ep.size));
    }
    if (!ep.comm) return Status::InvalidArgument("expert-parallel size > 1 without a communicator");
  }
  GH_RETURN_IF_ERROR(d->spec().Validate());
  if (tp.enabled()) {
    GH_RETURN_IF_ERROR(DecoderTpPlan(d->spec(), tp.size).status());
    if (!tp.comm) return Status::InvalidArgument("tensor-parallel size > 1 without a communicator");
  }
  try {
    const ParamOptions po{torch::TensorOptions().dtype(dtype).device(device),
                          /*init=*/!worker::WeightInitSkipped()};
    auto model = std::make_shared<DecoderModel>(d->spec(), tp, po, ep);
    return std::shared_ptr<worker::CausalLM>(std::move(model));
  } catch (const c10::Error& e) {
    return Status::Internal("constructing the " + name_ + " model: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Status::Internal("constructing the " + name_ + " model: " + e.what());
  }
}

Result<worker::StateDictAdapter> DecoderFamily::Adapter(const worker::ModelArgs& args) const {
  GH_ASSIGN_OR_RETURN(const DecoderArgs* d, AsDecoderArgs(args, name_));
  try {
    return MakeDecoderAdapter(d->spec());
  } catch (const std::exception& e) {
    return Status::Internal(name_ + " name table: " + e.what());
  }
}

Status ParseCoreFields(ConfigReader& reader, const CoreDefaults& defaults, DecoderSpec& spec) {
  reader.IgnoreCommonFields();
  GH_ASSIGN_OR_RETURN(auto model_type, reader.OptionalString("model_type"));
  spec.model_type = model_type.value_or("");
  GH_ASSIGN_OR_RETURN(spec.vocab_size, reader.RequiredInt("vocab_size"));
  GH_ASSIGN_OR_RETURN(spec.hidden_size, reader.RequiredInt("hidden_size"));
  GH_ASSIGN_OR_RETURN(spec.intermediate_size, reader.RequiredInt("intermediate_size"));
  GH_ASSIGN_OR_RETURN(spec.num_hidden_layers, reader.RequiredInt("num_hidden_layers"));
  GH_ASSIGN_OR_RETURN(spec.num_attention_heads, reader.RequiredInt("num_attention_heads"));
  GH_ASSIGN_OR_RETURN(spec.max_position_embeddings,
                      reader.RequiredInt("max_position_embeddings"));
  GH_ASSIGN_OR_RETURN(spec.rms_norm_eps, reader.RequiredNumber("rms_norm_eps"));
  if (spec.num_attention_heads <= 0) {
    return FieldError("num_attention_heads", json(spec.num_attention_heads), "must be positive");
  }
  if (spec.num_hidden_layers <= 0) {
    return FieldError("num_hidden_layers", json(spec.num_hidden_layers), "must be positive");
  }
  GH_ASSIGN_OR_RETURN(auto kv_heads, reader.OptionalInt("num_key_value_heads"));
  if (!reader.config().contains("num_key_value_heads")) kv_heads = defaults.num_key_value_heads;
  spec.num_key_value_heads = kv_heads.value_or(spec.num_attention_heads);
  GH_ASSIGN_OR_RETURN(auto head_dim, reader.OptionalInt("head_dim"));
  if (!head_dim.has_value()) {
    if (!defaults.head_dim_optional) return MissingField("head_dim");
    if (spec.hidden_size % spec.num_attention_heads != 0) {
      return FieldError("hidden_size", json(spec.hidden_size),
                        "is not a multiple of num_attention_heads = " +
                            std::to_string(spec.num_attention_heads) +
                            " and head_dim is not given");
    }
  }
  spec.head_dim = head_dim.value_or(spec.hidden_size / spec.num_attention_heads);
  if (spec.head_dim <= 0) return FieldError("head_dim", json(spec.head_dim), "must be positive");
  GH_ASSIGN_OR_RETURN(spec.tie_word_embeddings,
                      reader.Bool("tie_word_embeddings", defaults.tie_word_embeddings));
  GH_ASSIGN_OR_RETURN(spec.pad_token_id, reader.OptionalInt("pad_token_id"));

  const std::string fallback =
      defaults.activation == Activation::kSilu ? "silu" : "gelu_pytorch_tanh";
  GH_ASSIGN_OR_RETURN(std::string act,
                      reader.StringIn(defaults.activation_field, fallback,
                                      {defaults.activation == Activation::kSilu
                                           ? "silu"
                                           : "gelu_pytorch_tanh"},
                                      spec.model_type.empty() ? "decoder" : spec.model_type));
  spec.hidden_act = act == "silu" ? Activation::kSilu : Activation::kGeluTanh;

  spec.attention_scaling = 1.0 / std::sqrt(static_cast<double>(spec.head_dim));
  spec.layers.assign(static_cast<size_t>(spec.num_hidden_layers), LayerSpec{});
  return Status::Ok();
}

Result<std::vector<std::string>> ReadLayerTypes(ConfigReader& reader, int64_t num_hidden_layers,
                                                std::vector<std::string> derived) {
  const json* v = reader.Raw("layer_types");
  if (v == nullptr) return derived;
  if (!v->is_array() || static_cast<int64_t>(v->size()) != num_hidden_layers) {
    return FieldError("layer_types", *v,
                      "expected a list of num_hidden_layers = " +
                          std::to_string(num_hidden_layers) + " layer types");
  }
  std::vector<std::string> types;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& t = (*v)[i];
    if (!t.is_string() ||
        (t.get<std::string>() != "full_attention" && t.get<std::string>() != "sliding_attention")) {
      return FieldError("layer_types[" + std::to_string(i) + "]", t,
                        "expected \"full_attention\" or \"sliding_attention\"");
    }
    types.push_back(t.get<std::string>());
  }
  return types;
}

}  // namespace gatehouse::models
