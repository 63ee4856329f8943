// The store's cell_visibility table and cells.hidden (migrations/0012_hidden_cells.sql).
#include <string>
#include <vector>

#include "controller/store/sqlite_statement.h"
#include "controller/store/store.h"

namespace gatehouse::controller {

Result<CellVisibilityAction> Store::SetCellHidden(const std::string& cell_id, bool hidden,
                                                  const std::string& actor,
                                                  const std::string& reason) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  Stmt current(*statements_, "SELECT hidden FROM cells WHERE id = ?");
  current.Bind(1, cell_id);
  if (!current.Step()) {
    GH_RETURN_IF_ERROR(current.status());
    return Status::NotFound("cell '" + cell_id + "' not found");
  }
  if ((current.Int(0) != 0) == hidden) {
    return Status::FailedPrecondition("cell '" + cell_id + "' is already " +
                                      (hidden ? "hidden" : "shown"));
  }
  CellVisibilityAction action{cell_id, hidden ? "hide" : "show", actor, reason, Now()};
  GH_RETURN_IF_ERROR(Stmt(*statements_, "UPDATE cells SET hidden = ? WHERE id = ?")
                         .Bind(1, int64_t{hidden ? 1 : 0})
                         .Bind(2, cell_id)
                         .Exec());
  GH_RETURN_IF_ERROR(Stmt(*statements_,
                          "INSERT INTO cell_visibility(cell_id, action, actor, reason, at) "
                          "VALUES (?, ?, ?, ?, ?)")
                         .Bind(1, action.cell_id)
                         .Bind(2, action.action)
                         .Bind(3, action.actor)
                         .Bind(4, action.reason)
                         .Bind(5, action.at)
                         .Exec());
  GH_RETURN_IF_ERROR(tx.Commit());
  return action;
}

Result<std::vector<CellVisibilityAction>> Store::ListCellVisibility(const std::string& cell_id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "SELECT cell_id, action, actor, reason, at FROM cell_visibility WHERE cell_id = ? "
         "ORDER BY id");
  s.Bind(1, cell_id);
  std::vector<CellVisibilityAction> out;
  while (s.Step()) out.push_back({s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Text(4)});
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

}  // namespace gatehouse::controller
