// The Slurm engine's pure parts (docs/protocols.md §3.5): the job's shape from the cell's
// topology, srun's arguments, torchrun's variables from Slurm's (gatehouse-slurm-rank), Slurm's
// hostlist and task-count formats, and the attempt outcome a Slurm job state maps to. No process
// is started here; slurm_launcher.h runs srun.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/capabilities.h"
#include "common/cell_spec.h"
#include "common/status.h"

namespace gatehouse::agent {

/// An agent configured for a Slurm cluster (gatehouse-agent --slurm ...). The agent's work
/// directory, the worker and gatehouse-slurm-rank must be at the same paths on the nodes (a
/// shared file system), as for any Slurm job.
struct SlurmConfig {
  std::string partition;          // srun --partition; empty: the cluster's default
  int nodes = 1;                  // nodes this agent may use for one attempt
  int gpus_per_node = 0;          // a cuda cell runs this many ranks per node, one GPU each
  int cpu_ranks_per_node = 1;     // a cpu cell runs this many ranks per node
  std::string gpu_model;          // the nodes' GPU model ("NVIDIA H200"), as nvidia-smi names it
  std::vector<std::string> extra_args;  // more srun arguments (--account=..., --qos=...)
  std::filesystem::path srun = "srun", scancel = "scancel", squeue = "squeue";
  std::filesystem::path rank_exe;  // gatehouse-slurm-rank (absolute)
};

/// What an agent for a Slurm cluster offers the scheduler: `local` (the machine it runs on:
/// cores, memory, the worker's runtime) with the GPUs of config.nodes x config.gpus_per_node
/// (index 0.., model config.gpu_model), lane gpu when there are any (else cpu) and label
/// engine=slurm, so a cell larger than one node's GPUs fits it and no local agent.
AgentCapabilities SlurmCapabilities(const SlurmConfig& config, AgentCapabilities local);

/// Nodes x ranks per node of one attempt.
struct SlurmShape {
  int nodes = 1;
  int ranks_per_node = 1;
};

/// The job's shape for `spec`: world_size ranks, ranks_per_node = min(world_size, the
/// config's gpus_per_node for a cuda cell or cpu_ranks_per_node for a cpu cell), nodes =
/// ceil(world_size / ranks_per_node). Errors: FAILED_PRECONDITION when that needs more nodes
/// than config.nodes, or a cuda cell on a config with no GPUs per node, naming both counts.
Result<SlurmShape> ShapeOf(const CellSpec& spec, const SlurmConfig& config);

/// The job name of attempt `attempt_id` of agent `agent_name`: "gatehouse-<agent>-a<id>",
/// unique per controller, so squeue --name and scancel --name find exactly this attempt's job.
std::string SlurmJobName(std::string_view agent_name, int64_t attempt_id);

/// srun's arguments (no program) for one attempt: --job-name, --nodes, --ntasks,
/// --ntasks-per-node, --gpus-per-node (cuda cells), --partition, --chdir, --label (each output
/// line starts with its task number, which RunSlurmRanks splits by), --kill-on-bad-exit=1 (a
/// rank that fails stops the others, as local ranks), --export=ALL, then config.extra_args.
std::vector<std::string> SrunArgs(const SlurmConfig& config, const SlurmShape& shape,
                                  bool cuda, const std::string& job_name,
                                  const std::filesystem::path& chdir);

/// The first host of a Slurm hostlist ("gpu[07-09,12],cpu1" -> "gpu07"; "node1,node2" ->
/// "node1"; zero padding kept). Errors: INVALID_ARGUMENT naming the list when it is empty or
/// its first bracket is malformed.
Result<std::string> FirstHost(std::string_view hostlist);

/// The task count of node `node_id` from SLURM_STEP_TASKS_PER_NODE ("2(x3),1": nodes 0-2 run
/// 2, node 3 runs 1). Errors: INVALID_ARGUMENT naming the value when it is malformed or has no
/// entry for node_id.
Result<int> TasksOnNode(std::string_view tasks_per_node, int node_id);

/// torchrun's variables for one task of a Slurm step, from Slurm's own (`getenv` reads them):
/// RANK = SLURM_PROCID, WORLD_SIZE = SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), LOCAL_RANK =
/// SLURM_LOCALID, LOCAL_WORLD_SIZE = this node's count in SLURM_STEP_TASKS_PER_NODE (at
/// SLURM_NODEID), MASTER_ADDR = GATEHOUSE_MASTER_ADDR when set, else the first host of
/// SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
/// MASTER_PORT = GATEHOUSE_MASTER_PORT when set, else 10000 + SLURM_JOB_ID % 50000 (the same on
/// every node without talking to them). Errors: FAILED_PRECONDITION naming a missing variable
/// (not started by srun), INVALID_ARGUMENT naming one that does not parse.
Result<std::vector<std::pair<std::string, std::string>>> TorchrunEnvironmentFromSlurm(
    const std::function<const char*(const char*)>& getenv);

/// One job as `squeue --states=all --noheader --format=%i|%T|%r|%N` prints it.
struct SlurmJob {
  std::string id, state, reason, nodes;
};

/// Parses that output's first line. nullopt when the output is empty (no such job, or it left
/// slurmctld's memory). Errors: INVALID_ARGUMENT naming the line when it has not four fields.
Result<std::optional<SlurmJob>> ParseSqueueJob(std::string_view output);

/// The ids of this agent's jobs in `squeue --noheader --format=%i|%j` output: those named
/// SlurmJobName(agent_name, <any id>). Lines that do not parse are skipped.
std::vector<std::string> JobsOfAgent(std::string_view squeue_output, std::string_view agent_name);

/// What an attempt's end is when its Slurm job ended in `state` (a JobState name) and not every
/// rank emitted run_end: "lost" (no word on the adaptation; the controller retries it) for a
/// job Slurm or someone else took away (NODE_FAIL, BOOT_FAIL, PREEMPTED, DEADLINE, CANCELLED
/// when the agent did not cancel it, REVOKED), else "error" (a rank failed: FAILED,
/// OUT_OF_MEMORY, TIMEOUT, ...; or the agent's own cancel). The reason names the job, its
/// state, Slurm's reason and nodes ("slurm job 12 NODE_FAIL (NodeDown) on node0").
std::pair<std::string, std::string> SlurmEnd(const SlurmJob& job, bool cancelled_by_agent);

}  // namespace gatehouse::agent
