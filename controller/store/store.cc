#include "controller/store/store.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sqlite3.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "controller/store/sqlite_statement.h"

namespace gatehouse::controller {
namespace {

constexpr char kAttemptColumns[] =
    "id, cell_id, number, state, agent_id, reason, run_status, created_at, started_at, ended_at, "
    "cancel_reason, retry_of, leased_at, cancel_as";

Result<AttemptRecord> AttemptFromRow(const Stmt& s) {
  AttemptRecord a;
  a.id = s.Int(0);
  a.cell_id = s.Text(1);
  a.number = static_cast<int>(s.Int(2));
  GH_ASSIGN_OR_RETURN(a.state, StateColumn(s, 3));
  a.agent_id = s.Text(4);
  a.reason = s.Text(5);
  a.run_status = s.Text(6);
  a.created_at = s.Text(7);
  a.started_at = s.Text(8);
  a.ended_at = s.Text(9);
  a.cancel_reason = s.Text(10);
  a.retry_of = s.Int(11);  // NULL reads as 0
  a.leased_at = s.Text(12);
  GH_ASSIGN_OR_RETURN(a.cancel_as, StateColumn(s, 13));
  return a;
}

constexpr char kCellColumns[] =
    "id, spec_json, repository, commit_sha, branch, model_family, created_at, submitter, priority";

CellRecord CellFromRow(const Stmt& s, int first = 0) {
  CellRecord c;
  c.id = s.Text(first + 0);
  c.spec_json = s.Text(first + 1);
  c.repository = s.Text(first + 2);
  c.commit_sha = s.Text(first + 3);
  c.branch = s.Text(first + 4);
  c.model_family = s.Text(first + 5);
  c.created_at = s.Text(first + 6);
  c.submitter = s.Text(first + 7);
  c.priority = static_cast<int>(s.Int(first + 8));
  return c;
}

// Reads one attempt; NOT_FOUND when absent. Caller holds mu_.
Result<AttemptRecord> LoadAttempt(StatementCache& db, int64_t attempt_id) {
  Stmt s(db, std::string("SELECT ") + kAttemptColumns + " FROM attempts WHERE id = ?");
  s.Bind(1, attempt_id);
  if (!s.Step()) {
    GH_RETURN_IF_ERROR(s.status());
    return Status::NotFound("attempt " + std::to_string(attempt_id) + " not found");
  }
  return AttemptFromRow(s);
}

// The latest attempt of cell `cell_id`; NOT_FOUND for a cell without one. Caller holds mu_.
Result<AttemptRecord> LatestAttempt(StatementCache& db, const std::string& cell_id) {
  Stmt last(db, "SELECT id FROM attempts WHERE cell_id = ? ORDER BY number DESC LIMIT 1");
  last.Bind(1, cell_id);
  if (!last.Step()) {
    GH_RETURN_IF_ERROR(last.status());
    return Status::NotFound("cell '" + cell_id + "' has no attempt");
  }
  return LoadAttempt(db, last.Int(0));
}

// Inserts attempt `number` of cell `cell_id`, queued at `now`, retry_of `retry_of`; returns
// its id. Errors name `what`. Caller holds mu_, in a transaction.
Result<int64_t> QueueAttempt(StatementCache& db, sqlite3* handle, const std::string& cell_id,
                             int64_t number, int64_t retry_of, const std::string& now,
                             const std::string& what) {
  Stmt insert(db,
              "INSERT INTO attempts(cell_id, number, state, created_at, retry_of) "
              "VALUES (?, ?, ?, ?, ?)");
  insert.Bind(1, cell_id)
      .Bind(2, number)
      .Bind(3, AttemptStateName(AttemptState::kQueued))
      .Bind(4, now)
      .Bind(5, retry_of);
  GH_RETURN_IF_ERROR(insert.Exec().WithContext(what));
  return static_cast<int64_t>(sqlite3_last_insert_rowid(handle));
}

}  // namespace

Store::Store(sqlite3* db, Clock clock)
    : db_(db), statements_(std::make_unique<StatementCache>(db)), clock_(std::move(clock)) {}

Store::~Store() {
  statements_.reset();  // finalized before the connection closes
  sqlite3_close_v2(db_);
}

std::string Store::Now() const { return FormatTimestamp(clock_()); }

Result<std::unique_ptr<Store>> Store::Open(const std::string& path, Clock clock,
                                           std::span<const Migration> migrations) {
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    return Status::Unavailable("cannot open database '" + path + "': " + msg);
  }
  std::unique_ptr<Store> store(new Store(db, std::move(clock)));
  sqlite3_busy_timeout(db, 5000);
  GH_RETURN_IF_ERROR(ExecSql(db, "PRAGMA journal_mode=WAL").WithContext("database '" + path + "'"));
  GH_RETURN_IF_ERROR(ExecSql(db, "PRAGMA foreign_keys=ON"));
  GH_RETURN_IF_ERROR(ExecSql(db, "PRAGMA synchronous=NORMAL"));
  GH_RETURN_IF_ERROR(store->ApplyMigrations(migrations).WithContext("database '" + path + "'"));
  return store;
}

Status Store::ApplyMigrations(std::span<const Migration> migrations) {
  std::lock_guard lock(mu_);
  GH_RETURN_IF_ERROR(ExecSql(db_,
                             "CREATE TABLE IF NOT EXISTS schema_migrations ("
                             "version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                             "applied_at TEXT NOT NULL)"));
  for (const Migration& m : migrations) {
    Transaction tx(*statements_);
    GH_RETURN_IF_ERROR(tx.begin_status());
    Stmt seen(*statements_, "SELECT 1 FROM schema_migrations WHERE version = ?");
    seen.Bind(1, int64_t{m.version});
    if (seen.Step()) continue;  // already applied; the transaction rolls back (nothing done)
    GH_RETURN_IF_ERROR(seen.status());
    const std::string sql(m.sql);
    GH_RETURN_IF_ERROR(
        ExecSql(db_, sql.c_str())
            .WithContext("migration " + std::to_string(m.version) + "_" + std::string(m.name)));
    Stmt record(*statements_, "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, ?)");
    record.Bind(1, int64_t{m.version}).Bind(2, m.name).Bind(3, Now());
    GH_RETURN_IF_ERROR(record.Exec());
    GH_RETURN_IF_ERROR(tx.Commit());
  }
  return Status::Ok();
}

Result<std::vector<AppliedMigration>> Store::AppliedMigrations() {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, "SELECT version, name, applied_at FROM schema_migrations ORDER BY version");
  std::vector<AppliedMigration> out;
  while (s.Step()) {
    out.push_back({static_cast<int>(s.Int(0)), s.Text(1), s.Text(2)});
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<bool> Store::CreateCellIfAbsent(const CellRecord& cell) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  const std::string now = Now();
  Stmt insert(*statements_, std::string("INSERT OR IGNORE INTO cells(") + kCellColumns +
                       ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
  insert.Bind(1, cell.id)
      .Bind(2, cell.spec_json)
      .Bind(3, cell.repository)
      .Bind(4, cell.commit_sha)
      .Bind(5, cell.branch)
      .Bind(6, cell.model_family)
      .Bind(7, now)
      .Bind(8, cell.submitter)
      .Bind(9, int64_t{cell.priority});
  GH_RETURN_IF_ERROR(insert.Exec().WithContext("store cell " + cell.id));
  const bool created = sqlite3_changes(db_) != 0;
  bool new_branch = false;
  if (!cell.branch.empty()) {
    GH_ASSIGN_OR_RETURN(new_branch, AddCellBranchLocked(cell.id, cell.branch, now));
  }
  if (!created) {
    // A resubmit: only a branch the cell was not submitted on before is written.
    if (new_branch) GH_RETURN_IF_ERROR(tx.Commit());
    return false;
  }
  Stmt attempt(*statements_, "INSERT INTO attempts(cell_id, number, state, created_at) VALUES (?, 1, ?, ?)");
  attempt.Bind(1, cell.id).Bind(2, AttemptStateName(AttemptState::kQueued)).Bind(3, now);
  GH_RETURN_IF_ERROR(attempt.Exec().WithContext("store attempt 1 of cell " + cell.id));
  GH_RETURN_IF_ERROR(tx.Commit());
  return true;
}

Result<std::optional<CellRecord>> Store::GetCell(const std::string& id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, std::string("SELECT ") + kCellColumns + ", hidden FROM cells WHERE id = ?");
  s.Bind(1, id);
  if (s.Step()) {
    CellRecord cell = CellFromRow(s);
    cell.hidden = s.Int(9) != 0;
    return std::optional<CellRecord>(std::move(cell));
  }
  GH_RETURN_IF_ERROR(s.status());
  return std::optional<CellRecord>();
}

Result<std::vector<CellSummary>> Store::ListCells(int limit, int offset) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "SELECT c.id, c.spec_json, c.repository, c.commit_sha, c.branch, c.model_family, "
         "c.created_at, c.submitter, c.priority, "
         "(SELECT a.state FROM attempts a WHERE a.cell_id = c.id ORDER BY a.number DESC LIMIT 1), "
         "c.hidden FROM cells c ORDER BY c.created_at DESC, c.rowid DESC LIMIT ? OFFSET ?");
  s.Bind(1, int64_t{limit}).Bind(2, int64_t{offset});
  std::vector<CellSummary> out;
  while (s.Step()) {
    CellSummary summary;
    summary.cell = CellFromRow(s);
    GH_ASSIGN_OR_RETURN(summary.status, StateColumn(s, 9));
    summary.cell.hidden = s.Int(10) != 0;
    out.push_back(std::move(summary));
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<std::vector<AttemptRecord>> Store::ListAttempts(const std::string& cell_id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, std::string("SELECT ") + kAttemptColumns +
                  " FROM attempts WHERE cell_id = ? ORDER BY number");
  s.Bind(1, cell_id);
  std::vector<AttemptRecord> out;
  while (s.Step()) {
    GH_ASSIGN_OR_RETURN(AttemptRecord a, AttemptFromRow(s));
    out.push_back(std::move(a));
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<AttemptRecord> Store::GetAttempt(int64_t attempt_id) {
  std::lock_guard lock(mu_);
  return LoadAttempt(*statements_, attempt_id);
}

Result<bool> Store::RecordArtifact(const ArtifactRecord& a) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  GH_RETURN_IF_ERROR(LoadAttempt(*statements_, a.attempt_id).status());
  {
    Stmt s(*statements_, "SELECT digest FROM artifacts WHERE attempt_id = ? AND name = ?");
    s.Bind(1, a.attempt_id).Bind(2, a.name);
    if (s.Step()) {
      const std::string stored = s.Text(0);
      if (stored == a.digest) return false;
      return Status::AlreadyExists("attempt " + std::to_string(a.attempt_id) +
                                   " already stored artifact '" + a.name + "' as " + stored +
                                   ", not " + a.digest);
    }
    GH_RETURN_IF_ERROR(s.status());
  }
  const std::string now = Now();
  {
    // A blob retention removed is stored again: its bytes are back in place.
    Stmt s(*statements_,
           "INSERT INTO artifact_blobs(digest, size, created_at, last_used_at) "
           "VALUES (?1, ?2, ?3, ?3) ON CONFLICT(digest) DO UPDATE SET last_used_at = ?3, "
           "expired_at = ''");
    s.Bind(1, a.digest).Bind(2, a.size).Bind(3, now);
    GH_RETURN_IF_ERROR(s.Exec());
  }
  {
    Stmt s(*statements_,
           "INSERT INTO artifacts(attempt_id, name, digest, size, created_at) "
           "VALUES (?, ?, ?, ?, ?)");
    s.Bind(1, a.attempt_id).Bind(2, a.name).Bind(3, a.digest).Bind(4, a.size).Bind(5, now);
    GH_RETURN_IF_ERROR(s.Exec());
  }
  GH_RETURN_IF_ERROR(tx.Commit());
  return true;
}

Result<std::vector<ArtifactRecord>> Store::ListArtifacts(int64_t attempt_id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "SELECT a.name, a.digest, a.size, a.created_at, b.expired_at FROM artifacts a "
         "JOIN artifact_blobs b ON b.digest = a.digest WHERE a.attempt_id = ? ORDER BY a.name");
  s.Bind(1, attempt_id);
  std::vector<ArtifactRecord> out;
  while (s.Step()) {
    out.push_back({attempt_id, s.Text(0), s.Text(1), s.Int(2), s.Text(3), s.Text(4)});
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

namespace {

constexpr const char* kDeliveryColumns =
    "d.id, d.attempt_id, d.cell_id, d.created_at, d.state, d.tries, d.next_try_at, "
    "d.last_status, d.last_error, d.delivered_at, "
    "(SELECT a.state = 'lost' AND EXISTS (SELECT 1 FROM attempts r WHERE r.retry_of = a.id) "
    "FROM attempts a WHERE a.id = d.attempt_id) ";

WebhookDelivery DeliveryFrom(Stmt& s) {
  WebhookDelivery d;
  d.id = s.Int(0);
  d.attempt_id = s.Int(1);
  d.cell_id = s.Text(2);
  d.created_at = s.Text(3);
  d.state = s.Text(4);
  d.tries = static_cast<int>(s.Int(5));
  d.next_try_at = s.Text(6);
  d.last_status = static_cast<int>(s.Int(7));
  d.last_error = s.Text(8);
  d.delivered_at = s.Text(9);
  d.retried = s.Int(10) != 0;
  return d;
}

}  // namespace

Result<std::vector<WebhookDelivery>> Store::DueWebhookDeliveries(const std::string& now,
                                                                 int limit) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, std::string("SELECT ") + kDeliveryColumns +
                           "FROM webhook_deliveries d WHERE d.state = 'pending' AND "
                           "d.next_try_at <= ? ORDER BY d.next_try_at, d.id LIMIT ?");
  s.Bind(1, now).Bind(2, int64_t{limit});
  std::vector<WebhookDelivery> out;
  while (s.Step()) out.push_back(DeliveryFrom(s));
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Status Store::RecordWebhookTry(int64_t id, const WebhookTry& t) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "UPDATE webhook_deliveries SET state = ?, tries = tries + ?, last_status = ?, "
         "last_error = ?, next_try_at = CASE WHEN ? != '' THEN ? ELSE next_try_at END, "
         "delivered_at = CASE WHEN ? = 'delivered' THEN ? ELSE delivered_at END WHERE id = ?");
  const std::string now = Now();
  s.Bind(1, t.state)
      .Bind(2, int64_t{t.counts ? 1 : 0})
      .Bind(3, int64_t{t.status})
      .Bind(4, t.error)
      .Bind(5, t.next_try_at)
      .Bind(6, t.next_try_at)
      .Bind(7, t.state)
      .Bind(8, now)
      .Bind(9, id);
  GH_RETURN_IF_ERROR(s.Exec());
  if (sqlite3_changes(db_) == 0) {
    return Status::NotFound("webhook delivery " + std::to_string(id) + " not found");
  }
  return Status::Ok();
}

Result<std::vector<WebhookDelivery>> Store::ListWebhookDeliveries(const std::string& cell_id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, std::string("SELECT ") + kDeliveryColumns +
                           "FROM webhook_deliveries d WHERE d.cell_id = ? ORDER BY d.attempt_id");
  s.Bind(1, cell_id);
  std::vector<WebhookDelivery> out;
  while (s.Step()) out.push_back(DeliveryFrom(s));
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

namespace {

constexpr const char* kBlobColumns = "digest, size, created_at, last_used_at, expired_at";

BlobRecord BlobFrom(Stmt& s) {
  return {s.Text(0), s.Int(1), s.Text(2), s.Text(3), s.Text(4)};
}

}  // namespace

Result<std::optional<BlobRecord>> Store::GetBlob(const std::string& digest) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         std::string("SELECT ") + kBlobColumns + " FROM artifact_blobs WHERE digest = ?");
  s.Bind(1, digest);
  if (s.Step()) return std::optional<BlobRecord>(BlobFrom(s));
  GH_RETURN_IF_ERROR(s.status());
  return std::optional<BlobRecord>();
}

Status Store::TouchBlobs(const std::vector<std::string>& digests) {
  if (digests.empty()) return Status::Ok();
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  const std::string now = Now();
  for (const std::string& d : digests) {
    Stmt s(*statements_,
           "UPDATE artifact_blobs SET last_used_at = ? WHERE digest = ? AND expired_at = ''");
    s.Bind(1, now).Bind(2, d);
    GH_RETURN_IF_ERROR(s.Exec());
  }
  return tx.Commit();
}

Result<std::vector<BlobRecord>> Store::ExpireBlobs(const BlobRetention& r) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  int64_t stored = 0;  // bytes of every stored blob, removable or not
  {
    Stmt total(*statements_, "SELECT COALESCE(SUM(size), 0) FROM artifact_blobs WHERE expired_at = ''");
    if (!total.Step()) {
      GH_RETURN_IF_ERROR(total.status());
      return Status::Internal("artifact_blobs: no total");
    }
    stored = total.Int(0);
  }
  // A blob an attempt still going recorded may be waited for: that attempt's cell has not
  // handed it to anyone yet.
  Stmt pick(*statements_,
            std::string("SELECT ") + kBlobColumns +
                " FROM artifact_blobs b WHERE b.expired_at = '' AND "
                "NOT EXISTS (SELECT 1 FROM artifacts f JOIN attempts a ON a.id = f.attempt_id "
                "WHERE f.digest = b.digest AND a.state IN ('queued', 'leased', 'running')) "
                "ORDER BY b.last_used_at, b.digest");
  std::vector<BlobRecord> out;
  while (pick.Step()) {
    BlobRecord b = BlobFrom(pick);
    const bool too_old = !r.used_before.empty() && b.last_used_at < r.used_before;
    const bool over_cap = r.max_total_bytes > 0 && stored > r.max_total_bytes &&
                          (r.kept_since.empty() || b.last_used_at < r.kept_since);
    if (!too_old && !over_cap) continue;
    stored -= b.size;
    out.push_back(std::move(b));
  }
  GH_RETURN_IF_ERROR(pick.status());
  const std::string now = Now();
  for (BlobRecord& b : out) {
    Stmt s(*statements_, "UPDATE artifact_blobs SET expired_at = ? WHERE digest = ?");
    s.Bind(1, now).Bind(2, b.digest);
    GH_RETURN_IF_ERROR(s.Exec());
    b.expired_at = now;
  }
  GH_RETURN_IF_ERROR(tx.Commit());
  return out;
}

Result<std::vector<std::string>> Store::ListExpiredBlobs() {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, "SELECT digest FROM artifact_blobs WHERE expired_at != '' ORDER BY digest");
  std::vector<std::string> out;
  while (s.Step()) out.push_back(s.Text(0));
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<std::optional<AttemptRecord>> Store::RunAgainForExpiredArtifacts(
    const std::string& cell_id, int64_t passed_attempt_id) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  GH_ASSIGN_OR_RETURN(AttemptRecord a, LatestAttempt(*statements_, cell_id));
  if (a.id != passed_attempt_id || a.state != AttemptState::kPassed) {
    return std::optional<AttemptRecord>();
  }
  GH_ASSIGN_OR_RETURN(int64_t id, QueueAttempt(*statements_, db_, cell_id, int64_t{a.number} + 1,
                                               a.id, Now(), "new attempt of cell " + cell_id));
  GH_ASSIGN_OR_RETURN(AttemptRecord again, LoadAttempt(*statements_, id));
  GH_RETURN_IF_ERROR(tx.Commit());
  return std::optional<AttemptRecord>(std::move(again));
}

namespace {

// Binds a file_digests row's key to parameters 1-6: path, size, mtime_ns, ctime_ns, inode and
// device (the unsigned values' bits as SQLite's signed integers).
Stmt& BindFileStamp(Stmt& s, const std::string& path, const FileStamp& stamp) {
  return s.Bind(1, path)
      .Bind(2, stamp.size)
      .Bind(3, stamp.mtime_ns)
      .Bind(4, stamp.ctime_ns)
      .Bind(5, static_cast<int64_t>(stamp.inode))
      .Bind(6, static_cast<int64_t>(stamp.device));
}

}  // namespace

Result<std::optional<std::string>> Store::FindFileDigest(const std::string& path,
                                                         const FileStamp& stamp) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "SELECT sha256 FROM file_digests WHERE path = ? AND size = ? AND mtime_ns = ? AND "
         "ctime_ns = ? AND inode = ? AND device = ?");
  BindFileStamp(s, path, stamp);
  std::optional<std::string> found;
  if (s.Step()) found = s.Text(0);
  GH_RETURN_IF_ERROR(s.status());
  return found;
}

Status Store::RecordFileDigest(const std::string& path, const FileStamp& stamp,
                               const std::string& sha256_hex) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "INSERT OR REPLACE INTO file_digests (path, size, mtime_ns, ctime_ns, inode, device, "
         "sha256, hashed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  BindFileStamp(s, path, stamp).Bind(7, sha256_hex).Bind(8, Now());
  return s.Exec();
}

std::optional<std::string> StoreDigestBook::Find(const std::string& path,
                                                 const FileStamp& stamp) {
  Result<std::optional<std::string>> found = store_.FindFileDigest(path, stamp);
  if (found.ok()) return *found;
  spdlog::warn("file digest of '{}' not read from the store: {}", path,
               found.status().ToString());
  return std::nullopt;
}

void StoreDigestBook::Record(const std::string& path, const FileStamp& stamp,
                             const std::string& sha256_hex) {
  if (Status s = store_.RecordFileDigest(path, stamp, sha256_hex); !s.ok()) {
    spdlog::warn("file digest of '{}' not stored: {}", path, s.ToString());
  }
}

Result<std::vector<QueuedAttempt>> Store::ListQueuedAttempts(bool with_specs) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         with_specs ? "SELECT a.id, a.cell_id, c.spec_json, c.priority, c.submitter, c.repository "
                      "FROM attempts a JOIN cells c ON c.id = a.cell_id "
                      "WHERE a.state = ? ORDER BY a.created_at, a.id"
                    : "SELECT a.id, a.cell_id, '', c.priority, c.submitter, c.repository "
                      "FROM attempts a JOIN cells c ON c.id = a.cell_id "
                      "WHERE a.state = ? ORDER BY a.created_at, a.id");
  s.Bind(1, AttemptStateName(AttemptState::kQueued));
  std::vector<QueuedAttempt> out;
  while (s.Step()) {
    out.push_back({s.Int(0), s.Text(1), s.Text(2), static_cast<int>(s.Int(3)), s.Text(4),
                   s.Text(5)});
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<std::vector<ActiveAttempt>> Store::ListActiveAttempts() {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "SELECT a.agent_id, a.id, a.cell_id, c.submitter, c.repository "
         "FROM attempts a JOIN cells c ON c.id = a.cell_id WHERE a.state IN (?, ?) ORDER BY a.id");
  s.Bind(1, AttemptStateName(AttemptState::kLeased))
      .Bind(2, AttemptStateName(AttemptState::kRunning));
  std::vector<ActiveAttempt> out;
  while (s.Step()) {
    out.push_back({s.Text(0), s.Int(1), s.Text(2), s.Text(3), s.Text(4)});
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<bool> Store::CancelQueued(int64_t attempt_id, const std::string& reason, AttemptState as) {
  if (as != AttemptState::kCancelled && as != AttemptState::kTimedOut &&
      as != AttemptState::kBlocked) {
    return Status::InvalidArgument("a queued attempt stops as cancelled, timed_out or blocked");
  }
  std::lock_guard lock(mu_);
  Stmt s(*statements_, "UPDATE attempts SET state = ?, reason = ?, ended_at = ? WHERE id = ? AND state = ?");
  s.Bind(1, AttemptStateName(as))
      .Bind(2, reason)
      .Bind(3, Now())
      .Bind(4, attempt_id)
      .Bind(5, AttemptStateName(AttemptState::kQueued));
  GH_RETURN_IF_ERROR(s.Exec());
  return sqlite3_changes(db_) > 0;
}

Result<bool> Store::RequestCancel(int64_t attempt_id, const std::string& reason, AttemptState as) {
  if (as != AttemptState::kCancelled && as != AttemptState::kTimedOut) {
    return Status::InvalidArgument("a requested stop ends cancelled or timed_out");
  }
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  GH_ASSIGN_OR_RETURN(AttemptRecord a, LoadAttempt(*statements_, attempt_id));
  if (a.state != AttemptState::kLeased && a.state != AttemptState::kRunning) {
    return Status::FailedPrecondition("attempt " + std::to_string(attempt_id) + " is " +
                                      std::string(AttemptStateName(a.state)) +
                                      ", not leased or running");
  }
  if (!a.cancel_reason.empty()) return false;
  Stmt s(*statements_, "UPDATE attempts SET cancel_reason = ?, cancel_as = ? WHERE id = ?");
  s.Bind(1, reason.empty() ? std::string("cancel requested") : reason)
      .Bind(2, AttemptStateName(as))
      .Bind(3, attempt_id);
  GH_RETURN_IF_ERROR(s.Exec());
  GH_RETURN_IF_ERROR(tx.Commit());
  return true;
}

Result<std::optional<int64_t>> Store::LoseAttempt(int64_t attempt_id, const std::string& reason,
                                                  int retry_limit) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  GH_ASSIGN_OR_RETURN(AttemptRecord a, LoadAttempt(*statements_, attempt_id));
  if (IsTerminal(a.state)) return std::optional<int64_t>();  // ended meanwhile
  // A lost attempt whose stop was requested ends as requested (cancelled or timed_out):
  // nobody wants it run again.
  const bool cancelled = !a.cancel_reason.empty();
  const AttemptState to = cancelled ? a.cancel_as : AttemptState::kLost;
  GH_RETURN_IF_ERROR(CheckTransition(a.id, a.state, to));
  const std::string now = Now();
  {
    Stmt s(*statements_, "UPDATE attempts SET state = ?, reason = ?, ended_at = ? WHERE id = ?");
    s.Bind(1, AttemptStateName(to))
        .Bind(2, cancelled ? a.cancel_reason + "; " + reason : reason)
        .Bind(3, now)
        .Bind(4, attempt_id);
    GH_RETURN_IF_ERROR(s.Exec());
  }
  std::optional<int64_t> retry;
  if (!cancelled) {
    Stmt count(*statements_,
               "SELECT MAX(number), SUM(state = ?) FROM attempts WHERE cell_id = ?");
    count.Bind(1, AttemptStateName(AttemptState::kLost)).Bind(2, a.cell_id);
    if (!count.Step()) {
      GH_RETURN_IF_ERROR(count.status());
      return Status::Internal("attempts of cell " + a.cell_id + ": no row");
    }
    const int64_t last_number = count.Int(0);
    const int64_t lost_so_far = count.Int(1);  // this one included
    if (lost_so_far <= retry_limit) {
      GH_ASSIGN_OR_RETURN(retry, QueueAttempt(*statements_, db_, a.cell_id, last_number + 1,
                                              attempt_id, now,
                                              "retry of attempt " + std::to_string(attempt_id)));
    }
  }
  GH_RETURN_IF_ERROR(tx.Commit());
  return retry;
}

Result<AttemptRecord> Store::RetryCell(const std::string& cell_id) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  GH_ASSIGN_OR_RETURN(AttemptRecord a, LatestAttempt(*statements_, cell_id));
  GH_RETURN_IF_ERROR(CheckRetryable(cell_id, a.number, a.state));
  GH_ASSIGN_OR_RETURN(int64_t id, QueueAttempt(*statements_, db_, cell_id, int64_t{a.number} + 1,
                                               a.id, Now(), "retry of cell " + cell_id));
  GH_ASSIGN_OR_RETURN(AttemptRecord retry, LoadAttempt(*statements_, id));
  GH_RETURN_IF_ERROR(tx.Commit());
  return retry;
}

Result<std::vector<OverdueAttempt>> Store::ListOverdue(const std::string& queued_before,
                                                       const std::string& leased_before,
                                                       const std::string& phase_started_before) {
  std::lock_guard lock(mu_);
  // Only attempts not already being stopped; an empty cutoff disables that limit.
  Stmt s(*statements_,
         "SELECT a.id, a.cell_id, a.state, a.agent_id, a.created_at, a.leased_at, "
         "COALESCE(p.phase, ''), COALESCE(p.started_at, '') "
         "FROM attempts a LEFT JOIN phases p ON p.attempt_id = a.id AND p.status = 'RUNNING' "
         "WHERE a.cancel_reason = '' AND ("
         "(a.state = 'queued' AND ?1 != '' AND a.created_at < ?1) OR "
         "(a.state IN ('leased', 'running') AND ("
         "(?2 != '' AND a.leased_at != '' AND a.leased_at < ?2) OR "
         "(?3 != '' AND p.started_at IS NOT NULL AND p.started_at != '' AND p.started_at < ?3))))"
         " ORDER BY a.id");
  s.Bind(1, queued_before).Bind(2, leased_before).Bind(3, phase_started_before);
  std::vector<OverdueAttempt> out;
  while (s.Step()) {
    OverdueAttempt o;
    o.attempt_id = s.Int(0);
    o.cell_id = s.Text(1);
    GH_ASSIGN_OR_RETURN(o.state, StateColumn(s, 2));
    o.agent_id = s.Text(3);
    if (o.state == AttemptState::kQueued) {
      o.limit = OverdueAttempt::Limit::kQueued;
      o.since = s.Text(4);
    } else if (!leased_before.empty() && !s.Text(5).empty() && s.Text(5) < leased_before) {
      o.limit = OverdueAttempt::Limit::kAttempt;
      o.since = s.Text(5);
    } else {
      o.limit = OverdueAttempt::Limit::kPhase;
      o.phase = s.Text(6);
      o.since = s.Text(7);
    }
    // One row per attempt even if two phases were RUNNING (a lost phase_end).
    if (!out.empty() && out.back().attempt_id == o.attempt_id) continue;
    out.push_back(std::move(o));
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Status Store::LeaseAttempts(const std::vector<Lease>& leases) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  for (const Lease& lease : leases) {
    GH_ASSIGN_OR_RETURN(AttemptRecord a, LoadAttempt(*statements_, lease.attempt_id));
    GH_RETURN_IF_ERROR(CheckTransition(a.id, a.state, AttemptState::kLeased));
    Stmt s(*statements_, "UPDATE attempts SET state = ?, agent_id = ?, leased_at = ? WHERE id = ?");
    s.Bind(1, AttemptStateName(AttemptState::kLeased))
        .Bind(2, lease.agent_id)
        .Bind(3, Now())
        .Bind(4, a.id);
    GH_RETURN_IF_ERROR(s.Exec());
  }
  return tx.Commit();
}

Result<bool> Store::FinishAttempt(int64_t attempt_id, AttemptState to, const std::string& reason) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  GH_ASSIGN_OR_RETURN(AttemptRecord a, LoadAttempt(*statements_, attempt_id));
  if (IsTerminal(a.state)) return false;
  GH_RETURN_IF_ERROR(CheckTransition(a.id, a.state, to));
  Stmt s(*statements_, "UPDATE attempts SET state = ?, reason = ?, ended_at = ? WHERE id = ?");
  s.Bind(1, AttemptStateName(to)).Bind(2, reason).Bind(3, Now()).Bind(4, attempt_id);
  GH_RETURN_IF_ERROR(s.Exec());
  GH_RETURN_IF_ERROR(tx.Commit());
  return true;
}

Result<bool> Store::RecordEvent(int64_t attempt_id, int64_t seq, const std::string& json,
                                const EventEffect& effect) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  GH_ASSIGN_OR_RETURN(AttemptRecord a, LoadAttempt(*statements_, attempt_id));
  const std::string now = Now();
  // An event for an attempt already ended (lost, cancelled, ...) comes from an agent whose
  // lease is gone: stored flagged stale, never applied.
  const bool stale = IsTerminal(a.state);
  {
    Stmt s(*statements_,
           "INSERT OR IGNORE INTO events(attempt_id, seq, json, received_at, stale) "
           "VALUES (?, ?, ?, ?, ?)");
    s.Bind(1, attempt_id).Bind(2, seq).Bind(3, json).Bind(4, now).Bind(5, int64_t{stale ? 1 : 0});
    GH_RETURN_IF_ERROR(s.Exec());
    if (sqlite3_changes(db_) == 0) return false;  // a resend
  }
  using Kind = EventEffect::Kind;
  switch (stale ? Kind::kNone : effect.kind) {
    case Kind::kNone:
      break;
    case Kind::kPhaseStart: {
      Stmt s(
          *statements_,
          "INSERT INTO phases(attempt_id, phase, status, started_at) VALUES (?, ?, 'RUNNING', ?) "
          "ON CONFLICT(attempt_id, phase) DO UPDATE SET status = 'RUNNING', "
          "started_at = excluded.started_at");
      s.Bind(1, attempt_id).Bind(2, effect.phase).Bind(3, now);
      GH_RETURN_IF_ERROR(s.Exec());
      if (IsAllowedTransition(a.state, AttemptState::kRunning)) {
        Stmt u(*statements_, "UPDATE attempts SET state = ?, started_at = ? WHERE id = ?");
        u.Bind(1, AttemptStateName(AttemptState::kRunning)).Bind(2, now).Bind(3, attempt_id);
        GH_RETURN_IF_ERROR(u.Exec());
      }
      break;
    }
    case Kind::kFigure: {
      Stmt s(
          *statements_,
          "INSERT INTO figures(attempt_id, phase, name, value_json, unit) VALUES (?, ?, ?, ?, ?)");
      s.Bind(1, attempt_id)
          .Bind(2, effect.phase)
          .Bind(3, effect.name)
          .Bind(4, effect.value_json)
          .Bind(5, effect.unit);
      GH_RETURN_IF_ERROR(s.Exec());
      break;
    }
    case Kind::kPhaseEnd: {
      Stmt s(*statements_,
             "INSERT INTO phases(attempt_id, phase, status, reason, classification, ended_at, "
             "duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?) "
             "ON CONFLICT(attempt_id, phase) DO UPDATE SET status = excluded.status, "
             "reason = excluded.reason, classification = excluded.classification, "
             "ended_at = excluded.ended_at, duration_ms = excluded.duration_ms");
      s.Bind(1, attempt_id)
          .Bind(2, effect.phase)
          .Bind(3, effect.status)
          .Bind(4, effect.reason)
          .Bind(5, effect.classification)
          .Bind(6, now)
          .Bind(7, effect.duration_ms);
      GH_RETURN_IF_ERROR(s.Exec());
      break;
    }
    case Kind::kRunEnd: {
      Stmt s(*statements_, "UPDATE attempts SET run_status = ? WHERE id = ?");
      s.Bind(1, effect.status).Bind(2, attempt_id);
      GH_RETURN_IF_ERROR(s.Exec());
      break;
    }
  }
  GH_RETURN_IF_ERROR(tx.Commit());
  return true;
}

Result<std::vector<PhaseRecord>> Store::ListPhases(int64_t attempt_id) {
  std::lock_guard lock(mu_);
  std::vector<PhaseRecord> out;
  std::map<std::string, size_t> index;
  {
    Stmt s(*statements_,
           "SELECT phase, status, reason, classification, started_at, ended_at, duration_ms "
           "FROM phases WHERE attempt_id = ?");
    s.Bind(1, attempt_id);
    while (s.Step()) {
      PhaseRecord p;
      p.phase = s.Text(0);
      p.status = s.Text(1);
      p.reason = s.Text(2);
      p.classification = s.Text(3);
      p.started_at = s.Text(4);
      p.ended_at = s.Text(5);
      if (!s.IsNull(6)) p.duration_ms = s.Int(6);
      index[p.phase] = out.size();
      out.push_back(std::move(p));
    }
    GH_RETURN_IF_ERROR(s.status());
  }
  Stmt f(*statements_, "SELECT phase, name, value_json, unit FROM figures WHERE attempt_id = ? ORDER BY id");
  f.Bind(1, attempt_id);
  while (f.Step()) {
    std::string phase = f.Text(0);
    auto it = index.find(phase);
    if (it == index.end()) {  // a figure for a phase that never started: show it anyway
      PhaseRecord p;
      p.phase = phase;
      p.status = "RUNNING";
      it = index.emplace(phase, out.size()).first;
      out.push_back(std::move(p));
    }
    out[it->second].figures.push_back({f.Text(1), f.Text(2), f.Text(3)});
  }
  GH_RETURN_IF_ERROR(f.status());
  return out;
}

Result<bool> Store::AppendLog(int64_t attempt_id, const std::string& stream, int64_t offset,
                              const std::string& data) {
  std::lock_guard lock(mu_);
  // stale = 1 when the attempt has already ended (a terminal state), in the same statement.
  Stmt s(*statements_,
         "INSERT OR IGNORE INTO logs(attempt_id, stream, offset, data, stale) VALUES (?, ?, ?, ?, "
         "COALESCE((SELECT state IN ('passed', 'failed', 'error', 'lost', 'cancelled', "
         "'timed_out') FROM attempts WHERE id = ?), 0))");
  s.Bind(1, attempt_id).Bind(2, stream).Bind(3, offset).BindBlob(4, data).Bind(5, attempt_id);
  GH_RETURN_IF_ERROR(s.Exec());
  return sqlite3_changes(db_) > 0;
}

Result<std::string> Store::ReadLog(int64_t attempt_id, const std::string& stream, int64_t from) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "SELECT offset, data FROM logs WHERE attempt_id = ? AND stream = ? "
         "AND offset + length(data) > ? ORDER BY offset");
  s.Bind(1, attempt_id).Bind(2, stream).Bind(3, from);
  std::string out;
  while (s.Step()) {
    const int64_t offset = s.Int(0);
    const std::string data = s.Blob(1);
    // Offsets are contiguous per stream (docs/protocols.md §3.1): only the first chunk can
    // start before `from`.
    out += offset < from ? data.substr(static_cast<size_t>(from - offset)) : data;
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<std::vector<MatrixSquare>> Store::Matrix(const MatrixFilter& f) {
  std::lock_guard lock(mu_);
  // One group per square; with a single max() SQLite takes the bare columns from the row that
  // holds the max, i.e. the newest cell (https://sqlite.org/lang_select.html, "bare columns").
  // The cells_matrix index covers every column read here. The newest attempt of that cell is
  // looked up once (its id), then its state by primary key.
  Stmt s(*statements_,
         "SELECT g.*, a.state, a.id FROM (SELECT model_family, checkpoint_path, "
         "checkpoint_digest, device, precision, tp, dp, pp, ep, dp_shard, cp, etp, mode, id, "
         "repository, branch, commit_sha, max(created_at), count(*), (SELECT a.id FROM attempts a WHERE a.cell_id = "
         "c.id ORDER BY a.number DESC LIMIT 1) AS last_attempt "
         "FROM cells c WHERE kind = '' AND hidden <= ?5 "
         "AND (?1 = '' OR repository = ?1) AND (?2 = '' OR branch = ?2) "
         "AND (?3 = '' OR commit_sha = ?3) AND (?4 = '' OR model_family = ?4) "
         // Designated branches: both sets are read once (uncorrelated), each cell's branches
         // through cell_branches' primary key.
         "AND (?6 = 0 OR repository NOT IN (SELECT value FROM json_each(?7)) OR EXISTS "
         "(SELECT 1 FROM cell_branches b WHERE b.cell_id = c.id AND (c.repository, b.branch) IN "
         "(SELECT json_extract(d.value, '$[0]'), json_extract(d.value, '$[1]') "
         "FROM json_each(?8) d))) "
         "GROUP BY model_family, checkpoint_digest, device, precision, tp, dp, pp, ep, dp_shard, "
         "cp, etp, mode) g "
         "LEFT JOIN attempts a ON a.id = g.last_attempt "
         "ORDER BY g.model_family, g.checkpoint_path, g.checkpoint_digest, g.device, g.precision, "
         "g.tp, g.dp, g.pp, g.ep, g.dp_shard, g.cp, g.etp, g.mode");
  nlohmann::json restricted = nlohmann::json::array(), designated = nlohmann::json::array();
  if (f.designated) {
    restricted = f.designated->restricted;
    for (const auto& [repository, branch] : f.designated->designated) {
      designated.push_back({repository, branch});
    }
  }
  s.Bind(1, f.repository).Bind(2, f.branch).Bind(3, f.commit).Bind(4, f.model_family)
      .Bind(5, int64_t{f.include_hidden ? 1 : 0})
      .Bind(6, int64_t{f.designated ? 1 : 0})
      .Bind(7, restricted.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
      .Bind(8, designated.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  std::vector<MatrixSquare> out;
  while (s.Step()) {
    MatrixSquare q;
    q.model_family = s.Text(0);
    q.checkpoint_path = s.Text(1);
    q.checkpoint_digest = s.Text(2);
    q.device = s.Text(3);
    q.precision = s.Text(4);
    q.topology.tp = s.Int(5);
    q.topology.dp = s.Int(6);
    q.topology.pp = s.Int(7);
    q.topology.ep = s.Int(8);
    q.topology.dp_shard = s.Int(9);
    q.topology.cp = s.Int(10);
    q.topology.etp = s.Int(11);
    q.mode = s.Text(12);
    q.cell_id = s.Text(13);
    q.repository = s.Text(14);
    q.branch = s.Text(15);
    q.commit_sha = s.Text(16);
    q.created_at = s.Text(17);
    q.cells = s.Int(18);
    GH_ASSIGN_OR_RETURN(q.status, StateColumn(s, 20));
    q.attempt_id = s.Int(21);
    out.push_back(std::move(q));
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<MatrixChoices> Store::ListMatrixChoices() {
  std::lock_guard lock(mu_);
  MatrixChoices out;
  Stmt r(*statements_,
         "SELECT DISTINCT repository, branch FROM cells WHERE kind = '' ORDER BY repository, branch");
  while (r.Step()) {
    std::string repository = r.Text(0);
    if (out.repositories.empty() || out.repositories.back().first != repository) {
      out.repositories.push_back({repository, {}});
    }
    out.repositories.back().second.push_back(r.Text(1));
  }
  GH_RETURN_IF_ERROR(r.status());
  Stmt m(*statements_, "SELECT DISTINCT model_family FROM cells WHERE kind = '' ORDER BY model_family");
  while (m.Step()) out.model_families.push_back(m.Text(0));
  GH_RETURN_IF_ERROR(m.status());
  return out;
}

Result<std::vector<std::string>> Store::ListLogStreams(int64_t attempt_id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, "SELECT DISTINCT stream FROM logs WHERE attempt_id = ? ORDER BY stream");
  s.Bind(1, attempt_id);
  std::vector<std::string> out;
  while (s.Step()) out.push_back(s.Text(0));
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Status Store::UpsertAgent(const AgentRecord& agent) {
  std::lock_guard lock(mu_);
  const std::string now = Now();
  Stmt s(*statements_,
         "INSERT INTO agents(id, name, capabilities_json, registered_at, last_heartbeat_at, state) "
         "VALUES (?, ?, ?, ?, ?, 'connected') ON CONFLICT(id) DO UPDATE SET name = excluded.name, "
         "capabilities_json = excluded.capabilities_json, registered_at = excluded.registered_at, "
         "last_heartbeat_at = excluded.last_heartbeat_at, state = 'connected'");
  s.Bind(1, agent.id)
      .Bind(2, agent.name)
      .Bind(3, agent.capabilities_json)
      .Bind(4, now)
      .Bind(5, now);
  return s.Exec();
}

Status Store::TouchAgent(const std::string& agent_id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, "UPDATE agents SET last_heartbeat_at = ? WHERE id = ?");
  s.Bind(1, Now()).Bind(2, agent_id);
  return s.Exec();
}

Status Store::SetAgentState(const std::string& agent_id, const std::string& state) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, "UPDATE agents SET state = ? WHERE id = ?");
  s.Bind(1, state).Bind(2, agent_id);
  return s.Exec();
}

Result<std::vector<AgentRecord>> Store::ListAgents() {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "SELECT id, name, capabilities_json, registered_at, last_heartbeat_at, state "
         "FROM agents ORDER BY id");
  std::vector<AgentRecord> out;
  while (s.Step()) {
    out.push_back(AgentRecord{s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Text(4), s.Text(5)});
  }
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<AgentRecord> Store::GetAgent(const std::string& agent_id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_,
         "SELECT id, name, capabilities_json, registered_at, last_heartbeat_at, state "
         "FROM agents WHERE id = ?");
  s.Bind(1, agent_id);
  if (!s.Step()) {
    GH_RETURN_IF_ERROR(s.status());
    return Status::NotFound("agent '" + agent_id + "' not found");
  }
  return AgentRecord{s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Text(4), s.Text(5)};
}

namespace {

constexpr char kTokenColumns[] =
    "id, name, kind, scopes, created_at, COALESCE(last_used_at, ''), COALESCE(revoked_at, '')";

TokenRecord TokenFromRow(const Stmt& s) {
  return TokenRecord{s.Int(0), s.Text(1), s.Text(2), s.Text(3), s.Text(4), s.Text(5), s.Text(6)};
}

Result<TokenRecord> LoadToken(StatementCache& db, int64_t token_id) {
  Stmt s(db, std::string("SELECT ") + kTokenColumns + " FROM tokens WHERE id = ?");
  s.Bind(1, token_id);
  if (!s.Step()) {
    GH_RETURN_IF_ERROR(s.status());
    return Status::NotFound("token " + std::to_string(token_id) + " not found");
  }
  return TokenFromRow(s);
}

}  // namespace

Result<TokenRecord> Store::CreateToken(const TokenRecord& token, const std::string& sha256_hex) {
  std::lock_guard lock(mu_);
  Transaction tx(*statements_);
  GH_RETURN_IF_ERROR(tx.begin_status());
  {
    Stmt active(*statements_, "SELECT 1 FROM tokens WHERE name = ? AND revoked_at IS NULL");
    active.Bind(1, token.name);
    if (active.Step()) {
      return Status::AlreadyExists("an active token is named '" + token.name + "'");
    }
    GH_RETURN_IF_ERROR(active.status());
  }
  Stmt s(*statements_,
         "INSERT INTO tokens(name, kind, scopes, token_sha256, created_at) VALUES (?, ?, ?, ?, ?)");
  s.Bind(1, token.name).Bind(2, token.kind).Bind(3, token.scopes).Bind(4, sha256_hex).Bind(5, Now());
  GH_RETURN_IF_ERROR(s.Exec());
  auto stored = LoadToken(*statements_, sqlite3_last_insert_rowid(db_));
  if (!stored.ok()) return stored.status();
  GH_RETURN_IF_ERROR(tx.Commit());
  return stored;
}

Result<std::optional<TokenRecord>> Store::FindToken(const std::string& sha256_hex) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, std::string("SELECT ") + kTokenColumns + " FROM tokens WHERE token_sha256 = ?");
  s.Bind(1, sha256_hex);
  if (!s.Step()) {
    GH_RETURN_IF_ERROR(s.status());
    return std::optional<TokenRecord>();
  }
  return std::optional<TokenRecord>(TokenFromRow(s));
}

Result<std::vector<TokenRecord>> Store::ListTokens() {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, std::string("SELECT ") + kTokenColumns + " FROM tokens ORDER BY id");
  std::vector<TokenRecord> out;
  while (s.Step()) out.push_back(TokenFromRow(s));
  GH_RETURN_IF_ERROR(s.status());
  return out;
}

Result<TokenRecord> Store::RevokeToken(int64_t token_id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, "UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL");
  s.Bind(1, Now()).Bind(2, token_id);
  GH_RETURN_IF_ERROR(s.Exec());
  return LoadToken(*statements_, token_id);
}

Status Store::TouchToken(int64_t token_id) {
  std::lock_guard lock(mu_);
  Stmt s(*statements_, "UPDATE tokens SET last_used_at = ? WHERE id = ?");
  s.Bind(1, Now()).Bind(2, token_id);
  return s.Exec();
}

}  // namespace gatehouse::controller
