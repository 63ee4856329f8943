// The cell spec (common/cell_spec.h): the frozen form's strict parse, the limits every knob
// has in both forms, the canonical JSON and GPU-model matching.
#include "common/cell_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/phases.h"
#include "tests/common/sample_spec.h"

namespace gatehouse {
namespace {

using nlohmann::json;
using ::gatehouse::testing::SampleSpec;
using ::testing::HasSubstr;

std::string FrozenError(const json& spec) {
  Result<CellSpec> r = ParseCellSpec(spec);
  return r.ok() ? "" : r.status().message();
}

// A minimal valid submit body; `extra` members are merged in.
std::string Body(const json& extra = json::object()) {
  json body = {{"repository", "/repos/adapter"},
               {"branch", "main"},
               {"model_family", "llama"},
               {"checkpoint", "/data/llama-tiny/checkpoint"}};
  body.update(extra);
  return body.dump();
}

std::string BodyError(const json& extra) {
  Result<SubmitRequest> r = ParseSubmitBody(Body(extra), SubmitContext{});
  return r.ok() ? "" : r.status().message();
}

// Verifies a spec survives its canonical JSON unchanged, pins included only when set.
TEST(CellSpecTest, CanonicalJsonRoundTrips) {
  CellSpec spec = SampleSpec();
  EXPECT_EQ(ParseCellSpec(CellSpecToJson(spec)).value(), spec);
  EXPECT_FALSE(CellSpecToJson(spec)["runtime"].contains("cuda"));
  EXPECT_FALSE(CellSpecToJson(spec)["runtime"].contains("gpu_model"));
  spec.runtime.device = "cuda";
  spec.runtime.cuda = "13.0";
  spec.runtime.gpu_model = "H200";
  spec.topology = {2, 2, 1, 4};
  spec.env = {{"NCCL_DEBUG", "INFO"}};
  spec.training.lr = 3e-4;
  const std::string canonical = CanonicalSpecJson(spec);
  const CellSpec again = ParseCellSpecJson(canonical).value();
  EXPECT_EQ(again, spec);
  EXPECT_EQ(CanonicalSpecJson(again), canonical);
  EXPECT_EQ(again.topology.world_size(), 4);  // ep adds no rank
  EXPECT_FALSE(CellSpecToJson(spec)["topology"].contains("dp_shard"));  // 1: not frozen
  spec.topology.dp_shard = 2;
  spec.topology.cp = 2;
  spec.topology.etp = 2;
  const json frozen = CellSpecToJson(spec);
  EXPECT_EQ(frozen["topology"]["dp_shard"], 2);
  EXPECT_EQ(frozen["topology"]["etp"], 2);
  EXPECT_EQ(ParseCellSpec(frozen).value(), spec);
  EXPECT_EQ(spec.topology.world_size(), 16);  // tp 2 x dp 2 x dp_shard 2 x cp 2
  EXPECT_EQ(TopologyText(spec.topology), "tp=2 dp=2 pp=1 ep=4 dp_shard=2 cp=2 etp=2");
  EXPECT_EQ(TopologyText(CellSpec::Topology{}), "tp=1 dp=1 pp=1 ep=1");
}

// Verifies the frozen form names what is missing or unknown at any depth.
TEST(CellSpecTest, FrozenFormIsStrict) {
  json spec = CellSpecToJson(SampleSpec());
  spec["training"].erase("seed");
  EXPECT_EQ(FrozenError(spec), "missing field 'training.seed'");
  spec = CellSpecToJson(SampleSpec());
  spec.erase("launch");
  EXPECT_EQ(FrozenError(spec), "missing field 'launch'");
  spec = CellSpecToJson(SampleSpec());
  spec["topology"]["zz"] = 1;
  EXPECT_EQ(FrozenError(spec), "unknown field 'topology.zz'");
  spec = CellSpecToJson(SampleSpec());
  spec["checkpoint"] = "/data/ckpt";
  EXPECT_EQ(FrozenError(spec), "field 'checkpoint': expected an object, got \"/data/ckpt\"");
  spec = CellSpecToJson(SampleSpec());
  spec["spec_version"] = 2;
  EXPECT_EQ(FrozenError(spec), "field 'spec_version': expected version 1, got 2");
  EXPECT_THAT(ParseCellSpecJson("[1]").status().message(),
              HasSubstr("field 'spec': expected an object"));
}

// Verifies each topology factor and their product are bounded, in both forms, without
// overflow for huge factors (what the agent's rank count relies on).
TEST(CellSpecTest, TopologyIsBounded) {
  const std::pair<json, std::string> cases[] = {
      {{{"tp", 0}}, "field 'topology.tp': expected an integer from 1 to 64, got 0"},
      {{{"dp", "2"}}, "field 'topology.dp': expected an integer from 1 to 64, got \"2\""},
      {{{"pp", 1.5}}, "field 'topology.pp': expected an integer from 1 to 64, got 1.5"},
      {{{"tp", -3}}, "field 'topology.tp': expected an integer from 1 to 64, got -3"},
      {{{"tp", true}}, "field 'topology.tp': expected an integer from 1 to 64, got true"},
      {{{"ep", 65}}, "field 'topology.ep': expected an integer from 1 to 64, got 65"},
      {{{"tp", 18446744073709551615ull}},
       "field 'topology.tp': expected an integer from 1 to 64, got 18446744073709551615"},
  };
  for (const auto& [topology, message] : cases) {
    EXPECT_EQ(BodyError({{"topology", topology}}), message);
    json spec = CellSpecToJson(SampleSpec());
    spec["topology"].update(topology);
    EXPECT_EQ(FrozenError(spec), message);
  }
  // The product: each form shows the topology it read.
  EXPECT_EQ(BodyError({{"topology", {{"tp", 8}, {"dp", 16}}}}),
            "field 'topology': expected pp x dp x dp_shard x cp x tp of at most 64 ranks, got "
            "{\"dp\":16,\"tp\":8}");
  EXPECT_EQ(BodyError({{"topology", {{"dp_shard", 8}, {"cp", 16}}}}),
            "field 'topology': expected pp x dp x dp_shard x cp x tp of at most 64 ranks, got "
            "{\"cp\":16,\"dp_shard\":8}");
  json spec = CellSpecToJson(SampleSpec());
  spec["topology"].update({{"tp", 8}, {"dp", 16}});
  EXPECT_EQ(FrozenError(spec),
            "field 'topology': expected pp x dp x dp_shard x cp x tp of at most 64 ranks, got "
            "{\"dp\":16,\"ep\":1,\"pp\":1,\"tp\":8}");
  EXPECT_EQ(BodyError({{"topology", 2}}), "field 'topology': expected an object, got 2");
  // Expert parallelism borrows its ranks from dp_shard x cp (common/mesh.h): a submitted
  // mesh is held to that; a frozen one is not, so a cell stored before the rule keeps reading.
  EXPECT_EQ(BodyError({{"topology", {{"tp", 4}, {"dp", 2}, {"pp", 2}, {"ep", 8}}}}),
            "field 'topology.ep': 8 ranks must be borrowed from dp_shard x cp x tp = 4 (etp = 1): "
            "ep must divide it and be a multiple of cp x tp (4)");
  EXPECT_EQ(BodyError({{"topology", {{"tp", 2}, {"dp_shard", 4}, {"pp", 2}, {"ep", 4}, {"etp", 2}}}}),
            "");
  EXPECT_EQ(BodyError({{"topology", {{"tp", 2}, {"dp_shard", 2}, {"ep", 2}, {"etp", 3}}}}),
            "field 'topology.etp': 3 must be 1 (experts not tensor-parallel) or tp (2)");
  json stored = CellSpecToJson(SampleSpec());
  stored["topology"].update({{"tp", 4}, {"dp", 2}, {"pp", 2}, {"ep", 8}});
  EXPECT_EQ(FrozenError(stored), "");
  EXPECT_EQ(BodyError({{"topology", {{"tp", 64}}}}), "");
}

// Verifies the knobs a new user could set to run for days are refused with a 400-style error
// naming the field and the value (they were accepted before the limits existed).
TEST(CellSpecTest, EveryKnobIsBounded) {
  EXPECT_EQ(BodyError({{"training", {{"steps", 1000000000}}}}),
            "field 'training.steps': expected an integer from 2 to 1000, got 1000000000");
  EXPECT_EQ(BodyError({{"decode", {{"max_new_tokens", 100000000}}}}),
            "field 'decode.max_new_tokens': expected an integer from 1 to 4096, got 100000000");
  EXPECT_EQ(BodyError({{"training", {{"lr", 5}}}}),
            "field 'training.lr': expected a number above 0 and at most 1, got 5");
  EXPECT_EQ(BodyError({{"training", {{"seed", -1}}}}),
            "field 'training.seed': expected a non-negative 64-bit integer, got -1");
  EXPECT_EQ(BodyError({{"priority", 101}}),
            "field 'priority': expected an integer from -100 to 100, got 101");
  json many = json::object();
  for (int i = 0; i < 65; ++i) many["V" + std::to_string(i)] = "x";
  EXPECT_EQ(BodyError({{"env", many}}), "field 'env': 65 variables; at most 64");
  EXPECT_THAT(BodyError({{"env", {{"BIG", std::string(4097, 'x')}}}}),
              HasSubstr("field 'env.BIG': expected a string of at most 4096 bytes without NUL"));
  EXPECT_THAT(BodyError({{"env", {{"NUL", std::string("a\0b", 3)}}}}),
              HasSubstr("field 'env.NUL': expected a string of at most 4096 bytes without NUL"));
  EXPECT_THAT(BodyError({{"branch", std::string(1025, 'b')}}),
              HasSubstr("field 'branch': expected a non-empty string of at most 1024 bytes"));
  EXPECT_THAT(BodyError({{"checkpoint", "/" + std::string(4096, 'c')}}),
              HasSubstr("field 'checkpoint': expected a non-empty string of at most 4096 bytes"));
  EXPECT_THAT(BodyError({{"runtime", {{"torch", "2.11.0; rm -rf /"}}}}),
              HasSubstr("field 'runtime.torch': expected a torch version"));
  // The bounds themselves are accepted.
  EXPECT_EQ(BodyError({{"training", {{"steps", 1000}, {"lr", 1}}},
                       {"decode", {{"max_new_tokens", 4096}}}}),
            "");
}

// Verifies the body's defaults: the spec a minimal body gives.
TEST(CellSpecTest, BodyDefaults) {
  SubmitContext context;
  context.torch_pin = "2.11.0";
  const SubmitRequest r = ParseSubmitBody(Body(), context).value();
  EXPECT_EQ(r.branch, "main");
  EXPECT_EQ(r.priority, 0);
  EXPECT_EQ(r.spec.commit, "");
  EXPECT_TRUE(r.auto_reference);  // the controller finds or makes the reference cell
  EXPECT_EQ(r.spec.reference, ReferenceInput{});
  EXPECT_EQ(r.spec.runtime.torch, "2.11.0");
  EXPECT_EQ(r.spec.runtime.device, "cpu");
  EXPECT_EQ(r.spec.precision, "fp32");
  EXPECT_EQ(r.spec.mode, "eager");
  EXPECT_EQ(r.spec.training, CellSpec::Training{});
  EXPECT_EQ(r.spec.decode, CellSpec::Decode{});
  EXPECT_EQ(r.spec.topology.world_size(), 1);
  EXPECT_EQ(r.spec.phases, SampleSpec().phases);
}

// Verifies a submitted cell whose phases lack a prerequisite (PhasePrerequisite) is refused
// naming the phase and the missing one, transitively, while every phase with its chain, the
// default set and a frozen spec with the same gap (stored before the check) are accepted.
TEST(CellSpecTest, PhasesNeedTheirPrerequisites) {
  EXPECT_EQ(BodyError({{"phases", {"identity", "config", "load", "inference"}}}),
            "field 'phases': phase \"load\" needs phase \"construct\", which is not requested "
            "(add it)");
  EXPECT_THAT(BodyError({{"phases", {"save"}}}), HasSubstr("\"save\" needs phase \"load\""));
  EXPECT_THAT(BodyError({{"phases", {"construct", "identity"}}}),
              HasSubstr("\"construct\" needs phase \"config\""));
  for (std::string_view phase : kPhases) {
    json phases = json::array();
    for (std::optional<std::string_view> p = phase; p; p = PhasePrerequisite(*p)) {
      phases.push_back(std::string(*p));
    }
    EXPECT_EQ(BodyError({{"phases", phases}}), "") << phases.dump();
  }
  EXPECT_EQ(BodyError({{"phases", {"identity"}}}), "");
  EXPECT_EQ(BodyError({{"phases", {"config", "identity"}}}), "");
  json frozen = CellSpecToJson(SampleSpec());
  frozen["phases"] = {"identity", "config", "load"};
  EXPECT_EQ(FrozenError(frozen), "");
}

// Verifies GPU-model pins match case-insensitive substrings of nvidia-smi's names.
TEST(CellSpecTest, GpuModelMatching) {
  EXPECT_TRUE(GpuModelMatches("NVIDIA H200", "h200"));
  EXPECT_TRUE(GpuModelMatches("NVIDIA H200", "H200"));
  EXPECT_TRUE(GpuModelMatches("NVIDIA H200", ""));
  EXPECT_FALSE(GpuModelMatches("NVIDIA A100-SXM4-80GB", "H200"));
  EXPECT_FALSE(GpuModelMatches("", "H200"));
}

// A reference cell of the sample's checkpoint with two prompts.
CellSpec SampleReference() {
  CellSpec r = ReferenceCellFor(SampleSpec(), {}, SubmitContext{});
  r.prompts = {Prompt{{5, 6, 7}, "", false}, Prompt{{}, "Hello there", true}};
  return r;
}

// Verifies a validation cell's frozen form is the one it had before kinds, controls and
// reference cells existed (so stored cell ids do not change): no kind, control or prompts
// member, and a reference of exactly path and digest.
TEST(CellSpecTest, ValidationCellKeepsItsFrozenForm) {
  const json spec = CellSpecToJson(SampleSpec());
  EXPECT_FALSE(spec.contains("kind"));
  EXPECT_FALSE(spec.contains("control"));
  EXPECT_FALSE(spec.contains("prompts"));
  EXPECT_EQ(spec["reference"], (json{{"path", "/data/llama-tiny/reference"},
                                     {"digest", "sha256:" + std::string(64, '2')}}));
  EXPECT_FALSE(spec["runtime"].contains("transformers"));
}

// Verifies a reference cell's frozen form: its own members only, round-tripping, with the
// transformers pin required and its two phases fixed.
TEST(CellSpecTest, ReferenceCellFrozenForm) {
  const CellSpec r = SampleReference();
  const json spec = CellSpecToJson(r);
  EXPECT_EQ(spec["kind"], "reference");
  for (const char* absent : {"repository", "commit", "model_family", "reference", "topology",
                             "precision", "mode", "launch"}) {
    EXPECT_FALSE(spec.contains(absent)) << absent;
  }
  EXPECT_EQ(spec["runtime"]["transformers"], "5.24.0");
  EXPECT_EQ(spec["prompts"], json::parse(R"([{"ids":[5,6,7]},{"text":"Hello there","chat":true}])"));
  EXPECT_EQ(ParseCellSpec(spec).value(), r);

  json with_repo = spec;
  with_repo["repository"] = "/repos/adapter";
  EXPECT_THAT(FrozenError(with_repo), HasSubstr("unknown field 'repository'"));
  json no_pin = spec;
  no_pin["runtime"].erase("transformers");
  EXPECT_THAT(FrozenError(no_pin), HasSubstr("runtime.transformers"));
  json one_phase = spec;
  one_phase["phases"] = {"identity"};
  EXPECT_THAT(FrozenError(one_phase), HasSubstr("every phase of a reference cell"));
  json gate_phase = spec;
  gate_phase["phases"] = {"identity", "load"};
  EXPECT_THAT(FrozenError(gate_phase), HasSubstr("unknown phase \"load\" for a reference cell"));
  json no_prompts = spec;
  no_prompts.erase("prompts");
  EXPECT_EQ(FrozenError(no_prompts), "missing field 'prompts'");
}

// Verifies a reference body: defaults (phases, the controller's pins), prompts read one by one
// with errors naming the prompt, and members of a validation body refused.
TEST(CellSpecTest, ReferenceBody) {
  SubmitContext context;
  context.transformers_pin = "5.99.0";
  auto parse = [&](const json& body) { return ParseSubmitBody(body.dump(), context); };
  const json base = {{"kind", "reference"}, {"checkpoint", "/data/ckpt"}};
  auto r = parse(base);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->spec.IsReference());
  EXPECT_EQ(r->spec.runtime.transformers, "5.99.0");
  EXPECT_EQ(r->spec.phases, (std::vector<std::string>{"identity", "reference"}));
  EXPECT_TRUE(r->spec.prompts.empty());

  auto error = [&](const json& extra) {
    json body = base;
    body.update(extra);
    auto parsed = parse(body);
    return parsed.ok() ? std::string() : parsed.status().message();
  };
  EXPECT_EQ(error({{"prompts", {{{"ids", {1, 2}}}, {{"text", "hi"}, {"chat", true}}}}}), "");
  EXPECT_THAT(error({{"prompts", {{{"ids", {1}}, {"text", "hi"}}}}}),
              HasSubstr("field 'prompts[0]'"));
  EXPECT_THAT(error({{"prompts", {{{"ids", {1}}, {"chat", true}}}}}),
              HasSubstr("'prompts[0].chat': only a text prompt"));
  EXPECT_THAT(error({{"prompts", {{{"ids", json::array()}}}}}), HasSubstr("prompts[0].ids"));
  EXPECT_THAT(error({{"prompts", {{{"ids", {3, -1}}}}}}), HasSubstr("prompts[0].ids"));
  EXPECT_THAT(error({{"prompts", {{{"text", ""}}}}}), HasSubstr("prompts[0].text"));
  EXPECT_THAT(error({{"prompts", {{{"text", "x"}, {"chat", "yes"}}}}}),
              HasSubstr("prompts[0].chat"));
  json seventeen = json::array();
  for (int i = 0; i < 17; ++i) seventeen.push_back({{"ids", {1}}});
  EXPECT_THAT(error({{"prompts", seventeen}}), HasSubstr("17 prompts; at most 16"));
  EXPECT_THAT(error({{"repository", "/repos/adapter"}}), HasSubstr("unknown field 'repository'"));
  EXPECT_THAT(error({{"precision", "bf16"}}), HasSubstr("unknown field 'precision'"));
  EXPECT_THAT(error({{"phases", {"identity"}}}), HasSubstr("every phase of a reference cell"));
  EXPECT_THAT(error({{"kind", "upstream"}}), HasSubstr("field 'kind'"));
}

// Verifies the three ways a validation body names its reference, and what only a reference
// cell may carry.
TEST(CellSpecTest, ValidationBodyReferenceForms) {
  auto none = ParseSubmitBody(Body(), SubmitContext{});
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->auto_reference);
  EXPECT_TRUE(none->spec.reference.path.empty());

  auto dir = ParseSubmitBody(Body({{"reference", "/data/ref/"}}), SubmitContext{});
  ASSERT_TRUE(dir.ok());
  EXPECT_FALSE(dir->auto_reference);
  EXPECT_EQ(dir->spec.reference.path, "/data/ref");

  const std::string id(64, 'c');
  auto cell = ParseSubmitBody(Body({{"reference", {{"cell", id}}}, {"control", std::string(64, 'd')}}),
                              SubmitContext{});
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  EXPECT_EQ(cell->spec.reference.cell, id);
  EXPECT_EQ(cell->spec.control, std::string(64, 'd'));
  EXPECT_EQ(CellSpecToJson(cell->spec)["reference"], (json{{"cell", id}}));

  auto prompts = ParseSubmitBody(Body({{"prompts", {{{"ids", {4, 5}}}}}}), SubmitContext{});
  ASSERT_TRUE(prompts.ok());
  EXPECT_EQ(prompts->reference_prompts, (std::vector<Prompt>{Prompt{{4, 5}, "", false}}));

  EXPECT_THAT(BodyError({{"reference", {{"cell", "abc"}}}}), HasSubstr("field 'reference.cell'"));
  EXPECT_THAT(BodyError({{"reference", {{"path", "/x"}}}}), HasSubstr("reference.path"));
  EXPECT_THAT(BodyError({{"control", "nope"}}), HasSubstr("field 'control'"));
  EXPECT_THAT(BodyError({{"reference", "/data/ref"}, {"prompts", {{{"ids", {1}}}}}}),
              HasSubstr("prompts are the reference cell's"));
  EXPECT_THAT(BodyError({{"runtime", {{"transformers", "5.24.0"}}}}),
              HasSubstr("only a reference cell runs transformers"));
}

// Verifies the frozen reference member's forms: a run spec carries the fetched bundle's path
// and digest beside the reference cell's id; a digest alone is refused.
TEST(CellSpecTest, FrozenReferenceForms) {
  CellSpec spec = SampleSpec();
  spec.reference = {};
  spec.reference.cell = std::string(64, 'e');
  json frozen = CellSpecToJson(spec);
  EXPECT_EQ(ParseCellSpec(frozen).value(), spec);
  spec.reference.path = "/work/attempts/3/reference";
  spec.reference.digest = "sha256:" + std::string(64, 'f');
  json run = CellSpecToJson(spec);
  EXPECT_EQ(run["reference"].size(), 3u);
  EXPECT_EQ(ParseCellSpec(run).value(), spec);
  frozen["reference"]["digest"] = "sha256:x";
  EXPECT_THAT(FrozenError(frozen), HasSubstr("'reference.digest' needs 'reference.path'"));
}

// Verifies the reference cell made for a validation cell takes the inputs that change
// upstream's outputs (checkpoint, device, torch, decode length, training, prompts) and none of
// the adapter's (precision, topology, mode, repository): variants of one checkpoint share one
// reference cell.
TEST(CellSpecTest, ReferenceCellForSharesOneReferenceAcrossVariants) {
  CellSpec a = SampleSpec();
  CellSpec b = SampleSpec();
  b.precision = "bf16";
  b.topology.tp = 2;
  b.repository = "/repos/other";
  const CellSpec ra = ReferenceCellFor(a, {}, SubmitContext{});
  EXPECT_EQ(CanonicalSpecJson(ra), CanonicalSpecJson(ReferenceCellFor(b, {}, SubmitContext{})));
  EXPECT_EQ(ra.checkpoint, a.checkpoint);
  EXPECT_EQ(ra.runtime.torch, a.runtime.torch);
  EXPECT_EQ(ra.decode, a.decode);
  EXPECT_EQ(ra.training, a.training);
  CellSpec c = SampleSpec();
  c.decode.max_new_tokens = 8;
  EXPECT_NE(CanonicalSpecJson(ra), CanonicalSpecJson(ReferenceCellFor(c, {}, SubmitContext{})));
  EXPECT_NE(CanonicalSpecJson(ra),
            CanonicalSpecJson(ReferenceCellFor(a, {Prompt{{1}, "", false}}, SubmitContext{})));
}

}  // namespace
}  // namespace gatehouse
