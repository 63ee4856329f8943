// libFuzzer target for the cell spec (common/cell_spec.cc, docs/protocols.md §1 and §2): the
// input is read both as a POST /api/v1/cells body (the controller's path) and as a frozen spec
// (the agent's and the worker's path).
//
// Checked for every input:
//  - ParseSubmitBody and ParseCellSpecJson return a Status, never throw or crash; an error is
//    INVALID_ARGUMENT with a non-empty message that the REST layer can put into its JSON error
//    body (nlohmann's strict dump: valid UTF-8).
//  - For an accepted body: the documented normal forms and limits (commit 40 lower-case hex,
//    absolute normal paths without a trailing '/', phases known, unique and in kPhases order,
//    every knob within CellSpecLimits); the frozen spec, with a fixed fake commit and digests,
//    reads back through ParseCellSpec as the same spec; its canonical JSON is stable (parsed
//    and serialised again: the same string); and ReproduceBody(spec) parses again into the
//    same spec (the "reproduce" body in reports really reproduces the cell).
//  - For an accepted frozen spec: the same limits, and its canonical JSON reads back equal.
// Any violation aborts, which libFuzzer reports as a crash with the input saved.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cell_spec.h"
#include "common/phases.h"

using gatehouse::CellSpec;
using gatehouse::CellSpecLimits;
using nlohmann::json;

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_cell_spec: invariant violated: %s\n", what.c_str());
  std::abort();
}

#define FUZZ_CHECK(cond, what) \
  do {                         \
    if (!(cond)) Fail(std::string(#cond) + ": " + (what)); \
  } while (0)

constexpr std::string_view kFakeCommit = "0123456789abcdef0123456789abcdef01234567";
const std::string kCheckpointDigest = "sha256:" + std::string(64, 'c');
const std::string kReferenceDigest = "sha256:" + std::string(64, 'e');

const gatehouse::SubmitContext& Context() {
  static const gatehouse::SubmitContext context = [] {
    gatehouse::SubmitContext c;
    c.torch_pin = "2.11.0";
    return c;
  }();
  return context;
}

bool IsLowerHex40(const std::string& s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool IsNormalAbsolute(const std::string& p) {
  return !p.empty() && p.front() == '/' && (p.size() == 1 || p.back() != '/') &&
         std::filesystem::path(p).lexically_normal().string() == p;
}

// What the REST layer does with an error message (controller/rest_api.cc ErrorResponse).
bool DumpsAsJson(const std::string& message) {
  try {
    (void)json{{"error", message}}.dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

void CheckError(const gatehouse::Status& s) {
  FUZZ_CHECK(s.code() == gatehouse::StatusCode::kInvalidArgument, s.message());
  FUZZ_CHECK(!s.message().empty(), "empty error message");
  FUZZ_CHECK(DumpsAsJson(s.message()),
             "error message is not valid UTF-8, the REST error body cannot hold it");
}

// The normal forms and limits every accepted spec keeps (commit may be empty in a body; a
// reference cell has no repository, commit or reference; a validation cell's reference is a
// directory, a reference cell's id, or none yet in a body that lets the controller choose).
void CheckSpec(const CellSpec& s) {
  using L = CellSpecLimits;
  const bool reference = s.IsReference();
  FUZZ_CHECK(reference || s.kind == gatehouse::kValidationKind, "unknown kind " + s.kind);
  FUZZ_CHECK(reference == s.repository.empty(), "repository and kind disagree");
  FUZZ_CHECK(!reference || (s.commit.empty() && s.reference == gatehouse::ReferenceInput{} &&
                            s.control.empty() && !s.runtime.transformers.empty()),
             "a reference cell with a validation cell's members");
  FUZZ_CHECK(reference || s.prompts.empty(), "a validation cell with prompts");
  FUZZ_CHECK(s.prompts.size() <= L::kMaxPrompts, "too many prompts");
  for (const gatehouse::Prompt& p : s.prompts) {
    FUZZ_CHECK(p.ids.empty() != p.text.empty(), "a prompt with both or neither of ids and text");
    FUZZ_CHECK(p.ids.size() <= L::kMaxPromptTokens && p.text.size() <= L::kMaxPromptTextBytes,
               "a prompt over its limit");
    FUZZ_CHECK(!p.chat || !p.text.empty(), "chat on an ids prompt");
  }
  FUZZ_CHECK(s.commit.empty() || IsLowerHex40(s.commit), "commit not lower-case hex: " + s.commit);
  FUZZ_CHECK(IsNormalAbsolute(s.checkpoint.path), "checkpoint not normal: " + s.checkpoint.path);
  FUZZ_CHECK(s.reference.path.empty() || IsNormalAbsolute(s.reference.path),
             "reference not normal: " + s.reference.path);
  FUZZ_CHECK(reference || !s.reference.path.empty() || !s.reference.cell.empty() ||
                 s.reference.digest.empty(),
             "a reference digest without a path");
  const auto& t = s.topology;
  FUZZ_CHECK(t.tp >= 1 && t.dp >= 1 && t.pp >= 1 && t.ep >= 1, "non-positive topology");
  FUZZ_CHECK(t.tp <= L::kMaxWorldSize && t.dp <= L::kMaxWorldSize && t.pp <= L::kMaxWorldSize &&
                 t.ep <= L::kMaxWorldSize && t.world_size() <= L::kMaxWorldSize,
             "topology over the rank cap");
  FUZZ_CHECK(s.training.steps >= 2 && s.training.steps <= L::kMaxTrainingSteps,
             "training.steps out of range");
  FUZZ_CHECK(s.training.lr > 0 && s.training.lr <= L::kMaxLearningRate, "training.lr out of range");
  FUZZ_CHECK(s.training.seed >= 0, "negative seed");
  FUZZ_CHECK(s.decode.max_new_tokens >= 1 && s.decode.max_new_tokens <= L::kMaxNewTokens,
             "max_new_tokens out of range");
  FUZZ_CHECK(s.env.size() <= L::kMaxEnvEntries, "too many env entries");
  for (const auto& [k, v] : s.env) {
    FUZZ_CHECK(v.size() <= L::kMaxEnvValueBytes && v.find('\0') == std::string::npos,
               "env value out of range: " + k);
  }
  FUZZ_CHECK(!s.phases.empty(), "no phases");
  if (reference) {
    FUZZ_CHECK(s.phases == std::vector<std::string>(gatehouse::kReferenceCellPhases.begin(),
                                                   gatehouse::kReferenceCellPhases.end()),
               "a reference cell's phases are not identity, reference");
  }
  for (size_t i = 0; !reference && i < s.phases.size(); ++i) {
    auto index = gatehouse::PhaseIndex(s.phases[i]);
    FUZZ_CHECK(index.has_value(), "unknown phase " + s.phases[i]);
    FUZZ_CHECK(i == 0 || *gatehouse::PhaseIndex(s.phases[i - 1]) < *index,
               "phases not in canonical order");
  }
  FUZZ_CHECK(!s.runtime.torch.empty(), "empty runtime.torch");
  FUZZ_CHECK(s.runtime.gpu_model.empty() || s.runtime.device == "cuda", "gpu_model without cuda");
}

// The canonical JSON of `spec` reads back as `spec` and is stable.
void CheckCanonical(const CellSpec& spec) {
  const std::string canonical = gatehouse::CanonicalSpecJson(spec);
  auto back = gatehouse::ParseCellSpecJson(canonical);
  FUZZ_CHECK(back.ok(), "the canonical JSON does not parse: " + back.status().message() +
                            " spec: " + canonical);
  FUZZ_CHECK(*back == spec, "the canonical JSON reads back as another spec: " + canonical);
  FUZZ_CHECK(json::parse(canonical).dump() == canonical,
             "canonical JSON changes when parsed and serialised again: " + canonical);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // The agent's and the worker's path: the input as a frozen spec.
  if (auto frozen = gatehouse::ParseCellSpecJson(text); frozen.ok()) {
    CheckSpec(*frozen);
    FUZZ_CHECK(frozen->IsReference() || !frozen->commit.empty(), "a frozen spec without a commit");
    FUZZ_CHECK(frozen->IsReference() || !frozen->reference.path.empty() ||
                   !frozen->reference.cell.empty(),
               "a frozen validation spec without a reference");
    CheckCanonical(*frozen);
  } else {
    CheckError(frozen.status());
  }

  // The controller's path: the input as a submit body.
  auto parsed = gatehouse::ParseSubmitBody(text, Context());
  if (!parsed.ok()) {
    CheckError(parsed.status());
    return 0;
  }
  CellSpec spec = parsed->spec;
  CheckSpec(spec);
  spec.checkpoint.digest = kCheckpointDigest;
  if (spec.IsReference()) {
    FUZZ_CHECK(!parsed->auto_reference && parsed->reference_prompts.empty(),
               "a reference body asking for a reference cell of its own");
  } else {
    FUZZ_CHECK(!parsed->branch.empty() || !spec.commit.empty(), "neither branch nor commit");
    FUZZ_CHECK(!spec.model_family.empty() &&
                   std::isalnum(static_cast<unsigned char>(spec.model_family[0])) &&
                   spec.model_family.find('/') == std::string::npos,
               "a model_family that is no name was accepted: " + spec.model_family);
    FUZZ_CHECK(parsed->auto_reference ==
                   (spec.reference.path.empty() && spec.reference.cell.empty()),
               "auto_reference and the body's reference disagree");
    if (spec.commit.empty()) spec.commit = kFakeCommit;
    // As the controller freezes it: a directory gets its digest, none gets the reference cell
    // ReferenceCellFor makes (whose own spec must freeze too).
    if (!spec.reference.path.empty()) spec.reference.digest = kReferenceDigest;
    if (parsed->auto_reference) {
      CellSpec ref = gatehouse::ReferenceCellFor(spec, parsed->reference_prompts, Context());
      CheckSpec(ref);
      CheckCanonical(ref);
      spec.reference.cell = std::string(64, 'a');
    }
  }
  CheckCanonical(spec);

  // The reproduce body (reports) reads back into the same spec.
  const std::string reproduce = gatehouse::ReproduceBody(spec).dump();
  auto again = gatehouse::ParseSubmitBody(reproduce, Context());
  FUZZ_CHECK(again.ok(), "ReproduceBody does not parse: " + again.status().message() +
                             " body: " + reproduce);
  CellSpec again_spec = again->spec;
  again_spec.checkpoint.digest = kCheckpointDigest;
  if (!again_spec.reference.path.empty()) again_spec.reference.digest = kReferenceDigest;
  FUZZ_CHECK(again_spec == spec, "ReproduceBody reads back as another spec: " + reproduce);
  return 0;
}
