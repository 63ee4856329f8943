-- Artifact retention (docs/protocols.md §7, --artifact-retention-days): a blob is removed when
-- it has not been used for that long. "Used" is stored by an attempt, handed to an attempt as
-- an input, or fetched. The rows stay (they are the record of what each attempt stored); the
-- blob's row says when its bytes were removed. Storing the same bytes again brings it back.
ALTER TABLE artifact_blobs ADD COLUMN last_used_at TEXT NOT NULL DEFAULT '';
ALTER TABLE artifact_blobs ADD COLUMN expired_at TEXT NOT NULL DEFAULT '';  -- '' while stored
UPDATE artifact_blobs SET last_used_at = created_at;
CREATE INDEX artifact_blobs_use ON artifact_blobs(expired_at, last_used_at);
