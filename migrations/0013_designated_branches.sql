-- Designated branches (docs/protocols.md §1, GET|PUT /api/v1/designated-branches): readiness and
-- the matrix count only the cells submitted on a branch designated for their repository, so an
-- experiment or typo branch's FAIL does not turn the rows of main red.

-- One row per repository a policy is known for (repository as cells store it: the frozen spec's
-- member). default_branch is the remote's HEAD as the controller's mirror last saw it (recorded
-- when a cell of the repository is stored); designated is an admin's set, a JSON array of branch
-- names, NULL while none was set (then the default branch alone is designated; with neither
-- known, every branch counts).
CREATE TABLE repository_branches (
  repository        TEXT PRIMARY KEY,
  default_branch    TEXT NOT NULL DEFAULT '',
  default_seen_at   TEXT NOT NULL DEFAULT '',
  designated        TEXT CHECK (designated IS NULL OR json_type(designated) = 'array'),
  designated_by     TEXT NOT NULL DEFAULT '',
  designated_reason TEXT NOT NULL DEFAULT '',
  designated_at     TEXT NOT NULL DEFAULT ''
);

-- Every branch a cell was submitted on. cells.branch keeps the first one as its label; a commit
-- submitted again from another branch (main fast-forwarded to an experiment's commit) is the
-- same cell, and counts for that branch too.
CREATE TABLE cell_branches (
  cell_id  TEXT NOT NULL REFERENCES cells(id),
  branch   TEXT NOT NULL,
  first_at TEXT NOT NULL,
  PRIMARY KEY (cell_id, branch)
) WITHOUT ROWID;

INSERT INTO cell_branches(cell_id, branch, first_at)
  SELECT id, branch, created_at FROM cells WHERE branch != '';
