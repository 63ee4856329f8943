// The controller's command line (controller/options.h): defaults, bounds, the checks across
// flags, and the tokens subcommand. CLI11 and the checks print to stderr; exit codes are read.
#include "controller/options.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

std::variant<ControllerOptions, int> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "gatehouse-controller");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return ParseControllerOptions(static_cast<int>(argv.size()), argv.data(), "/srv/web");
}

int ExitCode(std::vector<std::string> args) {
  auto parsed = Parse(std::move(args));
  const int* code = std::get_if<int>(&parsed);
  return code ? *code : -1;
}

TEST(ControllerOptionsTest, Defaults) {
  auto parsed = Parse({});
  ASSERT_TRUE(std::holds_alternative<ControllerOptions>(parsed));
  const ControllerOptions& o = std::get<ControllerOptions>(parsed);
  EXPECT_EQ(o.http_address.host, "127.0.0.1");
  EXPECT_EQ(o.http_address.port, 8080);
  EXPECT_EQ(o.grpc_host, "127.0.0.1");
  EXPECT_EQ(o.web_dir, "/srv/web");
  EXPECT_EQ(o.identity.torch_pin, "2.11.0");
  EXPECT_TRUE(o.auth.required);
  EXPECT_FALSE(o.auth.anonymous_read);
  EXPECT_EQ(o.lease.heartbeat_interval, std::chrono::milliseconds(kHeartbeatIntervalMs));
  EXPECT_EQ(o.limits.queued, std::chrono::hours(24));
  EXPECT_EQ(o.digests.inline_bytes, 16 << 20);
  EXPECT_EQ(o.artifact_retention_days, 0) << "artifacts are kept unless asked";
  EXPECT_FALSE(o.tokens.has_value());
}

TEST(ControllerOptionsTest, ValuesAreConvertedToTheirUnits) {
  auto parsed = Parse({"--http", "127.0.0.1:0", "--heartbeat-ms", "250", "--restart-grace-ms",
                       "500", "--queued-timeout-s", "60", "--phase-timeout-s", "0",
                       "--max-running-per-repository", "3", "--digest-inline-mib", "0",
                       "--auth", "none", "--anonymous-read", "--artifact-retention-days", "30",
                       "--artifact-max-total-bytes", "1000000"});
  ASSERT_TRUE(std::holds_alternative<ControllerOptions>(parsed));
  const ControllerOptions& o = std::get<ControllerOptions>(parsed);
  EXPECT_EQ(o.http_address.port, 0);
  EXPECT_EQ(o.lease.heartbeat_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(o.lease.restart_grace, std::chrono::milliseconds(500));
  EXPECT_EQ(o.limits.queued, std::chrono::seconds(60));
  EXPECT_EQ(o.limits.phase, std::chrono::seconds(0));
  EXPECT_EQ(o.policy.max_running_per_repository, 3);
  EXPECT_EQ(o.digests.inline_bytes, 0);
  EXPECT_FALSE(o.auth.required);
  EXPECT_TRUE(o.auth.anonymous_read);
  EXPECT_EQ(o.artifact_retention_days, 30);
  EXPECT_EQ(o.artifact_max_total_bytes, 1000000);
}

TEST(ControllerOptionsTest, BadValuesAndInconsistentFlagsEndTheProgram) {
  testing::TempDir dir;
  const std::string pem = (dir.path() / "cert.pem").string();
  std::ofstream(pem) << "not checked here\n";
  EXPECT_EQ(ExitCode({"--http", "nope"}), 2);
  EXPECT_EQ(ExitCode({"--grpc", "127.0.0.1:70000"}), 2);
  EXPECT_GT(ExitCode({"--heartbeat-ms", "50"}), 0) << "CLI11's code for a value out of range";
  // No family list: the family is the adapter's claim, checked by the worker.
  EXPECT_GT(ExitCode({"--families", "llama"}), 0);
  EXPECT_EQ(ExitCode({"--auth", "none", "--http", "0.0.0.0:8080"}), 2);
  EXPECT_GT(ExitCode({"--auth", "maybe"}), 0);
  EXPECT_EQ(ExitCode({"--tls-cert", pem}), 2) << "a certificate without its key";
  EXPECT_EQ(ExitCode({"--tls-client-ca", pem}), 2) << "a client CA without TLS";
  EXPECT_GT(ExitCode({"--no-such-flag"}), 0);
  EXPECT_GT(ExitCode({"--artifact-retention-days", "-1"}), 0);
  EXPECT_EQ(ExitCode({"--help"}), 0);
}

TEST(ControllerOptionsTest, TheTokensSubcommand) {
  auto parsed = Parse({"--db", "/tmp/x.db", "tokens", "create", "--name", "ci", "--scopes",
                       "read,submit"});
  ASSERT_TRUE(std::holds_alternative<ControllerOptions>(parsed));
  const ControllerOptions& o = std::get<ControllerOptions>(parsed);
  ASSERT_TRUE(o.tokens.has_value());
  EXPECT_EQ(o.db, "/tmp/x.db");
  EXPECT_EQ(o.tokens->action, "create");
  EXPECT_EQ(o.tokens->name, "ci");
  EXPECT_EQ(o.tokens->kind, TokenKind::kApi);
  EXPECT_EQ(o.tokens->scopes, (std::vector<Scope>{Scope::kRead, Scope::kSubmit}));
  parsed = Parse({"tokens", "revoke", "7"});
  ASSERT_TRUE(std::holds_alternative<ControllerOptions>(parsed));
  EXPECT_EQ(std::get<ControllerOptions>(parsed).tokens->id, 7);
  EXPECT_EQ(ExitCode({"tokens", "create", "--name", "ci", "--scopes", "read,bogus"}), 2);
  EXPECT_EQ(ExitCode({"tokens", "create", "--name", "x", "--kind", "robot"}), 2);
  EXPECT_GT(ExitCode({"tokens"}), 0) << "a subcommand is required";
}

}  // namespace
}  // namespace gatehouse::controller
