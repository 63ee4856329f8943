// The Slurm engine's pure parts (docs/protocols.md §3.5).
#include "agent/slurm.h"

#include <algorithm>
#include <charconv>
#include <cstdint>

#include "agent/attempt_sink.h"

namespace gatehouse::agent {
namespace {

// A non-negative decimal integer filling `text`; nullopt otherwise.
std::optional<int64_t> ParseCount(std::string_view text) {
  int64_t value = 0;
  if (text.empty()) return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

}  // namespace

AgentCapabilities SlurmCapabilities(const SlurmConfig& config, AgentCapabilities local) {
  local.gpus.clear();
  for (int i = 0; i < config.nodes * config.gpus_per_node; ++i) {
    GpuInfo gpu;
    gpu.index = i;
    gpu.model = config.gpu_model;
    local.gpus.push_back(gpu);
  }
  local.labels["lane"] = local.gpus.empty() ? "cpu" : "gpu";
  local.labels["engine"] = "slurm";
  return local;
}

Result<SlurmShape> ShapeOf(const CellSpec& spec, const SlurmConfig& config) {
  const int world_size = spec.topology.world_size();
  const bool cuda = spec.runtime.device == "cuda";
  const int per_node = cuda ? config.gpus_per_node : config.cpu_ranks_per_node;
  if (per_node <= 0) {
    return Status::FailedPrecondition(
        std::string("the cell runs on ") + (cuda ? "cuda" : "cpu") + " but this Slurm agent runs " +
        std::to_string(per_node) + " such ranks per node (" +
        (cuda ? "--slurm-gpus-per-node" : "--slurm-cpu-ranks-per-node") + ")");
  }
  SlurmShape shape;
  shape.ranks_per_node = std::min(world_size, per_node);
  shape.nodes = (world_size + shape.ranks_per_node - 1) / shape.ranks_per_node;
  if (shape.nodes > config.nodes) {
    return Status::FailedPrecondition(
        "the cell needs " + std::to_string(shape.nodes) + " nodes of " +
        std::to_string(shape.ranks_per_node) + " ranks (world size " + std::to_string(world_size) +
        ") but this Slurm agent may use " + std::to_string(config.nodes) + " (--slurm-nodes)");
  }
  return shape;
}

std::string SlurmJobName(std::string_view agent_name, int64_t attempt_id) {
  return "gatehouse-" + std::string(agent_name) + "-a" + std::to_string(attempt_id);
}

std::vector<std::string> SrunArgs(const SlurmConfig& config, const SlurmShape& shape, bool cuda,
                                  const std::string& job_name,
                                  const std::filesystem::path& chdir) {
  std::vector<std::string> args = {
      "--job-name=" + job_name,
      "--nodes=" + std::to_string(shape.nodes),
      "--ntasks=" + std::to_string(shape.nodes * shape.ranks_per_node),
      "--ntasks-per-node=" + std::to_string(shape.ranks_per_node),
  };
  if (cuda) args.push_back("--gpus-per-node=" + std::to_string(shape.ranks_per_node));
  if (!config.partition.empty()) args.push_back("--partition=" + config.partition);
  args.push_back("--chdir=" + chdir.string());
  args.push_back("--label");
  args.push_back("--kill-on-bad-exit=1");
  args.push_back("--export=ALL");
  args.insert(args.end(), config.extra_args.begin(), config.extra_args.end());
  return args;
}

Result<std::string> FirstHost(std::string_view hostlist) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("hostlist '" + std::string(hostlist) + "': " + why);
  };
  const size_t comma = hostlist.find(',');
  const size_t bracket = hostlist.find('[');
  if (bracket == std::string_view::npos || (comma != std::string_view::npos && comma < bracket)) {
    std::string_view first = hostlist.substr(0, comma);
    if (first.empty()) return bad("no host");
    return std::string(first);
  }
  const size_t close = hostlist.find(']', bracket);
  if (close == std::string_view::npos) return bad("'[' without ']'");
  std::string_view inside = hostlist.substr(bracket + 1, close - bracket - 1);
  inside = inside.substr(0, inside.find(','));
  inside = inside.substr(0, inside.find('-'));
  if (!ParseCount(inside)) return bad("the first range does not start with a number");
  // "gpu[07-09]x" names gpu07x first: what follows the bracket up to the next comma stays.
  std::string_view suffix = hostlist.substr(close + 1);
  suffix = suffix.substr(0, suffix.find(','));
  return std::string(hostlist.substr(0, bracket)) + std::string(inside) + std::string(suffix);
}

Result<int> TasksOnNode(std::string_view tasks_per_node, int node_id) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("SLURM_STEP_TASKS_PER_NODE '" + std::string(tasks_per_node) +
                                   "': " + why);
  };
  int64_t node = 0;
  std::string_view rest = tasks_per_node;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    int64_t repeat = 1;
    if (const size_t open = item.find("(x"); open != std::string_view::npos) {
      if (item.back() != ')') return bad("'" + std::string(item) + "' is not N(xM)");
      const auto times = ParseCount(item.substr(open + 2, item.size() - open - 3));
      if (!times || *times == 0) return bad("'" + std::string(item) + "' is not N(xM)");
      repeat = *times;
      item = item.substr(0, open);
    }
    const auto count = ParseCount(item);
    if (!count || *count == 0) return bad("'" + std::string(item) + "' is not a task count");
    if (node_id < node + repeat) return static_cast<int>(*count);
    node += repeat;
  }
  return bad("no entry for node " + std::to_string(node_id));
}

Result<std::vector<std::pair<std::string, std::string>>> TorchrunEnvironmentFromSlurm(
    const std::function<const char*(const char*)>& getenv) {
  const auto read = [&](const char* name) -> Result<std::string> {
    const char* value = getenv(name);
    if (value == nullptr || *value == '\0') {
      return Status::FailedPrecondition(std::string(name) +
                                        " is not set: gatehouse-slurm-rank runs as a task of srun");
    }
    return std::string(value);
  };
  const auto read_count = [&](const char* name) -> Result<int64_t> {
    GH_ASSIGN_OR_RETURN(std::string text, read(name));
    const auto value = ParseCount(text);
    if (!value) return Status::InvalidArgument(std::string(name) + " '" + text + "' is not a count");
    return *value;
  };
  const auto first_set = [&](const char* a, const char* b) {
    const char* value = getenv(a);
    return value != nullptr && *value != '\0' ? a : b;
  };
  GH_ASSIGN_OR_RETURN(int64_t rank, read_count("SLURM_PROCID"));
  GH_ASSIGN_OR_RETURN(int64_t world_size,
                      read_count(first_set("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")));
  GH_ASSIGN_OR_RETURN(int64_t local_rank, read_count("SLURM_LOCALID"));
  GH_ASSIGN_OR_RETURN(int64_t node_id, read_count("SLURM_NODEID"));
  GH_ASSIGN_OR_RETURN(std::string tasks_per_node, read("SLURM_STEP_TASKS_PER_NODE"));
  GH_ASSIGN_OR_RETURN(int local_world_size, TasksOnNode(tasks_per_node, static_cast<int>(node_id)));
  GH_ASSIGN_OR_RETURN(std::string nodelist,
                      read(first_set("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")));
  std::string master;
  if (const char* fixed = getenv("GATEHOUSE_MASTER_ADDR"); fixed != nullptr && *fixed != '\0') {
    master = fixed;  // node names that do not resolve on the nodes: the operator's address
  } else {
    GH_ASSIGN_OR_RETURN(master, FirstHost(nodelist));
  }
  int64_t port = 0;
  if (const char* fixed = getenv("GATEHOUSE_MASTER_PORT"); fixed != nullptr && *fixed != '\0') {
    GH_ASSIGN_OR_RETURN(port, read_count("GATEHOUSE_MASTER_PORT"));
  } else {
    GH_ASSIGN_OR_RETURN(int64_t job_id, read_count("SLURM_JOB_ID"));
    port = 10000 + job_id % 50000;
  }
  if (rank >= world_size || local_rank >= local_world_size || port == 0 || port > 65535) {
    return Status::InvalidArgument(
        "inconsistent Slurm task: SLURM_PROCID " + std::to_string(rank) + " of " +
        std::to_string(world_size) + " tasks, SLURM_LOCALID " + std::to_string(local_rank) +
        " of " + std::to_string(local_world_size) + " on this node, port " + std::to_string(port));
  }
  return std::vector<std::pair<std::string, std::string>>{
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
      {"MASTER_ADDR", master},
      {"MASTER_PORT", std::to_string(port)},
  };
}

Result<std::optional<SlurmJob>> ParseSqueueJob(std::string_view output) {
  std::string_view line = output.substr(0, output.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  if (line.empty()) return std::optional<SlurmJob>();
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t bar = line.find('|', start);
    fields.emplace_back(line.substr(start, bar - start));
    if (bar == std::string_view::npos) break;
    start = bar + 1;
  }
  if (fields.size() != 4 || fields[0].empty() || fields[1].empty()) {
    return Status::InvalidArgument("squeue line '" + std::string(line) +
                                   "' is not 'id|state|reason|nodes'");
  }
  return std::optional<SlurmJob>(SlurmJob{fields[0], fields[1], fields[2], fields[3]});
}

std::vector<std::string> JobsOfAgent(std::string_view squeue_output,
                                     std::string_view agent_name) {
  const std::string prefix = "gatehouse-" + std::string(agent_name) + "-a";
  std::vector<std::string> ids;
  while (!squeue_output.empty()) {
    const size_t nl = squeue_output.find('\n');
    std::string_view line = squeue_output.substr(0, nl);
    squeue_output = nl == std::string_view::npos ? std::string_view() : squeue_output.substr(nl + 1);
    const size_t bar = line.find('|');
    if (bar == std::string_view::npos) continue;
    std::string_view name = line.substr(bar + 1);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\r')) name.remove_suffix(1);
    if (name.rfind(prefix, 0) != 0 || !ParseCount(name.substr(prefix.size()))) continue;
    ids.emplace_back(line.substr(0, bar));
  }
  return ids;
}

std::pair<std::string, std::string> SlurmEnd(const SlurmJob& job, bool cancelled_by_agent) {
  std::string reason = "slurm job " + job.id + " " + job.state;
  if (!job.reason.empty() && job.reason != "None") reason += " (" + job.reason + ")";
  if (!job.nodes.empty()) reason += " on " + job.nodes;
  // Slurm's job states (squeue(1), "JOB STATE CODES") in which the job was taken away rather
  // than ended by what it ran.
  static constexpr std::string_view kTakenAway[] = {"NODE_FAIL", "BOOT_FAIL", "PREEMPTED",
                                                   "DEADLINE", "REVOKED"};
  const bool taken =
      std::find(std::begin(kTakenAway), std::end(kTakenAway), job.state) != std::end(kTakenAway);
  if (taken || (job.state == "CANCELLED" && !cancelled_by_agent)) {
    if (job.state == "CANCELLED") reason += ", not by this agent";
    return {std::string(kOutcomeLost), reason};
  }
  return {std::string(kOutcomeError), reason};
}

}  // namespace gatehouse::agent
