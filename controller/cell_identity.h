// Cell identity: freezing a submit body (docs/protocols.md §1, read by common/cell_spec.h) into
// the canonical spec whose SHA-256 is the cell id (§2). Domain logic: no transport, SQLite or
// libgit2 header; the commit comes through CommitResolver and digests through DigestCache.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/cell_spec.h"
#include "common/status.h"
#include "controller/commit_resolver.h"
#include "controller/digest_cache.h"

namespace gatehouse::controller {

/// The cell id: lower-case hex SHA-256 of CanonicalSpecJson(spec).
std::string CellIdOf(const CellSpec& spec);

/// A frozen cell: the id, its canonical spec and the labels kept beside it.
struct FrozenCell {
  std::string id;
  std::string spec_json;
  std::string repository;
  std::string commit;
  std::string branch;
  std::string model_family;
  int priority = 0;  // from the body; not part of the identity
  CellSpec spec;     // the spec spec_json serialises
  /// A validation cell's repository's default branch as the resolver saw it
  /// (CommitResolver::DefaultBranch); empty when not known. Not part of the identity.
  std::string default_branch;
  /// A validation body that named no reference: the reference cell it compares with (its id
  /// is spec.reference.cell), stored before this cell.
  std::shared_ptr<FrozenCell> reference_cell;
};

/// A valid body whose directory digests are still being computed (DigestCache::Lookup): the
/// cell id hashes them, so there is no cell yet. Submitting the same body again gives the cell
/// once they are known (docs/protocols.md §1, 202 "resolving").
struct DigestPending {
  /// "digesting checkpoint '/data/x': 1.2 of 2.0 GB hashed (3 of 5 files)"; "; " between
  /// directories.
  std::string reason;
  int64_t bytes_hashed = 0;  // over the directories being digested
  int64_t bytes_total = 0;
  /// The spec as far as it is frozen (commit resolved; digests, and the reference cell of a
  /// body naming none, not yet), for the checks that need no digest.
  CellSpec spec;
};

/// Freeze's answer to a valid body.
using FreezeOutcome = std::variant<FrozenCell, DigestPending>;

/// Turns submit bodies into frozen cells: validates, checks the checkpoint and reference
/// directories, resolves the commit, digests the directories, builds and hashes the spec.
///
/// Threading: thread-safe if the resolver is (DigestCache is). Blocking: a git fetch may take
/// seconds (do not call on an event loop); Freeze hashes no more than the cache's inline_bytes
/// itself and never waits for a background job, FreezeAndWait does.
class CellFreezer {
 public:
  CellFreezer(SubmitContext config, CommitResolver& resolver, DigestCache& digests);

  /// The frozen cell, or DigestPending while a digest is computed in the background. Every
  /// check that needs no digest (the body, the directories and their files, the tokenizer of
  /// text prompts, the commit, the adapter's recipe at that commit) runs first, so a bad body
  /// is refused at once. A reference
  /// cell's body freezes the checkpoint's digest only (no repository). A validation body
  /// naming no reference also freezes the reference cell for it (ReferenceCellFor). Errors:
  /// INVALID_ARGUMENT from ParseSubmitBody (common/cell_spec.h), or text prompts for a
  /// checkpoint without a tokenizer, a gatehouse.recipe.json at the commit that does not parse
  /// (its error after "<commit>: ") or declares "families" without the body's model_family
  /// (CheckServes, common/recipe.h); NOT_FOUND naming the checkpoint or reference path, the
  /// repository, branch or commit; a digest's error (DigestCache::Lookup) after "checkpoint
  /// '<path>': " or "reference '<path>': ".
  Result<FreezeOutcome> Freeze(std::string_view body);

  /// Freeze, waiting for the digests (DigestCache::Digest) instead of answering pending: for
  /// tests and tools that want the cell. Errors as Freeze.
  Result<FrozenCell> FreezeAndWait(std::string_view body);

  const SubmitContext& config() const { return config_; }

 private:
  Result<FreezeOutcome> FreezeBody(std::string_view body, bool wait);
  /// The recipe at spec.commit (from the resolver's mirror) serves spec.model_family; a commit
  /// without a recipe passes (its attempt ends saying so: the agent reads the checkout).
  Status CheckRecipeAt(const CellSpec& spec);

  SubmitContext config_;
  CommitResolver& resolver_;
  DigestCache& digests_;
};

}  // namespace gatehouse::controller
