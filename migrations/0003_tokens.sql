-- Bearer tokens (issue 5, controller/auth.h). Only the SHA-256 of a token is stored; the token
-- itself is shown once, when it is created. kind 'api' tokens call the REST API with their
-- scopes (read, submit, admin); kind 'agent' tokens only open the agent stream (gRPC).
CREATE TABLE tokens (
  id            INTEGER PRIMARY KEY,
  name          TEXT NOT NULL,
  kind          TEXT NOT NULL CHECK (kind IN ('api', 'agent')),
  scopes        TEXT NOT NULL,          -- comma-separated: 'read,submit'; '' for agent tokens
  token_sha256  TEXT NOT NULL UNIQUE,   -- lower-case hex
  created_at    TEXT NOT NULL,
  last_used_at  TEXT,
  revoked_at    TEXT
);

-- One active token per name, so a name identifies a submitter or an agent.
CREATE UNIQUE INDEX tokens_active_name ON tokens(name) WHERE revoked_at IS NULL;
