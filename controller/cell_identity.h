// Cell identity: validating the submit body (docs/protocols.md §1) and freezing it into the
// canonical spec whose SHA-256 is the cell id (§2). Domain logic: no transport, SQLite or
// libgit2 header; the commit comes through CommitResolver and digests through DigestCache.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "controller/commit_resolver.h"
#include "controller/digest_cache.h"

namespace gatehouse::controller {

/// Controller-wide settings that identity depends on.
struct IdentityConfig {
  std::vector<std::string> families = {"llama"};  // --families
  std::string torch_pin = "2.11.0";               // --torch-pin: default runtime.torch
};

/// The submit body after validation, with every default filled (docs/protocols.md §1).
struct SubmitRequest {
  std::string repository;
  std::string branch;  // empty when only commit was given
  std::string commit;  // empty when only branch was given; lower-case 40 hex otherwise
  std::string model_family;
  std::string checkpoint;  // absolute, lexically normal, no trailing '/'
  std::string reference;   // ditto; default <checkpoint>/../reference
  std::string precision = "fp32";
  std::string mode = "eager";
  std::string device = "cpu";
  struct Topology {
    int64_t tp = 1, dp = 1, pp = 1, ep = 1;
  } topology;
  struct Training {
    int64_t steps = 2;
    double lr = 0.001;
    int64_t seed = 1234;
  } training;
  int64_t max_new_tokens = 32;
  std::map<std::string, std::string> env;
  std::vector<std::string> phases;  // known names in kPhases order, no duplicates
  std::string torch;                // runtime.torch
  std::string cuda;                 // runtime.cuda ("13.0"); empty: not pinned, not in the spec
  std::string gpu_model;            // runtime.gpu_model ("H200"); empty: any, not in the spec
  int priority = 0;                 // scheduling only (-100..100); never in the spec
};

/// Parses and validates a submit body. Checks types and values only (no filesystem or git).
/// Errors: INVALID_ARGUMENT naming the field and the offending value, e.g.
/// "unknown field 'foo'", "field 'topology.tp': expected a positive integer, got \"2\"";
/// arrays/objects nested deeper than 64 levels are rejected. Messages are valid UTF-8.
Result<SubmitRequest> ParseSubmitBody(std::string_view body, const IdentityConfig& config);

/// The frozen spec of docs/protocols.md §2 for a validated request and its resolved inputs.
nlohmann::json BuildFrozenSpec(const SubmitRequest& request, const std::string& commit,
                               const std::string& checkpoint_digest,
                               const std::string& reference_digest);

/// The canonical serialisation (keys sorted, no whitespace) of a spec.
std::string CanonicalJson(const nlohmann::json& spec);

/// The cell id: lower-case hex SHA-256 of CanonicalJson(spec).
std::string CellIdOf(const nlohmann::json& spec);

/// A submit body that reproduces the cell of `spec` (names the commit, not the branch).
nlohmann::json ReproduceBody(const nlohmann::json& spec);

/// A frozen cell: the id, its canonical spec and the labels kept beside it.
struct FrozenCell {
  std::string id;
  std::string spec_json;
  std::string repository;
  std::string commit;
  std::string branch;
  std::string model_family;
  int priority = 0;  // from the body; not part of the identity
};

/// Turns submit bodies into frozen cells: validates, checks the checkpoint and reference
/// directories, resolves the commit, digests the directories, builds and hashes the spec.
///
/// Threading: thread-safe if the resolver is (DigestCache is). Blocking: git fetch and
/// hashing may take seconds; do not call on an event loop.
class CellFreezer {
 public:
  CellFreezer(IdentityConfig config, CommitResolver& resolver, DigestCache& digests);

  /// Errors: INVALID_ARGUMENT from ParseSubmitBody; NOT_FOUND naming the checkpoint or
  /// reference path, the repository, branch or commit.
  Result<FrozenCell> Freeze(std::string_view body);

  const IdentityConfig& config() const { return config_; }

 private:
  IdentityConfig config_;
  CommitResolver& resolver_;
  DigestCache& digests_;
};

}  // namespace gatehouse::controller
