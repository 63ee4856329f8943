// Run spec parsing (docs/protocols.md §2, §3): the cell spec through common/cell_spec.h, the
// attempt member here.
#include "gatehouse/worker/run_spec.h"

#include <fstream>
#include <sstream>

#include "common/json_fields.h"

namespace gatehouse::worker {
namespace {

using json_fields::Members;
using nlohmann::json;

// The attempt member (docs/protocols.md §3), read as strictly as the cell spec: every member
// required, nothing unknown.
Result<RunSpec::Attempt> ParseAttempt(const json& a) {
  constexpr size_t kMaxBytes = CellSpecLimits::kMaxPathBytes;
  GH_ASSIGN_OR_RETURN(Members m, Members::Of(a, "attempt.", {"id", "dir", "checkout", "agent"}));
  RunSpec::Attempt out;
  GH_ASSIGN_OR_RETURN(const json* id, m.Require("id"));
  GH_ASSIGN_OR_RETURN(out.id, json_fields::ReadInt(*id, "attempt.id", 0, INT64_MAX,
                                                   "a non-negative integer"));
  GH_ASSIGN_OR_RETURN(const json* dir, m.Require("dir"));
  GH_ASSIGN_OR_RETURN(out.dir, json_fields::ReadAbsolutePath(*dir, "attempt.dir", kMaxBytes));
  GH_ASSIGN_OR_RETURN(const json* checkout, m.Require("checkout"));
  GH_ASSIGN_OR_RETURN(Members c,
                      Members::Of(*checkout, "attempt.checkout.", {"head", "clean", "path"}));
  GH_ASSIGN_OR_RETURN(const json* head, c.Require("head"));
  GH_ASSIGN_OR_RETURN(out.checkout.head,
                      json_fields::ReadString(*head, c.Name("head"), kMaxBytes, 0));
  GH_ASSIGN_OR_RETURN(const json* clean, c.Require("clean"));
  GH_ASSIGN_OR_RETURN(out.checkout.clean, json_fields::ReadBool(*clean, c.Name("clean")));
  GH_ASSIGN_OR_RETURN(const json* path, c.Require("path"));
  GH_ASSIGN_OR_RETURN(out.checkout.path,
                      json_fields::ReadString(*path, c.Name("path"), kMaxBytes, 0));
  GH_ASSIGN_OR_RETURN(const json* agent, m.Require("agent"));
  GH_ASSIGN_OR_RETURN(out.agent, json_fields::ReadString(*agent, "attempt.agent", kMaxBytes, 0));
  return out;
}

}  // namespace

Result<RunSpec> ParseRunSpec(const json& j) {
  if (!j.is_object()) return json_fields::FieldError("spec", "an object", j);
  if (!j.contains("attempt")) return Status::InvalidArgument("missing field 'attempt'");
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
