// Verifies the libgit2 mirror against real repositories made with the git CLI: branches and
// commits resolve, moved and deleted branches are seen, unknown names are reported by name.
#include "controller/git_mirror.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>

#include "common/sha256.h"
#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

using testing::TempDir;
using testing::WriteFile;

// Runs a shell command and returns its standard output without the trailing newline.
std::string Sh(const std::string& cmd) {
  std::string out;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  std::array<char, 256> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) out += buf.data();
  EXPECT_EQ(::pclose(pipe), 0) << cmd;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class GitMirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_ = (dir_.path() / "adapt").string();
    Git("init -q -b main " + repo_);
    Commit("first");
  }

  void Git(const std::string& args) {
    Sh("git -c user.email=t@example.com -c user.name=test -c init.defaultBranch=main " + args);
  }
  std::string Commit(const std::string& message) {
    Git("-C " + repo_ + " commit -q --allow-empty -m " + message);
    return Sh("git -C " + repo_ + " rev-parse HEAD");
  }

  TempDir dir_;
  std::string repo_;
  GitMirror mirror_{dir_.path() / "mirrors"};
};

TEST_F(GitMirrorTest, ResolvesABranchAndFollowsItWhenItMoves) {
  // Verifies a branch resolves to its commit (mirror named by URL hash) and follows new commits.
  const std::string first = Sh("git -C " + repo_ + " rev-parse HEAD");
  auto sha = mirror_.ResolveBranch(repo_, "main");
  ASSERT_TRUE(sha.ok()) << sha.status().ToString();
  EXPECT_EQ(*sha, first);
  EXPECT_TRUE(std::filesystem::is_directory(dir_.path() / "mirrors" / (Sha256Hex(repo_) + ".git")));

  const std::string second = Commit("second");
  EXPECT_EQ(*mirror_.ResolveBranch(repo_, "main"), second);
}

TEST_F(GitMirrorTest, LearnsTheDefaultBranchFromTheRemotesHead) {
  // Verifies DefaultBranch: the branch the repository's HEAD points to, learned when a branch
  // is resolved, asked of the repository when not seen yet (a fresh mirror object), followed
  // when HEAD moves, and NOT_FOUND for a repository that cannot be reached.
  Git("-C " + repo_ + " branch trunk");
  Git("-C " + repo_ + " symbolic-ref HEAD refs/heads/trunk");
  ASSERT_TRUE(mirror_.ResolveBranch(repo_, "main").ok());
  auto seen = mirror_.DefaultBranch(repo_);
  ASSERT_TRUE(seen.ok()) << seen.status().ToString();
  EXPECT_EQ(*seen, "trunk");

  GitMirror fresh(dir_.path() / "mirrors");
  auto asked = fresh.DefaultBranch(repo_);
  ASSERT_TRUE(asked.ok()) << asked.status().ToString();
  EXPECT_EQ(*asked, "trunk");

  Git("-C " + repo_ + " symbolic-ref HEAD refs/heads/main");
  ASSERT_TRUE(mirror_.ResolveBranch(repo_, "trunk").ok());
  EXPECT_EQ(*mirror_.DefaultBranch(repo_), "main");

  EXPECT_EQ(mirror_.DefaultBranch((dir_.path() / "absent").string()).status().code(),
            StatusCode::kNotFound);
}

TEST_F(GitMirrorTest, ResolvesAFileUrl) {
  // Verifies file:// URLs resolve like local paths.
  auto sha = mirror_.ResolveBranch("file://" + repo_, "main");
  ASSERT_TRUE(sha.ok()) << sha.status().ToString();
  EXPECT_EQ(*sha, Sh("git -C " + repo_ + " rev-parse HEAD"));
}

TEST_F(GitMirrorTest, UnknownOrDeletedBranchIsNotFoundByName) {
  // Verifies unknown or deleted branches are NOT_FOUND by name; malformed names INVALID_ARGUMENT.
  auto missing = mirror_.ResolveBranch(repo_, "no-such-branch");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "branch 'no-such-branch' not found in '" + repo_ + "'");

  Git("-C " + repo_ + " branch dev");
  ASSERT_TRUE(mirror_.ResolveBranch(repo_, "dev").ok());
  Git("-C " + repo_ + " branch -q -D dev");
  // The mirror still holds refs/heads/dev, but the repository no longer does.
  EXPECT_EQ(mirror_.ResolveBranch(repo_, "dev").status().code(), StatusCode::kNotFound);

  EXPECT_EQ(mirror_.ResolveBranch(repo_, "bad..name").status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(GitMirrorTest, UnknownRepositoryIsNotFoundByName) {
  // Verifies unreachable repositories are NOT_FOUND naming the URL, leaving no empty mirror.
  const std::string nowhere = (dir_.path() / "nowhere").string();
  auto r = mirror_.ResolveBranch(nowhere, "main");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message().rfind("repository '" + nowhere + "': ", 0), 0u)
      << r.status().message();
  // A directory that is not a git repository: libgit2's own message.
  std::filesystem::create_directories(dir_.path() / "plain");
  r = mirror_.ResolveBranch((dir_.path() / "plain").string(), "main");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("repository '" + (dir_.path() / "plain").string() + "'"),
            std::string::npos);
  // No empty mirror is left behind for them.
  EXPECT_FALSE(std::filesystem::exists(mirror_.MirrorPath(nowhere)));
}

TEST_F(GitMirrorTest, ResolvesAnExistingCommitAndRejectsAnUnknownOne) {
  // Verifies a commit on any branch resolves after fetching all heads; an unknown one is named.
  Git("-C " + repo_ + " checkout -q -b feature");
  const std::string feature = Commit("feature-work");
  Git("-C " + repo_ + " checkout -q main");
  auto sha = mirror_.ResolveCommit(repo_, feature);
  ASSERT_TRUE(sha.ok()) << sha.status().ToString();
  EXPECT_EQ(*sha, feature);

  const std::string unknown(40, 'e');
  auto r = mirror_.ResolveCommit(repo_, unknown);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "commit '" + unknown + "' not found in '" + repo_ + "'");
}

TEST_F(GitMirrorTest, AKnownCommitResolvesWithoutAFetchANewOneIsFetched) {
  const std::string first = Commit("first");
  ASSERT_TRUE(mirror_.ResolveCommit(repo_, first).ok());
  // A commit made after the mirror's last fetch is fetched on demand.
  const std::string second = Commit("second");
  auto fetched = mirror_.ResolveCommit(repo_, second);
  ASSERT_TRUE(fetched.ok()) << fetched.status().ToString();
  // With the repository gone, a commit the mirror holds still resolves (no network needed);
  // anything else needs the repository and says it cannot be reached.
  std::filesystem::rename(repo_, repo_ + ".moved");
  auto known = mirror_.ResolveCommit(repo_, first);
  ASSERT_TRUE(known.ok()) << known.status().ToString();
  EXPECT_EQ(*known, first);
  EXPECT_EQ(mirror_.ResolveCommit(repo_, std::string(40, 'e')).status().code(),
            StatusCode::kNotFound);
  std::filesystem::rename(repo_ + ".moved", repo_);
}

// Verifies a (repository, commit) pair resolved once is answered from memory: with the mirror
// deleted and the repository moved away it still resolves, where a fresh GitMirror over the
// same directory has to reach the repository and cannot.
TEST_F(GitMirrorTest, AResolvedCommitIsRememberedWithoutOpeningTheMirror) {
  const std::string first = Commit("first");
  ASSERT_TRUE(mirror_.ResolveCommit(repo_, first).ok());
  std::filesystem::remove_all(mirror_.MirrorPath(repo_));
  std::filesystem::rename(repo_, repo_ + ".moved");
  auto remembered = mirror_.ResolveCommit(repo_, first);
  ASSERT_TRUE(remembered.ok()) << remembered.status().ToString();
  EXPECT_EQ(*remembered, first);
  GitMirror fresh(dir_.path() / "mirrors");
  EXPECT_EQ(fresh.ResolveCommit(repo_, first).status().code(), StatusCode::kNotFound);
  std::filesystem::rename(repo_ + ".moved", repo_);
}

TEST_F(GitMirrorTest, ReadsAFileAtACommitFromTheMirror) {
  // Verifies a file is read from the commit's tree (not the branch's newer one), a path the
  // tree lacks or that names a directory is no file, a commit the mirror lacks is NOT_FOUND,
  // and a read is remembered (answered after the mirror is gone).
  std::filesystem::create_directories(std::filesystem::path(repo_) / "sub");
  WriteFile(std::filesystem::path(repo_) / "sub" / "recipe.json", "version one\n");
  Git("-C " + repo_ + " add sub/recipe.json");
  const std::string first = Commit("with-file");
  WriteFile(std::filesystem::path(repo_) / "sub" / "recipe.json", "version two\n");
  Git("-C " + repo_ + " commit -q -am second");
  ASSERT_TRUE(mirror_.ResolveBranch(repo_, "main").ok());
  auto text = mirror_.ReadFileAt(repo_, first, "sub/recipe.json");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  ASSERT_TRUE(text->has_value());
  EXPECT_EQ(**text, "version one\n");
  auto absent = mirror_.ReadFileAt(repo_, first, "gatehouse.recipe.json");
  ASSERT_TRUE(absent.ok()) << absent.status().ToString();
  EXPECT_FALSE(absent->has_value());
  auto directory = mirror_.ReadFileAt(repo_, first, "sub");
  ASSERT_TRUE(directory.ok()) << directory.status().ToString();
  EXPECT_FALSE(directory->has_value());
  EXPECT_EQ(mirror_.ReadFileAt(repo_, std::string(40, 'e'), "sub/recipe.json").status().code(),
            StatusCode::kNotFound);
  std::filesystem::remove_all(mirror_.MirrorPath(repo_));
  auto remembered = mirror_.ReadFileAt(repo_, first, "sub/recipe.json");
  ASSERT_TRUE(remembered.ok() && remembered->has_value());
  EXPECT_EQ(**remembered, "version one\n");
}

}  // namespace
}  // namespace gatehouse::controller
