// Fault tests with real processes on 127.0.0.1 (issue 5): kill -9 the agent or the controller
// while a cell runs, and check that every cell still reaches a final state with its evidence
// whole: the attempt of a lost agent becomes `lost` within the lease and is retried; an agent
// that comes back without its attempt loses it at once; a controller that crashes restarts from
// SQLite and the agent re-attaches its running attempt, resending what the controller missed.
// Then the database: PRAGMA integrity_check, no duplicated event, no gap in any event sequence
// of a passed attempt, no gap or overlap in any log stream.
//
// The agent reaches the controller through a TCP proxy (tcp_proxy.h) that can cut the link: a
// cut that heals at once must cost nothing (the agent reconnects within the lease and goes on);
// a cut longer than the lease loses the attempt, which is retried once the agent is back (and
// the agent stops the stale run when the controller cancels it).
//
// GATEHOUSE_FAULT_TRIALS (default 1) repeats each kind of fault. Figures are printed as a table.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "e2e_util.h"
#include "http_client.h"
#include "process_harness.h"
#include "tcp_proxy.h"

namespace gatehouse::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr int kHeartbeatMs = 200;
constexpr int kMissedHeartbeats = 5;  // lease: 1 s (heartbeats stay on time on 2 busy cores)

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// Rows of one SQL query (text of each column), or a failure.
std::vector<std::vector<std::string>> Query(sqlite3* db, const std::string& sql) {
  std::vector<std::vector<std::string>> rows;
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db);
    return rows;
  }
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    std::vector<std::string> row;
    for (int c = 0; c < sqlite3_column_count(stmt); ++c) {
      const unsigned char* text = sqlite3_column_text(stmt, c);
      row.emplace_back(text ? reinterpret_cast<const char*>(text) : "");
    }
    rows.push_back(std::move(row));
  }
  sqlite3_finalize(stmt);
  return rows;
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("gatehouse-faults-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "logs");
    ASSERT_NO_FATAL_FAILURE(MakeAdapterRepository(root_ / "adapter"));
    ASSERT_NO_FATAL_FAILURE(StartController(0, 0));
    proxy_ = std::make_unique<TcpProxy>(grpc_port_);  // agents connect through it
  }

  void TearDown() override {
    agent_.reset();
    proxy_.reset();
    controller_.reset();
    if (!HasFailure()) fs::remove_all(root_);
    else std::cerr << "faults: keeping " << root_ << " for inspection\n";
  }

  // Port 0: any free port (the first start); a restart reuses the ports the agent knows.
  void StartController(int http_port, int grpc_port) {
    controller_ = std::make_unique<Daemon>(
        std::string(GATEHOUSE_BIN_DIR) + "/gatehouse-controller",
        std::vector<std::string>{"--db", (root_ / "gatehouse.db").string(), "--http",
                                 "127.0.0.1:" + std::to_string(http_port), "--grpc",
                                 "127.0.0.1:" + std::to_string(grpc_port), "--mirror-dir",
                                 (root_ / "mirrors").string(), "--web-dir", GATEHOUSE_WEB_DIR,
                                 "--torch-pin", GATEHOUSE_TORCH_VERSION, "--heartbeat-ms",
                                 std::to_string(kHeartbeatMs), "--missed-heartbeats",
                                 std::to_string(kMissedHeartbeats), "--restart-grace-ms",
                                 "20000", "--auth", "none"},  // loopback; tokens: e2e_test
        root_ / "logs" / ("controller" + std::to_string(++controller_starts_)));
    auto ports = WaitForControllerPorts(*controller_);
    ASSERT_TRUE(ports) << controller_->Stderr();
    http_port_ = ports->http;
    grpc_port_ = ports->grpc;
  }

  // Agents share one work dir (a killed agent's clone and plugin build are reused).
  void StartAgent(const std::string& name) {
    const std::string bin = GATEHOUSE_BIN_DIR;
    agent_ = std::make_unique<Daemon>(
        bin + "/gatehouse-agent",
        std::vector<std::string>{"--controller", "127.0.0.1:" + std::to_string(proxy_->port()),
                                 "--name", name, "--work-dir", (root_ / "agent").string(),
                                 "--sdk-dir", GATEHOUSE_SDK_DIR, "--cmake-prefix-path",
                                 GATEHOUSE_TORCH_PREFIX, "--worker", bin + "/gatehouse-worker"},
        root_ / "logs" / ("agent" + std::to_string(++agent_starts_)));
    ASSERT_TRUE(agent_->WaitForLine(std::regex("registered as"), seconds(60))) << agent_->Stderr();
  }

  json Submit(int seed) {
    const fs::path data = fs::path(GATEHOUSE_TESTDATA_DIR) / "llama-tiny-untied";
    const json body = {{"repository", (root_ / "adapter").string()},
                       {"branch", "main"},
                       {"model_family", "llama"},
                       {"checkpoint", (data / "checkpoint").string()},
                       {"reference", (data / "reference").string()},
                       {"training", {{"seed", seed}}},
                       {"phases", {"identity", "config", "construct", "load", "inference", "decode"}}};
    HttpResponse r = SubmitCell(http_port_, body.dump());
    EXPECT_EQ(r.status, 201) << r.body << r.error;
    return json::parse(r.body, nullptr, false);
  }

  json Get(const std::string& id) {
    HttpResponse r = HttpRequest(http_port_, "GET", "/api/v1/cells/" + id);
    json cell = json::parse(r.body, nullptr, false);
    return r.status == 200 && cell.is_object() ? cell : json();
  }

  /// Polls until `done(cell)`; returns the cell, or fails after `timeout`.
  template <typename Pred>
  json WaitUntil(const std::string& id, seconds timeout, const char* what, Pred done) {
    const auto deadline = Clock::now() + timeout;
    json cell;
    while (Clock::now() < deadline) {
      cell = Get(id);
      if (cell.is_object() && done(cell)) return cell;
      std::this_thread::sleep_for(milliseconds(50));
    }
    ADD_FAILURE() << "cell " << id << ": not " << what << " after " << timeout.count()
                  << " s: " << cell.dump() << "\nagent stderr:\n"
                  << (agent_ ? agent_->Stderr() : "");
    return cell;
  }

  static bool Final(const json& cell) {
    const std::string s = cell.value("status", "");
    return s == "passed" || s == "failed" || s == "error" || s == "lost" || s == "cancelled" ||
           s == "timed_out" || s == "blocked";
  }

  struct Trial {
    std::string kind;
    std::string final_status;
    size_t attempts = 0;
    double detection_s = -1;  // kill -> attempt lost (agent faults)
    double recovery_s = 0;    // kill -> cell final
    std::string lost_via;     // what ended the first attempt: reconcile or lease expiry
  };

  fs::path root_;
  int http_port_ = 0, grpc_port_ = 0;
  int controller_starts_ = 0, agent_starts_ = 0;
  std::unique_ptr<Daemon> controller_;
  std::unique_ptr<TcpProxy> proxy_;
  std::unique_ptr<Daemon> agent_;
};

TEST_F(FaultTest, KillAgentOrControllerMidRunLosesNothing) {
  const char* env = std::getenv("GATEHOUSE_FAULT_TRIALS");
  const int trials = env ? std::max(1, std::atoi(env)) : 1;
  StartAgent("node-0");
  // Warm-up: the first cell builds the plugin (not a fault trial).
  const json warm = Submit(1000);
  ASSERT_EQ(WaitUntil(warm.at("id"), seconds(900), "final", Final).value("status", ""), "passed");

  std::vector<Trial> results;
  int seed = 0, names = 0;
  for (int round = 0; round < trials; ++round) {
    for (const std::string kind : {"agent kill -9, restarted", "agent kill -9, replaced",
                                   "controller kill -9, restarted", "network cut, healed at once",
                                   "network cut 3 s (past the lease)"}) {
      SCOPED_TRACE(kind);
      Trial t;
      t.kind = kind;
      const std::string id = Submit(++seed).at("id");
      WaitUntil(id, seconds(120), "running", [](const json& c) { return c.value("status", "") == "running"; });
      const auto killed = Clock::now();
      const bool cut = kind.rfind("network cut", 0) == 0;
      const bool long_cut = kind == "network cut 3 s (past the lease)";
      if (kind == "controller kill -9, restarted") {
        controller_->Kill();
        std::this_thread::sleep_for(milliseconds(500));
        ASSERT_NO_FATAL_FAILURE(StartController(http_port_, grpc_port_));
      } else if (cut) {
        EXPECT_GE(proxy_->Cut(long_cut ? milliseconds(3000) : milliseconds(0)), 1);
        if (long_cut) {
          WaitUntil(id, seconds(30), "lost", [](const json& c) { return c.at("attempts").at(0).at("state") == "lost"; });
          t.detection_s = SecondsSince(killed);
        }
      } else {
        agent_->Kill();
        const bool replaced = kind == "agent kill -9, replaced";
        if (replaced) {
          // Nobody comes back: the lease expires.
          WaitUntil(id, seconds(30), "lost", [](const json& c) { return c.at("attempts").at(0).at("state") == "lost"; });
          t.detection_s = SecondsSince(killed);
        }
        ASSERT_NO_FATAL_FAILURE(StartAgent(replaced ? "node-" + std::to_string(++names) : "node-" + std::to_string(names)));
        if (!replaced) {
          WaitUntil(id, seconds(30), "lost", [](const json& c) { return c.at("attempts").at(0).at("state") == "lost"; });
          t.detection_s = SecondsSince(killed);
        }
      }
      const json cell = WaitUntil(id, seconds(300), "final", Final);
      t.recovery_s = SecondsSince(killed);
      t.final_status = cell.value("status", "");
      t.attempts = cell.at("attempts").size();
      EXPECT_EQ(t.final_status, "passed") << cell.dump(2);
      if (kind == "controller kill -9, restarted" || (cut && !long_cut)) {
        EXPECT_EQ(t.attempts, 1u) << "the running attempt should have been re-attached";
      } else {
        ASSERT_EQ(t.attempts, 2u) << cell.dump(2);
        EXPECT_EQ(cell["attempts"][0]["state"], "lost");
        EXPECT_EQ(cell["attempts"][1]["retry_of"], cell["attempts"][0]["id"]);
        const std::string reason = cell["attempts"][0]["reason"];
        t.lost_via = reason.find("registered again") != std::string::npos ? "reconcile"
                     : reason.find("unreachable") != std::string::npos  ? "lease expiry"
                                                                         : reason;
        if (kind == "agent kill -9, replaced" || long_cut) EXPECT_EQ(t.lost_via, "lease expiry");
      }
      results.push_back(t);
    }
  }

  // The evidence in SQLite.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2((root_ / "gatehouse.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  const auto integrity = Query(db, "PRAGMA integrity_check");
  ASSERT_FALSE(integrity.empty());
  EXPECT_EQ(integrity[0][0], "ok");
  const auto duplicates = Query(db,
      "SELECT attempt_id, json FROM events WHERE stale = 0 GROUP BY attempt_id, json HAVING COUNT(*) > 1");
  EXPECT_TRUE(duplicates.empty()) << duplicates.size() << " duplicated event(s), e.g. " << duplicates[0][1];
  const auto seq_gaps = Query(db,
      "SELECT e.attempt_id, COUNT(*), MAX(seq) FROM events e JOIN attempts a ON a.id = e.attempt_id "
      "WHERE a.state = 'passed' GROUP BY e.attempt_id HAVING COUNT(*) != MAX(seq)");
  EXPECT_TRUE(seq_gaps.empty()) << "attempt " << seq_gaps[0][0] << ": " << seq_gaps[0][1]
                                << " events, last seq " << seq_gaps[0][2];
  int log_gaps = 0;
  std::map<std::pair<std::string, std::string>, long long> next_offset;
  for (const auto& row : Query(db, "SELECT attempt_id, stream, offset, length(data) FROM logs "
                                   "ORDER BY attempt_id, stream, offset")) {
    long long& next = next_offset[{row[0], row[1]}];
    if (std::stoll(row[2]) != next) ++log_gaps;
    next = std::stoll(row[2]) + std::stoll(row[3]);
  }
  EXPECT_EQ(log_gaps, 0) << "log chunks with a gap or an overlap";
  const auto stale = Query(db, "SELECT COUNT(*) FROM events WHERE stale = 1");
  const auto stale_logs = Query(db, "SELECT COUNT(*) FROM logs WHERE stale = 1");
  sqlite3_close(db);

  int lost_cells = 0;
  std::cout << "\n| fault | final | attempts | lost via | detection (s) | fault -> final (s) |\n"
               "|---|---|---|---|---|---|\n";
  for (const Trial& t : results) {
    lost_cells += t.final_status == "passed" ? 0 : 1;
    std::printf("| %s | %s | %zu | %s | %s | %.1f |\n", t.kind.c_str(), t.final_status.c_str(),
                t.attempts, t.lost_via.empty() ? "-" : t.lost_via.c_str(),
                t.detection_s < 0 ? "-" : std::to_string(t.detection_s).substr(0, 4).c_str(), t.recovery_s);
  }
  std::printf("trials %zu, cells not passed %d, duplicate events %zu, log gaps %d, stale events stored %s, "
              "stale log chunks %s, lease %d ms\n",
              results.size(), lost_cells, duplicates.size(), log_gaps,
              stale.empty() ? "?" : stale[0][0].c_str(),
              stale_logs.empty() ? "?" : stale_logs[0][0].c_str(), kHeartbeatMs * kMissedHeartbeats);
  EXPECT_EQ(lost_cells, 0);
}

}  // namespace
}  // namespace gatehouse::testing
