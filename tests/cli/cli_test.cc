// The `gatehouse` CLI's parts that need no controller: controller URLs, the exit code CI acts
// on, progress lines, JUnit XML (checked well-formed by Python's XML parser), an unreachable
// controller named in the error, and a submit posted again while the controller answers 202
// "resolving" (PostCell, and the binary against a fake controller of canned answers). The CLI
// against a real controller, agent and worker is in tests/e2e/e2e_test.cc.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/api_client.h"
#include "cli/body_flags.h"
#include "cli/matrix.h"
#include "cli/submit.h"
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

// Verifies that a cell ending without a verdict says why under its end line, and a verdict
// does not repeat what its phase lines said.
TEST(Verdict, EndLinesCarryTheReasonOfACellWithoutVerdict) {
  json cell = {{"id", std::string(64, 'a')}, {"status", "error"},
               {"attempts", json::array({{{"reason", "lost"}},
                                         {{"reason", "build failed: pip resolve exited with "
                                                     "code 1:\nERROR: No matching distribution"}}})}};
  EXPECT_THAT(EndLines(cell),
              ElementsAre(std::string(64, 'a') + " error",
                          "  build failed: pip resolve exited with code 1:",
                          "  ERROR: No matching distribution"));
  cell["status"] = "failed";
  EXPECT_THAT(EndLines(cell), ElementsAre(std::string(64, 'a') + " failed"));
  cell["status"] = "cancelled";
  cell["attempts"] = json::array();
  EXPECT_THAT(EndLines(cell), ElementsAre(std::string(64, 'a') + " cancelled"));
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

// Verifies --mesh: KEY=N items become topology members (the values are the controller's to
// judge), anything else is refused naming the item.
TEST(BodyFlags, MeshFillsTheTopology) {
  Result<json> mesh = ParseMeshFlag("dp_shard=2,tp=2,etp=2");
  ASSERT_TRUE(mesh.ok()) << mesh.status().ToString();
  EXPECT_EQ(*mesh, (json{{"dp_shard", 2}, {"tp", 2}, {"etp", 2}}));
  for (const char* bad : {"", "tp", "tp=", "tp=0", "tp=2,", "zz=2", "tp=2x", "tp=-1", "dp_shard=2,,cp=2"}) {
    Result<json> refused = ParseMeshFlag(bad);
    EXPECT_FALSE(refused.ok()) << bad;
    if (!refused.ok()) EXPECT_THAT(refused.status().message(), HasSubstr("is not KEY=N"));
  }
  EXPECT_THAT(ParseMeshFlag("tp=2,zz=3").status().message(), HasSubstr("'zz=3'"));
  // CLI11 puts the option's name in front: the message does not repeat it.
  EXPECT_EQ(ParseMeshFlag("ep=0").status().message().rfind("'ep=0' is not KEY=N", 0), 0u);
  // Through the command line: --tp, when also given, wins for tp.
  CLI::App app;
  BodyFlags flags;
  AddBodyFlags(app, flags);
  app.parse(std::vector<std::string>{"2", "--tp", "dp_shard=4,cp=2,tp=4", "--mesh"});
  json body = {{"topology", {{"pp", 2}}}};
  ApplyBodyFlags(flags, body);
  EXPECT_EQ(body["topology"], (json{{"pp", 2}, {"dp_shard", 4}, {"cp", 2}, {"tp", 2}}));
  CLI::App strict;
  BodyFlags unused;
  AddBodyFlags(strict, unused);
  EXPECT_THROW(strict.parse(std::vector<std::string>{"tp=two", "--mesh"}), CLI::ValidationError);
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

// A 202 "resolving" answer of POST /api/v1/cells (docs/protocols.md §1).
ApiResponse Resolving(const std::string& reason, int retry_after_s = 1) {
  return {202, json{{"state", "resolving"}, {"reason", reason}, {"bytes_hashed", 0},
                    {"bytes_total", 2000000000}, {"retry_after_s", retry_after_s}}
                   .dump()};
}

// PostCell with canned answers and a fake clock that `sleep` advances.
struct FakePoster {
  std::vector<ApiResponse> answers;
  size_t posts = 0;
  std::vector<std::chrono::seconds> slept;
  std::chrono::steady_clock::time_point clock{};

  PostCellOptions Options(std::chrono::seconds timeout = std::chrono::hours(1)) {
    PostCellOptions o;
    o.post = [this]() -> Result<ApiResponse> {
      return answers.at(std::min(posts++, answers.size() - 1));
    };
    o.sleep = [this](std::chrono::milliseconds d) {
      slept.push_back(std::chrono::duration_cast<std::chrono::seconds>(d));
      clock += d;
    };
    o.now = [this] { return clock; };
    o.deadline = clock + timeout;
    return o;
  }
};

TEST(PostCell, PostsAgainWhileResolvingAndSaysEachNewReasonOnce) {
  // Verifies a 202 "resolving" is posted again after its retry_after_s, its reason written
  // once per change, and the first other answer (the cell) returned.
  FakePoster fake;
  fake.answers = {Resolving("digesting checkpoint '/c': 0.0 of 2.0 GB hashed (0 of 1 file)", 2),
                  Resolving("digesting checkpoint '/c': 0.0 of 2.0 GB hashed (0 of 1 file)"),
                  Resolving("digesting checkpoint '/c': 1.0 of 2.0 GB hashed (0 of 1 file)", 0),
                  {201, Cell("queued").dump()}};
  std::ostringstream progress;
  auto r = PostCell(fake.Options(), progress);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(fake.posts, 4u);
  using std::chrono::seconds;
  EXPECT_THAT(fake.slept, ElementsAre(seconds(2), seconds(1), seconds(1)));  // 0 means 1
  EXPECT_EQ(progress.str(),
            "gatehouse: resolving: digesting checkpoint '/c': 0.0 of 2.0 GB hashed (0 of 1 file)\n"
            "gatehouse: resolving: digesting checkpoint '/c': 1.0 of 2.0 GB hashed (0 of 1 file)\n");
}

TEST(PostCell, GivesUpAtTheDeadlineNamingTheReason) {
  FakePoster fake;
  fake.answers = {Resolving("digesting reference '/r': 0 of 10 B hashed (0 of 1 file)")};
  std::ostringstream progress;
  auto r = PostCell(fake.Options(std::chrono::seconds(5)), progress);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("still resolving: digesting reference '/r'"));
  EXPECT_EQ(fake.posts, 6u);  // at 0, 1, ..., 5 s; a sixth wait would pass the deadline
}

TEST(PostCell, AnyOtherAnswerIsReturnedAsIs) {
  for (const ApiResponse& answer :
       {ApiResponse{400, R"({"error": "unknown field 'x'"})"}, ApiResponse{200, "{}"},
        ApiResponse{202, R"({"id": "a"})"}, ApiResponse{202, "not json"}}) {
    FakePoster fake;
    fake.answers = {answer};
    std::ostringstream progress;
    auto r = PostCell(fake.Options(), progress);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, answer.status);
    EXPECT_EQ(fake.posts, 1u);
    EXPECT_EQ(progress.str(), "");
  }
  PostCellOptions unreachable;
  unreachable.post = [] { return Result<ApiResponse>(Status::Unavailable("controller down")); };
  std::ostringstream progress;
  EXPECT_EQ(PostCell(unreachable, progress).status().code(), StatusCode::kUnavailable);
}

// A controller on 127.0.0.1 that answers each request with the next canned answer (the last
// one again when they run out) and records the requests' bodies.
class CannedController {
 public:
  explicit CannedController(std::vector<ApiResponse> answers) : answers_(std::move(answers)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~CannedController() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  int port() const { return port_; }
  std::vector<std::string> bodies() {
    std::lock_guard lock(mu_);
    return bodies_;
  }

 private:
  void Serve() {
    for (size_t n = 0;; ++n) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string in;
      char buf[4096];
      size_t end = std::string::npos, length = 0;
      while (end == std::string::npos || in.size() < end + 4 + length) {
        const ssize_t got = ::recv(c, buf, sizeof(buf), 0);
        if (got <= 0) break;
        in.append(buf, static_cast<size_t>(got));
        if (end == std::string::npos && (end = in.find("\r\n\r\n")) != std::string::npos) {
          const size_t at = in.find("Content-Length: ");
          if (at != std::string::npos && at < end) length = std::stoul(in.substr(at + 16));
        }
      }
      const ApiResponse& a = answers_[std::min(n, answers_.size() - 1)];
      {
        std::lock_guard lock(mu_);
        bodies_.push_back(end == std::string::npos ? "" : in.substr(end + 4));
      }
      const std::string out = "HTTP/1.1 " + std::to_string(a.status) +
                              " X\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(a.body.size()) + "\r\nConnection: close\r\n\r\n" +
                              a.body;
      ::send(c, out.data(), out.size(), MSG_NOSIGNAL);
      ::close(c);
    }
  }

  std::vector<ApiResponse> answers_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> bodies_;
};

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

// Runs the `gatehouse` binary against 127.0.0.1:`port` with `args`.
CliRun RunCli(int port, const std::string& args) {
  test_util::TempDir dir("gatehouse-cli");
  const std::string cmd = "GATEHOUSE_TOKEN=t '" + std::string(GATEHOUSE_CLI) +
                          "' --controller http://127.0.0.1:" + std::to_string(port) + " " + args +
                          " >" + (dir.path() / "out").string() + " 2>" +
                          (dir.path() / "err").string();
  const int rc = std::system(cmd.c_str());
  CliRun run;
  run.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::stringstream out, err;
  out << std::ifstream(dir.path() / "out").rdbuf();
  err << std::ifstream(dir.path() / "err").rdbuf();
  run.out = out.str();
  run.err = err.str();
  return run;
}

// Verifies Fetch hands a 2xx body to the sink in pieces of at most 1 MiB, in order, keeping
// none of it; another status's body comes back as the error text without reaching the sink;
// a sink error stops the transfer and is returned.
TEST(ApiClient, FetchHandsTheBodyOverInPieces) {
  std::string blob(size_t{3} << 20, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 7 + i / 4096);
  CannedController fake({{200, blob}, {404, R"({"error":"artifact sha256:00 is not stored"})"},
                         {200, blob}});
  const ApiClient api(ControllerUrl{false, "127.0.0.1", fake.port()}, "t");
  std::string got;
  size_t pieces = 0, largest = 0;
  auto ok = api.Fetch("/api/v1/artifacts/x", [&](std::string_view piece) {
    got.append(piece);
    ++pieces;
    largest = std::max(largest, piece.size());
    return Status::Ok();
  });
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->status, 200);
  EXPECT_TRUE(ok->body.empty());
  EXPECT_TRUE(got == blob) << got.size() << " of " << blob.size() << " bytes";
  EXPECT_GE(pieces, 3u);
  EXPECT_LE(largest, size_t{1} << 20);

  bool called = false;
  auto missing = api.Fetch("/api/v1/artifacts/y", [&](std::string_view) {
    called = true;
    return Status::Ok();
  });
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);
  EXPECT_THAT(missing->body, HasSubstr("is not stored"));
  EXPECT_FALSE(called);

  auto refused = api.Fetch("/api/v1/artifacts/z", [](std::string_view) {
    return Status::Internal("disk full");
  });
  EXPECT_EQ(refused.status().code(), StatusCode::kInternal);
  EXPECT_THAT(refused.status().message(), HasSubstr("disk full"));
}

TEST(SubmitCommand, PostsTheSameBodyAgainUntilTheCellIsResolved) {
  // Verifies `gatehouse submit` and `gatehouse reference` post the same body again after a
  // 202 "resolving", print each reason once on stderr (stdout keeps the id line first), and
  // print the cell once the controller answers it.
  json cell = Cell("queued");
  cell["created"] = true;
  for (const char* args : {"submit --repository /r --branch main --family llama --checkpoint /c",
                           "reference --checkpoint /c"}) {
    CannedController controller({Resolving("digesting checkpoint '/c': 0 of 9 B hashed (0 of 1 file)"),
                                 Resolving("digesting checkpoint '/c': 4 of 9 B hashed (0 of 1 file)"),
                                 {201, cell.dump()}});
    const CliRun run = RunCli(controller.port(), args);
    EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_EQ(run.out, std::string(64, 'a') + " created queued\n");
    EXPECT_EQ(run.err,
              "gatehouse: resolving: digesting checkpoint '/c': 0 of 9 B hashed (0 of 1 file)\n"
              "gatehouse: resolving: digesting checkpoint '/c': 4 of 9 B hashed (0 of 1 file)\n");
    const std::vector<std::string> bodies = controller.bodies();
    ASSERT_EQ(bodies.size(), 3u);
    EXPECT_EQ(json::parse(bodies[0])["checkpoint"], "/c");
    EXPECT_EQ(bodies[1], bodies[0]);
    EXPECT_EQ(bodies[2], bodies[0]);
  }
}

TEST(SubmitCommand, StillResolvingAtTimeoutExits4) {
  CannedController controller({Resolving("digesting checkpoint '/c': 0 of 9 B hashed (0 of 1 file)")});
  const CliRun run = RunCli(controller.port(),
                            "submit --repository /r --branch main --family llama --checkpoint /c "
                            "--timeout-s 1");
  EXPECT_EQ(run.exit_code, kExitTimeout) << run.out << run.err;
  EXPECT_EQ(run.out, "");
  EXPECT_THAT(run.err, HasSubstr("still resolving: digesting checkpoint '/c'"));
  EXPECT_THAT(run.err, HasSubstr("after 1 s (--timeout-s)"));
}

TEST(LogsCommand, AStreamTheEndedAttemptNeverWroteIsAnErrorNamingTheOnesItHas) {
  CannedController controller(
      {{404, R"json({"error":"cell 'x' attempt 1 has no log stream 'nope' (it has build, worker)"})json"}});
  const CliRun run = RunCli(controller.port(), "logs " + std::string(64, 'a') + " --stream nope");
  EXPECT_EQ(run.exit_code, kExitUsage) << run.out << run.err;
  EXPECT_EQ(run.out, "");
  EXPECT_THAT(run.err, HasSubstr("HTTP 404"));
  EXPECT_THAT(run.err, HasSubstr("has no log stream 'nope' (it has build, worker)"));
}

TEST(VersionFlag, PrintsTheProjectVersion) {
  const CliRun run = RunCli(1, "--version");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, ::testing::MatchesRegex("gatehouse [0-9]+\\.[0-9]+\\.[0-9]+\n"));
}

}  // namespace
}  // namespace gatehouse::cli
