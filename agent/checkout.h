// Working clones of adaptation repositories at an exact commit (libgit2).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gatehouse::agent {

/// What an attempt records about its checkout (run.json "attempt.checkout").
struct CheckoutResult {
  std::string head;             // the commit HEAD points at (40 hex)
  bool clean = false;           // no modified, staged or untracked file
  std::filesystem::path path;   // the working tree
};

/// A working tree as its owner left it (`gatehouse run`): HEAD, its branch and what differs.
struct WorkingTree {
  CheckoutResult checkout;              // head, clean, path (absolute)
  std::string branch;                   // HEAD's branch; empty when HEAD is detached
  std::string origin_url;               // remote "origin"'s URL; empty without one
  /// Paths (relative, '/'-separated) that differ from HEAD: modified, staged, deleted or
  /// untracked (ignored files excluded), sorted.
  std::vector<std::string> changed;
};

/// Reads the repository whose working tree contains `path` (or is it), changing nothing.
/// Errors: NOT_FOUND when `path` is in no git repository; FAILED_PRECONDITION when HEAD points
/// at no commit (an empty repository); INTERNAL for another libgit2 failure. Each message names
/// the path.
Result<WorkingTree> InspectWorkingTree(const std::filesystem::path& path);

/// The directory name of a repository's clone and build tree: sha256(url)[:16].
std::string RepoKey(std::string_view url);

/// Keeps one working clone per repository under `<root>/<RepoKey(url)>` and checks out exact
/// commits in it: clone when absent, else fetch every branch
/// (+refs/heads/*:refs/remotes/origin/*); then a forced, detached checkout of the commit that
/// removes untracked (and ignored) files; then HEAD == commit and a clean status are verified.
///
/// Threading: calls for the same repository must not overlap (the agent runs one attempt at a
/// time); different instances may be used from different threads.
class GitCheckout {
 public:
  /// `root` is created when missing. Initialises libgit2 once per process.
  explicit GitCheckout(std::filesystem::path root);

  /// Errors: INVALID_ARGUMENT for a commit that is not 40 hex digits; UNAVAILABLE when cloning
  /// or fetching fails; NOT_FOUND when the commit is not in the repository; FAILED_PRECONDITION
  /// when HEAD or the tree does not verify. Every message names the repository and commit.
  Result<CheckoutResult> Checkout(std::string_view url, std::string_view commit);

 private:
  std::filesystem::path root_;
};

}  // namespace gatehouse::agent
