-- Scheduling (issue 5): a cell's priority (-100..100, higher first; a label, never hashed: the
-- same inputs are the same cell whatever their priority). Its attempts, retries included, are
-- placed by it, then fairly across submitters, then first-in first-out.
ALTER TABLE cells ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
