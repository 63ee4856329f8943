// Security of the real processes on 127.0.0.1 (issue 5): the agent stream refuses agents
// without an agent token; REST and the agent stream over TLS, with mutual TLS for agents; and
// every string field of the submit body, filled with path traversal and shell syntax, is
// answered 4xx or accepted as data, never executed and never a 5xx.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "e2e_util.h"
#include "http_client.h"
#include "process_harness.h"

namespace gatehouse::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::seconds;

const std::string kBin = GATEHOUSE_BIN_DIR;

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("gatehouse-security-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "logs");
    db_ = (root_ / "gatehouse.db").string();
  }
  void TearDown() override {
    agents_.clear();
    controller_.reset();
    if (!HasFailure()) fs::remove_all(root_);
  }

  // Starts the controller with `extra` flags; sets http_port_ and grpc_port_.
  void StartController(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--db", db_, "--http", "127.0.0.1:0", "--grpc",
                                     "127.0.0.1:0", "--mirror-dir", (root_ / "mirrors").string(),
                                     "--web-dir", GATEHOUSE_WEB_DIR};
    args.insert(args.end(), extra.begin(), extra.end());
    controller_ = std::make_unique<Daemon>(kBin + "/gatehouse-controller", args,
                                           root_ / "logs" / "controller");
    auto ports = WaitForControllerPorts(*controller_);
    ASSERT_TRUE(ports) << controller_->Stderr();
    http_port_ = ports->http;
    grpc_port_ = ports->grpc;
  }

  std::vector<std::string> AgentArgs(const std::string& name) const {
    return {"--controller", "127.0.0.1:" + std::to_string(grpc_port_), "--name", name,
            "--work-dir", (root_ / ("agent-" + name)).string(), "--sdk-dir", GATEHOUSE_SDK_DIR,
            "--worker", kBin + "/gatehouse-worker", "--torch-version", GATEHOUSE_TORCH_VERSION};
  }

  // Runs an agent that must give up by itself (bounded by timeout(1)); returns its result.
  CommandResult RunRefusedAgent(std::vector<std::string> args) {
    args.insert(args.begin(), {"30", kBin + "/gatehouse-agent"});
    return RunCommand("timeout", args, root_);
  }

  // Starts an agent daemon; true when it registers within `timeout`.
  bool AgentRegisters(const std::string& name, const std::vector<std::string>& extra,
                      seconds timeout) {
    std::vector<std::string> args = AgentArgs(name);
    args.insert(args.end(), extra.begin(), extra.end());
    agents_.push_back(std::make_unique<Daemon>(kBin + "/gatehouse-agent", args,
                                               root_ / "logs" / ("agent-" + name)));
    return agents_.back()->WaitForLine(std::regex("registered as"), timeout).has_value();
  }

  fs::path root_;
  std::string db_;
  int http_port_ = 0;
  int grpc_port_ = 0;
  std::unique_ptr<Daemon> controller_;
  std::vector<std::unique_ptr<Daemon>> agents_;
};

TEST_F(SecurityTest, TheAgentStreamNeedsAnAgentToken) {
  const std::string agent_token = CreateToken(kBin, db_, {"--name", "node-1", "--kind", "agent"});
  const std::string api_token = CreateToken(kBin, db_, {"--name", "root", "--scopes", "admin"});
  ASSERT_NO_FATAL_FAILURE(StartController({}));
  WriteTextFile(root_ / "agent.token", agent_token + "\n");
  WriteTextFile(root_ / "api.token", api_token + "\n");
  WriteTextFile(root_ / "wrong.token", "ghagent_" + std::string(64, '0') + "\n");

  // No token, an unknown one and an API token: the agent is refused and exits 2 (it holds no
  // attempt, so there is nothing to keep trying for).
  const CommandResult none = RunRefusedAgent(AgentArgs("a"));
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("refused the agent token"), std::string::npos) << none.output;
  auto with_file = [&](const char* file) {
    auto args = AgentArgs("a");
    args.insert(args.end(), {"--token-file", (root_ / file).string()});
    return args;
  };
  const CommandResult wrong = RunRefusedAgent(with_file("wrong.token"));
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  const CommandResult api = RunRefusedAgent(with_file("api.token"));
  EXPECT_EQ(api.exit_code, 2) << api.output;
  EXPECT_NE(api.output.find("API token"), std::string::npos) << api.output;
  // The agent token registers its own name (or "<name>-..."), and no other.
  const CommandResult other = RunRefusedAgent(with_file("agent.token"));  // named "a"
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("may register agents named 'node-1'"), std::string::npos)
      << other.output;
  EXPECT_TRUE(AgentRegisters("node-1", {"--token-file", (root_ / "agent.token").string()},
                             seconds(30)))
      << controller_->Stderr();
  EXPECT_TRUE(AgentRegisters("node-1-b", {"--token-file", (root_ / "agent.token").string()},
                             seconds(30)))
      << controller_->Stderr();
  // The API itself refuses the agent token.
  EXPECT_EQ(HttpRequest(http_port_, "GET", "/api/v1/cells", "", agent_token).status, 403);
  EXPECT_EQ(HttpRequest(http_port_, "GET", "/api/v1/cells", "", api_token).status, 200);
}

// Makes a CA, a server certificate for IP 127.0.0.1 and a client certificate with openssl(1).
void MakeCertificates(const fs::path& dir) {
  auto openssl = [&](const std::vector<std::string>& args) {
    CommandResult r = RunCommand("openssl", args, dir);
    ASSERT_EQ(r.exit_code, 0) << "openssl " << args.front() << ":\n" << r.output;
  };
  WriteTextFile(dir / "server.ext", "subjectAltName=IP:127.0.0.1\n");
  for (const char* ca : {"ca", "other-ca"}) {
    openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             std::string("/CN=gatehouse test ") + ca, "-keyout", std::string(ca) + ".key", "-out",
             std::string(ca) + ".pem"});
  }
  for (const char* who : {"server", "client"}) {
    openssl({"req", "-newkey", "rsa:2048", "-nodes", "-subj", std::string("/CN=") + who,
             "-keyout", std::string(who) + ".key", "-out", std::string(who) + ".csr"});
    std::vector<std::string> sign = {"x509", "-req", "-in", std::string(who) + ".csr", "-CA",
                                     "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days",
                                     "2", "-out", std::string(who) + ".pem"};
    if (std::string(who) == "server") sign.insert(sign.end(), {"-extfile", "server.ext"});
    openssl(sign);
  }
}

TEST_F(SecurityTest, RestAndTheAgentStreamServeTlsWithMutualTlsForAgents) {
  const fs::path certs = root_ / "certs";
  fs::create_directories(certs);
  ASSERT_NO_FATAL_FAILURE(MakeCertificates(certs));
  const std::string api_token = CreateToken(kBin, db_, {"--name", "ci", "--scopes", "read"});
  const std::string agent_token = CreateToken(kBin, db_, {"--name", "node-1", "--kind", "agent"});
  WriteTextFile(root_ / "agent.token", agent_token + "\n");
  ASSERT_NO_FATAL_FAILURE(StartController(
      {"--tls-cert", (certs / "server.pem").string(), "--tls-key", (certs / "server.key").string(),
       "--tls-client-ca", (certs / "ca.pem").string()}));
  const std::string ca = (certs / "ca.pem").string();

  // REST: HTTPS with the right CA; a client trusting another CA, or speaking plain HTTP, gets
  // no answer.
  HttpResponse tls = HttpsRequest(http_port_, ca, "GET", "/api/v1/cells", "", api_token);
  EXPECT_EQ(tls.status, 200) << tls.error << tls.body;
  EXPECT_EQ(HttpsRequest(http_port_, ca, "GET", "/api/v1/cells").status, 401);
  HttpResponse untrusted = HttpsRequest(http_port_, (certs / "other-ca.pem").string(), "GET",
                                        "/healthz");
  EXPECT_EQ(untrusted.status, 0);
  EXPECT_FALSE(untrusted.error.empty());
  EXPECT_EQ(HttpRequest(http_port_, "GET", "/healthz").status, 0);
  // The server still serves after those.
  EXPECT_EQ(HttpsRequest(http_port_, ca, "GET", "/healthz").status, 200);

  // Agent stream: mutual TLS and the agent token together register; without a client
  // certificate, or without TLS, the agent never registers (it keeps retrying: a stopped
  // handshake is not a refused token).
  const std::string token_file = (root_ / "agent.token").string();
  EXPECT_TRUE(AgentRegisters("node-1-mtls", {"--token-file", token_file, "--tls-ca", ca, "--tls-cert",
                                      (certs / "client.pem").string(), "--tls-key",
                                      (certs / "client.key").string()},
                             seconds(30)))
      << controller_->Stderr();
  EXPECT_FALSE(AgentRegisters("node-1-no-client-cert", {"--token-file", token_file, "--tls-ca", ca},
                              seconds(5)));
  EXPECT_FALSE(AgentRegisters("node-1-plain", {"--token-file", token_file}, seconds(5)));
}

TEST_F(SecurityTest, HostileStringsInEverySubmitFieldAreDataNeverCommands) {
  const std::string token = CreateToken(kBin, db_, {"--name", "ci", "--scopes", "read,submit"});
  ASSERT_NO_FATAL_FAILURE(StartController({}));
  const fs::path marker_dir = root_ / "markers";
  fs::create_directories(marker_dir);
  const std::string m = marker_dir.string();
  const std::vector<std::string> hostile = {
      "../../../../../../etc/passwd",
      "/etc/passwd",
      "..%2f..%2f..%2fetc%2fpasswd",
      "$(touch " + m + "/p1)",
      "`touch " + m + "/p2`",
      "x; touch " + m + "/p3",
      "x | touch " + m + "/p4",
      "x && touch " + m + "/p5",
      "--upload-pack=touch " + m + "/p6",
      "-oProxyCommand=touch " + m + "/p7",
      "ext::sh -c touch% " + m + "/p8",
      "x\ny",
      std::string("nul\0byte", 8),
      std::string(5000, 'A'),
  };
  // A real repository and checkpoint directory, so each hostile value is the only thing wrong
  // and reaches git resolution, hashing or the store.
  ASSERT_NO_FATAL_FAILURE(MakeAdapterRepository(root_ / "adapter"));
  fs::create_directories(root_ / "ckpt" / "checkpoint");
  fs::create_directories(root_ / "ckpt" / "reference");
  WriteTextFile(root_ / "ckpt" / "checkpoint" / "config.json", R"({"model_type":"llama"})");
  WriteTextFile(root_ / "ckpt" / "checkpoint" / "model.safetensors", "weights");
  WriteTextFile(root_ / "ckpt" / "reference" / "reference.json",
                R"({"format":"gatehouse-reference/2"})");
  WriteTextFile(root_ / "ckpt" / "reference" / "reference.safetensors", "reference");
  const json base = {{"repository", (root_ / "adapter").string()}, {"branch", "main"},
                     {"model_family", "llama"},
                     {"checkpoint", (root_ / "ckpt" / "checkpoint").string()}};
  const HttpResponse seeded = SubmitCell(http_port_, base.dump(), token);
  ASSERT_EQ(seeded.status, 201) << seeded.body;
  const std::vector<json::json_pointer> fields = {
      json::json_pointer("/repository"), json::json_pointer("/branch"),
      json::json_pointer("/commit"),     json::json_pointer("/model_family"),
      json::json_pointer("/checkpoint"), json::json_pointer("/reference"),
      json::json_pointer("/precision"),  json::json_pointer("/mode"),
      json::json_pointer("/device"),     json::json_pointer("/runtime/torch"),
      json::json_pointer("/runtime/cuda"), json::json_pointer("/env/GATEHOUSE_X"),
      json::json_pointer("/phases/0")};
  int answered = 0;
  for (const auto& field : fields) {
    for (const std::string& value : hostile) {
      json body = base;
      body[field] = value;
      const HttpResponse r =
          HttpRequest(http_port_, "POST", "/api/v1/cells", body.dump(-1, ' ', false,
                                                                     json::error_handler_t::replace),
                      token);
      SCOPED_TRACE(field.to_string() + " = " + value.substr(0, 60));
      ASSERT_GE(r.status, 200) << r.error;
      EXPECT_LT(r.status, 500) << r.body;
      ++answered;
    }
    // An env variable name full of shell syntax is refused or kept as data too.
    json body = base;
    body["env"] = {{"X$(touch " + m + "/n1)", "v"}};
    const HttpResponse r = HttpRequest(http_port_, "POST", "/api/v1/cells", body.dump(), token);
    EXPECT_LT(r.status, 500) << r.body;
  }
  // Cancel reasons and log stream names are data too.
  for (const std::string& value : hostile) {
    json reason = {{"reason", value}};
    const HttpResponse c = HttpRequest(
        http_port_, "POST", "/api/v1/cells/" + std::string(64, 'a') + "/cancel",
        reason.dump(-1, ' ', false, json::error_handler_t::replace), token);
    EXPECT_LT(c.status, 500) << c.body;
  }
  for (const char* target :
       {"/api/v1/cells/..%2f..%2fetc%2fpasswd", "/api/v1/cells/x/log?stream=../../../etc/passwd",
        "/..%2f..%2f..%2fetc%2fpasswd", "/static/..%2f..%2fCMakeLists.txt", "/%2e%2e/%2e%2e/"}) {
    const HttpResponse r = HttpRequest(http_port_, "GET", target, "", token);
    EXPECT_GE(r.status, 400) << target;
    EXPECT_LT(r.status, 500) << target << " " << r.body;
    EXPECT_EQ(r.body.find("root:"), std::string::npos) << target;
  }
  EXPECT_EQ(answered, static_cast<int>(fields.size() * hostile.size()));
  EXPECT_EQ(HttpRequest(http_port_, "GET", "/healthz").status, 200) << controller_->Stderr();
  EXPECT_TRUE(fs::is_empty(marker_dir)) << "a shell ran user input";
}

}  // namespace
}  // namespace gatehouse::testing
