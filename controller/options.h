// The controller's command line: every flag, its default and its bounds, parsed and checked in
// one place (CLI11), so controller/main.cc is wiring only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/cell_spec.h"
#include "common/status.h"
#include "controller/auth.h"
#include "controller/controller_core.h"
#include "controller/scheduler.h"
#include "controller/store/blob_store.h"
#include "controller/webhook.h"

namespace gatehouse::controller {

/// A listen address "host:port" (port 0: any free port).
struct HostPort {
  std::string host;
  uint16_t port = 0;
};

/// Parses "host:port" for flag `flag`. Errors: INVALID_ARGUMENT naming the flag and the value.
Result<HostPort> ParseHostPort(const std::string& flag, const std::string& value);

/// True for localhost, ::1 and 127.0.0.0/8.
bool IsLoopback(const std::string& host);

/// `gatehouse-controller tokens create|list|revoke`: token administration on the database.
struct TokenCommand {
  std::string action;  // "create" | "list" | "revoke"
  std::string name;    // create: --name
  TokenKind kind = TokenKind::kApi;
  std::vector<Scope> scopes;  // create: --scopes
  int64_t id = 0;             // revoke: the token id
};

/// Everything the controller is started with.
struct ControllerOptions {
  std::string db = "var/gatehouse.db";
  std::string http = "127.0.0.1:8080";  // --http, as given
  HostPort http_address;                // parsed
  std::string grpc = "127.0.0.1:50051";
  std::string grpc_host;                // the host part of --grpc
  std::string mirror_dir = "var/mirrors";
  std::string artifact_dir = "var/artifacts";  // the blob store (protocols.md §7)
  BlobLimits artifacts;                         // --artifact-max-bytes
  int artifact_retention_days = 0;              // --artifact-retention-days; 0: keep
  int64_t artifact_max_total_bytes = 0;         // --artifact-max-total-bytes; 0: no cap
  std::string web_dir;
  SubmitContext identity;  // --torch-pin
  DigestCache::Options digests;  // --digest-inline-mib
  LeaseConfig lease;       // --heartbeat-ms, --missed-heartbeats, --retry-limit, --restart-grace-ms
  TimeLimits limits;       // --queued-timeout-s, --attempt-timeout-s, --phase-timeout-s
  SchedulingPolicy policy;  // --max-running-per-repository
  AuthConfig auth;          // --auth, --anonymous-read
  std::string tls_cert, tls_key, tls_client_ca;
  /// --webhook-url, --webhook-max-tries, --webhook-timeout-s; the secret is read from
  /// --webhook-secret-file (never taken from argv).
  WebhookConfig webhook;
  std::string webhook_ca_file;  // --webhook-ca-file: PEM CAs for an https receiver
  /// Set when the command line is `tokens ...` (the controller does not start).
  std::optional<TokenCommand> tokens;
};

/// Parses and checks the command line. On success the options are complete and consistent:
/// listen addresses parse, at least one family is named, --auth none only with both listeners
/// on loopback, --tls-cert with --tls-key, --tls-client-ca only with both. When the command
/// line ends the program here (also: --webhook-secret-file unreadable or empty, or
/// --webhook-url not http(s)://), returns the exit code after printing why to stderr: 0 for
/// --help, CLI11's own non-zero code for a flag it refuses (unknown, out of range, missing),
/// 2 for a failed check above (the message names the flags).
/// `default_web_dir` is the --web-dir default.
std::variant<ControllerOptions, int> ParseControllerOptions(int argc, const char* const* argv,
                                                            const std::string& default_web_dir);

}  // namespace gatehouse::controller
