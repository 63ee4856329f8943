// Detokenizer (tokenizer.json ByteLevel decoding) and Utf8Lossy. The check against
// transformers' own tokenizer.decode on a real tokenizer is in
// tests/models/trained_checkpoint_test.cc (detokenizer_cases.json of the trained fixture).
#include "gatehouse/worker/detokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/common/temp_dir.h"

namespace gatehouse::worker {
namespace {

using ::testing::HasSubstr;

const std::string kFffd = "\xEF\xBF\xBD";

// Verifies well-formed UTF-8 passes through unchanged, 1- to 4-byte characters alike.
TEST(Utf8LossyTest, WellFormedUnchanged) {
  const std::string s = "a\xC3\xA9\xE2\x98\x95\xF0\x9F\x9A\x80z";  // a é ☕ 🚀 z
  EXPECT_EQ(Utf8Lossy(s), s);
  EXPECT_EQ(Utf8Lossy(""), "");
}

// Verifies each maximal subpart of an ill-formed sequence becomes one U+FFFD (the cases of
// Unicode 15 Table 3-8 and Rust's from_utf8_lossy).
TEST(Utf8LossyTest, MaximalSubpartsReplaced) {
  EXPECT_EQ(Utf8Lossy("\x80"), kFffd);                            // lone continuation
  EXPECT_EQ(Utf8Lossy("\xC3"), kFffd);                            // truncated 2-byte
  EXPECT_EQ(Utf8Lossy("\xE2\x98"), kFffd);                        // truncated 3-byte: one
  EXPECT_EQ(Utf8Lossy("\xE2\x98x"), kFffd + "x");                 // ... then ASCII resumes
  EXPECT_EQ(Utf8Lossy("\xC0\xAF"), kFffd + kFffd);                // overlong lead: two
  EXPECT_EQ(Utf8Lossy("\xE0\x80\x80"), kFffd + kFffd + kFffd);    // E0 needs A0..BF
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);    // surrogate
  EXPECT_EQ(Utf8Lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x9A"), kFffd);                    // truncated 4-byte: one
  EXPECT_EQ(Utf8Lossy("\xFF" "a"), kFffd + "a");
  EXPECT_EQ(Utf8Lossy("\xC3\xA9\xE2\xA9\xC3"), "\xC3\xA9" + kFffd + kFffd);
}

/// A tokenizer.json in a temp dir; the decoder block and vocab are the test's.
struct TokenizerFile {
  explicit TokenizerFile(const nlohmann::json& j) {
    path = dir.path() / "tokenizer.json";
    std::ofstream(path) << j.dump();
  }
  test_util::TempDir dir;
  std::filesystem::path path;
};

nlohmann::json ByteLevelTokenizer() {
  // "Ġ" is byte 0x20 (space), "Ċ" byte 0x0A, "Ã" "©" bytes C3 A9 (é) in GPT-2's table.
  return {
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}}},
      {"model",
       {{"type", "BPE"},
        {"vocab",
         {{"hello", 0}, {"\xC4\xA0world", 1}, {"\xC4\x8A", 2}, {"caf", 3}, {"\xC3\x83", 4},
          {"\xC2\xA9", 5}, {"\xC4\xA0\xC4\xA0", 6}}}}},
      {"added_tokens",
       {{{"id", 7}, {"content", "<|im_end|>"}, {"special", true}},
        // A character outside the byte table: the token's own UTF-8 is kept.
        {{"id", 8}, {"content", "\xE2\x98\x85 star"}, {"special", false}},
        // An added token overrides a vocab entry with the same id.
        {{"id", 0}, {"content", "<s>"}, {"special", true}}}},
  };
}

// Verifies token strings map back through the byte table: spaces, newlines, a character split
// across two tokens, added tokens verbatim.
TEST(DetokenizerTest, ByteLevelDecode) {
  TokenizerFile f(ByteLevelTokenizer());
  auto d = Detokenizer::Open(f.path);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->size(), 9);
  EXPECT_EQ(d->Decode({1, 2, 3, 4, 5}), " world\ncaf\xC3\xA9");
  EXPECT_EQ(d->Decode({6, 1, 7}), "   world<|im_end|>");
  EXPECT_EQ(d->Decode({8, 1}), "\xE2\x98\x85 star world");
  EXPECT_EQ(d->Decode({0, 1}), "<s> world");
  EXPECT_EQ(d->Decode({}), "");
}

// Verifies half a character decodes to U+FFFD, and ids without a token are skipped as
// upstream skips them.
TEST(DetokenizerTest, PartialCharacterAndUnknownIds) {
  TokenizerFile f(ByteLevelTokenizer());
  auto d = Detokenizer::Open(f.path);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->Decode({3, 4}), "caf" + kFffd);
  EXPECT_EQ(d->Decode({5, 4}), kFffd + kFffd);
  EXPECT_EQ(d->Decode({1, 99, -1, 1}), " world world");
}

// Verifies an absent file is NOT_FOUND and bad contents are INVALID_ARGUMENT naming the field.
TEST(DetokenizerTest, ErrorsNameTheField) {
  test_util::TempDir dir;
  auto missing = Detokenizer::Open(dir.path() / "tokenizer.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  auto metaspace = ByteLevelTokenizer();
  metaspace["decoder"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}};
  TokenizerFile m(metaspace);
  auto r = Detokenizer::Open(m.path);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("decoder.type"));
  EXPECT_THAT(r.status().message(), HasSubstr("\"Metaspace\""));

  auto no_vocab = ByteLevelTokenizer();
  no_vocab["model"].erase("vocab");
  TokenizerFile nv(no_vocab);
  EXPECT_THAT(Detokenizer::Open(nv.path).status().message(), HasSubstr("model.vocab"));

  auto negative = ByteLevelTokenizer();
  negative["model"]["vocab"]["bad"] = -3;
  TokenizerFile ng(negative);
  auto n = Detokenizer::Open(ng.path);
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(n.status().message(), HasSubstr("model.vocab.bad"));
  EXPECT_THAT(n.status().message(), HasSubstr("-3"));

  auto added = ByteLevelTokenizer();
  added["added_tokens"][1].erase("content");
  TokenizerFile ad(added);
  EXPECT_THAT(Detokenizer::Open(ad.path).status().message(), HasSubstr("added_tokens[1]"));

  TokenizerFile not_json(nlohmann::json::array({1, 2}));
  EXPECT_THAT(Detokenizer::Open(not_json.path).status().message(),
              HasSubstr("not a JSON object"));
}

}  // namespace
}  // namespace gatehouse::worker
