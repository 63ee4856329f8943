// Verifies webhooks on cell end (controller/webhook.h, protocols.md §8): every way an attempt
// ends leaves one delivery in the store's outbox; deliveries are signed with HMAC-SHA256,
// retried with backoff and recorded; a receiver that is down never changes a verdict; and the
// Beast client posts over HTTP and verified HTTPS to a real local receiver.
#include "controller/webhook.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "controller/http_server.h"
#include "controller/store/store.h"
#include "controller/webhook_client.h"
#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::TempDir;

/// A wall clock the test moves by hand (milliseconds since the epoch).
struct ManualClock {
  std::shared_ptr<std::atomic<int64_t>> ms = std::make_shared<std::atomic<int64_t>>(1'700'000'000'000);
  Clock clock() const {
    return [ms = ms] { return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms->load())); };
  }
  void Advance(std::chrono::milliseconds d) { ms->fetch_add(d.count()); }
};

CellRecord MakeCell(const std::string& id) { return testing::MakeCellRecord(id); }

/// Records the requests it is given and answers from a script (then 200).
struct ScriptedPoster {
  std::vector<Result<int>> answers;
  std::vector<WebhookRequest> requests;
  WebhookPoster poster() {
    return [this](const WebhookRequest& r) -> Result<int> {
      requests.push_back(r);
      if (requests.size() <= answers.size()) return answers[requests.size() - 1];
      return 200;
    };
  }
};

std::string Header(const WebhookRequest& r, const std::string& name) {
  for (const auto& [k, v] : r.headers) {
    if (k == name) return v;
  }
  return "";
}

class WebhookTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = Store::Open((dir_.path() / "gatehouse.db").string(), clock_.clock());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }

  /// A cell whose first attempt ended `to` (via lease when `to` needs one); its attempt id.
  int64_t EndedAttempt(const std::string& cell_id, AttemptState to, int retry_limit = 1) {
    EXPECT_TRUE(*store_->CreateCellIfAbsent(MakeCell(cell_id)));
    const int64_t id = (*store_->ListAttempts(cell_id)).front().id;
    if (to == AttemptState::kCancelled || to == AttemptState::kBlocked) {
      EXPECT_TRUE(*store_->CancelQueued(id, "stopped while queued", to));
      return id;
    }
    EXPECT_TRUE(store_->LeaseAttempts({{id, "node-1"}}).ok());
    if (to == AttemptState::kLost) {
      EXPECT_TRUE(store_->LoseAttempt(id, "agent silent", retry_limit).ok());
    } else if (to == AttemptState::kTimedOut) {
      EXPECT_TRUE(*store_->RequestCancel(id, "over the attempt limit", to));
      EXPECT_TRUE(store_->LoseAttempt(id, "agent silent", retry_limit).ok());  // ends as requested
    } else {
      EXPECT_TRUE(*store_->FinishAttempt(id, to, to == AttemptState::kPassed ? "" : "gate FAIL"));
    }
    return id;
  }

  TempDir dir_;
  ManualClock clock_;
  std::unique_ptr<Store> store_;
};

TEST(WebhookSignatureTest, IsHmacSha256OfTheBodyInHex) {
  // RFC 4231, test case 2.
  EXPECT_EQ(WebhookSignature("Jefe", "what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(WebhookBackoffTest, DoublesFromTheFirstWaitUpToTheCap) {
  WebhookConfig c;
  c.first_backoff = 2s;
  c.max_backoff = 30s;
  EXPECT_EQ(WebhookBackoff(c, 1), 2s);
  EXPECT_EQ(WebhookBackoff(c, 2), 4s);
  EXPECT_EQ(WebhookBackoff(c, 4), 16s);
  EXPECT_EQ(WebhookBackoff(c, 5), 30s);
  EXPECT_EQ(WebhookBackoff(c, 60), 30s);
}

TEST_F(WebhookTest, EveryWayAnAttemptEndsLeavesOneDelivery) {
  const int64_t passed = EndedAttempt("c-passed", AttemptState::kPassed);
  const int64_t failed = EndedAttempt("c-failed", AttemptState::kFailed);
  const int64_t cancelled = EndedAttempt("c-cancelled", AttemptState::kCancelled);
  const int64_t lost = EndedAttempt("c-lost", AttemptState::kLost);
  const int64_t error = EndedAttempt("c-error", AttemptState::kError);
  const int64_t blocked = EndedAttempt("c-blocked", AttemptState::kBlocked);
  const int64_t timed_out = EndedAttempt("c-timed-out", AttemptState::kTimedOut);
  const int64_t lost_for_good = EndedAttempt("c-lost-last", AttemptState::kLost, /*retry_limit=*/0);
  ASSERT_TRUE(*store_->CreateCellIfAbsent(MakeCell("c-queued")));

  auto due = store_->DueWebhookDeliveries(FormatTimestamp(clock_.clock()()), 100);
  ASSERT_TRUE(due.ok()) << due.status().ToString();
  std::vector<int64_t> attempts;
  for (const WebhookDelivery& d : *due) {
    attempts.push_back(d.attempt_id);
    EXPECT_EQ(d.state, "pending");
    EXPECT_EQ(d.tries, 0);
    EXPECT_EQ(d.retried, d.attempt_id == lost) << d.attempt_id;
  }
  EXPECT_EQ(attempts, (std::vector<int64_t>{passed, failed, cancelled, lost, error, blocked,
                                             timed_out, lost_for_good}));
  EXPECT_EQ((*store_->GetAttempt(timed_out)).state, AttemptState::kTimedOut);
  // The lost attempt's retry is queued, not ended: no delivery for it (nor for c-queued).
  EXPECT_EQ((*store_->ListWebhookDeliveries("c-lost")).size(), 1u);
  EXPECT_TRUE((*store_->ListWebhookDeliveries("c-queued")).empty());
}

TEST_F(WebhookTest, ASignedDeliveryCarriesTheVerdictAndIsRecorded) {
  const int64_t attempt = EndedAttempt("c1", AttemptState::kFailed);
  ScriptedPoster receiver;
  WebhookConfig config;
  config.url = "http://127.0.0.1:9/hook";
  config.secret = "s3cret";
  WebhookSender sender(*store_, config, receiver.poster(), clock_.clock());
  EXPECT_EQ(sender.RunOnce(), 1);

  ASSERT_EQ(receiver.requests.size(), 1u);
  const WebhookRequest& r = receiver.requests[0];
  EXPECT_EQ(r.url, config.url);
  EXPECT_EQ(Header(r, "X-Gatehouse-Event"), "cell.ended");
  EXPECT_EQ(Header(r, "X-Gatehouse-Signature-256"), WebhookSignature("s3cret", r.body));
  const json body = json::parse(r.body);
  EXPECT_EQ(body["event"], "cell.ended");
  EXPECT_EQ(body["verdict"], "failed");
  EXPECT_EQ(body["cell"]["id"], "c1");
  EXPECT_EQ(body["cell"]["kind"], "validation");
  EXPECT_EQ(body["cell"]["commit"], std::string(40, 'a'));
  EXPECT_EQ(body["cell"]["report_url"], "/api/v1/cells/c1/report");
  EXPECT_EQ(body["attempt"]["id"], attempt);
  EXPECT_EQ(body["attempt"]["reason"], "gate FAIL");
  EXPECT_EQ(Header(r, "X-Gatehouse-Delivery"), std::to_string(body["delivery"].get<int64_t>()));

  const auto deliveries = *store_->ListWebhookDeliveries("c1");
  ASSERT_EQ(deliveries.size(), 1u);
  EXPECT_EQ(deliveries[0].state, "delivered");
  EXPECT_EQ(deliveries[0].tries, 1);
  EXPECT_EQ(deliveries[0].last_status, 200);
  EXPECT_FALSE(deliveries[0].delivered_at.empty());
  EXPECT_EQ(sender.RunOnce(), 0);  // delivered once, never again
  EXPECT_EQ(receiver.requests.size(), 1u);
}

TEST_F(WebhookTest, AFailedTryIsRetriedAfterTheBackoff) {
  EndedAttempt("c1", AttemptState::kPassed);
  ScriptedPoster receiver;
  receiver.answers = {503, Status::Unavailable("connect 127.0.0.1:9: refused")};
  WebhookConfig config;
  config.url = "http://127.0.0.1:9/hook";
  config.first_backoff = 2s;
  WebhookSender sender(*store_, config, receiver.poster(), clock_.clock());

  EXPECT_EQ(sender.RunOnce(), 1);
  auto d = (*store_->ListWebhookDeliveries("c1")).at(0);
  EXPECT_EQ(d.state, "pending");
  EXPECT_EQ(d.tries, 1);
  EXPECT_EQ(d.last_status, 503);
  EXPECT_EQ(d.last_error, "receiver answered HTTP 503");
  EXPECT_EQ(sender.RunOnce(), 0);  // not due before the backoff
  clock_.Advance(1999ms);
  EXPECT_EQ(sender.RunOnce(), 0);
  clock_.Advance(1ms);
  EXPECT_EQ(sender.RunOnce(), 1);
  d = (*store_->ListWebhookDeliveries("c1")).at(0);
  EXPECT_EQ(d.state, "pending");
  EXPECT_EQ(d.tries, 2);
  EXPECT_EQ(d.last_status, 0);
  EXPECT_NE(d.last_error.find("refused"), std::string::npos) << d.last_error;
  clock_.Advance(3999ms);  // the second wait is twice the first
  EXPECT_EQ(sender.RunOnce(), 0);
  clock_.Advance(1ms);
  EXPECT_EQ(sender.RunOnce(), 1);
  d = (*store_->ListWebhookDeliveries("c1")).at(0);
  EXPECT_EQ(d.state, "delivered");
  EXPECT_EQ(d.tries, 3);
  EXPECT_EQ(receiver.requests.size(), 3u);
  // Every try carried the same body (the same delivery id).
  EXPECT_EQ(receiver.requests[0].body, receiver.requests[2].body);
}

TEST_F(WebhookTest, AReceiverThatStaysDownFailsTheDeliveryNotTheVerdict) {
  const int64_t attempt = EndedAttempt("c1", AttemptState::kPassed);
  int posts = 0;
  WebhookConfig config;
  config.url = "http://127.0.0.1:9/hook";
  config.max_tries = 3;
  config.first_backoff = 1s;
  WebhookSender sender(*store_, config,
                       [&](const WebhookRequest&) -> Result<int> {
                         ++posts;
                         return Status::Unavailable("connect 127.0.0.1:9: Connection refused");
                       },
                       clock_.clock());
  for (int i = 0; i < 10; ++i) {
    sender.RunOnce();
    clock_.Advance(10min);
  }
  EXPECT_EQ(posts, 3);
  const auto d = (*store_->ListWebhookDeliveries("c1")).at(0);
  EXPECT_EQ(d.state, "failed");
  EXPECT_EQ(d.tries, 3);
  EXPECT_EQ((*store_->GetAttempt(attempt)).state, AttemptState::kPassed);
}

TEST_F(WebhookTest, AnEndRetriedByHandIsStillDelivered) {
  // Only a lost attempt the controller retried itself is skipped: an error end that a user
  // retried (POST .../retry) before its delivery went out was an end, and is delivered.
  EndedAttempt("c1", AttemptState::kError);
  ASSERT_TRUE(store_->RetryCell("c1").ok());
  ScriptedPoster receiver;
  WebhookConfig config;
  config.url = "http://127.0.0.1:9/hook";
  WebhookSender sender(*store_, config, receiver.poster(), clock_.clock());
  EXPECT_EQ(sender.RunOnce(), 1);
  ASSERT_EQ(receiver.requests.size(), 1u);
  EXPECT_EQ(json::parse(receiver.requests[0].body)["verdict"], "error");
  EXPECT_EQ((*store_->ListWebhookDeliveries("c1")).at(0).state, "delivered");
}

TEST_F(WebhookTest, AStopRequestEndsThePassBeforeTheNextPost) {
  EndedAttempt("c1", AttemptState::kPassed);
  EndedAttempt("c2", AttemptState::kPassed);
  WebhookConfig config;
  config.url = "http://127.0.0.1:9/hook";
  WebhookSender* self = nullptr;
  int posts = 0;
  WebhookSender sender(*store_, config,
                       [&](const WebhookRequest&) -> Result<int> {
                         ++posts;
                         self->RequestStop();  // shutdown arrives during the first POST
                         return 200;
                       },
                       clock_.clock());
  self = &sender;
  EXPECT_EQ(sender.RunOnce(), 1);
  EXPECT_EQ(posts, 1);
  EXPECT_EQ((*store_->ListWebhookDeliveries("c2")).at(0).state, "pending");
}

TEST(WebhookRedactionTest, UserinfoAndQueryAreHiddenInLogs) {
  EXPECT_EQ(RedactedUrl("https://ci.example/hook"), "https://ci.example/hook");
  EXPECT_EQ(RedactedUrl("https://bot:s3cret@ci.example:8443/hook?token=abc"),
            "https://***@ci.example:8443/hook?***");
  EXPECT_EQ(RedactedUrl("http://ci.example/h#frag"), "http://ci.example/h#***");
}

TEST_F(WebhookTest, WithoutAUrlOrForARetriedLossTheDeliveryIsSkippedWithWhy) {
  EndedAttempt("c1", AttemptState::kPassed);
  EndedAttempt("c-lost", AttemptState::kLost);
  ScriptedPoster receiver;
  WebhookSender without_url(*store_, WebhookConfig{}, receiver.poster(), clock_.clock());
  EXPECT_EQ(without_url.RunOnce(), 2);
  EXPECT_TRUE(receiver.requests.empty());
  auto d = (*store_->ListWebhookDeliveries("c1")).at(0);
  EXPECT_EQ(d.state, "skipped");
  EXPECT_EQ(d.tries, 0);
  EXPECT_EQ(d.last_error, "no webhook configured");
  d = (*store_->ListWebhookDeliveries("c-lost")).at(0);
  EXPECT_EQ(d.state, "skipped");
  EXPECT_EQ(d.last_error, "attempt lost and retried: its cell goes on");
}

// ---- the Beast client against a real receiver on 127.0.0.1 ----

/// A local receiver: our own HttpServer, answering `status` after `delay`.
class Receiver {
 public:
  explicit Receiver(int status, std::chrono::milliseconds delay = 0ms,
                    HttpServer::Options options = {}) {
    auto server = HttpServer::Start(options, [this, status, delay](const HttpRequest& r) {
      std::this_thread::sleep_for(delay);
      std::lock_guard lock(mu_);
      requests_.push_back(r);
      HttpResponse response;
      response.status = status;
      response.body = "{}";
      return response;
    });
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    if (server.ok()) server_ = std::move(*server);
  }
  uint16_t port() const { return server_ ? server_->port() : 0; }
  std::vector<HttpRequest> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  std::mutex mu_;
  std::vector<HttpRequest> requests_;
  std::unique_ptr<HttpServer> server_;
};

WebhookRequest Request(const std::string& url, std::chrono::milliseconds timeout = 5s) {
  WebhookRequest r;
  r.url = url;
  r.body = R"({"event":"cell.ended"})";
  r.headers = {{"Content-Type", "application/json"},
               {"X-Gatehouse-Signature-256", WebhookSignature("k", r.body)}};
  r.timeout = timeout;
  return r;
}

TEST(WebhookClientTest, PostsTheBodyAndHeadersAndReturnsTheStatus) {
  Receiver ok(200);
  const WebhookPoster post = MakeHttpWebhookPoster();
  auto status = post(Request("http://127.0.0.1:" + std::to_string(ok.port()) + "/hook?ci=1"));
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(*status, 200);
  const auto got = ok.requests();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].method, "POST");
  EXPECT_EQ(got[0].target, "/hook?ci=1");
  EXPECT_EQ(got[0].body, R"({"event":"cell.ended"})");
  EXPECT_EQ(got[0].headers.at("x-gatehouse-signature-256"), WebhookSignature("k", got[0].body));

  Receiver broken(500);
  status = post(Request("http://127.0.0.1:" + std::to_string(broken.port()) + "/"));
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(*status, 500);
}

TEST(WebhookClientTest, NoReceiverATimeoutAndABadUrlAreErrors) {
  const WebhookPoster post = MakeHttpWebhookPoster();
  uint16_t closed = 0;
  {
    Receiver gone(200);
    closed = gone.port();
  }  // stopped: nothing listens there now
  auto status = post(Request("http://127.0.0.1:" + std::to_string(closed) + "/hook"));
  EXPECT_EQ(status.status().code(), StatusCode::kUnavailable) << status.status().ToString();

  Receiver slow(200, 1500ms);
  status = post(Request("http://127.0.0.1:" + std::to_string(slow.port()) + "/hook", 300ms));
  EXPECT_EQ(status.status().code(), StatusCode::kDeadlineExceeded) << status.status().ToString();

  for (const char* bad : {"ftp://127.0.0.1/hook", "127.0.0.1:80/hook", "http:///hook"}) {
    status = post(Request(bad));
    EXPECT_EQ(status.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(WebhookClientTest, HttpsVerifiesTheReceiverAgainstTheGivenCa) {
  TempDir dir;
  // openssl(1) in the test's directory (arguments are fixed words: no quoting needed).
  auto openssl = [&](const std::vector<std::string>& args) {
    std::string cmd = "cd '" + dir.path().string() + "' && openssl";
    for (const std::string& a : args) cmd += " '" + a + "'";
    cmd += " 2>&1";
    std::string output;
    FILE* pipe = ::popen(cmd.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
    ASSERT_EQ(::pclose(pipe), 0) << cmd << "\n" << output;
  };
  testing::WriteFile(dir.path() / "server.ext", "subjectAltName=IP:127.0.0.1\n");
  ASSERT_NO_FATAL_FAILURE(openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                                   "-subj", "/CN=webhook test ca", "-keyout", "ca.key", "-out",
                                   "ca.pem"}));
  ASSERT_NO_FATAL_FAILURE(openssl({"req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=receiver",
                                   "-keyout", "server.key", "-out", "server.csr"}));
  ASSERT_NO_FATAL_FAILURE(openssl({"x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey",
                                   "ca.key", "-CAcreateserial", "-days", "2", "-out",
                                   "server.pem", "-extfile", "server.ext"}));
  HttpServer::Options tls;
  tls.tls_cert_file = (dir.path() / "server.pem").string();
  tls.tls_key_file = (dir.path() / "server.key").string();
  Receiver receiver(202, 0ms, tls);
  const std::string url = "https://127.0.0.1:" + std::to_string(receiver.port()) + "/hook";

  auto status = MakeHttpWebhookPoster((dir.path() / "ca.pem").string())(Request(url));
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(*status, 202);
  // The system's CAs do not know this receiver: refused, nothing posted.
  status = MakeHttpWebhookPoster()(Request(url));
  EXPECT_EQ(status.status().code(), StatusCode::kUnavailable) << status.status().ToString();
  EXPECT_NE(status.status().message().find("certificate verify failed"), std::string::npos)
      << status.status().ToString();
  EXPECT_EQ(receiver.requests().size(), 1u);

  // A certificate the trusted CA signed for another name: refused too (host name checked).
  testing::WriteFile(dir.path() / "other.ext", "subjectAltName=DNS:other.example\n");
  ASSERT_NO_FATAL_FAILURE(openssl({"req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=other",
                                   "-keyout", "other.key", "-out", "other.csr"}));
  ASSERT_NO_FATAL_FAILURE(openssl({"x509", "-req", "-in", "other.csr", "-CA", "ca.pem", "-CAkey",
                                   "ca.key", "-CAcreateserial", "-days", "2", "-out", "other.pem",
                                   "-extfile", "other.ext"}));
  HttpServer::Options other_tls;
  other_tls.tls_cert_file = (dir.path() / "other.pem").string();
  other_tls.tls_key_file = (dir.path() / "other.key").string();
  Receiver impostor(202, 0ms, other_tls);
  status = MakeHttpWebhookPoster((dir.path() / "ca.pem").string())(
      Request("https://127.0.0.1:" + std::to_string(impostor.port()) + "/hook"));
  EXPECT_EQ(status.status().code(), StatusCode::kUnavailable) << status.status().ToString();
  EXPECT_TRUE(impostor.requests().empty());
}

}  // namespace
}  // namespace gatehouse::controller
