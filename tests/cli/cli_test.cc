// The `gatehouse` CLI's parts that need no controller: controller URLs, the exit code CI acts
// on, progress lines, JUnit XML (checked well-formed by Python's XML parser), and an
// unreachable controller named in the error. The CLI against a real controller, agent and
// worker is in tests/e2e/e2e_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli/api_client.h"
#include "cli/matrix.h"
#include "cli/verdict.h"
#include "tests/common/temp_dir.h"

namespace gatehouse::cli {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

json Cell(const std::string& status, json phases = json::array()) {
  return {{"id", std::string(64, 'a')},
          {"status", status},
          {"spec", {{"model_family", "olmo2"}}},
          {"labels", {{"branch", "main"}}},
          {"phases", std::move(phases)}};
}

json Phase(const std::string& name, const std::string& status, const std::string& reason = "") {
  return {{"phase", name}, {"status", status}, {"reason", reason}, {"classification", ""},
          {"duration_ms", 1500}, {"figures", json::array()}};
}

TEST(ControllerUrl, SchemesPortsAndRefusals) {
  auto http = ParseControllerUrl("http://127.0.0.1:8080");
  ASSERT_TRUE(http.ok()) << http.status().ToString();
  EXPECT_FALSE(http->tls);
  EXPECT_EQ(http->host, "127.0.0.1");
  EXPECT_EQ(http->port, 8080);
  auto https = ParseControllerUrl("https://gatehouse.example.org/");
  ASSERT_TRUE(https.ok());
  EXPECT_TRUE(https->tls);
  EXPECT_EQ(https->port, 443);
  for (const char* bad : {"ftp://h:1", "127.0.0.1:8080", "http://h:0", "http://h:99999",
                          "http://h:80/api/v1", "http://:80"}) {
    auto r = ParseControllerUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_THAT(r.status().message(), HasSubstr(bad));
  }
}

TEST(ControllerUrl, QueryValuesArePercentEncoded) {
  EXPECT_EQ(EncodeQueryValue("worker.rank1"), "worker.rank1");
  EXPECT_EQ(EncodeQueryValue("x y&z=1?#"), "x%20y%26z%3D1%3F%23");
}

TEST(Verdict, FinalStatuses) {
  for (const char* s : {"passed", "failed", "error", "lost", "cancelled", "timed_out"}) {
    EXPECT_TRUE(IsFinalStatus(s)) << s;
  }
  for (const char* s : {"queued", "leased", "running", ""}) EXPECT_FALSE(IsFinalStatus(s)) << s;
}

TEST(Verdict, ExitCodesAreDistinctAndFailWins) {
  EXPECT_EQ(VerdictExitCode({Cell("passed"), Cell("passed")}), kExitPass);
  EXPECT_EQ(VerdictExitCode({Cell("passed"), Cell("failed"), Cell("error")}), kExitFail);
  EXPECT_EQ(VerdictExitCode({Cell("passed"), Cell("error")}), kExitBlocked);
  EXPECT_EQ(VerdictExitCode({Cell("cancelled")}), kExitBlocked);
  EXPECT_EQ(VerdictExitCode({Cell("timed_out")}), kExitBlocked);
  const std::set<int> codes = {kExitPass, kExitFail, kExitUsage, kExitBlocked, kExitTimeout,
                               kExitUnreachable};
  EXPECT_EQ(codes.size(), 6u);
}

TEST(Verdict, EachEndedPhaseIsPrintedOnce) {
  std::set<std::string> seen;
  json cell = Cell("running", {Phase("identity", "PASS"), Phase("config", "RUNNING")});
  EXPECT_THAT(NewPhaseLines(cell, seen), ElementsAre("aaaaaaaaaaaa identity PASS 1.500 s"));
  cell["phases"][1] = Phase("config", "FAIL", "field 'use_mrope' unmapped");
  EXPECT_THAT(NewPhaseLines(cell, seen),
              ElementsAre("aaaaaaaaaaaa config FAIL 1.500 s: field 'use_mrope' unmapped"));
  EXPECT_TRUE(NewPhaseLines(cell, seen).empty());
}

TEST(Verdict, JUnitXmlIsWellFormedWithOneCasePerPhase) {
  std::vector<json> cells = {
      Cell("failed", {Phase("identity", "PASS"), Phase("inference", "FAIL", "kl_mean 0.3 > 1e-6 <&\"'>"),
                      Phase("decode", "SKIPPED", "earlier phase inference ended FAIL")}),
      Cell("error", {Phase("identity", "BLOCKED", std::string("torch pin\x01 2.10"))}),
      Cell("cancelled")};
  cells[2]["attempts"] = {{{"number", 1}, {"state", "cancelled"}, {"reason", "superseded"}}};
  const std::string xml = JUnitXml(cells);
  EXPECT_THAT(xml, HasSubstr("tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""));
  EXPECT_THAT(xml, HasSubstr("<failure message=\"FAIL: kl_mean 0.3 &gt; 1e-6 &lt;&amp;&quot;&apos;&gt;\""));
  EXPECT_THAT(xml, HasSubstr("name=\"aaaaaaaaaaaa.inference\""));
  EXPECT_THAT(xml, HasSubstr("classname=\"gatehouse.olmo2\""));
  EXPECT_THAT(xml, HasSubstr("<error message=\"BLOCKED: torch pin? 2.10\""));
  EXPECT_THAT(xml, HasSubstr("<error message=\"cell cancelled: superseded\""));
  test_util::TempDir dir("gatehouse-junit");
  const auto path = dir.path() / "out.xml";
  std::ofstream(path) << xml;
  const std::string cmd = std::string("'") + GATEHOUSE_PYTHON +
                          "' -c 'import sys, xml.etree.ElementTree as E; "
                          "r = E.parse(sys.argv[1]).getroot(); "
                          "assert len(r.findall(\"testsuite\")) == 3; "
                          "assert len(list(r.iter(\"testcase\"))) == 5' '" +
                          path.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << xml;
}

TEST(Matrix, ExpandsTheProductOfItsAxesLastFastest) {
  const json matrix = json::parse(R"({
      "repository": "/srv/adapters/olmo2", "branch": ["main", "rope-fix"],
      "checkpoints": ["/data/a/checkpoint", {"checkpoint": "/data/b/checkpoint", "reference": "/data/b/ref"}],
      "precision": ["fp32", "bf16"], "topology": {"tp": 2},
      "base": {"model_family": "olmo2", "decode": {"max_new_tokens": 16}}})");
  auto bodies = ExpandMatrix(matrix);
  ASSERT_TRUE(bodies.ok()) << bodies.status().ToString();
  ASSERT_EQ(bodies->size(), 8u);
  const json& first = (*bodies)[0];
  EXPECT_EQ(first["repository"], "/srv/adapters/olmo2");
  EXPECT_EQ(first["branch"], "main");
  EXPECT_EQ(first["checkpoint"], "/data/a/checkpoint");
  EXPECT_FALSE(first.contains("reference"));
  EXPECT_EQ(first["precision"], "fp32");
  EXPECT_EQ(first["topology"], json({{"tp", 2}}));
  EXPECT_EQ(first["model_family"], "olmo2");
  EXPECT_EQ(first["decode"]["max_new_tokens"], 16);
  EXPECT_EQ((*bodies)[1]["precision"], "bf16");
  EXPECT_EQ((*bodies)[2]["reference"], "/data/b/ref");
  EXPECT_EQ((*bodies)[7]["branch"], "rope-fix");
  std::set<std::string> distinct;
  for (const json& b : *bodies) distinct.insert(b.dump());
  EXPECT_EQ(distinct.size(), 8u);
}

TEST(Matrix, BadMatricesAreRefusedNamingTheMember) {
  auto error = [](const char* text) {
    auto r = ExpandMatrix(json::parse(text));
    EXPECT_FALSE(r.ok()) << text;
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_THAT(error(R"({"branches": ["main"]})"), HasSubstr("'branches': unknown"));
  EXPECT_THAT(error(R"({"precision": []})"), HasSubstr("'precision': an empty list"));
  EXPECT_THAT(error(R"({"checkpoints": [3]})"), HasSubstr("'checkpoints[0]'"));
  EXPECT_THAT(error(R"({"checkpoints": [{"checkpoint": "/a", "ref": "/b"}]})"),
              HasSubstr("'checkpoints[0].ref'"));
  EXPECT_THAT(error(R"({"branch": "main", "base": {"branch": "dev"}})"),
              HasSubstr("'branch': given both as an axis and in 'base'"));
  EXPECT_THAT(error(R"({"base": 1})"), HasSubstr("'base'"));
  EXPECT_THAT(error(R"({"checkpoints": ["/a"], "base": {"reference": "/r"}})"),
              HasSubstr("'checkpoints': an axis while 'base' sets checkpoint or reference"));
  json big = {{"branch", json::array()}, {"precision", json::array()}};
  for (int i = 0; i < 20; ++i) big["branch"].push_back("b" + std::to_string(i));
  for (int i = 0; i < 20; ++i) big["precision"].push_back("p" + std::to_string(i));
  auto r = ExpandMatrix(big);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("expands to 400 cells by axis 'precision' (with the axes before it); at most 256"));
}

TEST(ApiClient, AnUnreachableControllerIsNamed) {
  // Port 1 on loopback: nothing listens there (a privileged port no test binds).
  ApiClient api(ControllerUrl{false, "127.0.0.1", 1}, "token");
  auto r = api.Call("GET", "/api/v1/cells");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("http://127.0.0.1:1"));
}

}  // namespace
}  // namespace gatehouse::cli
