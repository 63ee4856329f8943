-- Attempt lifecycle (issue 5). attempts.state may also be lost | cancelled | timed_out
-- (controller/attempt_state.h): lost when its agent missed its heartbeats, never "failed".

-- Why a cancel was requested for a leased or running attempt; '' when none was. The attempt
-- ends cancelled when its agent reports the end (or is lost).
ALTER TABLE attempts ADD COLUMN cancel_reason TEXT NOT NULL DEFAULT '';

-- The attempt a retry repeats (a lost one); NULL for a cell's first attempt.
ALTER TABLE attempts ADD COLUMN retry_of INTEGER REFERENCES attempts(id);

-- 1: the event arrived after its attempt had ended (the agent's lease was gone). Stored for
-- the record, never applied to phases, figures or the verdict.
ALTER TABLE events ADD COLUMN stale INTEGER NOT NULL DEFAULT 0;
