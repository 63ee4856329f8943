// EventWriter / JsonlEventSink tests (docs/protocols.md §4).
#include "gatehouse/worker/events.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace gatehouse::worker {
namespace {

std::vector<nlohmann::json> ReadLines(FILE* f) {
  std::rewind(f);
  std::vector<nlohmann::json> out;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), f)) out.push_back(nlohmann::json::parse(buf));
  return out;
}

// Verifies each event is one JSON line with the protocol's members and ts_ms from the clock.
TEST(EventWriterTest, WritesProtocolLines) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  JsonlEventSink sink(f);
  int64_t now = 100;
  EventWriter w(sink, [&] { return now++; });
  w.PhaseStart("load");
  w.EmitFigure("load", {"keys_used", int64_t{21}, "count"});
  w.EmitFigure("inference", {"kl_mean", 2.5e-7, "nats"});
  w.EmitFigure("decode", {"first_mismatch", std::string("none"), "text"});
  w.PhaseEnd("load", GateStatus::kFail, "1 missing key(s): x", "adapter_contract", 12);
  w.EmitArtifact("save", {"saved_checkpoint", "save/model.safetensors", 1024, "ab12"});
  w.RunEnd(GateStatus::kFail);
  const auto lines = ReadLines(f);
  std::fclose(f);
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0], (nlohmann::json{{"event", "phase_start"}, {"phase", "load"}, {"ts_ms", 100}}));
  EXPECT_EQ(lines[1]["value"], 21);
  EXPECT_EQ(lines[1]["unit"], "count");
  EXPECT_DOUBLE_EQ(lines[2]["value"].get<double>(), 2.5e-7);
  EXPECT_EQ(lines[3]["value"], "none");
  EXPECT_EQ(lines[4], (nlohmann::json{{"event", "phase_end"}, {"phase", "load"}, {"status", "FAIL"},
                                       {"reason", "1 missing key(s): x"},
                                       {"classification", "adapter_contract"},
                                       {"duration_ms", 12}, {"ts_ms", 104}}));
  EXPECT_EQ(lines[5]["path"], "save/model.safetensors");
  EXPECT_EQ(lines[5]["bytes"], 1024);
  EXPECT_EQ(lines[5]["sha256"], "ab12");
  EXPECT_EQ(lines[6], (nlohmann::json{{"event", "run_end"}, {"status", "FAIL"}, {"ts_ms", 106}}));
}

// Verifies a classification is dropped unless the status is FAIL.
TEST(EventWriterTest, ClassificationOnlyOnFail) {
  MemoryEventSink sink;
  EventWriter w(sink, [] { return int64_t{0}; });
  w.PhaseEnd("parallel", GateStatus::kBlocked, "not implemented", "adapter_contract", 0);
  EXPECT_EQ(sink.events()[0]["classification"], "");
}

// Verifies non-finite figure values are written as strings (JSON has no NaN).
TEST(EventWriterTest, NonFiniteFiguresAreStrings) {
  EXPECT_EQ(FigureValueToJson(std::nan("")), "NaN");
  EXPECT_EQ(FigureValueToJson(INFINITY), "Infinity");
  EXPECT_EQ(FigureValueToJson(-INFINITY), "-Infinity");
  EXPECT_EQ(FigureValueToJson(1.5), 1.5);
}

// Verifies invalid UTF-8 in a reason is replaced, not thrown on.
TEST(EventWriterTest, InvalidUtf8IsReplaced) {
  FILE* f = std::tmpfile();
  JsonlEventSink sink(f);
  EventWriter w(sink, [] { return int64_t{0}; });
  EXPECT_NO_THROW(w.PhaseEnd("config", GateStatus::kFail, std::string("bad \xff byte"), "unknown", 0));
  const auto lines = ReadLines(f);
  std::fclose(f);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["status"], "FAIL");
}

}  // namespace
}  // namespace gatehouse::worker
