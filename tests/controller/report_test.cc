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

// Verifies no section appears when the decode phase showed no generated text (no tokenizer).
TEST(ReportTest, NoDecodedTextSectionWithoutGeneratedText) {
  const std::string report = RenderReport(DetailWithDecodeFigures({
      {"input_text_prompt_0", R"("prompt 0")", "text"},
      {"detokenizer", R"("no text shown: no tokenizer file /x/tokenizer.json")", "text"},
  }));
  EXPECT_EQ(report.find("## Decoded text"), std::string::npos) << report;
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

}  // namespace
}  // namespace gatehouse::controller
