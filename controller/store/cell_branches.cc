// The store's cell_branches table (migrations/0013_designated_branches.sql): every branch a
// cell was submitted on; cells.branch keeps the first as the cell's label.
#include <sqlite3.h>

#include <string>
#include <vector>

#include "controller/store/sqlite_statement.h"
#include "controller/store/store.h"

namespace gatehouse::controller {

Result<bool> Store::AddCellBranchLocked(const std::string& cell_id, const std::string& branch,
                                        const std::string& at) {
  GH_RETURN_IF_ERROR(Stmt(*statements_,
                          "INSERT OR IGNORE INTO cell_branches(cell_id, branch, first_at) "
                          "VALUES (?, ?, ?)")
                         .Bind(1, cell_id)
                         .Bind(2, branch)
                         .Bind(3, at)
                         .Exec()
                         .WithContext("record branch '" + branch + "' of cell " + cell_id));
  return sqlite3_changes(db_) != 0;
}

Result<std::vector<CellBranch>> Store::ListCellBranches() {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, "SELECT cell_id, branch FROM cell_branches ORDER BY cell_id, branch");
  std::vector<CellBranch> out;
  while (s.Step()) out.push_back({s.Text(0), s.Text(1)});
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

}  // namespace gatehouse::controller
