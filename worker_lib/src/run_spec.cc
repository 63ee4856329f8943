// Run spec parsing (docs/protocols.md §2, §3): the cell spec through common/cell_spec.h, the
// attempt member here.
#include "gatehouse/worker/run_spec.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace gatehouse::worker {
namespace {

using nlohmann::json;

Status Missing(const std::string& field) {
  return Status::InvalidArgument("missing field '" + field + "'");
}

Status Expected(const std::string& field, const std::string& what, const json& value) {
  return Status::InvalidArgument("field '" + field + "': expected " + what + ", got " +
                                 value.dump(-1, ' ', false, json::error_handler_t::replace));
}

// Refuses members of `obj` not in `known`, naming them as <prefix><name>.
Status OnlyKnown(const json& obj, std::initializer_list<std::string_view> known,
                 const std::string& prefix) {
  for (const auto& [key, _] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Status::InvalidArgument("unknown field '" + prefix + key + "'");
    }
  }
  return Status::Ok();
}

Result<std::string> String(const json& obj, const std::string& key, const std::string& field) {
  if (!obj.contains(key)) return Missing(field);
  if (!obj.at(key).is_string()) return Expected(field, "a string", obj.at(key));
  return obj.at(key).get<std::string>();
}

Result<RunSpec::Attempt> ParseAttempt(const json& a) {
  if (!a.is_object()) return Expected("attempt", "an object", a);
  GH_RETURN_IF_ERROR(OnlyKnown(a, {"id", "dir", "checkout", "agent"}, "attempt."));
  RunSpec::Attempt out;
  if (!a.contains("id")) return Missing("attempt.id");
  if (!a.at("id").is_number_integer() || a.at("id").get<int64_t>() < 0 ||
      (a.at("id").is_number_unsigned() && a.at("id").get<uint64_t>() > INT64_MAX)) {
    return Expected("attempt.id", "a non-negative integer", a.at("id"));
  }
  out.id = a.at("id").get<int64_t>();
  GH_ASSIGN_OR_RETURN(out.dir, String(a, "dir", "attempt.dir"));
  if (!std::filesystem::path(out.dir).is_absolute()) {
    return Expected("attempt.dir", "an absolute path", a.at("dir"));
  }
  if (!a.contains("checkout")) return Missing("attempt.checkout");
  const json& c = a.at("checkout");
  if (!c.is_object()) return Expected("attempt.checkout", "an object", c);
  GH_RETURN_IF_ERROR(OnlyKnown(c, {"head", "clean", "path"}, "attempt.checkout."));
  GH_ASSIGN_OR_RETURN(out.checkout.head, String(c, "head", "attempt.checkout.head"));
  if (!c.contains("clean")) return Missing("attempt.checkout.clean");
  if (!c.at("clean").is_boolean()) {
    return Expected("attempt.checkout.clean", "true or false", c.at("clean"));
  }
  out.checkout.clean = c.at("clean").get<bool>();
  GH_ASSIGN_OR_RETURN(out.checkout.path, String(c, "path", "attempt.checkout.path"));
  GH_ASSIGN_OR_RETURN(out.agent, String(a, "agent", "attempt.agent"));
  return out;
}

}  // namespace

Result<RunSpec> ParseRunSpec(const json& j) {
  if (!j.is_object()) return Expected("spec", "an object", j);
  if (!j.contains("attempt")) return Missing("attempt");
  RunSpec s;
  GH_ASSIGN_OR_RETURN(s.attempt, ParseAttempt(j.at("attempt")));
  json cell = j;
  cell.erase("attempt");
  GH_ASSIGN_OR_RETURN(static_cast<CellSpec&>(s), ParseCellSpec(cell));
  return s;
}

Result<RunSpec> LoadRunSpec(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read run spec " + path.string());
  std::stringstream buf;
  buf << in.rdbuf();
  json j = json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Status::InvalidArgument("run spec " + path.string() + " is not valid JSON");
  }
  Result<RunSpec> spec = ParseRunSpec(j);
  if (!spec.ok()) return spec.status().WithContext("run spec " + path.string());
  return spec;
}

}  // namespace gatehouse::worker
