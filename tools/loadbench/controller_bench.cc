// gatehouse-controller-bench: load figures for the controller (issue 5), printed, not asserted.
//
//   seed       --db DB --cells N            N finished cells straight into a database (SQLite
//                                           rows in one transaction; the schema via Store)
//   agents     --grpc H:P --http P ...      N simulated agents on loopback gRPC, each taking an
//                                           attempt at a time and ending it at once; cells
//                                           submitted over REST from several threads; prints
//                                           submits/s, placements/s, submit-to-lease p50/p99
//   get        --http P --target T ...      closed-loop REST GETs over keep-alive connections
//                                           for a time; prints requests/s and latency p50/p99
//   dashboard  --http P ...                 what the cells page loads (HTML, CSS, JS, the first
//                                           50 cells), repeated; prints the page time
//
// tools/loadbench/run.sh runs all four against real controller processes and prints the table.
#include <grpcpp/grpcpp.h>
#include <sqlite3.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/cell_spec.h"
#include "common/file_util.h"
#include "common/sha256.h"
#include "controller/clock.h"
#include "controller/store/store.h"
#include "gatehouse/agent/v1/agent.grpc.pb.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace pb = gatehouse::agent::v1;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

/// The q-quantile (0..1) of `v` (sorted here), nearest rank.
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

std::string ReadSecret(const std::string& path) {
  auto secret = gatehouse::ReadSecretFile(path, "token file");
  if (!secret.ok()) throw std::runtime_error(secret.status().ToString());
  return std::move(secret).value();
}

/// One keep-alive HTTP/1.1 connection to 127.0.0.1:port (reconnects when the server closes).
class HttpConnection {
 public:
  HttpConnection(int port, std::string token) : port_(port), token_(std::move(token)) {}

  /// Sends a request and returns (status, body); throws on a transport error.
  std::pair<int, std::string> Request(http::verb method, const std::string& target,
                                      const std::string& body = "") {
    for (int attempt = 0;; ++attempt) {
      try {
        if (!stream_) Connect();
        http::request<http::string_body> req{method, target, 11};
        req.set(http::field::host, "127.0.0.1");
        req.keep_alive(true);
        if (!token_.empty()) req.set(http::field::authorization, "Bearer " + token_);
        if (!body.empty()) {
          req.set(http::field::content_type, "application/json");
          req.body() = body;
        }
        req.prepare_payload();
        http::write(*stream_, req);
        http::response<http::string_body> res;
        http::read(*stream_, buffer_, res);
        if (!res.keep_alive()) stream_.reset();
        return {static_cast<int>(res.result_int()), std::move(res.body())};
      } catch (const std::exception&) {
        stream_.reset();
        if (attempt >= 2) throw;
      }
    }
  }

 private:
  void Connect() {
    stream_ = std::make_unique<beast::tcp_stream>(ioc_);
    stream_->connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"),
                                            static_cast<unsigned short>(port_)));
    buffer_.clear();
  }
  int port_;
  std::string token_;
  net::io_context ioc_;
  std::unique_ptr<beast::tcp_stream> stream_;
  beast::flat_buffer buffer_;
};

// ---------------------------------------------------------------------------------------------
// seed

int Seed(const std::string& db_path, int cells) {
  {
    auto store = gatehouse::controller::Store::Open(db_path, gatehouse::controller::SystemClock());
    if (!store.ok()) {
      std::cerr << store.status().ToString() << "\n";
      return 1;
    }
  }
  sqlite3* db = nullptr;
  if (sqlite3_open(db_path.c_str(), &db) != SQLITE_OK) return 1;
  const auto start = Clock::now();
  sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
  sqlite3_stmt* cell = nullptr;
  sqlite3_stmt* attempt = nullptr;
  sqlite3_prepare_v2(db,
                     "INSERT INTO cells(id, spec_json, repository, commit_sha, branch, "
                     "model_family, created_at, submitter, priority) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
                     -1, &cell, nullptr);
  sqlite3_prepare_v2(db,
                     "INSERT INTO attempts(cell_id, number, state, agent_id, created_at, started_at, "
                     "ended_at, leased_at) VALUES (?, 1, 'passed', 'bench-agent', ?, ?, ?, ?)",
                     -1, &attempt, nullptr);
  std::string last_id;
  for (int i = 0; i < cells; ++i) {
    gatehouse::CellSpec spec;  // a complete frozen spec, as a submit would store
    spec.repository = "/repos/adapter-" + std::to_string(i % 50);
    spec.commit = gatehouse::Sha256Hex(std::to_string(i)).substr(0, 40);
    // 40 families x 5 checkpoints x {fp32, bf16} x {tp 1, 2}: the matrix's 200 rows, 4 columns.
    spec.model_family = "family" + std::to_string(i % 40);
    spec.checkpoint = {"/data/family" + std::to_string(i % 40) + "/ckpt" + std::to_string(i / 40 % 5),
                       "sha256:" + std::string(63, '1') + std::to_string(i / 40 % 5)};
    spec.precision = i / 200 % 2 ? "bf16" : "fp32";
    spec.topology.tp = 1 + i / 400 % 2;
    spec.reference = {"/data/llama-tiny/reference", "sha256:" + std::string(64, '2')};
    spec.runtime.torch = "2.11.0";
    spec.training.seed = i;
    spec.phases = {"identity", "config", "load", "inference"};
    const std::string spec_json = gatehouse::CanonicalSpecJson(spec);
    last_id = gatehouse::Sha256Hex(spec_json);
    const std::string ts = gatehouse::controller::FormatTimestamp(
        std::chrono::system_clock::now() - std::chrono::seconds(cells - i));
    const std::string repo = spec.repository, commit = spec.commit;
    sqlite3_bind_text(cell, 1, last_id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(cell, 2, spec_json.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(cell, 3, repo.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(cell, 4, commit.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(cell, 5, "main", -1, SQLITE_STATIC);
    sqlite3_bind_text(cell, 6, spec.model_family.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(cell, 7, ts.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(cell, 8, i % 7 == 0 ? "nightly" : "ci", -1, SQLITE_STATIC);
    if (sqlite3_step(cell) != SQLITE_DONE) {
      std::cerr << "insert cell: " << sqlite3_errmsg(db) << "\n";
      return 1;
    }
    sqlite3_reset(cell);
    for (int c = 2; c <= 5; ++c) sqlite3_bind_text(attempt, c, ts.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(attempt, 1, last_id.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(attempt) != SQLITE_DONE) {
      std::cerr << "insert attempt: " << sqlite3_errmsg(db) << "\n";
      return 1;
    }
    sqlite3_reset(attempt);
  }
  sqlite3_finalize(cell);
  sqlite3_finalize(attempt);
  sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  std::printf("seeded %d cells in %.1f s; last cell %s\n", cells, Ms(Clock::now() - start) / 1000,
              last_id.c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// agents

struct LeaseLog {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Clock::time_point> leased;  // cell id -> first lease seen
  size_t count = 0;
};

/// One simulated agent: its own channel (one TCP connection) and Connect stream, registers
/// with slots 1, ends every assignment at once (run_end PASS, then the end), heartbeats through
/// Heartbeat(). A gRPC callback-API client reactor, so 1,000 agents need no 1,000 threads in
/// this process (the controller's share of the two cores is what is measured).
class SimAgent : public grpc::ClientBidiReactor<pb::AgentMessage, pb::ControllerMessage> {
 public:
  SimAgent(std::string target, std::string token, std::string name, LeaseLog& log,
           std::atomic<int>& registered)
      : target_(std::move(target)), token_(std::move(token)), name_(std::move(name)), log_(log),
        registered_(registered) {}

  /// Opens the stream and sends Register; returns at once.
  void Start() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one TCP connection per agent
    channel_ = grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args);
    stub_ = pb::AgentService::NewStub(channel_);
    if (!token_.empty()) context_.AddMetadata("authorization", "Bearer " + token_);
    stub_->async()->Connect(&context_, this);
    pb::AgentMessage hello;
    hello.mutable_register_()->set_agent_name(name_);
    pb::Capabilities* caps = hello.mutable_register_()->mutable_capabilities();
    caps->set_slots(1);
    caps->set_torch_version("2.11.0");
    (*caps->mutable_labels())["lane"] = "cpu";
    AddHold();  // writes start from the heartbeat thread too; released by Stop()
    Write(std::move(hello));
    StartRead(&in_);
    StartCall();
  }

  void Heartbeat() {
    pb::AgentMessage hb;
    hb.mutable_heartbeat()->set_seq(1);
    Write(std::move(hb));
  }

  /// Cancels the stream and waits until gRPC is done with it.
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
    }
    context_.TryCancel();
    RemoveHold();
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [this] { return done_; });
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (in_.has_registered()) ++registered_;
    if (in_.has_assignment()) {
      const auto now = Clock::now();
      {
        std::lock_guard lock(log_.mu);
        if (log_.leased.emplace(in_.assignment().cell_id(), now).second) ++log_.count;
      }
      log_.cv.notify_all();
      pb::AgentMessage event;
      event.mutable_event()->set_attempt_id(in_.assignment().attempt_id());
      event.mutable_event()->set_seq(1);
      event.mutable_event()->set_json(R"({"event":"run_end","status":"PASS"})");
      Write(std::move(event));
      pb::AgentMessage end;
      end.mutable_end()->set_attempt_id(in_.assignment().attempt_id());
      end.mutable_end()->set_seq(2);
      end.mutable_end()->set_outcome("finished");
      Write(std::move(end));
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    bool start = false;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      if (!ok) queue_.clear();
      if (!queue_.empty()) {
        in_flight_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = start = true;
      }
    }
    if (start) StartWrite(&in_flight_);
  }

  void OnDone(const grpc::Status&) override {
    std::lock_guard lock(mu_);
    done_ = true;
    done_cv_.notify_all();
  }

 private:
  // One write in flight at a time (the callback API's rule); the rest wait in queue_.
  void Write(pb::AgentMessage m) {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      if (writing_) {
        queue_.push_back(std::move(m));
        return;
      }
      in_flight_ = std::move(m);
      writing_ = true;
    }
    StartWrite(&in_flight_);
  }

  std::string target_, token_, name_;
  LeaseLog& log_;
  std::atomic<int>& registered_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::AgentService::Stub> stub_;
  grpc::ClientContext context_;
  pb::ControllerMessage in_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<pb::AgentMessage> queue_;
  pb::AgentMessage in_flight_;
  bool writing_ = false;
  bool stopped_ = false;
  bool done_ = false;
};

struct AgentsOptions {
  std::string grpc;
  int http_port = 0;
  int agents = 1000;
  int cells = 5000;
  int submitters = 4;
  std::string api_token_file, agent_token_file;
  std::string repository, commit, checkpoint, reference;
};

int Agents(const AgentsOptions& o) {
  const std::string api_token = ReadSecret(o.api_token_file);
  const std::string agent_token = ReadSecret(o.agent_token_file);
  LeaseLog log;
  std::atomic<int> registered{0};
  std::vector<std::unique_ptr<SimAgent>> agents;
  const auto connect_start = Clock::now();
  for (int i = 0; i < o.agents; ++i) {
    agents.push_back(std::make_unique<SimAgent>(o.grpc, agent_token, "sim-" + std::to_string(i),
                                                log, registered));
    agents.back()->Start();
  }
  while (registered < o.agents && Clock::now() - connect_start < std::chrono::seconds(180)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double connect_s = Ms(Clock::now() - connect_start) / 1000;
  std::printf("%d of %d agents registered in %.1f s\n", registered.load(), o.agents, connect_s);
  std::atomic<bool> stop_heartbeats{false};
  std::thread heartbeats([&] {
    while (!stop_heartbeats) {
      for (auto& a : agents) a->Heartbeat();
      for (int i = 0; i < 40 && !stop_heartbeats; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });

  // Submit: distinct cells (training.seed), by commit (CI's usual form: no git fetch once the
  // mirror holds it), from several threads on keep-alive connections.
  std::mutex submit_mu;
  std::map<std::string, Clock::time_point> submitted;  // cell id -> request start
  std::vector<double> submit_ms;
  std::atomic<int> next{0}, failed{0};
  const auto submit_start = Clock::now();
  Clock::time_point submit_end;
  {
    std::vector<std::thread> submitters;
    for (int s = 0; s < o.submitters; ++s) {
      submitters.emplace_back([&] {
        HttpConnection conn(o.http_port, api_token);
        for (int i; (i = next++) < o.cells;) {
          const json body = {{"repository", o.repository}, {"commit", o.commit},
                             {"model_family", "llama"},    {"checkpoint", o.checkpoint},
                             {"reference", o.reference},   {"training", {{"seed", 100000 + i}}},
                             {"phases", {"identity"}}};
          const auto t0 = Clock::now();
          std::pair<int, std::string> r;
          try {
            // 202: the controller is still digesting a checkpoint over --digest-inline-mib
            // (protocols.md §1); the same body again, the wait counted in the submit's time.
            for (int tries = 0; tries < 3600; ++tries) {
              r = conn.Request(http::verb::post, "/api/v1/cells", body.dump());
              if (r.first != 202) break;
              std::this_thread::sleep_for(std::chrono::seconds(1));
            }
          } catch (const std::exception& e) {
            r = {0, e.what()};
          }
          const auto t1 = Clock::now();
          const json cell = json::parse(r.second, nullptr, false);
          if ((r.first != 201 && r.first != 200) || !cell.is_object()) {
            if (failed++ < 3) std::fprintf(stderr, "submit: %d %s\n", r.first, r.second.c_str());
            continue;
          }
          std::lock_guard lock(submit_mu);
          submitted[cell.value("id", "")] = t0;
          submit_ms.push_back(Ms(t1 - t0));
        }
      });
    }
    for (auto& t : submitters) t.join();
    submit_end = Clock::now();
  }
  const size_t expected = submitted.size();
  {
    std::unique_lock lock(log.mu);
    log.cv.wait_for(lock, std::chrono::seconds(300), [&] { return log.count >= expected; });
  }
  std::vector<double> to_lease_ms;
  Clock::time_point last_lease = submit_start;
  {
    std::lock_guard lock(log.mu);
    for (const auto& [id, t0] : submitted) {
      auto it = log.leased.find(id);
      if (it == log.leased.end()) continue;
      to_lease_ms.push_back(Ms(it->second - t0));
      last_lease = std::max(last_lease, it->second);
    }
  }
  stop_heartbeats = true;
  heartbeats.join();
  for (auto& a : agents) a->Stop();

  const double submit_s = Ms(submit_end - submit_start) / 1000;
  const double placed_s = Ms(last_lease - submit_start) / 1000;
  std::printf("\n| figure | value | target |\n|---|---|---|\n");
  std::printf("| simulated agents (loopback gRPC, one TCP connection each) | %d | 1000 |\n", registered.load());
  std::printf("| cells submitted (REST, %d threads) | %zu (%d failed) | |\n", o.submitters, expected, failed.load());
  std::printf("| submit throughput | %.0f cells/s | |\n", static_cast<double>(expected) / submit_s);
  std::printf("| submitted and scheduled (first submit -> last lease) | %.0f cells/s | >= 2000 |\n",
              static_cast<double>(to_lease_ms.size()) / placed_s);
  std::printf("| submit request p50 / p99 | %.1f / %.1f ms | |\n", Quantile(submit_ms, 0.5), Quantile(submit_ms, 0.99));
  std::printf("| submit -> lease p50 / p99 / max | %.1f / %.1f / %.1f ms | p99 < 100 ms |\n",
              Quantile(to_lease_ms, 0.5), Quantile(to_lease_ms, 0.99), Quantile(to_lease_ms, 1.0));
  std::printf("| cells leased | %zu of %zu | |\n", to_lease_ms.size(), expected);
  return to_lease_ms.size() == expected && expected > 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// get / dashboard

int Get(int port, const std::string& token_file, const std::vector<std::string>& targets,
        int connections, double seconds) {
  const std::string token = token_file.empty() ? "" : ReadSecret(token_file);
  std::mutex mu;
  std::vector<double> latencies;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  const auto start = Clock::now();
  for (int c = 0; c < connections; ++c) {
    threads.emplace_back([&, c] {
      HttpConnection conn(port, token);
      std::vector<double> mine;
      for (size_t i = static_cast<size_t>(c); Clock::now() < deadline; ++i) {
        const auto t0 = Clock::now();
        try {
          if (conn.Request(http::verb::get, targets[i % targets.size()]).first != 200) ++errors;
        } catch (const std::exception&) {
          ++errors;
        }
        mine.push_back(Ms(Clock::now() - t0));
      }
      std::lock_guard lock(mu);
      latencies.insert(latencies.end(), mine.begin(), mine.end());
    });
  }
  for (auto& t : threads) t.join();
  const double elapsed = Ms(Clock::now() - start) / 1000;
  std::printf("| REST GET %s (%d connections, %.0f s) | %.0f req/s, p50 %.2f ms, p99 %.2f ms, %d errors | p99 < 20 ms |\n",
              targets.size() == 1 ? targets[0].c_str() : (targets[0] + " ...").c_str(), connections,
              seconds, static_cast<double>(latencies.size()) / elapsed, Quantile(latencies, 0.5),
              Quantile(latencies, 0.99), errors.load());
  return errors == 0 ? 0 : 1;
}

int Dashboard(int port, const std::string& token_file, int repeats) {
  const std::string token = token_file.empty() ? "" : ReadSecret(token_file);
  // What index.html (the matrix) loads: the page, its CSS and scripts, then the matrix of
  // every stored validation cell (matrix.js asks for it unfiltered).
  const std::vector<std::pair<std::string, bool>> loads = {
      {"/", false},          {"/static/style.css", false}, {"/static/app.js", false},
      {"/static/matrix.js", false}, {"/api/v1/matrix", true}};
  std::vector<double> page_ms, api_ms;
  size_t page_bytes = 0, api_bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    HttpConnection anonymous(port, ""), authed(port, token);
    const auto t0 = Clock::now();
    double api_page_ms = 0;
    page_bytes = api_bytes = 0;
    for (const auto& [target, needs_token] : loads) {
      const auto t1 = Clock::now();
      auto res = (needs_token ? authed : anonymous).Request(http::verb::get, target);
      if (res.first != 200) {
        std::fprintf(stderr, "dashboard %s: %d\n", target.c_str(), res.first);
        return 1;
      }
      (needs_token ? api_bytes : page_bytes) += res.second.size();
      if (needs_token) api_page_ms += Ms(Clock::now() - t1);
    }
    page_ms.push_back(Ms(Clock::now() - t0));
    api_ms.push_back(api_page_ms);
  }
  std::printf("| dashboard matrix page (5 requests, new connections; median of %d) | %.1f ms (of which the API %.1f ms); %zu bytes of page, %zu of matrix JSON | < 300 ms |\n",
              repeats, Quantile(page_ms, 0.5), Quantile(api_ms, 0.5), page_bytes, api_bytes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gatehouse-controller-bench: controller load figures (tools/loadbench)"};
  app.require_subcommand(1);
  std::string db;
  int cells = 100000;
  auto* seed = app.add_subcommand("seed", "write finished cells straight into a database");
  seed->add_option("--db", db)->required();
  seed->add_option("--cells", cells);

  AgentsOptions ao;
  auto* agents = app.add_subcommand("agents", "simulated agents + REST submits");
  agents->add_option("--grpc", ao.grpc)->required();
  agents->add_option("--http-port", ao.http_port)->required();
  agents->add_option("--agents", ao.agents);
  agents->add_option("--cells", ao.cells);
  agents->add_option("--submitters", ao.submitters);
  agents->add_option("--api-token-file", ao.api_token_file)->required();
  agents->add_option("--agent-token-file", ao.agent_token_file)->required();
  agents->add_option("--repository", ao.repository)->required();
  agents->add_option("--commit", ao.commit)->required();
  agents->add_option("--checkpoint", ao.checkpoint)->required();
  agents->add_option("--reference", ao.reference)->required();

  int port = 0, connections = 8, repeats = 20;
  double seconds = 10;
  std::string token_file;
  std::vector<std::string> targets;
  auto* get = app.add_subcommand("get", "closed-loop REST GETs");
  get->add_option("--http-port", port)->required();
  get->add_option("--token-file", token_file);
  get->add_option("--target", targets)->required();
  get->add_option("--connections", connections);
  get->add_option("--seconds", seconds);
  auto* dashboard = app.add_subcommand("dashboard", "the cells page's requests");
  dashboard->add_option("--http-port", port)->required();
  dashboard->add_option("--token-file", token_file);
  dashboard->add_option("--repeats", repeats);
  CLI11_PARSE(app, argc, argv);
  try {
    if (seed->parsed()) return Seed(db, cells);
    if (agents->parsed()) return Agents(ao);
    if (get->parsed()) return Get(port, token_file, targets, connections, seconds);
    return Dashboard(port, token_file, repeats);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gatehouse-controller-bench: %s\n", e.what());
    return 1;
  }
}
