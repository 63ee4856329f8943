#include "controller/readiness.h"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace gatehouse::controller {
namespace {

/// The topology's degrees in a fixed order, so combinations and columns sort by number.
std::array<int64_t, 7> Degrees(const CellSpec::Topology& t) {
  return {t.tp, t.dp, t.pp, t.ep, t.dp_shard, t.cp, t.etp};
}

}  // namespace

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
  // The topology enters as its seven degrees, compared as numbers.
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string,
                         std::array<int64_t, 7>, std::string, std::string, std::string>;
  std::map<Key, ReadinessCombination> combinations;
  std::set<std::pair<Key, std::pair<std::string, std::string>>> seen;  // (key, (repo, commit))
  for (const CellSummary& c : cells) {
    auto spec = ParseCellSpecJson(c.cell.spec_json);
    if (!spec.ok() || spec->IsReference()) continue;
    std::string phases;
    for (const std::string& p : spec->phases) phases += (phases.empty() ? "" : ",") + p;
    const Key key{spec->model_family, spec->checkpoint.path, spec->checkpoint.digest,
                  spec->runtime.device, spec->precision, Degrees(spec->topology),
                  spec->mode, phases, spec->runtime.torch};
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
  // bf16 combinations: the same commit's standing where the numerics are claimed, in fp32.
  for (auto& [key, combination] : combinations) {
    if (combination.precision != "bf16") continue;
    combination.numerics = std::string(kBf16NumericsNote);
    Key fp32_key = key;
    std::get<4>(fp32_key) = "fp32";
    auto fp32 = combinations.find(fp32_key);
    for (ReadinessCommit& commit : combination.commits) {
      commit.fp32_readiness = "none";
      if (fp32 == combinations.end()) continue;
      for (const ReadinessCommit& other : fp32->second.commits) {
        if (other.repository == commit.repository && other.commit == commit.commit) {
          commit.fp32_readiness = other.readiness;
        }
      }
    }
  }
  std::vector<ReadinessCombination> out;
  out.reserve(combinations.size());
  for (auto& [key, combination] : combinations) out.push_back(std::move(combination));
  return out;
}

BranchDesignation DesignationOf(const RepositoryBranches& row) {
  BranchDesignation d{row.repository, "unknown", {}, row};
  if (row.designated) {
    d.source = "configured";
    d.branches = *row.designated;
  } else if (!row.default_branch.empty()) {
    d.source = "default_branch";
    d.branches = {row.default_branch};
  }
  std::sort(d.branches.begin(), d.branches.end());
  d.branches.erase(std::unique(d.branches.begin(), d.branches.end()), d.branches.end());
  return d;
}

DesignatedBranches::DesignatedBranches(const std::vector<RepositoryBranches>& rows) {
  for (const RepositoryBranches& row : rows) by_repository_[row.repository] = DesignationOf(row);
}

bool DesignatedBranches::Counts(const std::string& repository, const std::string& branch) const {
  auto it = by_repository_.find(repository);
  if (it == by_repository_.end() || it->second.source == "unknown") return true;
  const std::vector<std::string>& b = it->second.branches;
  return !branch.empty() && std::binary_search(b.begin(), b.end(), branch);
}

BranchDesignation DesignatedBranches::Of(const std::string& repository) const {
  auto it = by_repository_.find(repository);
  if (it != by_repository_.end()) return it->second;
  RepositoryBranches none;
  none.repository = repository;
  return DesignationOf(none);
}

MatrixFilter::Designated DesignatedBranches::AsFilter() const {
  MatrixFilter::Designated f;
  for (const auto& [repository, d] : by_repository_) {
    if (d.source == "unknown") continue;
    f.restricted.push_back(repository);
    for (const std::string& branch : d.branches) f.designated.emplace_back(repository, branch);
  }
  return f;
}

std::vector<CellSummary> OnDesignatedBranches(std::vector<CellSummary> cells,
                                              const std::vector<CellBranch>& branches,
                                              const DesignatedBranches& designated) {
  std::map<std::string, std::vector<std::string>> by_cell;
  for (const CellBranch& b : branches) by_cell[b.cell_id].push_back(b.branch);
  std::vector<CellSummary> out;
  for (CellSummary& c : cells) {
    if (designated.Counts(c.cell.repository, c.cell.branch)) {
      out.push_back(std::move(c));
      continue;
    }
    auto it = by_cell.find(c.cell.id);
    if (it == by_cell.end()) continue;
    std::vector<std::string> others = it->second;
    std::sort(others.begin(), others.end());
    for (const std::string& branch : others) {
      if (!designated.Counts(c.cell.repository, branch)) continue;
      c.cell.branch = branch;  // the branch it counts for
      out.push_back(std::move(c));
      break;
    }
  }
  return out;
}

Matrix ArrangeMatrix(const std::vector<MatrixSquare>& squares, std::string_view status) {
  using ColumnOrder =
      std::tuple<std::string, std::string, std::array<int64_t, 7>, std::string>;
  std::map<ColumnOrder, MatrixColumn> columns;
  Matrix out;
  for (const MatrixSquare& q : squares) {
    const std::string_view readiness = ReadinessOf(q.status);
    if (!status.empty() && status != AttemptStateName(q.status) && status != readiness) continue;
    MatrixColumn c{"", q.device, q.precision, q.topology, q.mode};
    c.key = q.device + " " + q.precision + " " + TopologyText(q.topology) + " " + q.mode;
    if (out.rows.empty() || out.rows.back().model_family != q.model_family ||
        out.rows.back().checkpoint.digest != q.checkpoint_digest ||
        out.rows.back().checkpoint.path != q.checkpoint_path) {
      out.rows.push_back({q.model_family, {q.checkpoint_path, q.checkpoint_digest}, "", {}, {}});
    }
    MatrixRow& row = out.rows.back();
    ++row.counts[std::string(readiness)];
    row.squares.emplace(c.key, q);
    columns.emplace(ColumnOrder{q.device, q.precision, Degrees(q.topology), q.mode}, std::move(c));
  }
  for (MatrixRow& row : out.rows) {
    const auto validated = row.counts.find("validated");
    const bool all_validated = validated != row.counts.end() &&
                               validated->second == static_cast<int>(row.squares.size());
    row.readiness = row.counts.count("failed")    ? "failed"
                    : row.counts.count("blocked") ? "blocked"
                    : all_validated               ? "validated"
                                                  : "unverified";
  }
  for (auto& [order, column] : columns) out.columns.push_back(std::move(column));
  return out;
}

}  // namespace gatehouse::controller
