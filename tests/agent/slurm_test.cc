// Tests of the Slurm engine's pure parts (agent/slurm.h) and of RunSlurmRanks' relay, ends and
// cancel (agent/slurm_launcher.h) with fake srun, squeue and scancel scripts. The real Slurm
// runs in tests/e2e/slurm_test.cc.
#include "agent/slurm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "agent/slurm_launcher.h"
#include "agent_test_util.h"
#include "fake_attempt_sink.h"
#include "tests/common/sample_spec.h"

namespace gatehouse::agent {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

TEST(SlurmTest, ShapeFollowsTheTopologyAndTheNodes) {
  // Verifies nodes x ranks per node: a cuda cell takes one GPU per rank, a cpu cell
  // cpu_ranks_per_node ranks per node, and a cell larger than the agent's nodes is refused
  // naming both counts.
  CellSpec spec = gatehouse::testing::SampleSpec();
  SlurmConfig config;
  config.nodes = 2;
  config.gpus_per_node = 4;
  config.cpu_ranks_per_node = 2;
  spec.topology.tp = 8;
  spec.runtime.device = "cuda";
  auto shape = ShapeOf(spec, config);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->nodes, 2);
  EXPECT_EQ(shape->ranks_per_node, 4);
  spec.topology.tp = 2;
  shape = ShapeOf(spec, config);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->nodes, 1);
  EXPECT_EQ(shape->ranks_per_node, 2);
  spec.runtime.device = "cpu";
  spec.topology.tp = 4;
  shape = ShapeOf(spec, config);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->nodes, 2);
  EXPECT_EQ(shape->ranks_per_node, 2);
  spec.topology.tp = 8;
  shape = ShapeOf(spec, config);
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(shape.status().message().find("needs 4 nodes of 2 ranks (world size 8) but this "
                                          "Slurm agent may use 2"),
            std::string::npos)
      << shape.status().message();
  config.gpus_per_node = 0;
  spec.runtime.device = "cuda";
  spec.topology.tp = 1;
  EXPECT_NE(ShapeOf(spec, config).status().message().find("--slurm-gpus-per-node"),
            std::string::npos);
}

TEST(SlurmTest, SrunArgumentsAskForTheShapeAndLabelTheLines) {
  // Verifies the step srun is asked for: name, nodes, tasks, GPUs for a cuda cell only,
  // partition, the attempt dir, --label (the relay splits by it), --kill-on-bad-exit, extras.
  SlurmConfig config;
  config.partition = "gpu";
  config.extra_args = {"--account=ml"};
  const auto args = SrunArgs(config, SlurmShape{2, 4}, /*cuda=*/true, "gatehouse-n-a7", "/w/7");
  const std::vector<std::string> expected = {
      "--job-name=gatehouse-n-a7", "--nodes=2",        "--ntasks=8",        "--ntasks-per-node=4",
      "--gpus-per-node=4",         "--partition=gpu",  "--chdir=/w/7",      "--label",
      "--kill-on-bad-exit=1",      "--export=ALL",     "--account=ml"};
  EXPECT_EQ(args, expected);
  const auto cpu = SrunArgs(SlurmConfig{}, SlurmShape{1, 2}, /*cuda=*/false, "j", "/w");
  for (const std::string& a : cpu) {
    EXPECT_EQ(a.find("--gpus"), std::string::npos) << a;
    EXPECT_EQ(a.find("--partition"), std::string::npos) << a;
  }
  EXPECT_EQ(SlurmJobName("node-1", 42), "gatehouse-node-1-a42");
}

TEST(SlurmTest, FirstHostOfAHostlist) {
  // Verifies Slurm's hostlist forms: plain, comma lists, ranges with zero padding, a bracket
  // after a plain host; and the malformed ones named in the error.
  EXPECT_EQ(*FirstHost("localhost"), "localhost");
  EXPECT_EQ(*FirstHost("node1,node2"), "node1");
  EXPECT_EQ(*FirstHost("gpu[07-09,12],cpu1"), "gpu07");
  EXPECT_EQ(*FirstHost("gpu[3]"), "gpu3");
  EXPECT_EQ(*FirstHost("a1,gpu[1-2]"), "a1");
  EXPECT_EQ(*FirstHost("rack[01-02]-n,x"), "rack01-n");
  EXPECT_FALSE(FirstHost("").ok());
  EXPECT_FALSE(FirstHost("gpu[1-2").ok());
  auto bad = FirstHost("gpu[x-2]");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'gpu[x-2]'"), std::string::npos);
}

TEST(SlurmTest, TasksOnNodeReadsTheRepeatForm) {
  // Verifies SLURM_STEP_TASKS_PER_NODE's "N(xM)" runs and plain entries, per node id.
  EXPECT_EQ(*TasksOnNode("2", 0), 2);
  EXPECT_EQ(*TasksOnNode("2(x3),1", 0), 2);
  EXPECT_EQ(*TasksOnNode("2(x3),1", 2), 2);
  EXPECT_EQ(*TasksOnNode("2(x3),1", 3), 1);
  EXPECT_FALSE(TasksOnNode("2(x3),1", 4).ok());
  EXPECT_FALSE(TasksOnNode("2(x", 0).ok());
  EXPECT_FALSE(TasksOnNode("a", 0).ok());
  EXPECT_FALSE(TasksOnNode("0", 0).ok());
}

TEST(SlurmTest, TorchrunVariablesFromSlurms) {
  // Verifies the task's torchrun variables: rank, world size, local rank and local world size
  // from the step, the master from the first node, the port from the job id (or the override);
  // a missing variable names itself; an inconsistent task is refused.
  std::map<std::string, std::string> env = {
      {"SLURM_PROCID", "5"},          {"SLURM_STEP_NUM_TASKS", "8"},
      {"SLURM_NTASKS", "99"},         {"SLURM_LOCALID", "1"},
      {"SLURM_NODEID", "1"},          {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
      {"SLURM_STEP_NODELIST", "gpu[07-08]"}, {"SLURM_JOB_ID", "123456"}};
  const auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto vars = TorchrunEnvironmentFromSlurm(getenv);
  ASSERT_TRUE(vars.ok()) << vars.status().ToString();
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"RANK", "5"},          {"WORLD_SIZE", "8"},        {"LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "gpu07"}, {"MASTER_PORT", "33456"}};
  EXPECT_EQ(*vars, expected);
  env["GATEHOUSE_MASTER_PORT"] = "29500";
  EXPECT_EQ(TorchrunEnvironmentFromSlurm(getenv)->back().second, "29500");
  // Node names that do not resolve on the nodes: the operator gives the first node's address.
  env["GATEHOUSE_MASTER_ADDR"] = "10.0.0.7";
  EXPECT_EQ(TorchrunEnvironmentFromSlurm(getenv)->at(4),
            (std::pair<std::string, std::string>{"MASTER_ADDR", "10.0.0.7"}));
  env.erase("GATEHOUSE_MASTER_ADDR");
  env.erase("SLURM_STEP_NUM_TASKS");  // an older srun: SLURM_NTASKS
  env["SLURM_PROCID"] = "120";
  auto inconsistent = TorchrunEnvironmentFromSlurm(getenv);
  ASSERT_FALSE(inconsistent.ok());
  EXPECT_NE(inconsistent.status().message().find("SLURM_PROCID 120 of 99 tasks"),
            std::string::npos)
      << inconsistent.status().message();
  env.erase("SLURM_LOCALID");
  auto missing = TorchrunEnvironmentFromSlurm(getenv);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("SLURM_LOCALID is not set"), std::string::npos);
}

TEST(SlurmTest, JobStatesMapToAttemptEnds) {
  // Verifies a job taken away (node failure, preemption, a cancel from outside) is "lost" and
  // one that ended by what it ran (or by this agent's cancel) is "error", with the job named.
  auto job = ParseSqueueJob("17|NODE_FAIL|NodeDown|gpu[01-02]\n");
  ASSERT_TRUE(job.ok() && job->has_value());
  auto [outcome, reason] = SlurmEnd(**job, false);
  EXPECT_EQ(outcome, "lost");
  EXPECT_EQ(reason, "slurm job 17 NODE_FAIL (NodeDown) on gpu[01-02]");
  EXPECT_EQ(SlurmEnd(SlurmJob{"1", "PREEMPTED", "", "n"}, false).first, "lost");
  EXPECT_EQ(SlurmEnd(SlurmJob{"1", "CANCELLED", "None", "n"}, false),
            std::make_pair(std::string("lost"), std::string("slurm job 1 CANCELLED on n, not by "
                                                            "this agent")));
  EXPECT_EQ(SlurmEnd(SlurmJob{"1", "CANCELLED", "None", "n"}, true).first, "error");
  EXPECT_EQ(SlurmEnd(SlurmJob{"1", "FAILED", "NonZeroExitCode", "n"}, false).first, "error");
  EXPECT_EQ(SlurmEnd(SlurmJob{"1", "OUT_OF_MEMORY", "", "n"}, false).first, "error");
  EXPECT_FALSE(ParseSqueueJob("")->has_value());
  EXPECT_FALSE(ParseSqueueJob("17|RUNNING").ok());
}

TEST(SlurmTest, JobsOfAgentAreFoundByName) {
  // Verifies only this agent's attempt jobs are picked: not another agent whose name shares a
  // prefix, not a job of another name.
  const std::string out =
      "11|gatehouse-n1-a7\n12|gatehouse-n1-a8\n13|gatehouse-n10-a7\n14|train\n"
      "15|gatehouse-n1-ax\nbroken\n";
  EXPECT_EQ(JobsOfAgent(out, "n1"), (std::vector<std::string>{"11", "12"}));
  EXPECT_TRUE(JobsOfAgent("", "n1").empty());
}

TEST(SlurmTest, CapabilitiesOfferTheClustersGpus) {
  // Verifies a Slurm agent offers nodes x GPUs per node of the configured model, lane gpu and
  // engine=slurm, keeping the machine's runtime.
  AgentCapabilities local;
  local.torch_version = "2.11.0";
  local.labels["lane"] = "cpu";
  SlurmConfig config;
  config.nodes = 2;
  config.gpus_per_node = 8;
  config.gpu_model = "NVIDIA H200";
  const AgentCapabilities caps = SlurmCapabilities(config, local);
  ASSERT_EQ(caps.gpus.size(), 16u);
  EXPECT_EQ(caps.gpus[15].index, 15);
  EXPECT_EQ(caps.gpus[15].model, "NVIDIA H200");
  EXPECT_EQ(caps.labels.at("lane"), "gpu");
  EXPECT_EQ(caps.labels.at("engine"), "slurm");
  EXPECT_EQ(caps.torch_version, "2.11.0");
  EXPECT_EQ(SlurmCapabilities(SlurmConfig{}, local).labels.at("lane"), "cpu");
}

// RunSlurmRanks against fake Slurm clients: `srun` runs two labelled tasks of the command after
// its options (as srun --label does), `squeue` prints the file squeue.out, `scancel` records
// its arguments and tells the fake tasks to stop.
class SlurmLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto dir = tmp_.path();
    WriteFile(dir / "srun",
              "#!/bin/bash\n"
              "echo \"$@\" > " + (dir / "srun.args").string() + "\n"
              "while [ $# -gt 0 ]; do case \"$1\" in --*) shift;; *) break;; esac; done\n"
              "for t in 0 1; do\n"
              "  ( SLURM_PROCID=$t \"$@\" 2> >(sed -u \"s/^/$t: /\" >&2) | sed -u \"s/^/$t: /\" ) &\n"
              "done\n"
              "wait\n"
              "echo 'srun: done' >&2\n",
              true);
    WriteFile(dir / "squeue", "#!/bin/sh\ncat " + (dir / "squeue.out").string() + "\n", true);
    WriteFile(dir / "scancel",
              "#!/bin/sh\necho \"$@\" >> " + (dir / "scancel.args").string() + "\ntouch " +
                  (dir / "stop").string() + "\n",
              true);
    // What gatehouse-slurm-rank does, without Slurm: drop its options and "--", run the worker.
    WriteFile(dir / "rank",
              "#!/bin/sh\nwhile [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n", true);
    config_.srun = dir / "srun";
    config_.squeue = dir / "squeue";
    config_.scancel = dir / "scancel";
    config_.rank_exe = dir / "rank";
    run_.attempt_id = 9;
    run_.job_name = "gatehouse-a-a9";
    run_.shape = SlurmShape{1, 2};
    run_.worker.cwd = dir;
  }

  void Worker(const std::string& body) {
    WriteFile(tmp_.path() / "worker", "#!/bin/sh\n" + body, true);
    run_.worker.exe = tmp_.path() / "worker";
  }

  TempDir tmp_{"gatehouse-slurm"};
  SlurmConfig config_;
  SlurmRun run_;
  FakeAttemptSink sink_;
};

TEST_F(SlurmLauncherTest, EveryRanksRunEndFinishesAndEachRankHasItsStreams) {
  // Verifies the relay: events of both ranks in one sequence, each rank's text and stderr on
  // its own stream, srun's own lines and the command on "slurm", and "finished".
  WriteFile(tmp_.path() / "squeue.out", "42|COMPLETED|None|localhost\n");
  Worker("echo \"hello from $SLURM_PROCID\"\necho \"err $SLURM_PROCID\" >&2\n"
         "echo '{\"event\":\"run_end\",\"status\":\"PASS\"}'\n");
  const AttemptEndReport end = RunSlurmRanks(config_, run_, sink_);
  EXPECT_EQ(end.outcome, "finished") << end.reason;
  EXPECT_EQ(end.seq, 3);
  ASSERT_EQ(sink_.events.size(), 2u);
  EXPECT_EQ(sink_.events[0].seq, 1);
  EXPECT_EQ(sink_.events[1].seq, 2);
  EXPECT_EQ(sink_.logs["worker-stdout"], "hello from 0\n");
  EXPECT_EQ(sink_.logs["worker-stdout.rank1"], "hello from 1\n");
  EXPECT_EQ(sink_.logs["worker"], "err 0\n");
  EXPECT_EQ(sink_.logs["worker.rank1"], "err 1\n");
  EXPECT_NE(sink_.logs["slurm"].find("--job-name=gatehouse-a-a9"), std::string::npos);
  EXPECT_NE(sink_.logs["slurm"].find("srun: done\n"), std::string::npos);
  EXPECT_NE(sink_.logs["slurm"].find("slurm job 42 ended COMPLETED"), std::string::npos);
  EXPECT_NE(ReadFile(tmp_.path() / "srun.args").find("--ntasks=2"), std::string::npos);
}

TEST_F(SlurmLauncherTest, ASandboxedRunTellsEachTaskSo) {
  // Verifies a sandboxed run's command: gatehouse-slurm-rank --sandboxed -- <the bwrap command>
  // (here a stand-in that runs its program), so each task drops the covers its node lacks.
  WriteFile(tmp_.path() / "squeue.out", "42|COMPLETED|None|localhost\n");
  Worker("echo '{\"event\":\"run_end\",\"status\":\"PASS\"}'\n");
  run_.sandboxed = true;
  const AttemptEndReport end = RunSlurmRanks(config_, run_, sink_);
  EXPECT_EQ(end.outcome, "finished") << end.reason;
  EXPECT_NE(ReadFile(tmp_.path() / "srun.args")
                .find((tmp_.path() / "rank").string() + " --sandboxed -- " +
                      (tmp_.path() / "worker").string()),
            std::string::npos)
      << ReadFile(tmp_.path() / "srun.args");
}

TEST_F(SlurmLauncherTest, ARankWithoutRunEndEndsAsTheJobDid) {
  // Verifies the end when rank 1 fails: the job's FAILED is an error naming the job, the rank
  // and srun's last line; the same run under a NODE_FAIL job is lost.
  Worker("if [ \"$SLURM_PROCID\" = 1 ]; then exit 3; fi\n"
         "echo '{\"event\":\"run_end\",\"status\":\"PASS\"}'\n");
  WriteFile(tmp_.path() / "squeue.out", "42|FAILED|NonZeroExitCode|localhost\n");
  AttemptEndReport end = RunSlurmRanks(config_, run_, sink_);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason,
            "slurm job 42 FAILED (NonZeroExitCode) on localhost; rank 1 of 2 ended before "
            "run_end; srun exited with code 0 (srun: done)");
  // A rank that dies of its own error in a phase: where and why, from its events and stderr.
  Worker("if [ \"$SLURM_PROCID\" = 1 ]; then\n"
         "  echo '{\"event\":\"phase_start\",\"phase\":\"tensor_parallel\"}'\n"
         "  echo 'Traceback (most recent call last):' >&2\n"
         "  echo 'RuntimeError: gloo: op.preamble.length <= op.nbytes. 512 vs 384' >&2\n"
         "  exit 1\n"
         "fi\n"
         "echo '{\"event\":\"run_end\",\"status\":\"PASS\"}'\n");
  FakeAttemptSink crashed;
  end = RunSlurmRanks(config_, run_, crashed);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_EQ(end.reason,
            "slurm job 42 FAILED (NonZeroExitCode) on localhost; rank 1 of 2 ended before "
            "run_end; srun exited with code 0 (srun: done); rank 1 was in phase "
            "tensor_parallel; rank 1's last stderr lines: Traceback (most recent call last): | "
            "RuntimeError: gloo: op.preamble.length <= op.nbytes. 512 vs 384");
  WriteFile(tmp_.path() / "squeue.out", "43|NODE_FAIL|NodeDown|localhost\n");
  FakeAttemptSink again;
  end = RunSlurmRanks(config_, run_, again);
  EXPECT_EQ(end.outcome, "lost");
  EXPECT_NE(end.reason.find("slurm job 43 NODE_FAIL (NodeDown)"), std::string::npos) << end.reason;
  // No job at all (srun could not allocate): an error naming the job name.
  WriteFile(tmp_.path() / "squeue.out", "");
  FakeAttemptSink none;
  end = RunSlurmRanks(config_, run_, none);
  EXPECT_EQ(end.outcome, "error");
  EXPECT_NE(end.reason.find("no slurm job gatehouse-a-a9"), std::string::npos) << end.reason;
}

TEST_F(SlurmLauncherTest, CancelScancelsTheJob) {
  // Verifies a cancel runs scancel --name=<job> (the fake tasks stop when it has run), and the
  // end says the agent cancelled it.
  WriteFile(tmp_.path() / "squeue.out", "44|CANCELLED|None|localhost\n");
  Worker("while [ ! -f " + (tmp_.path() / "stop").string() + " ]; do sleep 0.05; done\nexit 143\n");
  std::atomic<bool> flag{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    flag = true;
  });
  const AttemptEndReport end =
      RunSlurmRanks(config_, run_, sink_, CancelToken{&flag, std::chrono::milliseconds(10000)});
  canceller.join();
  EXPECT_EQ(end.outcome, "error");
  EXPECT_NE(end.reason.find("slurm job 44 CANCELLED"), std::string::npos) << end.reason;
  EXPECT_NE(end.reason.find("(cancelled)"), std::string::npos) << end.reason;
  EXPECT_EQ(ReadFile(tmp_.path() / "scancel.args"), "--name=gatehouse-a-a9\n");
}

}  // namespace
}  // namespace gatehouse::agent
