// gatehouse-controller: REST API + dashboard (HTTP), agent service (gRPC), store, git mirror.
// Prints one "gatehouse-controller: <kind> listening on <host>:<port>" line per listener to
// stdout (tests parse them); logs go to stderr. SIGTERM/SIGINT shut it down cleanly.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "controller/agent_service.h"
#include "controller/auth.h"
#include "controller/cell_identity.h"
#include "controller/controller_core.h"
#include "controller/digest_cache.h"
#include "controller/git_mirror.h"
#include "controller/http_server.h"
#include "controller/rest_api.h"
#include "controller/store/store.h"

#ifndef GATEHOUSE_DEFAULT_WEB_DIR
#define GATEHOUSE_DEFAULT_WEB_DIR "web"
#endif

namespace {

namespace fs = std::filesystem;
using namespace gatehouse;
using namespace gatehouse::controller;

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

Result<HostPort> ParseHostPort(const std::string& flag, const std::string& value) {
  const auto colon = value.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status::InvalidArgument("--" + flag + ": expected host:port, got '" + value + "'");
  }
  HostPort hp;
  hp.host = value.substr(0, colon);
  try {
    size_t used = 0;
    const int port = std::stoi(value.substr(colon + 1), &used);
    if (used != value.size() - colon - 1 || port < 0 || port > 65535) throw std::out_of_range("");
    hp.port = static_cast<uint16_t>(port);
  } catch (const std::exception&) {
    return Status::InvalidArgument("--" + flag + ": bad port in '" + value + "'");
  }
  return hp;
}

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

// `gatehouse-controller tokens create|list|revoke`: token administration on the database
// directly (the first admin token has to come from somewhere); the REST routes under
// /api/v1/tokens do the same for a running controller.
int RunTokens(const std::string& db, const std::string& action, const std::string& name,
              const std::string& kind_name, const std::string& scope_list, int64_t token_id) {
  auto store = Store::Open(db, SystemClock());
  if (!store.ok()) {
    std::cerr << "gatehouse-controller: " << store.status().ToString() << "\n";
    return 1;
  }
  Authenticator auth(**store, AuthConfig{});
  if (action == "create") {
    auto kind = ParseTokenKind(kind_name);
    if (!kind.ok()) {
      std::cerr << "gatehouse-controller: --kind: " << kind.status().message() << "\n";
      return 2;
    }
    std::vector<Scope> scopes;
    for (const std::string& item : SplitCommas(scope_list)) {
      auto scope = ParseScope(item);
      if (!scope.ok()) {
        std::cerr << "gatehouse-controller: --scopes: " << scope.status().message() << "\n";
        return 2;
      }
      scopes.push_back(*scope);
    }
    auto issued = auth.Issue(name, *kind, scopes);
    if (!issued.ok()) {
      std::cerr << "gatehouse-controller: " << issued.status().ToString() << "\n";
      return issued.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
    // The secret alone on stdout, so `... tokens create ... > token` works; the rest to stderr.
    std::cerr << "token " << issued->record.id << " '" << issued->record.name << "' ("
              << issued->record.kind
              << (issued->record.scopes.empty() ? "" : ", scopes " + issued->record.scopes)
              << "); the secret is shown only now:\n";
    std::cout << issued->secret << std::endl;
    return 0;
  }
  if (action == "list") {
    auto tokens = auth.ListTokens();
    if (!tokens.ok()) {
      std::cerr << "gatehouse-controller: " << tokens.status().ToString() << "\n";
      return 1;
    }
    for (const TokenRecord& t : *tokens) {
      std::cout << t.id << "\t" << t.name << "\t" << t.kind << "\t"
                << (t.scopes.empty() ? "-" : t.scopes) << "\tcreated " << t.created_at
                << "\tlast used " << (t.last_used_at.empty() ? "never" : t.last_used_at)
                << (t.revoked_at.empty() ? "" : "\trevoked " + t.revoked_at) << "\n";
    }
    return 0;
  }
  auto revoked = auth.Revoke(token_id);
  if (!revoked.ok()) {
    std::cerr << "gatehouse-controller: " << revoked.status().ToString() << "\n";
    return revoked.status().code() == StatusCode::kNotFound ? 2 : 1;
  }
  std::cerr << "token " << revoked->id << " '" << revoked->name << "' revoked at "
            << revoked->revoked_at << "\n";
  return 0;
}

int Run(int argc, char** argv) {
  CLI::App app{"gatehouse-controller: validation cells for model adaptations"};
  std::string db = "var/gatehouse.db";
  std::string http = "127.0.0.1:8080";
  std::string grpc = "127.0.0.1:50051";
  std::string mirror_dir = "var/mirrors";
  std::string web_dir = GATEHOUSE_DEFAULT_WEB_DIR;
  std::string families = "llama,qwen2,qwen3,qwen3_moe,mistral,gemma,gemma2,gemma3,phi3";
  std::string torch_pin = "2.11.0";
  app.add_option("--db", db, "SQLite database file")->capture_default_str();
  app.add_option("--http", http, "REST/dashboard listen address host:port (port 0: any)")
      ->capture_default_str();
  app.add_option("--grpc", grpc, "agent service listen address host:port (port 0: any)")
      ->capture_default_str();
  app.add_option("--mirror-dir", mirror_dir, "directory of bare git mirrors")
      ->capture_default_str();
  app.add_option("--web-dir", web_dir, "dashboard files")->capture_default_str();
  app.add_option("--families", families, "known model families, comma-separated")
      ->capture_default_str();
  app.add_option("--torch-pin", torch_pin, "default runtime.torch of submitted cells")
      ->capture_default_str();
  int heartbeat_ms = gatehouse::controller::kHeartbeatIntervalMs;
  LeaseConfig lease;
  app.add_option("--heartbeat-ms", heartbeat_ms, "agent heartbeat interval told at registration, ms")
      ->capture_default_str()
      ->check(CLI::Range(100, 600000));
  app.add_option("--missed-heartbeats", lease.missed_heartbeats,
                 "an agent silent this many heartbeat intervals is unreachable; its attempts are lost")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--retry-limit", lease.retry_limit,
                 "lost attempts of one cell retried automatically (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  int restart_grace_ms = static_cast<int>(lease.restart_grace.count());
  app.add_option("--restart-grace-ms", restart_grace_ms,
                 "after a start, how long agents holding leases have to reconnect, ms")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600000));
  std::string auth_mode = "tokens";
  app.add_option("--auth", auth_mode,
                 "tokens: every /api/v1 call and every agent needs a bearer token; none: no "
                 "checks (only when both listeners are on loopback)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tokens", "none"}));
  bool anonymous_read = false;
  app.add_flag("--anonymous-read", anonymous_read,
               "GET requests without a token may read cells (a dashboard on a trusted network)");
  std::string tls_cert, tls_key, tls_client_ca;
  app.add_option("--tls-cert", tls_cert, "PEM certificate: serve REST and gRPC over TLS")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", tls_key, "PEM private key of --tls-cert")->check(CLI::ExistingFile);
  app.add_option("--tls-client-ca", tls_client_ca,
                 "PEM CA: agents must present a certificate it signed (mutual TLS on gRPC)")
      ->check(CLI::ExistingFile);

  TimeLimits limits;
  int64_t queued_timeout_s = limits.queued.count(), attempt_timeout_s = limits.attempt.count(),
          phase_timeout_s = limits.phase.count();
  app.add_option("--queued-timeout-s", queued_timeout_s,
                 "a queued attempt waiting longer ends timed_out (0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{365} * 86400));
  app.add_option("--attempt-timeout-s", attempt_timeout_s,
                 "an attempt leased longer (checkout, build, gates) is stopped and ends "
                 "timed_out (0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{365} * 86400));
  app.add_option("--phase-timeout-s", phase_timeout_s,
                 "a gate running longer stops its attempt, which ends timed_out (0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{365} * 86400));

  SchedulingPolicy policy;
  app.add_option("--max-running-per-repository", policy.max_running_per_repository,
                 "at most this many attempts of one repository leased or running at once "
                 "(0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));

  CLI::App* tokens = app.add_subcommand("tokens", "create, list or revoke API and agent tokens");
  tokens->require_subcommand(1);
  tokens->fallthrough();
  std::string token_name, token_kind = "api", token_scopes;
  int64_t token_id = 0;
  CLI::App* create = tokens->add_subcommand("create", "issue a token; prints its secret once");
  create->add_option("--name", token_name, "unique among active tokens: [A-Za-z0-9._-]{1,100}")
      ->required();
  create->add_option("--kind", token_kind, "api or agent")->capture_default_str();
  create->add_option("--scopes", token_scopes, "api tokens: comma-separated read,submit,admin");
  CLI::App* list = tokens->add_subcommand("list", "list tokens (never their secrets)");
  CLI::App* revoke = tokens->add_subcommand("revoke", "revoke a token now");
  revoke->add_option("id", token_id, "token id (see list)")->required();
  CLI11_PARSE(app, argc, argv);
  if (tokens->parsed()) {
    const std::string action = create->parsed() ? "create" : list->parsed() ? "list" : "revoke";
    (void)revoke;
    return RunTokens(db, action, token_name, token_kind, token_scopes, token_id);
  }
  lease.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  limits.queued = std::chrono::seconds(queued_timeout_s);
  limits.attempt = std::chrono::seconds(attempt_timeout_s);
  limits.phase = std::chrono::seconds(phase_timeout_s);
  lease.restart_grace = std::chrono::milliseconds(restart_grace_ms);

  spdlog::set_default_logger(spdlog::stderr_color_mt("gatehouse-controller"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  auto http_addr = ParseHostPort("http", http);
  if (!http_addr.ok()) {
    spdlog::error("{}", http_addr.status().message());
    return 2;
  }
  SubmitContext identity;
  identity.families = SplitCommas(families);
  identity.torch_pin = torch_pin;
  if (identity.families.empty()) {
    spdlog::error("--families: no family named");
    return 2;
  }

  // Block the shutdown signals in every thread; the main thread waits for them below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::error_code ec;
  if (db != ":memory:" && fs::path(db).has_parent_path()) {
    fs::create_directories(fs::path(db).parent_path(), ec);
  }
  auto store = Store::Open(db, SystemClock());
  if (!store.ok()) {
    spdlog::error("{}", store.status().ToString());
    return 1;
  }
  GitMirror mirror(mirror_dir);
  DigestCache digests;
  CellFreezer freezer(identity, mirror, digests);
  ControllerCore core(**store, freezer, lease, SystemClock(), limits, policy, SteadyClock());
  // Attempts left queued by an earlier run are placed as agents connect; leases of agents that
  // stay away expire and time limits are enforced (both every second).
  core.StartBackgroundWork();
  auto grpc_addr = ParseHostPort("grpc", grpc);
  const std::string grpc_host = grpc_addr.ok() ? grpc_addr->host : grpc;
  AuthConfig auth_config;
  auth_config.required = auth_mode == "tokens";
  auth_config.anonymous_read = anonymous_read;
  if (!auth_config.required && !(IsLoopback(http_addr->host) && IsLoopback(grpc_host))) {
    spdlog::error("--auth none: refused, a listener is not on loopback (--http {}, --grpc {})",
                  http, grpc);
    return 2;
  }
  if (tls_cert.empty() != tls_key.empty()) {
    spdlog::error("--tls-cert and --tls-key go together");
    return 2;
  }
  if (!tls_client_ca.empty() && tls_cert.empty()) {
    spdlog::error("--tls-client-ca needs --tls-cert and --tls-key");
    return 2;
  }
  Authenticator auth(**store, auth_config);
  if (auth_config.required) {
    auto existing = auth.ListTokens();
    if (existing.ok() && existing->empty()) {
      spdlog::warn("no tokens yet: create one with `gatehouse-controller --db {} tokens create "
                   "--name NAME --scopes read,submit,admin` (agents: --kind agent)",
                   db);
    }
  } else {
    spdlog::warn("--auth none: no token is checked (loopback only)");
  }
  RestApi api(core, auth, web_dir);

  HttpServer::Options http_options;
  http_options.address = http_addr->host;
  http_options.port = http_addr->port;
  http_options.tls_cert_file = tls_cert;
  http_options.tls_key_file = tls_key;
  auto http_server =
      HttpServer::Start(http_options, [&api](const HttpRequest& r) { return api.Handle(r); });
  if (!http_server.ok()) {
    spdlog::error("{}", http_server.status().ToString());
    return 1;
  }
  AgentRpcServer::Options rpc_options;
  rpc_options.auth = auth_config.required ? &auth : nullptr;
  rpc_options.tls_cert_file = tls_cert;
  rpc_options.tls_key_file = tls_key;
  rpc_options.tls_client_ca_file = tls_client_ca;
  auto rpc_server = AgentRpcServer::Start(grpc, core, rpc_options);
  if (!rpc_server.ok()) {
    spdlog::error("{}", rpc_server.status().ToString());
    return 1;
  }
  std::cout << "gatehouse-controller: http listening on " << http_addr->host << ":"
            << (*http_server)->port() << "\n"
            << "gatehouse-controller: grpc listening on " << grpc_host << ":"
            << (*rpc_server)->port() << std::endl;
  spdlog::info("database {}, mirrors {}, web {}, families {}, torch pin {}, auth {}{}, tls {}{}",
               db, mirror_dir, web_dir, families, torch_pin, auth_mode,
               anonymous_read ? " (anonymous read)" : "", tls_cert.empty() ? "off" : "on",
               tls_client_ca.empty() ? "" : " (agents: mutual)");

  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("signal {}: shutting down", signal);
  core.StopBackgroundWork();
  (*http_server)->Stop();
  (*rpc_server)->Shutdown();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gatehouse-controller: fatal: %s\n", e.what());
    return 1;
  }
}
