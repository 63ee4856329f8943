// Tests of GitCheckout (libgit2) against temporary repositories made with the git CLI.
#include "agent/checkout.h"

#include <gtest/gtest.h>

#include "agent_test_util.h"

namespace gatehouse::agent {
namespace {

using testing::CommitFiles;
using testing::Git;
using testing::GitInit;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

class CheckoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    origin_ = tmp_.path() / "origin";
    GitInit(origin_);
    first_ = CommitFiles(origin_, {{"model.txt", "v1\n"}, {".gitignore", "scratch/\n"}}, "first");
    second_ = CommitFiles(origin_, {{"model.txt", "v2\n"}, {"extra.txt", "x\n"}}, "second");
  }

  TempDir tmp_;
  std::filesystem::path origin_;
  std::string first_;
  std::string second_;
};

// Verifies that the exact (non-tip) SHA is checked out detached, HEAD verified and tree clean.
TEST_F(CheckoutTest, ChecksOutExactShaClean) {
  GitCheckout git(tmp_.path() / "repos");
  auto result = git.Checkout(origin_.string(), first_);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->head, first_);
  EXPECT_TRUE(result->clean);
  EXPECT_EQ(result->path, tmp_.path() / "repos" / RepoKey(origin_.string()));
  EXPECT_EQ(ReadFile(result->path / "model.txt"), "v1\n");
  EXPECT_FALSE(std::filesystem::exists(result->path / "extra.txt"));
  // The git CLI agrees: detached at the commit, nothing to report.
  EXPECT_EQ(Git(result->path, {"rev-parse", "HEAD"}), first_);
  EXPECT_EQ(Git(result->path, {"status", "--porcelain", "--untracked-files=all"}), "");
}

// Verifies that a commit made later on another branch is fetched into the same clone.
TEST_F(CheckoutTest, FetchesCommitOfAnotherBranchIntoSameClone) {
  GitCheckout git(tmp_.path() / "repos");
  auto before = git.Checkout(origin_.string(), second_);
  ASSERT_TRUE(before.ok()) << before.status().ToString();

  Git(origin_, {"checkout", "-q", "-b", "feature", first_});
  const std::string feature = CommitFiles(origin_, {{"feature.txt", "f\n"}}, "feature work");

  auto after = git.Checkout(origin_.string(), feature);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->path, before->path);
  EXPECT_EQ(after->head, feature);
  EXPECT_TRUE(after->clean);
  EXPECT_EQ(ReadFile(after->path / "feature.txt"), "f\n");
  EXPECT_EQ(ReadFile(after->path / "model.txt"), "v1\n");
  EXPECT_FALSE(std::filesystem::exists(after->path / "extra.txt"));  // from second_, removed
}

// Verifies that a SHA the repository does not have is an error that names it.
TEST_F(CheckoutTest, UnknownShaIsErrorNamingIt) {
  GitCheckout git(tmp_.path() / "repos");
  const std::string unknown = "0123456789abcdef0123456789abcdef01234567";
  auto result = git.Checkout(origin_.string(), unknown);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kNotFound);
  EXPECT_NE(result.status().message().find(unknown), std::string::npos)
      << result.status().message();
  EXPECT_NE(result.status().message().find(origin_.string()), std::string::npos);
}

// Verifies that something that is not a 40-hex SHA (a branch name) is refused up front.
TEST_F(CheckoutTest, NonShaCommitIsInvalid) {
  GitCheckout git(tmp_.path() / "repos");
  auto result = git.Checkout(origin_.string(), "main");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("main"), std::string::npos);
}

// Verifies that a repository that cannot be cloned is an error naming its URL.
TEST_F(CheckoutTest, UnreachableRepositoryIsUnavailable) {
  GitCheckout git(tmp_.path() / "repos");
  const std::string missing = (tmp_.path() / "no-such-repo").string();
  auto result = git.Checkout(missing, first_);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(result.status().message().find(missing), std::string::npos);
}

// Verifies that edits, untracked and ignored files left in the clone by an earlier attempt are
// wiped, so the next checkout of the same commit is clean.
TEST_F(CheckoutTest, DirtyCloneIsCleaned) {
  GitCheckout git(tmp_.path() / "repos");
  auto first = git.Checkout(origin_.string(), first_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  WriteFile(first->path / "model.txt", "edited by a previous attempt\n");
  WriteFile(first->path / "untracked.txt", "left over\n");
  WriteFile(first->path / "nested" / "deep.txt", "left over\n");
  WriteFile(first->path / "scratch" / "ignored.bin", "ignored\n");

  auto again = git.Checkout(origin_.string(), first_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->clean);
  EXPECT_EQ(ReadFile(again->path / "model.txt"), "v1\n");
  EXPECT_FALSE(std::filesystem::exists(again->path / "untracked.txt"));
  EXPECT_FALSE(std::filesystem::exists(again->path / "nested" / "deep.txt"));
  EXPECT_FALSE(std::filesystem::exists(again->path / "scratch" / "ignored.bin"));
  EXPECT_EQ(Git(again->path, {"status", "--porcelain", "--ignored", "--untracked-files=all"}), "");
}

// Verifies that a half-made clone (a directory that is not a repository) is replaced.
TEST_F(CheckoutTest, BrokenCloneDirectoryIsRecloned) {
  const auto clone = tmp_.path() / "repos" / RepoKey(origin_.string());
  WriteFile(clone / "junk.txt", "not a repository\n");
  GitCheckout git(tmp_.path() / "repos");
  auto result = git.Checkout(origin_.string(), second_);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->head, second_);
  EXPECT_FALSE(std::filesystem::exists(clone / "junk.txt"));
}

}  // namespace
}  // namespace gatehouse::agent
