// The controller's persistent state in SQLite (one file, WAL mode). Schema: migrations/*.sql,
// embedded at build time and applied at Open.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/clock.h"
#include "controller/digest_cache.h"
#include "controller/memory_estimate.h"
#include "controller/records.h"
#include "controller/store/migrations.h"

struct sqlite3;

namespace gatehouse::controller {

class StatementCache;  // store.cc: the connection's prepared statements

/// A migration recorded in schema_migrations.
struct AppliedMigration {
  int version = 0;
  std::string name;
  std::string applied_at;
};

/// A placement decided by the scheduler, to persist.
struct Lease {
  int64_t attempt_id = 0;
  std::string agent_id;
};

/// SQLite-backed store of cells, attempts, evidence and agents.
///
/// Threading: thread-safe; one connection guarded by a mutex, so calls are serialised.
/// Every method that writes more than one row does so in one transaction: on any error
/// nothing of it is stored. Errors: INTERNAL with SQLite's message for database failures;
/// NOT_FOUND / FAILED_PRECONDITION where documented.
class Store {
 public:
  /// Opens (creating if needed) the database at `path` (":memory:" works), sets WAL mode and
  /// applies the `migrations` not yet recorded in schema_migrations, each in one transaction.
  static Result<std::unique_ptr<Store>> Open(
      const std::string& path, Clock clock,
      std::span<const Migration> migrations = EmbeddedMigrations());
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // ---- artifacts (protocols.md §7) ----

  /// Records that attempt `a.attempt_id` stored file `a.name` as blob `a.digest` of `a.size`
  /// bytes (the blob's file is already in place); the blob counts as used now, and an expired
  /// blob whose bytes came again is stored again. Returns false for a resend of the same
  /// record. ALREADY_EXISTS when the attempt named another blob by that name; NOT_FOUND for an
  /// unknown attempt.
  Result<bool> RecordArtifact(const ArtifactRecord& a);

  /// The artifacts of an attempt, by name, each with its blob's expired_at.
  Result<std::vector<ArtifactRecord>> ListArtifacts(int64_t attempt_id);

  /// Blob `digest` when some attempt recorded it (expired or not); nullopt otherwise.
  Result<std::optional<BlobRecord>> GetBlob(const std::string& digest);

  /// Stamps last_used_at = now on each stored (not expired) blob of `digests`: it was handed to
  /// an attempt or fetched. Unknown digests are ignored.
  Status TouchBlobs(const std::vector<std::string>& digests);

  /// What one retention pass removes (ExpireBlobs); timestamps as stored.
  struct BlobRetention {
    std::string used_before;      // every blob last used before this; empty: no age limit
    int64_t max_total_bytes = 0;  // then the least recently used until the stored bytes are at
                                  // most this; 0: no cap
    std::string kept_since;       // the cap never removes a blob used at or after this
  };

  /// Artifact retention, in one transaction: marks expired (expired_at = now) the stored blobs
  /// `r` removes, never one that an attempt still queued, leased or running recorded, and
  /// returns them, least recently used first. The caller then removes their files.
  Result<std::vector<BlobRecord>> ExpireBlobs(const BlobRetention& r);

  /// The digests of every expired blob (the caller removes any file left of them).
  Result<std::vector<std::string>> ListExpiredBlobs();

  /// Queues attempt number + 1 of cell `cell_id` (retry_of `passed_attempt_id`) when that
  /// attempt is still the cell's latest and passed: its artifacts expired and a cell needs them
  /// again. Returns the new attempt, or nullopt when another attempt already follows it (made
  /// by an earlier call) or it did not pass.
  Result<std::optional<AttemptRecord>> RunAgainForExpiredArtifacts(const std::string& cell_id,
                                                                   int64_t passed_attempt_id);

  // ---- webhook outbox (migrations/0008_webhooks.sql) ----

  /// Pending deliveries due at `now` (next_try_at <= now), oldest first, at most `limit`.
  Result<std::vector<WebhookDelivery>> DueWebhookDeliveries(const std::string& now, int limit);

  /// Records a try of delivery `id`: its new state, the try counted when `t.counts`, the
  /// status and error, next_try_at (pending) or delivered_at (delivered, stamped now).
  /// NOT_FOUND for an unknown delivery.
  Status RecordWebhookTry(int64_t id, const WebhookTry& t);

  /// The deliveries of every attempt of cell `cell_id`, by attempt.
  Result<std::vector<WebhookDelivery>> ListWebhookDeliveries(const std::string& cell_id);

  /// Rows of schema_migrations in version order.
  Result<std::vector<AppliedMigration>> AppliedMigrations();

  // ---- cells and attempts ----

  /// Stores `cell` and its attempt 1 (queued) in one transaction, unless a cell with that id
  /// exists, and records `cell.branch` (when not empty) among the branches it was submitted on
  /// either way (cell_branches). Returns true when it created the cell. `cell.created_at` is
  /// set here.
  Result<bool> CreateCellIfAbsent(const CellRecord& cell);

  /// The cell, or nullopt.
  Result<std::optional<CellRecord>> GetCell(const std::string& id);

  /// Cells newest first with their latest attempt's state.
  Result<std::vector<CellSummary>> ListCells(int limit, int offset);

  /// The newest validation cell of every square (migrations/0011_matrix.sql) among the cells
  /// `filter` matches (hidden ones only with filter.include_hidden), with its latest attempt's state and the square's count, sorted by
  /// family, checkpoint, device, precision, topology and mode.
  Result<std::vector<MatrixSquare>> Matrix(const MatrixFilter& filter);

  /// The repositories, branches and model families of the stored validation cells.
  Result<MatrixChoices> ListMatrixChoices();

  /// Hides (`hidden`) or shows cell `cell_id` and records the action with `actor`, `reason`
  /// and the store's clock, in one transaction (cell_visibility.cc, migrations/0012).
  /// Errors: NOT_FOUND for an unknown cell; FAILED_PRECONDITION "cell '<id>' is already
  /// hidden|shown" (nothing recorded).
  Result<CellVisibilityAction> SetCellHidden(const std::string& cell_id, bool hidden,
                                             const std::string& actor, const std::string& reason);

  /// Every hide and show of `cell_id`, oldest first (empty for an unknown cell).
  Result<std::vector<CellVisibilityAction>> ListCellVisibility(const std::string& cell_id);

  // ---- memory admission (memory.cc, migrations/0014_memory.sql) ----

  /// Records the facts of the checkpoint with `digest` (replacing what was recorded).
  Status PutCheckpointFacts(const std::string& digest, const CheckpointFacts& facts);
  /// The facts recorded for `digest`; nullopt when none were.
  Result<std::optional<CheckpointFacts>> GetCheckpointFacts(const std::string& digest);
  /// Records what one ended attempt's process measured (replacing an earlier row of it).
  Status RecordMemoryPeak(const MeasuredPeak& peak);
  /// The newest `limit` recorded peaks, oldest first.
  Result<std::vector<MeasuredPeak>> ListMemoryPeaks(int limit);
  /// The largest peak_rss_bytes figure attempt `attempt_id` reported (any phase, any rank); 0
  /// when it reported none.
  Result<int64_t> AttemptPeakRss(int64_t attempt_id);

  // ---- designated branches (migrations/0013_designated_branches.sql) ----

  /// Records `branch` as the default branch (the remote's HEAD) of `repository`, stamped now
  /// when it differs from the one recorded (repository_branches.cc). An empty branch changes
  /// nothing.
  Status RecordDefaultBranch(const std::string& repository, const std::string& branch);

  /// Sets the designated branches of `repository` (an empty list: none set, the default branch
  /// again) with `actor`, `reason` and the store's clock, and returns the row.
  Result<RepositoryBranches> SetDesignatedBranches(const std::string& repository,
                                                   const std::vector<std::string>& branches,
                                                   const std::string& actor,
                                                   const std::string& reason);

  /// Every repository_branches row, by repository. DATA_LOSS for a stored set that does not
  /// parse.
  Result<std::vector<RepositoryBranches>> ListRepositoryBranches();

  /// Every (cell, branch) a cell was submitted on (cell_branches.cc), by cell.
  Result<std::vector<CellBranch>> ListCellBranches();

  /// Attempts of a cell, by number ascending.
  Result<std::vector<AttemptRecord>> ListAttempts(const std::string& cell_id);

  /// NOT_FOUND "attempt <id> not found" when absent.
  Result<AttemptRecord> GetAttempt(int64_t attempt_id);

  /// Queued attempts with their cells' specs (spec_json left empty when `with_specs` is
  /// false: a scheduling pass reads the specs it has not cached), oldest first (FIFO).
  Result<std::vector<QueuedAttempt>> ListQueuedAttempts(bool with_specs = true);

  /// Leased and running attempts with their agents, submitters and repositories.
  Result<std::vector<ActiveAttempt>> ListActiveAttempts();

  /// Moves a queued attempt to `as` (cancelled, timed_out for the queued time limit, or
  /// blocked when a cell it waits for ended without PASS) with `reason`, only if it is still queued (in one statement, so a concurrent lease wins or
  /// loses whole). Returns false when it was not.
  Result<bool> CancelQueued(int64_t attempt_id, const std::string& reason,
                            AttemptState as = AttemptState::kCancelled);

  /// Queues a new attempt of cell `cell_id` (number + 1, retry_of the latest) when its latest
  /// attempt ended without a verdict: error, lost, cancelled, timed_out or blocked. Returns the
  /// new attempt. FAILED_PRECONDITION naming the state otherwise (queued or running: it is
  /// still going; passed or failed: a verdict, which the same inputs would give again);
  /// NOT_FOUND for a cell without attempts.
  Result<AttemptRecord> RetryCell(const std::string& cell_id);

  /// Records that a stop was requested for a leased or running attempt (cancel_reason, and
  /// `as`: cancelled for a cancel, timed_out for a time limit; the attempt ends in that state
  /// when its agent reports the end, or when it is lost). Returns false when one was already
  /// requested (the first reason and state stay). FAILED_PRECONDITION for an attempt in any
  /// other state.
  Result<bool> RequestCancel(int64_t attempt_id, const std::string& reason,
                             AttemptState as = AttemptState::kCancelled);

  /// Attempts over a time limit and not already being stopped: queued ones created before
  /// `queued_before`, leased/running ones leased before `leased_before`, or whose RUNNING
  /// phase started before `phase_started_before` (timestamps as stored; an empty cutoff turns
  /// that limit off). The attempt limit wins when both apply. By attempt id.
  Result<std::vector<OverdueAttempt>> ListOverdue(const std::string& queued_before,
                                                  const std::string& leased_before,
                                                  const std::string& phase_started_before);

  /// In one transaction: moves a leased or running attempt to lost with `reason` (to cancelled
  /// when a cancel was requested for it) and, when the cell's lost attempts (this one
  /// included) number at most `retry_limit`, adds the cell's next attempt, queued, with
  /// retry_of = this attempt. Returns the new attempt's id, or nullopt when no retry was made
  /// (limit reached, cancelled, or the attempt had already ended: then nothing changes).
  Result<std::optional<int64_t>> LoseAttempt(int64_t attempt_id, const std::string& reason,
                                             int retry_limit);

  /// Moves each attempt queued -> leased with its agent, all in one transaction; fails whole
  /// (FAILED_PRECONDITION) if one attempt is no longer queued.
  Status LeaseAttempts(const std::vector<Lease>& leases);

  /// Ends an attempt: moves it to `to` (checked against the transition table), sets reason and
  /// ended_at. Returns false, changing nothing, if it is already terminal (a resend).
  Result<bool> FinishAttempt(int64_t attempt_id, AttemptState to, const std::string& reason);

  // ---- evidence ----

  /// Stores event (attempt_id, seq) and applies `effect` in one transaction. A seq already
  /// stored is ignored: returns false and changes nothing. A phase_start moves a leased
  /// attempt to running. An event for an attempt already ended is stored with stale = 1 and
  /// not applied. NOT_FOUND if the attempt does not exist.
  Result<bool> RecordEvent(int64_t attempt_id, int64_t seq, const std::string& json,
                           const EventEffect& effect);

  /// Phases of an attempt (unordered) with their figures.
  Result<std::vector<PhaseRecord>> ListPhases(int64_t attempt_id);

  /// Stores a log chunk; a chunk at an (attempt, stream, offset) already stored is ignored
  /// (returns false). A chunk for an attempt that has already ended is stored flagged stale
  /// (logs.stale; still part of the log, so it keeps its tail).
  Result<bool> AppendLog(int64_t attempt_id, const std::string& stream, int64_t offset,
                         const std::string& data);

  /// The chunks of one stream concatenated in offset order, from byte `from` on (a live log is
  /// followed by asking from the length already read).
  Result<std::string> ReadLog(int64_t attempt_id, const std::string& stream, int64_t from = 0);
  /// The names of the streams an attempt has chunks of, sorted.
  Result<std::vector<std::string>> ListLogStreams(int64_t attempt_id);

  // ---- agents ----

  /// Inserts or replaces the agent row; state "connected", registered_at = now.
  Status UpsertAgent(const AgentRecord& agent);
  /// Sets last_heartbeat_at = now.
  Status TouchAgent(const std::string& agent_id);
  /// Sets the agent's state ("connected" | "disconnected").
  Status SetAgentState(const std::string& agent_id, const std::string& state);
  /// NOT_FOUND when absent.
  Result<AgentRecord> GetAgent(const std::string& agent_id);
  /// Every agent that ever registered, by id.
  Result<std::vector<AgentRecord>> ListAgents();

  // ---- file digests (migrations/0009_file_digests.sql, controller/digest_cache.h) ----

  /// The hex SHA-256 recorded for the file at `path` with exactly `stamp`; nullopt when none
  /// (or the file's stat is another now).
  Result<std::optional<std::string>> FindFileDigest(const std::string& path,
                                                    const FileStamp& stamp);
  /// Records the digest of the file at `path` with `stamp`, replacing the path's row.
  Status RecordFileDigest(const std::string& path, const FileStamp& stamp,
                          const std::string& sha256_hex);

  // ---- tokens (controller/auth.h) ----

  /// Stores a token (name, kind, scopes; created_at set here) by the SHA-256 hex of its
  /// secret and returns the stored row. ALREADY_EXISTS when an active token has that name.
  Result<TokenRecord> CreateToken(const TokenRecord& token, const std::string& sha256_hex);
  /// The token whose secret hashes to `sha256_hex` (revoked ones too), or nullopt.
  Result<std::optional<TokenRecord>> FindToken(const std::string& sha256_hex);
  /// All tokens, by id.
  Result<std::vector<TokenRecord>> ListTokens();
  /// Sets revoked_at (kept when already revoked) and returns the row; NOT_FOUND when absent.
  Result<TokenRecord> RevokeToken(int64_t token_id);
  /// Sets last_used_at = now.
  Status TouchToken(int64_t token_id);

 private:
  Store(sqlite3* db, Clock clock);
  Status ApplyMigrations(std::span<const Migration> migrations);
  // Adds (cell_id, branch) to cell_branches unless there (then false); under mu_, inside the
  // caller's transaction (cell_branches.cc).
  Result<bool> AddCellBranchLocked(const std::string& cell_id, const std::string& branch,
                             const std::string& at);
  std::string Now() const;

  std::mutex mu_;
  sqlite3* db_;
  std::unique_ptr<StatementCache> statements_;  // prepared statements of db_
  Clock clock_;
};

/// The store as a DigestCache's book of file digests, so they outlive a restart. A failure is
/// logged and costs a rehash, never a wrong digest. Threading: thread-safe, as the store.
class StoreDigestBook : public FileDigestBook {
 public:
  explicit StoreDigestBook(Store& store) : store_(store) {}
  std::optional<std::string> Find(const std::string& path, const FileStamp& stamp) override;
  void Record(const std::string& path, const FileStamp& stamp,
              const std::string& sha256_hex) override;

 private:
  Store& store_;
};

}  // namespace gatehouse::controller
