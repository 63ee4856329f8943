-- Cells an operator hides from readiness and the matrix (POST /api/v1/cells/{id}/hide, docs/
-- protocols.md §1): a typo's cell or an abandoned experiment's. Nothing is deleted: the cell,
-- its attempts and evidence stay, GET /api/v1/cells/{id} shows it, and each hide and show is
-- recorded with who did it, when and why.
ALTER TABLE cells ADD COLUMN hidden INTEGER NOT NULL DEFAULT 0;

CREATE TABLE cell_visibility (
  id       INTEGER PRIMARY KEY,
  cell_id  TEXT NOT NULL REFERENCES cells(id),
  action   TEXT NOT NULL CHECK (action IN ('hide', 'show')),
  actor    TEXT NOT NULL,
  reason   TEXT NOT NULL,
  at       TEXT NOT NULL
);
CREATE INDEX cell_visibility_by_cell ON cell_visibility(cell_id, id);

-- The matrix's covering index gains `hidden` after `kind`, so the query that leaves hidden
-- cells out still reads no table row.
DROP INDEX cells_matrix;
CREATE INDEX cells_matrix ON cells(kind, hidden, model_family, checkpoint_digest, device,
                                   precision, tp, dp, pp, ep, mode, created_at, checkpoint_path,
                                   id, repository, branch, commit_sha);
