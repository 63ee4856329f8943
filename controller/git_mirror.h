// Bare mirrors of adaptation repositories (libgit2), used to resolve branches to commits.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "controller/commit_resolver.h"

struct git_remote;

namespace gatehouse::controller {

/// One bare mirror per repository under `mirror_dir`, named by the SHA-256 hex of the URL.
/// Repositories may be remote URLs, file:// URLs or absolute local paths.
///
/// Threading: thread-safe. Fetches into one mirror are serialised; different mirrors fetch in
/// parallel. Blocking (network and disk): do not call on an event loop.
class GitMirror : public CommitResolver {
 public:
  /// Calls git_libgit2_init once per process. The directory is created on first use.
  explicit GitMirror(std::filesystem::path mirror_dir);

  /// Fetches refs/heads/<branch> into the mirror and returns its commit SHA.
  /// Errors: NOT_FOUND "repository '<url>': <libgit2 message>" when it cannot be reached;
  /// NOT_FOUND "branch '<b>' not found in '<url>'"; INVALID_ARGUMENT for a malformed name.
  Result<std::string> ResolveBranch(const std::string& repository,
                                    const std::string& branch) override;

  /// Checks that `commit` names a commit in the mirror, fetching all heads first unless the
  /// mirror already holds it (commits are immutable, so a known one needs no network). A pair
  /// found once is remembered (up to kKnownCommits pairs) and answered without opening the
  /// mirror: CI submits a matrix of cells for one SHA.
  /// Errors: NOT_FOUND for the repository as above, or "commit '<sha>' not found in '<url>'".
  Result<std::string> ResolveCommit(const std::string& repository,
                                    const std::string& commit) override;

  /// Reads a blob of the commit's tree from the mirror (no network: the commit was resolved
  /// first). A (repository, commit, path) read once is remembered (up to kKnownFiles): a matrix
  /// of cells at one SHA reads its recipe once.
  Result<std::optional<std::string>> ReadFileAt(const std::string& repository,
                                                const std::string& commit,
                                                const std::string& path) override;

  /// The branch the remote's HEAD pointed to when this mirror last reached it (every
  /// ResolveBranch, and every ResolveCommit that fetched); a repository not reached since the
  /// process started is asked now, once (a connect, no fetch). Errors: NOT_FOUND for an
  /// unreachable repository (as ResolveBranch) or a remote whose HEAD names no branch.
  Result<std::string> DefaultBranch(const std::string& repository) override;

  /// The mirror directory of a repository.
  std::filesystem::path MirrorPath(const std::string& repository) const;

 private:
  std::mutex& MirrorMutex(const std::string& repository);
  // Keeps (or forgets) the default branch the connected `remote` advertises.
  void RememberDefaultBranch(const std::string& repository, git_remote* remote);

  std::filesystem::path mirror_dir_;
  static constexpr size_t kKnownCommits = 4096;
  static constexpr size_t kKnownFiles = 1024;
  static constexpr size_t kMaxFileBytes = 1 << 20;

  std::mutex mu_;  // guards locks_ and known_
  std::map<std::string, std::unique_ptr<std::mutex>> locks_;
  /// (repository, commit SHA) pairs the mirror was seen to hold; cleared when full.
  std::set<std::pair<std::string, std::string>> known_;
  /// (repository, commit, path) -> the file's bytes or nullopt, for ReadFileAt; cleared when
  /// full. Guarded by mu_.
  std::map<std::tuple<std::string, std::string, std::string>, std::optional<std::string>> files_;
  /// repository -> its remote's default branch as last seen ("": asked, none named or not
  /// reached). Guarded by mu_.
  std::map<std::string, std::string> default_branches_;
};

}  // namespace gatehouse::controller
