// End-to-end: one validation cell from REST submit to stored evidence, on real checkpoints made
// by transformers, through the real controller, agent and worker processes on 127.0.0.1.
//
// The adaptation repository is a real git repository made here from models/ (the reference
// Llama adapter): branch `main` holds it as is, branch `rope-keys-bug` commits the adapter bug
// "RoPE not applied to keys" (tools/mutations/rope_keys_unapplied.patch). The agent builds each
// branch's plugin from the checked-out commit, so the two branches must give different verdicts.
#include <gtest/gtest.h>

#include <algorithm>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "e2e_util.h"
#include "http_client.h"
#include "process_harness.h"

namespace gatehouse::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::seconds;

constexpr const char* kCpuGates[] = {"identity", "config",  "construct",      "load",
                                     "inference", "decode", "packing", "logprob_parity",
                                     "training",  "save"};

class EndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("gatehouse-e2e-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "logs");
    repo_ = root_ / "adapter";
    ASSERT_NO_FATAL_FAILURE(MakeAdapterRepository(repo_));

    const std::string bin = GATEHOUSE_BIN_DIR;
    // Tokens as an operator makes them (controller --auth tokens is the default): one for CI
    // (read, submit) and one for the agent, passed in a file.
    const std::string db = (root_ / "gatehouse.db").string();
    token_ = CreateToken(bin, db, {"--name", "ci", "--scopes", "read,submit"});
    const std::string agent_token = CreateToken(bin, db, {"--name", "e2e-agent", "--kind", "agent"});
    ASSERT_FALSE(token_.empty() || agent_token.empty());
    WriteTextFile(root_ / "agent.token", agent_token + "\n");
    controller_ = std::make_unique<Daemon>(
        bin + "/gatehouse-controller",
        std::vector<std::string>{"--db", (root_ / "gatehouse.db").string(), "--http",
                                 "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--mirror-dir",
                                 (root_ / "mirrors").string(), "--web-dir", GATEHOUSE_WEB_DIR,
                                 "--torch-pin", GATEHOUSE_TORCH_VERSION},
        root_ / "logs" / "controller");
    auto ports = WaitForControllerPorts(*controller_);
    ASSERT_TRUE(ports) << controller_->Stderr();
    http_port_ = ports->http;

    std::vector<std::string> agent_args = {
        "--controller", "127.0.0.1:" + std::to_string(ports->grpc), "--name", "e2e-agent",
        "--work-dir", (root_ / "agent").string(), "--sdk-dir", GATEHOUSE_SDK_DIR,
        "--cmake-prefix-path", GATEHOUSE_TORCH_PREFIX, "--worker", bin + "/gatehouse-worker",
        "--torch-version", GATEHOUSE_TORCH_VERSION, "--token-file",
        (root_ / "agent.token").string()};
    // Every attempt runs sandboxed where bubblewrap can make a user and network namespace
    // (docs/protocols.md §3.6); the identity gate then names the sandbox.
    sandboxed_ = RunCommand("bwrap", {"--unshare-user", "--unshare-net", "--ro-bind", "/", "/",
                                      "true"},
                            root_)
                     .exit_code == 0;
    if (sandboxed_) agent_args.insert(agent_args.end(), {"--sandbox", "bwrap"});
    // And in a cgroup with a memory limit where this (root) process may make cgroups, on
    // cgroup v1's memory hierarchy or v2 (§3.7); the identity gate then names it.
    limited_ = ::geteuid() == 0 && (::access("/sys/fs/cgroup/memory", W_OK) == 0 ||
                                    ::access("/sys/fs/cgroup/cgroup.subtree_control", W_OK) == 0);
    if (limited_) agent_args.insert(agent_args.end(), {"--attempt-memory-limit", "12G"});
    agent_ = std::make_unique<Daemon>(bin + "/gatehouse-agent", agent_args,
                                      root_ / "logs" / "agent");
    ASSERT_TRUE(agent_->WaitForLine(std::regex("registered as"), seconds(120)))
        << agent_->Stderr();
  }

  void TearDown() override {
    agent_.reset();
    controller_.reset();
    if (!HasFailure()) fs::remove_all(root_);
    else std::cerr << "e2e: keeping " << root_ << " for inspection\n";
  }

  json Body(const std::string& branch, const std::string& checkpoint) const {
    const fs::path data = fs::path(GATEHOUSE_TESTDATA_DIR) / checkpoint;
    return json{{"repository", repo_.string()},
                {"branch", branch},
                {"model_family", "llama"},
                {"checkpoint", (data / "checkpoint").string()},
                {"reference", (data / "reference").string()}};
  }

  /// POSTs a cell (again while the controller answers 202 "resolving") and returns the
  /// response JSON; expects 200 or 201.
  json Submit(const json& body) {
    HttpResponse r = SubmitCell(http_port_, body.dump(), token_);
    EXPECT_TRUE(r.status == 200 || r.status == 201) << r.status << " " << r.body << r.error;
    return json::parse(r.body, nullptr, false);
  }

  /// Polls the cell until its status is final; returns it (or the last seen on timeout).
  json WaitFinal(const std::string& id, seconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    json cell;
    while (std::chrono::steady_clock::now() < deadline) {
      HttpResponse r = HttpRequest(http_port_, "GET", "/api/v1/cells/" + id, "", token_);
      cell = json::parse(r.body, nullptr, false);
      if (r.status == 200 && cell.is_object()) {
        const std::string s = cell.value("status", "");
        if (s == "passed" || s == "failed" || s == "error" || s == "blocked") return cell;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    ADD_FAILURE() << "cell " << id << " not final after " << timeout.count() << " s: "
                  << cell.dump() << "\nagent stderr:\n" << agent_->Stderr();
    return cell;
  }

  /// Submits `body` with topology tp=2 and expects the cell to pass with its parallel gate's
  /// TP=2 logits within the fp32 bar of the TP=1 control. Returns the parallel phase, and the
  /// cell's id in `id`.
  json ExpectTp2Passes(json body, std::string& id) {
    body["topology"] = {{"tp", 2}};
    json tp = Submit(body);
    EXPECT_TRUE(tp.contains("id")) << tp.dump();
    id = tp.value("id", "");
    json cell = WaitFinal(id, seconds(600));
    EXPECT_EQ(cell.value("status", ""), "passed") << cell.dump(2);
    const json* parallel = FindPhase(cell, "parallel");
    if (parallel == nullptr) {
      ADD_FAILURE() << "no parallel phase: " << cell.dump(2);
      return json();
    }
    EXPECT_EQ(parallel->at("status"), "PASS") << parallel->dump();
    auto kl = Figure(*parallel, "kl_mean_vs_tp1");
    auto top1 = Figure(*parallel, "top1_agreement_vs_tp1");
    EXPECT_TRUE(kl && top1) << parallel->dump();
    if (kl) EXPECT_LT(*kl, 1e-6);
    if (top1) EXPECT_EQ(*top1, 100.0);
    return *parallel;
  }

  /// Submits `body` with `topology` and only the phases the parallel gate needs (config,
  /// construct, load, parallel) and expects the cell to pass: one worker process per rank, rank
  /// 0's parallel gate training two steps against the single-rank control, the step-1 loss
  /// within the fp32 bar and the figures named `judged` present. Returns the parallel phase.
  json ExpectLayoutPasses(json body, const json& topology, const std::vector<std::string>& judged) {
    body["topology"] = topology;
    body["phases"] = {"config", "construct", "load", "parallel"};
    json sub = Submit(body);
    EXPECT_TRUE(sub.contains("id")) << sub.dump();
    json cell = WaitFinal(sub.value("id", ""), seconds(600));
    EXPECT_EQ(cell.value("status", ""), "passed") << topology.dump() << " " << cell.dump(2);
    const json* parallel = FindPhase(cell, "parallel");
    if (parallel == nullptr) {
      ADD_FAILURE() << "no parallel phase: " << cell.dump(2);
      return json();
    }
    EXPECT_EQ(parallel->at("status"), "PASS") << parallel->dump();
    auto loss = Figure(*parallel, "loss_step_1_rel_diff");
    EXPECT_TRUE(loss) << parallel->dump();
    if (loss) EXPECT_LT(*loss, 1e-5);
    for (const std::string& name : judged) {
      EXPECT_TRUE(Figure(*parallel, name)) << name << " in " << parallel->dump();
    }
    return *parallel;
  }

  struct CliRun {
    int exit_code = -1;
    std::string out, err;
  };

  /// Runs bin/gatehouse against this controller with `args` (shell words the test controls),
  /// the API token in GATEHOUSE_TOKEN (never in argv) unless `with_token` is false.
  /// `url` replaces this controller's when set.
  CliRun Cli(const std::string& args, bool with_token = true, const std::string& url = "") {
    const fs::path out = root_ / "cli.stdout", err = root_ / "cli.stderr";
    if (with_token) ::setenv("GATEHOUSE_TOKEN", token_.c_str(), 1);
    const std::string controller =
        url.empty() ? "http://127.0.0.1:" + std::to_string(http_port_) : url;
    const std::string cmd = std::string(GATEHOUSE_BIN_DIR) + "/gatehouse --controller " +
                            controller + " " + args + " > " + out.string() + " 2> " +
                            err.string();
    const int rc = std::system(cmd.c_str());
    ::unsetenv("GATEHOUSE_TOKEN");
    CliRun run;
    run.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    std::stringstream o, e;
    o << std::ifstream(out).rdbuf();
    e << std::ifstream(err).rdbuf();
    run.out = o.str();
    run.err = e.str();
    return run;
  }

  void ExpectAllCpuGatesPass(const json& cell) {
    ASSERT_EQ(cell.value("status", ""), "passed") << cell.dump(2);
    for (const char* gate : kCpuGates) {
      const json* p = FindPhase(cell, gate);
      ASSERT_NE(p, nullptr) << "phase " << gate << " missing";
      EXPECT_EQ(p->at("status"), "PASS") << gate << ": " << p->dump();
      EXPECT_FALSE(p->at("figures").empty()) << gate << " reported no figure";
    }
    for (const char* gate : {"parallel", "cuda_graph"}) {
      const json* p = FindPhase(cell, gate);
      ASSERT_NE(p, nullptr) << "phase " << gate << " missing";
      EXPECT_EQ(p->at("status"), "SKIPPED") << gate;
      EXPECT_FALSE(p->at("reason").get<std::string>().empty()) << gate << " skipped silently";
    }
    const json* identity = FindPhase(cell, "identity");
    const std::string sandbox = TextFigure(*identity, "sandbox");
    const std::string cgroup = TextFigure(*identity, "cgroup");
    if (sandboxed_) {
      EXPECT_EQ(sandbox.rfind("bubblewrap", 0), 0u) << identity->dump();
    } else {
      EXPECT_EQ(sandbox, "none") << identity->dump();
    }
    if (limited_) {
      EXPECT_EQ(cgroup.rfind("cgroup v", 0), 0u) << identity->dump();
      EXPECT_NE(cgroup.find("memory limit 12 GiB (no swap)"), std::string::npos) << cgroup;
    } else {
      EXPECT_TRUE(cgroup.rfind("cgroup v", 0) == 0 || cgroup.rfind("none: ", 0) == 0) << cgroup;
    }
    // The agents page shows the same: the agent registered its sandbox and cgroups as labels.
    HttpResponse agents = HttpRequest(http_port_, "GET", "/api/v1/agents", "", token_);
    ASSERT_EQ(agents.status, 200) << agents.body;
    const json listed = json::parse(agents.body, nullptr, false);
    ASSERT_TRUE(listed.is_object() && listed.contains("agents") && !listed["agents"].empty())
        << agents.body;
    const json labels = listed["agents"][0]["capabilities"].value("labels", json::object());
    EXPECT_EQ(labels.value("sandbox", ""),
              sandboxed_ ? sandbox.substr(0, sandbox.find(':')) : std::string("none"))
        << labels.dump();
    if (limited_) {
      EXPECT_NE(labels.value("cgroup", "").find("memory limit 12 GiB, process limit none per "
                                                "attempt"),
                std::string::npos)
          << labels.dump();
    }
    const json* inference = FindPhase(cell, "inference");
    auto kl = Figure(*inference, "kl_mean");
    auto top1 = Figure(*inference, "top1_agreement");
    ASSERT_TRUE(kl && top1);
    EXPECT_LT(*kl, 1e-6);
    EXPECT_EQ(*top1, 100.0);
    const json* decode = FindPhase(cell, "decode");
    auto matched = Figure(*decode, "tokens_matched");
    auto total = Figure(*decode, "tokens_total");
    ASSERT_TRUE(matched && total);
    EXPECT_EQ(*matched, *total);
    EXPECT_GE(*total, 32);
  }

  fs::path root_;
  fs::path repo_;
  std::string token_;  // scopes read, submit
  int http_port_ = 0;
  std::unique_ptr<Daemon> controller_;
  std::unique_ptr<Daemon> agent_;
  bool sandboxed_ = false;  // the agent runs with --sandbox bwrap
  bool limited_ = false;    // ... and --attempt-memory-limit 12G
};

// A repository whose adapter is Python (the gh_archon llama adapter, recipe lane "python"):
// the agent pip-installs the frozen commit and the worker runs it on its Python lane, under the
// same gates. The correct branch passes every CPU gate; the branch that swaps two projections
// in its name table (consistently both ways, so the load's round trip holds) FAILs at
// inference, and the build log is pip's.
TEST_F(EndToEndTest, PythonAdapterFromRestToEvidence) {
  const fs::path py_repo = root_ / "python-adapter";
  ASSERT_NO_FATAL_FAILURE(MakePythonAdapterRepository(py_repo));
  json body = Body("main", "llama-tiny-tied");
  body["repository"] = py_repo.string();
  json submitted = Submit(body);
  ASSERT_TRUE(submitted.contains("id")) << submitted.dump();
  const std::string id = submitted.at("id");
  json cell = WaitFinal(id, seconds(600));
  ASSERT_NO_FATAL_FAILURE(ExpectAllCpuGatesPass(cell));
  const json* load = FindPhase(cell, "load");
  ASSERT_NE(load, nullptr);
  EXPECT_NE(load->dump().find("code: from_hf, proved by to_hf(from_hf(checkpoint))"),
            std::string::npos)
      << load->dump();
  HttpResponse build_log =
      HttpRequest(http_port_, "GET", "/api/v1/cells/" + id + "/log?stream=build", "", token_);
  EXPECT_EQ(build_log.status, 200);
  EXPECT_NE(build_log.body.find("-m pip install --no-deps --no-build-isolation"),
            std::string::npos)
      << build_log.body;
  EXPECT_NE(build_log.body.find("Successfully installed gatehouse-archon-adapters"),
            std::string::npos)
      << build_log.body;

  // Tensor parallelism on the lane: a tp=2 cell runs one worker per rank (each with the lane's
  // entries and the installed commit), and each rank's interpreter runs the adapter's own
  // parallelize (DTensor over gloo) against the TP=1 control.
  std::string tp_id;
  const json parallel = ExpectTp2Passes(body, tp_id);
  EXPECT_NE(parallel.dump().find("the adapter's parallelize"), std::string::npos) << parallel.dump();

  body["branch"] = "gate-up-swapped";
  json broken = Submit(body);
  ASSERT_TRUE(broken.contains("id")) << broken.dump();
  json broken_cell = WaitFinal(broken.at("id"), seconds(600));
  EXPECT_EQ(broken_cell.value("status", ""), "failed") << broken_cell.dump(2);
  const json* load_broken = FindPhase(broken_cell, "load");
  ASSERT_NE(load_broken, nullptr);
  EXPECT_EQ(load_broken->at("status"), "PASS") << load_broken->dump();
  const json* inference = FindPhase(broken_cell, "inference");
  ASSERT_NE(inference, nullptr);
  EXPECT_EQ(inference->at("status"), "FAIL") << inference->dump();
  EXPECT_EQ(inference->value("classification", ""), "adapter_contract") << inference->dump();
}

TEST_F(EndToEndTest, CellFromRestToEvidence) {
  // 1. The correct adapter passes every CPU gate on a tied checkpoint.
  json tied = Submit(Body("main", "llama-tiny-tied"));
  ASSERT_TRUE(tied.contains("id")) << tied.dump();
  const std::string tied_id = tied.at("id");
  json cell = WaitFinal(tied_id, seconds(900));
  ASSERT_NO_FATAL_FAILURE(ExpectAllCpuGatesPass(cell));

  // 2. Resubmitting the same inputs returns the same cell, not a new one.
  json again = Submit(Body("main", "llama-tiny-tied"));
  EXPECT_EQ(again.value("id", ""), tied_id);
  EXPECT_EQ(again.value("created", true), false);

  // 3. The report names the commit and every phase.
  HttpResponse report = HttpRequest(http_port_, "GET", "/api/v1/cells/" + tied_id + "/report", "", token_);
  ASSERT_EQ(report.status, 200);
  EXPECT_NE(report.body.find(cell.at("spec").at("commit").get<std::string>()), std::string::npos);
  for (const char* gate : kCpuGates) EXPECT_NE(report.body.find(gate), std::string::npos) << gate;

  // 4. Untied and sharded checkpoints pass too (same plugin build, new cells).
  for (const char* ckpt : {"llama-tiny-untied", "llama-tiny-sharded"}) {
    json other = Submit(Body("main", ckpt));
    ASSERT_TRUE(other.contains("id"));
    EXPECT_NE(other.at("id"), tied_id);
    ASSERT_NO_FATAL_FAILURE(ExpectAllCpuGatesPass(WaitFinal(other.at("id"), seconds(300))))
        << ckpt;
  }

  // 4b. Tensor parallelism: a tp=2 cell runs as two worker processes (one per rank, started
  //     by the agent); rank 0's parallel gate compares TP=2 with the TP=1 control, and rank 1's
  //     log is kept on its own stream.
  std::string tp_id;
  ExpectTp2Passes(Body("main", "llama-tiny-untied"), tp_id);
  HttpResponse rank1_log = HttpRequest(
      http_port_, "GET", "/api/v1/cells/" + tp_id + "/log?stream=worker.rank1", "", token_);
  EXPECT_EQ(rank1_log.status, 200);
  EXPECT_NE(rank1_log.body.find("rank 1 of 2"), std::string::npos) << rank1_log.body;

  // 4c. Layouts beyond tp: dp=2 x tp=2 (four worker processes, each replica sharded over its
  //     own tp group) and pp=2 (two stages, 1F1B), each against the single-rank control.
  ExpectLayoutPasses(Body("main", "llama-tiny-untied"), {{"dp", 2}, {"tp", 2}},
                     {"replica_max_abs_diff", "grad_norm_step_2_rel_diff"});
  ExpectLayoutPasses(Body("main", "llama-tiny-untied"), {{"pp", 2}},
                     {"stage_copies_max_abs_diff", "grad_norm_step_2_rel_diff"});

  // 5. The branch that commits the RoPE bug FAILs at inference and stops later gates.
  json bug = Submit(Body("rope-keys-bug", "llama-tiny-tied"));
  ASSERT_TRUE(bug.contains("id"));
  json bug_cell = WaitFinal(bug.at("id"), seconds(600));
  EXPECT_EQ(bug_cell.value("status", ""), "failed") << bug_cell.dump(2);
  EXPECT_NE(bug_cell.at("spec").at("commit"), cell.at("spec").at("commit"));
  const json* inference = FindPhase(bug_cell, "inference");
  ASSERT_NE(inference, nullptr);
  EXPECT_EQ(inference->at("status"), "FAIL");
  auto kl = Figure(*inference, "kl_mean");
  ASSERT_TRUE(kl);
  EXPECT_GT(*kl, 1e-6);
  for (const char* later : {"decode", "packing", "logprob_parity", "training", "save"}) {
    const json* p = FindPhase(bug_cell, later);
    ASSERT_NE(p, nullptr) << later;
    EXPECT_EQ(p->at("status"), "SKIPPED") << later;
    EXPECT_NE(p->at("reason").get<std::string>().find("inference"), std::string::npos) << later;
  }
  // Its plot data went worker -> agent -> controller as an artifact: KL along the position is
  // 0 at position 0 (a token there attends only to itself, and RoPE rotates by angle 0) and
  // rises after it, the shape the cell page draws for a RoPE bug.
  std::string plot_digest;
  for (const json& a : bug_cell.at("artifacts")) {
    if (a.at("name") == "inference/kl_by_position.json") plot_digest = a.at("digest");
  }
  ASSERT_FALSE(plot_digest.empty()) << bug_cell.at("artifacts").dump();
  HttpResponse plot = HttpRequest(http_port_, "GET", "/api/v1/artifacts/" + plot_digest, "", token_);
  ASSERT_EQ(plot.status, 200) << plot.body;
  const json kl_plot = json::parse(plot.body);
  ASSERT_FALSE(kl_plot.at("prompts").empty());
  for (const json& p : kl_plot.at("prompts")) {
    const std::vector<double> by_position = p.at("kl");
    ASSERT_GE(by_position.size(), 2u);
    EXPECT_LT(by_position[0], 1e-9) << p.dump();
    EXPECT_GT(*std::max_element(by_position.begin() + 1, by_position.end()), 1e-6) << p.dump();
  }

  // 5b. CI's path, the gatehouse CLI: the exit code is the verdict (0 PASS, 1 FAIL, 2 refused,
  //     5 unreachable), progress as phases end, JUnit XML, the report and the log.
  WriteTextFile(root_ / "main.json", Body("main", "llama-tiny-tied").dump());
  WriteTextFile(root_ / "bug.json", Body("rope-keys-bug", "llama-tiny-tied").dump());
  CliRun passed = Cli("submit --body " + (root_ / "main.json").string() + " --wait --junit " +
                      (root_ / "junit.xml").string());
  EXPECT_EQ(passed.exit_code, 0) << passed.out << passed.err;
  EXPECT_NE(passed.out.find(tied_id + " existing passed"), std::string::npos) << passed.out;
  std::stringstream junit;
  junit << std::ifstream(root_ / "junit.xml").rdbuf();
  EXPECT_NE(junit.str().find("name=\"" + tied_id.substr(0, 12) + ".inference\""), std::string::npos)
      << junit.str();
  const fs::path untied = fs::path(GATEHOUSE_TESTDATA_DIR) / "llama-tiny-untied";
  CliRun fresh = Cli("submit --repository " + repo_.string() + " --branch main --family llama" +
                     " --checkpoint " + (untied / "checkpoint").string() + " --reference " +
                     (untied / "reference").string() +
                     " --max-new-tokens 16 --wait --poll-ms 300 --timeout-s 600");
  EXPECT_EQ(fresh.exit_code, 0) << fresh.out << fresh.err;
  EXPECT_NE(fresh.out.find(" created "), std::string::npos) << fresh.out;
  EXPECT_NE(fresh.out.find(" inference PASS "), std::string::npos) << fresh.out;
  CliRun failed = Cli("submit --body " + (root_ / "bug.json").string() + " --wait");
  EXPECT_EQ(failed.exit_code, 1) << failed.out << failed.err;
  EXPECT_NE(failed.out.find(" inference FAIL "), std::string::npos) << failed.out;
  const fs::path tied_dir = fs::path(GATEHOUSE_TESTDATA_DIR) / "llama-tiny-tied";
  WriteTextFile(root_ / "matrix.json",
                json{{"repository", repo_.string()},
                     {"branch", {"main", "rope-keys-bug"}},
                     {"checkpoints", {{{"checkpoint", (tied_dir / "checkpoint").string()},
                                       {"reference", (tied_dir / "reference").string()}}}},
                     {"base", {{"model_family", "llama"}}}}
                    .dump());
  CliRun matrix = Cli("submit --matrix " + (root_ / "matrix.json").string() + " --wait");
  EXPECT_EQ(matrix.exit_code, 1) << matrix.out << matrix.err;
  EXPECT_NE(matrix.out.find(tied_id + " existing passed"), std::string::npos) << matrix.out;
  EXPECT_NE(matrix.out.find(bug.at("id").get<std::string>() + " existing failed"),
            std::string::npos)
      << matrix.out;
  CliRun cli_report = Cli("report " + tied_id);
  EXPECT_EQ(cli_report.exit_code, 0) << cli_report.err;
  EXPECT_NE(cli_report.out.find(cell.at("spec").at("commit").get<std::string>()), std::string::npos);
  CliRun log = Cli("logs " + tied_id + " --stream worker");
  EXPECT_EQ(log.exit_code, 0) << log.err;
  EXPECT_FALSE(log.out.empty());
  CliRun refused = Cli("submit --repository " + repo_.string() +
                       " --branch no-such-branch --family llama --checkpoint " +
                       (untied / "checkpoint").string());
  EXPECT_EQ(refused.exit_code, 2) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("no-such-branch"), std::string::npos) << refused.err;
  CliRun no_token = Cli("report " + tied_id, /*with_token=*/false);
  EXPECT_EQ(no_token.exit_code, 2) << no_token.err;
  EXPECT_NE(no_token.err.find("HTTP 401"), std::string::npos) << no_token.err;
  CliRun unreachable = Cli("wait " + tied_id, true, "http://127.0.0.1:1");
  EXPECT_EQ(unreachable.exit_code, 5) << unreachable.err;

  // 6. Bad input is refused with the offending value named, and the controller keeps serving.
  json unknown_branch = Body("no-such-branch", "llama-tiny-tied");
  HttpResponse r = HttpRequest(http_port_, "POST", "/api/v1/cells", unknown_branch.dump(), token_);
  EXPECT_GE(r.status, 400);
  EXPECT_LT(r.status, 500);
  EXPECT_NE(r.body.find("no-such-branch"), std::string::npos) << r.body;
  r = HttpRequest(http_port_, "POST", "/api/v1/cells", "{\"repository\": ", token_);
  EXPECT_EQ(r.status, 400);
  json extra = Body("main", "llama-tiny-tied");
  extra["colour"] = "blue";
  r = HttpRequest(http_port_, "POST", "/api/v1/cells", extra.dump(), token_);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("colour"), std::string::npos) << r.body;
  EXPECT_EQ(HttpRequest(http_port_, "GET", "/api/v1/cells/" + tied_id, "", token_).status, 200);

  // 7. User strings reach processes as argv and environment, never through a shell: a branch
  //    name and an env value full of shell syntax run like any other cell, and nothing they
  //    spell is executed (no "pwned*" file appears anywhere under the test's root or cwd).
  const std::string evil = "sec/$(touch${IFS}pwned1)`touch${IFS}pwned2`;touch${IFS}pwned3";
  Git(repo_, {"branch", evil, "main"});
  json evil_body = Body(evil, "llama-tiny-untied");
  evil_body["env"] = {{"GATEHOUSE_PROBE", "$(touch pwned4); `touch pwned5` | touch pwned6 && x"}};
  json evil_cell = Submit(evil_body);
  ASSERT_TRUE(evil_cell.contains("id")) << evil_cell.dump();
  EXPECT_EQ(evil_cell.at("labels").at("branch"), evil);
  json evil_final = WaitFinal(evil_cell.at("id"), seconds(300));
  EXPECT_EQ(evil_final.value("status", ""), "passed") << evil_final.dump(2);
  EXPECT_EQ(evil_final.at("spec").at("env").at("GATEHOUSE_PROBE"),
            evil_body["env"]["GATEHOUSE_PROBE"]);
  for (const fs::path& dir : {root_, fs::current_path()}) {
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      EXPECT_EQ(entry.path().filename().string().rfind("pwned", 0), std::string::npos)
          << "a shell ran user input: " << entry.path();
    }
  }
}

}  // namespace
}  // namespace gatehouse::testing
