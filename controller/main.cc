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

#include "controller/agent_service.h"
#include "controller/auth.h"
#include "controller/cell_identity.h"
#include "controller/controller_core.h"
#include "controller/digest_cache.h"
#include "controller/git_mirror.h"
#include "controller/http_server.h"
#include "controller/loops.h"
#include "controller/options.h"
#include "controller/rest_api.h"
#include "controller/store/store.h"
#include "controller/webhook.h"
#include "controller/webhook_client.h"

#ifndef GATEHOUSE_DEFAULT_WEB_DIR
#define GATEHOUSE_DEFAULT_WEB_DIR "web"
#endif

namespace {

namespace fs = std::filesystem;
using namespace gatehouse;
using namespace gatehouse::controller;

// `gatehouse-controller tokens create|list|revoke`: token administration on the database
// directly (the first admin token has to come from somewhere); the REST routes under
// /api/v1/tokens do the same for a running controller.
int RunTokens(const std::string& db, const TokenCommand& command) {
  auto store = Store::Open(db, SystemClock());
  if (!store.ok()) {
    std::cerr << "gatehouse-controller: " << store.status().ToString() << "\n";
    return 1;
  }
  Authenticator auth(**store, AuthConfig{});
  if (command.action == "create") {
    auto issued = auth.Issue(command.name, command.kind, command.scopes);
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
  if (command.action == "list") {
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
  auto revoked = auth.Revoke(command.id);
  if (!revoked.ok()) {
    std::cerr << "gatehouse-controller: " << revoked.status().ToString() << "\n";
    return revoked.status().code() == StatusCode::kNotFound ? 2 : 1;
  }
  std::cerr << "token " << revoked->id << " '" << revoked->name << "' revoked at "
            << revoked->revoked_at << "\n";
  return 0;
}

int Run(int argc, char** argv) {
  auto parsed = ParseControllerOptions(argc, argv, GATEHOUSE_DEFAULT_WEB_DIR);
  if (const int* exit_code = std::get_if<int>(&parsed)) return *exit_code;
  const ControllerOptions& o = std::get<ControllerOptions>(parsed);
  if (o.tokens) return RunTokens(o.db, *o.tokens);

  spdlog::set_default_logger(spdlog::stderr_color_mt("gatehouse-controller"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  // Block the shutdown signals in every thread; the main thread waits for them below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::error_code ec;
  if (o.db != ":memory:" && fs::path(o.db).has_parent_path()) {
    fs::create_directories(fs::path(o.db).parent_path(), ec);
  }
  auto store = Store::Open(o.db, SystemClock());
  if (!store.ok()) {
    spdlog::error("{}", store.status().ToString());
    return 1;
  }
  GitMirror mirror(o.mirror_dir);
  // Checkpoints are hashed on the cache's thread (a submit waiting for one answers 202), each
  // file once: its digest is kept in the store across restarts.
  StoreDigestBook digest_book(**store);
  DigestCache::Options digest_options = o.digests;
  digest_options.book = &digest_book;
  DigestCache digests(digest_options);
  CellFreezer freezer(o.identity, mirror, digests);
  ControllerCore core(**store, freezer, o.lease, SystemClock(), o.limits, o.policy,
                      SteadyClock());
  auto blobs = BlobStore::Open(o.artifact_dir, o.artifacts);
  if (!blobs.ok()) {
    spdlog::error("{}", blobs.status().ToString());
    return 1;
  }
  core.SetBlobStore(blobs->get());
  core.SetArtifactRetention(std::chrono::hours(24) * o.artifact_retention_days,
                            o.artifact_max_total_bytes);
  // Attempts left queued by an earlier run are placed as agents connect; leases of agents that
  // stay away expire and time limits are enforced (both every second).
  core.StartBackgroundWork();
  // Cell ends go to --webhook-url from the store's outbox, on a thread of their own: a receiver
  // that is slow or down delays deliveries, never a verdict (protocols.md §8).
  WebhookSender webhooks(**store, o.webhook, MakeHttpWebhookPoster(o.webhook_ca_file),
                         SystemClock());
  PeriodicLoop webhook_loop([&webhooks] { webhooks.RunOnce(); }, std::chrono::seconds(1));
  webhook_loop.Start();
  Authenticator auth(**store, o.auth);
  if (o.auth.required) {
    auto existing = auth.ListTokens();
    if (existing.ok() && existing->empty()) {
      spdlog::warn("no tokens yet: create one with `gatehouse-controller --db {} tokens create "
                   "--name NAME --scopes read,submit,admin` (agents: --kind agent)",
                   o.db);
    }
  } else {
    spdlog::warn("--auth none: no token is checked (loopback only)");
  }
  RestApi api(core, auth, o.web_dir);

  HttpServer::Options http_options;
  http_options.address = o.http_address.host;
  http_options.port = o.http_address.port;
  http_options.tls_cert_file = o.tls_cert;
  http_options.tls_key_file = o.tls_key;
  auto http_server =
      HttpServer::Start(http_options, [&api](const HttpRequest& r) { return api.Handle(r); });
  if (!http_server.ok()) {
    spdlog::error("{}", http_server.status().ToString());
    return 1;
  }
  AgentRpcServer::Options rpc_options;
  rpc_options.auth = o.auth.required ? &auth : nullptr;
  rpc_options.tls_cert_file = o.tls_cert;
  rpc_options.tls_key_file = o.tls_key;
  rpc_options.tls_client_ca_file = o.tls_client_ca;
  auto rpc_server = AgentRpcServer::Start(o.grpc, core, rpc_options);
  if (!rpc_server.ok()) {
    spdlog::error("{}", rpc_server.status().ToString());
    return 1;
  }
  std::cout << "gatehouse-controller: http listening on " << o.http_address.host << ":"
            << (*http_server)->port() << "\n"
            << "gatehouse-controller: grpc listening on " << o.grpc_host << ":"
            << (*rpc_server)->port() << std::endl;
  spdlog::info("database {}, mirrors {}, artifacts {}, web {}, torch pin {}, transformers pin {}, "
               "webhook {}{}, auth {}{}, tls {}{}",
               o.db, o.mirror_dir, o.artifact_dir, o.web_dir, o.identity.torch_pin,
               o.identity.transformers_pin, o.webhook.url.empty() ? "none" : RedactedUrl(o.webhook.url),
               o.webhook.url.empty() ? "" : (o.webhook.secret.empty() ? " (unsigned)" : " (signed)"),
               o.auth.required ? "tokens" : "none", o.auth.anonymous_read ? " (anonymous read)" : "",
               o.tls_cert.empty() ? "off" : "on", o.tls_client_ca.empty() ? "" : " (agents: mutual)");

  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("signal {}: shutting down", signal);
  core.StopBackgroundWork();
  webhooks.RequestStop();
  webhook_loop.Stop();
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
