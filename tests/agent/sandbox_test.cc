// Tests of per-attempt isolation (agent/sandbox.h, docs/protocols.md §3.6): a two-rank attempt
// whose "adapter" tries to read the agent's token and another attempt's files, write its own
// checkout, and reach the network, run by RunWorker with and without the sandbox (the run
// without it shows the probe does reach what the sandbox hides). SKIPPED with the reason where
// bwrap is missing or user namespaces are not allowed.
#include "agent/sandbox.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "agent/worker_launcher.h"
#include "agent_test_util.h"
#include "fake_attempt_sink.h"
#include "tests/common/sample_spec.h"

namespace gatehouse::agent {
namespace {

using nlohmann::json;
using testing::TempDir;
using testing::WriteFile;

TEST(SandboxTest, BwrapArgumentsHideTheWorkDirThenBindTheAttemptsOwn) {
  // Verifies the mount order: read-only root, the work dir hidden, hidden files and dirs
  // covered, then the attempt's read-only paths and its writable dir bound back over them.
  SandboxConfig config;
  config.work_dir = "/var/lib/agent";
  config.hidden_files = {"/etc/gatehouse/agent.token"};
  config.hidden_dirs = {"/srv/secrets"};
  SandboxPaths paths;
  paths.attempt_dir = "/var/lib/agent/attempts/7";
  paths.read_only = {"/var/lib/agent/repos/abc"};
  paths.writable = {"/var/lib/agent/build/abc"};
  const std::vector<std::string> expected = {
      "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
      "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
      "--tmpfs", "/var/lib/agent", "--tmpfs", "/srv/secrets",
      "--ro-bind", "/dev/null", "/etc/gatehouse/agent.token",
      "--ro-bind", "/var/lib/agent/repos/abc", "/var/lib/agent/repos/abc",
      "--bind", "/var/lib/agent/build/abc", "/var/lib/agent/build/abc",
      "--bind", "/var/lib/agent/attempts/7", "/var/lib/agent/attempts/7"};
  EXPECT_EQ(BwrapArgs(config, paths), expected);
}

class SandboxRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto root = tmp_.path();
    work_ = root / "work";
    token_ = root / "etc" / "agent.token";
    WriteFile(token_, "agent-token-s3cret\n");
    WriteFile(work_ / "attempts" / "6" / "evidence.txt", "another attempt's evidence\n");
    WriteFile(work_ / "repos" / "abc" / "adapter.py", "# the submitter's adapter\n");
    // The probe every rank runs (outside the work dir, like the worker executable).
    WriteFile(root / "bin" / "probe",
              "#!/usr/bin/env python3\n"
              "import json, os, socket, time\n"
              "rank = int(os.environ['RANK']); port = int(os.environ['MASTER_PORT'])\n"
              "res = {'sandbox': os.environ.get('GATEHOUSE_SANDBOX', 'none')}\n"
              "def probe(name, f):\n"
              "    try: res[name] = f()\n"
              "    except Exception as e: res[name] = 'refused: ' + str(e)\n"
              "probe('token', lambda: open('" + token_.string() + "').read())\n"
              "probe('other_attempt', lambda: open('" +
                  (work_ / "attempts" / "6" / "evidence.txt").string() + "').read())\n"
              "probe('write_checkout', lambda: open('" +
                  (work_ / "repos" / "abc" / "x").string() + "', 'w').write('x'))\n"
              "probe('read_checkout', lambda: open('" +
                  (work_ / "repos" / "abc" / "adapter.py").string() + "').read())\n"
              "probe('write_attempt', lambda: open('out%d' % rank, 'w').write('ok'))\n"
              "probe('internet', lambda: socket.create_connection(('192.0.2.1', 80), timeout=2) "
              "and 'connected')\n"
              "def loopback():\n"
              "    if rank == 0:\n"
              "        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
              "        s.bind(('127.0.0.1', port)); s.listen(); s.settimeout(20)\n"
              "        c, _ = s.accept(); return c.recv(16).decode()\n"
              "    for _ in range(400):\n"
              "        try:\n"
              "            socket.create_connection(('127.0.0.1', port)).sendall(b'hello'); return 'sent'\n"
              "        except OSError: time.sleep(0.05)\n"
              "    return 'no rank 0'\n"
              "probe('loopback', loopback)\n"
              "print(json.dumps({'event': 'run_end', 'status': 'PASS', 'probe': res}), flush=True)\n",
              true);
    launch_.attempt_id = 7;
    launch_.attempt_dir = work_ / "attempts" / "7";
    launch_.spec = gatehouse::testing::SampleSpec();
    launch_.spec.topology.tp = 2;
    launch_.checkout = {"abc", true, work_ / "repos" / "abc"};
    launch_.worker = root / "bin" / "probe";
    launch_.agent_name = "sandbox-test";
    config_.work_dir = work_;
    config_.hidden_files = {token_};
    config_.max_processes = 4096;
  }

  // Runs the two ranks; returns each rank's probe results.
  std::vector<json> Run(const AttemptSandbox* sandbox) {
    std::filesystem::create_directories(launch_.attempt_dir);
    launch_.sandbox = sandbox;
    launch_.sandbox_paths.attempt_dir = launch_.attempt_dir;
    launch_.sandbox_paths.read_only = {launch_.checkout.path};
    FakeAttemptSink sink;
    const AttemptEndReport end = RunWorker(launch_, sink);
    EXPECT_EQ(end.outcome, "finished") << end.reason << "\n" << sink.logs["worker"]
                                       << sink.logs["worker.rank1"];
    std::vector<json> out;
    for (const auto& e : sink.events) out.push_back(json::parse(e.json).at("probe"));
    return out;
  }

  TempDir tmp_{"gatehouse-sandbox"};
  std::filesystem::path work_, token_;
  WorkerLaunch launch_;
  SandboxConfig config_;
};

TEST_F(SandboxRunTest, AnAdapterSeesItsOwnAttemptOnly) {
  // Without the sandbox the probe reads the token and the other attempt (so it can tell);
  // with it, both are refused, the checkout is read-only, the attempt dir writable, the
  // network unreachable but the ranks' loopback works, and the ranks are told their sandbox.
  const std::vector<json> open = Run(nullptr);
  ASSERT_EQ(open.size(), 2u);
  EXPECT_EQ(open[0]["token"], "agent-token-s3cret\n");
  EXPECT_EQ(open[0]["other_attempt"], "another attempt's evidence\n");
  EXPECT_EQ(open[0]["sandbox"], "none");

  auto version = ProbeSandbox(config_);
  if (!version.ok()) GTEST_SKIP() << "no sandbox here: " << version.status().message();
  config_.version = *version;
  auto sandbox = AttemptSandbox::Open(config_);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  const std::vector<json> ranks = Run(sandbox->get());
  ASSERT_EQ(ranks.size(), 2u);
  for (const json& r : ranks) {
    EXPECT_EQ(r["token"].get<std::string>().rfind("refused: ", 0), 0u) << r.dump();  // covered
    EXPECT_EQ(r["other_attempt"].get<std::string>().rfind("refused: ", 0), 0u) << r.dump();
    EXPECT_NE(r["write_checkout"].get<std::string>().find("Read-only file system"),
              std::string::npos)
        << r.dump();
    EXPECT_EQ(r["read_checkout"], "# the submitter's adapter\n") << r.dump();
    EXPECT_EQ(r["write_attempt"], 2) << r.dump();
    EXPECT_NE(r["internet"].get<std::string>().find("Network is unreachable"), std::string::npos)
        << r.dump();
    EXPECT_EQ(r["sandbox"], (*sandbox)->Describe());
  }
  EXPECT_TRUE((ranks[0]["loopback"] == "hello" && ranks[1]["loopback"] == "sent") ||
              (ranks[1]["loopback"] == "hello" && ranks[0]["loopback"] == "sent"))
      << ranks[0].dump() << ranks[1].dump();
  EXPECT_NE((*sandbox)->Describe().find("token hidden"), std::string::npos);
  EXPECT_EQ((*sandbox)->Describe().rfind("bubblewrap ", 0), 0u) << (*sandbox)->Describe();
  EXPECT_TRUE(std::filesystem::exists(launch_.attempt_dir / "out1"));
}

TEST_F(SandboxRunTest, ABuildStepWritesItsBuildDirOnlyAndKeepsTheNetworkOnlyWhenAsked) {
  // Verifies a build step's sandbox (BuildConfig::wrap): its build dir writable, the token and
  // other attempts hidden, and the network namespace the attempt's unless the step fetches
  // from the package index (then the node's, as this process's).
  SandboxPaths attempt;
  attempt.attempt_dir = launch_.attempt_dir;
  std::filesystem::create_directories(attempt.attempt_dir);
  if (auto version = ProbeSandbox(config_); !version.ok()) {
    GTEST_SKIP() << "no sandbox here: " << version.status().message();
  }
  auto sandbox = AttemptSandbox::Open(config_);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  SandboxPaths build = attempt;
  build.read_only = {launch_.checkout.path};
  build.writable = {work_ / "build" / "abc"};
  std::filesystem::create_directories(build.writable[0]);
  const auto run = [&](bool loopback_only) {
    ProcessSpec step;
    step.exe = "/bin/sh";
    step.args = {"-c", "readlink /proc/self/ns/net; echo built > " +
                           (work_ / "build" / "abc" / "out").string() + " && echo wrote; cat " +
                           token_.string() + " || echo no-token; ls " +
                           (work_ / "attempts" / "6").string() + " || echo no-other"};
    (*sandbox)->Wrap(step, build, loopback_only);
    std::string out;
    auto exit = RunProcess(step, [&](std::string_view b) { out.append(b); },
                           [&](std::string_view) {});
    EXPECT_TRUE(exit.ok()) << exit.status().ToString();
    return out;
  };
  char own[64] = {};
  ASSERT_GT(::readlink("/proc/self/ns/net", own, sizeof(own) - 1), 0);
  const std::string isolated = run(true), networked = run(false);
  for (const std::string& out : {isolated, networked}) {
    EXPECT_NE(out.find("wrote"), std::string::npos) << out;
    EXPECT_NE(out.find("no-token"), std::string::npos) << out;
    EXPECT_EQ(out.find("agent-token-s3cret"), std::string::npos) << out;
    EXPECT_NE(out.find("no-other"), std::string::npos) << out;
  }
  EXPECT_EQ(isolated.find(own), std::string::npos) << isolated;
  EXPECT_EQ(networked.rfind(own, 0), 0u) << networked;
  EXPECT_EQ(testing::ReadFile(work_ / "build" / "abc" / "out"), "built\n");
}

}  // namespace
}  // namespace gatehouse::agent
