#include "controller/options.h"

#include <iostream>

#include <CLI/CLI.hpp>

#include "common/file_util.h"

namespace gatehouse::controller {
namespace {

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

// The checks across flags, after CLI11 has read each one.
Status Check(ControllerOptions& o) {
  GH_ASSIGN_OR_RETURN(o.http_address, ParseHostPort("http", o.http));
  GH_ASSIGN_OR_RETURN(const HostPort grpc, ParseHostPort("grpc", o.grpc));
  o.grpc_host = grpc.host;
  if (!o.auth.required && !(IsLoopback(o.http_address.host) && IsLoopback(o.grpc_host))) {
    return Status::InvalidArgument("--auth none: refused, a listener is not on loopback (--http " +
                                   o.http + ", --grpc " + o.grpc + ")");
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return Status::InvalidArgument("--tls-cert and --tls-key go together");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return Status::InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key");
  }
  return Status::Ok();
}

}  // namespace

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

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

std::variant<ControllerOptions, int> ParseControllerOptions(int argc, const char* const* argv,
                                                            const std::string& default_web_dir) {
  ControllerOptions o;
  o.web_dir = default_web_dir;
  CLI::App app{"gatehouse-controller: validation cells for model adaptations"};
  o.identity.torch_pin = "2.11.0";
  app.add_option("--db", o.db, "SQLite database file")->capture_default_str();
  app.add_option("--http", o.http, "REST/dashboard listen address host:port (port 0: any)")
      ->capture_default_str();
  app.add_option("--grpc", o.grpc, "agent service listen address host:port (port 0: any)")
      ->capture_default_str();
  app.add_option("--mirror-dir", o.mirror_dir, "directory of bare git mirrors")
      ->capture_default_str();
  app.add_option("--web-dir", o.web_dir, "dashboard files")->capture_default_str();
  app.add_option("--artifact-dir", o.artifact_dir,
                 "content-addressed store of the attempts' artifacts (reference bundles)")
      ->capture_default_str();
  app.add_option("--artifact-max-bytes", o.artifacts.max_blob_bytes,
                 "largest artifact file an agent may store, bytes")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 50));
  app.add_option("--artifact-retention-days", o.artifact_retention_days,
                 "remove an artifact not stored, handed to an attempt or fetched for this many "
                 "days (a reference cell whose bundle is removed runs again when a cell needs "
                 "it); 0 keeps every artifact")
      ->capture_default_str()
      ->check(CLI::Range(0, 36500));
  app.add_option("--artifact-max-total-bytes", o.artifact_max_total_bytes,
                 "while the stored artifacts hold more bytes than this, remove the least "
                 "recently used (never one used within the last hour or held by an attempt "
                 "still going); 0: no cap")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 60));
  app.add_option("--torch-pin", o.identity.torch_pin, "default runtime.torch of submitted cells")
      ->capture_default_str();
  app.add_option("--transformers-pin", o.identity.transformers_pin,
                 "default runtime.transformers of reference cells")
      ->capture_default_str();
  int64_t digest_inline_mib = o.digests.inline_bytes >> 20;
  app.add_option("--digest-inline-mib", digest_inline_mib,
                 "a submit hashes up to this much of a checkpoint or reference not digested "
                 "yet itself; more is hashed in the background and the submit answers 202 "
                 "(0: always in the background)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1024}));
  int heartbeat_ms = static_cast<int>(o.lease.heartbeat_interval.count());
  app.add_option("--heartbeat-ms", heartbeat_ms, "agent heartbeat interval told at registration, ms")
      ->capture_default_str()
      ->check(CLI::Range(100, 600000));
  app.add_option("--missed-heartbeats", o.lease.missed_heartbeats,
                 "an agent silent this many heartbeat intervals is unreachable; its attempts are lost")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--retry-limit", o.lease.retry_limit,
                 "lost attempts of one cell retried automatically (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  int restart_grace_ms = static_cast<int>(o.lease.restart_grace.count());
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
  app.add_flag("--anonymous-read", o.auth.anonymous_read,
               "GET requests without a token may read cells (a dashboard on a trusted network)");
  app.add_option("--tls-cert", o.tls_cert, "PEM certificate: serve REST and gRPC over TLS")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", o.tls_key, "PEM private key of --tls-cert")->check(CLI::ExistingFile);
  app.add_option("--tls-client-ca", o.tls_client_ca,
                 "PEM CA: agents must present a certificate it signed (mutual TLS on gRPC)")
      ->check(CLI::ExistingFile);

  int64_t queued_timeout_s = o.limits.queued.count(), attempt_timeout_s = o.limits.attempt.count(),
          phase_timeout_s = o.limits.phase.count();
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
  app.add_option("--max-running-per-repository", o.policy.max_running_per_repository,
                 "at most this many attempts of one repository leased or running at once "
                 "(0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));

  app.add_option("--webhook-url", o.webhook.url,
                 "POST every cell end here (http:// or https://; docs/protocols.md §8)");
  std::string webhook_secret_file;
  app.add_option("--webhook-secret-file", webhook_secret_file,
                 "file holding the HMAC-SHA256 key of the X-Gatehouse-Signature-256 header")
      ->check(CLI::ExistingFile);
  app.add_option("--webhook-ca-file", o.webhook_ca_file,
                 "PEM CAs that sign an https receiver's certificate (default: the system's)")
      ->check(CLI::ExistingFile);
  app.add_option("--webhook-max-tries", o.webhook.max_tries,
                 "POSTs per delivery (backoff doubling from 2 s up to 10 min) before it fails")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  int64_t webhook_timeout_s = 10;
  app.add_option("--webhook-timeout-s", webhook_timeout_s, "per try: connect, send and answer")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{600}));

  CLI::App* tokens = app.add_subcommand("tokens", "create, list or revoke API and agent tokens");
  tokens->require_subcommand(1);
  tokens->fallthrough();
  TokenCommand command;
  std::string token_kind = "api", token_scopes;
  CLI::App* create = tokens->add_subcommand("create", "issue a token; prints its secret once");
  create->add_option("--name", command.name, "unique among active tokens: [A-Za-z0-9._-]{1,100}")
      ->required();
  create->add_option("--kind", token_kind, "api or agent")->capture_default_str();
  create->add_option("--scopes", token_scopes, "api tokens: comma-separated read,submit,admin");
  CLI::App* list = tokens->add_subcommand("list", "list tokens (never their secrets)");
  CLI::App* revoke = tokens->add_subcommand("revoke", "revoke a token now");
  revoke->add_option("id", command.id, "token id (see list)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const auto fail = [](const std::string& message) {
    std::cerr << "gatehouse-controller: " << message << "\n";
    return 2;
  };
  if (tokens->parsed()) {
    command.action = create->parsed() ? "create" : list->parsed() ? "list" : "revoke";
    if (create->parsed()) {
      auto kind = ParseTokenKind(token_kind);
      if (!kind.ok()) return fail("--kind: " + kind.status().message());
      command.kind = *kind;
      for (const std::string& item : SplitCommas(token_scopes)) {
        auto scope = ParseScope(item);
        if (!scope.ok()) return fail("--scopes: " + scope.status().message());
        command.scopes.push_back(*scope);
      }
    }
    o.tokens = std::move(command);
    return o;
  }
  o.digests.inline_bytes = digest_inline_mib << 20;
  o.lease.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  o.lease.restart_grace = std::chrono::milliseconds(restart_grace_ms);
  o.limits.queued = std::chrono::seconds(queued_timeout_s);
  o.limits.attempt = std::chrono::seconds(attempt_timeout_s);
  o.limits.phase = std::chrono::seconds(phase_timeout_s);
  o.auth.required = auth_mode == "tokens";
  o.webhook.timeout = std::chrono::seconds(webhook_timeout_s);
  if (!o.webhook.url.empty() && o.webhook.url.rfind("http://", 0) != 0 &&
      o.webhook.url.rfind("https://", 0) != 0) {
    return fail("--webhook-url '" + o.webhook.url + "': must start with http:// or https://");
  }
  if (!webhook_secret_file.empty()) {
    auto secret = ReadSecretFile(webhook_secret_file, "--webhook-secret-file");
    if (!secret.ok()) return fail(secret.status().message());
    o.webhook.secret = std::move(*secret);
  }
  if (Status s = Check(o); !s.ok()) return fail(s.message());
  return o;
}

}  // namespace gatehouse::controller
