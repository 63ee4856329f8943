// Verifies cell identity: submit-body validation, defaults, canonical hashing of the frozen
// spec (docs/protocols.md §1-2), and a submit answered pending while a digest is computed.
#include "controller/cell_identity.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "common/phases.h"
#include "common/sha256.h"
#include "tests/controller/test_util.h"

namespace gatehouse::controller {
namespace {

using nlohmann::json;
using testing::FakeCommitResolver;
using testing::TempDir;

/// A frozen spec as JSON, read back as the typed spec.
CellSpec Spec(const json& frozen) { return ParseCellSpec(frozen).value(); }

class IdentityTest : public ::testing::Test {
 protected:
  IdentityTest() : freezer_(Config(), resolver_, digests_) {
    testing::MakeCheckpoint(dir_.path());
    testing::MakeCheckpoint(dir_.path() / "second");
  }

  static SubmitContext Config() {
    SubmitContext c;
    c.torch_pin = "2.11.0";
    return c;
  }

  json BaseBody() const {
    return {{"repository", "/repos/adapt"},
            {"branch", "main"},
            {"model_family", "llama"},
            {"checkpoint", (dir_.path() / "ckpt").string()},
            {"reference", (dir_.path() / "reference").string()}};
  }

  std::string IdOf(const json& body) {
    auto cell = freezer_.FreezeAndWait(body.dump());
    EXPECT_TRUE(cell.ok()) << cell.status().ToString() << " for " << body.dump();
    return cell.ok() ? cell->id : "";
  }

  Status ErrorOf(const json& body) { return freezer_.FreezeAndWait(body.dump()).status(); }

  json Freeze(const json& body) {
    auto cell = freezer_.FreezeAndWait(body.dump());
    EXPECT_TRUE(cell.ok()) << cell.status().ToString() << " for " << body.dump();
    return cell.ok() ? json::parse(cell->spec_json) : json::object();
  }

  TempDir dir_;
  FakeCommitResolver resolver_;
  DigestCache digests_;
  CellFreezer freezer_;
};

TEST_F(IdentityTest, SameInputsGiveSameIdWhateverTheFieldOrder) {
  // Verifies field order and explicitly spelled defaults do not change the cell id.
  const std::string reordered =
      R"({"topology":{"ep":1,"pp":1,"dp":1,"tp":1},"checkpoint":")" +
      (dir_.path() / "ckpt").string() +
      R"(","model_family":"llama","training":{"seed":1234,"lr":0.001,"steps":2},)"
      R"("branch":"main","repository":"/repos/adapt","precision":"fp32","reference":")" +
      (dir_.path() / "reference").string() + R"("})";
  auto a = freezer_.FreezeAndWait(BaseBody().dump());
  auto b = freezer_.FreezeAndWait(reordered);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->id, b->id);
  EXPECT_EQ(a->spec_json, b->spec_json);
  EXPECT_EQ(a->id.size(), 64u);
  EXPECT_EQ(a->id, CellIdOf(ParseCellSpecJson(a->spec_json).value()));
}

TEST_F(IdentityTest, EveryFieldChangeGivesANewId) {
  // Verifies each hashed input, changed alone, gives a distinct cell id.
  const std::string second_ckpt = (dir_.path() / "second" / "ckpt").string();
  const std::string second_ref = (dir_.path() / "second" / "reference").string();
  const std::vector<std::pair<std::string, json>> changes = {
      {"repository", {{"repository", "/repos/other"}}},
      {"branch resolving elsewhere", {{"branch", "other"}}},
      {"commit", {{"commit", std::string(40, 'c')}}},
      {"model_family", {{"model_family", "mistral"}}},
      {"checkpoint",
       {{"checkpoint", second_ckpt}, {"reference", (dir_.path() / "reference").string()}}},
      {"reference", {{"reference", second_ref}}},
      {"precision", {{"precision", "bf16"}}},
      {"mode", {{"mode", "cuda_graph"}}},
      {"device", {{"device", "cuda"}}},
      {"topology.tp", {{"topology", {{"tp", 2}}}}},
      {"topology.dp", {{"topology", {{"dp", 2}}}}},
      {"topology.pp", {{"topology", {{"pp", 2}}}}},
      {"topology.dp_shard", {{"topology", {{"dp_shard", 2}}}}},
      {"topology.cp", {{"topology", {{"cp", 2}}}}},
      // ep borrows its ranks from dp_shard x cp: the same dp_shard with and without it.
      {"topology.ep", {{"topology", {{"dp_shard", 2}, {"ep", 2}}}}},
      {"topology.etp", {{"topology", {{"dp_shard", 2}, {"tp", 2}, {"ep", 2}, {"etp", 2}}}}},
      {"training.steps", {{"training", {{"steps", 3}}}}},
      {"training.lr", {{"training", {{"lr", 0.01}}}}},
      {"training.seed", {{"training", {{"seed", 7}}}}},
      {"decode.max_new_tokens", {{"decode", {{"max_new_tokens", 8}}}}},
      {"env", {{"env", {{"NCCL_DEBUG", "INFO"}}}}},
      {"phases", {{"phases", {"identity", "config"}}}},
      {"runtime.torch", {{"runtime", {{"torch", "2.10.0"}}}}},
      {"runtime.cuda", {{"runtime", {{"cuda", "13.0"}}}}},
  };
  const std::string base = IdOf(BaseBody());
  std::set<std::string> seen = {base};
  for (const auto& [what, patch] : changes) {
    json body = BaseBody();
    body.merge_patch(patch);
    if (what == "commit") body.erase("branch");
    const std::string id = IdOf(body);
    EXPECT_TRUE(seen.insert(id).second) << "changing " << what << " did not change the id";
  }
}

TEST_F(IdentityTest, CudaPinIsFrozenOnlyWhenGivenAndReproduced) {
  // Verifies runtime.cuda is in the frozen spec only when the body pins it (so cells without
  // the pin keep their ids), and that the report's reproduce body carries it.
  const json plain = Freeze(BaseBody());
  EXPECT_FALSE(plain.at("runtime").contains("cuda"));
  json body = BaseBody();
  body["runtime"] = {{"cuda", "13.0"}};
  const json pinned = Freeze(body);
  EXPECT_EQ(pinned.at("runtime").at("cuda"), "13.0");
  EXPECT_EQ(ReproduceBody(Spec(pinned)).at("runtime").at("cuda"), "13.0");
  EXPECT_EQ(IdOf(ReproduceBody(Spec(pinned))), CellIdOf(Spec(pinned)));
}

TEST_F(IdentityTest, GpuModelPinIsFrozenOnlyWhenGivenAndNeedsCuda) {
  json body = BaseBody();
  body["device"] = "cuda";
  const json plain = Freeze(body);
  EXPECT_FALSE(plain.at("runtime").contains("gpu_model"));
  body["runtime"] = {{"gpu_model", "H200"}};
  const json pinned = Freeze(body);
  EXPECT_EQ(pinned.at("runtime").at("gpu_model"), "H200");
  EXPECT_NE(CellIdOf(Spec(pinned)), CellIdOf(Spec(plain)));
  EXPECT_EQ(IdOf(ReproduceBody(Spec(pinned))), CellIdOf(Spec(pinned)));
  json cpu = BaseBody();
  cpu["runtime"] = {{"gpu_model", "H200"}};
  EXPECT_THAT(ErrorOf(cpu).message(), ::testing::HasSubstr("needs \"device\": \"cuda\""));
  body["runtime"] = {{"gpu_model", "H200; rm -rf /"}};
  EXPECT_EQ(ErrorOf(body).code(), StatusCode::kInvalidArgument);
}

TEST_F(IdentityTest, PriorityIsALabelNotIdentity) {
  json urgent = BaseBody();
  urgent["priority"] = 50;
  auto a = freezer_.FreezeAndWait(BaseBody().dump());
  auto b = freezer_.FreezeAndWait(urgent.dump());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->id, b->id);
  EXPECT_EQ(a->priority, 0);
  EXPECT_EQ(b->priority, 50);
  EXPECT_EQ(json::parse(b->spec_json).count("priority"), 0u);
  for (const json& bad : {json(101), json(-101), json("high"), json(1.5)}) {
    json body = BaseBody();
    body["priority"] = bad;
    EXPECT_THAT(ErrorOf(body).message(), ::testing::HasSubstr("field 'priority'")) << bad;
  }
}

TEST_F(IdentityTest, CheckpointContentIsPartOfTheIdentity) {
  // Verifies rewriting a checkpoint file changes the id (content digest, not just the path).
  const std::string before = IdOf(BaseBody());
  testing::WriteFile(dir_.path() / "ckpt" / "model.safetensors", "other weights");
  EXPECT_NE(IdOf(BaseBody()), before);
}

TEST_F(IdentityTest, BranchAndSubmitterAreLabelsNotIdentity) {
  // Verifies the branch is a label: two branches at one commit give one cell id.
  json dev = BaseBody();
  dev["branch"] = "dev";
  auto a = freezer_.FreezeAndWait(BaseBody().dump());
  auto b = freezer_.FreezeAndWait(dev.dump());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->id, b->id);
  EXPECT_EQ(b->branch, "dev");
  EXPECT_EQ(json::parse(a->spec_json).count("branch"), 0u);
}

TEST_F(IdentityTest, DefaultsAreFilledExactlyAsTheProtocolSays) {
  // Verifies a minimal body freezes to exactly the spec of protocols.md §2, canonically.
  auto cell = freezer_.FreezeAndWait(BaseBody().dump());
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  json spec = json::parse(cell->spec_json);
  const std::string ckpt = (dir_.path() / "ckpt").string();
  const std::string ref = (dir_.path() / "reference").string();
  json phases = json::array();
  for (auto p : kDefaultPhases) phases.push_back(std::string(p));
  json expected = {
      {"spec_version", 1},
      {"repository", "/repos/adapt"},
      {"commit", FakeCommitResolver::kSha},
      {"model_family", "llama"},
      {"checkpoint", {{"path", ckpt}, {"digest", *DirectoryDigest(ckpt)}}},
      {"reference", {{"path", ref}, {"digest", *DirectoryDigest(ref)}}},
      {"runtime", {{"torch", "2.11.0"}, {"device", "cpu"}}},
      {"launch", {{"runner", "gatehouse-worker"}, {"processes_per_rank", 1}}},
      {"topology", {{"tp", 1}, {"dp", 1}, {"pp", 1}, {"ep", 1}}},
      {"precision", "fp32"},
      {"mode", "eager"},
      {"decode", {{"max_new_tokens", 32}, {"sampling", "greedy"}}},
      {"training", {{"steps", 2}, {"lr", 0.001}, {"seed", 1234}}},
      {"env", json::object()},
      {"phases", phases},
  };
  EXPECT_EQ(spec, expected) << spec.dump(2);
  EXPECT_EQ(cell->spec_json, expected.dump());  // canonical: sorted keys, no whitespace
  EXPECT_EQ(cell->spec_json.find(' '), std::string::npos);
}

TEST_F(IdentityTest, PhasesAreNormalisedToPhaseOrder) {
  // Verifies requested phases are a set: their order does not change the id.
  json a = BaseBody(), b = BaseBody();
  a["phases"] = {"load", "identity", "construct", "config"};
  b["phases"] = {"identity", "config", "construct", "load"};
  EXPECT_EQ(IdOf(a), IdOf(b));
}

TEST_F(IdentityTest, ModelFamilyIsCheckedAgainstTheRecipeAtTheCommit) {
  // Verifies the recipe at the resolved commit decides before anything is frozen: a family it
  // does not declare is refused naming the declared ones, a recipe that does not parse is
  // refused with its error, a declared family and a commit without a recipe pass.
  EXPECT_TRUE(freezer_.FreezeAndWait(BaseBody().dump()).ok());  // no recipe at the commit
  {
    std::lock_guard lock(resolver_.files_mu);
    resolver_.files["gatehouse.recipe.json"] =
        R"({"recipe_version": 1, "families": ["llama", "olmo2"], "build": {"system": "cmake"},
            "plugins": ["libx.so"]})";
  }
  EXPECT_TRUE(freezer_.FreezeAndWait(BaseBody().dump()).ok());
  json typo = BaseBody();
  typo["model_family"] = "olmo-2";
  const Status refused = ErrorOf(typo);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), std::string("field 'model_family' = \"olmo-2\": the adapter at ") +
                                   FakeCommitResolver::kSha +
                                   " declares the families \"llama\", \"olmo2\" "
                                   "(gatehouse.recipe.json)");
  {
    std::lock_guard lock(resolver_.files_mu);
    resolver_.files["gatehouse.recipe.json"] = R"({"recipe_version": 2})";
  }
  const Status broken = ErrorOf(BaseBody());
  EXPECT_EQ(broken.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(broken.message(), std::string("repository '/repos/adapt' at ") +
                                  FakeCommitResolver::kSha +
                                  ": gatehouse.recipe.json: field 'recipe_version': must be 1, got 2");
}

TEST_F(IdentityTest, UnknownFieldIsRejectedByName) {
  // Verifies unknown top-level and nested fields are rejected by their dotted name.
  json body = BaseBody();
  body["colour"] = "blue";
  Status s = ErrorOf(body);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'colour'"), std::string::npos) << s.message();

  body = BaseBody();
  body["topology"] = {{"tp", 1}, {"xp", 2}};
  s = ErrorOf(body);
  EXPECT_NE(s.message().find("'topology.xp'"), std::string::npos) << s.message();
}

TEST_F(IdentityTest, BadValuesNameFieldAndValue) {
  // Verifies each wrong type or value is INVALID_ARGUMENT naming the field and the value.
  struct Case {
    json patch;
    std::string field;
    std::string value;
  };
  const std::vector<Case> cases = {
      {{{"topology", {{"tp", "2"}}}}, "topology.tp", "\"2\""},
      {{{"topology", {{"tp", 0}}}}, "topology.tp", "0"},
      {{{"topology", {{"dp", 1.5}}}}, "topology.dp", "1.5"},
      {{{"topology", {{"tp", 8}, {"dp", 16}}}}, "topology", "\"tp\":8"},
      {{{"training", {{"steps", 1}}}}, "training.steps", "1"},
      {{{"training", {{"steps", 1000000000}}}}, "training.steps", "1000000000"},
      {{{"decode", {{"max_new_tokens", 100000000}}}}, "decode.max_new_tokens", "100000000"},
      {{{"training", {{"lr", -1}}}}, "training.lr", "-1"},
      {{{"precision", "fp8"}}, "precision", "\"fp8\""},
      {{{"mode", 3}}, "mode", "3"},
      {{{"phases", {"identity", "warp"}}}, "phases", "\"warp\""},
      {{{"phases", {"identity", "config", "load", "save"}}}, "phases", "\"load\" needs phase \"construct\""},
      {{{"phases", {"config", "construct", "save"}}}, "phases", "\"save\" needs phase \"load\""},
      {{{"phases", {"construct"}}}, "phases", "\"construct\" needs phase \"config\""},
      {{{"model_family", "../olmo2"}}, "model_family", "\"../olmo2\""},
      {{{"model_family", ""}}, "model_family", "\"\""},
      {{{"commit", "abc"}}, "commit", "\"abc\""},
      {{{"checkpoint", "relative/ckpt"}}, "checkpoint", "\"relative/ckpt\""},
      {{{"env", {{"A", 1}}}}, "env.A", "1"},
      {{{"runtime", {{"cuda", "13"}}}}, "runtime.cuda", "\"13\""},
      {{{"runtime", {{"cuda", "13.0; rm"}}}}, "runtime.cuda", "\"13.0; rm\""},
  };
  for (const Case& c : cases) {
    json body = BaseBody();
    body.merge_patch(c.patch);
    Status s = ErrorOf(body);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field << ": " << s.ToString();
    EXPECT_NE(s.message().find("'" + c.field + "'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.value), std::string::npos) << s.message();
  }
}

TEST_F(IdentityTest, AFamilyNoneOfOursHasIsTheAdaptersClaim) {
  // The controller keeps no list of families: whether the adapter at that commit registers
  // "olmo2" is the worker's config gate to say. The family is part of the identity.
  json body = BaseBody();
  body["model_family"] = "olmo2";
  auto olmo = freezer_.FreezeAndWait(body.dump());
  ASSERT_TRUE(olmo.ok()) << olmo.status().ToString();
  EXPECT_EQ(olmo->spec.model_family, "olmo2");
  auto llama = freezer_.FreezeAndWait(BaseBody().dump());
  ASSERT_TRUE(llama.ok());
  EXPECT_NE(olmo->id, llama->id);
}

TEST_F(IdentityTest, MalformedOrIncompleteBodiesAreRejected) {
  // Verifies non-objects, bad JSON and missing required fields are rejected by name.
  EXPECT_EQ(ErrorOf(json::array()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(freezer_.FreezeAndWait("{not json").status().code(), StatusCode::kInvalidArgument);
  json body = BaseBody();
  body.erase("branch");
  Status s = ErrorOf(body);
  EXPECT_NE(s.message().find("'branch'"), std::string::npos) << s.message();
  body = BaseBody();
  body.erase("checkpoint");
  s = ErrorOf(body);
  EXPECT_NE(s.message().find("'checkpoint'"), std::string::npos) << s.message();
}

// Regressions found by tests/fuzz/fuzz_cell_spec (docs/architecture.md, "Fuzzing").

TEST(ParseSubmitBodyTest, TopologyFactorsAtTheInt32LimitAreRejectedWithoutOverflow) {
  // Verifies tp x dp x pp is not computed before each factor is capped (three factors of
  // 2^31 - 1 overflowed int64: undefined behaviour, reported by UBSan).
  json body = {{"repository", "/repos/adapt"}, {"branch", "main"}, {"model_family", "llama"},
               {"checkpoint", "/ckpt"},
               {"topology", {{"tp", 2147483647}, {"dp", 2147483647}, {"pp", 2147483647}}}};
  auto r = ParseSubmitBody(body.dump(), SubmitContext{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'topology.tp'"), std::string::npos) << r.status().message();
}

TEST(ParseSubmitBodyTest, DeeplyNestedBodyIsRejectedNotAStackOverflow) {
  // Verifies a body nesting arrays 200k deep (400 KB, under the 1 MiB body limit) is an
  // INVALID_ARGUMENT: its error message used to dump the value recursively and overflow the
  // stack, killing the controller.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  for (const std::string& body :
       {deep, R"({"repository":"/r","branch":"b","model_family":"llama","checkpoint":"/c",)"
              R"("topology":)" + deep + "}"}) {
    auto r = ParseSubmitBody(body, SubmitContext{});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("deeper than 64"), std::string::npos)
        << r.status().message();
  }
  // 64 levels still parse (and are then rejected for what they are).
  auto r = ParseSubmitBody(std::string(64, '[') + std::string(64, ']'), SubmitContext{});
  EXPECT_NE(r.status().message().find("expected a JSON object"), std::string::npos)
      << r.status().message();
}

TEST(ParseSubmitBodyTest, ErrorMessagesAreValidUtf8ForTheRestErrorBody) {
  // Verifies every error message fits the REST error body, which nlohmann dumps strictly (an
  // invalid UTF-8 message made the 400 a 500): the parse error quoting raw bytes, and a long
  // value cut in the middle of a multi-byte character.
  // What controller/rest_api.cc ErrorResponse does with the message.
  auto error_body = [](const Status& s) { return json{{"error", s.message()}}.dump(); };
  auto invalid = ParseSubmitBody("{\"repository\": \"\xff\xfe\"}", SubmitContext{});
  ASSERT_FALSE(invalid.ok());
  EXPECT_NE(invalid.status().message().find("\\xFF"), std::string::npos)
      << invalid.status().message();
  json body = {{"repository", "/repos/adapt"}, {"branch", "main"}, {"model_family", "llama"},
               {"checkpoint", "/ckpt"}};
  // Two- and three-byte characters after 0-2 ASCII bytes: the cut falls on every position.
  for (const char* character : {"\xc3\xa9", "\xe4\xb8\xad"}) {  // U+00E9, U+4E2D
    for (std::string value : {"", "x", "xx"}) {
      for (int i = 0; i < 60; ++i) value += character;
      body["precision"] = value;
      auto r = ParseSubmitBody(body.dump(), SubmitContext{});
      ASSERT_FALSE(r.ok());
      EXPECT_NE(r.status().message().find("'precision'"), std::string::npos);
      EXPECT_NO_THROW(error_body(r.status())) << value;
    }
  }
  EXPECT_NO_THROW(error_body(invalid.status()));
}

TEST_F(IdentityTest, MissingDirectoriesAreNotFoundAndNamed) {
  // Verifies a missing checkpoint, config.json or default reference is NOT_FOUND naming the path.
  json body = BaseBody();
  const std::string missing = (dir_.path() / "absent").string();
  body["checkpoint"] = missing;
  Status s = ErrorOf(body);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(missing), std::string::npos) << s.message();

  std::filesystem::create_directories(dir_.path() / "noconfig" / "ckpt");
  body["checkpoint"] = (dir_.path() / "noconfig" / "ckpt").string();
  s = ErrorOf(body);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("config.json"), std::string::npos) << s.message();

  // A named reference directory must exist, and be a reference bundle, not any directory.
  testing::WriteFile(dir_.path() / "lonely" / "ckpt" / "config.json", "{}");
  body["checkpoint"] = (dir_.path() / "lonely" / "ckpt").string();
  body["reference"] = (dir_.path() / "lonely" / "reference").string();
  s = ErrorOf(body);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find((dir_.path() / "lonely" / "reference").string()), std::string::npos)
      << s.message();
  testing::WriteFile(dir_.path() / "lonely" / "reference" / "notes.txt", "not a bundle");
  s = ErrorOf(body);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("reference.json"), std::string::npos) << s.message();
}

TEST_F(IdentityTest, ABodyNamingNoReferenceGetsItsReferenceCell) {
  // Verifies a validation body without `reference` freezes the reference cell of its
  // checkpoint too (digested, the controller's transformers pin, default prompts), names it as
  // reference.cell, and that variants of one checkpoint share that reference cell while another
  // decode length gets another.
  json body = BaseBody();
  body.erase("reference");
  auto cell = freezer_.FreezeAndWait(body.dump());
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  ASSERT_NE(cell->reference_cell, nullptr);
  const FrozenCell& ref = *cell->reference_cell;
  EXPECT_TRUE(ref.spec.IsReference());
  EXPECT_EQ(ref.spec.checkpoint.digest, cell->spec.checkpoint.digest);
  EXPECT_FALSE(ref.spec.checkpoint.digest.empty());
  EXPECT_EQ(ref.spec.runtime.transformers, SubmitContext{}.transformers_pin);
  EXPECT_EQ(cell->spec.reference.cell, ref.id);
  EXPECT_TRUE(cell->spec.reference.path.empty());
  EXPECT_EQ(json::parse(cell->spec_json)["reference"], (json{{"cell", ref.id}}));

  json bf16 = body;
  bf16["precision"] = "bf16";
  auto variant = freezer_.FreezeAndWait(bf16.dump());
  ASSERT_TRUE(variant.ok());
  EXPECT_NE(variant->id, cell->id);
  EXPECT_EQ(variant->reference_cell->id, ref.id);
  json shorter = body;
  shorter["decode"] = {{"max_new_tokens", 4}};
  EXPECT_NE(freezer_.FreezeAndWait(shorter.dump())->reference_cell->id, ref.id);
}

TEST_F(IdentityTest, AReferenceBodyFreezesTheCheckpointOnly) {
  // Verifies a reference body resolves no repository (none is named), digests the checkpoint,
  // and refuses a text prompt when the checkpoint has no tokenizer (400 naming the prompt), but
  // takes one when it has one.
  const int calls = resolver_.calls;
  json body = {{"kind", "reference"}, {"checkpoint", (dir_.path() / "ckpt").string()},
               {"prompts", {{{"ids", {1, 2, 3}}}}}};
  auto cell = freezer_.FreezeAndWait(body.dump());
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  EXPECT_EQ(resolver_.calls, calls);
  EXPECT_TRUE(cell->spec.IsReference());
  EXPECT_EQ(cell->spec.checkpoint.digest, *DirectoryDigest((dir_.path() / "ckpt").string()));
  EXPECT_EQ(cell->repository, (dir_.path() / "ckpt").string());  // a label
  EXPECT_EQ(cell->model_family, "reference");

  body["prompts"] = {{{"ids", {1}}}, {{"text", "Hello"}, {"chat", true}}};
  Status s = ErrorOf(body);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'prompts[1]': a text prompt needs the checkpoint's tokenizer"),
            std::string::npos)
      << s.message();
  testing::WriteFile(dir_.path() / "ckpt" / "tokenizer.json", "{}");
  EXPECT_TRUE(freezer_.FreezeAndWait(body.dump()).ok());

  // The same check for the prompts of a validation body's reference cell.
  json validation = BaseBody();
  validation.erase("reference");
  validation["checkpoint"] = (dir_.path() / "second" / "ckpt").string();
  validation["prompts"] = {{{"text", "Hello"}}};
  EXPECT_EQ(ErrorOf(validation).code(), StatusCode::kInvalidArgument);
}

TEST_F(IdentityTest, RelativeRepositoryIsRejected) {
  // Verifies a relative repository path (resolved differently by each process) is a 400 naming it.
  json body = BaseBody();
  body["repository"] = "var/demo/adapter";
  Status s = ErrorOf(body);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("var/demo/adapter"), std::string::npos) << s.message();
}

TEST_F(IdentityTest, ResolverErrorsPassThrough) {
  // Verifies git resolution errors reach the caller unchanged.
  json body = BaseBody();
  body["branch"] = "missing";
  Status s = ErrorOf(body);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("branch 'missing'"), std::string::npos);
}

TEST_F(IdentityTest, TheReportsReproduceBodyGivesTheSameCell) {
  // Verifies the report's reproduce body (commit, no branch) freezes to the same cell id.
  json body = BaseBody();
  body["topology"] = {{"tp", 2}};
  body["env"] = {{"OMP_NUM_THREADS", "1"}};
  auto cell = freezer_.FreezeAndWait(body.dump());
  ASSERT_TRUE(cell.ok());
  json again = ReproduceBody(ParseCellSpecJson(cell->spec_json).value());
  EXPECT_EQ(again.count("branch"), 0u);
  EXPECT_EQ(IdOf(again), cell->id);
}

TEST(FreezePendingTest, AValidBodyIsPendingWhileItsDigestsAreComputedThenFrozen) {
  // Verifies Freeze never waits for hashing: while the checkpoint's digest is computed it
  // answers DigestPending naming each directory and its progress (the reference queued behind
  // the checkpoint), with the commit resolved; every check that needs no digest still fails at
  // once (bad field, unknown branch, no config.json, text prompts without a tokenizer); once
  // the digests are known the same body freezes to the cell FreezeAndWait gives.
  TempDir dir;
  testing::MakeCheckpoint(dir.path());
  constexpr int64_t kMiB = int64_t{1} << 20;
  testing::WriteBigFile(dir.path() / "ckpt" / "model.safetensors", 3 * kMiB);
  testing::WriteBigFile(dir.path() / "reference" / "reference.safetensors", 2 * kMiB);
  testing::Backdate(dir.path());
  testing::HashingGate gate;
  DigestCache::Options options;
  options.inline_bytes = 0;
  options.before_block = [&gate](const std::filesystem::path&) { gate.Pass(); };
  DigestCache digests(options);
  FakeCommitResolver resolver;
  SubmitContext context;
  context.torch_pin = "2.11.0";
  CellFreezer freezer(context, resolver, digests);
  const std::string ckpt = (dir.path() / "ckpt").string();
  const std::string ref = (dir.path() / "reference").string();
  const json body = {{"repository", "/repos/adapt"}, {"branch", "main"},
                     {"model_family", "llama"},      {"checkpoint", ckpt},
                     {"reference", ref}};

  auto outcome = freezer.Freeze(body.dump());
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  ASSERT_TRUE(std::holds_alternative<DigestPending>(*outcome));
  const DigestPending& pending = std::get<DigestPending>(*outcome);
  EXPECT_EQ(pending.reason, "digesting checkpoint '" + ckpt +
                                "': 0.0 of 3.1 MB hashed (0 of 2 files); digesting reference '" +
                                ref + "': queued behind another directory (2.1 MB in 2 files "
                                      "to hash)");
  EXPECT_EQ(pending.bytes_hashed, 0);
  EXPECT_EQ(pending.bytes_total,
            static_cast<int64_t>(std::filesystem::file_size(dir.path() / "ckpt" / "config.json") +
                                 std::filesystem::file_size(dir.path() / "reference" /
                                                            "reference.json")) +
                5 * kMiB);
  EXPECT_EQ(pending.spec.commit, FakeCommitResolver::kSha);
  EXPECT_TRUE(pending.spec.checkpoint.digest.empty());

  json bad = body;
  bad["flavour"] = 1;
  EXPECT_EQ(freezer.Freeze(bad.dump()).status().code(), StatusCode::kInvalidArgument);
  bad = body;
  bad["branch"] = "missing";
  EXPECT_EQ(freezer.Freeze(bad.dump()).status().code(), StatusCode::kNotFound);
  bad = body;
  bad["checkpoint"] = ref;  // no config.json
  EXPECT_EQ(freezer.Freeze(bad.dump()).status().code(), StatusCode::kNotFound);
  const json text_prompt = {{"kind", "reference"}, {"checkpoint", ckpt},
                            {"prompts", {{{"text", "Hello"}}}}};
  EXPECT_EQ(freezer.Freeze(text_prompt.dump()).status().code(), StatusCode::kInvalidArgument);
  // A reference cell of the checkpoint joins its job.
  auto reference_cell = freezer.Freeze(json{{"kind", "reference"}, {"checkpoint", ckpt}}.dump());
  ASSERT_TRUE(reference_cell.ok());
  EXPECT_TRUE(std::holds_alternative<DigestPending>(*reference_cell));

  gate.Open();
  auto waited = freezer.FreezeAndWait(body.dump());
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(waited->spec.checkpoint.digest, DirectoryDigest(ckpt).value());
  EXPECT_EQ(waited->spec.reference.digest, DirectoryDigest(ref).value());
  auto frozen = freezer.Freeze(body.dump());
  ASSERT_TRUE(frozen.ok());
  ASSERT_TRUE(std::holds_alternative<FrozenCell>(*frozen));
  EXPECT_EQ(std::get<FrozenCell>(*frozen).id, waited->id);
  EXPECT_EQ(digests.computations(), 4);  // each file once
}

}  // namespace
}  // namespace gatehouse::controller
