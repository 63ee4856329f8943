// The cell spec (docs/protocols.md §1, §2): one reader per field, shared by the submit body and
// the frozen spec. The two forms differ only in which members are required and where a few
// live (the body's "device" is the spec's runtime.device; the body's checkpoint is a path, the
// spec's a path with its digest).
#include "common/cell_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "common/json_fields.h"
#include "common/phases.h"

namespace gatehouse {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Limits = CellSpecLimits;
using json_fields::FieldError;
using json_fields::Members;
using json_fields::ReadInt;
using json_fields::ReadString;
using json_fields::Shown;

// Deepest nesting of arrays/objects accepted in a body (a valid one needs 2). Deeper input is
// refused while parsing: nlohmann's dump(), which error messages use, recurses once per level,
// and a 200 KB body of '[' overflowed the stack (found by tests/fuzz/fuzz_cell_spec).
constexpr int kMaxJsonDepth = 64;

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

// Thrown by the parse callback when the body nests deeper than kMaxJsonDepth; it stops the
// parse at once.
struct TooDeep {};

// Which form is read: the submit body (members optional, defaults fill) or the frozen spec
// (every member required but the optional pins).
enum class Form { kBody, kFrozen };

// The member `key` of `m` read in `form`: nullptr when absent and it may be (any member of a
// body; an optional one of a frozen spec). Errors: "missing field" otherwise.
Result<const json*> Get(const Members& m, Form form, std::string_view key,
                        bool optional_when_frozen = false) {
  if (form == Form::kFrozen && !optional_when_frozen) return m.Require(key);
  return m.Find(key);
}

std::string Bytes(size_t n) { return std::to_string(n) + " bytes"; }

// An absolute path of at most kMaxPathBytes, lexically normal, without a trailing separator.
Result<std::string> ReadAbsolutePath(const json& v, std::string_view field) {
  return json_fields::ReadAbsolutePath(v, field, Limits::kMaxPathBytes);
}


Result<std::string> ReadEnum(const json& v, std::string_view field,
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

bool IsHex40(std::string_view s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         });
}

// A 40-hex commit SHA, lower-cased.
Result<std::string> ReadCommit(const json& v, std::string_view field) {
  if (!v.is_string() || !IsHex40(v.get_ref<const std::string&>())) {
    return FieldError(field, "a 40-hex commit SHA", v);
  }
  std::string s = v.get<std::string>();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// A URL (scheme://...) or an absolute path (normalised like the checkpoint path).
Result<std::string> ReadRepository(const json& v, std::string_view field) {
  GH_ASSIGN_OR_RETURN(std::string repository, ReadString(v, field, Limits::kMaxPathBytes));
  if (repository.front() == '/') return ReadAbsolutePath(v, field);
  if (repository.find("://") == std::string::npos) {
    // A relative path would be resolved against whichever process reads it (controller,
    // agent): not one repository.
    return Status::InvalidArgument("field '" + std::string(field) + "' = " + Shown(v) +
                                   ": expected a URL (scheme://...) or an absolute path");
  }
  return repository;
}

// A version pin or a GPU model name: 1 to kMaxNameBytes of [A-Za-z0-9 ._+-] (spaces only when
// `spaces`).
bool IsName(const std::string& s, bool spaces) {
  return !s.empty() && s.size() <= Limits::kMaxNameBytes &&
         std::all_of(s.begin(), s.end(), [&](unsigned char ch) {
           return std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '+' ||
                  (spaces && ch == ' ');
         });
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

Status ReadTopology(const json& v, Form form, CellSpec::Topology& out) {
  GH_ASSIGN_OR_RETURN(Members m, Members::Of(v, "topology.",
                                             {"tp", "dp", "pp", "ep", "dp_shard", "cp", "etp"}));
  // dp_shard, cp and etp are frozen only when not 1 (CellSpecToJson), so they are optional there.
  struct Degree {
    const char* name;
    int64_t* dst;
    bool optional_when_frozen;
  };
  const Degree members[] = {{"tp", &out.tp, false},      {"dp", &out.dp, false},
                            {"pp", &out.pp, false},      {"ep", &out.ep, false},
                            {"dp_shard", &out.dp_shard, true}, {"cp", &out.cp, true},
                            {"etp", &out.etp, true}};
  for (const Degree& d : members) {
    GH_ASSIGN_OR_RETURN(const json* f, Get(m, form, d.name, d.optional_when_frozen));
    if (f) {
      GH_ASSIGN_OR_RETURN(*d.dst, ReadInt(*f, m.Name(d.name), 1, Limits::kMaxWorldSize));
    }
  }
  // One worker process per rank. Each factor is at most kMaxWorldSize, so the product cannot
  // overflow.
  if (out.tp * out.dp * out.pp * out.dp_shard * out.cp > Limits::kMaxWorldSize) {
    return FieldError("topology",
                      "pp x dp x dp_shard x cp x tp of at most " +
                          std::to_string(Limits::kMaxWorldSize) + " ranks",
                      v);
  }
  // A submitted mesh must also be one the ranks can form (ep borrowed from dp_shard x cp).
  // A frozen spec is not held to that rule: cells stored before it keep reading (their
  // parallel gate names what it cannot run).
  if (form == Form::kBody) {
    GH_RETURN_IF_ERROR(Mesh::Make(out.mesh_shape(), Limits::kMaxWorldSize).status());
  }
  return Status::Ok();
}

Status ReadTraining(const json& v, Form form, CellSpec::Training& out) {
  GH_ASSIGN_OR_RETURN(Members m, Members::Of(v, "training.", {"steps", "lr", "seed"}));
  GH_ASSIGN_OR_RETURN(const json* steps, Get(m, form, "steps"));
  if (steps) {
    GH_ASSIGN_OR_RETURN(out.steps,
                        ReadInt(*steps, "training.steps", 2, Limits::kMaxTrainingSteps));
  }
  GH_ASSIGN_OR_RETURN(const json* lr, Get(m, form, "lr"));
  if (lr) {
    if (!lr->is_number() || !(lr->get<double>() > 0) ||
        !(lr->get<double>() <= Limits::kMaxLearningRate)) {
      return FieldError("training.lr", "a number above 0 and at most 1", *lr);
    }
    out.lr = lr->get<double>();
  }
  GH_ASSIGN_OR_RETURN(const json* seed, Get(m, form, "seed"));
  if (seed) {
    GH_ASSIGN_OR_RETURN(out.seed, ReadInt(*seed, "training.seed", 0,
                                          std::numeric_limits<int64_t>::max(),
                                          "a non-negative 64-bit integer"));
  }
  return Status::Ok();
}

Status ReadDecode(const json& v, Form form, CellSpec::Decode& out) {
  // The body names no sampling: greedy is the only one.
  GH_ASSIGN_OR_RETURN(Members m, form == Form::kBody
                                     ? Members::Of(v, "decode.", {"max_new_tokens"})
                                     : Members::Of(v, "decode.",
                                                   {"max_new_tokens", "sampling"}));
  GH_ASSIGN_OR_RETURN(const json* n, Get(m, form, "max_new_tokens"));
  if (n) {
    GH_ASSIGN_OR_RETURN(out.max_new_tokens,
                        ReadInt(*n, "decode.max_new_tokens", 1, Limits::kMaxNewTokens));
  }
  if (form == Form::kFrozen) {
    GH_ASSIGN_OR_RETURN(const json* s, Get(m, form, "sampling"));
    GH_ASSIGN_OR_RETURN(out.sampling, ReadEnum(*s, "decode.sampling", {"greedy"}));
  }
  return Status::Ok();
}

Status ReadEnv(const json& v, std::map<std::string, std::string>& out) {
  if (!v.is_object()) return FieldError("env", "an object of strings", v);
  if (v.size() > Limits::kMaxEnvEntries) {
    return Status::InvalidArgument("field 'env': " + std::to_string(v.size()) +
                                   " variables; at most " +
                                   std::to_string(Limits::kMaxEnvEntries));
  }
  for (const auto& [key, value] : v.items()) {
    if (key.empty() || key.size() > Limits::kMaxEnvNameBytes ||
        key.find('=') != std::string::npos || key.find('\0') != std::string::npos) {
      return Status::InvalidArgument("field 'env': invalid variable name " + Shown(json(key)) +
                                     " (1 to " + Bytes(Limits::kMaxEnvNameBytes) +
                                     ", no '=' or NUL)");
    }
    if (!value.is_string() || value.get_ref<const std::string&>().size() >
                                  Limits::kMaxEnvValueBytes ||
        value.get_ref<const std::string&>().find('\0') != std::string::npos) {
      return FieldError("env." + key,
                        "a string of at most " + Bytes(Limits::kMaxEnvValueBytes) + " without NUL",
                        value);
    }
    out[key] = value.get<std::string>();
  }
  return Status::Ok();
}

// The phases of a cell of kind `kind`: names of kPhases (validation) or of
// kReferenceCellPhases (reference), no duplicates, stored in that order. A reference cell runs
// all of its phases.
Status ReadPhases(const json& v, std::string_view kind, std::vector<std::string>& out) {
  const bool reference = kind == kReferenceKind;
  std::vector<std::string_view> allowed(reference ? kReferenceCellPhases.begin() : kPhases.begin(),
                                        reference ? kReferenceCellPhases.end() : kPhases.end());
  if (!v.is_array() || v.empty()) {
    return FieldError("phases", "a non-empty array of phase names", v);
  }
  std::set<size_t> indices;
  for (const json& p : v) {
    if (!p.is_string()) return FieldError("phases", "phase names (strings)", p);
    const auto it = std::find(allowed.begin(), allowed.end(), p.get_ref<const std::string&>());
    if (it == allowed.end()) {
      std::string known;
      for (auto k : allowed) known += (known.empty() ? "" : ", ") + std::string(k);
      return Status::InvalidArgument("field 'phases': unknown phase " + Shown(p) + " for a " +
                                     std::string(kind) + " cell (known: " + known + ")");
    }
    if (!indices.insert(static_cast<size_t>(it - allowed.begin())).second) {
      return Status::InvalidArgument("field 'phases': duplicate phase " + Shown(p));
    }
  }
  if (reference && indices.size() != allowed.size()) {
    return FieldError("phases", "every phase of a reference cell: [\"identity\", \"reference\"]", v);
  }
  out.clear();
  for (size_t i : indices) out.emplace_back(allowed[i]);  // canonical order
  return Status::Ok();
}

// A submitted validation cell's phases include each one's prerequisite (PhasePrerequisite),
// transitively: without it the phase can only end UNKNOWN, so the body is refused naming the
// first phase whose prerequisite is missing. Frozen specs are not checked (stored cells stay
// readable).
Status CheckPrerequisites(const std::vector<std::string>& phases) {
  const auto requested = [&](std::string_view p) {
    return std::find(phases.begin(), phases.end(), p) != phases.end();
  };
  for (const std::string& phase : phases) {
    const std::optional<std::string_view> needed = PhasePrerequisite(phase);
    if (needed && !requested(*needed)) {
      return Status::InvalidArgument("field 'phases': phase \"" + phase + "\" needs phase \"" +
                                     std::string(*needed) + "\", which is not requested (add it)");
    }
  }
  return Status::Ok();
}

Result<std::string> ReadKind(const json& v) {
  return ReadEnum(v, "kind", {kValidationKind, kReferenceKind});
}

bool IsHex64(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// A cell id: 64 lower-case hex.
Result<std::string> ReadCellId(const json& v, std::string_view field) {
  if (!v.is_string() || !IsHex64(v.get_ref<const std::string&>())) {
    return FieldError(field, "a cell id (64 lower-case hex)", v);
  }
  return v.get<std::string>();
}

// Probe prompts: at most kMaxPrompts objects {"ids": [...]} or {"text": "...", "chat": bool}.
Status ReadPrompts(const json& v, std::vector<Prompt>& out) {
  if (!v.is_array()) return FieldError("prompts", "an array of prompts", v);
  if (v.size() > Limits::kMaxPrompts) {
    return Status::InvalidArgument("field 'prompts': " + std::to_string(v.size()) +
                                   " prompts; at most " + std::to_string(Limits::kMaxPrompts));
  }
  out.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = "prompts[" + std::to_string(i) + "]";
    const json& p = v[i];
    GH_ASSIGN_OR_RETURN(Members m, Members::Of(p, field + ".", {"ids", "text", "chat"}));
    Prompt prompt;
    const json* ids = m.Find("ids");
    const json* text = m.Find("text");
    const json* chat = m.Find("chat");
    if ((ids == nullptr) == (text == nullptr)) {
      return FieldError(field, "an object with either \"ids\" or \"text\"", p);
    }
    if (ids != nullptr) {
      if (!ids->is_array() || ids->empty() || ids->size() > Limits::kMaxPromptTokens) {
        return FieldError(field + ".ids",
                          "an array of 1 to " + std::to_string(Limits::kMaxPromptTokens) +
                              " token ids",
                          *ids);
      }
      for (const json& id : *ids) {
        GH_ASSIGN_OR_RETURN(const int64_t token,
                            ReadInt(id, field + ".ids", 0, std::numeric_limits<int32_t>::max(),
                                    "token ids from 0 to 2147483647"));
        prompt.ids.push_back(token);
      }
      if (chat != nullptr) {
        return Status::InvalidArgument("field '" + field +
                                       ".chat': only a text prompt takes a chat template");
      }
    } else {
      GH_ASSIGN_OR_RETURN(prompt.text, ReadString(*text, field + ".text",
                                                  Limits::kMaxPromptTextBytes));
      if (prompt.text.empty()) return FieldError(field + ".text", "a non-empty string", *text);
      if (chat != nullptr) {
        if (!chat->is_boolean()) return FieldError(field + ".chat", "true or false", *chat);
        prompt.chat = chat->get<bool>();
      }
    }
    out.push_back(std::move(prompt));
  }
  return Status::Ok();
}

json PromptsToJson(const std::vector<Prompt>& prompts) {
  json out = json::array();
  for (const Prompt& p : prompts) {
    if (!p.ids.empty()) {
      out.push_back({{"ids", p.ids}});
    } else {
      out.push_back({{"text", p.text}, {"chat", p.chat}});
    }
  }
  return out;
}

// A name-like pin of runtime: 1 to kMaxNameBytes of [A-Za-z0-9._+-] (and spaces when
// `spaces`), set into `dst` when present. `what` describes it in the error ("a torch version").
Status ReadRuntimeName(const Members& m, Form form, std::string_view key, bool optional_when_frozen,
                       bool spaces, std::string_view what, std::string_view example,
                       std::string& dst) {
  GH_ASSIGN_OR_RETURN(const json* v, Get(m, form, key, optional_when_frozen));
  if (v == nullptr) return Status::Ok();
  if (!v->is_string() || !IsName(v->get<std::string>(), spaces)) {
    return FieldError("runtime." + std::string(key),
                      std::string(what) + " of 1 to 128 characters [A-Za-z0-9" +
                          (spaces ? " " : "") + "._+-] such as \"" + std::string(example) + "\"",
                      *v);
  }
  dst = v->get<std::string>();
  return Status::Ok();
}

// runtime.{torch, cuda, gpu_model, transformers} in both forms; runtime.device in the frozen
// form only (the body names it at the top level).
Status ReadRuntime(const json& v, Form form, CellSpec::Runtime& out) {
  GH_ASSIGN_OR_RETURN(Members m, form == Form::kBody
                                     ? Members::Of(v, "runtime.",
                                                   {"torch", "cuda", "gpu_model", "transformers"})
                                     : Members::Of(v, "runtime.",
                                                   {"torch", "device", "cuda", "gpu_model",
                                                    "transformers"}));
  GH_RETURN_IF_ERROR(ReadRuntimeName(m, form, "torch", /*optional_when_frozen=*/false,
                                     /*spaces=*/false, "a torch version", "2.11.0", out.torch));
  if (form == Form::kFrozen) {
    GH_ASSIGN_OR_RETURN(const json* device, Get(m, form, "device"));
    GH_ASSIGN_OR_RETURN(out.device, ReadEnum(*device, "runtime.device", {"cpu", "cuda"}));
  }
  GH_ASSIGN_OR_RETURN(const json* cuda, Get(m, form, "cuda", /*optional_when_frozen=*/true));
  if (cuda) {
    if (!cuda->is_string() || !IsMajorMinor(cuda->get<std::string>())) {
      return FieldError("runtime.cuda", "a CUDA version \"major.minor\" such as \"13.0\"", *cuda);
    }
    out.cuda = cuda->get<std::string>();
  }
  GH_RETURN_IF_ERROR(ReadRuntimeName(m, form, "gpu_model", /*optional_when_frozen=*/true,
                                     /*spaces=*/true, "a GPU model name", "H200", out.gpu_model));
  GH_RETURN_IF_ERROR(ReadRuntimeName(m, form, "transformers", /*optional_when_frozen=*/true,
                                     /*spaces=*/false, "a transformers version", "5.24.0",
                                     out.transformers));
  return Status::Ok();
}

Result<DigestedPath> ReadDigestedPath(const json& v, std::string_view field) {
  const std::string prefix = std::string(field) + ".";
  GH_ASSIGN_OR_RETURN(Members m, field == "reference"
                                     ? Members::Of(v, prefix, {"path", "digest", "cell"})
                                     : Members::Of(v, prefix, {"path", "digest"}));
  DigestedPath out;
  GH_ASSIGN_OR_RETURN(const json* path, m.Require("path"));
  GH_ASSIGN_OR_RETURN(out.path, ReadAbsolutePath(*path, m.Name("path")));
  GH_ASSIGN_OR_RETURN(const json* digest, m.Require("digest"));
  GH_ASSIGN_OR_RETURN(out.digest, ReadString(*digest, m.Name("digest"), Limits::kMaxNameBytes));
  return out;
}

// The frozen `reference`: {"path", "digest"} (a directory), {"cell"} (a reference cell's
// bundle) or all three (a run spec: the agent fetched the cell's bundle to path).
Result<ReferenceInput> ReadReference(const json& v) {
  GH_ASSIGN_OR_RETURN(Members m, Members::Of(v, "reference.", {"path", "digest", "cell"}));
  ReferenceInput out;
  const json* cell = m.Find("cell");
  if (cell != nullptr) {
    GH_ASSIGN_OR_RETURN(out.cell, ReadCellId(*cell, "reference.cell"));
    const json* path = m.Find("path");
    if (path == nullptr) {
      const json* digest = m.Find("digest");
      if (digest != nullptr) return Status::InvalidArgument("field 'reference.digest' needs 'reference.path'");
      return out;
    }
  }
  GH_ASSIGN_OR_RETURN(DigestedPath dir, ReadDigestedPath(v, "reference"));
  static_cast<DigestedPath&>(out) = std::move(dir);
  return out;
}

// A model family name: the adapter's claim, checked by the worker against the families its
// plugin registers. 1 to kMaxNameBytes of [A-Za-z0-9_.-], starting with a letter or digit (it
// names folders and log lines; "../x" or "" never is one).
Result<std::string> ReadFamily(const json& v) {
  GH_ASSIGN_OR_RETURN(std::string family, ReadString(v, "model_family", Limits::kMaxNameBytes));
  const bool ok = !family.empty() && std::isalnum(static_cast<unsigned char>(family[0])) &&
                  std::all_of(family.begin(), family.end(), [](unsigned char ch) {
                    return std::isalnum(ch) || ch == '_' || ch == '-' || ch == '.';
                  });
  if (!ok) {
    return Status::InvalidArgument("field 'model_family' = " + Shown(v) +
                                   ": expected a family name (letters, digits, '_', '-', '.', "
                                   "starting with a letter or digit)");
  }
  return family;
}

// Checks across fields, the same in both forms.
Status CheckCoherent(const CellSpec& s) {
  if (!s.runtime.gpu_model.empty() && s.runtime.device != "cuda") {
    return Status::InvalidArgument("field 'runtime.gpu_model' (\"" + s.runtime.gpu_model +
                                   "\") needs \"device\": \"cuda\"");
  }
  if (s.IsReference() && s.runtime.transformers.empty()) {
    return Status::InvalidArgument("field 'runtime.transformers': a reference cell pins the "
                                   "transformers version it runs");
  }
  return Status::Ok();
}

// Parses JSON text with the nesting limit; errors name `what` ("body", "spec").
Result<json> ParseJson(std::string_view text, std::string_view what) {
  try {
    return json::parse(text, [](int depth, json::parse_event_t event, json&) {
      if ((event == json::parse_event_t::object_start ||
           event == json::parse_event_t::array_start) &&
          depth >= kMaxJsonDepth) {
        throw TooDeep{};
      }
      return true;
    });
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string(what) + " is not valid JSON: " +
                                   ValidUtf8(e.what()));
  } catch (const TooDeep&) {
    return Status::InvalidArgument(std::string(what) + ": JSON arrays/objects nested deeper than " +
                                   std::to_string(kMaxJsonDepth) + " levels");
  }
}

}  // namespace

bool CellSpec::Requested(std::string_view phase) const {
  return std::find(phases.begin(), phases.end(), phase) != phases.end();
}

Result<CellSpec> ParseCellSpec(const json& in) {
  CellSpec s;
  if (in.is_object() && in.contains("kind")) {
    GH_ASSIGN_OR_RETURN(s.kind, ReadKind(in.at("kind")));
  }
  const bool reference = s.IsReference();
  GH_ASSIGN_OR_RETURN(
      Members m,
      reference ? Members::Of(in, "",
                              {"spec_version", "kind", "checkpoint", "runtime", "decode",
                               "training", "prompts", "env", "phases"})
                : Members::Of(in, "",
                              {"spec_version", "kind", "repository", "commit", "model_family",
                               "checkpoint", "reference", "control", "runtime", "launch",
                               "topology", "precision", "mode", "decode", "training", "env",
                               "phases"}));
  GH_ASSIGN_OR_RETURN(const json* version, m.Require("spec_version"));
  GH_ASSIGN_OR_RETURN(s.spec_version, ReadInt(*version, "spec_version", kCellSpecVersion,
                                              kCellSpecVersion,
                                              "version " + std::to_string(kCellSpecVersion)));
  GH_ASSIGN_OR_RETURN(const json* checkpoint, m.Require("checkpoint"));
  GH_ASSIGN_OR_RETURN(s.checkpoint, ReadDigestedPath(*checkpoint, "checkpoint"));
  GH_ASSIGN_OR_RETURN(const json* runtime, m.Require("runtime"));
  GH_RETURN_IF_ERROR(ReadRuntime(*runtime, Form::kFrozen, s.runtime));
  GH_ASSIGN_OR_RETURN(const json* decode, m.Require("decode"));
  GH_RETURN_IF_ERROR(ReadDecode(*decode, Form::kFrozen, s.decode));
  GH_ASSIGN_OR_RETURN(const json* training, m.Require("training"));
  GH_RETURN_IF_ERROR(ReadTraining(*training, Form::kFrozen, s.training));
  GH_ASSIGN_OR_RETURN(const json* env, m.Require("env"));
  GH_RETURN_IF_ERROR(ReadEnv(*env, s.env));
  GH_ASSIGN_OR_RETURN(const json* phases, m.Require("phases"));
  GH_RETURN_IF_ERROR(ReadPhases(*phases, s.kind, s.phases));
  if (reference) {
    GH_ASSIGN_OR_RETURN(const json* prompts, m.Require("prompts"));
    GH_RETURN_IF_ERROR(ReadPrompts(*prompts, s.prompts));
    GH_RETURN_IF_ERROR(CheckCoherent(s));
    return s;
  }
  GH_ASSIGN_OR_RETURN(const json* repository, m.Require("repository"));
  GH_ASSIGN_OR_RETURN(s.repository, ReadRepository(*repository, "repository"));
  GH_ASSIGN_OR_RETURN(const json* commit, m.Require("commit"));
  GH_ASSIGN_OR_RETURN(s.commit, ReadCommit(*commit, "commit"));
  GH_ASSIGN_OR_RETURN(const json* family, m.Require("model_family"));
  GH_ASSIGN_OR_RETURN(s.model_family, ReadFamily(*family));
  GH_ASSIGN_OR_RETURN(const json* reference_member, m.Require("reference"));
  GH_ASSIGN_OR_RETURN(s.reference, ReadReference(*reference_member));
  const json* control = m.Find("control");
  if (control != nullptr) {
    GH_ASSIGN_OR_RETURN(s.control, ReadCellId(*control, "control"));
  }
  {
    GH_ASSIGN_OR_RETURN(const json* launch, m.Require("launch"));
    GH_ASSIGN_OR_RETURN(Members l,
                        Members::Of(*launch, "launch.", {"runner", "processes_per_rank"}));
    GH_ASSIGN_OR_RETURN(const json* runner, l.Require("runner"));
    GH_ASSIGN_OR_RETURN(s.launch.runner, ReadEnum(*runner, "launch.runner", {"gatehouse-worker"}));
    GH_ASSIGN_OR_RETURN(const json* ppr, l.Require("processes_per_rank"));
    GH_ASSIGN_OR_RETURN(s.launch.processes_per_rank,
                        ReadInt(*ppr, "launch.processes_per_rank", 1, 1,
                                "1 (one worker process per rank)"));
  }
  GH_ASSIGN_OR_RETURN(const json* topology, m.Require("topology"));
  GH_RETURN_IF_ERROR(ReadTopology(*topology, Form::kFrozen, s.topology));
  GH_ASSIGN_OR_RETURN(const json* precision, m.Require("precision"));
  GH_ASSIGN_OR_RETURN(s.precision, ReadEnum(*precision, "precision", {"fp32", "bf16"}));
  GH_ASSIGN_OR_RETURN(const json* mode, m.Require("mode"));
  GH_ASSIGN_OR_RETURN(s.mode, ReadEnum(*mode, "mode", {"eager", "cuda_graph"}));
  GH_RETURN_IF_ERROR(CheckCoherent(s));
  return s;
}

Result<CellSpec> ParseCellSpecJson(std::string_view spec_json) {
  GH_ASSIGN_OR_RETURN(const json spec, ParseJson(spec_json, "spec"));
  return ParseCellSpec(spec);
}

json TopologyJson(const CellSpec::Topology& t) {
  json out = {{"tp", t.tp}, {"dp", t.dp}, {"pp", t.pp}, {"ep", t.ep}};
  // Frozen only when not 1: a cell frozen before these dimensions existed keeps its identity.
  if (t.dp_shard != 1) out["dp_shard"] = t.dp_shard;
  if (t.cp != 1) out["cp"] = t.cp;
  if (t.etp != 1) out["etp"] = t.etp;
  return out;
}

std::string TopologyText(const CellSpec::Topology& t) {
  std::string out = "tp=" + std::to_string(t.tp) + " dp=" + std::to_string(t.dp) +
                    " pp=" + std::to_string(t.pp) + " ep=" + std::to_string(t.ep);
  if (t.dp_shard != 1) out += " dp_shard=" + std::to_string(t.dp_shard);
  if (t.cp != 1) out += " cp=" + std::to_string(t.cp);
  if (t.etp != 1) out += " etp=" + std::to_string(t.etp);
  return out;
}

json CellSpecToJson(const CellSpec& s) {
  json spec = json::object();
  spec["spec_version"] = s.spec_version;
  spec["checkpoint"] = {{"path", s.checkpoint.path}, {"digest", s.checkpoint.digest}};
  spec["runtime"] = {{"torch", s.runtime.torch}, {"device", s.runtime.device}};
  // Only when pinned: a cell without a CUDA pin keeps the id it had before the field existed.
  if (!s.runtime.cuda.empty()) spec["runtime"]["cuda"] = s.runtime.cuda;
  if (!s.runtime.gpu_model.empty()) spec["runtime"]["gpu_model"] = s.runtime.gpu_model;
  if (!s.runtime.transformers.empty()) spec["runtime"]["transformers"] = s.runtime.transformers;
  spec["decode"] = {{"max_new_tokens", s.decode.max_new_tokens}, {"sampling", s.decode.sampling}};
  spec["training"] = {
      {"steps", s.training.steps}, {"lr", s.training.lr}, {"seed", s.training.seed}};
  spec["env"] = json::object();
  for (const auto& [k, v] : s.env) spec["env"][k] = v;
  spec["phases"] = s.phases;
  if (s.IsReference()) {
    spec["kind"] = s.kind;
    spec["prompts"] = PromptsToJson(s.prompts);
    return spec;
  }
  // A validation cell has no `kind` member: its id is the one it had before kinds existed.
  spec["repository"] = s.repository;
  spec["commit"] = s.commit;
  spec["model_family"] = s.model_family;
  spec["reference"] = json::object();
  if (!s.reference.cell.empty()) spec["reference"]["cell"] = s.reference.cell;
  if (s.reference.cell.empty() || !s.reference.path.empty()) {
    spec["reference"]["path"] = s.reference.path;
    spec["reference"]["digest"] = s.reference.digest;
  }
  if (!s.control.empty()) spec["control"] = s.control;
  spec["launch"] = {{"runner", s.launch.runner},
                    {"processes_per_rank", s.launch.processes_per_rank}};
  spec["topology"] = TopologyJson(s.topology);
  spec["precision"] = s.precision;
  spec["mode"] = s.mode;
  return spec;
}

std::string CanonicalSpecJson(const CellSpec& spec) { return CellSpecToJson(spec).dump(); }

namespace {

// The body's members both kinds of cell read alike: training, decode, env.
Status ReadUpstreamKnobs(const json& in, CellSpec& s) {
  if (in.contains("training")) GH_RETURN_IF_ERROR(ReadTraining(in.at("training"), Form::kBody, s.training));
  if (in.contains("decode")) GH_RETURN_IF_ERROR(ReadDecode(in.at("decode"), Form::kBody, s.decode));
  if (in.contains("env")) GH_RETURN_IF_ERROR(ReadEnv(in.at("env"), s.env));
  return Status::Ok();
}

// The body's scheduling priority (never part of the spec).
Status ReadPriority(const json& in, SubmitRequest& r) {
  if (!in.contains("priority")) return Status::Ok();
  GH_ASSIGN_OR_RETURN(const int64_t priority, ReadInt(in.at("priority"), "priority",
                                                      Limits::kMinPriority, Limits::kMaxPriority));
  r.priority = static_cast<int>(priority);
  return Status::Ok();
}

// A reference body (docs/protocols.md §1): the checkpoint and what upstream runs on it.
Result<SubmitRequest> ParseReferenceBody(const json& in, const SubmitContext& context) {
  constexpr Form kForm = Form::kBody;
  GH_RETURN_IF_ERROR(Members::Of(in, "",
                                 {"kind", "checkpoint", "device", "runtime", "decode", "training",
                                  "prompts", "env", "phases", "priority"})
                         .status());
  if (!in.contains("checkpoint")) {
    return Status::InvalidArgument("missing required field 'checkpoint'");
  }
  SubmitRequest r;
  CellSpec& s = r.spec;
  s.kind = std::string(kReferenceKind);
  GH_ASSIGN_OR_RETURN(s.checkpoint.path, ReadAbsolutePath(in.at("checkpoint"), "checkpoint"));
  if (in.contains("device")) {
    GH_ASSIGN_OR_RETURN(s.runtime.device, ReadEnum(in.at("device"), "device", {"cpu", "cuda"}));
  }
  s.runtime.torch = context.torch_pin;
  s.runtime.transformers = context.transformers_pin;
  if (in.contains("runtime")) GH_RETURN_IF_ERROR(ReadRuntime(in.at("runtime"), kForm, s.runtime));
  GH_RETURN_IF_ERROR(ReadUpstreamKnobs(in, s));
  if (in.contains("prompts")) GH_RETURN_IF_ERROR(ReadPrompts(in.at("prompts"), s.prompts));
  if (in.contains("phases")) {
    GH_RETURN_IF_ERROR(ReadPhases(in.at("phases"), s.kind, s.phases));
  } else {
    s.phases.assign(kReferenceCellPhases.begin(), kReferenceCellPhases.end());
  }
  GH_RETURN_IF_ERROR(CheckCoherent(s));
  GH_RETURN_IF_ERROR(ReadPriority(in, r));
  return r;
}

}  // namespace

Result<SubmitRequest> ParseSubmitBody(std::string_view body, const SubmitContext& context) {
  constexpr Form kForm = Form::kBody;
  GH_ASSIGN_OR_RETURN(const json in, ParseJson(body, "body"));
  if (!in.is_object()) {
    return Status::InvalidArgument("body: expected a JSON object, got " + Shown(in));
  }
  if (in.contains("kind")) {
    GH_ASSIGN_OR_RETURN(const std::string kind, ReadKind(in.at("kind")));
    if (kind == kReferenceKind) return ParseReferenceBody(in, context);
  }
  GH_RETURN_IF_ERROR(Members::Of(in, "",
                                 {"kind", "repository", "branch", "commit", "model_family",
                                  "checkpoint", "reference", "control", "prompts", "precision",
                                  "mode", "device", "topology", "training", "decode", "env",
                                  "phases", "runtime", "priority"})
                         .status());
  for (const char* required : {"repository", "model_family", "checkpoint"}) {
    if (!in.contains(required)) {
      return Status::InvalidArgument(std::string("missing required field '") + required + "'");
    }
  }
  if (!in.contains("branch") && !in.contains("commit")) {
    return Status::InvalidArgument("one of the fields 'branch' or 'commit' is required");
  }

  SubmitRequest r;
  CellSpec& s = r.spec;
  GH_ASSIGN_OR_RETURN(s.repository, ReadRepository(in.at("repository"), "repository"));
  if (in.contains("branch")) {
    GH_ASSIGN_OR_RETURN(r.branch, ReadString(in.at("branch"), "branch", Limits::kMaxBranchBytes));
  }
  if (in.contains("commit")) {
    GH_ASSIGN_OR_RETURN(s.commit, ReadCommit(in.at("commit"), "commit"));
  }

  GH_ASSIGN_OR_RETURN(s.model_family, ReadFamily(in.at("model_family")));

  GH_ASSIGN_OR_RETURN(s.checkpoint.path, ReadAbsolutePath(in.at("checkpoint"), "checkpoint"));
  // The reference bundle: a directory, a reference cell's ({"cell": id}), or none named (the
  // controller finds or creates the reference cell for this checkpoint).
  if (!in.contains("reference")) {
    r.auto_reference = true;
  } else if (const json& ref = in.at("reference"); ref.is_object()) {
    GH_ASSIGN_OR_RETURN(Members m, Members::Of(ref, "reference.", {"cell"}));
    GH_ASSIGN_OR_RETURN(const json* cell, m.Require("cell"));
    GH_ASSIGN_OR_RETURN(s.reference.cell, ReadCellId(*cell, "reference.cell"));
  } else {
    GH_ASSIGN_OR_RETURN(s.reference.path, ReadAbsolutePath(ref, "reference"));
  }
  if (in.contains("prompts")) {
    if (!r.auto_reference) {
      return Status::InvalidArgument(
          "field 'prompts': prompts are the reference cell's; a cell naming its reference "
          "compares with that bundle's prompts");
    }
    GH_RETURN_IF_ERROR(ReadPrompts(in.at("prompts"), r.reference_prompts));
  }
  if (in.contains("control")) {
    GH_ASSIGN_OR_RETURN(s.control, ReadCellId(in.at("control"), "control"));
  }

  if (in.contains("precision")) {
    GH_ASSIGN_OR_RETURN(s.precision, ReadEnum(in.at("precision"), "precision", {"fp32", "bf16"}));
  }
  if (in.contains("mode")) {
    GH_ASSIGN_OR_RETURN(s.mode, ReadEnum(in.at("mode"), "mode", {"eager", "cuda_graph"}));
  }
  if (in.contains("device")) {
    GH_ASSIGN_OR_RETURN(s.runtime.device, ReadEnum(in.at("device"), "device", {"cpu", "cuda"}));
  }
  if (in.contains("topology")) GH_RETURN_IF_ERROR(ReadTopology(in.at("topology"), kForm, s.topology));
  GH_RETURN_IF_ERROR(ReadUpstreamKnobs(in, s));
  if (in.contains("phases")) {
    GH_RETURN_IF_ERROR(ReadPhases(in.at("phases"), s.kind, s.phases));
    GH_RETURN_IF_ERROR(CheckPrerequisites(s.phases));
  } else {
    s.phases.assign(kDefaultPhases.begin(), kDefaultPhases.end());
  }
  s.runtime.torch = context.torch_pin;
  if (in.contains("runtime")) GH_RETURN_IF_ERROR(ReadRuntime(in.at("runtime"), kForm, s.runtime));
  if (!s.runtime.transformers.empty()) {
    return Status::InvalidArgument("field 'runtime.transformers': only a reference cell runs "
                                   "transformers (pin it with \"kind\": \"reference\")");
  }
  GH_RETURN_IF_ERROR(CheckCoherent(s));
  GH_RETURN_IF_ERROR(ReadPriority(in, r));
  return r;
}

// The device is taken with its CUDA and GPU-model pins: upstream runs where the cell runs.
CellSpec ReferenceCellFor(const CellSpec& spec, const std::vector<Prompt>& prompts,
                          const SubmitContext& context) {
  CellSpec r;
  r.kind = std::string(kReferenceKind);
  r.checkpoint = spec.checkpoint;
  r.runtime.torch = spec.runtime.torch;
  r.runtime.device = spec.runtime.device;
  r.runtime.cuda = spec.runtime.cuda;
  r.runtime.gpu_model = spec.runtime.gpu_model;
  r.runtime.transformers = context.transformers_pin;
  r.decode = spec.decode;
  r.training = spec.training;
  r.prompts = prompts;
  r.phases.assign(kReferenceCellPhases.begin(), kReferenceCellPhases.end());
  return r;
}

json ReproduceBody(const CellSpec& s) {
  const json spec = CellSpecToJson(s);
  if (s.IsReference()) {
    json body = {{"kind", s.kind},
                 {"checkpoint", s.checkpoint.path},
                 {"device", s.runtime.device},
                 {"runtime", {{"torch", s.runtime.torch}, {"transformers", s.runtime.transformers}}},
                 {"decode", {{"max_new_tokens", s.decode.max_new_tokens}}},
                 {"training", spec["training"]},
                 {"prompts", spec["prompts"]},
                 {"env", spec["env"]}};
    if (!s.runtime.cuda.empty()) body["runtime"]["cuda"] = s.runtime.cuda;
    if (!s.runtime.gpu_model.empty()) body["runtime"]["gpu_model"] = s.runtime.gpu_model;
    return body;
  }
  json body = {{"repository", s.repository},
               {"commit", s.commit},
               {"model_family", s.model_family},
               {"checkpoint", s.checkpoint.path},
               {"precision", s.precision},
               {"mode", s.mode},
               {"device", s.runtime.device},
               {"decode", {{"max_new_tokens", s.decode.max_new_tokens}}},
               {"runtime", {{"torch", s.runtime.torch}}},
               {"phases", s.phases}};
  if (s.reference.cell.empty()) {
    body["reference"] = s.reference.path;
  } else {
    body["reference"] = {{"cell", s.reference.cell}};
  }
  if (!s.control.empty()) body["control"] = s.control;
  body["topology"] = spec["topology"];
  body["training"] = spec["training"];
  body["env"] = spec["env"];
  if (!s.runtime.cuda.empty()) body["runtime"]["cuda"] = s.runtime.cuda;
  if (!s.runtime.gpu_model.empty()) body["runtime"]["gpu_model"] = s.runtime.gpu_model;
  return body;
}

bool GpuModelMatches(std::string_view gpu_model, std::string_view pin) {
  if (pin.empty()) return true;
  auto lower = [](unsigned char c) { return static_cast<char>(std::tolower(c)); };
  return std::search(gpu_model.begin(), gpu_model.end(), pin.begin(), pin.end(),
                     [&](char a, char b) { return lower(a) == lower(b); }) != gpu_model.end();
}

}  // namespace gatehouse
