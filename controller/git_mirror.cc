#include "controller/git_mirror.h"

#include <git2.h>

#include <optional>
#include <string_view>
#include <vector>

#include "common/sha256.h"

namespace gatehouse::controller {
namespace {

namespace fs = std::filesystem;

std::string LastGitError() {
  const git_error* e = git_error_last();
  return e && e->message ? e->message : "unknown libgit2 error";
}

// RAII for libgit2 handles: each freed by its own git_*_free.
template <typename T, void (*Free)(T*)>
struct GitFree {
  void operator()(T* p) const { Free(p); }
};
using RepoPtr = std::unique_ptr<git_repository, GitFree<git_repository, git_repository_free>>;
using RemotePtr = std::unique_ptr<git_remote, GitFree<git_remote, git_remote_free>>;
using CommitPtr = std::unique_ptr<git_commit, GitFree<git_commit, git_commit_free>>;
using TreePtr = std::unique_ptr<git_tree, GitFree<git_tree, git_tree_free>>;
using TreeEntryPtr = std::unique_ptr<git_tree_entry, GitFree<git_tree_entry, git_tree_entry_free>>;
using BlobPtr = std::unique_ptr<git_blob, GitFree<git_blob, git_blob_free>>;

std::string OidHex(const git_oid& oid) {
  char buf[GIT_OID_HEXSZ + 1];
  git_oid_tostr(buf, sizeof(buf), &oid);
  return buf;
}

Status RepositoryError(const std::string& url) {
  return Status::NotFound("repository '" + url + "': " + LastGitError());
}

// Opens the bare mirror at `path`, creating it if absent. `created` tells which.
Result<RepoPtr> OpenOrInitMirror(const fs::path& path, bool& created) {
  git_repository* raw = nullptr;
  created = false;
  std::error_code ec;
  if (fs::exists(path / "HEAD", ec)) {
    if (git_repository_open_bare(&raw, path.c_str()) != 0) {
      return Status::Internal("cannot open mirror '" + path.string() + "': " + LastGitError());
    }
    return RepoPtr(raw);
  }
  fs::create_directories(path.parent_path(), ec);
  if (git_repository_init(&raw, path.c_str(), /*is_bare=*/1) != 0) {
    return Status::Internal("cannot create mirror '" + path.string() + "': " + LastGitError());
  }
  created = true;
  return RepoPtr(raw);
}

// Connects an anonymous remote for `url` in `repo` for fetching.
Result<RemotePtr> Connect(git_repository* repo, const std::string& url) {
  std::error_code ec;
  if (!url.empty() && url.front() == '/' && !fs::exists(url, ec)) {
    // libgit2 says "unsupported URL protocol" here, which hides the real problem.
    return Status::NotFound("repository '" + url + "': no such file or directory");
  }
  git_remote* raw = nullptr;
  if (git_remote_create_anonymous(&raw, repo, url.c_str()) != 0) return RepositoryError(url);
  RemotePtr remote(raw);
  git_remote_callbacks callbacks = GIT_REMOTE_CALLBACKS_INIT;
  if (git_remote_connect(remote.get(), GIT_DIRECTION_FETCH, &callbacks, nullptr, nullptr) != 0) {
    return RepositoryError(url);
  }
  return remote;
}

// Connect, and when that fails on a mirror this call just made (`created`), the mirror is
// removed: no empty mirror of an unreachable repository is kept.
Result<RemotePtr> ConnectOrDiscard(RepoPtr& repo, bool created, const fs::path& path,
                                   const std::string& url) {
  Result<RemotePtr> remote = Connect(repo.get(), url);
  if (!remote.ok() && created) {
    repo.reset();
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  return remote;
}

Status Fetch(git_remote* remote, const std::string& url, const std::string& refspec) {
  std::vector<char> spec(refspec.begin(), refspec.end());
  spec.push_back('\0');
  char* specs[] = {spec.data()};
  git_strarray refspecs = {specs, 1};
  git_fetch_options opts = GIT_FETCH_OPTIONS_INIT;
  opts.download_tags = GIT_REMOTE_DOWNLOAD_TAGS_NONE;
  opts.update_fetchhead = 0;
  if (git_remote_fetch(remote, &refspecs, &opts, "gatehouse fetch") != 0) {
    return Status::Unavailable("fetch '" + refspec + "' from '" + url + "': " + LastGitError());
  }
  return Status::Ok();
}

// The branch the connected remote's HEAD points to, without "refs/heads/"; nullopt when it
// names none (an empty repository, a detached HEAD).
std::optional<std::string> RemoteDefaultBranch(git_remote* remote) {
  git_buf buf = GIT_BUF_INIT;
  if (git_remote_default_branch(&buf, remote) != 0) {
    git_buf_dispose(&buf);
    return std::nullopt;
  }
  std::string ref(buf.ptr, buf.size);
  git_buf_dispose(&buf);
  constexpr std::string_view kHeads = "refs/heads/";
  if (ref.rfind(kHeads, 0) != 0 || ref.size() == kHeads.size()) return std::nullopt;
  return ref.substr(kHeads.size());
}

Status CheckCommitExists(git_repository* repo, const git_oid& oid, const std::string& what) {
  git_commit* raw = nullptr;
  if (git_commit_lookup(&raw, repo, &oid) != 0) return Status::NotFound(what);
  CommitPtr commit(raw);
  return Status::Ok();
}

}  // namespace

GitMirror::GitMirror(fs::path mirror_dir) : mirror_dir_(std::move(mirror_dir)) {
  static std::once_flag init_once;
  std::call_once(init_once, [] { git_libgit2_init(); });
}

fs::path GitMirror::MirrorPath(const std::string& repository) const {
  return mirror_dir_ / (Sha256Hex(repository) + ".git");
}

std::mutex& GitMirror::MirrorMutex(const std::string& repository) {
  std::lock_guard lock(mu_);
  auto& slot = locks_[repository];
  if (!slot) slot = std::make_unique<std::mutex>();
  return *slot;
}

Result<std::string> GitMirror::ResolveBranch(const std::string& repository,
                                             const std::string& branch) {
  const std::string ref = "refs/heads/" + branch;
  int valid = 0;
  if (git_reference_name_is_valid(&valid, ref.c_str()) != 0 || !valid) {
    return Status::InvalidArgument("field 'branch': invalid branch name '" + branch + "'");
  }
  std::lock_guard lock(MirrorMutex(repository));
  const fs::path path = MirrorPath(repository);
  bool created = false;
  GH_ASSIGN_OR_RETURN(RepoPtr repo, OpenOrInitMirror(path, created));
  Result<RemotePtr> remote = ConnectOrDiscard(repo, created, path, repository);
  if (!remote.ok()) return remote.status();
  // Look the branch up in the remote's advertisement, so a deleted branch is not served from
  // a stale mirror ref.
  const git_remote_head** heads = nullptr;
  size_t count = 0;
  if (git_remote_ls(&heads, &count, remote->get()) != 0) return RepositoryError(repository);
  const git_remote_head* head = nullptr;
  for (size_t i = 0; i < count; ++i) {
    if (ref == heads[i]->name) head = heads[i];
  }
  if (head == nullptr) {
    return Status::NotFound("branch '" + branch + "' not found in '" + repository + "'");
  }
  const git_oid oid = head->oid;
  RememberDefaultBranch(repository, remote->get());
  GH_RETURN_IF_ERROR(Fetch(remote->get(), repository, "+" + ref + ":" + ref));
  GH_RETURN_IF_ERROR(CheckCommitExists(
      repo.get(), oid,
      "branch '" + branch + "' of '" + repository + "' does not point at a commit"));
  return OidHex(oid);
}

Result<std::string> GitMirror::ResolveCommit(const std::string& repository,
                                             const std::string& commit) {
  git_oid oid;
  if (commit.size() != GIT_OID_HEXSZ || git_oid_fromstr(&oid, commit.c_str()) != 0) {
    return Status::InvalidArgument("field 'commit': expected a 40-hex commit SHA, got '" + commit +
                                   "'");
  }
  const std::string sha = OidHex(oid);
  {
    std::lock_guard lock(mu_);
    if (known_.count({repository, sha}) > 0) return sha;
  }
  auto remember = [&] {
    std::lock_guard lock(mu_);
    if (known_.size() >= kKnownCommits) known_.clear();
    known_.emplace(repository, sha);
    return sha;
  };
  std::lock_guard lock(MirrorMutex(repository));
  const fs::path path = MirrorPath(repository);
  bool created = false;
  GH_ASSIGN_OR_RETURN(RepoPtr repo, OpenOrInitMirror(path, created));
  // A commit the mirror already holds needs no fetch: commits are immutable (CI submits by
  // SHA many times; the agent still checks it out from the repository itself).
  if (!created && CheckCommitExists(repo.get(), oid, "").ok()) return remember();
  Result<RemotePtr> remote = ConnectOrDiscard(repo, created, path, repository);
  if (!remote.ok()) return remote.status();
  RememberDefaultBranch(repository, remote->get());
  GH_RETURN_IF_ERROR(Fetch(remote->get(), repository, "+refs/heads/*:refs/heads/*"));
  GH_RETURN_IF_ERROR(CheckCommitExists(
      repo.get(), oid, "commit '" + commit + "' not found in '" + repository + "'"));
  return remember();
}

void GitMirror::RememberDefaultBranch(const std::string& repository, git_remote* remote) {
  std::optional<std::string> branch = RemoteDefaultBranch(remote);
  std::lock_guard lock(mu_);
  default_branches_[repository] = branch.value_or("");
}

Result<std::string> GitMirror::DefaultBranch(const std::string& repository) {
  const std::string none = "repository '" + repository + "' names no default branch (its HEAD)";
  auto known = [&]() -> std::optional<Result<std::string>> {
    std::lock_guard lock(mu_);
    auto it = default_branches_.find(repository);
    if (it == default_branches_.end()) return std::nullopt;
    if (it->second.empty()) return Result<std::string>(Status::NotFound(none));
    return Result<std::string>(it->second);
  };
  if (auto answer = known()) return *answer;
  {
    // Not seen since this process started (a commit the mirror held needed no fetch): ask the
    // remote once, without fetching. A failure is remembered as "none" until the next
    // ResolveBranch or fetching ResolveCommit, so a gone remote does not slow every submit.
    std::lock_guard lock(MirrorMutex(repository));
    const fs::path path = MirrorPath(repository);
    bool created = false;
    GH_ASSIGN_OR_RETURN(RepoPtr repo, OpenOrInitMirror(path, created));
    Result<RemotePtr> remote = ConnectOrDiscard(repo, created, path, repository);
    if (!remote.ok()) {
      std::lock_guard lock_known(mu_);
      default_branches_[repository] = "";
      return remote.status();
    }
    RememberDefaultBranch(repository, remote->get());
  }
  return known().value_or(Status::NotFound(none));
}

Result<std::optional<std::string>> GitMirror::ReadFileAt(const std::string& repository,
                                                         const std::string& commit,
                                                         const std::string& path) {
  const auto key = std::make_tuple(repository, commit, path);
  {
    std::lock_guard lock(mu_);
    if (auto it = files_.find(key); it != files_.end()) return it->second;
  }
  git_oid oid;
  if (commit.size() != GIT_OID_HEXSZ || git_oid_fromstr(&oid, commit.c_str()) != 0) {
    return Status::InvalidArgument("commit '" + commit + "' is not a 40-hex SHA");
  }
  std::optional<std::string> bytes;
  {
    std::lock_guard lock(MirrorMutex(repository));
    const std::string missing = "commit '" + commit + "' not in the mirror of '" + repository + "'";
    std::error_code ec;
    if (!fs::exists(MirrorPath(repository) / "HEAD", ec)) return Status::NotFound(missing);
    bool created = false;
    GH_ASSIGN_OR_RETURN(RepoPtr repo, OpenOrInitMirror(MirrorPath(repository), created));
    git_commit* raw_commit = nullptr;
    if (git_commit_lookup(&raw_commit, repo.get(), &oid) != 0) return Status::NotFound(missing);
    CommitPtr c(raw_commit);
    git_tree* raw_tree = nullptr;
    if (git_commit_tree(&raw_tree, c.get()) != 0) {
      return Status::Internal("tree of " + commit + ": " + LastGitError());
    }
    TreePtr tree(raw_tree);
    git_tree_entry* raw_entry = nullptr;
    const int found = git_tree_entry_bypath(&raw_entry, tree.get(), path.c_str());
    if (found == GIT_ENOTFOUND) {
      bytes = std::nullopt;
    } else if (found != 0) {
      return Status::Internal(path + " at " + commit + ": " + LastGitError());
    } else {
      TreeEntryPtr entry(raw_entry);
      if (git_tree_entry_type(entry.get()) == GIT_OBJECT_BLOB) {
        git_blob* raw_blob = nullptr;
        if (git_blob_lookup(&raw_blob, repo.get(), git_tree_entry_id(entry.get())) != 0) {
          return Status::Internal(path + " at " + commit + ": " + LastGitError());
        }
        BlobPtr blob(raw_blob);
        const auto size = static_cast<size_t>(git_blob_rawsize(blob.get()));
        if (size > kMaxFileBytes) {
          return Status::Internal(path + " at " + commit + " is " + std::to_string(size) +
                                  " bytes, past " + std::to_string(kMaxFileBytes));
        }
        bytes = std::string(static_cast<const char*>(git_blob_rawcontent(blob.get())), size);
      }  // a directory or submodule of that name is no file
    }
  }
  std::lock_guard lock(mu_);
  if (files_.size() >= kKnownFiles) files_.clear();
  files_.emplace(key, bytes);
  return bytes;
}

}  // namespace gatehouse::controller
