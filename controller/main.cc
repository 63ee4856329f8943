// gatehouse-controller: REST API + dashboard (HTTP), agent service (gRPC), store, git mirror.
// Prints one "gatehouse-controller: <kind> listening on <host>:<port>" line per listener to
// stdout (tests parse them); logs go to stderr. SIGTERM/SIGINT shut it down cleanly.
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "controller/agent_service.h"
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
  CLI11_PARSE(app, argc, argv);
  lease.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  lease.restart_grace = std::chrono::milliseconds(restart_grace_ms);

  spdlog::set_default_logger(spdlog::stderr_color_mt("gatehouse-controller"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  auto http_addr = ParseHostPort("http", http);
  if (!http_addr.ok()) {
    spdlog::error("{}", http_addr.status().message());
    return 2;
  }
  IdentityConfig identity;
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
  ControllerCore core(**store, freezer, lease);
  RestApi api(core, web_dir);

  HttpServer::Options http_options;
  http_options.address = http_addr->host;
  http_options.port = http_addr->port;
  auto http_server =
      HttpServer::Start(http_options, [&api](const HttpRequest& r) { return api.Handle(r); });
  if (!http_server.ok()) {
    spdlog::error("{}", http_server.status().ToString());
    return 1;
  }
  auto rpc_server = AgentRpcServer::Start(grpc, core);
  if (!rpc_server.ok()) {
    spdlog::error("{}", rpc_server.status().ToString());
    return 1;
  }
  auto grpc_addr = ParseHostPort("grpc", grpc);
  const std::string grpc_host = grpc_addr.ok() ? grpc_addr->host : grpc;
  std::cout << "gatehouse-controller: http listening on " << http_addr->host << ":"
            << (*http_server)->port() << "\n"
            << "gatehouse-controller: grpc listening on " << grpc_host << ":"
            << (*rpc_server)->port() << std::endl;
  spdlog::info("database {}, mirrors {}, web {}, families {}, torch pin {}", db, mirror_dir,
               web_dir, families, torch_pin);

  // Attempts left queued by an earlier run are placed as agents connect; leases of agents that
  // stay away expire (ExpireLeases, checked every second).
  std::mutex reaper_mu;
  std::condition_variable reaper_cv;
  bool stopping = false;
  std::thread reaper([&] {
    std::unique_lock lock(reaper_mu);
    while (!reaper_cv.wait_for(lock, std::chrono::seconds(1), [&] { return stopping; })) {
      lock.unlock();
      core.ExpireLeases();
      lock.lock();
    }
  });
  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("signal {}: shutting down", signal);
  {
    std::lock_guard lock(reaper_mu);
    stopping = true;
  }
  reaper_cv.notify_all();
  reaper.join();
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
