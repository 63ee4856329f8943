// Verifies directory digests from per-file digests (controller/directory_digest.h) and the
// digest cache (controller/digest_cache.h): the digest equals common/sha256.h DirectoryDigest,
// a file is hashed once per content, a lookup answers pending while a background job hashes
// (progress, one job per directory), a job's error names the file, and the cache stops its
// thread mid-job when destroyed.
#include "controller/digest_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>

#include "common/sha256.h"
#include "controller/store/store.h"
#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::HashingGate;
using testing::TempDir;
using testing::WriteFile;

constexpr int64_t kMiB = int64_t{1} << 20;

// A cache that hashes everything in the background, 1 MiB at a time, held by `gate`.
DigestCache::Options GatedOptions(HashingGate& gate) {
  DigestCache::Options o;
  o.inline_bytes = 0;
  o.block_bytes = kMiB;
  o.before_block = [&gate](const fs::path&) { gate.Pass(); };
  return o;
}

TEST(DirectoryDigestTest, PerFileDigestsGiveDirectoryDigest) {
  // Verifies DirectoryDigestOf over ListDirectoryFiles + HashFile is byte for byte the digest
  // common/sha256.h DirectoryDigest computes: nested paths, sort order ('.' before '/',
  // upper case first), an empty file, non-ASCII names, a symlinked file under its own name,
  // a symlinked directory not entered.
  TempDir dir;
  WriteFile(dir.path() / "b.txt", "bee");
  WriteFile(dir.path() / "a" / "x.bin", std::string(3000, 'x'));
  WriteFile(dir.path() / "a.b", "dot");
  WriteFile(dir.path() / "A.txt", "upper");
  WriteFile(dir.path() / "empty", "");
  WriteFile(dir.path() / "\xc3\xa9t\xc3\xa9.json", "{}");
  fs::create_symlink(dir.path() / "b.txt", dir.path() / "link.txt");
  fs::create_directory_symlink(dir.path() / "a", dir.path() / "linkdir");
  testing::Backdate(dir.path());

  auto files = ListDirectoryFiles(dir.path());
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  std::vector<std::string> rels;
  std::vector<FileDigest> digests;
  for (const ListedFile& f : *files) {
    rels.push_back(f.rel);
    auto hex = HashFile(f.path, 7, nullptr);  // odd block size: blocks do not change the hash
    ASSERT_TRUE(hex.ok()) << hex.status().ToString();
    EXPECT_EQ(*hex, Sha256FileHex(f.path).value());
    digests.push_back({f.rel, f.stamp.size, *hex});
  }
  EXPECT_THAT(rels, ::testing::ElementsAre("A.txt", "a.b", "a/x.bin", "b.txt", "empty",
                                           "link.txt", "\xc3\xa9t\xc3\xa9.json"));
  const std::string want = DirectoryDigest(dir.path()).value();
  std::reverse(digests.begin(), digests.end());  // the order given does not matter
  EXPECT_EQ(DirectoryDigestOf(digests), want);

  DigestCache cache;
  EXPECT_EQ(cache.Digest(dir.path()).value(), want);
  auto lookup = cache.Lookup(dir.path().string() + "/");
  ASSERT_TRUE(lookup.ok()) << lookup.status().ToString();
  EXPECT_EQ(lookup->digest, want);
  EXPECT_EQ(cache.computations(), 7);  // a second spelling of the directory hashes nothing
}

TEST(DirectoryDigestTest, ErrorsNameTheDirectory) {
  TempDir dir;
  EXPECT_THAT(ListDirectoryFiles(dir.path()).status().message(), HasSubstr("holds no file"));
  EXPECT_EQ(ListDirectoryFiles(dir.path() / "nope").status().code(), StatusCode::kNotFound);
  DigestCache cache;
  EXPECT_EQ(cache.Lookup(dir.path() / "nope").status().code(), StatusCode::kNotFound);
}

TEST(DigestCacheTest, OnlyChangedFilesAreHashedAgain) {
  // Verifies a file's digest is reused while its stamp (size, mtime, ctime, inode, device) is
  // unchanged: an unchanged directory hashes nothing, a rewritten shard (same size) or a
  // touched one is hashed alone, and the digest always equals DirectoryDigest.
  TempDir dir;
  for (const char* shard : {"model-1.safetensors", "model-2.safetensors", "model-3.safetensors"}) {
    WriteFile(dir.path() / shard, std::string("shard ") + shard);
  }
  WriteFile(dir.path() / "config.json", "{}");
  testing::Backdate(dir.path());
  DigestCache cache;
  auto first = cache.Digest(dir.path());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(cache.computations(), 4);
  EXPECT_EQ(cache.Digest(dir.path()).value(), *first);
  EXPECT_EQ(cache.Lookup(dir.path())->digest, *first);
  EXPECT_EQ(cache.computations(), 4);

  const fs::path rewritten = dir.path() / "model-2.safetensors";
  WriteFile(rewritten, "SHARD model-2.safetensors");  // same size
  fs::last_write_time(rewritten, fs::last_write_time(rewritten) - std::chrono::minutes(30));
  auto second = cache.Digest(dir.path());
  ASSERT_TRUE(second.ok());
  EXPECT_NE(*second, *first);
  EXPECT_EQ(*second, DirectoryDigest(dir.path()).value());
  EXPECT_EQ(cache.computations(), 5);

  // A touch (new mtime, same bytes) is hashed again; the digest stays.
  const fs::path touched = dir.path() / "model-3.safetensors";
  fs::last_write_time(touched, fs::last_write_time(touched) + std::chrono::seconds(5));
  EXPECT_EQ(cache.Lookup(dir.path())->digest, *second);
  EXPECT_EQ(cache.computations(), 6);

  // A new file is hashed alone too.
  WriteFile(dir.path() / "tokenizer.json", "{\"model\": {}}");
  testing::Backdate(dir.path() / "tokenizer.json");
  EXPECT_EQ(cache.Digest(dir.path()).value(), DirectoryDigest(dir.path()).value());
  EXPECT_EQ(cache.computations(), 7);
}

TEST(DigestCacheTest, LookupIsPendingWhileAJobHashesThenReady) {
  // Verifies Lookup starts one background job per directory and answers pending with its
  // progress (queued, bytes and files hashed of the total) without waiting; a second lookup
  // joins the same job; once it ended the lookup is ready, equal to DirectoryDigest, and every
  // file was hashed once.
  TempDir dir;
  testing::WriteBigFile(dir.path() / "model.safetensors", 8 * kMiB);
  testing::Backdate(dir.path());
  HashingGate gate;
  auto cache = std::make_unique<DigestCache>(GatedOptions(gate));

  auto first = cache->Lookup(dir.path());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->ready());
  EXPECT_EQ(first->progress.bytes_total, 8 * kMiB);
  EXPECT_EQ(first->progress.files_total, 1);
  EXPECT_EQ(first->progress.bytes_hashed, 0);
  ASSERT_TRUE(gate.WaitForArrivals(1));  // the thread holds before the first block

  gate.Allow(3);  // before the file, after its first and second blocks
  ASSERT_TRUE(gate.WaitForArrivals(4));  // after the third
  auto joined = cache->Lookup(dir.path());
  ASSERT_TRUE(joined.ok());
  EXPECT_FALSE(joined->ready());
  EXPECT_FALSE(joined->progress.queued);
  EXPECT_EQ(joined->progress.bytes_hashed, 3 * kMiB);
  EXPECT_EQ(joined->progress.files_hashed, 0);
  EXPECT_EQ(joined->progress.bytes_total, 8 * kMiB);

  gate.Open();
  auto digest = cache->Digest(dir.path());  // waits for the job, hashes nothing more
  ASSERT_TRUE(digest.ok()) << digest.status().ToString();
  EXPECT_EQ(*digest, DirectoryDigest(dir.path()).value());
  auto ready = cache->Lookup(dir.path());
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(ready->digest, *digest);
  EXPECT_EQ(cache->computations(), 1);
  EXPECT_EQ(gate.arrivals(), 9);  // one job: before the file, after each of its 8 blocks
}

TEST(DigestCacheTest, AFileReadAsItWasWrittenIsHashedAgainOrWaitedFor) {
  // Verifies a digest read within `settle` of the file's mtime is not reused (a rewrite in the
  // same timestamp tick would keep the stamp), that once the file has settled it is, and that a
  // background job waits for a fresh file to settle so its digest is reused.
  TempDir dir;
  WriteFile(dir.path() / "fresh" / "config.json", "{}");
  DigestCache::Options o;
  o.settle = std::chrono::seconds(60);
  DigestCache cache(o);
  const std::string want = DirectoryDigest(dir.path() / "fresh").value();
  EXPECT_EQ(cache.Digest(dir.path() / "fresh").value(), want);
  EXPECT_EQ(cache.Digest(dir.path() / "fresh").value(), want);
  EXPECT_EQ(cache.computations(), 2);
  testing::Backdate(dir.path() / "fresh");
  EXPECT_EQ(cache.Digest(dir.path() / "fresh").value(), want);
  EXPECT_EQ(cache.Lookup(dir.path() / "fresh")->digest, want);
  EXPECT_EQ(cache.computations(), 3);

  WriteFile(dir.path() / "job" / "model.safetensors", "weights");
  o.inline_bytes = 0;
  o.settle = std::chrono::milliseconds(200);
  DigestCache background(o);
  ASSERT_FALSE(background.Lookup(dir.path() / "job")->ready());
  const std::string job = background.Digest(dir.path() / "job").value();  // waits for the job
  EXPECT_EQ(background.Lookup(dir.path() / "job")->digest, job);
  EXPECT_EQ(background.computations(), 1);
}

TEST(DigestCacheTest, SmallDirectoriesAreHashedInlineUpToTheLimit) {
  // Verifies the inline limit: at most inline_bytes left to hash is hashed on the caller's
  // thread (ready at once); one byte more goes to the background.
  TempDir dir;
  WriteFile(dir.path() / "a" / "config.json", std::string(100, 'c'));
  WriteFile(dir.path() / "b" / "config.json", std::string(101, 'c'));
  testing::Backdate(dir.path());  // the job need not wait for b to settle
  DigestCache::Options o;
  o.inline_bytes = 100;
  DigestCache cache(o);
  EXPECT_TRUE(cache.Lookup(dir.path() / "a")->ready());
  EXPECT_FALSE(cache.Lookup(dir.path() / "b")->ready());
  EXPECT_EQ(cache.Digest(dir.path() / "b").value(), DirectoryDigest(dir.path() / "b").value());
}

TEST(DigestCacheTest, AJobsErrorNamesTheFileOnTheNextLookupOnce) {
  // Verifies a background job's error comes back on the next lookup, naming the file (one
  // removed before the job read it; one that grew while it was read), and that the lookup
  // after that starts a new job.
  TempDir dir;
  testing::WriteBigFile(dir.path() / "ckpt" / "a.safetensors", 2 * kMiB);
  testing::WriteBigFile(dir.path() / "ckpt" / "b.safetensors", 2 * kMiB);
  testing::Backdate(dir.path());
  HashingGate gate;
  auto cache = std::make_unique<DigestCache>(GatedOptions(gate));
  const fs::path ckpt = dir.path() / "ckpt";
  ASSERT_FALSE(cache->Lookup(ckpt)->ready());
  ASSERT_TRUE(gate.WaitForArrivals(1));  // before a.safetensors
  fs::remove(ckpt / "a.safetensors");
  gate.Allow(1);  // the job ends at the missing file without reaching the gate again
  for (int i = 0; i < 2000; ++i) {
    auto r = cache->Lookup(ckpt);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
      EXPECT_THAT(r.status().message(), HasSubstr((ckpt / "a.safetensors").string()));
      break;
    }
    ASSERT_FALSE(r->ready());
    ASSERT_LT(i, 1999) << "the job never ended";
    usleep(5000);
  }
  // The next lookup starts again on what is there now: b, which grows while it is read.
  auto again = cache->Lookup(ckpt);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_FALSE(again->ready());
  EXPECT_EQ(again->progress.files_total, 1);
  gate.Allow(2);  // arrivals 2 (before b) and 3 (after its first block)
  ASSERT_TRUE(gate.WaitForArrivals(4));  // after its second and last block, before EOF
  std::ofstream(ckpt / "b.safetensors", std::ios::app) << "more";
  gate.Open();
  Status changed;
  for (int i = 0; i < 2000 && changed.ok(); ++i) {
    auto r = cache->Lookup(ckpt);
    if (!r.ok()) changed = r.status();
    else usleep(5000);
  }
  EXPECT_EQ(changed.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(changed.message(), HasSubstr((ckpt / "b.safetensors").string() + "' changed"));
  EXPECT_EQ(cache->Digest(ckpt).value(), DirectoryDigest(ckpt).value());
}

TEST(DigestCacheTest, DigestsKeptInTheStoreOutliveTheCache) {
  // Verifies that with the store as its book a new cache (a controller restart) reads no file
  // whose stamp is the recorded one, rehashes a changed one, and records nothing unsettled.
  TempDir dir;
  WriteFile(dir.path() / "ckpt" / "config.json", "{}");
  testing::WriteBigFile(dir.path() / "ckpt" / "model.safetensors", 2 * kMiB);
  testing::Backdate(dir.path() / "ckpt");
  auto store = Store::Open((dir.path() / "g.db").string(), SystemClock());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  StoreDigestBook book(**store);
  DigestCache::Options o;
  o.book = &book;
  const std::string want = DirectoryDigest(dir.path() / "ckpt").value();
  {
    DigestCache first(o);
    EXPECT_EQ(first.Digest(dir.path() / "ckpt").value(), want);
    EXPECT_EQ(first.computations(), 2);
  }
  DigestCache restarted(o);
  auto found = restarted.Lookup(dir.path() / "ckpt");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->digest, want);
  EXPECT_EQ(restarted.computations(), 0);
  WriteFile(dir.path() / "ckpt" / "config.json", "{\"x\": 1}");  // fresh: not recorded
  EXPECT_EQ(restarted.Digest(dir.path() / "ckpt").value(),
            DirectoryDigest(dir.path() / "ckpt").value());
  EXPECT_EQ(restarted.computations(), 1);
  DigestCache again(o);
  EXPECT_EQ(again.Digest(dir.path() / "ckpt").value(),
            DirectoryDigest(dir.path() / "ckpt").value());
  EXPECT_EQ(again.computations(), 1);  // config.json, again; the shard from the store
}

TEST(DigestCacheTest, DestroyingTheCacheStopsItsJobBetweenBlocks) {
  // Verifies the destructor stops a running job at the next block and joins the thread: a
  // 1 GiB (sparse) file is not read to its end.
  TempDir dir;
  {
    std::ofstream(dir.path() / "huge.safetensors");
  }
  fs::resize_file(dir.path() / "huge.safetensors", 1024 * kMiB);
  testing::Backdate(dir.path());
  HashingGate gate;
  auto cache = std::make_unique<DigestCache>(GatedOptions(gate));
  ASSERT_FALSE(cache->Lookup(dir.path())->ready());
  gate.Allow(1);
  ASSERT_TRUE(gate.WaitForArrivals(2));  // one block read
  const auto start = std::chrono::steady_clock::now();
  gate.Open();
  cache.reset();
  EXPECT_LT(gate.arrivals(), 1025);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace gatehouse::controller
