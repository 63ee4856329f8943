// Run spec parsing (docs/protocols.md §2, §3).
#include "gatehouse/worker/run_spec.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "common/phases.h"

namespace gatehouse::worker {
namespace {

using nlohmann::json;

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// Reads the members of one JSON object, each exactly once; Finish() rejects members nobody
/// asked for. Errors name the full member path.
class ObjectReader {
 public:
  ObjectReader(const json& obj, std::string path) : obj_(obj), path_(std::move(path)) {}

  Status CheckObject() const {
    if (!obj_.is_object()) return Status::InvalidArgument(Where("") + " must be a JSON object");
    return Status::Ok();
  }

  std::string Where(std::string_view key) const {
    if (key.empty()) return path_.empty() ? "run spec" : "'" + path_ + "'";
    return "'" + (path_.empty() ? "" : path_ + ".") + std::string(key) + "'";
  }
  std::string Child(std::string_view key) const {
    return (path_.empty() ? "" : path_ + ".") + std::string(key);
  }

  Result<const json*> Member(const std::string& key) {
    seen_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end()) return Status::InvalidArgument("missing member " + Where(key));
    return &*it;
  }

  Result<std::string> String(const std::string& key, bool non_empty = true) {
    GH_ASSIGN_OR_RETURN(const json* v, Member(key));
    if (!v->is_string()) {
      return Status::InvalidArgument(Where(key) + " must be a string, got " + v->dump());
    }
    std::string s = v->get<std::string>();
    if (non_empty && s.empty()) return Status::InvalidArgument(Where(key) + " must not be empty");
    return s;
  }

  Result<std::string> OneOf(const std::string& key, const std::vector<std::string>& allowed) {
    GH_ASSIGN_OR_RETURN(std::string s, String(key));
    if (std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
      return Status::InvalidArgument(Where(key) + " is '" + s + "'; expected one of " +
                                     Join(allowed));
    }
    return s;
  }

  Result<int64_t> Int(const std::string& key, int64_t min) {
    GH_ASSIGN_OR_RETURN(const json* v, Member(key));
    if (!v->is_number_integer()) {
      return Status::InvalidArgument(Where(key) + " must be an integer, got " + v->dump());
    }
    int64_t i = v->get<int64_t>();
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Status::InvalidArgument(Where(key) + " is out of range: " + v->dump());
    }
    if (i < min) {
      return Status::InvalidArgument(Where(key) + " is " + std::to_string(i) + "; must be >= " +
                                     std::to_string(min));
    }
    return i;
  }

  Result<double> PositiveNumber(const std::string& key) {
    GH_ASSIGN_OR_RETURN(const json* v, Member(key));
    if (!v->is_number()) {
      return Status::InvalidArgument(Where(key) + " must be a number, got " + v->dump());
    }
    double d = v->get<double>();
    if (!std::isfinite(d) || d <= 0) {
      return Status::InvalidArgument(Where(key) + " is " + v->dump() +
                                     "; must be a finite number > 0");
    }
    return d;
  }

  Result<bool> Bool(const std::string& key) {
    GH_ASSIGN_OR_RETURN(const json* v, Member(key));
    if (!v->is_boolean()) {
      return Status::InvalidArgument(Where(key) + " must be true or false, got " + v->dump());
    }
    return v->get<bool>();
  }

  /// A nested object reader for `key` (checked to be an object).
  Result<ObjectReader> Object(const std::string& key) {
    GH_ASSIGN_OR_RETURN(const json* v, Member(key));
    ObjectReader r(*v, Child(key));
    GH_RETURN_IF_ERROR(r.CheckObject());
    return r;
  }

  /// Errors on members that were never read.
  Status Finish() const {
    std::vector<std::string> unknown;
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (!seen_.count(it.key())) unknown.push_back(Where(it.key()));
    }
    if (!unknown.empty()) return Status::InvalidArgument("unknown member " + Join(unknown));
    return Status::Ok();
  }

  const json& obj() const { return obj_; }

 private:
  const json& obj_;
  std::string path_;
  std::set<std::string> seen_;
};

bool IsHex40(const std::string& s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

Result<DigestedPath> ReadDigestedPath(ObjectReader& parent, const std::string& key) {
  GH_ASSIGN_OR_RETURN(ObjectReader r, parent.Object(key));
  DigestedPath out;
  GH_ASSIGN_OR_RETURN(out.path, r.String("path"));
  GH_ASSIGN_OR_RETURN(out.digest, r.String("digest"));
  if (!std::filesystem::path(out.path).is_absolute()) {
    return Status::InvalidArgument(r.Where("path") + " must be absolute, got '" + out.path + "'");
  }
  GH_RETURN_IF_ERROR(r.Finish());
  return out;
}

}  // namespace

bool RunSpec::Requested(std::string_view phase) const {
  return std::find(phases.begin(), phases.end(), phase) != phases.end();
}

Result<RunSpec> ParseRunSpec(const json& j) {
  ObjectReader r(j, "");
  GH_RETURN_IF_ERROR(r.CheckObject());
  RunSpec s;
  GH_ASSIGN_OR_RETURN(s.spec_version, r.Int("spec_version", 1));
  if (s.spec_version != 1) {
    return Status::InvalidArgument("'spec_version' is " + std::to_string(s.spec_version) +
                                   "; this worker reads version 1");
  }
  GH_ASSIGN_OR_RETURN(s.repository, r.String("repository"));
  GH_ASSIGN_OR_RETURN(s.commit, r.String("commit"));
  if (!IsHex40(s.commit)) {
    return Status::InvalidArgument("'commit' must be 40 lower-case hex digits, got '" + s.commit +
                                   "'");
  }
  GH_ASSIGN_OR_RETURN(s.model_family, r.String("model_family"));
  GH_ASSIGN_OR_RETURN(s.checkpoint, ReadDigestedPath(r, "checkpoint"));
  GH_ASSIGN_OR_RETURN(s.reference, ReadDigestedPath(r, "reference"));
  {
    GH_ASSIGN_OR_RETURN(ObjectReader o, r.Object("runtime"));
    GH_ASSIGN_OR_RETURN(s.runtime.torch, o.String("torch"));
    GH_ASSIGN_OR_RETURN(s.runtime.device, o.OneOf("device", {"cpu", "cuda"}));
    if (o.obj().contains("cuda")) {
      GH_ASSIGN_OR_RETURN(s.runtime.cuda, o.String("cuda"));
    }
    GH_RETURN_IF_ERROR(o.Finish());
  }
  {
    GH_ASSIGN_OR_RETURN(ObjectReader o, r.Object("launch"));
    GH_ASSIGN_OR_RETURN(s.launch.runner, o.String("runner"));
    GH_ASSIGN_OR_RETURN(s.launch.processes_per_rank, o.Int("processes_per_rank", 1));
    GH_RETURN_IF_ERROR(o.Finish());
  }
  {
    GH_ASSIGN_OR_RETURN(ObjectReader o, r.Object("topology"));
    GH_ASSIGN_OR_RETURN(s.topology.tp, o.Int("tp", 1));
    GH_ASSIGN_OR_RETURN(s.topology.dp, o.Int("dp", 1));
    GH_ASSIGN_OR_RETURN(s.topology.pp, o.Int("pp", 1));
    GH_ASSIGN_OR_RETURN(s.topology.ep, o.Int("ep", 1));
    GH_RETURN_IF_ERROR(o.Finish());
  }
  GH_ASSIGN_OR_RETURN(s.precision, r.OneOf("precision", {"fp32", "bf16"}));
  GH_ASSIGN_OR_RETURN(s.mode, r.OneOf("mode", {"eager", "cuda_graph"}));
  {
    GH_ASSIGN_OR_RETURN(ObjectReader o, r.Object("decode"));
    GH_ASSIGN_OR_RETURN(s.decode.max_new_tokens, o.Int("max_new_tokens", 1));
    GH_ASSIGN_OR_RETURN(s.decode.sampling, o.OneOf("sampling", {"greedy"}));
    GH_RETURN_IF_ERROR(o.Finish());
  }
  {
    GH_ASSIGN_OR_RETURN(ObjectReader o, r.Object("training"));
    GH_ASSIGN_OR_RETURN(s.training.steps, o.Int("steps", 2));
    GH_ASSIGN_OR_RETURN(s.training.lr, o.PositiveNumber("lr"));
    GH_ASSIGN_OR_RETURN(s.training.seed, o.Int("seed", INT64_MIN));
    GH_RETURN_IF_ERROR(o.Finish());
  }
  {
    GH_ASSIGN_OR_RETURN(ObjectReader o, r.Object("env"));
    for (auto it = o.obj().begin(); it != o.obj().end(); ++it) {
      GH_ASSIGN_OR_RETURN(s.env[it.key()], o.String(it.key(), /*non_empty=*/false));
    }
    GH_RETURN_IF_ERROR(o.Finish());
  }
  {
    GH_ASSIGN_OR_RETURN(const json* phases, r.Member("phases"));
    if (!phases->is_array() || phases->empty()) {
      return Status::InvalidArgument("'phases' must be a non-empty array of phase names, got " +
                                     phases->dump());
    }
    for (size_t i = 0; i < phases->size(); ++i) {
      const json& p = (*phases)[i];
      const std::string where = "'phases[" + std::to_string(i) + "]'";
      if (!p.is_string()) return Status::InvalidArgument(where + " must be a string");
      std::string name = p.get<std::string>();
      if (!PhaseIndex(name)) {
        std::vector<std::string> known(kPhases.begin(), kPhases.end());
        return Status::InvalidArgument(where + " is '" + name + "', not a phase; phases are " +
                                       Join(known));
      }
      if (s.Requested(name)) {
        return Status::InvalidArgument(where + " repeats phase '" + name + "'");
      }
      s.phases.push_back(std::move(name));
    }
  }
  {
    GH_ASSIGN_OR_RETURN(ObjectReader o, r.Object("attempt"));
    GH_ASSIGN_OR_RETURN(s.attempt.id, o.Int("id", 0));
    GH_ASSIGN_OR_RETURN(s.attempt.dir, o.String("dir"));
    if (!std::filesystem::path(s.attempt.dir).is_absolute()) {
      return Status::InvalidArgument("'attempt.dir' must be absolute, got '" + s.attempt.dir +
                                     "'");
    }
    {
      GH_ASSIGN_OR_RETURN(ObjectReader c, o.Object("checkout"));
      GH_ASSIGN_OR_RETURN(s.attempt.checkout.head, c.String("head", /*non_empty=*/false));
      GH_ASSIGN_OR_RETURN(s.attempt.checkout.clean, c.Bool("clean"));
      GH_ASSIGN_OR_RETURN(s.attempt.checkout.path, c.String("path", /*non_empty=*/false));
      GH_RETURN_IF_ERROR(c.Finish());
    }
    GH_ASSIGN_OR_RETURN(s.attempt.agent, o.String("agent", /*non_empty=*/false));
    GH_RETURN_IF_ERROR(o.Finish());
  }
  GH_RETURN_IF_ERROR(r.Finish());
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
