-- Webhook outbox (issue 17; docs/protocols.md §8). Every attempt that ends gets one delivery
-- row, written by the trigger below in the same transaction as the state change, whichever
-- code path ends it (finish, cancel, time limit, lost, blocked). The controller's webhook
-- thread posts due rows to the configured URL and records each try here, so a receiver that is
-- down delays a delivery and never a verdict, and a controller restart loses none.
CREATE TABLE webhook_deliveries (
  id           INTEGER PRIMARY KEY,
  attempt_id   INTEGER NOT NULL UNIQUE REFERENCES attempts(id),
  cell_id      TEXT NOT NULL REFERENCES cells(id),
  created_at   TEXT NOT NULL,
  -- pending | delivered | failed (tries used up) | skipped (no webhook configured, or a lost
  -- attempt that was retried automatically: its cell has not ended)
  state        TEXT NOT NULL DEFAULT 'pending',
  tries        INTEGER NOT NULL DEFAULT 0,
  next_try_at  TEXT NOT NULL,
  last_status  INTEGER NOT NULL DEFAULT 0,   -- HTTP status of the last try; 0: none answered
  last_error   TEXT NOT NULL DEFAULT '',
  delivered_at TEXT NOT NULL DEFAULT ''
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries(state, next_try_at);
CREATE INDEX webhook_deliveries_cell ON webhook_deliveries(cell_id);
-- "was this lost attempt retried?" is asked per due delivery and per cell read.
CREATE INDEX attempts_retry_of ON attempts(retry_of);

CREATE TRIGGER attempts_ended_webhook AFTER UPDATE OF state ON attempts
WHEN NEW.state IN ('passed', 'failed', 'error', 'lost', 'cancelled', 'timed_out', 'blocked')
 AND OLD.state NOT IN ('passed', 'failed', 'error', 'lost', 'cancelled', 'timed_out', 'blocked')
BEGIN
  INSERT OR IGNORE INTO webhook_deliveries(attempt_id, cell_id, created_at, next_try_at)
  VALUES (NEW.id, NEW.cell_id, NEW.ended_at, NEW.ended_at);
END;
