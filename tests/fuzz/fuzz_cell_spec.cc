// libFuzzer target for the submit-body parser and the cell identity built from it
// (controller/cell_identity.cc, docs/protocols.md §1 and §2). The input is a POST
// /api/v1/cells body.
//
// Checked for every input:
//  - ParseSubmitBody returns a Status, never throws or crashes; an error is INVALID_ARGUMENT
//    with a non-empty message that the REST layer can put into its JSON error body
//    (nlohmann's strict dump: valid UTF-8).
//  - For an accepted body: the documented normal forms (commit 40 lower-case hex, absolute
//    normal paths without a trailing '/', phases known, unique and in kPhases order, topology
//    within the 64-rank cap); BuildFrozenSpec with fixed fake digests and commit; CanonicalJson
//    is stable (parsed with nlohmann and serialised again: the same string); CellIdOf is the
//    SHA-256 of it; and ReproduceBody(spec) parses again into a request whose spec has the same
//    canonical JSON (the "reproduce" body in reports really reproduces the cell).
// Any violation aborts, which libFuzzer reports as a crash with the input saved.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/phases.h"
#include "common/sha256.h"
#include "controller/cell_identity.h"

namespace ctl = gatehouse::controller;
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
const std::string kCheckpointDigest =
    "sha256:" + std::string(64, 'c');
const std::string kReferenceDigest =
    "sha256:" + std::string(64, 'e');

const ctl::IdentityConfig& Config() {
  static const ctl::IdentityConfig config = [] {
    ctl::IdentityConfig c;
    c.families = {"llama", "qwen2",  "qwen3",  "qwen3_moe", "mistral",
                  "gemma", "gemma2", "gemma3", "phi3"};
    c.torch_pin = "2.11.0";
    return c;
  }();
  return config;
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

void CheckRequest(const ctl::SubmitRequest& r) {
  FUZZ_CHECK(!r.repository.empty(), "empty repository");
  FUZZ_CHECK(!r.branch.empty() || !r.commit.empty(), "neither branch nor commit");
  FUZZ_CHECK(r.commit.empty() || IsLowerHex40(r.commit), "commit not lower-case hex: " + r.commit);
  FUZZ_CHECK(std::find(Config().families.begin(), Config().families.end(), r.model_family) !=
                 Config().families.end(),
             "unknown family accepted: " + r.model_family);
  FUZZ_CHECK(IsNormalAbsolute(r.checkpoint), "checkpoint not normal: " + r.checkpoint);
  FUZZ_CHECK(IsNormalAbsolute(r.reference), "reference not normal: " + r.reference);
  FUZZ_CHECK(r.topology.tp >= 1 && r.topology.dp >= 1 && r.topology.pp >= 1 && r.topology.ep >= 1,
             "non-positive topology");
  FUZZ_CHECK(r.topology.tp <= 64 && r.topology.dp <= 64 && r.topology.pp <= 64 &&
                 r.topology.tp * r.topology.dp * r.topology.pp <= 64,
             "topology over the 64-rank cap");
  FUZZ_CHECK(r.training.steps >= 2 && r.training.lr > 0 && r.training.seed >= 0,
             "training out of range");
  FUZZ_CHECK(r.max_new_tokens >= 1, "max_new_tokens < 1");
  FUZZ_CHECK(!r.phases.empty(), "no phases");
  for (size_t i = 0; i < r.phases.size(); ++i) {
    auto index = gatehouse::PhaseIndex(r.phases[i]);
    FUZZ_CHECK(index.has_value(), "unknown phase " + r.phases[i]);
    FUZZ_CHECK(i == 0 || *gatehouse::PhaseIndex(r.phases[i - 1]) < *index,
               "phases not in canonical order");
  }
  FUZZ_CHECK(!r.torch.empty(), "empty runtime.torch");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto parsed = ctl::ParseSubmitBody(body, Config());
  if (!parsed.ok()) {
    const gatehouse::Status& s = parsed.status();
    FUZZ_CHECK(s.code() == gatehouse::StatusCode::kInvalidArgument, s.message());
    FUZZ_CHECK(!s.message().empty(), "empty error message");
    FUZZ_CHECK(DumpsAsJson(s.message()),
               "error message is not valid UTF-8, the REST error body cannot hold it");
    return 0;
  }
  const ctl::SubmitRequest& r = *parsed;
  CheckRequest(r);

  const std::string commit = r.commit.empty() ? std::string(kFakeCommit) : r.commit;
  const json spec = ctl::BuildFrozenSpec(r, commit, kCheckpointDigest, kReferenceDigest);
  const std::string canonical = ctl::CanonicalJson(spec);
  FUZZ_CHECK(ctl::CanonicalJson(spec) == canonical, "CanonicalJson not deterministic");
  json reparsed;
  try {
    reparsed = json::parse(canonical);
  } catch (const json::exception& e) {
    Fail(std::string("canonical JSON does not parse: ") + e.what());
  }
  FUZZ_CHECK(ctl::CanonicalJson(reparsed) == canonical,
             "canonical JSON changes when parsed and serialised again: " + canonical);
  const std::string id = ctl::CellIdOf(spec);
  FUZZ_CHECK(id == gatehouse::Sha256Hex(canonical) && id.size() == 64, "cell id: " + id);
  FUZZ_CHECK(ctl::CellIdOf(reparsed) == id, "cell id changes after a JSON round trip");

  // The reproduce body (reports) freezes into the same cell.
  const std::string reproduce = ctl::ReproduceBody(spec).dump();
  auto again = ctl::ParseSubmitBody(reproduce, Config());
  FUZZ_CHECK(again.ok(), "ReproduceBody does not parse: " + again.status().message() +
                             " body: " + reproduce);
  CheckRequest(*again);
  const std::string canonical_again = ctl::CanonicalJson(
      ctl::BuildFrozenSpec(*again, again->commit, kCheckpointDigest, kReferenceDigest));
  FUZZ_CHECK(canonical_again == canonical,
             "ReproduceBody freezes into another spec:\n  " + canonical + "\n  " +
                 canonical_again);
  return 0;
}
