#include "controller/readiness.h"

#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace gatehouse::controller {

std::string_view ReadinessOf(AttemptState status) {
  switch (status) {
    case AttemptState::kPassed:
      return "validated";
    case AttemptState::kFailed:
      return "failed";
    case AttemptState::kBlocked:
      return "blocked";
    default:
      return "unverified";
  }
}

std::vector<ReadinessCombination> ComputeReadiness(const std::vector<CellSummary>& cells) {
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string,
                         int64_t, int64_t, int64_t, int64_t, std::string, std::string, std::string>;
  std::map<Key, ReadinessCombination> combinations;
  std::set<std::pair<Key, std::pair<std::string, std::string>>> seen;  // (key, (repo, commit))
  for (const CellSummary& c : cells) {
    auto spec = ParseCellSpecJson(c.cell.spec_json);
    if (!spec.ok() || spec->IsReference()) continue;
    std::string phases;
    for (const std::string& p : spec->phases) phases += (phases.empty() ? "" : ",") + p;
    const Key key{spec->model_family, spec->checkpoint.path, spec->checkpoint.digest,
                  spec->runtime.device, spec->precision, spec->topology.tp, spec->topology.dp,
                  spec->topology.pp, spec->topology.ep, spec->mode, phases, spec->runtime.torch};
    if (!seen.insert({key, {spec->repository, spec->commit}}).second) continue;  // older cell
    ReadinessCombination& combination = combinations[key];
    if (combination.commits.empty()) {
      combination.model_family = spec->model_family;
      combination.checkpoint = spec->checkpoint;
      combination.device = spec->runtime.device;
      combination.precision = spec->precision;
      combination.topology = spec->topology;
      combination.mode = spec->mode;
      combination.phases = spec->phases;
      combination.torch = spec->runtime.torch;
    }
    combination.commits.push_back({spec->repository, c.cell.branch, spec->commit,
                                   std::string(ReadinessOf(c.status)), c.status, c.cell.id,
                                   c.cell.created_at});
  }
  std::vector<ReadinessCombination> out;
  out.reserve(combinations.size());
  for (auto& [key, combination] : combinations) out.push_back(std::move(combination));
  return out;
}

}  // namespace gatehouse::controller
