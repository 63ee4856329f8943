-- File digests (docs/protocols.md §1, "202 resolving"; controller/digest_cache.h): the SHA-256
-- of each file of the checkpoints and reference bundles the controller digested, so that after
-- a restart a 70 GB checkpoint is listed, not read again. A row is reused only while the file's
-- stat is the one recorded (size, mtime and ctime in ns, inode, device); one row per path.
CREATE TABLE file_digests (
  path      TEXT PRIMARY KEY,  -- absolute path of the file as the directory lists it
  size      INTEGER NOT NULL,  -- bytes
  mtime_ns  INTEGER NOT NULL,
  ctime_ns  INTEGER NOT NULL,
  inode     INTEGER NOT NULL,  -- the unsigned value's 64 bits
  device    INTEGER NOT NULL,  -- likewise
  sha256    TEXT NOT NULL,     -- lower-case hex
  hashed_at TEXT NOT NULL
);
