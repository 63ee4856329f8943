-- Memory admission (controller/memory_estimate.h, docs/scheduling.md "Memory").
-- What a checkpoint's memory depends on, read once per checkpoint digest at submit: the weight
-- files' bytes and config.json's dtype.
CREATE TABLE checkpoint_facts (
  digest        TEXT PRIMARY KEY,
  bytes         INTEGER NOT NULL,
  dtype         TEXT NOT NULL DEFAULT '',
  element_bytes INTEGER NOT NULL
);

-- The peak one process of an ended attempt measured (its evidence's peak_rss_bytes, or the
-- cgroup limit an OOM kill hit), beside the uncalibrated estimate for it: later estimates of
-- the same memory key use the peak, others of the role scale by the largest ratio.
CREATE TABLE memory_peaks (
  attempt_id     INTEGER PRIMARY KEY REFERENCES attempts(id),
  role           TEXT NOT NULL,
  memory_key     TEXT NOT NULL,
  estimate_bytes INTEGER NOT NULL,
  peak_bytes     INTEGER NOT NULL,
  recorded_at    TEXT NOT NULL
);
