// ConfigReader: reads a transformers-saved config.json and accounts for every top-level field.
//
// Each family's config parser reads the fields it honours through this class (they become
// `mapped`), declares the fields that do not change the computation with a reason (`ignored`),
// and everything left over is `unmapped`, which fails the config gate. So the report cannot
// drift from what the parser really read.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "gatehouse/worker/model_family.h"

namespace gatehouse::models {

/// INVALID_ARGUMENT "config field '<field>' = <value>: <what>".
Status FieldError(std::string_view field, const nlohmann::json& value, std::string_view what);
/// INVALID_ARGUMENT "config field '<field>' is required but missing".
Status MissingField(std::string_view field);

/// Typed, accounted access to the top-level fields of one config.json object. Absent fields and
/// JSON null read as "not given". Every accessor marks the field as mapped when it is present.
/// Errors name the field and the offending value.
class ConfigReader {
 public:
  /// `config` must outlive the reader. Not an object -> every read fails; use Check() first.
  explicit ConfigReader(const nlohmann::json& config) : config_(config) {}

  /// INVALID_ARGUMENT unless the config is a JSON object.
  Status Check() const;

  /// The raw value (marked mapped), or nullptr when absent or null.
  const nlohmann::json* Raw(std::string_view field);
  Result<int64_t> RequiredInt(std::string_view field);
  Result<std::optional<int64_t>> OptionalInt(std::string_view field);
  Result<double> RequiredNumber(std::string_view field);
  Result<std::optional<double>> OptionalNumber(std::string_view field);
  /// `fallback` when absent or null.
  Result<bool> Bool(std::string_view field, bool fallback);
  Result<std::optional<std::string>> OptionalString(std::string_view field);
  /// The string `field`, else `fallback`; INVALID_ARGUMENT unless it is one of `allowed`.
  Result<std::string> StringIn(std::string_view field, std::string_view fallback,
                               const std::vector<std::string>& allowed, std::string_view family);
  /// model_type must be absent or one of `types` (the family's model_types()).
  Status ExpectModelType(const std::vector<std::string>& types, std::string_view family);

  /// Declares `field` as not changing the computation, with the reason (kept only if present).
  void Ignore(std::string_view field, std::string_view reason);
  /// A boolean flag the family's upstream modelling code never reads (docs/config-fields.md
  /// lists each with the upstream files searched). false (or absent / null) states what upstream
  /// computes: ignored, with `unread` as the reason. true claims a computation upstream does
  /// not do (it silently computes without it): INVALID_ARGUMENT naming the field, saying
  /// `if_true`. Not a boolean: INVALID_ARGUMENT.
  Status IgnoreUnreadFlag(std::string_view field, std::string_view unread,
                          std::string_view if_true);
  /// Ignores the generic transformers PreTrainedConfig fields every family shares
  /// (architectures, transformers_version, dtype, use_cache, token ids, output flags, ...).
  void IgnoreCommonFields();
  /// Records a nested key nobody read, e.g. "rope_parameters.beta_fast".
  void AddUnmapped(std::string name) { extra_unmapped_.push_back(std::move(name)); }

  /// mapped = fields read (and present), ignored = declared ones present, unmapped = the rest
  /// plus AddUnmapped() names, all in config order.
  worker::ConfigReport Report() const;

  const nlohmann::json& config() const { return config_; }

 private:
  const nlohmann::json* Find(std::string_view field);

  const nlohmann::json& config_;
  std::set<std::string, std::less<>> read_;
  std::vector<std::pair<std::string, std::string>> ignored_;
  std::vector<std::string> extra_unmapped_;
};

/// Typed reads inside a nested JSON object (rope_parameters and the like); `prefix` names the
/// object in errors ("rope_parameters.").
Result<std::optional<double>> NestedNumber(const nlohmann::json& obj, std::string_view prefix,
                                           std::string_view key);
Result<std::optional<int64_t>> NestedInt(const nlohmann::json& obj, std::string_view prefix,
                                         std::string_view key);
Result<std::optional<std::string>> NestedString(const nlohmann::json& obj,
                                                 std::string_view prefix, std::string_view key);

}  // namespace gatehouse::models
