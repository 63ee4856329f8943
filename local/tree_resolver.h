// The commit resolver of `gatehouse run`: a working tree on the user's machine stands in for
// the controller's mirror, so the cell is frozen by the controller's own CellFreezer.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "controller/commit_resolver.h"

namespace gatehouse::local {

/// Resolves every repository name to the working tree at `tree` (the spec's repository is a
/// label there: the origin's URL, as a submit would name it): a branch or commit resolves to
/// `head` only, and files are read from the working tree as it is, changes included (what the
/// local run builds). Thread-safe (no state changes).
class TreeResolver : public controller::CommitResolver {
 public:
  /// `head`: the tree's HEAD (40 hex); `branch`: its branch, empty when detached.
  TreeResolver(std::filesystem::path tree, std::string head, std::string branch);

  /// `head` when `branch` is the tree's branch. Errors: NOT_FOUND naming the branch checked
  /// out (a local run builds what is checked out, nothing else).
  Result<std::string> ResolveBranch(const std::string& repository,
                                    const std::string& branch) override;
  /// `head` when `commit` is it. Errors: NOT_FOUND naming HEAD.
  Result<std::string> ResolveCommit(const std::string& repository,
                                    const std::string& commit) override;
  /// The working tree's file `path` (nullopt when absent). Errors: INVALID_ARGUMENT for a path
  /// leaving the tree; INTERNAL for a file past 1 MiB or unreadable.
  Result<std::optional<std::string>> ReadFileAt(const std::string& repository,
                                                const std::string& commit,
                                                const std::string& path) override;

 private:
  std::filesystem::path tree_;
  std::string head_;
  std::string branch_;
};

}  // namespace gatehouse::local
