// Verifies secret redaction: whole texts, JSON-escaped values inside event lines, secrets split
// across log chunks at every position (offsets stay contiguous, nothing of a secret leaks),
// a stream that ends inside a mere prefix, end reasons, and refused configurations.
#include "agent/redaction.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "tests/agent/fake_attempt_sink.h"

namespace gatehouse::agent {
namespace {

Redactor Make(std::vector<std::pair<std::string, std::string>> secrets) {
  auto r = Redactor::Create(secrets);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : Redactor();
}

TEST(RedactorTest, ReplacesEveryOccurrenceWithTheVariablesName) {
  const Redactor r = Make({{"HF_TOKEN", "hf_abcdef123"}, {"DB_PASS", "s3cr3t!!"}});
  EXPECT_EQ(r.Redact("token=hf_abcdef123 pass=s3cr3t!! again hf_abcdef123"),
            "token=[REDACTED:HF_TOKEN] pass=[REDACTED:DB_PASS] again [REDACTED:HF_TOKEN]");
  EXPECT_EQ(r.Redact("hf_abcdef12 is only a prefix"), "hf_abcdef12 is only a prefix");
  EXPECT_EQ(Redactor().Redact("anything"), "anything");
}

TEST(RedactorTest, MatchesTheJsonEscapedFormInsideEventLines) {
  const Redactor r = Make({{"KEY", "a\"b\\c\nd"}});
  const std::string line = R"({"event":"phase_end","reason":"saw a\"b\\c\nd here"})";
  EXPECT_EQ(r.Redact(line), R"({"event":"phase_end","reason":"saw [REDACTED:KEY] here"})");
}

TEST(RedactorTest, RefusesValuesTooShortToRedact) {
  auto r = Redactor::Create({{"FLAG", "on"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("FLAG"), std::string::npos);
}

TEST(RedactorTest, AnUnsetSecretVariableIsAnError) {
  ::setenv("GATEHOUSE_TEST_SECRET", "value-123", 1);
  auto ok = SecretsFromEnvironment({"GATEHOUSE_TEST_SECRET"});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)[0].second, "value-123");
  auto missing = SecretsFromEnvironment({"GATEHOUSE_TEST_NO_SUCH_SECRET"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("GATEHOUSE_TEST_NO_SUCH_SECRET"), std::string::npos);
}

TEST(RedactingSinkTest, ASecretSplitAcrossChunksAtAnyPositionNeverLeaks) {
  const std::string secret = "hf_XYZ_0123456789";
  const Redactor r = Make({{"HF_TOKEN", secret}});
  const std::string text = "start " + secret + " middle hf_XYZ_01 not one, " + secret + secret +
                           " end hf_XY";
  const std::string expected = r.Redact(text);
  ASSERT_EQ(expected.find(secret), std::string::npos);
  // Every pair of cut points: three chunks.
  for (size_t a = 1; a < text.size(); a += 3) {
    for (size_t b = a + 1; b < text.size(); b += 2) {
      FakeAttemptSink inner;  // checks offsets are contiguous from 0
      RedactingSink sink(inner, r);
      sink.Log(7, "worker", 0, text.substr(0, a));
      sink.Log(7, "worker", static_cast<int64_t>(a), text.substr(a, b - a));
      sink.Log(7, "worker", static_cast<int64_t>(b), text.substr(b));
      for (const auto& chunk : inner.chunks["worker"]) {
        // No chunk may carry more than a proper prefix of the secret at its end.
        EXPECT_EQ(chunk.data.find(secret), std::string::npos);
      }
      sink.End({7, 1, std::string(kOutcomeFinished), "", 0});
      ASSERT_EQ(inner.LogText("worker"), expected) << "cuts " << a << ", " << b;
      ASSERT_EQ(inner.ends.size(), 1u);
    }
  }
}

TEST(RedactingSinkTest, StreamsAreIndependentAndEventsAndReasonsAreRedacted) {
  const Redactor r = Make({{"PASS", "p4ssw0rd"}});
  FakeAttemptSink inner;
  RedactingSink sink(inner, r);
  sink.Log(3, "build", 0, "cmake -DPASS=p4ss");
  sink.Log(3, "worker", 0, "w0rd is not it");  // another stream: no join with build's tail
  sink.Log(3, "build", 17, "w0rd done");
  sink.Event(3, 1, R"({"event":"log","message":"p4ssw0rd"})");
  sink.End({3, 2, std::string(kOutcomeError), "build failed: p4ssw0rd rejected", 1});
  EXPECT_EQ(inner.LogText("build"), "cmake -DPASS=[REDACTED:PASS] done");
  EXPECT_EQ(inner.LogText("worker"), "w0rd is not it");
  ASSERT_EQ(inner.events.size(), 1u);
  EXPECT_EQ(inner.events[0].json, R"({"event":"log","message":"[REDACTED:PASS]"})");
  ASSERT_EQ(inner.ends.size(), 1u);
  EXPECT_EQ(inner.ends[0].reason, "build failed: [REDACTED:PASS] rejected");
}

TEST(RedactingSinkTest, AStreamEndingInsideAPrefixKeepsThoseBytes) {
  const Redactor r = Make({{"PASS", "p4ssw0rd"}});
  FakeAttemptSink inner;
  RedactingSink sink(inner, r);
  sink.Log(4, "worker", 0, "last bytes p4ss");
  EXPECT_EQ(inner.LogText("worker"), "last bytes ");  // "p4ss" is held back...
  sink.End({4, 1, std::string(kOutcomeFinished), "", 0});
  EXPECT_EQ(inner.LogText("worker"), "last bytes p4ss");  // ...and flushed at the end
}

}  // namespace
}  // namespace gatehouse::agent
