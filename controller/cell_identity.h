// Cell identity: freezing a submit body (docs/protocols.md §1, read by common/cell_spec.h) into
// the canonical spec whose SHA-256 is the cell id (§2). Domain logic: no transport, SQLite or
// libgit2 header; the commit comes through CommitResolver and digests through DigestCache.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
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
  /// A validation body that named no reference: the reference cell it compares with (its id
  /// is spec.reference.cell), stored before this cell.
  std::shared_ptr<FrozenCell> reference_cell;
};

/// Turns submit bodies into frozen cells: validates, checks the checkpoint and reference
/// directories, resolves the commit, digests the directories, builds and hashes the spec.
///
/// Threading: thread-safe if the resolver is (DigestCache is). Blocking: git fetch and
/// hashing may take seconds; do not call on an event loop.
class CellFreezer {
 public:
  CellFreezer(SubmitContext config, CommitResolver& resolver, DigestCache& digests);

  /// A reference cell's body freezes the checkpoint's digest only (no repository). A
  /// validation body naming no reference also freezes the reference cell for it
  /// (ReferenceCellFor). Errors: INVALID_ARGUMENT from ParseSubmitBody (common/cell_spec.h),
  /// or text prompts for a checkpoint without a tokenizer; NOT_FOUND naming the checkpoint or
  /// reference path, the repository, branch or commit.
  Result<FrozenCell> Freeze(std::string_view body);

  const SubmitContext& config() const { return config_; }

 private:
  SubmitContext config_;
  CommitResolver& resolver_;
  DigestCache& digests_;
};

}  // namespace gatehouse::controller
