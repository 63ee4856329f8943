// The SQLite plumbing the store's files share: the connection's statement cache, a prepared
// statement with typed binds and reads, a transaction, and the column readers every table
// needs. Used under Store::mu_ only; not thread-safe.
#pragma once

#include <sqlite3.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "controller/records.h"

namespace gatehouse::controller {

inline Status SqliteError(sqlite3* db, std::string_view what) {
  return Status::Internal(std::string(what) + ": " + sqlite3_errmsg(db));
}

/// The connection's prepared statements, kept and reused by SQL text: preparing every
/// statement anew was about 18% of the controller's CPU under the load bench
/// (tools/loadbench). A statement whose cached copy is in use (a nested Stmt of the same SQL)
/// is prepared afresh and finalized after use. Not thread-safe; used under Store::mu_.
class StatementCache {
 public:
  explicit StatementCache(sqlite3* db) : db_(db) {}
  ~StatementCache() {
    for (auto& [sql, entry] : cache_) sqlite3_finalize(entry.stmt);
  }
  StatementCache(const StatementCache&) = delete;
  StatementCache& operator=(const StatementCache&) = delete;

  sqlite3* db() const { return db_; }

  /// A cached statement's entry; its `in_use` is set while a Stmt holds it.
  struct Entry {
    sqlite3_stmt* stmt = nullptr;
    bool in_use = false;
  };

  /// A statement for `sql` ready to bind, or null with the SQLite error code in `rc`.
  /// `entry` is the cache entry it belongs to, or null for a one-off copy (the cached one was
  /// in use); pass both to Release.
  sqlite3_stmt* Acquire(std::string_view sql, int* rc, Entry** entry) {
    *entry = nullptr;
    auto it = cache_.find(sql);
    if (it != cache_.end() && !it->second.in_use) {
      it->second.in_use = true;
      *rc = SQLITE_OK;
      *entry = &it->second;
      return it->second.stmt;
    }
    sqlite3_stmt* stmt = nullptr;
    const bool keep = it == cache_.end();
    *rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                             keep ? SQLITE_PREPARE_PERSISTENT : 0, &stmt, nullptr);
    if (*rc != SQLITE_OK) {
      sqlite3_finalize(stmt);
      return nullptr;
    }
    if (keep) *entry = &cache_.emplace(std::string(sql), Entry{stmt, true}).first->second;
    return stmt;
  }

  /// Returns `stmt` from Acquire: reset with its bindings cleared when cached (`entry`), else
  /// finalized.
  static void Release(sqlite3_stmt* stmt, Entry* entry) {
    if (entry == nullptr) {
      sqlite3_finalize(stmt);
      return;
    }
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    entry->in_use = false;
  }

 private:
  sqlite3* db_;
  std::map<std::string, Entry, std::less<>> cache_;  // node-based: entries never move
};

/// A prepared statement (from the connection's StatementCache) with positional binds (1-based)
/// and typed column reads (0-based). Not thread-safe; used under Store::mu_.
class Stmt {
 public:
  Stmt(StatementCache& cache, std::string_view sql) : db_(cache.db()) {
    stmt_ = cache.Acquire(sql, &rc_, &entry_);
    if (rc_ != SQLITE_OK) error_ = SqliteError(db_, "prepare '" + std::string(sql) + "'");
  }
  ~Stmt() { StatementCache::Release(stmt_, entry_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& Bind(int i, std::string_view v) {
    if (ok())
      Check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  Stmt& BindBlob(int i, std::string_view v) {
    if (ok())
      Check(sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  Stmt& Bind(int i, int64_t v) {
    if (ok()) Check(sqlite3_bind_int64(stmt_, i, v));
    return *this;
  }
  Stmt& Bind(int i, std::optional<int64_t> v) {
    if (!ok()) return *this;
    if (v) return Bind(i, *v);
    Check(sqlite3_bind_null(stmt_, i));
    return *this;
  }

  /// Steps once. Returns true while a row is available; false when done or on error (see
  /// status()).
  bool Step() {
    if (!ok()) return false;
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) error_ = SqliteError(db_, "step");
    return false;
  }
  /// Runs a statement that returns no row.
  Status Exec() {
    while (Step()) {
    }
    return error_;
  }

  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    int n = sqlite3_column_bytes(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n))
             : std::string();
  }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    int n = sqlite3_column_bytes(stmt_, col);
    return p ? std::string(static_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

  bool ok() const { return error_.ok(); }
  const Status& status() const { return error_; }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK) error_ = SqliteError(db_, "bind");
  }
  sqlite3* db_;
  StatementCache::Entry* entry_ = nullptr;  // null: a one-off statement
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
  Status error_;
};

inline Status ExecSql(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return Status::Internal(std::string("'") + sql + "': " + msg);
  }
  return Status::Ok();
}

/// BEGIN IMMEDIATE on construction; ROLLBACK on destruction unless Commit() succeeded.
/// The three statements are prepared once (StatementCache), like every other.
class Transaction {
 public:
  explicit Transaction(StatementCache& cache) : cache_(cache) {
    begin_ = Stmt(cache, "BEGIN IMMEDIATE").Exec();
  }
  ~Transaction() {
    if (begin_.ok() && !committed_) (void)Stmt(cache_, "ROLLBACK").Exec();
  }
  Status begin_status() const { return begin_; }
  Status Commit() {
    GH_RETURN_IF_ERROR(Stmt(cache_, "COMMIT").Exec());
    committed_ = true;
    return Status::Ok();
  }

 private:
  StatementCache& cache_;
  Status begin_;
  bool committed_ = false;
};

inline Result<AttemptState> StateColumn(const Stmt& s, int col) {
  std::string name = s.Text(col);
  auto state = ParseAttemptState(name);
  if (!state) return Status::DataLoss("unknown attempt state '" + name + "' in the database");
  return *state;
}

}  // namespace gatehouse::controller
