// Verifies the interpretation of worker event lines (docs/protocols.md §4): the effect of each
// kind, the "rank" member of tensor-parallel groups, and the errors.
#include "controller/worker_event.h"

#include <gtest/gtest.h>

namespace gatehouse::controller {
namespace {

using Kind = EventEffect::Kind;

TEST(WorkerEventTest, KindsAndTheirMembers) {
  auto start = ParseWorkerEvent(R"({"event":"phase_start","phase":"load","ts_ms":1})");
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(start->kind, Kind::kPhaseStart);
  EXPECT_EQ(start->phase, "load");

  auto end = ParseWorkerEvent(
      R"({"event":"phase_end","phase":"load","status":"FAIL","reason":"r","classification":"adapter_contract","duration_ms":12})");
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_EQ(end->kind, Kind::kPhaseEnd);
  EXPECT_EQ(end->status, "FAIL");
  EXPECT_EQ(end->classification, "adapter_contract");
  EXPECT_EQ(end->duration_ms, 12);

  auto run_end = ParseWorkerEvent(R"({"event":"run_end","status":"PASS"})");
  ASSERT_TRUE(run_end.ok());
  EXPECT_EQ(run_end->kind, Kind::kRunEnd);

  auto artifact = ParseWorkerEvent(R"({"event":"artifact","name":"x"})");
  ASSERT_TRUE(artifact.ok());
  EXPECT_EQ(artifact->kind, Kind::kNone);
}

// Verifies that rank 0's tagged events count as the evidence and other ranks' have no effect,
// even when they would be invalid as rank 0's.
TEST(WorkerEventTest, RankZeroIsEvidenceOtherRanksAreKeptOnly) {
  auto rank0 = ParseWorkerEvent(R"({"event":"run_end","status":"FAIL","rank":0})");
  ASSERT_TRUE(rank0.ok()) << rank0.status().ToString();
  EXPECT_EQ(rank0->kind, Kind::kRunEnd);
  EXPECT_EQ(rank0->status, "FAIL");

  for (const char* line : {R"({"event":"phase_start","phase":"load","rank":1})",
                           R"({"event":"run_end","status":"PASS","rank":3})",
                           R"({"event":"phase_end","phase":"load","rank":63})",
                           R"({"event":"run_end","status":"NOPE","rank":2})"}) {
    auto effect = ParseWorkerEvent(line);
    ASSERT_TRUE(effect.ok()) << line << ": " << effect.status().ToString();
    EXPECT_EQ(effect->kind, Kind::kNone) << line;
    EXPECT_TRUE(effect->phase.empty()) << line;
    EXPECT_TRUE(effect->status.empty()) << line;
  }
}

TEST(WorkerEventTest, RankThatIsNotANonNegativeIntegerIsInvalid) {
  for (const char* line : {R"({"event":"run_end","status":"PASS","rank":-1})",
                           R"({"event":"run_end","status":"PASS","rank":"1"})",
                           R"({"event":"run_end","status":"PASS","rank":1.5})",
                           R"({"event":"run_end","status":"PASS","rank":null})",
                           R"({"event":"run_end","status":"PASS","rank":true})"}) {
    auto effect = ParseWorkerEvent(line);
    ASSERT_FALSE(effect.ok()) << line;
    EXPECT_EQ(effect.status().code(), StatusCode::kInvalidArgument) << line;
    EXPECT_NE(effect.status().message().find("'rank' must be a non-negative integer"),
              std::string::npos)
        << effect.status().message();
  }
}

TEST(WorkerEventTest, MalformedLinesAreInvalid) {
  for (const char* line : {"not json", "[1]", R"({"phase":"load"})", R"({"event":1})",
                           R"({"event":"phase_start"})",
                           R"({"event":"run_end","status":"MAYBE"})",
                           R"({"event":"figure","phase":"load","name":"n"})"}) {
    auto effect = ParseWorkerEvent(line);
    EXPECT_FALSE(effect.ok()) << line;
    if (!effect.ok()) EXPECT_EQ(effect.status().code(), StatusCode::kInvalidArgument) << line;
  }
}

}  // namespace
}  // namespace gatehouse::controller
