// The Slurm engine end to end (docs/deploy.md "Slurm", protocols.md §3.5): a real single-host
// Slurm (Debian's munged, slurmctld and slurmd, started here on 127.0.0.1 with a configuration
// of their own), a controller, and an agent with --slurm that runs every attempt as a Slurm job
// step, on two Slurm nodes ("node1" and "node2", a slurmd each on this host). One
// scenario, so the adapter's plugin is built once:
//  1. a TP=2 CPU cell passes over both nodes, one rank on each, started by srun with
//     torchrun's variables from Slurm's, and its logs name the job and each rank's node;
//  2. a cancel through the API scancels the job: the attempt ends cancelled, the job CANCELLED;
//  3. a node failure (the node set DOWN under a running job: NODE_FAIL) ends the attempt lost,
//     and the cell's retry runs and passes once the node is back;
//  4. a job cancelled from outside Gatehouse (an operator's scancel) ends the attempt lost.
// Needs root (slurmd starts tasks as their user) and the slurm-wlm and munge packages; else
// SKIPPED with the reason.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <thread>
#include <tuple>

#include "e2e_util.h"
#include "http_client.h"
#include "process_harness.h"

namespace gatehouse::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// The absolute path of `name` on PATH; empty when it is not installed.
std::string Which(const std::string& name) {
  CommandResult r = RunCommand("sh", {"-c", "command -v " + name}, fs::current_path());
  std::string path = r.exit_code == 0 ? r.output : "";
  while (!path.empty() && path.back() == '\n') path.pop_back();
  return path;
}

class SlurmEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "slurmd must run as root to start tasks; not root here";
    for (const char* tool : {"munged", "slurmctld", "slurmd", "srun", "squeue", "scancel",
                             "scontrol", "sinfo"}) {
      if (Which(tool).empty()) {
        GTEST_SKIP() << tool << " is not installed (Debian packages slurm-wlm and munge)";
      }
    }
    root_ = fs::temp_directory_path() / ("gatehouse-slurm-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    for (const char* dir : {"logs", "munge", "state", "spool", "run"}) {
      fs::create_directories(root_ / dir);
    }
    // munged refuses a key or a socket directory others may write to.
    fs::permissions(root_ / "munge", fs::perms::owner_all, fs::perm_options::replace);
    {
      std::ofstream key(root_ / "munge" / "munge.key", std::ios::binary);
      std::random_device random;
      for (int i = 0; i < 1024; ++i) key.put(static_cast<char>(random()));
    }
    fs::permissions(root_ / "munge" / "munge.key", fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::replace);
    const fs::path socket = root_ / "munge" / "munge.socket";
    munged_ = std::make_unique<Daemon>(
        Which("munged"),
        std::vector<std::string>{"--foreground", "--force", "--socket=" + socket.string(),
                                 "--key-file=" + (root_ / "munge" / "munge.key").string(),
                                 "--log-file=" + (root_ / "logs" / "munged.log").string(),
                                 "--pid-file=" + (root_ / "run" / "munged.pid").string(),
                                 "--seed-file=" + (root_ / "munge" / "munged.seed").string()},
        root_ / "logs" / "munged");
    ASSERT_TRUE(WaitFor(seconds(10), [&] { return fs::exists(socket); })) << munged_->Stderr();

    // Two nodes on this host, "node1" and "node2", one CPU each, each slurmd on a port of its
    // own (Port=; its spool, pid and log files named after it, %n): a cell of two ranks runs
    // one rank per node, as on a two-node cluster. Their names do not resolve: the agent gives
    // the ranks the first node's address (GATEHOUSE_MASTER_ADDR, below).
    for (const char* node : {"node1", "node2"}) fs::create_directories(root_ / "spool" / node);
    const fs::path conf = root_ / "slurm.conf";
    auto node_line = [](const char* name) {
      return std::string("NodeName=") + name + " NodeHostname=localhost NodeAddr=127.0.0.1 Port=" +
             std::to_string(FreePort()) + " CPUs=1 RealMemory=1024 State=UNKNOWN\n";
    };
    WriteTextFile(conf, "ClusterName=gatehouse\n"
                        "SlurmctldHost=localhost(127.0.0.1)\n"
                        "SlurmctldPort=" + std::to_string(FreePort()) + "\n"
                        "AuthType=auth/munge\nCredType=cred/munge\n"
                        "AuthInfo=socket=" + socket.string() + "\n"
                        "SlurmUser=root\nSlurmdUser=root\n"
                        "StateSaveLocation=" + (root_ / "state").string() + "\n"
                        "SlurmdSpoolDir=" + (root_ / "spool" / "%n").string() + "\n"
                        "SlurmctldPidFile=" + (root_ / "run" / "slurmctld.pid").string() + "\n"
                        "SlurmdPidFile=" + (root_ / "run" / "slurmd-%n.pid").string() + "\n"
                        "SlurmctldLogFile=" + (root_ / "logs" / "slurmctld.log").string() + "\n"
                        "SlurmdLogFile=" + (root_ / "logs" / "slurmd-%n.log").string() + "\n"
                        "ProctrackType=proctrack/pgid\nTaskPlugin=task/none\n"
                        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
                        "SchedulerType=sched/builtin\nJobAcctGatherType=jobacct_gather/none\n"
                        "AccountingStorageType=accounting_storage/none\nMpiDefault=none\n"
                        "ReturnToService=2\nFirstJobId=" + std::to_string(100 + ::getpid() % 1000) + "\n"
                        + node_line("node1") + node_line("node2") +
                        "PartitionName=gatehouse Nodes=node1,node2 Default=YES "
                        "MaxTime=INFINITE State=UP\n");
    // The Slurm clients (the agent's srun, squeue and scancel; this test's) find it here.
    ::setenv("SLURM_CONF", conf.string().c_str(), 1);
    // Standard input from /dev/null, not closed: with fd 0 free, slurmd's pipe to a starting
    // slurmstepd takes it and the step launch fails ("slurmstepd failed to send return code").
    slurmctld_ = std::make_unique<Daemon>(
        "/bin/sh", std::vector<std::string>{"-c", "exec " + Which("slurmctld") + " -D -i </dev/null"},
        root_ / "logs" / "slurmctld");
    for (const char* node : {"node1", "node2"}) {
      slurmd_.push_back(std::make_unique<Daemon>(
          "/bin/sh",
          std::vector<std::string>{"-c", "exec " + Which("slurmd") + " -D -N " + node + " </dev/null"},
          root_ / "logs" / (std::string("slurmd-") + node)));
    }
    // Both idle, and both daemons alive (a slurmd that lost its port to the other would leave
    // its node answering through the other's).
    ASSERT_TRUE(WaitFor(seconds(60), [&] {
      return NodeState() == "idle\nidle" && slurmd_[0]->running() && slurmd_[1]->running();
    })) << "the Slurm nodes are not idle: " << NodeState() << "\n"
        << slurmctld_->Stderr() << slurmd_[0]->Stderr() << slurmd_[1]->Stderr();

    repo_ = root_ / "adapter";
    ASSERT_NO_FATAL_FAILURE(MakeAdapterRepository(repo_));
    const std::string bin = GATEHOUSE_BIN_DIR;
    const std::string db = (root_ / "gatehouse.db").string();
    token_ = CreateToken(bin, db, {"--name", "ci", "--scopes", "read,submit"});
    const std::string agent_token =
        CreateToken(bin, db, {"--name", "slurm-agent", "--kind", "agent"});
    ASSERT_FALSE(token_.empty() || agent_token.empty());
    WriteTextFile(root_ / "agent.token", agent_token + "\n");
    controller_ = std::make_unique<Daemon>(
        bin + "/gatehouse-controller",
        std::vector<std::string>{"--db", db, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
                                 "--mirror-dir", (root_ / "mirrors").string(), "--torch-pin",
                                 GATEHOUSE_TORCH_VERSION},
        root_ / "logs" / "controller");
    auto ports = WaitForControllerPorts(*controller_);
    ASSERT_TRUE(ports) << controller_->Stderr();
    http_port_ = ports->http;
    std::vector<std::string> agent_args = {
        "--controller", "127.0.0.1:" + std::to_string(ports->grpc), "--name", "slurm-agent",
        "--work-dir", (root_ / "agent").string(), "--sdk-dir", GATEHOUSE_SDK_DIR,
        "--cmake-prefix-path", GATEHOUSE_TORCH_PREFIX, "--worker", bin + "/gatehouse-worker",
        "--torch-version", GATEHOUSE_TORCH_VERSION, "--token-file",
        (root_ / "agent.token").string(), "--slurm", "--slurm-nodes", "2",
        "--slurm-cpu-ranks-per-node", "1", "--slurm-partition", "gatehouse"};
    // The build and every task run sandboxed where bubblewrap works (docs/protocols.md §3.6).
    sandboxed_ = RunCommand("bwrap", {"--unshare-user", "--unshare-net", "--ro-bind", "/", "/",
                                      "true"},
                            root_)
                     .exit_code == 0;
    if (sandboxed_) agent_args.insert(agent_args.end(), {"--sandbox", "bwrap"});
    // The agent's environment reaches every task (srun --export=ALL).
    ::setenv("GATEHOUSE_MASTER_ADDR", "127.0.0.1", 1);
    agent_ = std::make_unique<Daemon>(bin + "/gatehouse-agent", agent_args,
                                      root_ / "logs" / "agent");
    ::unsetenv("GATEHOUSE_MASTER_ADDR");
    ASSERT_TRUE(agent_->WaitForLine(std::regex("registered as"), seconds(120))) << agent_->Stderr();
  }

  void TearDown() override {
    agent_.reset();
    controller_.reset();
    if (slurmctld_) RunCommand("scancel", {"--partition=gatehouse"}, root_);
    slurmd_.clear();
    slurmctld_.reset();
    munged_.reset();
    ::unsetenv("SLURM_CONF");
    if (root_.empty()) return;
    if (!HasFailure()) fs::remove_all(root_);
    else std::cerr << "slurm e2e: keeping " << root_ << " for inspection\n";
  }

  template <typename Pred>
  static bool WaitFor(seconds timeout, Pred done) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(milliseconds(200));
    }
    return done();
  }

  std::string NodeState() {
    CommandResult r = RunCommand("sinfo", {"--Node", "--noheader", "--format=%t"}, root_);
    std::string s = r.output;
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }

  /// The state of attempt `attempt_id`'s job ("RUNNING", "COMPLETED", ...); empty when none.
  std::string JobState(int64_t attempt_id) {
    CommandResult r = RunCommand(
        "squeue", {"--noheader", "--states=all", "--format=%T",
                   "--name=gatehouse-slurm-agent-a" + std::to_string(attempt_id)},
        root_);
    std::string s = r.output;
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }

  json Body(const std::string& scenario) const {
    const fs::path data = fs::path(GATEHOUSE_TESTDATA_DIR) / "llama-tiny-tied";
    return json{{"repository", repo_.string()},
                {"branch", "main"},
                {"model_family", "llama"},
                {"checkpoint", (data / "checkpoint").string()},
                {"reference", (data / "reference").string()},
                {"topology", {{"tp", 2}}},
                // A distinct cell per scenario (env is part of the cell's identity).
                {"env", {{"GATEHOUSE_SLURM_SCENARIO", scenario}}}};
  }

  std::string Submit(const json& body) {
    HttpResponse r = SubmitCell(http_port_, body.dump(), token_);
    EXPECT_TRUE(r.status == 200 || r.status == 201) << r.status << " " << r.body << r.error;
    json cell = json::parse(r.body, nullptr, false);
    return cell.is_object() ? cell.value("id", "") : "";
  }

  json Get(const std::string& id) {
    HttpResponse r = HttpRequest(http_port_, "GET", "/api/v1/cells/" + id, "", token_);
    return json::parse(r.body, nullptr, false);
  }

  std::string Log(const std::string& id, const std::string& stream, int attempt = 1) {
    return HttpRequest(http_port_, "GET",
                       "/api/v1/cells/" + id + "/log?stream=" + stream +
                           "&attempt=" + std::to_string(attempt),
                       "", token_)
        .body;
  }

  /// Polls the cell until `done(cell)`; returns it (the last seen after `timeout`, failing).
  template <typename Pred>
  json WaitCell(const std::string& id, seconds timeout, const char* what, Pred done) {
    const auto deadline = Clock::now() + timeout;
    json cell;
    while (Clock::now() < deadline) {
      cell = Get(id);
      if (cell.is_object() && done(cell)) return cell;
      std::this_thread::sleep_for(milliseconds(200));
    }
    ADD_FAILURE() << "cell " << id << " not " << what << " after " << timeout.count()
                  << " s: " << cell.dump() << "\nagent stderr:\n" << agent_->Stderr();
    return cell;
  }

  /// Waits until the cell's attempt `number` runs a phase and its Slurm job is RUNNING;
  /// returns the attempt's id (0 on timeout).
  int64_t WaitRunningJob(const std::string& id, int number) {
    int64_t attempt_id = 0;
    json cell = WaitCell(id, seconds(600), "running under Slurm", [&](const json& c) {
      const json& attempts = c.at("attempts");
      if (attempts.size() < static_cast<size_t>(number)) return false;
      const json& a = attempts.at(static_cast<size_t>(number - 1));
      attempt_id = a.at("id").get<int64_t>();
      // Past "construct": the ranks are in the gates, with seconds of work left.
      return a.at("state") == "running" && c.value("phases", json::array()).size() >= 3 &&
             JobState(attempt_id) == "RUNNING";
    });
    return cell.is_object() ? attempt_id : 0;
  }

  fs::path root_, repo_;
  bool sandboxed_ = false;  // the agent runs with --sandbox bwrap
  std::string token_;
  int http_port_ = 0;
  std::unique_ptr<Daemon> munged_, slurmctld_, controller_, agent_;
  std::vector<std::unique_ptr<Daemon>> slurmd_;  // one per node
};

bool Final(const json& c) {
  const std::string s = c.value("status", "");
  return s == "passed" || s == "failed" || s == "error" || s == "lost" || s == "cancelled" ||
         s == "blocked" || s == "timed_out";
}

TEST_F(SlurmEngineTest, CellsRunAsSlurmJobsAndEndAsTheirJobsDo) {
  // 1. A TP=2 cell on CPU over two nodes: each rank a task of one srun step on a node of its
  //    own, rank 1 reaching rank 0's rendezvous at the first node's address, and the parallel
  //    gate compares them with TP=1, as on a local agent.
  const std::string passing = Submit(Body("pass"));
  ASSERT_FALSE(passing.empty());
  json cell = WaitCell(passing, seconds(900), "final", Final);
  ASSERT_EQ(cell.value("status", ""), "passed") << cell.dump(2) << "\nslurm log:\n"
                                                << Log(passing, "slurm");
  const json* parallel = FindPhase(cell, "parallel");
  ASSERT_NE(parallel, nullptr) << cell.dump(2);
  EXPECT_EQ(parallel->at("status"), "PASS") << parallel->dump();
  const auto kl = Figure(*parallel, "kl_mean_vs_tp1");
  ASSERT_TRUE(kl) << parallel->dump();
  EXPECT_LT(*kl, 1e-6);
  const int64_t first_attempt = cell.at("attempts").at(0).at("id").get<int64_t>();
  EXPECT_EQ(JobState(first_attempt), "COMPLETED");
  const std::string slurm_log = Log(passing, "slurm");
  EXPECT_NE(slurm_log.find("--nodes=2 --ntasks=2 --ntasks-per-node=1"), std::string::npos)
      << slurm_log;
  EXPECT_NE(slurm_log.find("ended COMPLETED"), std::string::npos) << slurm_log;
  // Each rank says where it ran, with the variables gatehouse-slurm-rank derived from Slurm's.
  for (const auto& [stream, rank, node] : {std::tuple{"worker", 0, "node1"},
                                            std::tuple{"worker.rank1", 1, "node2"}}) {
    const std::string log = Log(passing, stream);
    EXPECT_TRUE(std::regex_search(
        log, std::regex("gatehouse-slurm-rank: slurm job [0-9]+ step 0 on " + std::string(node) +
                        " \\(host .*\\): RANK=" + std::to_string(rank) +
                        " WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1")))
        << stream << ":\n" << log.substr(0, 2000);
  }

  // Both ranks ran in the sandbox of a Slurm task (a bwrap of their own; the node's network),
  // and in Slurm's cgroups, not the agent's; the identity gate says so.
  const json* identity = FindPhase(cell, "identity");
  ASSERT_NE(identity, nullptr) << cell.dump(2);
  const std::string sandbox = TextFigure(*identity, "sandbox");
  const std::string cgroup = TextFigure(*identity, "cgroup");
  if (sandboxed_) {
    EXPECT_EQ(sandbox.rfind("bubblewrap", 0), 0u) << identity->dump();
    EXPECT_NE(sandbox.find(" in each Slurm task: user and IPC namespaces and /dev/shm of the "
                           "job's tasks on the node, the node's network"),
              std::string::npos)
        << sandbox;
    EXPECT_NE(sandbox.find("token hidden"), std::string::npos) << sandbox;
    // Not only the words: srun started each task as a sandboxed command.
    EXPECT_NE(slurm_log.find("--sandboxed -- bwrap --unshare-user --unshare-ipc "),
              std::string::npos)
        << slurm_log.substr(0, 2000);
  } else {
    EXPECT_EQ(sandbox, "none") << identity->dump();
  }
  EXPECT_EQ(cgroup.rfind("none: a Slurm step runs in the cgroups Slurm makes for it", 0), 0u)
      << cgroup;

  // 2. Cancel through the API: the agent scancels the job.
  const std::string cancelled = Submit(Body("cancel"));
  int64_t attempt = WaitRunningJob(cancelled, 1);
  ASSERT_NE(attempt, 0);
  HttpResponse r = HttpRequest(http_port_, "POST", "/api/v1/cells/" + cancelled + "/cancel",
                               R"({"reason":"slurm e2e"})", token_);
  ASSERT_TRUE(r.status == 200 || r.status == 202) << r.status << " " << r.body;
  cell = WaitCell(cancelled, seconds(120), "final", Final);
  EXPECT_EQ(cell.value("status", ""), "cancelled") << cell.dump(2);
  EXPECT_EQ(JobState(attempt), "CANCELLED");
  EXPECT_NE(cell.at("attempts").at(0).value("reason", "").find("(cancelled)"), std::string::npos)
      << cell.dump(2);

  // 3. Node failure: the node goes DOWN under the running job (NODE_FAIL). The attempt is lost,
  //    not failed, and the retry runs once Slurm takes the node back (ReturnToService=2).
  const std::string node_failure = Submit(Body("node-failure"));
  attempt = WaitRunningJob(node_failure, 1);
  ASSERT_NE(attempt, 0);
  CommandResult down = RunCommand(
      "scontrol", {"update", "NodeName=node1", "State=DOWN", "Reason=gatehouse-e2e"}, root_);
  ASSERT_EQ(down.exit_code, 0) << down.output;
  cell = WaitCell(node_failure, seconds(120), "with its first attempt lost", [](const json& c) {
    return c.at("attempts").at(0).value("state", "") == "lost";
  });
  const std::string lost_reason = cell.at("attempts").at(0).value("reason", "");
  EXPECT_NE(lost_reason.find("NODE_FAIL"), std::string::npos) << lost_reason;
  EXPECT_EQ(JobState(attempt), "NODE_FAIL");
  RunCommand("scontrol", {"update", "NodeName=node1", "State=RESUME"}, root_);
  cell = WaitCell(node_failure, seconds(900), "final", Final);
  EXPECT_EQ(cell.value("status", ""), "passed") << cell.dump(2);
  ASSERT_EQ(cell.at("attempts").size(), 2u) << cell.dump(2);
  EXPECT_EQ(cell.at("attempts").at(1).at("retry_of"), attempt);

  // 4. An operator scancels the job: lost as well, and retried; the test cancels the retry.
  const std::string outside = Submit(Body("scancel"));
  attempt = WaitRunningJob(outside, 1);
  ASSERT_NE(attempt, 0);
  CommandResult sc =
      RunCommand("scancel", {"--name=gatehouse-slurm-agent-a" + std::to_string(attempt)}, root_);
  ASSERT_EQ(sc.exit_code, 0) << sc.output;
  cell = WaitCell(outside, seconds(120), "with its first attempt lost", [](const json& c) {
    return c.at("attempts").at(0).value("state", "") == "lost";
  });
  EXPECT_NE(cell.at("attempts").at(0).value("reason", "").find("CANCELLED"), std::string::npos)
      << cell.dump(2);
  EXPECT_NE(cell.at("attempts").at(0).value("reason", "").find("not by this agent"),
            std::string::npos)
      << cell.dump(2);
  HttpRequest(http_port_, "POST", "/api/v1/cells/" + outside + "/cancel", R"({"reason":"done"})",
              token_);
  WaitCell(outside, seconds(120), "final", Final);
}

}  // namespace
}  // namespace gatehouse::testing
