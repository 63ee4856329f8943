-- The matrix's topology columns gain the mesh dimensions the frozen spec has had since its
-- topology became a device mesh (common/mesh.h; docs/protocols.md §2): dp_shard, cp and etp,
-- each written to spec_json only when not 1 (so 1 when absent). Cells that differ only in them
-- are different squares. Copies of the frozen spec as in 0011_matrix.sql: filled here for the
-- cells already stored, by the trigger for every cell inserted later.
ALTER TABLE cells ADD COLUMN dp_shard INTEGER NOT NULL DEFAULT 1;
ALTER TABLE cells ADD COLUMN cp INTEGER NOT NULL DEFAULT 1;
ALTER TABLE cells ADD COLUMN etp INTEGER NOT NULL DEFAULT 1;

UPDATE cells SET
  dp_shard = coalesce(json_extract(spec_json, '$.topology.dp_shard'), 1),
  cp = coalesce(json_extract(spec_json, '$.topology.cp'), 1),
  etp = coalesce(json_extract(spec_json, '$.topology.etp'), 1);

DROP TRIGGER cells_matrix_columns;
CREATE TRIGGER cells_matrix_columns AFTER INSERT ON cells BEGIN
  UPDATE cells SET
    kind = coalesce(json_extract(NEW.spec_json, '$.kind'), ''),
    checkpoint_path = coalesce(json_extract(NEW.spec_json, '$.checkpoint.path'), ''),
    checkpoint_digest = coalesce(json_extract(NEW.spec_json, '$.checkpoint.digest'), ''),
    device = coalesce(json_extract(NEW.spec_json, '$.runtime.device'), ''),
    precision = coalesce(json_extract(NEW.spec_json, '$.precision'), ''),
    tp = coalesce(json_extract(NEW.spec_json, '$.topology.tp'), 0),
    dp = coalesce(json_extract(NEW.spec_json, '$.topology.dp'), 0),
    pp = coalesce(json_extract(NEW.spec_json, '$.topology.pp'), 0),
    ep = coalesce(json_extract(NEW.spec_json, '$.topology.ep'), 0),
    dp_shard = coalesce(json_extract(NEW.spec_json, '$.topology.dp_shard'), 1),
    cp = coalesce(json_extract(NEW.spec_json, '$.topology.cp'), 1),
    etp = coalesce(json_extract(NEW.spec_json, '$.topology.etp'), 1),
    mode = coalesce(json_extract(NEW.spec_json, '$.mode'), '')
  WHERE rowid = NEW.rowid;
END;

-- The covering index as 0012_hidden_cells.sql left it (`hidden` after `kind`), with the new
-- columns in the square, so the matrix query still reads no table row.
DROP INDEX cells_matrix;
CREATE INDEX cells_matrix ON cells(kind, hidden, model_family, checkpoint_digest, device,
                                   precision, tp, dp, pp, ep, dp_shard, cp, etp, mode, created_at,
                                   checkpoint_path, id, repository, branch, commit_sha);
