-- 1: the log chunk arrived after its attempt had ended (its lease was gone, e.g. lost while
-- its agent was cut off). Kept, so the log has its tail, but flagged, as events are (0002).
ALTER TABLE logs ADD COLUMN stale INTEGER NOT NULL DEFAULT 0;
