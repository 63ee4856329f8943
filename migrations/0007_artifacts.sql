-- Artifacts (issue 17): files attempts store in the controller's content-addressed blob store
-- (docs/protocols.md §7). A blob is named by the SHA-256 of its bytes and stored once however
-- many attempts name it; an attempt's name for a file never changes (a retry is another attempt,
-- so a failed attempt's artifacts are kept beside its retry's).
CREATE TABLE artifact_blobs (
  digest     TEXT PRIMARY KEY,      -- "sha256:<hex>"
  size       INTEGER NOT NULL,      -- bytes
  created_at TEXT NOT NULL
);

CREATE TABLE artifacts (
  attempt_id INTEGER NOT NULL REFERENCES attempts(id),
  name       TEXT NOT NULL,         -- relative path, e.g. "reference/reference.json"
  digest     TEXT NOT NULL REFERENCES artifact_blobs(digest),
  size       INTEGER NOT NULL,
  created_at TEXT NOT NULL,
  UNIQUE (attempt_id, name)
);
CREATE INDEX artifacts_digest ON artifacts(digest);
