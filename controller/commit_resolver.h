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
};

}  // namespace gatehouse::controller
