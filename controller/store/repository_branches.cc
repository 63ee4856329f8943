// The store's repository_branches table (migrations/0013_designated_branches.sql): each
// repository's default branch as the mirror saw it and the branches an admin designated.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controller/store/sqlite_statement.h"
#include "controller/store/store.h"

namespace gatehouse::controller {
namespace {

constexpr char kColumns[] =
    "repository, default_branch, default_seen_at, designated, designated_by, designated_reason, "
    "designated_at";

Result<RepositoryBranches> RowOf(const Stmt& s) {
  RepositoryBranches r{s.Text(0), s.Text(1), s.Text(2), std::nullopt, s.Text(4), s.Text(5),
                       s.Text(6)};
  if (!s.IsNull(3)) {
    const nlohmann::json set = nlohmann::json::parse(s.Text(3), nullptr, false);
    if (!set.is_array()) {
      return Status::DataLoss("repository '" + r.repository + "': stored designated branches '" +
                              s.Text(3) + "' are no JSON array");
    }
    r.designated.emplace();
    for (const nlohmann::json& b : set) {
      if (!b.is_string()) {
        return Status::DataLoss("repository '" + r.repository +
                                "': a stored designated branch is no string");
      }
      r.designated->push_back(b.get<std::string>());
    }
  }
  return r;
}

}  // namespace

Status Store::RecordDefaultBranch(const std::string& repository, const std::string& branch) {
  if (branch.empty()) return Status::Ok();
  std::lock_guard lock(mu_);
  return Stmt(*statements_,
              "INSERT INTO repository_branches(repository, default_branch, default_seen_at) "
              "VALUES (?1, ?2, ?3) ON CONFLICT(repository) DO UPDATE SET "
              "default_branch = excluded.default_branch, default_seen_at = excluded.default_seen_at "
              "WHERE default_branch != excluded.default_branch")
      .Bind(1, repository)
      .Bind(2, branch)
      .Bind(3, Now())
      .Exec()
      .WithContext("record the default branch of '" + repository + "'");
}

Result<RepositoryBranches> Store::SetDesignatedBranches(const std::string& repository,
                                                        const std::vector<std::string>& branches,
                                                        const std::string& actor,
                                                        const std::string& reason) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  // An empty set is stored as NULL: none designated, the default branch counts again.
  const std::string set = branches.empty() ? "" : nlohmann::json(branches).dump();
  GH_RETURN_IF_ERROR(
      Stmt(*statements_,
           "INSERT INTO repository_branches(repository, designated, designated_by, "
           "designated_reason, designated_at) VALUES (?1, NULLIF(?2, ''), ?3, ?4, ?5) "
           "ON CONFLICT(repository) DO UPDATE SET designated = excluded.designated, "
           "designated_by = excluded.designated_by, designated_reason = excluded.designated_reason, "
           "designated_at = excluded.designated_at")
          .Bind(1, repository)
          .Bind(2, set)
          .Bind(3, actor)
          .Bind(4, reason)
          .Bind(5, Now())
          .Exec()
          .WithContext("designate branches of '" + repository + "'"));
  Stmt s(*statements_,
         std::string("SELECT ") + kColumns + " FROM repository_branches WHERE repository = ?");
  s.Bind(1, repository);
  if (!s.Step()) {
    GH_RETURN_IF_ERROR(s.status());
    return Status::Internal("repository '" + repository + "': its row is gone after the write");
  }
  GH_ASSIGN_OR_RETURN(RepositoryBranches row, RowOf(s));
  GH_RETURN_IF_ERROR(tx.Commit());
  return row;
}

Result<std::vector<RepositoryBranches>> Store::ListRepositoryBranches() {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         std::string("SELECT ") + kColumns + " FROM repository_branches ORDER BY repository");
  std::vector<RepositoryBranches> out;
  while (s.Step()) {
    GH_ASSIGN_OR_RETURN(RepositoryBranches row, RowOf(s));
    out.push_back(std::move(row));
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

}  // namespace gatehouse::controller
