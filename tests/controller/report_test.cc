// RenderReport: the decode phase's text section (full text, JSON-quoted, in prompt order).
#include "controller/report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/common/sample_spec.h"

namespace gatehouse::controller {
namespace {

CellDetail DetailWithDecodeFigures(std::vector<FigureRecord> figures) {
  CellDetail d;
  d.cell.id = "abc";
  CellSpec spec = gatehouse::testing::SampleSpec();
  spec.phases = {"decode"};
  d.cell.spec_json = CanonicalSpecJson(spec);
  PhaseRecord decode;
  decode.phase = "decode";
  decode.status = "PASS";
  decode.figures = std::move(figures);
  d.phases.push_back(decode);
  return d;
}

// Verifies the text figures appear in full (not cut at the phase table's 40 characters), with
// newlines escaped, for every prompt in order.
TEST(ReportTest, DecodedTextSectionShowsFullText) {
  const std::string long_text =
      "The capital of France is Paris.<|im_end|>\nand a second line that runs well past forty";
  const std::string report = RenderReport(DetailWithDecodeFigures({
      {"input_text_prompt_0", R"("What is the capital of France?")", "text"},
      {"generated_text_prompt_0", nlohmann::json(long_text).dump(), "text"},
      {"reference_text_prompt_0", nlohmann::json(long_text).dump(), "text"},
      {"generated_text_prompt_1", R"(" once")", "text"},
  }));
  const size_t section = report.find("## Decoded text (decode phase)");
  ASSERT_NE(section, std::string::npos) << report;
  EXPECT_NE(report.find("prompt 0 input:    \"What is the capital of France?\"", section),
            std::string::npos)
      << report;
  const std::string escaped = nlohmann::json(long_text).dump();  // "...<|im_end|>\n..."
  EXPECT_NE(report.find("prompt 0 ours:     " + escaped, section), std::string::npos) << report;
  EXPECT_NE(report.find("prompt 0 upstream: " + escaped, section), std::string::npos) << report;
  EXPECT_LT(report.find("prompt 0 upstream:", section), report.find("prompt 1 ours:", section));
}

// Verifies the artifacts table names each attempt's files and which of them artifact retention
// removed, and when.
TEST(ReportTest, ArtifactsSayWhichRetentionRemoved) {
  CellDetail d = DetailWithDecodeFigures({});
  AttemptRecord first;
  first.id = 7;
  first.number = 1;
  d.attempts.push_back(first);
  d.artifacts.push_back({7, "reference/reference.json", "sha256:aa", 12, "t0", ""});
  d.artifacts.push_back(
      {7, "reference/reference.safetensors", "sha256:bb", 34, "t0", "2026-01-02T00:00:00.000Z"});
  const std::string report = RenderReport(d);
  EXPECT_NE(report.find("| 1 | reference/reference.json | `sha256:aa` | 12 | yes |"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("| 1 | reference/reference.safetensors | `sha256:bb` | 34 | removed by "
                        "artifact retention at 2026-01-02T00:00:00.000Z |"),
            std::string::npos)
      << report;
}

// Verifies no section appears when the decode phase showed no generated text (no tokenizer).
TEST(ReportTest, NoDecodedTextSectionWithoutGeneratedText) {
  const std::string report = RenderReport(DetailWithDecodeFigures({
      {"input_text_prompt_0", R"("prompt 0")", "text"},
      {"detokenizer", R"("no text shown: no tokenizer file /x/tokenizer.json")", "text"},
  }));
  EXPECT_EQ(report.find("## Decoded text"), std::string::npos) << report;
}

// Verifies a phase still RUNNING when its attempt was cancelled is named among the reasons with
// the attempt's end (not "None."), while a RUNNING phase of a live attempt is not.
TEST(ReportTest, APhaseCutShortByTheAttemptsEndIsAReason) {
  CellDetail d = DetailWithDecodeFigures({});
  d.phases[0].status = "RUNNING";
  d.status = AttemptState::kRunning;
  EXPECT_NE(RenderReport(d).find("## Reasons for non-PASS phases\n\nNone."), std::string::npos);
  d.status = AttemptState::kCancelled;
  AttemptRecord attempt;
  attempt.state = AttemptState::kCancelled;
  attempt.reason = "cancelled by ci: superseded";
  d.attempts.push_back(attempt);
  const std::string report = RenderReport(d);
  EXPECT_NE(report.find("- **decode** did not finish: the attempt ended cancelled: cancelled by "
                        "ci: superseded"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("None."), std::string::npos) << report;
}

// Verifies a stored spec that no longer reads (frozen before a limit existed) still gives a
// report: the inputs row says why, and no reproduce body is offered.
TEST(ReportTest, AnUnreadableStoredSpecIsNamedNotHidden) {
  CellDetail d = DetailWithDecodeFigures({});
  nlohmann::json spec = nlohmann::json::parse(d.cell.spec_json);
  spec["decode"]["max_new_tokens"] = 100000000;
  d.cell.spec_json = spec.dump();
  const std::string report = RenderReport(d);
  EXPECT_NE(report.find("| spec | unreadable: field 'decode.max_new_tokens': expected an integer "
                        "from 1 to 4096, got 100000000 |"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("The stored spec does not parse, so no body reproduces it."),
            std::string::npos);
  EXPECT_EQ(report.find("```json"), std::string::npos);
}

// Verifies the inputs table and the reproduce body come from the typed spec.
TEST(ReportTest, InputsAndReproduceBodyComeFromTheSpec) {
  CellDetail d = DetailWithDecodeFigures({});
  CellSpec spec = ParseCellSpecJson(d.cell.spec_json).value();
  spec.topology.tp = 2;
  spec.training.lr = 3e-4;
  d.cell.spec_json = CanonicalSpecJson(spec);
  const std::string report = RenderReport(d);
  EXPECT_NE(report.find("| topology | tp=2 dp=1 pp=1 ep=1 |"), std::string::npos) << report;
  EXPECT_NE(report.find("| training | steps=2 lr=0.0003 seed=1234 |"), std::string::npos) << report;
  EXPECT_NE(report.find(ReproduceBody(spec).dump(2)), std::string::npos) << report;
}

PhaseRecord Phase(const std::string& name, const std::string& status, const std::string& reason = "",
                  std::vector<FigureRecord> figures = {}) {
  PhaseRecord p;
  p.phase = name;
  p.status = status;
  p.reason = reason;
  p.figures = std::move(figures);
  return p;
}

// Verifies the evidence summary a team files: model, source, adapter, claimed scope, the
// control and its result, this variant's, extensions excluded or skipped with why, execution
// and readiness, unknowns and blockers, validator and date; and the control's phases beside
// the variant's.
TEST(ReportTest, EvidenceSummaryNamesEveryFieldAndWhatDidNotRunOrPass) {
  CellSpec spec = gatehouse::testing::SampleSpec();
  spec.phases = {"config", "load", "inference", "decode", "training"};
  spec.precision = "bf16";
  spec.control = std::string(64, 'c');
  CellDetail d;
  d.cell.id = std::string(64, 'v');
  d.cell.branch = "bf16-support";
  d.cell.submitter = "ci";
  d.cell.spec_json = CanonicalSpecJson(spec);
  d.status = AttemptState::kFailed;
  AttemptRecord a;
  a.number = 1;
  a.state = AttemptState::kFailed;
  a.agent_id = "gpu-node-3";
  a.ended_at = "2026-12-02T03:00:00.000Z";
  d.attempts = {a};
  d.phases = {Phase("config", "PASS"), Phase("load", "PASS"),
              Phase("inference", "FAIL", "max_abs_diff 0.9 exceeds the bar 0.05",
                    {{"max_abs_diff", "0.9", "logits"}}),
              Phase("decode", "UNKNOWN", "near-tie at position 3"),
              Phase("training", "SKIPPED", "not applicable to bf16 here"),
              Phase("performance", "SKIPPED", "not requested")};
  PrerequisiteStatus control{"control", spec.control, true, AttemptState::kPassed, ""};
  control.phases = {Phase("config", "PASS"), Phase("inference", "PASS", "",
                                                   {{"max_abs_diff", "0", "logits"}})};
  d.prerequisites = {control};

  const std::string r = RenderReport(d);
  for (const char* field : {"| model | family `llama`", "| source | adapter repository",
                            "| adapter |", "| claimed scope | device cpu, precision bf16",
                            "control `cccccccccccc`: **passed**", "| control | reference bundle /data/llama-tiny/reference",
                            "| variant (this cell) | **failed**: 2 of 4 phases that ran passed",
                            "| execution | CPU: failed; GPU: not run in this cell",
                            "| readiness | CPU: failed;", "| validator and date | Gatehouse agent `gpu-node-3` (attempt 1), ended 2026-12-02T03:00:00.000Z; submitted by ci"}) {
    EXPECT_NE(r.find(field), std::string::npos) << field << "\n" << r;
  }
  // Excluded and skipped phases, and every blocker, by name and reason.
  EXPECT_NE(r.find("performance: excluded (not requested)"), std::string::npos) << r;
  EXPECT_EQ(r.find("performance: SKIPPED"), std::string::npos) << r;  // listed once, excluded
  EXPECT_NE(r.find("training: SKIPPED (not applicable to bf16 here)"), std::string::npos) << r;
  EXPECT_NE(r.find("inference FAIL: max_abs_diff 0.9 exceeds the bar 0.05"), std::string::npos) << r;
  EXPECT_NE(r.find("decode UNKNOWN: near-tie at position 3"), std::string::npos) << r;
  // The comparison with the control.
  EXPECT_NE(r.find("## Control `cccccccccccc` and this variant"), std::string::npos) << r;
  EXPECT_NE(r.find("| inference | PASS (max_abs_diff=0 logits) | FAIL (max_abs_diff=0.9 logits) |"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("| load | not run | PASS |"), std::string::npos) << r;

  // A cell blocked behind its reference cell names it and why.
  spec.control.clear();
  spec.reference = {{"", ""}, std::string(64, 'e')};
  d.cell.spec_json = CanonicalSpecJson(spec);
  d.status = AttemptState::kBlocked;
  d.attempts[0].state = AttemptState::kBlocked;
  d.attempts[0].reason = "blocked: its reference cell eee ended failed";
  d.phases.clear();
  d.prerequisites = {{"reference cell", std::string(64, 'e'), true, AttemptState::kFailed,
                      "transformers cannot load the checkpoint"}};
  const std::string b = RenderReport(d);
  EXPECT_NE(b.find("reference cell `eeeeeeeeeeee`: **failed** (transformers cannot load"),
            std::string::npos) << b;
  EXPECT_NE(b.find("| readiness | CPU: blocked;"), std::string::npos) << b;
  EXPECT_NE(b.find("config: not run; load: not run"), std::string::npos) << b;
  EXPECT_NE(b.find("blocked: its reference cell eee ended failed"), std::string::npos) << b;
}

// Verifies the summary's numerics row lists each numeric phase's claim (correct within the
// envelope, or bit-exact), and that a cell without claims has no such row.
TEST(ReportTest, EvidenceSummaryListsTheNumericClaims) {
  CellSpec spec = gatehouse::testing::SampleSpec();
  spec.phases = {"inference", "decode", "training"};
  CellDetail d;
  d.cell.id = std::string(64, 'n');
  d.cell.spec_json = CanonicalSpecJson(spec);
  d.status = AttemptState::kPassed;
  d.phases = {Phase("inference", "PASS", "", {{"claim", R"("correct, not bit-exact")", "text"}}),
              Phase("decode", "PASS", "", {{"claim", R"("bit-exact")", "text"}}),
              Phase("training", "PASS", "", {{"claim", R"("correct, not bit-exact")", "text"}})};
  const std::string r = RenderReport(d);
  EXPECT_NE(r.find("| numerics | inference: correct, not bit-exact; decode: bit-exact; training: "
                   "correct, not bit-exact |"),
            std::string::npos)
      << r;
  d.phases = {Phase("inference", "PASS")};
  EXPECT_EQ(RenderReport(d).find("| numerics |"), std::string::npos);
}

}  // namespace
}  // namespace gatehouse::controller
