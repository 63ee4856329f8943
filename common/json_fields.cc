#include "common/json_fields.h"

#include <algorithm>
#include <filesystem>

namespace gatehouse::json_fields {
namespace {

using nlohmann::json;

constexpr size_t kMaxShownValue = 80;

std::string Bytes(size_t n) { return std::to_string(n) + " bytes"; }

}  // namespace

std::string Shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > kMaxShownValue) {
    size_t cut = kMaxShownValue;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    s = s.substr(0, cut) + "...";
  }
  return s;
}

Status FieldError(std::string_view field, std::string_view expected, const json& value) {
  return Status::InvalidArgument("field '" + std::string(field) + "': expected " +
                                 std::string(expected) + ", got " + Shown(value));
}

Result<Members> Members::Of(const json& obj, std::string prefix,
                            std::initializer_list<std::string_view> known) {
  if (!obj.is_object()) {
    return FieldError(prefix.empty() ? "spec" : prefix.substr(0, prefix.size() - 1), "an object",
                      obj);
  }
  for (const auto& [key, _] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Status::InvalidArgument("unknown field '" + prefix + key + "'");
    }
  }
  return Members(obj, std::move(prefix));
}

const json* Members::Find(std::string_view key) const {
  const auto it = obj_.find(std::string(key));
  return it == obj_.end() ? nullptr : &*it;
}

Result<const json*> Members::Require(std::string_view key) const {
  if (const json* v = Find(key)) return v;
  return Status::InvalidArgument("missing field '" + Name(key) + "'");
}

Result<std::string> ReadString(const json& v, std::string_view field, size_t max_bytes,
                               size_t min_bytes) {
  if (!v.is_string() || v.get_ref<const std::string&>().size() < min_bytes ||
      v.get_ref<const std::string&>().size() > max_bytes) {
    return FieldError(field,
                      std::string(min_bytes > 0 ? "a non-empty string" : "a string") +
                          " of at most " + Bytes(max_bytes),
                      v);
  }
  return v.get<std::string>();
}

Result<int64_t> ReadInt(const json& v, std::string_view field, int64_t min, int64_t max,
                        std::string expected) {
  if (expected.empty()) {
    expected = "an integer from " + std::to_string(min) + " to " + std::to_string(max);
  }
  if (!v.is_number_integer()) return FieldError(field, expected, v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max)) {
    return FieldError(field, expected, v);
  }
  const int64_t i = v.get<int64_t>();
  if (i < min || i > max) return FieldError(field, expected, v);
  return i;
}

Result<bool> ReadBool(const json& v, std::string_view field) {
  if (!v.is_boolean()) return FieldError(field, "true or false", v);
  return v.get<bool>();
}

Result<std::string> ReadAbsolutePath(const json& v, std::string_view field, size_t max_bytes) {
  GH_ASSIGN_OR_RETURN(std::string s, ReadString(v, field, max_bytes));
  const std::filesystem::path p(s);
  if (!p.is_absolute()) return FieldError(field, "an absolute path", v);
  std::string norm = p.lexically_normal().string();
  while (norm.size() > 1 && norm.back() == '/') norm.pop_back();
  return norm;
}

}  // namespace gatehouse::json_fields
