// Verifies reading whole files and secret files: size limit, missing files, the trailing
// newline of a token file trimmed, an empty one refused.
#include "common/file_util.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/common/temp_dir.h"

namespace gatehouse {
namespace {

void Write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

TEST(FileUtilTest, ReadsWholeFilesWithinTheLimit) {
  test_util::TempDir dir;
  Write(dir.path() / "a", std::string("x\0y", 3));
  auto a = ReadFileToString(dir.path() / "a", "file");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, std::string("x\0y", 3));
  EXPECT_EQ(ReadFileToString(dir.path() / "a", "file", 2).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(ReadFileToString(dir.path() / "none", "file").status().code(), StatusCode::kNotFound);
}

TEST(FileUtilTest, SecretFilesLoseTrailingWhitespaceAndMayNotBeEmpty) {
  test_util::TempDir dir;
  Write(dir.path() / "token", "ghagent_abc\n");
  auto token = ReadSecretFile(dir.path() / "token", "--token-file");
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(*token, "ghagent_abc");
  Write(dir.path() / "empty", " \n");
  auto empty = ReadSecretFile(dir.path() / "empty", "--token-file");
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("--token-file"), std::string::npos);
}

}  // namespace
}  // namespace gatehouse
