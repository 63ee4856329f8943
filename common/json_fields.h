// Reading fields of a JSON document with errors that name the field and the value: the one
// reader the cell spec (common/cell_spec.cc) and the worker's run spec (its attempt member) are
// read with. Messages are valid UTF-8 ("field 'topology.tp': expected an integer from 1 to 64,
// got \"2\""), so a REST error body can hold them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace gatehouse::json_fields {

/// `value` as JSON text, cut to 80 bytes ("...") at the start of a UTF-8 sequence; invalid
/// UTF-8 in it becomes U+FFFD.
std::string Shown(const nlohmann::json& value);

/// INVALID_ARGUMENT "field '<field>': expected <expected>, got <Shown(value)>".
Status FieldError(std::string_view field, std::string_view expected, const nlohmann::json& value);

/// The members of one JSON object, with their full names (`prefix` + key, prefix "topology."
/// or "" at the top level). Holds a reference to the object.
class Members {
 public:
  /// Errors: INVALID_ARGUMENT naming the object when it is not one ("spec" at the top level),
  /// or naming the first member not in `known` ("unknown field 'topology.zz'").
  static Result<Members> Of(const nlohmann::json& obj, std::string prefix,
                            std::initializer_list<std::string_view> known);

  /// The member `key`; nullptr when absent.
  const nlohmann::json* Find(std::string_view key) const;
  /// The member `key`. Errors: INVALID_ARGUMENT "missing field '<name>'" when absent.
  Result<const nlohmann::json*> Require(std::string_view key) const;
  /// The member's full name: prefix + key.
  std::string Name(std::string_view key) const { return prefix_ + std::string(key); }

 private:
  Members(const nlohmann::json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}
  const nlohmann::json& obj_;
  std::string prefix_;
};

/// A string of `min_bytes` to `max_bytes` (expected: "a non-empty string of at most N bytes",
/// or "a string of at most N bytes" when empty is allowed).
Result<std::string> ReadString(const nlohmann::json& v, std::string_view field, size_t max_bytes,
                               size_t min_bytes = 1);

/// An integer in [min, max]; floats such as 2.0 are refused. `expected` defaults to "an
/// integer from <min> to <max>".
Result<int64_t> ReadInt(const nlohmann::json& v, std::string_view field, int64_t min,
                        int64_t max, std::string expected = "");

/// true or false.
Result<bool> ReadBool(const nlohmann::json& v, std::string_view field);

/// An absolute path of at most `max_bytes`, made lexically normal without a trailing '/'.
Result<std::string> ReadAbsolutePath(const nlohmann::json& v, std::string_view field,
                                     size_t max_bytes);

}  // namespace gatehouse::json_fields
