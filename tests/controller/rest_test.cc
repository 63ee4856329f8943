// Verifies the REST API end to end over real sockets (server on 127.0.0.1, ephemeral port):
// submit/list/get/report/log shapes, error codes and messages, the body limit, static files
// without path traversal, and that the server keeps serving after bad requests.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/sha256.h"
#include "controller/auth.h"
#include "controller/controller_core.h"
#include "controller/http_gzip.h"
#include "controller/http_server.h"
#include "controller/rest_api.h"
#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

using nlohmann::json;
using testing::TempDir;

struct Reply {
  int status = 0;
  std::string head;
  std::string body;
};

// Sends raw bytes on a fresh connection and reads until the server closes it.
Reply RawRequest(uint16_t port, const std::string& bytes) {
  Reply reply;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  // A server that never answers must fail the test in seconds, not hang it.
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return reply;
  }
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer and stop reading early (413)
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string raw;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
    raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t split = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || split == std::string::npos) return reply;
  reply.status = std::stoi(raw.substr(9, 3));
  reply.head = raw.substr(0, split);
  reply.body = raw.substr(split + 4);
  return reply;
}

Reply Http(uint16_t port, const std::string& method, const std::string& target,
           const std::string& body = "", const std::string& extra_headers = "") {
  std::string req = method + " " + target +
                    " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (!body.empty() || method == "POST") {
    req +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return RawRequest(port, req + "\r\n" + body);
}

using FakeChannel = testing::RecordingChannel;

class RestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::MakeCheckpoint(dir_.path());
    testing::WriteFile(dir_.path() / "web" / "index.html", "<h1>cells</h1>");
    testing::WriteFile(dir_.path() / "web" / "app.js", "poll();");
    testing::WriteFile(dir_.path() / "secret.txt", "do not serve");
    std::filesystem::create_symlink(dir_.path() / "secret.txt", dir_.path() / "web" / "leak.txt");
    auto store = Store::Open((dir_.path() / "g.db").string(), SystemClock());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    core_ = std::make_unique<ControllerCore>(*store_, freezer_);
    auth_ = std::make_unique<Authenticator>(*store_, auth_config_);
    api_ = std::make_unique<RestApi>(*core_, *auth_, dir_.path() / "web");
    auto server = HttpServer::Start({}, [this](const HttpRequest& r) { return api_->Handle(r); });
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    port_ = server_->port();
  }

  std::string SubmitBody(const std::string& branch = "main") const {
    return json{{"repository", "/repos/adapt"},
                {"branch", branch},
                {"model_family", "llama"},
                {"checkpoint", (dir_.path() / "ckpt").string()},
                {"reference", (dir_.path() / "reference").string()}}
        .dump();
  }

  struct Submitted {
    json cell;
    std::string id;
    int64_t attempt = 0;  // the attempt assigned to agent-1 (0 when none was)
  };
  // Connects agent-1 through `channel`, submits a cell and returns it with its attempt.
  Submitted SubmitToAgent(const std::shared_ptr<FakeChannel>& channel) {
    const AgentHello hello{"agent-1", "{}", 1};
    EXPECT_TRUE(core_->RegisterAgent(hello).ok());
    EXPECT_TRUE(core_->AttachAgent("agent-1", hello, channel).ok());
    Submitted s;
    s.cell = json::parse(Http(port_, "POST", "/api/v1/cells", SubmitBody()).body);
    s.id = s.cell["id"];
    EXPECT_EQ(channel->sent.size(), 1u);
    if (!channel->sent.empty()) s.attempt = channel->sent[0].attempt_id;
    return s;
  }

  // Records `events` for agent-1's `attempt` with seq 1, 2, ...
  void RecordEvents(int64_t attempt, const std::vector<std::string>& events) {
    for (size_t i = 0; i < events.size(); ++i) {
      ASSERT_TRUE(
          core_->RecordEvent("agent-1", attempt, static_cast<int64_t>(i + 1), events[i]).ok())
          << events[i];
    }
  }

  TempDir dir_;
  testing::FakeCommitResolver resolver_;
  DigestCache digests_;
  CellFreezer freezer_{SubmitContext{}, resolver_, digests_};
  std::unique_ptr<Store> store_;
  std::unique_ptr<ControllerCore> core_;
  AuthConfig auth_config_{.required = false};  // RestAuthTest turns tokens on
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<RestApi> api_;
  std::unique_ptr<HttpServer> server_;
  uint16_t port_ = 0;
};

TEST_F(RestTest, SubmitCreatesOnceThenReturnsTheSameCell) {
  // Verifies POST gives 201 created:true, the same inputs 200 created:false; GET returns it.
  Reply first = Http(port_, "POST", "/api/v1/cells", SubmitBody(), "X-Gatehouse-Submitter: ci\r\n");
  ASSERT_EQ(first.status, 201) << first.body;
  json cell = json::parse(first.body);
  EXPECT_TRUE(cell["created"].get<bool>());
  EXPECT_EQ(cell["status"], "queued");
  EXPECT_EQ(cell["labels"]["branch"], "main");
  EXPECT_EQ(cell["labels"]["submitter"], "ci");
  EXPECT_EQ(cell["spec"]["commit"], testing::FakeCommitResolver::kSha);
  EXPECT_EQ(cell["attempts"].size(), 1u);
  EXPECT_EQ(cell["attempts"][0]["number"], 1);
  EXPECT_EQ(cell["attempts"][0]["agent"], nullptr);
  EXPECT_TRUE(cell["phases"].empty());

  Reply again = Http(port_, "POST", "/api/v1/cells", SubmitBody());
  ASSERT_EQ(again.status, 200) << again.body;
  json same = json::parse(again.body);
  EXPECT_FALSE(same["created"].get<bool>());
  EXPECT_EQ(same["id"], cell["id"]);

  Reply got = Http(port_, "GET", "/api/v1/cells/" + cell["id"].get<std::string>());
  ASSERT_EQ(got.status, 200);
  EXPECT_NE(got.head.find("Content-Type: application/json"), std::string::npos);
  EXPECT_EQ(json::parse(got.body)["spec"], cell["spec"]);
}

TEST_F(RestTest, ASubmitIs202WhileItsCheckpointIsDigestedThenTheCell) {
  // Verifies a checkpoint with more to hash than the inline limit (16 MiB) answers 202
  // {"state": "resolving", reason, bytes, retry_after_s} with Retry-After and stores nothing
  // (a body naming an unknown control is still a 400); once its digest is known the same body
  // is 201 created, then 200.
  const std::filesystem::path ckpt = dir_.path() / "ckpt";
  {
    std::ofstream(ckpt / "model-00002.safetensors");
  }
  std::filesystem::resize_file(ckpt / "model-00002.safetensors", 17 << 20);  // sparse
  testing::Backdate(ckpt);
  json unknown_control = json::parse(SubmitBody());
  unknown_control["control"] = std::string(64, 'f');  // refused before any digest is known
  const Reply refused = Http(port_, "POST", "/api/v1/cells", unknown_control.dump());
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("field 'control'"), std::string::npos) << refused.body;
  const Reply pending = Http(port_, "POST", "/api/v1/cells", SubmitBody());
  ASSERT_EQ(pending.status, 202) << pending.body;
  EXPECT_NE(pending.head.find("Retry-After: 1"), std::string::npos) << pending.head;
  const json answer = json::parse(pending.body);
  EXPECT_EQ(answer["state"], "resolving");
  EXPECT_EQ(answer["reason"].get<std::string>().rfind("digesting checkpoint '" + ckpt.string() + "': ", 0),
            0u)
      << answer.dump();
  EXPECT_GE(answer["bytes_total"].get<int64_t>(), 17 << 20);
  EXPECT_LE(answer["bytes_hashed"].get<int64_t>(), answer["bytes_total"].get<int64_t>());
  EXPECT_EQ(answer["retry_after_s"], 1);
  EXPECT_TRUE(json::parse(Http(port_, "GET", "/api/v1/cells").body)["cells"].empty());

  ASSERT_TRUE(digests_.Digest(ckpt).ok());  // the job ended
  const Reply created = Http(port_, "POST", "/api/v1/cells", SubmitBody());
  ASSERT_EQ(created.status, 201) << created.body;
  const json cell = json::parse(created.body);
  EXPECT_EQ(cell["spec"]["checkpoint"]["digest"], DirectoryDigest(ckpt).value());
  const Reply again = Http(port_, "POST", "/api/v1/cells", SubmitBody());
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(json::parse(again.body)["id"], cell["id"]);
  EXPECT_EQ(json::parse(Http(port_, "GET", "/api/v1/cells").body)["cells"].size(), 1u);
}

TEST_F(RestTest, BadSubmissionsAreRejectedWithMessagesNamingTheProblem) {
  // Verifies bad JSON/fields/values are 400 and unknown branch/path 404, naming the culprit.
  Reply malformed = Http(port_, "POST", "/api/v1/cells", "{\"repository\": ");
  EXPECT_EQ(malformed.status, 400);
  EXPECT_NE(json::parse(malformed.body)["error"].get<std::string>().find("not valid JSON"),
            std::string::npos);

  json body = json::parse(SubmitBody());
  body["flavour"] = "extra";
  Reply unknown = Http(port_, "POST", "/api/v1/cells", body.dump());
  EXPECT_EQ(unknown.status, 400);
  EXPECT_EQ(json::parse(unknown.body)["error"], "unknown field 'flavour'");

  body = json::parse(SubmitBody());
  body["topology"] = {{"tp", -2}};
  Reply bad_value = Http(port_, "POST", "/api/v1/cells", body.dump());
  EXPECT_EQ(bad_value.status, 400);
  EXPECT_NE(bad_value.body.find("topology.tp"), std::string::npos);
  EXPECT_NE(bad_value.body.find("-2"), std::string::npos);

  Reply no_branch = Http(port_, "POST", "/api/v1/cells", SubmitBody("missing"));
  EXPECT_EQ(no_branch.status, 404);
  EXPECT_NE(no_branch.body.find("branch 'missing'"), std::string::npos);

  body = json::parse(SubmitBody());
  body["checkpoint"] = "/no/such/ckpt";
  Reply no_ckpt = Http(port_, "POST", "/api/v1/cells", body.dump());
  EXPECT_EQ(no_ckpt.status, 404);
  EXPECT_NE(no_ckpt.body.find("/no/such/ckpt"), std::string::npos);

  EXPECT_EQ(Http(port_, "GET", "/healthz").status, 200);
}

TEST_F(RestTest, LargeAnswersAreGzippedForClientsThatAcceptIt) {
  // Verifies the server compresses over the wire: the same document, gzip-encoded (with
  // Content-Encoding and Vary) when the client accepts gzip, plain otherwise or when refused.
  Reply plain = Http(port_, "GET", "/api/v1/openapi.json");
  ASSERT_EQ(plain.status, 200);
  ASSERT_GT(plain.body.size(), 1024u);
  EXPECT_EQ(plain.head.find("Content-Encoding"), std::string::npos) << plain.head;
  EXPECT_NE(plain.head.find("Vary: Accept-Encoding"), std::string::npos) << plain.head;
  Reply packed = Http(port_, "GET", "/api/v1/openapi.json", "",
                      "Accept-Encoding: gzip, deflate, br\r\n");
  ASSERT_EQ(packed.status, 200);
  EXPECT_NE(packed.head.find("Content-Encoding: gzip"), std::string::npos) << packed.head;
  EXPECT_NE(packed.head.find("Content-Length: " + std::to_string(packed.body.size())),
            std::string::npos)
      << packed.head;
  auto expected = Gzip(plain.body);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(packed.body, *expected);
  EXPECT_LT(packed.body.size(), plain.body.size() / 3);
  Reply refused = Http(port_, "GET", "/api/v1/openapi.json", "", "Accept-Encoding: gzip;q=0\r\n");
  EXPECT_EQ(refused.body, plain.body);
  // HEAD: the headers a GET with the same Accept-Encoding gets, no body.
  Reply head = Http(port_, "HEAD", "/api/v1/openapi.json", "", "Accept-Encoding: gzip\r\n");
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty());
  EXPECT_NE(head.head.find("Content-Encoding: gzip"), std::string::npos) << head.head;
  EXPECT_NE(head.head.find("Content-Length: " + std::to_string(packed.body.size())),
            std::string::npos)
      << head.head;
}

TEST_F(RestTest, CancelEndpoint) {
  // Verifies POST /api/v1/cells/{id}/cancel: 202 with the cell, the running attempt's agent is
  // sent a Cancel with the given reason; a queued cell shows why it waits; wrong method 405,
  // unknown field 400, unknown cell 404, an ended cell 409.
  auto channel = std::make_shared<FakeChannel>();
  const Submitted s = SubmitToAgent(channel);
  EXPECT_EQ(s.cell["waiting_reason"], nullptr);
  json other = json::parse(SubmitBody());
  other["precision"] = "bf16";
  const json queued = json::parse(Http(port_, "POST", "/api/v1/cells", other.dump()).body);
  EXPECT_EQ(queued["waiting_reason"], "no free slot on any agent");
  const std::string path = "/api/v1/cells/" + s.id + "/cancel";
  EXPECT_EQ(Http(port_, "GET", path).status, 405);
  EXPECT_EQ(Http(port_, "POST", path, R"({"why":"x"})").status, 400);
  EXPECT_EQ(Http(port_, "POST", path, R"({"reason":7})").status, 400);
  EXPECT_EQ(Http(port_, "POST", "/api/v1/cells/nope/cancel").status, 404);
  const Reply reply = Http(port_, "POST", path, R"j({"reason":"superseded; $(rm -rf /)"})j");
  ASSERT_EQ(reply.status, 202) << reply.body;
  EXPECT_EQ(json::parse(reply.body)["attempts"][0]["cancel_reason"],
            "cancelled: superseded; $(rm -rf /)");
  ASSERT_EQ(channel->cancels.size(), 1u);
  EXPECT_EQ(channel->cancels[0].first, s.attempt);
  ASSERT_TRUE(core_->EndAttempt("agent-1", s.attempt, "error", "stopped", 143).ok());
  const json ended = json::parse(Http(port_, "GET", "/api/v1/cells/" + s.id).body);
  EXPECT_EQ(ended["status"], "cancelled");
  EXPECT_EQ(Http(port_, "POST", path).status, 409);

  // A cancelled cell can be run again: POST .../retry queues attempt 2 (202); retrying it
  // while that attempt is queued is 409; unknown cell 404; GET 405.
  const std::string retry = "/api/v1/cells/" + s.id + "/retry";
  EXPECT_EQ(Http(port_, "GET", retry).status, 405);
  EXPECT_EQ(Http(port_, "POST", "/api/v1/cells/nope/retry").status, 404);
  const Reply retried = Http(port_, "POST", retry);
  ASSERT_EQ(retried.status, 202) << retried.body;
  const json again = json::parse(retried.body);
  ASSERT_EQ(again["attempts"].size(), 2u);
  EXPECT_EQ(again["attempts"][1]["retry_of"], s.attempt);
  EXPECT_EQ(Http(port_, "POST", retry).status, 409);
  // The cancelled attempt's end was recorded for the webhook (none configured here).
  EXPECT_EQ(again["webhook_deliveries"].size(), 1u);

  // Readiness: each cell's combination, its commit unverified while nothing has a verdict.
  const Reply readiness = Http(port_, "GET", "/api/v1/readiness");
  ASSERT_EQ(readiness.status, 200) << readiness.body;
  const json combinations = json::parse(readiness.body)["combinations"];
  ASSERT_EQ(combinations.size(), 2u) << readiness.body;  // bf16 and fp32
  EXPECT_EQ(combinations[1]["precision"], "fp32");
  ASSERT_EQ(combinations[1]["commits"].size(), 1u);
  EXPECT_EQ(combinations[1]["commits"][0]["cell"], s.id);
  EXPECT_EQ(combinations[1]["commits"][0]["readiness"], "unverified");
  EXPECT_EQ(Http(port_, "POST", "/api/v1/readiness").status, 405);

  // The matrix: both cells' squares in one row (one family and checkpoint), filtered by status
  // and refusing a malformed filter with the parameter and value named.
  const Reply matrix = Http(port_, "GET", "/api/v1/matrix");
  ASSERT_EQ(matrix.status, 200) << matrix.body;
  const json m = json::parse(matrix.body);
  ASSERT_EQ(m["rows"].size(), 1u) << matrix.body;
  ASSERT_EQ(m["columns"].size(), 2u) << matrix.body;
  const std::string fp32_key = m["columns"][1]["key"];
  EXPECT_EQ(m["columns"][1]["precision"], "fp32");
  EXPECT_EQ(m["rows"][0]["squares"][fp32_key]["cell"], s.id);
  EXPECT_EQ(m["rows"][0]["squares"][fp32_key]["status"], "queued");
  EXPECT_EQ(m["rows"][0]["readiness"], "unverified");
  EXPECT_EQ(m["choices"]["model_families"], json::array({"llama"}));
  const json by_status = json::parse(Http(port_, "GET", "/api/v1/matrix?status=queued").body);
  // The other cell's attempt is leased to the fake agent; s's retry waits for a slot.
  ASSERT_EQ(by_status["rows"][0]["squares"].size(), 1u) << by_status.dump();
  EXPECT_EQ(by_status["rows"][0]["squares"][fp32_key]["cell"], s.id);
  EXPECT_EQ(by_status["columns"].size(), 1u);
  EXPECT_EQ(by_status["filter"]["status"], "queued");
  // A queued square says why it waits, as the cell does.
  const json waiting = json::parse(Http(port_, "GET", "/api/v1/cells/" + s.id).body);
  ASSERT_TRUE(waiting["waiting_reason"].is_string()) << waiting.dump();
  EXPECT_EQ(by_status["rows"][0]["squares"][fp32_key]["waiting_reason"], waiting["waiting_reason"]);
  EXPECT_TRUE(json::parse(Http(port_, "GET", "/api/v1/matrix?status=passed").body)["rows"].empty());
  EXPECT_TRUE(json::parse(Http(port_, "GET", "/api/v1/matrix?model_family=qwen3").body)["rows"].empty());
  const Reply bad_status = Http(port_, "GET", "/api/v1/matrix?status=great");
  EXPECT_EQ(bad_status.status, 400);
  EXPECT_NE(bad_status.body.find("'status'"), std::string::npos) << bad_status.body;
  EXPECT_NE(bad_status.body.find("great"), std::string::npos) << bad_status.body;
  EXPECT_EQ(Http(port_, "GET", "/api/v1/matrix?commit=abc").status, 400);
}

TEST_F(RestTest, UnknownCellIs404WithItsId) {
  // Verifies unknown cells, routes and methods answer 404/405 with a JSON error.
  Reply r = Http(port_, "GET", "/api/v1/cells/feedbeef");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(json::parse(r.body)["error"], "cell 'feedbeef' not found");
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells/feedbeef/report").status, 404);
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells/feedbeef/log").status, 404);
  EXPECT_EQ(Http(port_, "GET", "/api/v1/nothing").status, 404);
  EXPECT_EQ(Http(port_, "DELETE", "/api/v1/cells/feedbeef").status, 405);
}

// Verifies the route table is the one source of scopes and of the 405's Allow header: each
// route's scope, the strongest scope of a known path for a method it lacks, the method list of
// the path in Allow, HEAD on a GET route, and open routes needing no token.
TEST_F(RestTest, RouteTableGivesScopesAndAllow) {
  std::set<std::pair<std::string_view, std::string_view>> seen;
  for (const Route& route : RestApi::Routes()) {
    EXPECT_TRUE(seen.insert({route.method, route.pattern}).second) << route.pattern;
    EXPECT_FALSE(route.name.empty()) << route.pattern;
    if (route.pattern.rfind("/api/v1/", 0) == 0 && route.name != "openapi") {
      EXPECT_TRUE(route.scope.has_value()) << route.name << " holds data but asks no token";
    }
  }
  EXPECT_EQ(RequiredScope("GET", "/api/v1/cells"), Scope::kRead);
  EXPECT_EQ(RequiredScope("HEAD", "/api/v1/cells/abc"), Scope::kRead);
  EXPECT_EQ(RequiredScope("POST", "/api/v1/cells"), Scope::kSubmit);
  EXPECT_EQ(RequiredScope("POST", "/api/v1/cells/abc/cancel"), Scope::kSubmit);
  EXPECT_EQ(RequiredScope("GET", "/api/v1/cells/abc/cancel"), Scope::kSubmit);
  EXPECT_EQ(RequiredScope("PUT", "/api/v1/agents"), Scope::kSubmit);
  EXPECT_EQ(RequiredScope("GET", "/api/v1/tokens"), Scope::kAdmin);
  EXPECT_EQ(RequiredScope("GET", "/api/v1/tokens/3"), Scope::kAdmin);
  EXPECT_EQ(RequiredScope("GET", "/api/v1/designated-branches"), Scope::kRead);
  EXPECT_EQ(RequiredScope("PUT", "/api/v1/designated-branches"), Scope::kAdmin);
  EXPECT_EQ(RequiredScope("DELETE", "/api/v1/designated-branches"), Scope::kAdmin);
  EXPECT_EQ(RequiredScope("GET", "/api/v1/nothing"), Scope::kRead);
  EXPECT_EQ(RequiredScope("DELETE", "/api/v1/nothing"), Scope::kSubmit);
  EXPECT_EQ(RequiredScope("GET", "/healthz"), std::nullopt);
  EXPECT_EQ(RequiredScope("GET", "/api/v1/openapi.json"), std::nullopt);
  EXPECT_EQ(RequiredScope("GET", "/index.html"), std::nullopt);

  Reply r = Http(port_, "DELETE", "/api/v1/cells");
  EXPECT_EQ(r.status, 405);
  EXPECT_NE(r.head.find("Allow: GET, POST\r\n"), std::string::npos) << r.head;
  r = Http(port_, "PUT", "/api/v1/tokens/3");
  EXPECT_EQ(r.status, 405);
  EXPECT_NE(r.head.find("Allow: DELETE\r\n"), std::string::npos) << r.head;
  EXPECT_EQ(Http(port_, "HEAD", "/api/v1/cells").status, 200);
  EXPECT_EQ(Http(port_, "POST", "/healthz").status, 405);
}

TEST_F(RestTest, OversizeAndMalformedRequestsDoNotStopTheServer) {
  // Verifies a body over 1 MiB is 413, garbage is 400, and the server keeps serving.
  const std::string big(2 * 1024 * 1024, 'x');
  Reply over = Http(port_, "POST", "/api/v1/cells", big);
  EXPECT_EQ(over.status, 413);
  EXPECT_NE(over.body.find("1048576"), std::string::npos);

  Reply garbage = RawRequest(port_, "THIS IS NOT HTTP\r\n\r\n");
  EXPECT_EQ(garbage.status, 400);

  Reply health = Http(port_, "GET", "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok");
}

TEST_F(RestTest, ListsCellsNewestFirstWithPaging) {
  // Verifies the cell list shape, newest-first order, limit/offset paging and a bad limit.
  ASSERT_EQ(Http(port_, "POST", "/api/v1/cells", SubmitBody("main")).status, 201);
  ASSERT_EQ(Http(port_, "POST", "/api/v1/cells", SubmitBody("other")).status, 201);
  Reply r = Http(port_, "GET", "/api/v1/cells");
  ASSERT_EQ(r.status, 200);
  json cells = json::parse(r.body)["cells"];
  ASSERT_EQ(cells.size(), 2u);
  EXPECT_EQ(cells[0]["branch"], "other");
  for (const char* key :
       {"id", "status", "model_family", "repository", "branch", "commit", "created_at"}) {
    EXPECT_TRUE(cells[0].contains(key)) << key;
  }
  json page = json::parse(Http(port_, "GET", "/api/v1/cells?limit=1&offset=1").body)["cells"];
  ASSERT_EQ(page.size(), 1u);
  EXPECT_EQ(page[0]["branch"], "main");
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells?limit=abc").status, 400);
}

TEST_F(RestTest, AnAttemptsEvidenceShowsInCellReportAndLog) {
  // Verifies agent events show as phases/figures, status, report table and concatenated log.
  // An agent takes the attempt, reports two phases and finishes with a FAIL.
  auto channel = std::make_shared<FakeChannel>();
  const auto [cell, id, attempt] = SubmitToAgent(channel);
  ASSERT_EQ(channel->sent.size(), 1u);
  EXPECT_EQ(channel->sent[0].cell_id, id);
  EXPECT_EQ(json::parse(channel->sent[0].spec_json), cell["spec"]);
  EXPECT_EQ(json::parse(Http(port_, "GET", "/api/v1/cells/" + id).body)["status"], "leased");

  const std::vector<std::string> events = {
      R"({"event":"phase_start","phase":"identity","ts_ms":1})",
      R"({"event":"figure","phase":"identity","name":"sha","value":"abc","unit":"text"})",
      R"({"event":"phase_end","phase":"identity","status":"PASS","reason":"","classification":"","duration_ms":3,"ts_ms":2})",
      R"({"event":"phase_start","phase":"load","ts_ms":3})",
      R"({"event":"figure","phase":"load","name":"keys_used","value":21,"unit":"count"})",
      R"({"event":"phase_end","phase":"load","status":"FAIL","reason":"missing key lm_head.weight","classification":"adapter_contract","duration_ms":12,"ts_ms":4})",
      R"({"event":"run_end","status":"FAIL","ts_ms":5})",
  };
  RecordEvents(attempt, events);
  EXPECT_EQ(core_->RecordEvent("agent-2", attempt, 99, "{}").code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(core_->RecordLog("agent-1", attempt, "worker", 6, "line 2\n").ok());
  ASSERT_TRUE(core_->RecordLog("agent-1", attempt, "worker", 0, "line1\n").ok());
  ASSERT_TRUE(core_->EndAttempt("agent-1", attempt, "finished", "", 1).ok());
  ASSERT_TRUE(core_->EndAttempt("agent-1", attempt, "error", "resent late", 1).ok());

  json detail = json::parse(Http(port_, "GET", "/api/v1/cells/" + id).body);
  EXPECT_EQ(detail["status"], "failed");
  EXPECT_EQ(detail["attempts"][0]["agent"], "agent-1");
  EXPECT_NE(detail["attempts"][0]["reason"].get<std::string>().find("phase 'load' FAIL"),
            std::string::npos);
  ASSERT_EQ(detail["phases"].size(), 2u);
  EXPECT_EQ(detail["phases"][0]["phase"], "identity");
  EXPECT_EQ(detail["phases"][1]["phase"], "load");
  EXPECT_EQ(detail["phases"][1]["status"], "FAIL");
  EXPECT_EQ(detail["phases"][1]["classification"], "adapter_contract");
  EXPECT_EQ(detail["phases"][1]["duration_ms"], 12);
  EXPECT_EQ(detail["phases"][1]["figures"][0],
            json({{"name", "keys_used"}, {"value", 21}, {"unit", "count"}}));

  Reply report = Http(port_, "GET", "/api/v1/cells/" + id + "/report");
  ASSERT_EQ(report.status, 200);
  EXPECT_NE(report.head.find("text/markdown"), std::string::npos);
  EXPECT_NE(report.body.find("| load | FAIL | keys_used=21 count | missing key lm_head.weight |"),
            std::string::npos)
      << report.body;
  EXPECT_NE(report.body.find(testing::FakeCommitResolver::kSha), std::string::npos);
  EXPECT_NE(report.body.find("| decode | (not reported) |"), std::string::npos);
  EXPECT_NE(report.body.find("\"checkpoint\": \"" + (dir_.path() / "ckpt").string()),
            std::string::npos);

  Reply log = Http(port_, "GET", "/api/v1/cells/" + id + "/log?stream=worker");
  ASSERT_EQ(log.status, 200);
  EXPECT_EQ(log.body, "line1\nline 2\n");
  EXPECT_NE(log.head.find("X-Log-Next-Offset: 13"), std::string::npos) << log.head;
  // Following from an offset: only the bytes after it, and where to ask next.
  Reply tail = Http(port_, "GET", "/api/v1/cells/" + id + "/log?stream=worker&offset=6");
  ASSERT_EQ(tail.status, 200);
  EXPECT_EQ(tail.body, "line 2\n");
  EXPECT_NE(tail.head.find("X-Log-Next-Offset: 13"), std::string::npos) << tail.head;
  Reply past = Http(port_, "GET", "/api/v1/cells/" + id + "/log?stream=worker&offset=13");
  EXPECT_EQ(past.status, 200);
  EXPECT_EQ(past.body, "");
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells/" + id + "/log?offset=-1").status, 400);
  // The attempt ended without a build stream: a 404 naming the streams it has, not an empty
  // log that reads like a silent build.
  Reply missing = Http(port_, "GET", "/api/v1/cells/" + id + "/log?stream=build");
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(missing.body.find("attempt 1 has no log stream 'build' (it has worker)"),
            std::string::npos)
      << missing.body;
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells/" + id + "/log?attempt=2").status, 404);
}

TEST_F(RestTest, OnlyRankZeroEventsAreEvidenceAndRankStreamsAreStored) {
  // Verifies a tensor-parallel attempt: events tagged "rank" > 0 are stored but do not touch the
  // phase table or the verdict, and the per-rank log streams are kept and readable.
  auto channel = std::make_shared<FakeChannel>();
  const auto [cell, id, attempt] = SubmitToAgent(channel);
  ASSERT_EQ(channel->sent.size(), 1u);

  const std::vector<std::string> events = {
      R"({"event":"phase_start","phase":"identity","ts_ms":1,"rank":1})",
      R"({"event":"phase_start","phase":"identity","ts_ms":1,"rank":0})",
      R"({"event":"phase_end","phase":"identity","status":"FAIL","reason":"rank 1 view","classification":"unknown","ts_ms":2,"rank":1})",
      R"({"event":"phase_end","phase":"identity","status":"PASS","ts_ms":2,"rank":0})",
      R"({"event":"phase_start","phase":"load","ts_ms":3,"rank":1})",
      R"({"event":"run_end","status":"FAIL","ts_ms":5,"rank":1})",
      R"({"event":"run_end","status":"PASS","ts_ms":5,"rank":0})",
  };
  RecordEvents(attempt, events);
  ASSERT_TRUE(core_->RecordLog("agent-1", attempt, "worker", 0, "rank 0 log\n").ok());
  ASSERT_TRUE(core_->RecordLog("agent-1", attempt, "worker.rank1", 0, "rank 1 log\n").ok());
  ASSERT_TRUE(
      core_->RecordLog("agent-1", attempt, "worker-stdout.rank1", 0, "rank 1 text\n").ok());
  ASSERT_TRUE(core_->EndAttempt("agent-1", attempt, "finished", "", 0).ok());

  json detail = json::parse(Http(port_, "GET", "/api/v1/cells/" + id).body);
  EXPECT_EQ(detail["status"], "passed");
  ASSERT_EQ(detail["phases"].size(), 1u) << detail["phases"].dump();
  EXPECT_EQ(detail["phases"][0]["phase"], "identity");
  EXPECT_EQ(detail["phases"][0]["status"], "PASS");
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells/" + id + "/log?stream=worker").body,
            "rank 0 log\n");
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells/" + id + "/log?stream=worker.rank1").body,
            "rank 1 log\n");
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells/" + id + "/log?stream=worker-stdout.rank1").body,
            "rank 1 text\n");
}

TEST_F(RestTest, ServesStoredArtifactsByDigestAndListsThemOnTheCell) {
  // Verifies an artifact an attempt stored is served whole by its digest (streamed from the blob
  // store) and listed on its cell; an unknown digest is a 404, a malformed one a 400.
  auto blobs = BlobStore::Open(dir_.path() / "artifacts");
  ASSERT_TRUE(blobs.ok());
  core_->SetBlobStore(blobs->get());
  auto channel = std::make_shared<FakeChannel>();
  AgentHello hello{"agent-1", "{}", 1};
  hello.transformers_version = "5.24.0";
  ASSERT_TRUE(core_->RegisterAgent(hello).ok());
  ASSERT_TRUE(core_->AttachAgent("agent-1", hello, channel).ok());
  Submitted s;  // a reference cell: the cells that store artifacts
  s.cell = json::parse(Http(port_, "POST", "/api/v1/cells",
                            json{{"kind", "reference"}, {"checkpoint", (dir_.path() / "ckpt").string()}}
                                .dump())
                           .body);
  s.id = s.cell["id"];
  ASSERT_EQ(channel->sent.size(), 1u) << s.cell.dump();
  s.attempt = channel->sent[0].attempt_id;
  const std::string bytes(3 << 20, 'x');  // larger than one read buffer
  const std::string digest = "sha256:" + Sha256Hex(bytes);
  auto writer = core_->BeginArtifact("agent-1", s.attempt, "reference/reference.json", digest,
                                     static_cast<int64_t>(bytes.size()));
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  ASSERT_TRUE((*writer)->Append(bytes).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  ASSERT_TRUE(core_->RecordArtifact("agent-1", s.attempt, "reference/reference.json", digest,
                                    static_cast<int64_t>(bytes.size()))
                  .ok());

  const Reply blob = Http(port_, "GET", "/api/v1/artifacts/" + digest);
  EXPECT_EQ(blob.status, 200) << blob.head;
  EXPECT_EQ(blob.body.size(), bytes.size());
  EXPECT_TRUE(blob.body == bytes);
  EXPECT_NE(blob.head.find("application/octet-stream"), std::string::npos) << blob.head;
  EXPECT_EQ(Http(port_, "GET", "/api/v1/artifacts/sha256:" + std::string(64, '0')).status, 404);
  EXPECT_EQ(Http(port_, "GET", "/api/v1/artifacts/md5:abc").status, 400);

  const json cell = json::parse(Http(port_, "GET", "/api/v1/cells/" + s.id).body);
  ASSERT_EQ(cell["artifacts"].size(), 1u) << cell.dump();
  EXPECT_EQ(cell["artifacts"][0]["name"], "reference/reference.json");
  EXPECT_EQ(cell["artifacts"][0]["digest"], digest);
  EXPECT_EQ(cell["artifacts"][0]["attempt_id"], s.attempt);
  const std::string report = Http(port_, "GET", "/api/v1/cells/" + s.id + "/report").body;
  EXPECT_NE(report.find("## Artifacts"), std::string::npos) << report;
  EXPECT_NE(report.find(digest), std::string::npos);
}

TEST_F(RestTest, ServesDashboardFilesAndNothingOutsideTheWebDir) {
  // Verifies dashboard files are served; '..', encoded '..' and outward symlinks are refused.
  Reply index = Http(port_, "GET", "/");
  EXPECT_EQ(index.status, 200);
  EXPECT_EQ(index.body, "<h1>cells</h1>");
  EXPECT_NE(index.head.find("text/html"), std::string::npos);
  EXPECT_EQ(Http(port_, "GET", "/static/app.js").body, "poll();");
  EXPECT_EQ(Http(port_, "GET", "/app.js").status, 200);
  EXPECT_EQ(Http(port_, "GET", "/static/../secret.txt").status, 400);
  EXPECT_EQ(Http(port_, "GET", "/static/%2e%2e/secret.txt").status, 400);
  EXPECT_EQ(Http(port_, "GET", "/static/..%2fsecret.txt").status, 400);
  Reply leak = Http(port_, "GET", "/static/leak.txt");  // a symlink pointing outside
  EXPECT_EQ(leak.status, 404);
  EXPECT_EQ(leak.body.find("do not serve"), std::string::npos);
  EXPECT_EQ(Http(port_, "GET", "/static/absent.css").status, 404);
  EXPECT_EQ(Http(port_, "GET", "/healthz").status, 200);
}

}  // namespace
}  // namespace gatehouse::controller

namespace gatehouse::controller {
namespace {

// Verifies that submits stuck in slow work (a git server that never answers) occupy only the
// write pool: GET requests and /healthz are still answered while every write worker is busy.
TEST(HttpServerPoolsTest, StuckWritesDoNotDelayReads) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  HttpServer::Options options;
  options.handler_threads = 2;
  options.write_handler_threads = 2;
  auto server = HttpServer::Start(options, [released](const HttpRequest& r) {
    HttpResponse response;
    if (r.method == "POST") released.wait();  // stands in for a fetch that never returns
    response.status = 200;
    response.content_type = "text/plain";
    response.body = "ok";
    return response;
  });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const uint16_t port = (*server)->port();
  std::vector<std::thread> writers;
  for (int i = 0; i < 4; ++i) {  // more stuck writes than write workers
    writers.emplace_back([port] { Http(port, "POST", "/api/v1/cells", "{}"); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto start = std::chrono::steady_clock::now();
  Reply health = Http(port, "GET", "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  release.set_value();
  for (auto& t : writers) t.join();
}

}  // namespace
}  // namespace gatehouse::controller

namespace gatehouse::controller {
namespace {

// The same server with bearer tokens required (controller --auth tokens, the default).
class RestAuthTest : public RestTest {
 protected:
  void SetUp() override {
    auth_config_.required = true;
    RestTest::SetUp();
    for (const auto& [name, scopes] :
         std::vector<std::pair<std::string, std::vector<Scope>>>{
             {"reader", {Scope::kRead}},
             {"submitter", {Scope::kSubmit}},
             {"ci", {Scope::kRead, Scope::kSubmit}},
             {"root", {Scope::kAdmin}}}) {
      auto issued = auth_->Issue(name, TokenKind::kApi, scopes);
      ASSERT_TRUE(issued.ok()) << issued.status().ToString();
      secrets_[name] = issued->secret;
    }
    auto agent = auth_->Issue("node-1", TokenKind::kAgent, {});
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    secrets_["node-1"] = agent->secret;
  }

  std::string Bearer(const std::string& name) {
    return "Authorization: Bearer " + secrets_.at(name) + "\r\n";
  }

  std::map<std::string, std::string> secrets_;
};

struct Route {
  std::string method;
  std::string target;
  std::string body;
  Scope needed;
};

TEST_F(RestAuthTest, EveryApiRouteNeedsATokenWithItsScope) {
  // A stored cell, so the cell routes reach their handlers.
  const Reply created =
      Http(port_, "POST", "/api/v1/cells", SubmitBody(), Bearer("submitter"));
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string id = json::parse(created.body)["id"];
  auto victim = auth_->Issue("victim", TokenKind::kApi, {Scope::kRead});  // for DELETE
  ASSERT_TRUE(victim.ok());
  const std::vector<Route> routes = {
      {"GET", "/api/v1/cells", "", Scope::kRead},
      {"POST", "/api/v1/cells", SubmitBody("other"), Scope::kSubmit},
      {"GET", "/api/v1/cells/" + id, "", Scope::kRead},
      {"GET", "/api/v1/cells/" + id + "/report", "", Scope::kRead},
      {"GET", "/api/v1/cells/" + id + "/log?stream=worker", "", Scope::kRead},
      {"POST", "/api/v1/cells/" + id + "/cancel", "{\"reason\": \"test\"}", Scope::kSubmit},
      {"POST", "/api/v1/cells/" + id + "/hide", "{\"reason\": \"test\"}", Scope::kAdmin},
      {"GET", "/api/v1/agents", "", Scope::kRead},
      {"GET", "/api/v1/matrix", "", Scope::kRead},
      {"GET", "/api/v1/readiness?branches=all", "", Scope::kRead},
      {"GET", "/api/v1/designated-branches", "", Scope::kRead},
      {"PUT", "/api/v1/designated-branches?repository=/repos/adapt",
       "{\"branches\": [\"main\"], \"reason\": \"test\"}", Scope::kAdmin},
      {"GET", "/api/v1/tokens", "", Scope::kAdmin},
      {"POST", "/api/v1/tokens", "{\"name\": \"made\", \"scopes\": [\"read\"]}", Scope::kAdmin},
      {"DELETE", "/api/v1/tokens/" + std::to_string(victim->record.id), "", Scope::kAdmin},
      {"GET", "/api/v1/no-such-route", "", Scope::kRead},
  };
  for (const Route& r : routes) {
    SCOPED_TRACE(r.method + " " + r.target);
    const Reply none = Http(port_, r.method, r.target, r.body);
    EXPECT_EQ(none.status, 401) << none.body;
    EXPECT_NE(none.head.find("WWW-Authenticate: Bearer"), std::string::npos) << none.head;
    EXPECT_EQ(Http(port_, r.method, r.target, r.body, "Authorization: Bearer ghapi_wrong\r\n")
                  .status,
              401);
    EXPECT_EQ(Http(port_, r.method, r.target, r.body, "Authorization: Basic cm9vdDpyb290\r\n")
                  .status,
              401);
    const Reply agent = Http(port_, r.method, r.target, r.body, Bearer("node-1"));
    EXPECT_EQ(agent.status, 403) << agent.body;
    EXPECT_NE(agent.body.find("agent token"), std::string::npos) << agent.body;
    // A token with another scope is refused with the scope named.
    const std::string wrong = r.needed == Scope::kRead ? "submitter" : "reader";
    const Reply denied = Http(port_, r.method, r.target, r.body, Bearer(wrong));
    EXPECT_EQ(denied.status, 403) << denied.body;
    EXPECT_NE(denied.body.find(std::string(ScopeName(r.needed))), std::string::npos)
        << denied.body;
  }
  // With the scope (admin holds every scope), each route reaches its handler.
  for (const Route& r : routes) {
    SCOPED_TRACE(r.method + " " + r.target);
    const std::string right = r.needed == Scope::kAdmin   ? "root"
                              : r.needed == Scope::kRead ? "reader"
                                                         : "submitter";
    for (const std::string& who : {right, std::string("root")}) {
      const Reply ok = Http(port_, r.method, r.target, r.body, Bearer(who));
      EXPECT_NE(ok.status, 401) << who << ": " << ok.body;
      EXPECT_NE(ok.status, 403) << who << ": " << ok.body;
      EXPECT_LT(ok.status, 500) << who << ": " << ok.body;
    }
  }
  // No token is needed for liveness, the API document and the dashboard's files.
  EXPECT_EQ(Http(port_, "GET", "/healthz").status, 200);
  EXPECT_EQ(Http(port_, "GET", "/api/v1/openapi.json").status, 200);
  EXPECT_EQ(Http(port_, "GET", "/").status, 200);
}

TEST_F(RestAuthTest, TheSubmitterIsTheTokensNameNotAHeader) {
  const Reply r = Http(port_, "POST", "/api/v1/cells", SubmitBody(),
                       Bearer("ci") + "X-Gatehouse-Submitter: mallory\r\n");
  ASSERT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(json::parse(r.body)["labels"]["submitter"], "ci");
}

TEST_F(RestAuthTest, TokensAreIssuedListedWithoutSecretsAndRevoked) {
  const Reply made = Http(port_, "POST", "/api/v1/tokens",
                          R"({"name": "ci-2", "scopes": ["submit", "read", "read"]})",
                          Bearer("root"));
  ASSERT_EQ(made.status, 201) << made.body;
  const json body = json::parse(made.body);
  const std::string secret = body["secret"];
  EXPECT_EQ(secret.rfind("ghapi_", 0), 0u) << secret;
  EXPECT_EQ(body["token"]["scopes"], json({"read", "submit"}));
  EXPECT_TRUE(body["token"]["revoked_at"].is_null());
  const std::string auth = "Authorization: Bearer " + secret + "\r\n";
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells", "", auth).status, 200);

  // Only the hash is stored: neither the list nor the database file holds the secret.
  const Reply list = Http(port_, "GET", "/api/v1/tokens", "", Bearer("root"));
  ASSERT_EQ(list.status, 200);
  EXPECT_EQ(list.body.find(secret), std::string::npos);
  EXPECT_EQ(list.body.find(Sha256Hex(secret)), std::string::npos);
  for (const char* file : {"g.db", "g.db-wal"}) {
    std::ifstream db(dir_.path() / file, std::ios::binary);
    const std::string db_bytes((std::istreambuf_iterator<char>(db)), {});
    EXPECT_EQ(db_bytes.find(secret.substr(6)), std::string::npos) << file;
  }
  auto stored = store_->FindToken(Sha256Hex(secret));
  ASSERT_TRUE(stored.ok() && stored->has_value());

  // Names are unique among active tokens; bad bodies name the field.
  EXPECT_EQ(Http(port_, "POST", "/api/v1/tokens", R"({"name": "ci-2", "scopes": ["read"]})",
                 Bearer("root")).status, 409);
  for (const char* bad : {R"({"name": "a b", "scopes": ["read"]})",
                          R"({"name": "../x", "scopes": ["read"]})",
                          R"({"name": "x", "scopes": []})",
                          R"({"name": "x", "scopes": ["root"]})",
                          R"({"name": "x", "kind": "agent", "scopes": ["read"]})",
                          R"({"name": "x", "kind": "robot", "scopes": ["read"]})",
                          R"({"name": "x", "scopes": ["read"], "secret": "mine"})",
                          R"(["x"])"}) {
    const Reply r = Http(port_, "POST", "/api/v1/tokens", bad, Bearer("root"));
    EXPECT_EQ(r.status, 400) << bad << " -> " << r.body;
  }

  // Revoked: the next call is refused at once; revoking again keeps the first time.
  const int64_t id = body["token"]["id"];
  const Reply revoked =
      Http(port_, "DELETE", "/api/v1/tokens/" + std::to_string(id), "", Bearer("root"));
  ASSERT_EQ(revoked.status, 200) << revoked.body;
  const std::string revoked_at = json::parse(revoked.body)["revoked_at"];
  const Reply after = Http(port_, "GET", "/api/v1/cells", "", auth);
  EXPECT_EQ(after.status, 401);
  EXPECT_NE(after.body.find("revoked"), std::string::npos) << after.body;
  const Reply again =
      Http(port_, "DELETE", "/api/v1/tokens/" + std::to_string(id), "", Bearer("root"));
  EXPECT_EQ(json::parse(again.body)["revoked_at"], revoked_at);
  EXPECT_EQ(Http(port_, "DELETE", "/api/v1/tokens/99999", "", Bearer("root")).status, 404);
  EXPECT_EQ(Http(port_, "DELETE", "/api/v1/tokens/..%2f1", "", Bearer("root")).status, 404);
  // The name is free again once its token is revoked.
  EXPECT_EQ(Http(port_, "POST", "/api/v1/tokens", R"({"name": "ci-2", "scopes": ["read"]})",
                 Bearer("root")).status, 201);
}

TEST_F(RestAuthTest, AgentTokensAreIssuedWithoutScopes) {
  const Reply made = Http(port_, "POST", "/api/v1/tokens", R"({"name": "gpu-7", "kind": "agent"})",
                          Bearer("root"));
  ASSERT_EQ(made.status, 201) << made.body;
  const json body = json::parse(made.body);
  EXPECT_EQ(body["token"]["kind"], "agent");
  EXPECT_EQ(body["secret"].get<std::string>().rfind("ghagent_", 0), 0u);
  EXPECT_TRUE(auth_->AuthorizeAgent("Bearer " + body["secret"].get<std::string>()).ok());
  EXPECT_EQ(auth_->AuthorizeAgent("Bearer " + secrets_["root"]).status().code(),
            StatusCode::kPermissionDenied);
}

class RestAnonymousReadTest : public RestAuthTest {
 protected:
  void SetUp() override {
    auth_config_.anonymous_read = true;
    RestAuthTest::SetUp();
  }
};

TEST_F(RestAnonymousReadTest, ReadsNeedNoTokenButWritesAndBadTokensStillDo) {
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells").status, 200);
  EXPECT_EQ(Http(port_, "GET", "/api/v1/cells", "", "Authorization: Bearer nope\r\n").status, 401);
  EXPECT_EQ(Http(port_, "POST", "/api/v1/cells", SubmitBody()).status, 401);
  EXPECT_EQ(Http(port_, "GET", "/api/v1/tokens").status, 401);
}

TEST_F(RestTest, ListsAgentsWithTheirLiveState) {
  auto channel = std::make_shared<FakeChannel>();
  const Submitted s = SubmitToAgent(channel);  // agent-1 holds one attempt
  ASSERT_TRUE(core_->Heartbeat("agent-1", "cleanup after attempt 9: port 29500 still in use").ok());
  const Reply r = Http(port_, "GET", "/api/v1/agents");
  ASSERT_EQ(r.status, 200) << r.body;
  const json agents = json::parse(r.body)["agents"];
  ASSERT_EQ(agents.size(), 1u);
  const json& a = agents[0];
  EXPECT_EQ(a["id"], "agent-1");
  EXPECT_EQ(a["state"], "connected");
  EXPECT_EQ(a["attached"], true);
  EXPECT_EQ(a["silent"], false);
  EXPECT_EQ(a["running"], 1);
  EXPECT_EQ(a["slots"], 1);
  EXPECT_EQ(a["drain_reason"], "cleanup after attempt 9: port 29500 still in use");
  EXPECT_TRUE(a["capabilities"].is_object());
  EXPECT_TRUE(a["last_seen_at"].is_string());
  core_->DetachAgent("agent-1", channel.get());
  const json after = json::parse(Http(port_, "GET", "/api/v1/agents").body)["agents"];
  EXPECT_EQ(after[0]["attached"], false);
  EXPECT_EQ(after[0]["state"], "disconnected");
  EXPECT_TRUE(after[0]["drain_reason"].is_null());
  EXPECT_EQ(Http(port_, "POST", "/api/v1/agents", "{}").status, 405);
}

TEST_F(RestTest, AHiddenCellLeavesReadinessAndTheMatrixAndStaysReadable) {
  // Verifies POST /api/v1/cells/{id}/hide and /show: a reason is required (400), an unknown
  // cell is 404, hiding twice 409; a hidden cell is left out of readiness and the matrix unless
  // include_hidden=true (anything but true/false is 400), is still listed and read with its
  // evidence, and every action is recorded on it.
  const Reply created = Http(port_, "POST", "/api/v1/cells", SubmitBody());
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string id = json::parse(created.body)["id"];
  EXPECT_EQ(json::parse(created.body)["hidden"], false);
  const std::string hide = "/api/v1/cells/" + id + "/hide";
  EXPECT_EQ(Http(port_, "GET", hide).status, 405);
  EXPECT_EQ(Http(port_, "POST", hide).status, 400);
  EXPECT_EQ(Http(port_, "POST", hide, R"({"reason":""})").status, 400);
  EXPECT_EQ(Http(port_, "POST", hide, R"({"reason":"x","colour":1})").status, 400);
  EXPECT_EQ(Http(port_, "POST", "/api/v1/cells/nope/hide", R"({"reason":"x"})").status, 404);
  const Reply hidden = Http(port_, "POST", hide, R"({"reason":"typo: olmo-2"})");
  ASSERT_EQ(hidden.status, 200) << hidden.body;
  const json h = json::parse(hidden.body);
  EXPECT_EQ(h["hidden"], true);
  ASSERT_EQ(h["visibility"].size(), 1u) << hidden.body;
  EXPECT_EQ(h["visibility"][0]["action"], "hide");
  EXPECT_EQ(h["visibility"][0]["reason"], "typo: olmo-2");
  EXPECT_FALSE(h["visibility"][0]["actor"].get<std::string>().empty());
  EXPECT_EQ(h["status"], "queued");  // nothing about the cell itself changed
  EXPECT_EQ(Http(port_, "POST", hide, R"({"reason":"again"})").status, 409);

  auto combinations = [&](const std::string& query) {
    return json::parse(Http(port_, "GET", "/api/v1/readiness" + query).body)["combinations"];
  };
  auto rows = [&](const std::string& query) {
    return json::parse(Http(port_, "GET", "/api/v1/matrix" + query).body)["rows"];
  };
  EXPECT_TRUE(combinations("").empty());
  EXPECT_TRUE(rows("").empty());
  EXPECT_EQ(combinations("?include_hidden=true").size(), 1u);
  EXPECT_EQ(rows("?include_hidden=true").size(), 1u);
  EXPECT_TRUE(rows("?include_hidden=false").empty());
  EXPECT_EQ(Http(port_, "GET", "/api/v1/matrix?include_hidden=yes").status, 400);
  const Reply bad = Http(port_, "GET", "/api/v1/readiness?include_hidden=1");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("include_hidden"), std::string::npos) << bad.body;
  const json listed = json::parse(Http(port_, "GET", "/api/v1/cells").body)["cells"];
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0]["hidden"], true);

  const Reply shown =
      Http(port_, "POST", "/api/v1/cells/" + id + "/show", R"({"reason":"hid the wrong cell"})");
  ASSERT_EQ(shown.status, 200) << shown.body;
  const json s = json::parse(shown.body);
  EXPECT_EQ(s["hidden"], false);
  ASSERT_EQ(s["visibility"].size(), 2u);
  EXPECT_EQ(s["visibility"][1]["action"], "show");
  EXPECT_EQ(s["visibility"][1]["reason"], "hid the wrong cell");
  EXPECT_EQ(Http(port_, "POST", "/api/v1/cells/" + id + "/show", R"({"reason":"x"})").status, 409);
  EXPECT_EQ(combinations("").size(), 1u);
  EXPECT_EQ(rows("").size(), 1u);
}

TEST_F(RestTest, ReadinessAndTheMatrixCountTheDesignatedBranches) {
  // Verifies designated branches: with none configured, the repository's default branch (as
  // the resolver saw it at submit) alone counts, so the experiment branch's and a commit-only
  // cell's FAIL leave main's row validated; branches=all counts every cell; an admin's PUT
  // changes the answer and an empty list goes back to the default; a new default branch seen at
  // a later submit is used; bad input is a 400 naming the field and the value.
  const std::string a(40, 'a'), e(40, 'e'), c(40, 'c');
  auto submit = [&](const std::string& commit, const std::string& branch,
                    AttemptState verdict) {
    json body = json::parse(SubmitBody());
    body["commit"] = commit;
    if (branch.empty()) body.erase("branch"); else body["branch"] = branch;
    const Reply r = Http(port_, "POST", "/api/v1/cells", body.dump());
    EXPECT_EQ(r.status, 201) << r.body;
    const std::string id = json::parse(r.body)["id"];
    const int64_t attempt = (*store_->ListAttempts(id)).at(0).id;
    EXPECT_TRUE(store_->LeaseAttempts({{attempt, "agent-x"}}).ok());
    EXPECT_TRUE(store_->FinishAttempt(attempt, verdict, "").ok());
    return id;
  };
  const std::string main_cell = submit(a, "main", AttemptState::kPassed);
  const std::string exp_cell = submit(e, "exp", AttemptState::kFailed);
  submit(c, "", AttemptState::kFailed);  // by commit, no branch

  auto get = [&](const std::string& target) {
    const Reply r = Http(port_, "GET", target);
    EXPECT_EQ(r.status, 200) << target << ": " << r.body;
    return json::parse(r.body, nullptr, false);
  };
  auto commits = [&](const std::string& query) {
    std::set<std::string> out;
    const json r = get("/api/v1/readiness" + query);
    for (const json& combination : r["combinations"]) {
      for (const json& commit : combination["commits"]) {
        out.insert(commit["branch"].get<std::string>() + ":" +
                   commit["readiness"].get<std::string>());
      }
    }
    return out;
  };
  auto row = [&](const std::string& query) {
    const json m = get("/api/v1/matrix" + query);
    EXPECT_EQ(m["rows"].size(), 1u) << m.dump();
    return m["rows"].empty() ? std::string() : m["rows"][0]["readiness"].get<std::string>();
  };

  // The default branch, main, alone.
  const json designated = get("/api/v1/readiness");
  EXPECT_EQ(designated["branches"], "designated");
  ASSERT_EQ(designated["designated"].size(), 1u) << designated.dump();
  EXPECT_EQ(designated["designated"][0]["repository"], "/repos/adapt");
  EXPECT_EQ(designated["designated"][0]["source"], "default_branch");
  EXPECT_EQ(designated["designated"][0]["branches"], json::array({"main"}));
  EXPECT_EQ(designated["designated"][0]["default_branch"], "main");
  EXPECT_EQ(commits(""), (std::set<std::string>{"main:validated"}));
  EXPECT_EQ(row(""), "validated");
  EXPECT_EQ(get("/api/v1/matrix")["filter"]["branches"], "designated");
  // Every branch.
  EXPECT_EQ(get("/api/v1/readiness?branches=all")["branches"], "all");
  EXPECT_FALSE(get("/api/v1/readiness?branches=all").contains("designated"));
  EXPECT_EQ(commits("?branches=all"),
            (std::set<std::string>{"main:validated", "exp:failed", ":failed"}));
  EXPECT_EQ(row("?branches=all"), "failed");
  EXPECT_EQ(row("?branches=designated"), "validated");
  EXPECT_EQ(row("?branch=exp"), "failed");  // a branch named in the filter is shown
  EXPECT_EQ(get("/api/v1/matrix?branch=exp")["filter"]["branches"], "all");

  // An admin designates main and exp: exp's FAIL counts.
  const std::string put = "/api/v1/designated-branches?repository=%2Frepos%2Fadapt%2F";
  const Reply set = Http(port_, "PUT", put,
                         R"({"branches":["main","exp"],"reason":"exp is the release candidate"})");
  ASSERT_EQ(set.status, 200) << set.body;
  const json d = json::parse(set.body);
  EXPECT_EQ(d["repository"], "/repos/adapt");  // as cells store it: normalised
  EXPECT_EQ(d["source"], "configured");
  EXPECT_EQ(d["branches"], json::array({"exp", "main"}));
  EXPECT_EQ(d["configured"]["branches"], json::array({"main", "exp"}));
  EXPECT_EQ(d["configured"]["reason"], "exp is the release candidate");
  EXPECT_EQ(commits(""), (std::set<std::string>{"main:validated", "exp:failed"}));
  EXPECT_EQ(row(""), "failed");
  const json listed = get("/api/v1/designated-branches");
  ASSERT_EQ(listed["repositories"].size(), 1u);
  EXPECT_EQ(listed["repositories"][0]["source"], "configured");
  const json elsewhere = get("/api/v1/designated-branches?repository=https%3A%2F%2Fgit.example%2Fa.git");
  ASSERT_EQ(elsewhere["repositories"].size(), 1u);
  EXPECT_EQ(elsewhere["repositories"][0]["repository"], "https://git.example/a.git");
  EXPECT_EQ(elsewhere["repositories"][0]["source"], "unknown");
  EXPECT_EQ(elsewhere["repositories"][0]["branches"], nullptr);

  // exp alone; then none configured again: the default branch.
  ASSERT_EQ(Http(port_, "PUT", put, R"({"branches":["exp"]})").status, 200);
  EXPECT_EQ(commits(""), (std::set<std::string>{"exp:failed"}));
  const Reply reset = Http(port_, "PUT", put, R"({"branches":[],"reason":"back"})");
  ASSERT_EQ(reset.status, 200) << reset.body;
  EXPECT_EQ(json::parse(reset.body)["source"], "default_branch");
  EXPECT_EQ(json::parse(reset.body)["configured"], nullptr);
  EXPECT_EQ(commits(""), (std::set<std::string>{"main:validated"}));

  // The remote's HEAD moved to exp: the next submit records it, and it is what counts.
  {
    std::lock_guard lock(resolver_.files_mu);
    resolver_.default_branch = "exp";
  }
  json body = json::parse(SubmitBody());
  body["commit"] = e;
  body["branch"] = "exp";
  ASSERT_EQ(Http(port_, "POST", "/api/v1/cells", body.dump()).status, 200);  // the same cell
  EXPECT_EQ(get("/api/v1/designated-branches")["repositories"][0]["default_branch"], "exp");
  EXPECT_EQ(commits(""), (std::set<std::string>{"exp:failed"}));
  EXPECT_EQ(row(""), "failed");
  (void)main_cell;
  (void)exp_cell;

  // Bad input: 400 naming the field and the value.
  auto refused = [&](const std::string& method, const std::string& target,
                     const std::string& request_body, const std::vector<std::string>& named) {
    const Reply r = Http(port_, method, target, request_body);
    EXPECT_EQ(r.status, 400) << target << " " << request_body << ": " << r.body;
    for (const std::string& n : named) {
      EXPECT_NE(r.body.find(n), std::string::npos) << n << " not in " << r.body;
    }
  };
  refused("PUT", "/api/v1/designated-branches", R"({"branches":["main"]})", {"'repository'"});
  refused("PUT", "/api/v1/designated-branches?repository=adapt", R"({"branches":["main"]})",
          {"'repository'", "adapt"});
  refused("PUT", put, R"({"branches":"main"})", {"'branches'", "main"});
  refused("PUT", put, R"({})", {"'branches'"});
  refused("PUT", put, R"({"branches":["main","a..b"]})", {"'branches[1]'", "a..b"});
  refused("PUT", put, R"({"branches":["-x"]})", {"'branches[0]'", "-x"});
  refused("PUT", put, R"({"branches":["main","main"]})", {"'branches[1]'", "main"});
  refused("PUT", put, R"({"branches":[7]})", {"'branches[0]'", "7"});
  refused("PUT", put, R"({"branches":["main"],"reason":5})", {"'reason'", "5"});
  refused("PUT", put, R"({"branches":["main"],"colour":1})", {"colour"});
  refused("PUT", put, "not json", {"body"});
  refused("GET", "/api/v1/readiness?branches=some", "", {"'branches'", "some"});
  refused("GET", "/api/v1/matrix?branches=every", "", {"'branches'", "every"});
  refused("GET", "/api/v1/designated-branches?repository=relative/path", "",
          {"'repository'", "relative/path"});
  const Reply wrong = Http(port_, "DELETE", "/api/v1/designated-branches");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_NE(wrong.head.find("Allow: GET, PUT\r\n"), std::string::npos) << wrong.head;
}

TEST_F(RestTest, ServesItsOpenApiDocument) {
  const Reply r = Http(port_, "GET", "/api/v1/openapi.json");
  ASSERT_EQ(r.status, 200);
  const json doc = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << r.body.substr(0, 200);
  EXPECT_EQ(doc.value("openapi", "").rfind("3.", 0), 0u);
  ASSERT_TRUE(doc.contains("paths"));
  for (const char* path : {"/api/v1/cells", "/api/v1/cells/{id}", "/api/v1/cells/{id}/cancel",
                           "/api/v1/agents", "/api/v1/tokens", "/api/v1/tokens/{id}"}) {
    EXPECT_TRUE(doc["paths"].contains(path)) << path;
  }
}

}  // namespace
}  // namespace gatehouse::controller
