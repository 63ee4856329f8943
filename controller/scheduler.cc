#include "controller/scheduler.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

namespace gatehouse::controller {
namespace {

/// Why `agent` (with `free_slots` and `free_gpus` left this round) cannot take `d`; empty when
/// it can.
std::string Misfit(const AgentView& agent, int free_slots, int free_gpus, const Demand& d) {
  if (free_slots <= 0) return "no free slot";
  if (!d.torch.empty() && !agent.torch_version.empty() && agent.torch_version != d.torch) {
    return "torch " + agent.torch_version + " (the cell pins " + d.torch + ")";
  }
  if (!d.cuda.empty() && agent.cuda_version != d.cuda) {
    return (agent.cuda_version.empty() ? std::string("no CUDA reported")
                                       : "CUDA " + agent.cuda_version) +
           " (the cell pins " + d.cuda + ")";
  }
  if (d.gpu && free_gpus < d.world_size) {
    return std::to_string(free_gpus) + " of " + std::to_string(agent.gpus) +
           " GPUs free, needs " + std::to_string(d.world_size);
  }
  return "";
}

}  // namespace

Demand DemandOfSpec(std::string_view spec_json) {
  Demand d;
  const nlohmann::json spec = nlohmann::json::parse(spec_json, nullptr, /*allow_exceptions=*/false);
  if (!spec.is_object()) return d;
  if (auto rt = spec.find("runtime"); rt != spec.end() && rt->is_object()) {
    d.gpu = rt->value("device", "") == "cuda";
    if (auto t = rt->find("torch"); t != rt->end() && t->is_string()) d.torch = t->get<std::string>();
    if (auto c = rt->find("cuda"); c != rt->end() && c->is_string()) d.cuda = c->get<std::string>();
  }
  if (auto topo = spec.find("topology"); topo != spec.end() && topo->is_object()) {
    int64_t n = 1;
    for (const char* k : {"tp", "dp", "pp"}) {
      auto v = topo->find(k);
      if (v != topo->end() && v->is_number_integer() && v->get<int64_t>() > 0) n *= v->get<int64_t>();
    }
    d.world_size = static_cast<int>(std::min<int64_t>(n, 1 << 20));
  }
  return d;
}

std::vector<Placement> Schedule(const std::vector<QueuedAttempt>& queue,
                                const std::vector<AgentView>& agents,
                                std::vector<Waiting>* waiting) {
  std::vector<int> free(agents.size()), free_gpus(agents.size());
  for (size_t i = 0; i < agents.size(); ++i) {
    free[i] = std::max(agents[i].slots, 1) - agents[i].running;
    free_gpus[i] = agents[i].gpus - agents[i].gpus_in_use;
  }
  std::vector<Placement> out;
  for (const QueuedAttempt& attempt : queue) {
    if (std::none_of(free.begin(), free.end(), [](int f) { return f > 0; })) {
      if (waiting) waiting->push_back({attempt.attempt_id, agents.empty() ? "no agent connected" : "no free slot on any agent"});
      continue;
    }
    const Demand d = DemandOfSpec(attempt.spec_json);
    std::optional<size_t> best;
    std::string why;
    for (size_t i = 0; i < agents.size(); ++i) {
      const std::string misfit = Misfit(agents[i], free[i], free_gpus[i], d);
      if (!misfit.empty()) {
        why += (why.empty() ? "" : "; ") + agents[i].agent_id + ": " + misfit;
        continue;
      }
      if (!best || free[i] > free[*best]) best = i;
    }
    if (!best) {
      if (waiting) waiting->push_back({attempt.attempt_id, why});
      continue;
    }
    out.push_back({attempt.attempt_id, attempt.cell_id, agents[*best].agent_id});
    --free[*best];
    if (d.gpu) free_gpus[*best] -= d.world_size;
  }
  return out;
}

}  // namespace gatehouse::controller
