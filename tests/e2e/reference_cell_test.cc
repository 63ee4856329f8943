// End-to-end, as a new user comes: a checkpoint saved by transformers in this test (a model
// type none of Gatehouse's families serves, and no reference bundle beside it) and an adapter
// repository that adds its own family ("ministral") next to a copy of models/. Through the real
// controller, agent, reference runner and worker processes on 127.0.0.1, driven by the
// `gatehouse` CLI:
//  - `gatehouse submit --wait` names no reference: the controller creates the reference cell of
//    the checkpoint, an agent runs upstream on it and stores the bundle as artifacts, the
//    validation cell waits for it, then runs against the fetched bundle and passes (exit 0);
//  - a second submit returns the same cells (no second reference run);
//  - the adapter branch that ignores the sliding window exits with the FAIL code, caught on the
//    default prompt the reference runner chose past the window;
//  - `gatehouse reference --wait --out` finds the same reference cell and downloads its bundle,
//    which the worker's validator accepts;
//  - a checkpoint transformers cannot load fails its reference cell with upstream's error, and
//    the validation cell waiting for it ends blocked (exit 3) without running;
//  - CI's webhook receiver gets a signed delivery for each of those cell ends (the first one
//    after a retry: the receiver answers it 503), and each cell records its delivery.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "common/sha256.h"
#include "e2e_util.h"
#include "http_client.h"
#include "process_harness.h"
#include "webhook_receiver.h"

namespace gatehouse::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

class ReferenceCellEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("gatehouse-e2e-ref-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "logs");
    ASSERT_NO_FATAL_FAILURE(MakeMinistralRepository(root_ / "adapter"));
    // The user's checkpoint, saved by transformers here; no reference bundle beside it.
    CommandResult made = RunCommand(GATEHOUSE_PYTHON,
                                    {std::string(GATEHOUSE_E2E_DIR) + "/make_user_checkpoint.py",
                                     (root_ / "user" / "ckpt").string()},
                                    root_);
    ASSERT_EQ(made.exit_code, 0) << made.output;
    ASSERT_FALSE(fs::exists(root_ / "user" / "reference"));

    const std::string bin = GATEHOUSE_BIN_DIR;
    const std::string db = (root_ / "gatehouse.db").string();
    token_ = CreateToken(bin, db, {"--name", "ci", "--scopes", "read,submit"});
    admin_token_ = CreateToken(bin, db, {"--name", "operator", "--scopes", "admin"});
    const std::string agent_token = CreateToken(bin, db, {"--name", "node", "--kind", "agent"});
    ASSERT_FALSE(token_.empty() || agent_token.empty());
    WriteTextFile(root_ / "agent.token", agent_token + "\n");
    // CI's webhook receiver: it answers the first delivery 503 (a retry must follow).
    receiver_ = std::make_unique<WebhookReceiver>(/*fail_first=*/1);
    WriteTextFile(root_ / "webhook.secret", std::string(kWebhookSecret) + "\n");
    controller_ = std::make_unique<Daemon>(
        bin + "/gatehouse-controller",
        std::vector<std::string>{"--db", db, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
                                 "--mirror-dir", (root_ / "mirrors").string(), "--artifact-dir",
                                 (root_ / "artifacts").string(), "--web-dir", GATEHOUSE_WEB_DIR,
                                 "--torch-pin", GATEHOUSE_TORCH_VERSION, "--webhook-url",
                                 "http://127.0.0.1:" + std::to_string(receiver_->port()) +
                                     "/hooks/gatehouse",
                                 "--webhook-secret-file", (root_ / "webhook.secret").string()},
        root_ / "logs" / "controller");
    auto ports = WaitForControllerPorts(*controller_);
    ASSERT_TRUE(ports) << controller_->Stderr();
    http_port_ = ports->http;
    // One agent runs both kinds of cell: the reference runner is this build's venv.
    agent_ = std::make_unique<Daemon>(
        bin + "/gatehouse-agent",
        std::vector<std::string>{"--controller", "127.0.0.1:" + std::to_string(ports->grpc),
                                 "--name", "node", "--work-dir", (root_ / "agent").string(),
                                 "--sdk-dir", GATEHOUSE_SDK_DIR, "--cmake-prefix-path",
                                 GATEHOUSE_TORCH_PREFIX, "--worker", bin + "/gatehouse-worker",
                                 "--token-file", (root_ / "agent.token").string(),
                                 "--reference-python", GATEHOUSE_PYTHON, "--reference-script",
                                 GATEHOUSE_REFERENCE_SCRIPT},
        root_ / "logs" / "agent");
    ASSERT_TRUE(agent_->WaitForLine(std::regex("registered as"), seconds(60)))
        << agent_->Stderr();
  }

  void TearDown() override {
    agent_.reset();
    controller_.reset();
    if (!HasFailure()) {
      fs::remove_all(root_);
    } else {
      std::cerr << "e2e: keeping " << root_ << " for inspection\n";
    }
  }

  /// models/ as the adapter repository's root plus the team's own family, ministral/
  /// (registered in plugin.cc, built by CMakeLists.txt): branch `main`; branch `no-window` with
  /// the bug "the sliding window is never applied".
  static void MakeMinistralRepository(const fs::path& repo) {
    fs::create_directories(repo);
    fs::copy(GATEHOUSE_MODELS_DIR, repo, fs::copy_options::recursive);
    fs::copy(fs::path(GATEHOUSE_E2E_DIR) / "adapter_ministral" / "ministral", repo / "ministral",
             fs::copy_options::recursive);
    auto edit = [](const fs::path& file, const std::string& after, const std::string& add) {
      std::stringstream text;
      text << std::ifstream(file).rdbuf();
      std::string s = text.str();
      const size_t at = s.find(after);
      ASSERT_NE(at, std::string::npos) << file << " has no '" << after << "'";
      s.insert(at + after.size(), add);
      WriteTextFile(file, s);
    };
    ASSERT_NO_FATAL_FAILURE(
        edit(repo / "plugin.cc", "#include \"llama/llama.h\"\n", "#include \"ministral/ministral.h\"\n"));
    ASSERT_NO_FATAL_FAILURE(edit(repo / "plugin.cc",
                                 "GH_RETURN_IF_ERROR(registry.Register(llama::MakeLlamaFamily()));\n",
                                 "  GH_RETURN_IF_ERROR(registry.Register(acme::ministral::"
                                 "MakeMinistralFamily()));\n"));
    ASSERT_NO_FATAL_FAILURE(
        edit(repo / "CMakeLists.txt", "set(GATEHOUSE_FAMILY_SOURCES\n", "  ministral/ministral.cc\n"));
    Git(repo, {"init", "-q", "-b", "main"});
    Git(repo, {"add", "-A"});
    Git(repo, {"commit", "-q", "-m", "Ministral adapter"});
    // The copied recipe still declares only models/' families: submit refuses "ministral" until
    // the team adds it (branch `forgot-recipe` keeps that first commit).
    Git(repo, {"branch", "forgot-recipe"});
    ASSERT_NO_FATAL_FAILURE(
        edit(repo / "gatehouse.recipe.json", "\"families\": [", "\"ministral\", "));
    Git(repo, {"commit", "-q", "-am", "Declare ministral in the recipe"});
    Git(repo, {"checkout", "-q", "-b", "no-window"});
    Git(repo, {"apply", std::string(GATEHOUSE_E2E_DIR) + "/adapter_ministral/no_window.patch"});
    Git(repo, {"commit", "-q", "-am", "Ministral adapter that never applies the sliding window"});
    Git(repo, {"checkout", "-q", "main"});
  }

  struct CliRun {
    int exit_code = -1;
    std::string out, err;
  };

  /// bin/gatehouse against this controller with `args` (shell words this test controls), the
  /// token in GATEHOUSE_TOKEN.
  CliRun Cli(const std::string& args, const std::string& token = "") {
    const fs::path out = root_ / "cli.stdout", err = root_ / "cli.stderr";
    ::setenv("GATEHOUSE_TOKEN", (token.empty() ? token_ : token).c_str(), 1);
    const std::string cmd = std::string(GATEHOUSE_BIN_DIR) + "/gatehouse --controller http://127.0.0.1:" +
                            std::to_string(http_port_) + " " + args + " > " + out.string() +
                            " 2> " + err.string();
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

  json Get(const std::string& path) {
    HttpResponse r = HttpRequest(http_port_, "GET", path, "", token_);
    EXPECT_EQ(r.status, 200) << path << ": " << r.body << r.error;
    return json::parse(r.body, nullptr, false);
  }

  /// The body flags of a validation cell of the user's checkpoint (submit's and run's).
  static std::string CellArgs(const fs::path& checkpoint) {
    return " --family ministral --checkpoint " + checkpoint.string() +
           " --max-new-tokens 8 --phases identity,config,construct,load,inference,decode,training,save";
  }

  /// The submit flags of a validation cell of the user's checkpoint on `branch`.
  std::string SubmitArgs(const std::string& branch, const fs::path& checkpoint) const {
    return "submit --wait --timeout-s 1200 --poll-ms 500 --repository " +
           (root_ / "adapter").string() + " --branch " + branch + CellArgs(checkpoint);
  }

  /// The cell id on the first line of a submit's output ("<id> created|existing <status>").
  static std::string FirstId(const std::string& out) {
    std::smatch m;
    if (!std::regex_search(out, m, std::regex("^([0-9a-f]{64}) (created|existing)"))) return "";
    return m[1];
  }

  fs::path root_;
  std::string token_;
  std::string admin_token_;  // the operator's: hide and show, designated branches
  int http_port_ = 0;
  static constexpr char kWebhookSecret[] = "e2e-webhook-secret";
  std::unique_ptr<WebhookReceiver> receiver_;
  std::unique_ptr<Daemon> controller_;
  std::unique_ptr<Daemon> agent_;
};

TEST_F(ReferenceCellEndToEndTest, YourOwnCheckpointFromSubmitToVerdict) {
  const fs::path checkpoint = root_ / "user" / "ckpt";

  // 0. The recipe at the commit does not declare the family: refused at submit, no queue.
  const CliRun undeclared = Cli(SubmitArgs("forgot-recipe", checkpoint));
  EXPECT_EQ(undeclared.exit_code, 2) << undeclared.out << undeclared.err;
  EXPECT_NE(undeclared.err.find("field 'model_family' = \"ministral\""), std::string::npos)
      << undeclared.err;
  EXPECT_NE(undeclared.err.find("gatehouse.recipe.json"), std::string::npos) << undeclared.err;
  EXPECT_EQ(Get("/api/v1/cells")["cells"].size(), 0u);

  // 1. A validation cell naming no reference: its reference cell runs first, then it passes.
  CliRun first = Cli(SubmitArgs("main", checkpoint));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err << "\nagent:\n" << agent_->Stderr();
  const std::string id = FirstId(first.out);
  ASSERT_FALSE(id.empty()) << first.out;
  EXPECT_NE(first.out.find("waiting: waiting for its reference cell"), std::string::npos)
      << first.out;
  const json cell = Get("/api/v1/cells/" + id);
  EXPECT_EQ(cell["status"], "passed");
  const std::string ref_id = cell["spec"]["reference"].value("cell", "");
  ASSERT_EQ(ref_id.size(), 64u) << cell["spec"].dump();
  const json* inference = FindPhase(cell, "inference");
  ASSERT_NE(inference, nullptr);
  EXPECT_EQ(inference->at("status"), "PASS") << inference->dump();
  const json* identity = FindPhase(cell, "identity");
  ASSERT_NE(identity, nullptr);
  EXPECT_EQ(identity->at("status"), "PASS") << identity->dump();

  const json ref = Get("/api/v1/cells/" + ref_id);
  EXPECT_EQ(ref["status"], "passed");
  EXPECT_EQ(ref["spec"]["kind"], "reference");
  EXPECT_EQ(ref["spec"]["checkpoint"]["digest"], cell["spec"]["checkpoint"]["digest"]);
  for (const char* phase : {"identity", "reference"}) {
    const json* p = FindPhase(ref, phase);
    ASSERT_NE(p, nullptr) << phase;
    EXPECT_EQ(p->at("status"), "PASS") << p->dump();
  }
  ASSERT_EQ(ref["artifacts"].size(), 2u) << ref.dump();
  std::map<std::string, std::string> digests;
  for (const json& a : ref["artifacts"]) digests[a["name"]] = a["digest"];
  ASSERT_TRUE(digests.count("reference/reference.json") &&
              digests.count("reference/reference.safetensors"));
  // The worker compared with exactly the bundle the reference cell stored: the directory digest
  // of those two files, as the identity gate recomputed it on the node.
  const fs::path fetched = root_ / "agent" / "attempts" / std::to_string(cell["attempts"][0]["id"].get<int>()) / "reference";
  EXPECT_TRUE(fs::exists(fetched / "reference.safetensors")) << fetched;

  // 2. The same inputs again: the same cells, no second reference run.
  CliRun again = Cli(SubmitArgs("main", checkpoint));
  EXPECT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_EQ(FirstId(again.out), id);
  EXPECT_NE(again.out.find(" existing "), std::string::npos) << again.out;
  EXPECT_EQ(Get("/api/v1/cells/" + ref_id)["attempts"].size(), 1u);

  // 2b. The same adapter in another repository (a team's fork): another repository key, so
  //     another build dir on the agent, yet every compilation of its build comes from ccache
  //     (docs/protocols.md §5.1), as the identity gate's build figures say.
  const fs::path fork = root_ / "fork.git";
  Git(root_, {"clone", "-q", "--bare", (root_ / "adapter").string(), fork.string()});
  CliRun forked = Cli("submit --wait --timeout-s 1200 --poll-ms 500 --repository " +
                      fork.string() + " --branch main" + CellArgs(checkpoint));
  ASSERT_EQ(forked.exit_code, 0) << forked.out << forked.err;
  const std::string fork_id = FirstId(forked.out);
  const json fork_cell = Get("/api/v1/cells/" + fork_id);
  EXPECT_EQ(fork_cell["spec"]["reference"].value("cell", ""), ref_id) << "the same reference";
  const json* fork_identity = FindPhase(fork_cell, "identity");
  ASSERT_NE(fork_identity, nullptr) << fork_cell.dump();
  std::map<std::string, json> build;
  for (const json& f : fork_identity->at("figures")) build[f["name"]] = f["value"];
  ASSERT_TRUE(build.count("build_compilations") && build.count("build_cache_hits"))
      << fork_identity->dump();
  EXPECT_GT(build["build_compilations"].get<int64_t>(), 0) << fork_identity->dump();
  EXPECT_EQ(build["build_cache_hits"], build["build_compilations"]) << fork_identity->dump();

  // 3. The adapter branch that ignores the sliding window: FAIL, on the reference cell's
  //    default prompt longer than the window (the reference is reused, not run again).
  CliRun broken = Cli(SubmitArgs("no-window", checkpoint));
  EXPECT_EQ(broken.exit_code, 1) << broken.out << broken.err;
  const json broken_cell = Get("/api/v1/cells/" + FirstId(broken.out));
  EXPECT_EQ(broken_cell["status"], "failed");
  EXPECT_EQ(broken_cell["spec"]["reference"]["cell"], ref_id);
  const json* broken_inference = FindPhase(broken_cell, "inference");
  ASSERT_NE(broken_inference, nullptr);
  EXPECT_EQ(broken_inference->at("status"), "FAIL") << broken_inference->dump();
  EXPECT_EQ(Get("/api/v1/cells/" + ref_id)["attempts"].size(), 1u);

  // 4. `gatehouse reference` finds that reference cell and downloads its bundle.
  CliRun download = Cli("reference --checkpoint " + checkpoint.string() +
                        " --max-new-tokens 8 --wait --timeout-s 300 --out " +
                        (root_ / "bundle").string());
  ASSERT_EQ(download.exit_code, 0) << download.out << download.err;
  EXPECT_EQ(FirstId(download.out), ref_id) << download.out;
  for (const auto& [name, digest] : digests) {
    const fs::path file = root_ / "bundle" / fs::path(name).filename();
    ASSERT_TRUE(fs::exists(file)) << file;
    EXPECT_EQ("sha256:" + *Sha256FileHex(file), digest) << name;
  }
  CommandResult check = RunCommand(std::string(GATEHOUSE_BIN_DIR) + "/gatehouse-worker",
                                   {"--check-reference", (root_ / "bundle").string()}, root_);
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("\"max_new_tokens\":8"), std::string::npos) << check.output;
  EXPECT_NE(check.output.find("40"), std::string::npos)
      << "a default prompt past the sliding window of 24: " << check.output;
  HttpResponse blob = HttpRequest(http_port_, "GET", "/api/v1/artifacts/sha256:" + std::string(64, '0'), "", token_);
  EXPECT_EQ(blob.status, 404) << blob.body;

  // 5. A checkpoint transformers cannot load: its reference cell FAILs with upstream's text,
  //    and the validation cell waiting for it ends blocked without running (exit 3).
  const fs::path bad = root_ / "bad" / "ckpt";
  fs::create_directories(bad);
  fs::copy_file(checkpoint / "model.safetensors", bad / "model.safetensors");
  WriteTextFile(bad / "config.json", R"({"model_type": "no_such_model", "vocab_size": 256})");
  CliRun blocked = Cli(SubmitArgs("main", bad));
  EXPECT_EQ(blocked.exit_code, 3) << blocked.out << blocked.err;
  const json blocked_cell = Get("/api/v1/cells/" + FirstId(blocked.out));
  EXPECT_EQ(blocked_cell["status"], "blocked") << blocked_cell.dump();
  const std::string bad_ref = blocked_cell["spec"]["reference"].value("cell", "");
  const std::string reason = blocked_cell["attempts"].back().value("reason", "");
  EXPECT_NE(reason.find("its reference cell " + bad_ref + " ended failed"), std::string::npos)
      << reason;
  const json bad_ref_cell = Get("/api/v1/cells/" + bad_ref);
  const json* bad_phase = FindPhase(bad_ref_cell, "reference");
  ASSERT_NE(bad_phase, nullptr) << bad_ref_cell.dump();
  EXPECT_EQ(bad_phase->at("status"), "FAIL");
  EXPECT_NE(bad_phase->at("reason").get<std::string>().find("transformers cannot load the checkpoint"),
            std::string::npos)
      << bad_phase->dump();
  EXPECT_NE(bad_phase->at("reason").get<std::string>().find("no_such_model"), std::string::npos)
      << bad_phase->dump();

  // 6. The webhook: a signed delivery for every cell end, the first one retried after the
  //    receiver's 503, each recorded on its cell.
  const std::map<std::string, std::string> verdicts = {{ref_id, "passed"},
                                                       {id, "passed"},
                                                       {fork_id, "passed"},
                                                       {FirstId(broken.out), "failed"},
                                                       {bad_ref, "failed"},
                                                       {FirstId(blocked.out), "blocked"}};
  std::map<std::string, json> delivered;  // cell id -> the body its 200 answered
  std::vector<WebhookReceiver::Delivery> got;
  for (int i = 0; i < 300 && delivered.size() < verdicts.size(); ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    got = receiver_->deliveries();
    delivered.clear();
    for (const auto& d : got) {
      if (d.answered == 200) delivered[json::parse(d.body)["cell"]["id"]] = json::parse(d.body);
    }
  }
  ASSERT_EQ(delivered.size(), verdicts.size()) << got.size() << " deliveries";
  EXPECT_EQ(got.size(), verdicts.size() + 1);  // the 503'd one once more
  for (const auto& d : got) {
    EXPECT_EQ(d.headers.at("x-gatehouse-signature-256"), HmacSha256Header(kWebhookSecret, d.body));
    EXPECT_EQ(d.headers.at("x-gatehouse-event"), "cell.ended");
    EXPECT_EQ(d.headers.at("content-type"), "application/json");
  }
  EXPECT_EQ(got[0].answered, 503);
  int same_delivery = 0;  // the retry carries the first try's delivery id and body
  for (size_t i = 1; i < got.size(); ++i) {
    if (got[i].headers.at("x-gatehouse-delivery") == got[0].headers.at("x-gatehouse-delivery")) {
      ++same_delivery;
      EXPECT_EQ(got[i].body, got[0].body);
      EXPECT_EQ(got[i].answered, 200);
    }
  }
  EXPECT_EQ(same_delivery, 1);
  for (const auto& [cell_id, verdict] : verdicts) {
    const json& body = delivered[cell_id];
    EXPECT_EQ(body["verdict"], verdict) << cell_id;
    EXPECT_EQ(body["cell"]["report_url"], "/api/v1/cells/" + cell_id + "/report");
    const json record = Get("/api/v1/cells/" + cell_id)["webhook_deliveries"];
    ASSERT_EQ(record.size(), 1u) << cell_id;
    EXPECT_EQ(record[0]["state"], "delivered") << record.dump();
    EXPECT_EQ(record[0]["last_status"], 200);
  }
  EXPECT_EQ(Get("/api/v1/cells/" + ref_id)["webhook_deliveries"][0]["tries"], 2);
  EXPECT_EQ(delivered[ref_id]["cell"]["kind"], "reference");

  // 7. `gatehouse run` on a clone of main with an uncommitted change, as the team would run it
  //    before pushing: no controller; the same cell (its origin is the repository the frozen
  //    cell names, its HEAD main's commit), the same verdict, phase by phase, and the same
  //    figures, its own reference bundle made by the same runner; the change is named.
  const fs::path clone = root_ / "clone";
  Git(root_, {"clone", "-q", (root_ / "adapter").string(), clone.string()});
  {
    std::ofstream edit(clone / "ministral" / "ministral.cc", std::ios::app);
    edit << "// a note not yet committed\n";
  }
  const fs::path out = root_ / "local-run";
  CliRun local = Cli("run --tree " + clone.string() + " --work-dir " + (root_ / "local").string() +
                     " --out " + out.string() + CellArgs(checkpoint));
  ASSERT_EQ(local.exit_code, 0) << local.out << local.err;
  EXPECT_NE(local.out.find(id + " passed"), std::string::npos) << local.out;
  EXPECT_NE(local.out.find("running upstream (transformers)"), std::string::npos) << local.out;
  std::map<std::string, std::map<std::string, json>> local_figures;  // phase -> name -> value
  std::map<std::string, std::string> local_status;
  std::ifstream events(out / "events.jsonl");
  for (std::string line; std::getline(events, line);) {
    const json e = json::parse(line, nullptr, false);
    if (!e.is_object() || e.value("rank", 0) != 0) continue;
    if (e.value("event", "") == "figure") local_figures[e["phase"]][e["name"]] = e["value"];
    if (e.value("event", "") == "phase_end") local_status[e["phase"]] = e["status"];
  }
  EXPECT_EQ(local_figures["identity"]["evidence"],
            "local, unfrozen; tree has 1 changed file: ministral/ministral.cc");
  EXPECT_EQ(local_figures["identity"]["tree_clean"], "false");
  EXPECT_EQ(local_figures["identity"]["sha"], cell["spec"]["commit"]);
  // Its build, in another work dir, took every object from ccache: the edit is a comment, so
  // even the edited source hits (ccache's preprocessed mode, after the direct-mode miss).
  ASSERT_TRUE(local_figures["identity"].count("build_compilations")) << local.out;
  const int64_t local_compilations = local_figures["identity"]["build_compilations"].get<int64_t>();
  EXPECT_GT(local_compilations, 1);
  EXPECT_EQ(local_figures["identity"]["build_cache_hits"].get<int64_t>(), local_compilations);
  // Figures that measure this run rather than the adapter (time, memory, where it ran, what its
  // build took from ccache), and the digest of its own reference bundle (the same runner's,
  // whose reference.json records its stages' timings).
  const std::regex run_figure("(_ms|_s|_bytes|_rss.*|seconds|_per_s|_per_token|threads)$");
  const std::set<std::string> where = {"evidence",         "tree_clean",
                                       "cgroup",           "sandbox",
                                       "reference_digest", "build_compilations",
                                       "build_cache_hits"};
  int compared = 0;
  for (const json& phase : cell["phases"]) {
    const std::string name = phase["phase"];
    EXPECT_EQ(local_status[name], phase["status"]) << name;
    for (const json& f : phase["figures"]) {
      const std::string figure = f["name"];
      if (std::regex_search(figure, run_figure) || (name == "identity" && where.count(figure))) {
        continue;
      }
      ASSERT_TRUE(local_figures[name].count(figure)) << name << "." << figure;
      EXPECT_EQ(local_figures[name][figure], f["value"]) << name << "." << figure;
      ++compared;
    }
  }
  EXPECT_GT(compared, 50);
  std::stringstream report;
  report << std::ifstream(out / "report.md").rdbuf();
  EXPECT_NE(report.str().find("**Local run**"), std::string::npos) << report.str();
  EXPECT_NE(report.str().find("| status | **passed** |"), std::string::npos) << report.str();
  // 7b. Ctrl-C (SIGINT; SIGTERM alike) stops `gatehouse run` with what it started: the
  //     reference runner (here: a new reference, 1000 training steps, minutes of work) runs in
  //     a process group of its own, so the terminal's signal reaches only the run, which stops
  //     that group and ends, saying so, leaving no process behind.
  {
    const fs::path work = root_ / "local-stop";
    Daemon stopped(std::string(GATEHOUSE_BIN_DIR) + "/gatehouse",
                   {"run", "--tree", clone.string(), "--work-dir", work.string(), "--family",
                    "ministral", "--checkpoint", checkpoint.string(), "--phases",
                    "identity,config,construct,load,training", "--training-steps", "1000"},
                   root_ / "logs" / "local-stop");
    const auto running_under = [&](const std::string& what) {
      return RunCommand("pgrep", {"-f", what + ".*" + work.string()}, root_).exit_code == 0;
    };
    ASSERT_TRUE(stopped.WaitForLine(std::regex("running upstream"), seconds(120))) << stopped.Stderr();
    const auto deadline_up = std::chrono::steady_clock::now() + seconds(60);
    while (!running_under("reference_cell.py") && std::chrono::steady_clock::now() < deadline_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ASSERT_TRUE(running_under("reference_cell.py")) << "the reference runner did not start";
    stopped.Interrupt();
    const auto deadline = std::chrono::steady_clock::now() + seconds(30);
    while (stopped.running() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    EXPECT_FALSE(stopped.running()) << stopped.Stderr();
    EXPECT_FALSE(running_under("")) << "the local run left a process behind";
    EXPECT_NE(stopped.Stderr().find("gatehouse: stopping the run"), std::string::npos)
        << stopped.Stderr();
    EXPECT_NE(stopped.Stderr().find("stopped by SIGINT or SIGTERM"), std::string::npos)
        << stopped.Stderr();
  }
  // 8. The operator's commands: the no-window branch is not designated (main, the default
  //    branch, is); its FAIL can also be hidden, and shown again, with a reason.
  CliRun branches = Cli("branches --repository " + (root_ / "adapter").string());
  EXPECT_EQ(branches.exit_code, 0) << branches.err;
  EXPECT_NE(branches.out.find("\"default_branch\""), std::string::npos) << branches.out;
  EXPECT_NE(branches.out.find("\"main\""), std::string::npos) << branches.out;
  const std::string broken_id = FirstId(broken.out);
  EXPECT_EQ(Cli("hide " + broken_id + " --reason experiment").exit_code, 2);  // ci: no admin
  CliRun hidden = Cli("hide " + broken_id + " --reason experiment", admin_token_);
  EXPECT_EQ(hidden.exit_code, 0) << hidden.err;
  EXPECT_EQ(hidden.out, broken_id + " hidden\n");
  EXPECT_EQ(Get("/api/v1/cells/" + broken_id)["hidden"], true);
  EXPECT_EQ(Cli("show " + broken_id + " --reason back", admin_token_).exit_code, 0);
  EXPECT_EQ(Get("/api/v1/cells/" + broken_id)["hidden"], false);

  // --submit of a tree with changes is refused before anything runs.
  CliRun refused = Cli("run --submit --tree " + clone.string() + " --family ministral --checkpoint " +
                       checkpoint.string() + " --work-dir " + (root_ / "local").string());
  EXPECT_EQ(refused.exit_code, 2) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("commit and push"), std::string::npos) << refused.err;
}

}  // namespace
}  // namespace gatehouse::testing
