// How the identity layer turns a branch or commit into a verified commit SHA. The real
// implementation is GitMirror (libgit2); tests use a fake. Keeps libgit2 out of domain code.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"

namespace gatehouse::controller {

/// Resolves repository references to commit SHAs. Implementations must be thread-safe.
class CommitResolver {
 public:
  virtual ~CommitResolver() = default;

  /// The commit SHA (40 lower-case hex) that refs/heads/<branch> of `repository` points at now.
  /// Errors: NOT_FOUND "repository '<url>': ..." or "branch '<b>' not found in '<url>'".
  virtual Result<std::string> ResolveBranch(const std::string& repository,
                                            const std::string& branch) = 0;

  /// `commit` (40 hex) if it exists in `repository`. Errors: NOT_FOUND naming the repository
  /// or the commit.
  virtual Result<std::string> ResolveCommit(const std::string& repository,
                                            const std::string& commit) = 0;

  /// The bytes of the file at `path` (relative, '/'-separated) in the tree of `commit`, a SHA
  /// this resolver returned for `repository`; nullopt when that tree has no such file.
  /// Errors: NOT_FOUND for a commit it does not hold; INTERNAL for a git failure or a file past
  /// 1 MiB.
  virtual Result<std::optional<std::string>> ReadFileAt(const std::string& repository,
                                                        const std::string& commit,
                                                        const std::string& path) = 0;

  /// The repository's default branch: the branch name (without refs/heads/) the remote's HEAD
  /// points to, as last seen when the resolver reached the remote (a branch or commit resolved
  /// before; reaching it now when not seen yet). Readiness counts this branch when an admin
  /// designated none (docs/protocols.md §1). Errors: NOT_FOUND when the remote names no default
  /// branch or cannot be reached; this default for resolvers that do not know.
  virtual Result<std::string> DefaultBranch(const std::string& repository) {
    return Status::NotFound("repository '" + repository + "': default branch not known");
  }
};

}  // namespace gatehouse::controller
