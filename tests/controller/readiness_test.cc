// Verifies readiness (controller/readiness.h): validation cells grouped by combination, the
// newest cell of each adapter commit deciding, verdicts mapped to validated / failed / blocked /
// unverified, reference cells left out.
#include "controller/readiness.h"

#include <gtest/gtest.h>

namespace gatehouse::controller {
namespace {

CellSummary MakeSummary(const std::string& id, const std::string& commit, AttemptState status,
                        const std::string& precision = "fp32", int64_t tp = 1,
                        const std::string& kind = "validation") {
  CellSpec spec;
  spec.kind = kind;
  spec.checkpoint = {"/data/llama-1b", "sha256:" + std::string(64, 'c')};
  spec.runtime.torch = "2.11.0";
  if (kind == "validation") {
    spec.repository = "/srv/git/adapter";
    spec.commit = commit;
    spec.model_family = "llama";
    spec.reference = {{"/data/llama-1b-ref", "sha256:" + std::string(64, 'e')}, ""};
    spec.phases = {"config", "load", "inference"};
    spec.precision = precision;
    spec.topology.tp = tp;
  } else {
    spec.runtime.transformers = "5.24.0";
    spec.phases = {"identity", "reference"};
  }
  CellSummary s;
  s.cell.id = id;
  s.cell.spec_json = CanonicalSpecJson(spec);
  EXPECT_TRUE(ParseCellSpecJson(s.cell.spec_json).ok()) << s.cell.spec_json;
  s.cell.branch = "main";
  s.cell.created_at = "2026-12-02T00:00:0" + id.substr(id.size() - 1) + ".000Z";
  s.status = status;
  return s;
}

TEST(ReadinessTest, VerdictsMapToReadiness) {
  EXPECT_EQ(ReadinessOf(AttemptState::kPassed), "validated");
  EXPECT_EQ(ReadinessOf(AttemptState::kFailed), "failed");
  EXPECT_EQ(ReadinessOf(AttemptState::kBlocked), "blocked");
  for (AttemptState s : {AttemptState::kQueued, AttemptState::kRunning, AttemptState::kError,
                         AttemptState::kLost, AttemptState::kCancelled, AttemptState::kTimedOut}) {
    EXPECT_EQ(ReadinessOf(s), "unverified") << AttemptStateName(s);
  }
}

TEST(ReadinessTest, TheNewestCellOfEachCommitDecidesPerCombination) {
  const std::string a(40, 'a'), b(40, 'b');
  // Newest first, as Store::ListCells returns them.
  const std::vector<CellSummary> cells = {
      MakeSummary("c6", a, AttemptState::kFailed, "bf16"),
      MakeSummary("c5", a, AttemptState::kPassed, "fp32", /*tp=*/2),
      MakeSummary("c4", b, AttemptState::kError),
      MakeSummary("c3", a, AttemptState::kPassed),  // newer than c1: decides for commit a
      MakeSummary("c2", "", AttemptState::kPassed, "fp32", 1, "reference"),
      MakeSummary("c1", a, AttemptState::kFailed),
  };
  const std::vector<ReadinessCombination> r = ComputeReadiness(cells);
  ASSERT_EQ(r.size(), 3u);  // bf16 tp1, fp32 tp1, fp32 tp2 (sorted by precision, then topology)
  EXPECT_EQ(r[0].precision, "bf16");
  ASSERT_EQ(r[0].commits.size(), 1u);
  EXPECT_EQ(r[0].commits[0].readiness, "failed");
  EXPECT_EQ(r[0].commits[0].cell_id, "c6");

  EXPECT_EQ(r[1].precision, "fp32");
  EXPECT_EQ(r[1].topology.tp, 1);
  EXPECT_EQ(r[1].model_family, "llama");
  EXPECT_EQ(r[1].checkpoint.path, "/data/llama-1b");
  ASSERT_EQ(r[1].commits.size(), 2u);
  EXPECT_EQ(r[1].commits[0].commit, b);
  EXPECT_EQ(r[1].commits[0].readiness, "unverified");
  EXPECT_EQ(r[1].commits[0].status, AttemptState::kError);
  EXPECT_EQ(r[1].commits[1].commit, a);
  EXPECT_EQ(r[1].commits[1].readiness, "validated");
  EXPECT_EQ(r[1].commits[1].cell_id, "c3");

  EXPECT_EQ(r[2].topology.tp, 2);
  EXPECT_EQ(r[2].commits.at(0).cell_id, "c5");
}

// Verifies a bf16 combination says its numerics need the fp32 cell and names, per commit, that
// commit's readiness in the otherwise equal fp32 combination ("none" without one); fp32
// combinations carry no such note.
TEST(ReadinessTest, Bf16CombinationsPointAtTheirFp32Cell) {
  const std::string a(40, 'a'), b(40, 'b');
  const std::vector<CellSummary> cells = {
      MakeSummary("c4", b, AttemptState::kPassed, "bf16"),
      MakeSummary("c3", a, AttemptState::kPassed, "bf16"),
      MakeSummary("c2", a, AttemptState::kFailed, "fp32", /*tp=*/2),
      MakeSummary("c1", a, AttemptState::kPassed, "fp32"),
  };
  const std::vector<ReadinessCombination> r = ComputeReadiness(cells);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].precision, "bf16");
  EXPECT_EQ(r[0].numerics, kBf16NumericsNote);
  ASSERT_EQ(r[0].commits.size(), 2u);
  EXPECT_EQ(r[0].commits[0].commit, b);
  EXPECT_EQ(r[0].commits[0].fp32_readiness, "none");
  EXPECT_EQ(r[0].commits[1].fp32_readiness, "validated");  // tp=1's fp32 cell, not tp=2's
  EXPECT_TRUE(r[1].numerics.empty());
  EXPECT_TRUE(r[1].commits[0].fp32_readiness.empty());
}

TEST(ReadinessTest, ACellThatRanFewerGatesIsAnotherCombination) {
  // A later identity-only PASS must not stand for the full run's FAIL of the same commit.
  const std::string a(40, 'a');
  CellSummary partial = MakeSummary("c2", a, AttemptState::kPassed);
  CellSpec spec = ParseCellSpecJson(partial.cell.spec_json).value();
  spec.phases = {"config"};
  partial.cell.spec_json = CanonicalSpecJson(spec);
  const auto r = ComputeReadiness({partial, MakeSummary("c1", a, AttemptState::kFailed)});
  ASSERT_EQ(r.size(), 2u);
  for (const ReadinessCombination& c : r) {
    ASSERT_EQ(c.commits.size(), 1u);
    EXPECT_EQ(c.commits[0].readiness, c.phases.size() == 1 ? "validated" : "failed");
    EXPECT_EQ(c.torch, "2.11.0");
  }
}

TEST(ReadinessTest, AnUnreadableSpecIsSkipped) {
  CellSummary broken;
  broken.cell.id = "x";
  broken.cell.spec_json = "{not json";
  EXPECT_TRUE(ComputeReadiness({broken}).empty());
}

MatrixSquare Square(const std::string& family, const std::string& precision, int tp,
                    AttemptState status, const std::string& cell) {
  MatrixSquare q;
  q.model_family = family;
  q.checkpoint_path = "/ckpt/" + family;
  q.checkpoint_digest = "sha256:" + family;
  q.device = "cpu";
  q.precision = precision;
  q.topology.tp = tp;
  q.mode = "eager";
  q.cell_id = cell;
  q.status = status;
  q.cells = 1;
  return q;
}

TEST(DesignatedBranchesTest, ConfiguredThenDefaultThenEveryBranch) {
  // Verifies DesignatedBranches: an admin's set wins over the default branch; without a set
  // the default branch alone counts; a repository with neither known (or no row at all)
  // counts every branch; a cell submitted by commit alone (branch "") counts only there.
  RepositoryBranches configured{"/srv/a", "main", "t0", std::vector<std::string>{"release", "main"}};
  RepositoryBranches by_default{"/srv/b", "trunk", "t0", std::nullopt};
  RepositoryBranches unknown{"/srv/c", "", "", std::nullopt};
  const DesignatedBranches d({configured, by_default, unknown});
  EXPECT_TRUE(d.Counts("/srv/a", "release"));
  EXPECT_TRUE(d.Counts("/srv/a", "main"));
  EXPECT_FALSE(d.Counts("/srv/a", "exp"));
  EXPECT_FALSE(d.Counts("/srv/a", ""));
  EXPECT_TRUE(d.Counts("/srv/b", "trunk"));
  EXPECT_FALSE(d.Counts("/srv/b", "main"));
  EXPECT_TRUE(d.Counts("/srv/c", "anything"));
  EXPECT_TRUE(d.Counts("/srv/c", ""));
  EXPECT_TRUE(d.Counts("/srv/none", "exp"));
  EXPECT_EQ(d.Of("/srv/a").source, "configured");
  EXPECT_EQ(d.Of("/srv/a").branches, (std::vector<std::string>{"main", "release"}));
  EXPECT_EQ(d.Of("/srv/b").source, "default_branch");
  EXPECT_EQ(d.Of("/srv/c").source, "unknown");
  EXPECT_EQ(d.Of("/srv/none").source, "unknown");
  EXPECT_EQ(d.Of("/srv/none").repository, "/srv/none");

  const MatrixFilter::Designated f = d.AsFilter();
  EXPECT_EQ(f.restricted, (std::vector<std::string>{"/srv/a", "/srv/b"}));
  EXPECT_EQ(f.designated.size(), 3u);
}

TEST(DesignatedBranchesTest, AnExperimentBranchsFailureLeavesMainsReadiness) {
  // Verifies OnDesignatedBranches with ComputeReadiness: main's passed commit decides, the
  // experiment branch's newer FAIL and a commit-only cell are left out; a cell first submitted
  // on the experiment branch and then from main (the same cell) counts, shown as main's.
  const std::string a(40, 'a'), b(40, 'b'), c(40, 'c'), e(40, 'e');
  std::vector<CellSummary> cells = {
      MakeSummary("c4", c, AttemptState::kFailed),  // commit only
      MakeSummary("c3", e, AttemptState::kFailed),  // experiment branch
      MakeSummary("c2", b, AttemptState::kPassed),  // first on exp, later from main
      MakeSummary("c1", a, AttemptState::kPassed),  // main
  };
  cells[0].cell.branch = "";
  cells[1].cell.branch = "exp";
  cells[2].cell.branch = "exp";
  for (CellSummary& cell : cells) cell.cell.repository = "/srv/git/adapter";
  const std::vector<CellBranch> branches = {
      {"c1", "main"}, {"c2", "exp"}, {"c2", "main"}, {"c3", "exp"}};
  const DesignatedBranches main_only({{"/srv/git/adapter", "main", "t0", std::nullopt}});

  const std::vector<CellSummary> kept = OnDesignatedBranches(cells, branches, main_only);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].cell.id, "c2");
  EXPECT_EQ(kept[0].cell.branch, "main");
  EXPECT_EQ(kept[1].cell.id, "c1");
  const std::vector<ReadinessCombination> r = ComputeReadiness(kept);
  ASSERT_EQ(r.size(), 1u);
  for (const ReadinessCommit& commit : r[0].commits) EXPECT_EQ(commit.readiness, "validated");

  // All of them, when every branch counts (no designation known).
  EXPECT_EQ(OnDesignatedBranches(cells, branches, DesignatedBranches({})).size(), 4u);
  // The experiment branch designated too: its FAIL counts.
  const DesignatedBranches both(
      {{"/srv/git/adapter", "main", "t0", std::vector<std::string>{"main", "exp"}}});
  EXPECT_EQ(OnDesignatedBranches(cells, branches, both).size(), 3u);
}

TEST(MatrixTest, SquaresAreArrangedIntoRowsAndColumnsWithARowReadiness) {
  // Verifies ArrangeMatrix: rows per family and checkpoint, sorted columns with their keys, a
  // row's readiness (failed over blocked over all validated over unverified), the status filter
  // by attempt state or readiness word dropping empty rows and columns.
  const std::vector<MatrixSquare> squares = {
      Square("llama", "bf16", 1, AttemptState::kPassed, "a"),
      Square("llama", "fp32", 1, AttemptState::kFailed, "b"),
      Square("llama", "fp32", 2, AttemptState::kPassed, "c"),
      Square("qwen3", "fp32", 1, AttemptState::kPassed, "d"),
      Square("qwen3", "fp32", 2, AttemptState::kRunning, "e"),
      Square("zeta", "fp32", 1, AttemptState::kPassed, "f"),
      Square("zeta", "fp32", 2, AttemptState::kBlocked, "g"),
  };
  const Matrix all = ArrangeMatrix(squares, "");
  ASSERT_EQ(all.columns.size(), 3u);
  EXPECT_EQ(all.columns[0].key, "cpu bf16 tp=1 dp=1 pp=1 ep=1 eager");
  EXPECT_EQ(all.columns[2].key, "cpu fp32 tp=2 dp=1 pp=1 ep=1 eager");
  ASSERT_EQ(all.rows.size(), 3u);
  EXPECT_EQ(all.rows[0].readiness, "failed");
  EXPECT_EQ(all.rows[0].counts.at("validated"), 2);
  EXPECT_EQ(all.rows[0].squares.at("cpu fp32 tp=1 dp=1 pp=1 ep=1 eager").cell_id, "b");
  EXPECT_EQ(all.rows[1].readiness, "unverified");
  EXPECT_EQ(all.rows[2].readiness, "blocked");
  EXPECT_EQ(ArrangeMatrix({squares[0], squares[2]}, "").rows[0].readiness, "validated");

  const Matrix running = ArrangeMatrix(squares, "running");
  ASSERT_EQ(running.rows.size(), 1u);
  EXPECT_EQ(running.rows[0].model_family, "qwen3");
  ASSERT_EQ(running.columns.size(), 1u);
  EXPECT_EQ(running.columns[0].topology.tp, 2);
  EXPECT_EQ(ArrangeMatrix(squares, "validated").rows.size(), 3u);
  EXPECT_EQ(ArrangeMatrix(squares, "validated").columns.size(), 3u);
  EXPECT_TRUE(ArrangeMatrix(squares, "lost").rows.empty());
}

}  // namespace
}  // namespace gatehouse::controller
