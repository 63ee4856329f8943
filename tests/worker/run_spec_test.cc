// Run spec parsing tests (docs/protocols.md §2, §3).
#include "gatehouse/worker/run_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gatehouse::worker {
namespace {

using ::testing::HasSubstr;

nlohmann::json ValidSpec() {
  return nlohmann::json::parse(R"({
    "spec_version": 1, "repository": "/srv/repo", "commit": "0123456789abcdef0123456789abcdef01234567",
    "model_family": "llama",
    "checkpoint": {"path": "/data/ckpt", "digest": "sha256:aa"},
    "reference": {"path": "/data/ref", "digest": "sha256:bb"},
    "runtime": {"torch": "2.11.0", "device": "cpu"},
    "launch": {"runner": "gatehouse-worker", "processes_per_rank": 1},
    "topology": {"tp": 1, "dp": 1, "pp": 1, "ep": 1},
    "precision": "bf16", "mode": "eager",
    "decode": {"max_new_tokens": 32, "sampling": "greedy"},
    "training": {"steps": 3, "lr": 0.001, "seed": 1234},
    "env": {"OMP_NUM_THREADS": "2"},
    "phases": ["identity", "config", "load"],
    "attempt": {"id": 7, "dir": "/var/attempts/7",
                "checkout": {"head": "0123456789abcdef0123456789abcdef01234567", "clean": true,
                             "path": "/var/checkouts/7"},
                "agent": "node-a"}
  })");
}

std::string ErrorOf(const nlohmann::json& j) {
  Result<RunSpec> r = ParseRunSpec(j);
  return r.ok() ? "" : r.status().message();
}

// Verifies a complete spec parses into every member, and that the cell spec part is what
// ParseCellSpec reads from the same JSON without the attempt member.
TEST(RunSpecTest, ParsesCompleteSpec) {
  Result<RunSpec> r = ParseRunSpec(ValidSpec());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  nlohmann::json cell = ValidSpec();
  cell.erase("attempt");
  Result<CellSpec> c = ParseCellSpec(cell);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(static_cast<const CellSpec&>(*r), *c);
  EXPECT_EQ(r->model_family, "llama");
  EXPECT_EQ(r->checkpoint.path, "/data/ckpt");
  EXPECT_EQ(r->reference.digest, "sha256:bb");
  EXPECT_EQ(r->precision, "bf16");
  EXPECT_EQ(r->training.steps, 3);
  EXPECT_DOUBLE_EQ(r->training.lr, 0.001);
  EXPECT_EQ(r->env.at("OMP_NUM_THREADS"), "2");
  EXPECT_EQ(r->topology.world_size(), 1);
  EXPECT_TRUE(r->Requested("load"));
  EXPECT_FALSE(r->Requested("decode"));
  EXPECT_EQ(r->attempt.checkout.path, "/var/checkouts/7");
}

// Verifies a missing member is named by its path.
TEST(RunSpecTest, MissingMemberNamed) {
  auto j = ValidSpec();
  j["training"].erase("steps");
  EXPECT_THAT(ErrorOf(j), HasSubstr("missing field 'training.steps'"));
  j = ValidSpec();
  j.erase("attempt");
  EXPECT_THAT(ErrorOf(j), HasSubstr("missing field 'attempt'"));
  j = ValidSpec();
  j["attempt"]["checkout"].erase("clean");
  EXPECT_THAT(ErrorOf(j), HasSubstr("missing field 'attempt.checkout.clean'"));
}

// Verifies an unknown member, top-level or nested, is named by its path.
TEST(RunSpecTest, UnknownMemberNamed) {
  auto j = ValidSpec();
  j["topology"]["zz"] = 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("unknown field 'topology.zz'"));
  j = ValidSpec();
  j["colour"] = "red";
  EXPECT_THAT(ErrorOf(j), HasSubstr("unknown field 'colour'"));
}

// Verifies out-of-range and ill-typed values are rejected naming the member.
TEST(RunSpecTest, RejectsBadValues) {
  auto j = ValidSpec();
  j["training"]["steps"] = 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'training.steps': expected an integer from 2 to 1000, got 1"));
  j = ValidSpec();
  j["precision"] = "fp8";
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'precision': expected one of 'fp32' 'bf16', got \"fp8\""));
  j = ValidSpec();
  j["commit"] = "main";
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'commit': expected a 40-hex commit SHA"));
  j = ValidSpec();
  j["decode"]["max_new_tokens"] = 100000000;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'decode.max_new_tokens': expected an integer from 1 "
                                    "to 4096, got 100000000"));
  j = ValidSpec();
  j["attempt"]["zz"] = 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("unknown field 'attempt.zz'"));
  j = ValidSpec();
  j["topology"]["tp"] = "2";
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'topology.tp': expected an integer from 1 to 64, got \"2\""));
  j = ValidSpec();
  j["attempt"]["dir"] = "relative/dir";
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'attempt.dir': expected an absolute path"));
}

// Verifies phases must be known names without repeats.
TEST(RunSpecTest, RejectsBadPhases) {
  auto j = ValidSpec();
  j["phases"] = {"identity", "warmup"};
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'phases': unknown phase \"warmup\""));
  j["phases"] = {"identity", "identity"};
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'phases': duplicate phase \"identity\""));
  j["phases"] = nlohmann::json::array();
  EXPECT_THAT(ErrorOf(j), HasSubstr("non-empty array"));
}

// Verifies LoadRunSpec names the file on bad JSON and on a missing file.
TEST(RunSpecTest, LoadNamesFile) {
  Result<RunSpec> r = LoadRunSpec("/nonexistent/run.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/run.json"));
}

}  // namespace
}  // namespace gatehouse::worker
