#include "decoder/config_reader.h"

#include <algorithm>
#include <array>

namespace gatehouse::models {
namespace {

using nlohmann::json;

struct CommonIgnored {
  std::string_view name;
  std::string_view reason;
};

/// PreTrainedConfig fields that no decoder's forward pass reads. Each family may add its own.
constexpr std::array kCommonIgnored = {
    CommonIgnored{"architectures",
                  "transformers auto-class names; the family is chosen by model_type"},
    CommonIgnored{"transformers_version", "provenance of the writer; no effect on computation"},
    CommonIgnored{"dtype",
                  "storage dtype of the saved weights; the cell's precision sets the compute dtype"},
    CommonIgnored{"torch_dtype",
                  "storage dtype of the saved weights (older spelling of dtype); the cell's "
                  "precision sets the compute dtype"},
    CommonIgnored{"use_cache",
                  "transformers generate() runtime flag; the decode gate always uses a KV cache, "
                  "which does not change results"},
    CommonIgnored{"bos_token_id", "tokenizer/generation metadata; not used by the forward pass"},
    CommonIgnored{"eos_token_id",
                  "generation stop token; the decode gate runs exactly max_new_tokens greedy steps"},
    CommonIgnored{"initializer_range",
                  "only initialises fresh weights; every weight is loaded from the checkpoint"},
    CommonIgnored{"attention_dropout",
                  "dropout probability; Gatehouse inference and training run without dropout "
                  "(upstream applies none in eval mode either)"},
    CommonIgnored{"output_attentions", "transformers output-format flag; no effect on logits"},
    CommonIgnored{"output_hidden_states", "transformers output-format flag; no effect on logits"},
    CommonIgnored{"return_dict", "transformers output-format flag; no effect on logits"},
    CommonIgnored{"_name_or_path", "where the config was loaded from; provenance only"},
    CommonIgnored{"_model_name_or_path",
                  "model name recorded by transformers' GGUF loader (general.name); provenance "
                  "only"},
    CommonIgnored{"unk_token_id", "tokenizer metadata; not used by the forward pass"},
    CommonIgnored{"auto_map",
                  "class names for transformers' trust_remote_code loading; the family is "
                  "chosen by model_type and its computation is the adapter's"},
};

}  // namespace

Status FieldError(std::string_view field, const json& value, std::string_view what) {
  return Status::InvalidArgument("config field '" + std::string(field) + "' = " +
                                 value.dump(-1, ' ', false, json::error_handler_t::replace) +
                                 ": " + std::string(what));
}

Status MissingField(std::string_view field) {
  return Status::InvalidArgument("config field '" + std::string(field) +
                                 "' is required but missing");
}

Status ConfigReader::Check() const {
  if (config_.is_object()) return Status::Ok();
  return Status::InvalidArgument("config.json must be a JSON object, got " +
                                 std::string(config_.type_name()));
}

const json* ConfigReader::Find(std::string_view field) {
  if (!config_.is_object()) return nullptr;
  auto it = config_.find(std::string(field));
  if (it == config_.end()) return nullptr;
  read_.emplace(field);
  if (it->is_null()) return nullptr;
  return &*it;
}

const json* ConfigReader::Raw(std::string_view field) { return Find(field); }

Result<std::optional<int64_t>> ConfigReader::OptionalInt(std::string_view field) {
  const json* v = Find(field);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) return FieldError(field, *v, "expected an integer");
  return std::optional<int64_t>(v->get<int64_t>());
}

Result<int64_t> ConfigReader::RequiredInt(std::string_view field) {
  GH_ASSIGN_OR_RETURN(auto v, OptionalInt(field));
  if (!v.has_value()) return MissingField(field);
  return *v;
}

Result<std::optional<double>> ConfigReader::OptionalNumber(std::string_view field) {
  const json* v = Find(field);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return FieldError(field, *v, "expected a number");
  return std::optional<double>(v->get<double>());
}

Result<double> ConfigReader::RequiredNumber(std::string_view field) {
  GH_ASSIGN_OR_RETURN(auto v, OptionalNumber(field));
  if (!v.has_value()) return MissingField(field);
  return *v;
}

Result<bool> ConfigReader::Bool(std::string_view field, bool fallback) {
  const json* v = Find(field);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return FieldError(field, *v, "expected true or false");
  return v->get<bool>();
}

Result<std::optional<std::string>> ConfigReader::OptionalString(std::string_view field) {
  const json* v = Find(field);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return FieldError(field, *v, "expected a string");
  return std::optional<std::string>(v->get<std::string>());
}

Result<std::string> ConfigReader::StringIn(std::string_view field, std::string_view fallback,
                                           const std::vector<std::string>& allowed,
                                           std::string_view family) {
  GH_ASSIGN_OR_RETURN(auto v, OptionalString(field));
  std::string value = v.value_or(std::string(fallback));
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return value;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
  return FieldError(field, json(value),
                    "unsupported value (the " + std::string(family) + " family implements " +
                        list + ")");
}

Status ConfigReader::ExpectModelType(const std::vector<std::string>& types,
                                     std::string_view family) {
  GH_ASSIGN_OR_RETURN(auto mt, OptionalString("model_type"));
  if (!mt.has_value() || std::find(types.begin(), types.end(), *mt) != types.end()) {
    return Status::Ok();
  }
  std::string list;
  for (const auto& t : types) list += (list.empty() ? "\"" : ", \"") + t + "\"";
  return FieldError("model_type", json(*mt),
                    "the " + std::string(family) + " family serves " + list);
}

void ConfigReader::Ignore(std::string_view field, std::string_view reason) {
  ignored_.emplace_back(std::string(field), std::string(reason));
}

Status ConfigReader::IgnoreUnreadFlag(std::string_view field, std::string_view unread,
                                      std::string_view if_true) {
  Ignore(field, std::string("false: ") + std::string(unread));
  auto it = config_.is_object() ? config_.find(std::string(field)) : config_.end();
  if (it == config_.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return FieldError(field, *it, "expected true or false");
  if (it->get<bool>()) {
    return FieldError(field, *it, std::string(if_true) + " (" + std::string(unread) + ")");
  }
  return Status::Ok();
}

void ConfigReader::IgnoreCommonFields() {
  for (const auto& f : kCommonIgnored) Ignore(f.name, f.reason);
}

worker::ConfigReport ConfigReader::Report() const {
  worker::ConfigReport report;
  if (!config_.is_object()) return report;
  for (const auto& [field, value] : config_.items()) {
    if (read_.count(field)) {
      report.mapped.push_back(field);
      continue;
    }
    auto ig = std::find_if(ignored_.begin(), ignored_.end(),
                           [&](const auto& p) { return p.first == field; });
    if (ig != ignored_.end()) {
      report.ignored.push_back(*ig);
    } else {
      report.unmapped.push_back(field);
    }
  }
  report.unmapped.insert(report.unmapped.end(), extra_unmapped_.begin(), extra_unmapped_.end());
  return report;
}

Result<std::optional<double>> NestedNumber(const json& obj, std::string_view prefix,
                                           std::string_view key) {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) {
    return FieldError(std::string(prefix) + std::string(key), *it, "expected a number");
  }
  return std::optional<double>(it->get<double>());
}

Result<std::optional<int64_t>> NestedInt(const json& obj, std::string_view prefix,
                                         std::string_view key) {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return std::optional<int64_t>();
  if (!it->is_number_integer()) {
    return FieldError(std::string(prefix) + std::string(key), *it, "expected an integer");
  }
  return std::optional<int64_t>(it->get<int64_t>());
}

Result<std::optional<std::string>> NestedString(const json& obj, std::string_view prefix,
                                                 std::string_view key) {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) {
    return FieldError(std::string(prefix) + std::string(key), *it, "expected a string");
  }
  return std::optional<std::string>(it->get<std::string>());
}

}  // namespace gatehouse::models
