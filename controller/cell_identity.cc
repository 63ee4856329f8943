#include "controller/cell_identity.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <set>

#include "common/phases.h"
#include "common/sha256.h"

namespace gatehouse::controller {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kSpecVersion = 1;
constexpr size_t kMaxShownValue = 80;
// Deepest nesting of arrays/objects accepted in a body (a valid one needs 2). Deeper input is
// rejected while parsing: nlohmann's dump(), which error messages use, recurses once per
// level, and a 200 KB body of '[' overflowed the stack (found by tests/fuzz/fuzz_cell_spec).
constexpr int kMaxJsonDepth = 64;

// The value as JSON text, shortened for error messages. The cut backs off to the start of a
// UTF-8 sequence, so the message stays valid UTF-8 (the REST error body is JSON).
std::string Shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > kMaxShownValue) {
    size_t cut = kMaxShownValue;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    s = s.substr(0, cut) + "...";
  }
  return s;
}

// `s` with every byte that is not part of a well-formed UTF-8 sequence written as \xHH.
// nlohmann's parse errors quote the raw input ("last read: '...'"); an error message must be
// valid UTF-8 to fit the REST error body (nlohmann's strict dump throws otherwise).
std::string ValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t len = lead < 0x80                ? 1
                       : (lead & 0xE0) == 0xC0 ? 2
                       : (lead & 0xF0) == 0xE0 ? 3
                       : (lead & 0xF8) == 0xF0 ? 4
                                               : 0;
    bool ok = len > 0 && i + len <= s.size();
    uint32_t cp = len > 1 ? lead & (0x7Fu >> len) : lead;
    for (size_t k = 1; ok && k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      ok = (c & 0xC0) == 0x80;
      cp = (cp << 6) | (c & 0x3Fu);
    }
    if (ok && len > 1) {  // no overlong forms, surrogates or code points past U+10FFFF
      constexpr uint32_t kMinOfLength[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMinOfLength[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      constexpr char kHex[] = "0123456789ABCDEF";
      out += "\\x";
      out += kHex[lead >> 4];
      out += kHex[lead & 0xF];
      ++i;
    }
  }
  return out;
}

// Thrown by the parse callback of ParseSubmitBody when the body nests deeper than
// kMaxJsonDepth; it stops the parse at once.
struct TooDeep {};

Status FieldError(std::string_view field, std::string_view expected, const json& value) {
  return Status::InvalidArgument("field '" + std::string(field) + "': expected " +
                                 std::string(expected) + ", got " + Shown(value));
}

// Rejects members of `obj` not in `known`, naming them as <prefix><name>.
Status CheckKnownFields(const json& obj, std::initializer_list<std::string_view> known,
                        std::string_view prefix) {
  for (const auto& [key, _] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Status::InvalidArgument("unknown field '" + std::string(prefix) + key + "'");
    }
  }
  return Status::Ok();
}

Result<std::string> GetString(const json& v, std::string_view field) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
    return FieldError(field, "a non-empty string", v);
  }
  return v.get<std::string>();
}

Result<std::string> GetEnum(const json& v, std::string_view field,
                            std::initializer_list<std::string_view> allowed) {
  std::string expected = "one of";
  for (auto a : allowed) expected += std::string(" '") + std::string(a) + "'";
  if (!v.is_string()) return FieldError(field, expected, v);
  const auto& s = v.get_ref<const std::string&>();
  if (std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
    return FieldError(field, expected, v);
  }
  return s;
}

// An integer in [min, max]; floats such as 2.0 are rejected.
Result<int64_t> GetInt(const json& v, std::string_view field, int64_t min, int64_t max,
                       std::string_view expected) {
  if (!v.is_number_integer()) return FieldError(field, expected, v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max)) {
    return FieldError(field, expected, v);
  }
  int64_t i = v.get<int64_t>();
  if (i < min || i > max) return FieldError(field, expected, v);
  return i;
}

// Absolute, lexically normal, without a trailing separator.
Result<std::string> GetAbsolutePath(const json& v, std::string_view field) {
  GH_ASSIGN_OR_RETURN(std::string s, GetString(v, field));
  fs::path p(s);
  if (!p.is_absolute()) return FieldError(field, "an absolute path", v);
  std::string norm = p.lexically_normal().string();
  while (norm.size() > 1 && norm.back() == '/') norm.pop_back();
  return norm;
}

bool IsHex40(std::string_view s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         });
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
/// The most worker ranks one cell may ask for (agent/worker_launcher.h kMaxWorldSize).
constexpr int64_t kMaxWorldSize = 64;

Status ParseTopology(const json& v, SubmitRequest::Topology& out) {
  if (!v.is_object()) return FieldError("topology", "an object", v);
  GH_RETURN_IF_ERROR(CheckKnownFields(v, {"tp", "dp", "pp", "ep"}, "topology."));
  std::pair<const char*, int64_t*> members[] = {
      {"tp", &out.tp}, {"dp", &out.dp}, {"pp", &out.pp}, {"ep", &out.ep}};
  for (auto& [name, dst] : members) {
    if (!v.contains(name)) continue;
    GH_ASSIGN_OR_RETURN(*dst, GetInt(v.at(name), std::string("topology.") + name, 1, kMaxInt32,
                                     "a positive integer"));
  }
  // One worker process per rank (tp x dp x pp): the agent launches at most kMaxWorldSize.
  // Each factor is checked first: three factors of up to 2^31 - 1 overflow int64 (found by
  // tests/fuzz/fuzz_cell_spec); with each <= kMaxWorldSize the product cannot.
  if (out.tp > kMaxWorldSize || out.dp > kMaxWorldSize || out.pp > kMaxWorldSize ||
      out.tp * out.dp * out.pp > kMaxWorldSize) {
    return FieldError("topology", "tp x dp x pp of at most " + std::to_string(kMaxWorldSize) +
                                      " ranks", v);
  }
  return Status::Ok();
}

Status ParseTraining(const json& v, SubmitRequest::Training& out) {
  if (!v.is_object()) return FieldError("training", "an object", v);
  GH_RETURN_IF_ERROR(CheckKnownFields(v, {"steps", "lr", "seed"}, "training."));
  if (v.contains("steps")) {
    GH_ASSIGN_OR_RETURN(out.steps,
                        GetInt(v.at("steps"), "training.steps", 2, kMaxInt32, "an integer >= 2"));
  }
  if (v.contains("lr")) {
    const json& lr = v.at("lr");
    if (!lr.is_number() || !(lr.get<double>() > 0) || !std::isfinite(lr.get<double>())) {
      return FieldError("training.lr", "a positive number", lr);
    }
    out.lr = lr.get<double>();
  }
  if (v.contains("seed")) {
    GH_ASSIGN_OR_RETURN(
        out.seed, GetInt(v.at("seed"), "training.seed", 0, std::numeric_limits<int64_t>::max(),
                         "a non-negative integer"));
  }
  return Status::Ok();
}

Status ParseEnv(const json& v, std::map<std::string, std::string>& out) {
  if (!v.is_object()) return FieldError("env", "an object of strings", v);
  for (const auto& [key, value] : v.items()) {
    if (key.empty() || key.find('=') != std::string::npos || key.find('\0') != std::string::npos) {
      return Status::InvalidArgument("field 'env': invalid variable name " + Shown(json(key)));
    }
    if (!value.is_string()) return FieldError("env." + key, "a string", value);
    out[key] = value.get<std::string>();
  }
  return Status::Ok();
}

Status ParsePhases(const json& v, std::vector<std::string>& out) {
  if (!v.is_array() || v.empty())
    return FieldError("phases", "a non-empty array of phase names", v);
  std::set<size_t> indices;
  for (const json& p : v) {
    if (!p.is_string()) return FieldError("phases", "phase names (strings)", p);
    const auto& name = p.get_ref<const std::string&>();
    auto index = PhaseIndex(name);
    if (!index) {
      std::string known;
      for (auto k : kPhases) known += (known.empty() ? "" : ", ") + std::string(k);
      return Status::InvalidArgument("field 'phases': unknown phase " + Shown(p) +
                                     " (known: " + known + ")");
    }
    if (!indices.insert(*index).second) {
      return Status::InvalidArgument("field 'phases': duplicate phase " + Shown(p));
    }
  }
  out.clear();
  for (size_t i : indices) out.emplace_back(kPhases[i]);  // canonical order
  return Status::Ok();
}

// "13.0": the CUDA version form torch.version.cuda reports (digits '.' digits).
bool IsMajorMinor(const std::string& s) {
  const size_t dot = s.find('.');
  if (dot == 0 || dot == std::string::npos || dot + 1 == s.size() || s.size() > 16) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i != dot && (s[i] < '0' || s[i] > '9')) return false;
  }
  return true;
}

Status ParseRuntime(const json& v, std::string& torch, std::string& cuda,
                    std::string& gpu_model) {
  if (!v.is_object()) return FieldError("runtime", "an object", v);
  GH_RETURN_IF_ERROR(CheckKnownFields(v, {"torch", "cuda", "gpu_model"}, "runtime."));
  if (v.contains("gpu_model")) {
    const json& g = v.at("gpu_model");
    const bool ok = g.is_string() && !g.get_ref<const std::string&>().empty() &&
                    g.get_ref<const std::string&>().size() <= 100 &&
                    std::all_of(g.get_ref<const std::string&>().begin(),
                                g.get_ref<const std::string&>().end(), [](unsigned char ch) {
                                  return std::isalnum(ch) || ch == ' ' || ch == '-' || ch == '_' ||
                                         ch == '.';
                                });
    if (!ok) {
      return FieldError("runtime.gpu_model",
                        "a GPU model name of 1 to 100 characters [A-Za-z0-9 ._-] such as \"H200\"",
                        g);
    }
    gpu_model = g.get<std::string>();
  }
  if (v.contains("torch")) {
    GH_ASSIGN_OR_RETURN(torch, GetString(v.at("torch"), "runtime.torch"));
  }
  if (v.contains("cuda")) {
    const json& c = v.at("cuda");
    if (!c.is_string() || !IsMajorMinor(c.get_ref<const std::string&>())) {
      return FieldError("runtime.cuda", "a CUDA version \"major.minor\" such as \"13.0\"", c);
    }
    cuda = c.get<std::string>();
  }
  return Status::Ok();
}

Status CheckDirectory(const std::string& what, const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return Status::NotFound(what + " '" + path + "': no such directory");
  }
  return Status::Ok();
}

}  // namespace

Result<SubmitRequest> ParseSubmitBody(std::string_view body, const IdentityConfig& config) {
  json in;
  try {
    in = json::parse(body, [](int depth, json::parse_event_t event, json&) {
      if ((event == json::parse_event_t::object_start ||
           event == json::parse_event_t::array_start) &&
          depth >= kMaxJsonDepth) {
        throw TooDeep{};
      }
      return true;
    });
  } catch (const json::exception& e) {
    return Status::InvalidArgument("body is not valid JSON: " + ValidUtf8(e.what()));
  } catch (const TooDeep&) {
    return Status::InvalidArgument("body: JSON arrays/objects nested deeper than " +
                                   std::to_string(kMaxJsonDepth) + " levels");
  }
  if (!in.is_object())
    return Status::InvalidArgument("body: expected a JSON object, got " + Shown(in));
  GH_RETURN_IF_ERROR(CheckKnownFields(
      in,
      {"repository", "branch", "commit", "model_family", "checkpoint", "reference", "precision",
       "mode", "device", "topology", "training", "decode", "env", "phases", "runtime",
       "priority"},
      ""));

  SubmitRequest r;
  for (const char* required : {"repository", "model_family", "checkpoint"}) {
    if (!in.contains(required)) {
      return Status::InvalidArgument(std::string("missing required field '") + required + "'");
    }
  }
  GH_ASSIGN_OR_RETURN(r.repository, GetString(in.at("repository"), "repository"));
  if (r.repository.front() == '/') {  // a local path: normalise like checkpoint
    GH_ASSIGN_OR_RETURN(r.repository, GetAbsolutePath(in.at("repository"), "repository"));
  } else if (r.repository.find("://") == std::string::npos) {
    // A relative path would be resolved against whichever process reads it (controller,
    // agent): not one repository.
    return Status::InvalidArgument("field 'repository' = " + Shown(in.at("repository")) +
                                   ": expected a URL (scheme://...) or an absolute path");
  }
  if (!in.contains("branch") && !in.contains("commit")) {
    return Status::InvalidArgument("one of the fields 'branch' or 'commit' is required");
  }
  if (in.contains("branch")) {
    GH_ASSIGN_OR_RETURN(r.branch, GetString(in.at("branch"), "branch"));
  }
  if (in.contains("commit")) {
    const json& c = in.at("commit");
    if (!c.is_string() || !IsHex40(c.get_ref<const std::string&>())) {
      return FieldError("commit", "a 40-hex commit SHA", c);
    }
    r.commit = Lower(c.get<std::string>());
  }

  GH_ASSIGN_OR_RETURN(r.model_family, GetString(in.at("model_family"), "model_family"));
  if (std::find(config.families.begin(), config.families.end(), r.model_family) ==
      config.families.end()) {
    std::string known;
    for (const auto& f : config.families) known += (known.empty() ? "" : ", ") + f;
    return Status::InvalidArgument("field 'model_family': unknown family " +
                                   Shown(in.at("model_family")) + " (known: " + known + ")");
  }

  GH_ASSIGN_OR_RETURN(r.checkpoint, GetAbsolutePath(in.at("checkpoint"), "checkpoint"));
  if (in.contains("reference")) {
    GH_ASSIGN_OR_RETURN(r.reference, GetAbsolutePath(in.at("reference"), "reference"));
  } else {
    r.reference = (fs::path(r.checkpoint).parent_path() / "reference").lexically_normal().string();
  }

  if (in.contains("precision")) {
    GH_ASSIGN_OR_RETURN(r.precision, GetEnum(in.at("precision"), "precision", {"fp32", "bf16"}));
  }
  if (in.contains("mode")) {
    GH_ASSIGN_OR_RETURN(r.mode, GetEnum(in.at("mode"), "mode", {"eager", "cuda_graph"}));
  }
  if (in.contains("device")) {
    GH_ASSIGN_OR_RETURN(r.device, GetEnum(in.at("device"), "device", {"cpu", "cuda"}));
  }
  if (in.contains("topology")) GH_RETURN_IF_ERROR(ParseTopology(in.at("topology"), r.topology));
  if (in.contains("training")) GH_RETURN_IF_ERROR(ParseTraining(in.at("training"), r.training));
  if (in.contains("decode")) {
    const json& d = in.at("decode");
    if (!d.is_object()) return FieldError("decode", "an object", d);
    GH_RETURN_IF_ERROR(CheckKnownFields(d, {"max_new_tokens"}, "decode."));
    if (d.contains("max_new_tokens")) {
      GH_ASSIGN_OR_RETURN(r.max_new_tokens, GetInt(d.at("max_new_tokens"), "decode.max_new_tokens",
                                                   1, kMaxInt32, "a positive integer"));
    }
  }
  if (in.contains("env")) GH_RETURN_IF_ERROR(ParseEnv(in.at("env"), r.env));
  if (in.contains("phases")) {
    GH_RETURN_IF_ERROR(ParsePhases(in.at("phases"), r.phases));
  } else {
    r.phases.assign(kDefaultPhases.begin(), kDefaultPhases.end());
  }
  r.torch = config.torch_pin;
  if (in.contains("runtime")) {
    GH_RETURN_IF_ERROR(ParseRuntime(in.at("runtime"), r.torch, r.cuda, r.gpu_model));
  }
  if (!r.gpu_model.empty() && r.device != "cuda") {
    return Status::InvalidArgument("field 'runtime.gpu_model' (\"" + r.gpu_model +
                                   "\") needs \"device\": \"cuda\"");
  }
  if (in.contains("priority")) {
    GH_ASSIGN_OR_RETURN(const int64_t priority,
                        GetInt(in.at("priority"), "priority", -100, 100,
                               "an integer from -100 to 100"));
    r.priority = static_cast<int>(priority);
  }
  return r;
}

json BuildFrozenSpec(const SubmitRequest& r, const std::string& commit,
                     const std::string& checkpoint_digest, const std::string& reference_digest) {
  json spec = json::object();
  spec["spec_version"] = kSpecVersion;
  spec["repository"] = r.repository;
  spec["commit"] = commit;
  spec["model_family"] = r.model_family;
  spec["checkpoint"] = {{"path", r.checkpoint}, {"digest", checkpoint_digest}};
  spec["reference"] = {{"path", r.reference}, {"digest", reference_digest}};
  spec["runtime"] = {{"torch", r.torch}, {"device", r.device}};
  // Only when pinned: a cell without a CUDA pin keeps the id it had before the field existed.
  if (!r.cuda.empty()) spec["runtime"]["cuda"] = r.cuda;
  if (!r.gpu_model.empty()) spec["runtime"]["gpu_model"] = r.gpu_model;  // likewise
  spec["launch"] = {{"runner", "gatehouse-worker"}, {"processes_per_rank", 1}};
  spec["topology"] = {
      {"tp", r.topology.tp}, {"dp", r.topology.dp}, {"pp", r.topology.pp}, {"ep", r.topology.ep}};
  spec["precision"] = r.precision;
  spec["mode"] = r.mode;
  spec["decode"] = {{"max_new_tokens", r.max_new_tokens}, {"sampling", "greedy"}};
  spec["training"] = {
      {"steps", r.training.steps}, {"lr", r.training.lr}, {"seed", r.training.seed}};
  spec["env"] = json::object();
  for (const auto& [k, v] : r.env) spec["env"][k] = v;
  spec["phases"] = r.phases;
  return spec;
}

std::string CanonicalJson(const json& spec) { return spec.dump(); }

std::string CellIdOf(const json& spec) { return Sha256Hex(CanonicalJson(spec)); }

json ReproduceBody(const json& spec) {
  json body = json::object();
  auto copy = [&](const char* key, const json::json_pointer& from) {
    if (spec.contains(from)) body[key] = spec.at(from);
  };
  copy("repository", json::json_pointer("/repository"));
  copy("commit", json::json_pointer("/commit"));
  copy("model_family", json::json_pointer("/model_family"));
  copy("checkpoint", json::json_pointer("/checkpoint/path"));
  copy("reference", json::json_pointer("/reference/path"));
  copy("precision", json::json_pointer("/precision"));
  copy("mode", json::json_pointer("/mode"));
  copy("device", json::json_pointer("/runtime/device"));
  copy("topology", json::json_pointer("/topology"));
  copy("training", json::json_pointer("/training"));
  copy("env", json::json_pointer("/env"));
  copy("phases", json::json_pointer("/phases"));
  if (spec.contains(json::json_pointer("/decode/max_new_tokens"))) {
    body["decode"] = {{"max_new_tokens", spec.at(json::json_pointer("/decode/max_new_tokens"))}};
  }
  if (spec.contains(json::json_pointer("/runtime/torch"))) {
    body["runtime"] = {{"torch", spec.at(json::json_pointer("/runtime/torch"))}};
    if (spec.contains(json::json_pointer("/runtime/cuda"))) {
      body["runtime"]["cuda"] = spec.at(json::json_pointer("/runtime/cuda"));
    }
    if (spec.contains(json::json_pointer("/runtime/gpu_model"))) {
      body["runtime"]["gpu_model"] = spec.at(json::json_pointer("/runtime/gpu_model"));
    }
  }
  return body;
}

CellFreezer::CellFreezer(IdentityConfig config, CommitResolver& resolver, DigestCache& digests)
    : config_(std::move(config)), resolver_(resolver), digests_(digests) {}

Result<FrozenCell> CellFreezer::Freeze(std::string_view body) {
  GH_ASSIGN_OR_RETURN(SubmitRequest r, ParseSubmitBody(body, config_));

  // Cheap filesystem checks before the git fetch.
  GH_RETURN_IF_ERROR(CheckDirectory("checkpoint", r.checkpoint));
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(r.checkpoint) / "config.json", ec)) {
    return Status::NotFound("checkpoint '" + r.checkpoint + "': no config.json in it");
  }
  GH_RETURN_IF_ERROR(CheckDirectory("reference", r.reference));
  for (const char* file : {"reference.json", "reference.safetensors"}) {
    if (!fs::is_regular_file(fs::path(r.reference) / file, ec)) {
      return Status::NotFound("reference '" + r.reference + "': no " + file +
                              " in it (not a reference bundle made by tools/refgen)");
    }
  }

  std::string commit;
  if (!r.commit.empty()) {
    GH_ASSIGN_OR_RETURN(commit, resolver_.ResolveCommit(r.repository, r.commit));
  } else {
    GH_ASSIGN_OR_RETURN(commit, resolver_.ResolveBranch(r.repository, r.branch));
  }

  GH_ASSIGN_OR_RETURN(std::string ckpt_digest, digests_.Digest(r.checkpoint));
  GH_ASSIGN_OR_RETURN(std::string ref_digest, digests_.Digest(r.reference));

  json spec = BuildFrozenSpec(r, commit, ckpt_digest, ref_digest);
  FrozenCell cell;
  cell.spec_json = CanonicalJson(spec);
  cell.id = Sha256Hex(cell.spec_json);
  cell.repository = r.repository;
  cell.commit = commit;
  cell.branch = r.branch;
  cell.model_family = r.model_family;
  cell.priority = r.priority;
  return cell;
}

}  // namespace gatehouse::controller
