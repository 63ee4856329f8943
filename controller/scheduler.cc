#include "controller/scheduler.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <optional>
#include <queue>
#include <tuple>

namespace gatehouse::controller {
namespace {

/// GPUs of `agent` that a demand for `model` may use (all of them when no model is pinned).
int MatchingGpus(const AgentView& agent, const std::string& model) {
  if (model.empty()) return agent.gpus;
  int n = 0;
  for (const std::string& m : agent.gpu_models) n += GpuModelMatches(m, model) ? 1 : 0;
  return n;
}

/// Why `agent` (with `free_slots`, `free_gpus` and `memory_in_use` this round) cannot take
/// `d`; empty when it can.
std::string Misfit(const AgentView& agent, int free_slots, int free_gpus, int64_t memory_in_use,
                   const Demand& d, int64_t held_for = 0) {
  if (!d.invalid.empty()) return "the cell's spec is invalid (" + d.invalid + ")";
  if (!agent.drain_reason.empty()) return "draining (" + agent.drain_reason + ")";
  if (held_for != 0) {
    return "held for attempt " + std::to_string(held_for) +
           ", which waits for the memory its running attempts hold";
  }
  if (free_slots <= 0) return "no free slot";
  if (!d.torch.empty() && !agent.torch_version.empty() && agent.torch_version != d.torch) {
    return "torch " + agent.torch_version + " (the cell pins " + d.torch + ")";
  }
  if (!d.transformers.empty() && agent.transformers_version != d.transformers) {
    return (agent.transformers_version.empty()
                ? std::string("runs no reference cells (no transformers reported)")
                : "transformers " + agent.transformers_version) +
           " (the reference cell pins " + d.transformers + ")";
  }
  if (!d.cuda.empty() && agent.cuda_version != d.cuda) {
    return (agent.cuda_version.empty() ? std::string("no CUDA reported")
                                       : "CUDA " + agent.cuda_version) +
           " (the cell pins " + d.cuda + ")";
  }
  if (d.gpu && !d.gpu_model.empty()) {
    const int matching = MatchingGpus(agent, d.gpu_model);
    if (matching < d.world_size) {
      return std::to_string(matching) + " " + d.gpu_model + " GPU" + (matching == 1 ? "" : "s") +
             " (the cell pins " + d.gpu_model + ", needs " + std::to_string(d.world_size) + ")";
    }
  }
  if (std::string never = MemoryMisfit(d.memory, agent.memory_bytes,
                                       d.gpu ? agent.gpu_memory_bytes : 0);
      !never.empty()) {
    return never;
  }
  if (d.gpu && free_gpus < d.world_size) {
    return std::to_string(free_gpus) + " of " + std::to_string(agent.gpus) +
           " GPUs free, needs " + std::to_string(d.world_size);
  }
  if (agent.memory_bytes > 0 && !d.memory.empty()) {
    const int64_t free_memory = agent.memory_bytes - kNodeMemoryReserve - memory_in_use;
    if (d.memory.host_bytes() > free_memory) {
      return FormatGigabytes(std::max<int64_t>(free_memory, 0)) + " of " +
             FormatGigabytes(agent.memory_bytes) +
             " memory free (its running attempts hold " + FormatGigabytes(memory_in_use) +
             "), needs ~" + FormatGigabytes(d.memory.host_bytes()) + " (" +
             d.memory.Describe() + ")";
    }
  }
  return "";
}

bool Fits(const AgentView& agent, int free_slots, int free_gpus, int64_t memory_in_use,
          const Demand& d, int64_t held_for) {
  if (free_slots <= 0 || !agent.drain_reason.empty()) return false;  // the common case, cheap
  return Misfit(agent, free_slots, free_gpus, memory_in_use, d, held_for).empty();
}

/// Why no agent can take `d`: one clause per distinct reason, naming up to 3 agents each
/// ("a, b, c and 997 more: no free slot; gpu-1: 1 of 4 GPUs free, needs 2").
std::string WhyNot(const std::vector<AgentView>& agents, const std::vector<int>& free,
                   const std::vector<int>& free_gpus, const std::vector<int64_t>& memory_in_use,
                   const std::vector<int64_t>& held_for, const Demand& d) {
  std::vector<std::pair<std::string, std::vector<const std::string*>>> groups;  // in first-seen order
  for (size_t i = 0; i < agents.size(); ++i) {
    const std::string misfit =
        Misfit(agents[i], free[i], free_gpus[i], memory_in_use[i], d, held_for[i]);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == misfit; });
    if (it == groups.end()) it = groups.insert(groups.end(), {misfit, {}});
    it->second.push_back(&agents[i].agent_id);
  }
  std::string why;
  for (const auto& [misfit, names] : groups) {
    std::string who;
    for (size_t k = 0; k < names.size() && k < 3; ++k) who += (k == 0 ? "" : ", ") + *names[k];
    if (names.size() > 3) who += " and " + std::to_string(names.size() - 3) + " more";
    why += (why.empty() ? "" : "; ") + who + ": " + misfit;
  }
  return why;
}

}  // namespace

std::string MemoryMisfit(const MemoryEstimate& estimate, int64_t memory_bytes,
                         int64_t gpu_memory_bytes) {
  if (estimate.empty()) return "";
  if (memory_bytes > 0 && estimate.host_bytes() > memory_bytes - kNodeMemoryReserve) {
    return "needs ~" + FormatGigabytes(estimate.host_bytes()) + " of host memory (" +
           estimate.Describe() + "), the node has " + FormatGigabytes(memory_bytes) + " (" +
           FormatGigabytes(std::max<int64_t>(memory_bytes - kNodeMemoryReserve, 0)) +
           " usable)";
  }
  if (gpu_memory_bytes > 0 && estimate.device_bytes_per_gpu() > gpu_memory_bytes) {
    return "needs ~" + FormatGigabytes(estimate.device_bytes_per_gpu()) +
           " of GPU memory per rank (" + estimate.Describe() + "), its GPUs have " +
           FormatGigabytes(gpu_memory_bytes);
  }
  return "";
}

Demand DemandOf(const CellSpec& spec, MemoryEstimate memory) {
  Demand d;
  d.memory = std::move(memory);
  d.gpu = spec.runtime.device == "cuda";
  d.world_size = spec.topology.world_size();
  d.torch = spec.runtime.torch;
  d.cuda = spec.runtime.cuda;
  d.gpu_model = spec.runtime.gpu_model;
  if (spec.IsReference()) d.transformers = spec.runtime.transformers;
  d.reference_cell = spec.reference.cell;
  if (!spec.reference.cell.empty()) d.waits_for.push_back(spec.reference.cell);
  if (!spec.control.empty()) d.waits_for.push_back(spec.control);
  return d;
}

Demand DemandOfSpec(std::string_view spec_json) {
  Result<CellSpec> spec = ParseCellSpecJson(spec_json);
  if (spec.ok()) return DemandOf(*spec);
  Demand d;
  d.invalid = spec.status().message();
  return d;
}

std::vector<Placement> Schedule(const std::vector<QueuedAttempt>& queue,
                                const std::vector<AgentView>& agents,
                                std::vector<Waiting>* waiting, const SchedulingPolicy& policy,
                                const RunningLoad& load) {
  std::vector<Demand> demands;
  demands.reserve(queue.size());
  for (const QueuedAttempt& a : queue) demands.push_back(DemandOfSpec(a.spec_json));
  return Schedule(queue, demands, agents, waiting, policy, load);
}

std::vector<Placement> Schedule(const std::vector<QueuedAttempt>& queue,
                                const std::vector<Demand>& demands,
                                const std::vector<AgentView>& agents,
                                std::vector<Waiting>* waiting, const SchedulingPolicy& policy,
                                const RunningLoad& load) {
  std::vector<int> free(agents.size()), free_gpus(agents.size());
  std::vector<int64_t> memory_in_use(agents.size());
  // An attempt that would fit an agent but for the memory its running attempts hold holds that
  // agent: later attempts of the round do not take it, so small cells cannot keep a large one
  // waiting forever (the agent's id -> the attempt; 0: not held).
  std::vector<int64_t> held_for(agents.size(), 0);
  for (size_t i = 0; i < agents.size(); ++i) {
    free[i] = agents[i].drain_reason.empty() ? std::max(agents[i].slots, 1) - agents[i].running : 0;
    free_gpus[i] = agents[i].gpus - agents[i].gpus_in_use;
    memory_in_use[i] = agents[i].memory_in_use;
  }
  const bool any_draining = std::any_of(agents.begin(), agents.end(), [](const AgentView& a) {
    return !a.drain_reason.empty();
  });
  std::map<std::string, int> by_submitter = load.by_submitter;
  std::map<std::string, int> by_repository = load.by_repository;

  // Priority buckets (highest first); in each, a FIFO per submitter.
  std::map<int, std::map<std::string, std::deque<size_t>>, std::greater<>> buckets;
  for (size_t i = 0; i < queue.size(); ++i) {
    buckets[queue[i].priority][queue[i].submitter].push_back(i);
  }

  std::vector<Placement> out;
  for (auto& [priority, fifos] : buckets) {
    // Next submitter: fewest running (this round included), then the oldest head.
    using Turn = std::tuple<int, size_t, std::string>;
    std::priority_queue<Turn, std::vector<Turn>, std::greater<>> turns;
    for (const auto& [submitter, fifo] : fifos) turns.emplace(by_submitter[submitter], fifo.front(), submitter);
    while (!turns.empty()) {
      const std::string submitter = std::get<2>(turns.top());
      turns.pop();
      std::deque<size_t>& fifo = fifos[submitter];
      const QueuedAttempt& attempt = queue[fifo.front()];
      const Demand& d = demands.at(fifo.front());
      fifo.pop_front();
      bool placed = false;
      // Shortcut when every agent is full (a draining one is named by the loop below instead).
      if (!any_draining && std::none_of(free.begin(), free.end(), [](int f) { return f > 0; })) {
        if (waiting) {
          waiting->push_back({attempt.attempt_id,
                              agents.empty() ? "no agent connected" : "no free slot on any agent"});
        }
      } else if (policy.max_running_per_repository > 0 &&
                 by_repository[attempt.repository] >= policy.max_running_per_repository) {
        if (waiting) {
          waiting->push_back({attempt.attempt_id,
                              "repository " + attempt.repository + " already runs " +
                                  std::to_string(by_repository[attempt.repository]) +
                                  " attempts, its limit (--max-running-per-repository)"});
        }
      } else {
        std::optional<size_t> best;
        auto better = [&](size_t i, size_t j) {  // is agent i a better home than agent j?
          if (!d.gpu) {
            const bool i_cpu = agents[i].lane == "cpu", j_cpu = agents[j].lane == "cpu";
            if (i_cpu != j_cpu) return i_cpu;
          }
          return free[i] > free[j];
        };
        for (size_t i = 0; i < agents.size(); ++i) {
          if (!Fits(agents[i], free[i], free_gpus[i], memory_in_use[i], d, held_for[i])) continue;
          if (!best || better(i, *best)) best = i;
        }
        if (!best) {
          if (waiting) {
            waiting->push_back({attempt.attempt_id, agents.empty() ? "no agent connected"
                                                                   : WhyNot(agents, free, free_gpus,
                                                                            memory_in_use, held_for, d)});
          }
          // Hold the largest agent it fits but for the memory in use, if any.
          std::optional<size_t> hold;
          for (size_t i = 0; i < agents.size() && !d.memory.empty(); ++i) {
            if (held_for[i] != 0 || free[i] <= 0) continue;
            if (!Misfit(agents[i], free[i], free_gpus[i], /*memory_in_use=*/0, d).empty()) continue;
            if (!hold || agents[i].memory_bytes > agents[*hold].memory_bytes) hold = i;
          }
          if (hold) held_for[*hold] = attempt.attempt_id;
        } else {
          out.push_back({attempt.attempt_id, attempt.cell_id, agents[*best].agent_id});
          --free[*best];
          if (d.gpu) free_gpus[*best] -= d.world_size;
          memory_in_use[*best] += d.memory.host_bytes();
          ++by_repository[attempt.repository];
          placed = true;
        }
      }
      if (placed) ++by_submitter[submitter];
      if (!fifo.empty()) turns.emplace(by_submitter[submitter], fifo.front(), submitter);
    }
  }
  return out;
}

}  // namespace gatehouse::controller
