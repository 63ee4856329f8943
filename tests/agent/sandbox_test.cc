// Tests of per-attempt isolation (agent/sandbox.h, docs/protocols.md §3.6): a two-rank attempt
// whose "adapter" tries to read the agent's token and another attempt's files, write its own
// checkout, and reach the network, run by RunWorker with and without the sandbox (the run
// without it shows the probe does reach what the sandbox hides). SKIPPED with the reason where
// bwrap is missing or user namespaces are not allowed.
#include "agent/sandbox.h"

#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <thread>

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
  // Verifies the mount order: read-only root, a fresh /dev with the devices and the shared
  // /dev/shm bound in, the work dir hidden, hidden files and dirs covered, then the attempt's
  // read-only paths and its writable dir bound back over them.
  SandboxConfig config;
  config.work_dir = "/var/lib/agent";
  config.hidden_files = {"/etc/gatehouse/agent.token"};
  config.hidden_dirs = {"/srv/secrets"};
  SandboxPaths paths;
  paths.attempt_dir = "/var/lib/agent/attempts/7";
  paths.read_only = {"/var/lib/agent/repos/abc"};
  paths.writable = {"/var/lib/agent/build/abc"};
  config.devices = {"/dev/nvidia0", "/dev/nvidiactl"};
  paths.shm_dir = "/dev/shm/gatehouse-sandbox-x";
  const std::vector<std::string> expected = {
      "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/", "--dev", "/dev",
      "--dev-bind", "/dev/nvidia0", "/dev/nvidia0", "--dev-bind", "/dev/nvidiactl",
      "/dev/nvidiactl", "--bind", "/dev/shm/gatehouse-sandbox-x", "/dev/shm", "--proc", "/proc",
      "--tmpfs", "/var/lib/agent", "--tmpfs", "/srv/secrets",
      "--ro-bind", "/dev/null", "/etc/gatehouse/agent.token",
      "--ro-bind", "/var/lib/agent/repos/abc", "/var/lib/agent/repos/abc",
      "--bind", "/var/lib/agent/build/abc", "/var/lib/agent/build/abc",
      "--bind", "/var/lib/agent/attempts/7", "/var/lib/agent/attempts/7"};
  EXPECT_EQ(BwrapArgs(config, paths), expected);
}

TEST(SandboxTest, DropAbsentCoversKeepsEverythingButCoversOfMissingPaths) {
  // Verifies what gatehouse-slurm-rank drops on a node: the tmpfs and /dev/null covers of paths
  // absent there, nothing else (binds of absent paths stay and fail loudly; the program's own
  // arguments after "--" are never touched, even when they look like bwrap's).
  const std::vector<std::string> command = {
      "bwrap", "--unshare-user", "--ro-bind", "/", "/", "--tmpfs", "/work",
      "--tmpfs", "/absent-dir", "--ro-bind", "/dev/null", "/etc/agent.token",
      "--ro-bind", "/dev/null", "/absent/other.token", "--ro-bind", "/absent/x", "/absent/x",
      "--chdir", "--tmpfs", "--", "worker", "--tmpfs", "/absent-dir"};
  const auto exists = [](const std::string& p) { return p.rfind("/absent", 0) != 0; };
  const std::vector<std::string> expected = {
      "bwrap", "--unshare-user", "--ro-bind", "/", "/", "--tmpfs", "/work",
      "--ro-bind", "/dev/null", "/etc/agent.token", "--ro-bind", "/absent/x", "/absent/x",
      "--chdir", "--tmpfs", "--", "worker", "--tmpfs", "/absent-dir"};
  EXPECT_EQ(DropAbsentCovers(command, exists), expected);
  EXPECT_TRUE(DropAbsentCovers({}, exists).empty());
}

TEST(SandboxTest, AcceleratorDevicesAreTheGpusAndRdmaEntries) {
  // Verifies which /dev entries are bound for an accelerator: NVIDIA's control, UVM and
  // numbered devices, nvidia-caps, infiniband, AMD's kfd and dri; nothing else.
  TempDir dev("gatehouse-dev");
  for (const char* name : {"nvidia0", "nvidia7", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                           "nvidia-modeset", "kfd", "null", "nvidia", "nvidiafoo", "sda"}) {
    WriteFile(dev.path() / name, "");
  }
  for (const char* name : {"nvidia-caps", "infiniband", "dri", "shm"}) {
    std::filesystem::create_directories(dev.path() / name);
  }
  std::vector<std::string> names;
  for (const auto& p : AcceleratorDevices(dev.path())) names.push_back(p.filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"dri", "infiniband", "kfd", "nvidia-caps",
                                             "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools",
                                             "nvidia0", "nvidia7", "nvidiactl"}));
  EXPECT_TRUE(AcceleratorDevices(dev.path() / "absent").empty());
}

TEST(SandboxTest, StaleShmDirsOfGoneAgentsAreRemoved) {
  // Verifies the start-up clean-up: a gone agent's /dev/shm dir (its segments in it) goes;
  // this agent's, a live process's and other names stay.
  TempDir shm("gatehouse-shm");
  pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);  // a pid that no longer runs
  const auto dir = [&](const std::string& name) { return shm.path() / name; };
  WriteFile(dir("gatehouse-sandbox-p" + std::to_string(gone) + "-abc123") / "nccl-shm", "x");
  WriteFile(dir("gatehouse-sandbox-p" + std::to_string(::getpid()) + "-def456") / "seg", "x");
  WriteFile(dir("gatehouse-sandbox-p1-ghi789") / "seg", "x");  // init: alive
  WriteFile(dir("gatehouse-sandbox-pxyz-1") / "seg", "x");
  WriteFile(dir("other") / "seg", "x");
  EXPECT_EQ(RemoveStaleShmDirs(shm.path()), 1);
  EXPECT_FALSE(std::filesystem::exists(dir("gatehouse-sandbox-p" + std::to_string(gone) +
                                           "-abc123")));
  EXPECT_TRUE(std::filesystem::exists(dir("gatehouse-sandbox-p" + std::to_string(::getpid()) +
                                          "-def456")));
  EXPECT_TRUE(std::filesystem::exists(dir("gatehouse-sandbox-p1-ghi789")));
  EXPECT_TRUE(std::filesystem::exists(dir("gatehouse-sandbox-pxyz-1")));
  EXPECT_TRUE(std::filesystem::exists(dir("other")));
  EXPECT_EQ(RemoveStaleShmDirs(shm.path() / "absent"), 0);
}

TEST(SandboxTest, ASlurmTaskCommandGetsItsNodesDevicesAndTheJobsShm) {
  // Verifies what gatehouse-slurm-rank --sandboxed does to the command: this node's devices
  // and the job's /dev/shm right after `--dev /dev`, covers of absent paths dropped, the
  // program's arguments untouched.
  const std::vector<std::string> command = {
      "bwrap", "--unshare-user", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
      "--ro-bind", "/dev/null", "/absent/token", "--", "worker", "--dev", "/dev"};
  const std::vector<std::string> expected = {
      "bwrap", "--unshare-user", "--ro-bind", "/", "/", "--dev", "/dev",
      "--dev-bind", "/dev/nvidia0", "/dev/nvidia0", "--bind", "/dev/shm/gatehouse-slurm-42",
      "/dev/shm", "--proc", "/proc", "--", "worker", "--dev", "/dev"};
  EXPECT_EQ(PrepareSlurmTaskCommand(
                command, [](const std::string& p) { return p.rfind("/absent", 0) != 0; },
                {"/dev/nvidia0"}, "/dev/shm/gatehouse-slurm-42"),
            expected);
}

TEST(SandboxTest, ASlurmJobsShmIsHeldWhileItsTasksRunAndRemovedAfter) {
  // Verifies OpenSlurmJobShm: a 0700 directory per job, reused by the job's next task, held by
  // a shared lock; another job's task removes it only once nobody holds it. Lock holders are
  // child processes (flock's locks belong to open descriptions, and this process keeps its).
  TempDir shm("gatehouse-shm");
  int hold[2];
  ASSERT_EQ(::pipe(hold), 0);
  const auto open_in_child = [&](const std::string& job, int hold_fd) {
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(hold[1]);  // EOF on hold[0] once the test closes its end
      auto dir = OpenSlurmJobShm(shm.path(), job);
      if (!dir.ok()) ::_exit(1);
      char c;
      if (hold_fd >= 0) (void)::read(hold_fd, &c, 1);  // holds until the pipe closes
      ::_exit(0);
    }
    return child;
  };
  const pid_t holder = open_in_child("11", hold[0]);  // job 11's task, still running
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int status = 0;
  const pid_t ended = open_in_child("12", -1);  // job 12's task, ended
  ::waitpid(ended, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(std::filesystem::is_directory(shm.path() / "gatehouse-slurm-11"));
  EXPECT_EQ(std::filesystem::status(shm.path() / "gatehouse-slurm-11").permissions() &
                std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  EXPECT_TRUE(std::filesystem::is_directory(shm.path() / "gatehouse-slurm-12"));
  ::close(hold[1]);
  ::waitpid(holder, &status, 0);
  // Job 13's task: job 11's and 12's are no longer held, so both go.
  auto dir = OpenSlurmJobShm(shm.path(), "13");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_EQ(*dir, shm.path() / "gatehouse-slurm-13");
  EXPECT_FALSE(std::filesystem::exists(shm.path() / "gatehouse-slurm-11"));
  EXPECT_FALSE(std::filesystem::exists(shm.path() / "gatehouse-slurm-12"));
  EXPECT_FALSE(OpenSlurmJobShm(shm.path(), "../x").ok());
  std::filesystem::permissions(*dir, std::filesystem::perms::all);  // someone else's: refused
  EXPECT_FALSE(OpenSlurmJobShm(shm.path(), "13").ok());
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
    WriteFile("/dev/shm/" + HostShmName(), "another attempt's shared memory\n");
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
              "open('/dev/shm/" + HostShmName() +
                  "-rank%d' % rank, 'w').write('from rank %d' % rank)\n"
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
              // Rank 0 wrote its file before listening, so rank 1 sees it once connected.
              "probe('shm_peer', lambda: open('/dev/shm/" + HostShmName() +
                  "-rank%d' % (1 - rank)).read())\n"
              "probe('shm_host', lambda: open('/dev/shm/" + HostShmName() + "').read())\n"
              "res['ipc_ns'] = os.readlink('/proc/self/ns/ipc')\n"
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

  // A file in the node's /dev/shm no sandboxed rank may see (another attempt's segment).
  static std::string HostShmName() { return "gatehouse-test-" + std::to_string(::getpid()); }

  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove("/dev/shm/" + HostShmName(), ec);
    std::filesystem::remove("/dev/shm/" + HostShmName() + "-rank0", ec);
    std::filesystem::remove("/dev/shm/" + HostShmName() + "-rank1", ec);
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
  EXPECT_EQ(open[0]["shm_host"], "another attempt's shared memory\n");
  TearDown();  // the unsandboxed ranks' files in the node's /dev/shm

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
    EXPECT_EQ(r["shm_host"].get<std::string>().rfind("refused: ", 0), 0u) << r.dump();
  }
  // One /dev/shm and one IPC namespace for both ranks (NCCL's shared-memory transport), not
  // the node's, and gone with the sandbox.
  EXPECT_EQ(ranks[0]["ipc_ns"], ranks[1]["ipc_ns"]);
  char ipc[64] = {};
  ASSERT_GT(::readlink("/proc/self/ns/ipc", ipc, sizeof(ipc) - 1), 0);
  EXPECT_NE(ranks[0]["ipc_ns"], std::string(ipc));
  // Each rank read the other's file (events arrive in either order).
  const std::set<std::string> peers = {ranks[0]["shm_peer"].get<std::string>(),
                                       ranks[1]["shm_peer"].get<std::string>()};
  EXPECT_EQ(peers, (std::set<std::string>{"from rank 0", "from rank 1"}))
      << ranks[0].dump() << ranks[1].dump();
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + HostShmName() + "-rank0"));
  const std::filesystem::path shm = (*sandbox)->shm_dir();
  EXPECT_TRUE(std::filesystem::exists(shm / (HostShmName() + "-rank0"))) << shm;
  EXPECT_TRUE((ranks[0]["loopback"] == "hello" && ranks[1]["loopback"] == "sent") ||
              (ranks[1]["loopback"] == "hello" && ranks[0]["loopback"] == "sent"))
      << ranks[0].dump() << ranks[1].dump();
  EXPECT_NE((*sandbox)->Describe().find("token hidden"), std::string::npos);
  EXPECT_EQ((*sandbox)->Describe().rfind("bubblewrap ", 0), 0u) << (*sandbox)->Describe();
  EXPECT_TRUE(std::filesystem::exists(launch_.attempt_dir / "out1"));
  sandbox->reset();
  EXPECT_FALSE(std::filesystem::exists(shm)) << shm;
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
  // A "device" in the node's /dev that bwrap's minimal /dev lacks (a plain file: --dev-bind
  // binds any path), bound in as a GPU's would be; only where this user may write /dev.
  const std::filesystem::path fake_gpu = "/dev/gatehouse-test-gpu-" + std::to_string(::getpid());
  const bool device = ::access("/dev", W_OK) == 0;
  if (device) {
    WriteFile(fake_gpu, "");
    config_.devices = {fake_gpu};
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
                           (work_ / "attempts" / "6").string() + " || echo no-other; "
                           "test -f " + fake_gpu.string() +
                           " && echo has-device; test -e /dev/kvm || echo no-kvm"};
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
  std::error_code ec;
  std::filesystem::remove(fake_gpu, ec);
  for (const std::string& out : {isolated, networked}) {
    EXPECT_NE(out.find("wrote"), std::string::npos) << out;
    EXPECT_NE(out.find("no-token"), std::string::npos) << out;
    EXPECT_EQ(out.find("agent-token-s3cret"), std::string::npos) << out;
    EXPECT_NE(out.find("no-other"), std::string::npos) << out;
    EXPECT_EQ(out.find("has-device") != std::string::npos, device) << out;
    EXPECT_NE(out.find("no-kvm"), std::string::npos) << out;  // not bound: not there
  }
  EXPECT_EQ(isolated.find(own), std::string::npos) << isolated;
  EXPECT_EQ(networked.rfind(own, 0), 0u) << networked;
  EXPECT_EQ(testing::ReadFile(work_ / "build" / "abc" / "out"), "built\n");
}

TEST_F(SandboxRunTest, ASlurmTaskRunsInABwrapOfItsOwnWithCoversOnlyWhereItsNodeHasThePath) {
  // Verifies a Slurm task's sandbox as gatehouse-slurm-rank runs it (the real executable, with
  // the variables srun would set): the token and other attempts hidden, the checkout
  // read-only, the node's network kept (ranks span nodes), a user namespace of its own, and
  // the evidence line. The config also covers a file and a dir this "node" does not have:
  // without --sandboxed (the covers kept) bwrap cannot start, which shows what dropping them
  // is for.
  if (auto version = ProbeSandbox(config_); !version.ok()) {
    GTEST_SKIP() << "no sandbox here: " << version.status().message();
  } else {
    config_.version = *version;
  }
  config_.hidden_files.push_back(tmp_.path() / "elsewhere" / "other.token");
  config_.hidden_dirs.push_back(tmp_.path() / "elsewhere-dir");
  auto sandbox = AttemptSandbox::Open(config_);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  SandboxPaths paths;
  paths.attempt_dir = launch_.attempt_dir;
  paths.read_only = {launch_.checkout.path};
  std::filesystem::create_directories(paths.attempt_dir);
  // The job's /dev/shm on this node; a gone job's (no task holds it) is removed.
  const std::string job = std::to_string(::getpid());
  const std::filesystem::path job_shm = "/dev/shm/gatehouse-slurm-" + job;
  const std::filesystem::path gone_shm = "/dev/shm/gatehouse-slurm-" + job + "_9";
  WriteFile(gone_shm / "nccl-seg", "x");
  const auto run = [&](bool sandboxed, std::string* err) {
    ProcessSpec task;
    task.exe = "/bin/sh";
    task.args = {"-c", "echo RANK=$RANK; readlink /proc/self/ns/net; readlink /proc/self/ns/user; "
                       "cat " + token_.string() + " || echo no-token; ls " +
                       (work_ / "attempts" / "6").string() + " || echo no-other; echo x > " +
                       (work_ / "repos" / "abc" / "x").string() + " || echo read-only; "
                       "echo shm-x > /dev/shm/task-file; readlink /proc/self/ns/ipc; cat "
                       "/dev/shm/" + HostShmName() + " || echo no-host-shm; "
                       "echo \"$GATEHOUSE_SANDBOX\""};
    task.cwd = paths.attempt_dir;
    (*sandbox)->WrapSlurmTask(task, paths);
    std::vector<std::string> args;
    if (sandboxed) args.push_back("--sandboxed");
    args.push_back("--");
    args.push_back(task.exe.string());
    args.insert(args.end(), task.args.begin(), task.args.end());
    task.exe = GATEHOUSE_SLURM_RANK_BIN;
    task.args = std::move(args);
    for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
             {"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_LOCALID", "0"},
             {"SLURM_NODEID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "1"},
             {"SLURM_STEP_NODELIST", "localhost"}, {"SLURM_JOB_ID", job},
             {"SLURM_STEP_ID", "0"}}) {
      task.env.emplace_back(name, value);
    }
    std::string out;
    auto exit = RunProcess(task, [&](std::string_view b) { out.append(b); },
                           [&](std::string_view b) { err->append(b); });
    EXPECT_TRUE(exit.ok()) << exit.status().ToString();
    return out;
  };
  std::string kept_err;
  const std::string kept = run(false, &kept_err);
  EXPECT_EQ(kept.find("RANK=0"), std::string::npos) << kept;
  EXPECT_NE(kept_err.find("elsewhere"), std::string::npos) << kept_err;

  std::string err;
  const std::string out = run(true, &err);
  char net[64] = {}, user[64] = {};
  ASSERT_GT(::readlink("/proc/self/ns/net", net, sizeof(net) - 1), 0);
  ASSERT_GT(::readlink("/proc/self/ns/user", user, sizeof(user) - 1), 0);
  EXPECT_NE(out.find("RANK=0\n" + std::string(net) + "\n"), std::string::npos) << out << err;
  EXPECT_EQ(out.find(user), std::string::npos) << out;
  EXPECT_NE(out.find("no-token"), std::string::npos) << out;
  EXPECT_EQ(out.find("agent-token-s3cret"), std::string::npos) << out;
  EXPECT_NE(out.find("no-other"), std::string::npos) << out;
  EXPECT_NE(out.find("read-only"), std::string::npos) << out;
  EXPECT_NE(out.find((*sandbox)->DescribeSlurmTask() + "\n"), std::string::npos) << out;
  EXPECT_NE((*sandbox)->DescribeSlurmTask().find(
                " in each Slurm task: user and IPC namespaces and /dev/shm of the job's tasks on "
                "the node, the node's network"),
            std::string::npos);
  EXPECT_NE(err.find("gatehouse-slurm-rank: slurm job " + job + " step 0"), std::string::npos)
      << err;
  // /dev/shm is the job's directory on the node, not the node's; IPC is the task's own.
  EXPECT_NE(out.find("no-host-shm"), std::string::npos) << out;
  EXPECT_EQ(testing::ReadFile(job_shm / "task-file"), "shm-x\n");
  char ipc[64] = {};
  ASSERT_GT(::readlink("/proc/self/ns/ipc", ipc, sizeof(ipc) - 1), 0);
  EXPECT_NE(out.find("ipc:["), std::string::npos) << out;
  EXPECT_EQ(out.find(ipc), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(gone_shm));
  std::error_code ec;
  std::filesystem::remove_all(job_shm, ec);
}

}  // namespace
}  // namespace gatehouse::agent
