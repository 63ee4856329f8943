-- Time limits (issue 5): when an attempt was leased (its attempt time limit counts from here;
-- started_at is its first phase_start), and the state a requested stop ends it in: 'cancelled'
-- for POST .../cancel, 'timed_out' when a time limit (queued, attempt, phase) stopped it.
ALTER TABLE attempts ADD COLUMN leased_at TEXT NOT NULL DEFAULT '';
ALTER TABLE attempts ADD COLUMN cancel_as TEXT NOT NULL DEFAULT 'cancelled';
