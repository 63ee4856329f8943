// Verifies SHA-256 against the FIPS 180-2 test vector and that directory digests change with
// any file's name or contents and ignore the order files were written in.
#include "common/sha256.h"

#include <gtest/gtest.h>

#include <fstream>

namespace gatehouse {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << s;
}

TEST(Sha256Test, KnownVector) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, DirectoryDigestTracksNamesAndContents) {
  fs::path root = fs::temp_directory_path() / ("gh_digest_" + std::to_string(::getpid()));
  fs::remove_all(root);
  Write(root / "a" / "config.json", "{}");
  Write(root / "a" / "model.safetensors", "xyz");
  Write(root / "b" / "model.safetensors", "xyz");  // written in the other order
  Write(root / "b" / "config.json", "{}");
  auto a = DirectoryDigest(root / "a");
  auto b = DirectoryDigest(root / "b");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, *b);
  Write(root / "b" / "config.json", "{ }");
  EXPECT_NE(*a, *DirectoryDigest(root / "b"));
  fs::rename(root / "b" / "config.json", root / "b" / "config2.json");
  Write(root / "b" / "config2.json", "{}");
  EXPECT_NE(*a, *DirectoryDigest(root / "b"));
  EXPECT_EQ(DirectoryDigest(root / "missing").status().code(), StatusCode::kNotFound);
  fs::remove_all(root);
}

// A Hub cache snapshot: every file is a link into ../../blobs/<sha>. The digest must name the
// links (swapping which blob a name points to is another checkpoint), and equal the digest of
// the same files copied in.
TEST(Sha256Test, DirectoryDigestNamesSymlinkedFilesByTheirOwnNames) {
  fs::path root = fs::temp_directory_path() / ("gh_digest_links_" + std::to_string(::getpid()));
  fs::remove_all(root);
  Write(root / "blobs" / "1111", "{}");
  Write(root / "blobs" / "2222", "xyz");
  fs::create_directories(root / "snapshots" / "s1");
  fs::create_symlink("../../blobs/1111", root / "snapshots" / "s1" / "config.json");
  fs::create_symlink("../../blobs/2222", root / "snapshots" / "s1" / "model.safetensors");
  Write(root / "copy" / "config.json", "{}");
  Write(root / "copy" / "model.safetensors", "xyz");
  auto linked = DirectoryDigest(root / "snapshots" / "s1");
  ASSERT_TRUE(linked.ok()) << linked.status().ToString();
  EXPECT_EQ(*linked, *DirectoryDigest(root / "copy"));
  fs::create_directories(root / "snapshots" / "s2");  // the names swapped
  fs::create_symlink("../../blobs/2222", root / "snapshots" / "s2" / "config.json");
  fs::create_symlink("../../blobs/1111", root / "snapshots" / "s2" / "model.safetensors");
  EXPECT_NE(*linked, *DirectoryDigest(root / "snapshots" / "s2"));
  fs::remove_all(root);
}

}  // namespace
}  // namespace gatehouse
