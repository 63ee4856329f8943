// Verifies bearer-token authentication: the header forms accepted and refused, scopes (admin
// holds every scope), agent vs API tokens, revocation, issue validation, secrets that are
// random and never stored, and the agent stream refusing streams without an agent token.
#include "controller/auth.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>

#include <set>

#include "common/sha256.h"
#include "controller/agent_service.h"
#include "gatehouse/agent/v1/agent.grpc.pb.h"
#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

namespace pb = gatehouse::agent::v1;

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = Store::Open((dir_.path() / "g.db").string(), SystemClock());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    auth_ = std::make_unique<Authenticator>(*store_, AuthConfig{});
  }

  std::string Issue(const std::string& name, TokenKind kind, std::vector<Scope> scopes) {
    auto issued = auth_->Issue(name, kind, std::move(scopes));
    EXPECT_TRUE(issued.ok()) << issued.status().ToString();
    return issued.ok() ? issued->secret : "";
  }

  /// Starts an agent stream server over this store with tokens required; returns its stub.
  pb::AgentService::Stub& StartAgentServer() {
    core_ = std::make_unique<ControllerCore>(*store_, freezer_);
    AgentRpcServer::Options options;
    options.auth = auth_.get();
    auto server = AgentRpcServer::Start("127.0.0.1:0", *core_, options);
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    if (server.ok()) server_ = std::move(*server);
    stub_ = pb::AgentService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_ ? server_->port() : 0),
        grpc::InsecureChannelCredentials()));
    return *stub_;
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  testing::TempDir dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Authenticator> auth_;
  testing::FakeCommitResolver resolver_;
  DigestCache digests_;
  CellFreezer freezer_{SubmitContext{}, resolver_, digests_};
  std::unique_ptr<ControllerCore> core_;
  std::unique_ptr<AgentRpcServer> server_;
  std::unique_ptr<pb::AgentService::Stub> stub_;
};

TEST_F(AuthTest, AcceptsTheBearerSchemeInAnyCaseAndNothingElse) {
  const std::string secret = Issue("ci", TokenKind::kApi, {Scope::kRead});
  for (const std::string& header : std::vector<std::string>{
           "Bearer " + secret, "bearer " + secret, "BEARER " + secret,
           "Bearer   " + secret + "  "}) {
    EXPECT_TRUE(auth_->AuthorizeApi(header, Scope::kRead, true).ok()) << header;
  }
  for (const std::string& header : std::vector<std::string>{
           std::string(), secret, "Bearer", "Bearer ", "Basic " + secret, "Bearer" + secret,
        "Bearer " + secret + "x", "Bearer " + secret.substr(1), "Bearer " + std::string(300, 'a'),
        "Bearer " + Sha256Hex(secret)}) {
    auto r = auth_->AuthorizeApi(header, Scope::kRead, true);
    EXPECT_EQ(r.status().code(), StatusCode::kUnauthenticated) << "'" << header << "'";
  }
}

TEST_F(AuthTest, ScopesAreCheckedAndAdminHoldsThemAll) {
  const std::string reader = "Bearer " + Issue("reader", TokenKind::kApi, {Scope::kRead});
  const std::string submitter = "Bearer " + Issue("sub", TokenKind::kApi, {Scope::kSubmit});
  const std::string admin = "Bearer " + Issue("root", TokenKind::kApi, {Scope::kAdmin});
  EXPECT_TRUE(auth_->AuthorizeApi(reader, Scope::kRead, true).ok());
  EXPECT_EQ(auth_->AuthorizeApi(reader, Scope::kSubmit, false).status().code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(auth_->AuthorizeApi(submitter, Scope::kRead, true).status().code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(auth_->AuthorizeApi(submitter, Scope::kAdmin, true).status().code(),
            StatusCode::kPermissionDenied);
  for (Scope s : {Scope::kRead, Scope::kSubmit, Scope::kAdmin}) {
    auto p = auth_->AuthorizeApi(admin, s, false);
    ASSERT_TRUE(p.ok()) << ScopeName(s);
    EXPECT_EQ(p->name, "root");
  }
}

TEST_F(AuthTest, AgentTokensOpenOnlyTheAgentStreamAndApiTokensOnlyTheApi) {
  const std::string agent = "Bearer " + Issue("node-1", TokenKind::kAgent, {});
  const std::string api = "Bearer " + Issue("root", TokenKind::kApi, {Scope::kAdmin});
  EXPECT_TRUE(agent.rfind("Bearer ghagent_", 0) == 0);
  EXPECT_TRUE(api.rfind("Bearer ghapi_", 0) == 0);
  EXPECT_EQ(auth_->AuthorizeApi(agent, Scope::kRead, true).status().code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(auth_->AuthorizeAgent(api).status().code(), StatusCode::kPermissionDenied);
  auto p = auth_->AuthorizeAgent(agent);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->name, "node-1");
  EXPECT_EQ(auth_->AuthorizeAgent("").status().code(), StatusCode::kUnauthenticated);
}

TEST_F(AuthTest, ARevokedTokenIsRefusedAtOnce) {
  auto issued = auth_->Issue("ci", TokenKind::kApi, {Scope::kRead});
  ASSERT_TRUE(issued.ok());
  const std::string header = "Bearer " + issued->secret;
  ASSERT_TRUE(auth_->AuthorizeApi(header, Scope::kRead, true).ok());
  ASSERT_TRUE(auth_->Revoke(issued->record.id).ok());
  auto r = auth_->AuthorizeApi(header, Scope::kRead, true);
  EXPECT_EQ(r.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(r.status().message().find("revoked"), std::string::npos);
  EXPECT_EQ(auth_->Revoke(12345).status().code(), StatusCode::kNotFound);
}

TEST_F(AuthTest, IssueValidatesNameKindAndScopes) {
  EXPECT_EQ(auth_->Issue("", TokenKind::kApi, {Scope::kRead}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(auth_->Issue(std::string(101, 'a'), TokenKind::kApi, {Scope::kRead}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(auth_->Issue("x;rm -rf /", TokenKind::kApi, {Scope::kRead}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(auth_->Issue("x", TokenKind::kApi, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(auth_->Issue("x", TokenKind::kAgent, {Scope::kRead}).status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(auth_->Issue("x", TokenKind::kApi, {Scope::kRead}).ok());
  EXPECT_EQ(auth_->Issue("x", TokenKind::kAgent, {}).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(ParseScope("write").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTokenKind("user").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(AuthTest, SecretsAreRandomAndOnlyTheirHashIsStored) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    auto s = NewTokenSecret(TokenKind::kApi);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->size(), 6u + 64u);
    EXPECT_TRUE(seen.insert(*s).second) << "repeated secret";
  }
  auto issued = auth_->Issue("ci", TokenKind::kApi, {Scope::kRead});
  ASSERT_TRUE(issued.ok());
  auto by_hash = store_->FindToken(Sha256Hex(issued->secret));
  ASSERT_TRUE(by_hash.ok() && by_hash->has_value());
  EXPECT_EQ((*by_hash)->name, "ci");
  auto by_secret = store_->FindToken(issued->secret);
  ASSERT_TRUE(by_secret.ok());
  EXPECT_FALSE(by_secret->has_value());
}

TEST_F(AuthTest, WithAuthOffEveryCallerMayDoEverything) {
  Authenticator open(*store_, AuthConfig{.required = false});
  EXPECT_TRUE(open.AuthorizeApi("", Scope::kAdmin, false).ok());
  EXPECT_TRUE(open.AuthorizeAgent("").ok());
}

// The agent stream with tokens required: no token and an API token are refused before
// Register is read; an agent token registers.
TEST_F(AuthTest, TheAgentStreamNeedsAnAgentToken) {
  pb::AgentService::Stub& stub = StartAgentServer();
  const std::string agent_secret = Issue("node-1", TokenKind::kAgent, {});
  const std::string api_secret = Issue("root", TokenKind::kApi, {Scope::kAdmin});

  const auto connect = [&](const std::string& authorization) {
    grpc::ClientContext ctx;
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    auto stream = stub.Connect(&ctx);
    pb::AgentMessage reg;
    reg.mutable_register_()->set_agent_name("node-1");
    stream->Write(reg);
    stream->WritesDone();
    pb::ControllerMessage in;
    bool registered = false;
    while (stream->Read(&in)) registered = registered || in.has_registered();
    const grpc::Status status = stream->Finish();
    return std::make_pair(registered, status.error_code());
  };
  EXPECT_EQ(connect(""), std::make_pair(false, grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_EQ(connect("Bearer ghagent_0000"),
            std::make_pair(false, grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_EQ(connect("Bearer " + api_secret),
            std::make_pair(false, grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_TRUE(connect("Bearer " + agent_secret).first);
}

// Revoking an agent token ends its open stream at the next heartbeat (UNAUTHENTICATED, naming
// the revocation): the stream was accepted when the token was good, and stays open until then.
TEST_F(AuthTest, RevokingAnAgentTokenEndsItsOpenStream) {
  pb::AgentService::Stub& stub = StartAgentServer();
  auto issued = auth_->Issue("node-2", TokenKind::kAgent, {});
  ASSERT_TRUE(issued.ok()) << issued.status().ToString();

  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + issued->secret);
  // A stream the revocation does not end fails the test by this deadline instead of hanging.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = stub.Connect(&ctx);
  pb::AgentMessage reg;
  reg.mutable_register_()->set_agent_name("node-2");
  ASSERT_TRUE(stream->Write(reg));
  pb::ControllerMessage in;
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_TRUE(in.has_registered());
  pb::AgentMessage hb;
  hb.mutable_heartbeat()->set_seq(1);
  ASSERT_TRUE(stream->Write(hb));  // accepted: the token is good
  ASSERT_TRUE(auth_->Revoke(issued->record.id).ok());
  hb.mutable_heartbeat()->set_seq(2);
  stream->Write(hb);
  while (stream->Read(&in)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(status.error_message().find("token 'node-2' was revoked"), std::string::npos)
      << status.error_message();
  auto agent = store_->GetAgent("node-2");
  ASSERT_TRUE(agent.ok());
  EXPECT_EQ(agent->state, "disconnected");
}

}  // namespace
}  // namespace gatehouse::controller
