// Checkout of an exact commit with libgit2 1.5.
#include "agent/checkout.h"

#include <git2.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include <spdlog/spdlog.h>

#include "common/sha256.h"

namespace gatehouse::agent {
namespace {

constexpr const char* kFetchRefspec = "+refs/heads/*:refs/remotes/origin/*";

template <typename T, void (*Free)(T*)>
struct GitDeleter {
  void operator()(T* p) const { Free(p); }
};
template <typename T, void (*Free)(T*)>
using GitPtr = std::unique_ptr<T, GitDeleter<T, Free>>;

using RepoPtr = GitPtr<git_repository, git_repository_free>;
using RemotePtr = GitPtr<git_remote, git_remote_free>;
using CommitPtr = GitPtr<git_commit, git_commit_free>;
using ReferencePtr = GitPtr<git_reference, git_reference_free>;
using StatusListPtr = GitPtr<git_status_list, git_status_list_free>;
using BufPtr = std::unique_ptr<git_buf, GitDeleter<git_buf, git_buf_dispose>>;

void InitLibgit2Once() {
  static std::once_flag once;
  // Never shut down: the process keeps using libgit2 until it exits.
  std::call_once(once, [] { git_libgit2_init(); });
}

// The message of the last libgit2 error on this thread.
std::string GitError(int code) {
  const git_error* e = git_error_last();
  std::string message = (e != nullptr && e->message != nullptr) ? e->message : "unknown error";
  return message + " (libgit2 error " + std::to_string(code) + ")";
}

bool IsHexSha(std::string_view s) {
  if (s.size() != GIT_OID_HEXSZ) return false;
  for (const char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
  }
  return true;
}

std::string OidHex(const git_oid* oid) {
  char buffer[GIT_OID_HEXSZ + 1];
  git_oid_tostr(buffer, sizeof(buffer), oid);
  return buffer;
}

// The clone's "origin", without insteadOf rewriting (see the fetch in Checkout).
int CreateOriginRemote(git_remote** out, git_repository* repo, const char* name, const char* url,
                       void* /*payload*/) {
  git_remote_create_options options = GIT_REMOTE_CREATE_OPTIONS_INIT;
  options.repository = repo;
  options.name = name;
  options.flags = GIT_REMOTE_CREATE_SKIP_INSTEADOF;
  return git_remote_create_with_opts(out, url, &options);
}

// The paths that differ from HEAD in the index or the working tree, untracked included and
// ignored ones not, sorted and unique. Errors: INTERNAL naming `what`.
Result<std::vector<std::string>> ChangedPaths(git_repository* repo, const std::string& what) {
  git_status_options options = GIT_STATUS_OPTIONS_INIT;
  options.show = GIT_STATUS_SHOW_INDEX_AND_WORKDIR;
  options.flags = GIT_STATUS_OPT_INCLUDE_UNTRACKED | GIT_STATUS_OPT_RECURSE_UNTRACKED_DIRS;
  git_status_list* raw_status = nullptr;
  const int rc = git_status_list_new(&raw_status, repo, &options);
  if (rc != 0) return Status::Internal(what + ": cannot read the status: " + GitError(rc));
  StatusListPtr status(raw_status);
  std::vector<std::string> changed;
  for (size_t i = 0; i < git_status_list_entrycount(status.get()); ++i) {
    const git_status_entry* e = git_status_byindex(status.get(), i);
    const git_diff_delta* delta =
        e->index_to_workdir != nullptr ? e->index_to_workdir : e->head_to_index;
    if (delta == nullptr) continue;
    const char* file = delta->new_file.path != nullptr ? delta->new_file.path : delta->old_file.path;
    changed.emplace_back(file != nullptr ? file : "?");
  }
  std::sort(changed.begin(), changed.end());
  changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
  return changed;
}

}  // namespace

std::string RepoKey(std::string_view url) { return Sha256Hex(url).substr(0, 16); }

GitCheckout::GitCheckout(std::filesystem::path root) : root_(std::move(root)) {
  InitLibgit2Once();
}

Result<CheckoutResult> GitCheckout::Checkout(std::string_view url_view, std::string_view commit_view) {
  const std::string url(url_view);
  const std::string commit(commit_view);
  const std::string what = "repository " + url + " at commit " + commit;
  if (!IsHexSha(commit)) {
    return Status::InvalidArgument(what + ": the commit is not a 40-hex SHA");
  }
  git_oid oid;
  if (git_oid_fromstr(&oid, commit.c_str()) != 0) {
    return Status::InvalidArgument(what + ": the commit is not a 40-hex SHA");
  }

  const std::filesystem::path path = root_ / RepoKey(url);
  std::error_code ec;
  std::filesystem::create_directories(root_, ec);
  if (ec) return Status::Internal(what + ": cannot create " + root_.string() + ": " + ec.message());

  // Open the existing clone and fetch, or clone afresh (a clone that will not open, e.g. one
  // interrupted half-way, is removed first).
  git_repository* raw_repo = nullptr;
  RepoPtr repo;
  if (std::filesystem::exists(path / ".git", ec) &&
      git_repository_open(&raw_repo, path.c_str()) == 0) {
    repo.reset(raw_repo);
    // An in-memory remote for the URL asked for, so a stale or edited "origin" cannot redirect
    // the fetch; insteadOf rewriting is skipped (it also leaks in libgit2 1.5's pcre2 matcher).
    git_remote_create_options remote_options = GIT_REMOTE_CREATE_OPTIONS_INIT;
    remote_options.repository = repo.get();
    remote_options.flags = GIT_REMOTE_CREATE_SKIP_INSTEADOF | GIT_REMOTE_CREATE_SKIP_DEFAULT_FETCHSPEC;
    git_remote* raw_remote = nullptr;
    int rc = git_remote_create_with_opts(&raw_remote, url.c_str(), &remote_options);
    if (rc != 0) return Status::Unavailable(what + ": bad remote URL: " + GitError(rc));
    RemotePtr remote(raw_remote);
    char* refspec = const_cast<char*>(kFetchRefspec);
    const git_strarray refspecs = {&refspec, 1};
    git_fetch_options fetch_options = GIT_FETCH_OPTIONS_INIT;
    rc = git_remote_fetch(remote.get(), &refspecs, &fetch_options, "gatehouse-agent fetch");
    if (rc != 0) {
      const std::string error = GitError(rc);
      git_object* present = nullptr;
      if (git_object_lookup(&present, repo.get(), &oid, GIT_OBJECT_COMMIT) != 0) {
        return Status::Unavailable(what + ": fetch failed: " + error);
      }
      git_object_free(present);
      // Commits are immutable: the one we need is already here.
      spdlog::warn("fetch of {} failed ({}); commit {} is already in the clone", url, error, commit);
    }
  } else {
    std::filesystem::remove_all(path, ec);
    git_clone_options clone_options = GIT_CLONE_OPTIONS_INIT;
    clone_options.checkout_opts.checkout_strategy = GIT_CHECKOUT_NONE;
    clone_options.remote_cb = &CreateOriginRemote;
    const int rc = git_clone(&raw_repo, url.c_str(), path.c_str(), &clone_options);
    if (rc != 0) {
      const std::string error = GitError(rc);
      std::filesystem::remove_all(path, ec);
      return Status::Unavailable(what + ": clone failed: " + error);
    }
    repo.reset(raw_repo);
  }

  git_commit* raw_commit = nullptr;
  int rc = git_commit_lookup(&raw_commit, repo.get(), &oid);
  if (rc == GIT_ENOTFOUND) {
    return Status::NotFound("commit " + commit + " not found in repository " + url);
  }
  if (rc != 0) return Status::NotFound(what + ": cannot read the commit: " + GitError(rc));
  CommitPtr target(raw_commit);

  git_checkout_options checkout_options = GIT_CHECKOUT_OPTIONS_INIT;
  checkout_options.checkout_strategy =
      GIT_CHECKOUT_FORCE | GIT_CHECKOUT_REMOVE_UNTRACKED | GIT_CHECKOUT_REMOVE_IGNORED;
  rc = git_checkout_tree(repo.get(), reinterpret_cast<const git_object*>(target.get()),
                         &checkout_options);
  if (rc != 0) return Status::Internal(what + ": checkout failed: " + GitError(rc));
  rc = git_repository_set_head_detached(repo.get(), &oid);
  if (rc != 0) return Status::Internal(what + ": cannot detach HEAD: " + GitError(rc));

  // Verify what the worker will see, rather than trusting the steps above.
  git_reference* raw_head = nullptr;
  rc = git_repository_head(&raw_head, repo.get());
  if (rc != 0) return Status::FailedPrecondition(what + ": cannot read HEAD: " + GitError(rc));
  ReferencePtr head(raw_head);
  const git_oid* head_oid = git_reference_target(head.get());
  if (head_oid == nullptr || git_oid_equal(head_oid, &oid) == 0) {
    return Status::FailedPrecondition(what + ": HEAD is " +
                                      (head_oid ? OidHex(head_oid) : std::string("symbolic")) +
                                      " after checkout");
  }

  GH_ASSIGN_OR_RETURN(const std::vector<std::string> dirty, ChangedPaths(repo.get(), what));
  if (!dirty.empty()) {
    return Status::FailedPrecondition(what + ": the tree is not clean after checkout (" +
                                      std::to_string(dirty.size()) + " entries, e.g. " +
                                      dirty.front() + ")");
  }

  CheckoutResult result;
  result.head = OidHex(head_oid);
  result.clean = true;
  result.path = std::filesystem::absolute(path);
  return result;
}

Result<WorkingTree> InspectWorkingTree(const std::filesystem::path& path) {
  InitLibgit2Once();
  const std::string what = "working tree " + path.string();
  git_buf root = GIT_BUF_INIT;
  int rc = git_repository_discover(&root, path.c_str(), /*across_fs=*/0, nullptr);
  BufPtr root_owner(&root);
  if (rc != 0) return Status::NotFound(what + ": not in a git repository: " + GitError(rc));
  git_repository* raw_repo = nullptr;
  rc = git_repository_open(&raw_repo, root.ptr);
  if (rc != 0) return Status::Internal(what + ": cannot open it: " + GitError(rc));
  RepoPtr repo(raw_repo);
  if (git_repository_is_bare(repo.get()) != 0) {
    return Status::FailedPrecondition(what + ": a bare repository has no working tree");
  }
  WorkingTree tree;
  // libgit2's workdir ends in '/': its parent_path() is the directory itself.
  tree.checkout.path =
      std::filesystem::absolute(std::filesystem::path(git_repository_workdir(repo.get())))
          .parent_path();
  git_reference* raw_head = nullptr;
  rc = git_repository_head(&raw_head, repo.get());
  if (rc != 0) {
    return Status::FailedPrecondition(what + ": HEAD names no commit (commit first): " +
                                      GitError(rc));
  }
  ReferencePtr head(raw_head);
  git_object* peeled = nullptr;
  rc = git_reference_peel(&peeled, head.get(), GIT_OBJECT_COMMIT);
  if (rc != 0) return Status::Internal(what + ": cannot read HEAD's commit: " + GitError(rc));
  tree.checkout.head = OidHex(git_object_id(peeled));
  git_object_free(peeled);
  if (git_reference_is_branch(head.get()) != 0) {
    const char* name = nullptr;
    if (git_branch_name(&name, head.get()) == 0 && name != nullptr) tree.branch = name;
  }
  git_remote* raw_origin = nullptr;
  if (git_remote_lookup(&raw_origin, repo.get(), "origin") == 0) {
    RemotePtr origin(raw_origin);
    if (const char* url = git_remote_url(origin.get()); url != nullptr) tree.origin_url = url;
  }
  GH_ASSIGN_OR_RETURN(tree.changed, ChangedPaths(repo.get(), what));
  tree.checkout.clean = tree.changed.empty();
  return tree;
}

}  // namespace gatehouse::agent
