-- Gatehouse controller schema, version 1: cells, attempts and their evidence, agents.
-- Times are UTC ISO-8601 strings with milliseconds ("2025-01-02T03:04:05.678Z").
-- Applied by controller/store/store.cc inside one transaction and recorded in schema_migrations.

-- A cell: one frozen set of inputs. id = SHA-256 hex of the canonical spec (docs/protocols.md §2).
CREATE TABLE cells (
  id           TEXT PRIMARY KEY,
  spec_json    TEXT NOT NULL,
  repository   TEXT NOT NULL,
  commit_sha   TEXT NOT NULL,
  branch       TEXT NOT NULL DEFAULT '',   -- label only, never hashed
  model_family TEXT NOT NULL,
  created_at   TEXT NOT NULL,
  submitter    TEXT NOT NULL DEFAULT ''    -- label only, never hashed
);
CREATE INDEX cells_created_at ON cells(created_at);

-- One run of a cell. number counts 1, 2, ... per cell; a retry never overwrites an earlier one.
-- state: queued | leased | running | passed | failed | error (controller/attempt_state.h).
-- run_status: the run_end event's status (PASS, FAIL, ...), empty until one arrives.
CREATE TABLE attempts (
  id         INTEGER PRIMARY KEY,
  cell_id    TEXT NOT NULL REFERENCES cells(id),
  number     INTEGER NOT NULL,
  state      TEXT NOT NULL,
  agent_id   TEXT NOT NULL DEFAULT '',
  reason     TEXT NOT NULL DEFAULT '',
  run_status TEXT NOT NULL DEFAULT '',
  created_at TEXT NOT NULL,
  started_at TEXT NOT NULL DEFAULT '',
  ended_at   TEXT NOT NULL DEFAULT '',
  UNIQUE (cell_id, number)
);
CREATE INDEX attempts_state ON attempts(state);

-- Worker events as relayed by the agent; a resent (attempt_id, seq) is ignored.
CREATE TABLE events (
  attempt_id  INTEGER NOT NULL REFERENCES attempts(id),
  seq         INTEGER NOT NULL,
  json        TEXT NOT NULL,
  received_at TEXT NOT NULL,
  UNIQUE (attempt_id, seq)
);

-- One gate of one attempt. status: RUNNING until phase_end, then PASS|FAIL|BLOCKED|UNKNOWN|SKIPPED.
CREATE TABLE phases (
  attempt_id     INTEGER NOT NULL REFERENCES attempts(id),
  phase          TEXT NOT NULL,
  status         TEXT NOT NULL,
  reason         TEXT NOT NULL DEFAULT '',
  classification TEXT NOT NULL DEFAULT '',
  started_at     TEXT NOT NULL DEFAULT '',
  ended_at       TEXT NOT NULL DEFAULT '',
  duration_ms    INTEGER,
  UNIQUE (attempt_id, phase)
);

-- A figure reported by a gate; value_json is a JSON number or string.
CREATE TABLE figures (
  id         INTEGER PRIMARY KEY,
  attempt_id INTEGER NOT NULL REFERENCES attempts(id),
  phase      TEXT NOT NULL,
  name       TEXT NOT NULL,
  value_json TEXT NOT NULL,
  unit       TEXT NOT NULL DEFAULT ''
);
CREATE INDEX figures_attempt ON figures(attempt_id, phase);

-- Log chunks at byte offsets within a stream ("build", "worker"); a resent offset is ignored.
CREATE TABLE logs (
  attempt_id INTEGER NOT NULL REFERENCES attempts(id),
  stream     TEXT NOT NULL,
  offset     INTEGER NOT NULL,
  data       BLOB NOT NULL,
  UNIQUE (attempt_id, stream, offset)
);

-- Agents as they registered. state: connected | disconnected.
CREATE TABLE agents (
  id                TEXT PRIMARY KEY,
  name              TEXT NOT NULL,
  capabilities_json TEXT NOT NULL DEFAULT '{}',
  registered_at     TEXT NOT NULL,
  last_heartbeat_at TEXT NOT NULL DEFAULT '',
  state             TEXT NOT NULL
);
