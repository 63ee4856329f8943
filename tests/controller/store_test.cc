// Verifies the SQLite store: migrations applied once and recorded, cells created with their
// first attempt atomically, idempotent events and log chunks, and all-or-nothing writes.
#include "controller/store/store.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include <atomic>
#include <map>
#include <vector>

#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

using testing::TempDir;

// A clock that advances one millisecond per reading, so order is deterministic.
Clock SteppingClock() {
  auto t = std::make_shared<std::atomic<int64_t>>(1'700'000'000'000);
  return [t] {
    return std::chrono::system_clock::time_point(std::chrono::milliseconds(t->fetch_add(1)));
  };
}

CellRecord MakeCell(const std::string& id) { return testing::MakeCellRecord(id); }

// Runs SQL on a second connection to the same file (to plant failures, as a test would).
void ExecOnFile(const std::filesystem::path& db, const std::string& sql) {
  sqlite3* conn = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &conn), SQLITE_OK);
  char* err = nullptr;
  int rc = sqlite3_exec(conn, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(conn);
}

EventEffect PhaseStart(const std::string& phase) {
  EventEffect e;
  e.kind = EventEffect::Kind::kPhaseStart;
  e.phase = phase;
  return e;
}

EventEffect Figure(const std::string& phase, const std::string& name, const std::string& value) {
  EventEffect e;
  e.kind = EventEffect::Kind::kFigure;
  e.phase = phase;
  e.name = name;
  e.value_json = value;
  e.unit = "count";
  return e;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = Store::Open(db_path(), SteppingClock());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }
  std::filesystem::path db_path() const { return dir_.path() / "gatehouse.db"; }

  // Creates a cell and leases its attempt 1 to "agent-1"; returns the attempt id.
  int64_t LeasedAttempt(const std::string& cell_id) {
    EXPECT_TRUE(*store_->CreateCellIfAbsent(MakeCell(cell_id)));
    auto attempts = *store_->ListAttempts(cell_id);
    EXPECT_TRUE(store_->LeaseAttempts({{attempts.at(0).id, "agent-1"}}).ok());
    return attempts.at(0).id;
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, MigrationsAreAppliedOnceAndRecorded) {
  // Verifies migrations are recorded once, skipped on reopen, and a new one is applied once.
  auto applied = store_->AppliedMigrations();
  ASSERT_TRUE(applied.ok());
  ASSERT_EQ(applied->size(), EmbeddedMigrations().size());
  EXPECT_EQ(applied->at(0).version, 1);
  EXPECT_EQ(applied->at(0).name, "initial");
  const std::string first_applied_at = applied->at(0).applied_at;
  ASSERT_TRUE(store_->CreateCellIfAbsent(MakeCell("c1")).ok());
  store_.reset();

  // Reopening skips what is recorded (re-running 0001 would fail: its tables exist) and
  // applies a new migration once.
  std::vector<Migration> more(EmbeddedMigrations().begin(), EmbeddedMigrations().end());
  const int next = static_cast<int>(more.size()) + 1;
  more.push_back({next, "extra", "CREATE TABLE extra (x INTEGER);"});
  for (int round = 0; round < 2; ++round) {
    auto reopened = Store::Open(db_path(), SteppingClock(), more);
    ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
    auto rows = *(*reopened)->AppliedMigrations();
    ASSERT_EQ(rows.size(), more.size());
    EXPECT_EQ(rows[0].applied_at, first_applied_at);
    EXPECT_EQ(rows.back().version, next);
    EXPECT_TRUE((*(*reopened)->GetCell("c1")).has_value());  // data kept
  }
}

TEST_F(StoreTest, AFailingMigrationLeavesNothingBehind) {
  // Verifies a failing migration rolls back whole and is not recorded.
  store_.reset();
  std::vector<Migration> more(EmbeddedMigrations().begin(), EmbeddedMigrations().end());
  const int next = static_cast<int>(more.size()) + 1;
  more.push_back({next, "broken", "CREATE TABLE half (x INTEGER); THIS IS NOT SQL;"});
  auto broken = Store::Open(db_path(), SteppingClock(), more);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find(std::to_string(next) + "_broken"), std::string::npos)
      << broken.status().message();
  // Not recorded, and its first statement rolled back: the fixed migration applies cleanly.
  more.back() = {next, "broken", "CREATE TABLE half (x INTEGER);"};
  auto fixed = Store::Open(db_path(), SteppingClock(), more);
  ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
  EXPECT_EQ((*(*fixed)->AppliedMigrations()).size(), more.size());
}

TEST_F(StoreTest, FileDigestsAreFoundOnlyForTheirExactStamp) {
  // Verifies a recorded file digest is found for the same path and stamp only (each stamp
  // field, inode and device past 2^63 included) and that recording a path again replaces it.
  const FileStamp stamp{12, 1'700'000'000'123'456'789, 1'700'000'001'000'000'000,
                        uint64_t{1} << 63 | 5, ~uint64_t{0}};
  ASSERT_TRUE(store_->RecordFileDigest("/data/x/model.safetensors", stamp, "ab12").ok());
  EXPECT_EQ(store_->FindFileDigest("/data/x/model.safetensors", stamp).value(), "ab12");
  EXPECT_FALSE(store_->FindFileDigest("/data/y/model.safetensors", stamp)->has_value());
  for (int field = 0; field < 5; ++field) {
    FileStamp other = stamp;
    if (field == 0) other.size += 1;
    if (field == 1) other.mtime_ns += 1;
    if (field == 2) other.ctime_ns += 1;
    if (field == 3) other.inode += 1;
    if (field == 4) other.device -= 1;
    EXPECT_FALSE(store_->FindFileDigest("/data/x/model.safetensors", other)->has_value())
        << "field " << field;
  }
  FileStamp rewritten = stamp;
  rewritten.mtime_ns += 10;
  ASSERT_TRUE(store_->RecordFileDigest("/data/x/model.safetensors", rewritten, "cd34").ok());
  EXPECT_EQ(store_->FindFileDigest("/data/x/model.safetensors", rewritten).value(), "cd34");
  EXPECT_FALSE(store_->FindFileDigest("/data/x/model.safetensors", stamp)->has_value());
}

TEST_F(StoreTest, CreatesACellWithAQueuedFirstAttemptOnce) {
  // Verifies a cell is stored once, with attempt 1 queued.
  EXPECT_TRUE(*store_->CreateCellIfAbsent(MakeCell("c1")));
  EXPECT_FALSE(*store_->CreateCellIfAbsent(MakeCell("c1")));
  auto cell = *store_->GetCell("c1");
  ASSERT_TRUE(cell.has_value());
  EXPECT_EQ(cell->branch, "main");
  EXPECT_EQ(cell->submitter, "ci");
  auto attempts = *store_->ListAttempts("c1");
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0].number, 1);
  EXPECT_EQ(attempts[0].state, AttemptState::kQueued);
  EXPECT_FALSE((*store_->GetCell("absent")).has_value());
}

TEST_F(StoreTest, ListsCellsNewestFirstWithTheirStatus) {
  // Verifies cells list newest first with the latest attempt's state.
  ASSERT_TRUE(store_->CreateCellIfAbsent(MakeCell("old")).ok());
  ASSERT_TRUE(store_->CreateCellIfAbsent(MakeCell("new")).ok());
  auto cells = *store_->ListCells(10, 0);
  ASSERT_EQ(cells.size(), 2u);
  EXPECT_EQ(cells[0].cell.id, "new");
  EXPECT_EQ(cells[1].cell.id, "old");
  EXPECT_EQ(cells[0].status, AttemptState::kQueued);
  EXPECT_EQ((*store_->ListCells(1, 1)).at(0).cell.id, "old");
}

TEST_F(StoreTest, ACreateThatFailsHalfwayStoresNothing) {
  // Verifies a cell whose attempt insert fails (after the cell row) is not stored at all.
  ExecOnFile(db_path(),
             "CREATE TRIGGER fail_attempts BEFORE INSERT ON attempts "
             "BEGIN SELECT RAISE(ABORT, 'injected failure'); END;");
  auto created = store_->CreateCellIfAbsent(MakeCell("c1"));
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.status().message().find("injected failure"), std::string::npos);
  EXPECT_FALSE((*store_->GetCell("c1")).has_value());
  EXPECT_TRUE((*store_->ListCells(10, 0)).empty());
  // Once the cause is gone the same cell is created whole.
  ExecOnFile(db_path(), "DROP TRIGGER fail_attempts;");
  EXPECT_TRUE(*store_->CreateCellIfAbsent(MakeCell("c1")));
  EXPECT_EQ((*store_->ListAttempts("c1")).size(), 1u);
}

TEST_F(StoreTest, EventsAreIdempotentBySequenceNumber) {
  // Verifies a resent (attempt, seq) is ignored and phase events update the phase row.
  const int64_t id = LeasedAttempt("c1");
  EXPECT_TRUE(
      *store_->RecordEvent(id, 1, R"({"event":"phase_start","phase":"load"})", PhaseStart("load")));
  EXPECT_EQ((*store_->GetAttempt(id)).state, AttemptState::kRunning);
  EXPECT_TRUE(*store_->RecordEvent(id, 2, "{}", Figure("load", "keys_used", "21")));
  // A reconnecting agent resends both; nothing is applied twice.
  EXPECT_FALSE(*store_->RecordEvent(id, 1, "{}", PhaseStart("load")));
  EXPECT_FALSE(*store_->RecordEvent(id, 2, "{}", Figure("load", "keys_used", "21")));
  auto phases = *store_->ListPhases(id);
  ASSERT_EQ(phases.size(), 1u);
  EXPECT_EQ(phases[0].status, "RUNNING");
  ASSERT_EQ(phases[0].figures.size(), 1u);
  EXPECT_EQ(phases[0].figures[0].value_json, "21");

  EventEffect end;
  end.kind = EventEffect::Kind::kPhaseEnd;
  end.phase = "load";
  end.status = "FAIL";
  end.reason = "missing key lm_head.weight";
  end.classification = "adapter_contract";
  end.duration_ms = 12;
  EXPECT_TRUE(*store_->RecordEvent(id, 3, "{}", end));
  phases = *store_->ListPhases(id);
  EXPECT_EQ(phases[0].status, "FAIL");
  EXPECT_EQ(phases[0].classification, "adapter_contract");
  EXPECT_EQ(phases[0].duration_ms, 12);

  EXPECT_EQ(store_->RecordEvent(9999, 1, "{}", EventEffect{}).status().code(),
            StatusCode::kNotFound);
}

TEST_F(StoreTest, AnEventThatFailsHalfwayIsNotRememberedAsSeen) {
  // Verifies an event whose effect fails is rolled back, so its resend is applied.
  const int64_t id = LeasedAttempt("c1");
  ExecOnFile(db_path(),
             "CREATE TRIGGER fail_figures BEFORE INSERT ON figures "
             "BEGIN SELECT RAISE(ABORT, 'injected failure'); END;");
  EXPECT_FALSE(store_->RecordEvent(id, 1, "{}", Figure("load", "keys", "1")).ok());
  ExecOnFile(db_path(), "DROP TRIGGER fail_figures;");
  // The resend is applied: the failed attempt did not store seq 1.
  EXPECT_TRUE(*store_->RecordEvent(id, 1, "{}", Figure("load", "keys", "1")));
  EXPECT_EQ((*store_->ListPhases(id)).at(0).figures.size(), 1u);
}

TEST_F(StoreTest, LogChunksKeepOffsetOrderAndIgnoreResends) {
  // Verifies log chunks concatenate in offset order per stream and resent offsets are ignored.
  const int64_t id = LeasedAttempt("c1");
  EXPECT_TRUE(*store_->AppendLog(id, "worker", 6, "world\n"));
  EXPECT_TRUE(*store_->AppendLog(id, "worker", 0, "hello "));
  EXPECT_FALSE(*store_->AppendLog(id, "worker", 0, "hello "));
  EXPECT_TRUE(*store_->AppendLog(id, "build", 0, "cmake\n"));
  EXPECT_EQ(*store_->ReadLog(id, "worker"), "hello world\n");
  EXPECT_EQ(*store_->ReadLog(id, "build"), "cmake\n");
  EXPECT_EQ(*store_->ReadLog(id, "none"), "");
  EXPECT_EQ(*store_->ListLogStreams(id), (std::vector<std::string>{"build", "worker"}));
  EXPECT_TRUE(store_->ListLogStreams(id + 1000)->empty());
}

TEST_F(StoreTest, ALogIsReadFromAnyByteOffset) {
  // Verifies a live log can be followed: from an offset inside a chunk, at a boundary, past the
  // end.
  const int64_t id = LeasedAttempt("c1");
  ASSERT_TRUE(store_->AppendLog(id, "worker", 0, "hello ").ok());
  ASSERT_TRUE(store_->AppendLog(id, "worker", 6, "world\n").ok());
  EXPECT_EQ(*store_->ReadLog(id, "worker", 3), "lo world\n");
  EXPECT_EQ(*store_->ReadLog(id, "worker", 6), "world\n");
  EXPECT_EQ(*store_->ReadLog(id, "worker", 12), "");
  EXPECT_EQ(*store_->ReadLog(id, "worker", 100), "");
}

/// A validation cell record whose spec has the matrix's members (migrations/0011_matrix.sql).
CellRecord MatrixCell(const std::string& id, const std::string& family, const std::string& precision,
                      int tp, const std::string& branch, const std::string& commit,
                      const std::string& kind = "") {
  CellRecord c = MakeCell(id);
  nlohmann::json spec = {{"model_family", family},
                         {"checkpoint", {{"path", "/ckpt/" + family}, {"digest", "sha256:" + family}}},
                         {"runtime", {{"torch", "2.11.0"}, {"device", "cpu"}}},
                         {"topology", {{"tp", tp}, {"dp", 1}, {"pp", 1}, {"ep", 1}}},
                         {"precision", precision},
                         {"mode", "eager"},
                         {"id", id}};
  if (!kind.empty()) spec["kind"] = kind;
  c.spec_json = spec.dump();
  c.model_family = family;
  c.branch = branch;
  c.commit_sha = commit;
  return c;
}

TEST_F(StoreTest, MeshDimensionsMakeSquaresOfTheirOwn) {
  // Verifies the matrix tells apart cells that differ only in dp_shard, cp or etp (frozen only
  // when not 1; migrations/0015_matrix_mesh.sql), and reads them back into the square.
  const std::string c1(40, '1');
  CellRecord plain = MatrixCell("p", "llama", "fp32", 2, "main", c1);
  CellRecord fsdp = MatrixCell("f", "llama", "fp32", 2, "main", c1);
  CellRecord cp = MatrixCell("c", "llama", "fp32", 2, "main", c1);
  for (auto& [cell, extra] : {std::pair<CellRecord*, nlohmann::json>{&fsdp, {{"dp_shard", 2}}},
                              {&cp, {{"cp", 2}, {"ep", 2}, {"etp", 2}}}}) {
    nlohmann::json spec = nlohmann::json::parse(cell->spec_json);
    spec["topology"].update(extra);
    cell->spec_json = spec.dump();
  }
  for (const CellRecord& c : {plain, fsdp, cp}) ASSERT_TRUE(*store_->CreateCellIfAbsent(c));
  auto squares = store_->Matrix({});
  ASSERT_TRUE(squares.ok()) << squares.status().ToString();
  ASSERT_EQ(squares->size(), 3u);
  std::map<std::string, CellSpec::Topology> by_cell;
  for (const MatrixSquare& q : *squares) by_cell[q.cell_id] = q.topology;
  EXPECT_EQ(by_cell["p"].dp_shard, 1);
  EXPECT_EQ(by_cell["f"].dp_shard, 2);
  EXPECT_EQ(by_cell["c"].cp, 2);
  EXPECT_EQ(by_cell["c"].etp, 2);
  EXPECT_EQ(by_cell["c"].tp, 2);
}

TEST_F(StoreTest, TheMatrixHoldsTheNewestCellOfEachSquare) {
  // Verifies Store::Matrix: one square per family x checkpoint x device x precision x topology x
  // mode, the newest cell of the filter's cells with its latest attempt's state and the count;
  // reference cells are left out; the choices list repositories, branches and families.
  const std::string c1(40, '1'), c2(40, '2');
  for (const CellRecord& c :
       {MatrixCell("a", "llama", "fp32", 1, "main", c1), MatrixCell("b", "llama", "bf16", 1, "main", c1),
        MatrixCell("c", "llama", "fp32", 1, "dev", c2), MatrixCell("d", "llama", "fp32", 2, "main", c1),
        MatrixCell("e", "qwen3", "fp32", 1, "main", c1),
        MatrixCell("r", "", "", 0, "", "", "reference")}) {
    ASSERT_TRUE(*store_->CreateCellIfAbsent(c));
  }
  ASSERT_TRUE(store_->LeaseAttempts({{(*store_->ListAttempts("c")).at(0).id, "agent-1"}}).ok());
  ASSERT_TRUE(store_->FinishAttempt((*store_->ListAttempts("c")).at(0).id, AttemptState::kFailed, "").ok());

  auto all = store_->Matrix({});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  std::vector<std::string> ids;
  for (const MatrixSquare& q : *all) ids.push_back(q.cell_id);
  // Sorted by family, checkpoint, device, precision (bf16 < fp32), topology.
  EXPECT_EQ(ids, (std::vector<std::string>{"b", "c", "d", "e"}));
  const MatrixSquare& fp32 = all->at(1);
  EXPECT_EQ(fp32.cells, 2);
  EXPECT_EQ(fp32.status, AttemptState::kFailed);
  EXPECT_EQ(fp32.branch, "dev");
  EXPECT_EQ(fp32.checkpoint_digest, "sha256:llama");
  EXPECT_EQ(fp32.device, "cpu");
  EXPECT_EQ(all->at(2).topology.tp, 2);

  auto main_only = store_->Matrix({.branch = "main"});
  ASSERT_TRUE(main_only.ok());
  ASSERT_EQ(main_only->size(), 4u);
  EXPECT_EQ(main_only->at(1).cell_id, "a");
  EXPECT_EQ(main_only->at(1).status, AttemptState::kQueued);
  EXPECT_EQ(main_only->at(1).cells, 1);
  EXPECT_EQ(store_->Matrix({.commit = c2})->size(), 1u);
  EXPECT_EQ(store_->Matrix({.model_family = "qwen3"})->size(), 1u);
  EXPECT_TRUE(store_->Matrix({.repository = "/elsewhere"})->empty());

  auto choices = store_->ListMatrixChoices();
  ASSERT_TRUE(choices.ok());
  ASSERT_EQ(choices->repositories.size(), 1u);
  EXPECT_EQ(choices->repositories[0].first, "/repos/adapt");
  EXPECT_EQ(choices->repositories[0].second, (std::vector<std::string>{"dev", "main"}));
  EXPECT_EQ(choices->model_families, (std::vector<std::string>{"llama", "qwen3"}));
}

TEST_F(StoreTest, DesignatedBranchesKeepExistingCellsAndNarrowTheMatrix) {
  // Verifies migrations/0013: a database of migration 0012 keeps its cells and gains each
  // cell's branch in cell_branches; a resubmit from another branch is recorded once; the
  // default branch and an admin's set are stored (an empty set goes back to the default); the
  // matrix's designated filter keeps cells on a designated branch of a restricted repository
  // and every cell of another repository.
  store_.reset();
  std::filesystem::remove(db_path());
  const std::span<const Migration> all = EmbeddedMigrations();
  std::vector<Migration> upto12;
  for (const Migration& m : all) {
    if (m.version <= 12) upto12.push_back(m);
  }
  ASSERT_LT(upto12.size(), all.size());
  const std::string c1(40, '1'), c2(40, '2');
  {
    // Cells stored without a branch (this code would write cell_branches, which 0012 lacks),
    // then labelled as that version stored them.
    auto old = Store::Open(db_path().string(), SteppingClock(), upto12);
    ASSERT_TRUE(old.ok()) << old.status().ToString();
    ASSERT_TRUE(*(*old)->CreateCellIfAbsent(MatrixCell("m", "llama", "fp32", 1, "", c1)));
    ASSERT_TRUE(*(*old)->CreateCellIfAbsent(MatrixCell("x", "llama", "bf16", 1, "", c2)));
    ASSERT_TRUE(*(*old)->CreateCellIfAbsent(MatrixCell("n", "llama", "fp32", 2, "", c2)));
  }
  ExecOnFile(db_path(), "UPDATE cells SET branch = 'main' WHERE id = 'm'; "
                        "UPDATE cells SET branch = 'exp' WHERE id = 'x'");
  auto reopened = Store::Open(db_path().string(), SteppingClock());
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  store_ = std::move(*reopened);
  ASSERT_EQ(store_->ListCells(10, 0)->size(), 3u);
  auto branches = store_->ListCellBranches();
  ASSERT_TRUE(branches.ok()) << branches.status().ToString();
  ASSERT_EQ(branches->size(), 2u);  // the commit-only cell has none
  EXPECT_EQ(branches->at(0).cell_id, "m");
  EXPECT_EQ(branches->at(1).branch, "exp");

  // The experiment's cell submitted again from main: the same cell, one more branch, once.
  CellRecord again = MatrixCell("x", "llama", "bf16", 1, "release", c2);
  EXPECT_FALSE(*store_->CreateCellIfAbsent(again));
  EXPECT_FALSE(*store_->CreateCellIfAbsent(again));
  EXPECT_EQ(store_->ListCellBranches()->size(), 3u);
  EXPECT_EQ((*store_->GetCell("x"))->branch, "exp");  // the label stays the first branch

  EXPECT_TRUE(store_->ListRepositoryBranches()->empty());
  ASSERT_TRUE(store_->RecordDefaultBranch("/repos/adapt", "main").ok());
  ASSERT_TRUE(store_->RecordDefaultBranch("/repos/adapt", "main").ok());
  ASSERT_TRUE(store_->RecordDefaultBranch("/repos/adapt", "").ok());  // unknown: no change
  auto rows = store_->ListRepositoryBranches();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ(rows->at(0).default_branch, "main");
  EXPECT_FALSE(rows->at(0).designated.has_value());
  const std::string seen = rows->at(0).default_seen_at;
  EXPECT_FALSE(seen.empty());

  auto set = store_->SetDesignatedBranches("/repos/adapt", {"release", "main"}, "root", "ship");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->designated, (std::vector<std::string>{"release", "main"}));
  EXPECT_EQ(set->designated_by, "root");
  EXPECT_EQ(set->designated_reason, "ship");
  EXPECT_EQ(set->default_branch, "main");  // kept
  EXPECT_EQ(set->default_seen_at, seen);

  auto ids = [&](const MatrixFilter& f) {
    std::vector<std::string> out;
    for (const MatrixSquare& q : *store_->Matrix(f)) out.push_back(q.cell_id);
    return out;
  };
  EXPECT_EQ(ids({}), (std::vector<std::string>{"x", "m", "n"}));
  MatrixFilter main_only;
  main_only.designated = MatrixFilter::Designated{{"/repos/adapt"}, {{"/repos/adapt", "main"}}};
  EXPECT_EQ(ids(main_only), (std::vector<std::string>{"m"}));
  MatrixFilter release;
  release.designated = MatrixFilter::Designated{{"/repos/adapt"}, {{"/repos/adapt", "release"}}};
  EXPECT_EQ(ids(release), (std::vector<std::string>{"x"}));  // by its second branch
  MatrixFilter other_repository;
  other_repository.designated = MatrixFilter::Designated{{"/elsewhere"}, {{"/elsewhere", "main"}}};
  EXPECT_EQ(ids(other_repository).size(), 3u);

  auto reset = store_->SetDesignatedBranches("/repos/adapt", {}, "root", "back to default");
  ASSERT_TRUE(reset.ok());
  EXPECT_FALSE(reset->designated.has_value());
  EXPECT_EQ(reset->designated_reason, "back to default");
}

TEST_F(StoreTest, LogChunksAfterTheAttemptEndedAreFlaggedStale) {
  const int64_t id = LeasedAttempt("c1");
  ASSERT_TRUE(*store_->AppendLog(id, "worker", 0, "before "));
  ASSERT_TRUE(*store_->FinishAttempt(id, AttemptState::kLost, "agent unreachable"));
  ASSERT_TRUE(*store_->AppendLog(id, "worker", 7, "after\n"));
  EXPECT_EQ(*store_->ReadLog(id, "worker"), "before after\n");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db_path().c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT offset, stale FROM logs ORDER BY offset", -1, &q, nullptr),
            SQLITE_OK);
  std::vector<std::pair<int, int>> rows;
  while (sqlite3_step(q) == SQLITE_ROW) rows.emplace_back(sqlite3_column_int(q, 0), sqlite3_column_int(q, 1));
  sqlite3_finalize(q);
  sqlite3_close(db);
  EXPECT_EQ(rows, (std::vector<std::pair<int, int>>{{0, 0}, {7, 1}}));
}

TEST_F(StoreTest, LeasesAreAllOrNothingAndFollowTheTransitionTable) {
  // Verifies a lease batch is all-or-nothing and ends obey the transition table.
  ASSERT_TRUE(store_->CreateCellIfAbsent(MakeCell("c1")).ok());
  ASSERT_TRUE(store_->CreateCellIfAbsent(MakeCell("c2")).ok());
  const int64_t a1 = (*store_->ListAttempts("c1")).at(0).id;
  const int64_t a2 = (*store_->ListAttempts("c2")).at(0).id;
  ASSERT_TRUE(store_->LeaseAttempts({{a2, "agent-1"}}).ok());
  // a2 is no longer queued, so the whole batch fails and a1 stays queued.
  Status s = store_->LeaseAttempts({{a1, "agent-1"}, {a2, "agent-2"}});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store_->GetAttempt(a1)).state, AttemptState::kQueued);
  EXPECT_EQ((*store_->GetAttempt(a2)).agent_id, "agent-1");
  const std::vector<ActiveAttempt> active = *store_->ListActiveAttempts();
  ASSERT_EQ(active.size(), 1u);
  EXPECT_EQ(active[0].agent_id, "agent-1");
  EXPECT_EQ(active[0].attempt_id, a2);
  EXPECT_EQ(active[0].cell_id, "c2");
  const std::vector<QueuedAttempt> queued = *store_->ListQueuedAttempts();
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0].attempt_id, a1);
  EXPECT_EQ(queued[0].spec_json, MakeCell("c1").spec_json);
  // Without specs (a scheduling pass reads only the specs it has not cached): the same rows.
  const std::vector<QueuedAttempt> queued_brief = *store_->ListQueuedAttempts(/*with_specs=*/false);
  ASSERT_EQ(queued_brief.size(), 1u);
  EXPECT_EQ(queued_brief[0].attempt_id, a1);
  EXPECT_EQ(queued_brief[0].spec_json, "");

  EXPECT_TRUE(*store_->FinishAttempt(a2, AttemptState::kPassed, ""));
  EXPECT_FALSE(*store_->FinishAttempt(a2, AttemptState::kError, "late resend"));
  EXPECT_EQ((*store_->GetAttempt(a2)).state, AttemptState::kPassed);
  EXPECT_FALSE((*store_->GetAttempt(a2)).ended_at.empty());
  EXPECT_EQ(store_->FinishAttempt(a1, AttemptState::kPassed, "").status().code(),
            StatusCode::kFailedPrecondition);  // queued -> passed is illegal
}

TEST_F(StoreTest, AgentsAreUpsertedAndTracked) {
  // Verifies agents re-register as connected with capabilities and heartbeat time.
  AgentRecord agent{"gpu-1", "gpu-1", R"({"slots":2})", "", "", ""};
  ASSERT_TRUE(store_->UpsertAgent(agent).ok());
  ASSERT_TRUE(store_->SetAgentState("gpu-1", "disconnected").ok());
  ASSERT_TRUE(store_->UpsertAgent(agent).ok());
  ASSERT_TRUE(store_->TouchAgent("gpu-1").ok());
  auto row = store_->GetAgent("gpu-1");
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, "connected");
  EXPECT_EQ(row->capabilities_json, R"({"slots":2})");
  EXPECT_FALSE(row->last_heartbeat_at.empty());
  EXPECT_EQ(store_->GetAgent("nobody").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace gatehouse::controller
