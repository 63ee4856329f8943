// The envelope of correct implementations (envelope.h) as the bundle carries it, and the
// numeric gates' verdicts against it: inside its margins a comparison is correct (PASS), equal
// to upstream it is bit-exact, outside it FAILs; without one the site's own bars stay.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "gatehouse/worker/bars.h"
#include "gatehouse/worker/envelope.h"
#include "gatehouse/worker/gates.h"
#include "gatehouse/worker/reference.h"
#include "gates_fixture.h"

namespace gatehouse::worker {
namespace {

using nlohmann::json;
using testing::Fixture;
using testing::FakeFamily;
using testing::FakeOptions;
using testing::FixtureOptions;
using testing::RunThrough;
using ::testing::HasSubstr;

const Figure* FigureOf(const GateOutcome& out, std::string_view name) {
  const Figure* f = out.Find(name);
  if (f == nullptr) ADD_FAILURE() << "no figure " << name;
  return f;
}
double Real(const GateOutcome& out, std::string_view name) {
  const Figure* f = FigureOf(out, name);
  const auto* v = f ? std::get_if<double>(&f->value) : nullptr;
  return v ? *v : std::nan("");
}
std::string Text(const GateOutcome& out, std::string_view name) {
  const Figure* f = FigureOf(out, name);
  const auto* v = f ? std::get_if<std::string>(&f->value) : nullptr;
  return v ? *v : "";
}

#define EXPECT_STATUS(out, s) \
  EXPECT_EQ(GateStatusName((out).status), GateStatusName(s)) << (out).reason

/// An envelope with one spread for every logit figure and training figure, both precisions.
json EnvelopeJson(double max_abs, double kl, double top1, double grad_rel, double loss_rel) {
  const json logits{{"max_abs_diff", max_abs}, {"max_abs_diff_from", "attention=sdpa"},
                    {"kl_mean", kl}, {"kl_mean_from", "combined"},
                    {"top1_percent", top1}, {"top1_percent_from", "rope=complex"}};
  const json precision{{"prompt", logits},
                       {"decode_steps", logits},
                       {"training", {{"first_loss_rel", loss_rel},
                                     {"loss_rel", {loss_rel, loss_rel, loss_rel, loss_rel}},
                                     {"grad_norm_rel", grad_rel},
                                     {"grad_norm_rel_from", "combined"},
                                     {"grad_sum_rel", grad_rel},
                                     {"grad_sum_rel_from", "combined"}}}};
  return {{"version", 1},
          {"variations", {"attention=sdpa", "rope=complex", "combined"}},
          {"fp32", precision},
          {"bf16", precision}};
}

/// Rewrites the fixture's reference.json with `envelope` (null: without one).
void SetEnvelope(const Fixture& fx, const json& envelope) {
  const auto path = fx.reference_dir / "reference.json";
  json meta = json::parse(std::ifstream(path));
  if (envelope.is_null()) {
    meta.erase("envelope");
  } else {
    meta["envelope"] = envelope;
  }
  std::ofstream(path, std::ios::trunc) << meta.dump();
}

// Verifies the bundle reader takes the envelope of both precisions with the variations run,
// reads a bundle without one as empty, and refuses a malformed one naming the field and value.
TEST(EnvelopeTest, ReadFromTheBundle) {
  Fixture fx;
  fx.Write();
  SetEnvelope(fx, EnvelopeJson(3e-6, 1e-13, 100, 4e-7, 1e-7));
  Result<ReferenceBundle> ref = LoadReference(fx.reference_dir);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const Envelope* e = ref->envelope.For("bf16");
  ASSERT_NE(e, nullptr);
  EXPECT_DOUBLE_EQ(e->prompt.max_abs_diff, 3e-6);
  EXPECT_EQ(e->prompt.max_abs_diff_from, "attention=sdpa");
  EXPECT_DOUBLE_EQ(e->training.grad_norm_rel, 4e-7);
  EXPECT_EQ(e->training.loss_rel.size(), 4u);
  EXPECT_THAT(e->Describe(), HasSubstr("3 variation(s) of upstream (attention=sdpa"));

  SetEnvelope(fx, nullptr);
  ref = LoadReference(fx.reference_dir);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->envelope.For("fp32"), nullptr);

  const std::vector<std::pair<std::function<void(json&)>, std::string>> bad = {
      {[](json& e) { e["fp32"]["prompt"]["max_abs_diff"] = -1; }, "envelope.fp32.prompt.max_abs_diff' is -1"},
      {[](json& e) { e["bf16"]["decode_steps"]["top1_percent"] = 150; }, "top1_percent' is 150"},
      {[](json& e) { e["fp32"].erase("training"); }, "envelope.fp32.training' is missing"},
      {[](json& e) { e["bf16"]["training"]["loss_rel"] = json::array(); }, "loss_rel' must be a non-empty list"},
  };
  for (const auto& [edit, want] : bad) {
    json env = EnvelopeJson(3e-6, 1e-13, 100, 4e-7, 1e-7);
    edit(env);
    SetEnvelope(fx, env);
    const Result<ReferenceBundle> r = LoadReference(fx.reference_dir);
    ASSERT_FALSE(r.ok()) << want;
    EXPECT_THAT(r.status().message(), HasSubstr(want));
  }
}

// Verifies a comparison that is not equal to upstream but inside the envelope's margins PASSes
// as "correct, not bit-exact" (one weight moved by 1e-5: logits apart by more than 0, KL far
// below 1e-9), the same model FAILs once the envelope is narrower than its difference, and
// without an envelope the site's equality bar holds and says so.
TEST(EnvelopeTest, InferenceInsideTheEnvelopeIsCorrect) {
  Fixture fx;
  fx.WriteReference(*fx.model);
  fx.tensors["model.layers.0.proj.weight"][3][5] += 1e-5;
  fx.WriteCheckpoint();
  auto run = [&](const json& envelope) {
    SetEnvelope(fx, envelope);
    GateContext ctx = fx.Context();
    return RunThrough(ctx, "inference");
  };
  const GateOutcome wide = run(EnvelopeJson(1e-3, 1e-9, 100, 0, 0));
  EXPECT_STATUS(wide, GateStatus::kPass);
  EXPECT_GT(Real(wide, "max_abs_diff"), 0.0);
  EXPECT_EQ(wide.figures.front().name, "claim");
  EXPECT_EQ(Text(wide, "claim"), "correct, not bit-exact");
  EXPECT_DOUBLE_EQ(Real(wide, "bar_max_abs_diff"), kFloorMargin * 1e-3);
  EXPECT_DOUBLE_EQ(Real(wide, "envelope_max_abs_diff"), 1e-3);
  EXPECT_THAT(Text(wide, "envelope_widest"), HasSubstr("max abs attention=sdpa"));
  EXPECT_THAT(Text(wide, "bars"), HasSubstr("envelope of correct implementations"));

  const GateOutcome narrow = run(EnvelopeJson(1e-9, 1e-30, 100, 0, 0));
  EXPECT_STATUS(narrow, GateStatus::kFail);
  EXPECT_EQ(Text(narrow, "claim"), "outside the bars");
  EXPECT_THAT(narrow.reason, HasSubstr("max_abs_diff"));

  const GateOutcome none = run(nullptr);
  EXPECT_STATUS(none, GateStatus::kFail);
  EXPECT_THAT(Text(none, "envelope"), HasSubstr("none in the bundle"));
  EXPECT_THAT(none.reason, HasSubstr("exceeds the bar 0"));
}

// Verifies equality stays a claim of its own: a model equal to upstream is "bit-exact" whatever
// the envelope allows, in the inference, decode and training gates.
TEST(EnvelopeTest, EqualToUpstreamIsBitExact) {
  Fixture fx;
  fx.Write();
  SetEnvelope(fx, EnvelopeJson(1e-3, 1e-9, 100, 1e-5, 1e-5));
  GateContext ctx = fx.Context();
  for (const char* phase : {"inference", "decode", "training"}) {
    const GateOutcome out = RunThrough(ctx, phase);
    EXPECT_STATUS(out, GateStatus::kPass);
    EXPECT_EQ(Text(out, "claim"), "bit-exact") << phase;
    ctx = fx.Context();
  }
}

// Verifies the training gate holds losses and gradient norms to the envelope's margins: a trace
// 1e-7 away (upstream's own rounding under another attention backend is of that order) PASSes
// as correct with the envelope and FAILs without; a gradient whose sign differs still FAILs.
TEST(EnvelopeTest, TrainingInsideTheEnvelopeIsCorrect) {
  Fixture fx;
  fx.Write();
  auto train_against = [&](const json& envelope, const std::function<void(TrainingTrace&)>& edit) {
    SetEnvelope(fx, envelope);
    GateContext ctx = fx.Context();
    EXPECT_EQ(RunThrough(ctx, "decode").status, GateStatus::kPass);
    edit(ctx.reference->training.fp32);
    return TrainingGate(ctx);
  };
  const json envelope = EnvelopeJson(0, 0, 100, 5e-7, 5e-7);
  auto nudge = [](TrainingTrace& t) {
    t.losses[1] *= 1 + 1e-7;
    t.grad_norms["model.norm.weight"] *= 1 + 1e-7;
  };
  const GateOutcome inside = train_against(envelope, nudge);
  EXPECT_STATUS(inside, GateStatus::kPass);
  EXPECT_EQ(Text(inside, "claim"), "correct, not bit-exact");
  EXPECT_DOUBLE_EQ(Real(inside, "bar_grad_norm_rel"), kFloorMargin * 5e-7);
  EXPECT_DOUBLE_EQ(Real(inside, "envelope_grad_norm_rel"), 5e-7);

  EXPECT_STATUS(train_against(nullptr, nudge), GateStatus::kFail);

  const GateOutcome sign = train_against(envelope, [](TrainingTrace& t) {
    t.grad_sums["model.norm.weight"] = -t.grad_sums["model.norm.weight"];
  });
  EXPECT_STATUS(sign, GateStatus::kFail);
  EXPECT_THAT(sign.reason, HasSubstr("gradient sum(s) differ"));
}

// Verifies the decode gate's step bars come from the envelope's decode steps (plus upstream's
// KV-cache spread, 0 here) and that a decode within them is correct.
TEST(EnvelopeTest, DecodeStepsInsideTheEnvelopeAreCorrect) {
  Fixture fx;
  fx.WriteReference(*fx.model);
  fx.tensors["model.layers.0.proj.weight"][3][5] += 1e-5;
  fx.WriteCheckpoint();
  SetEnvelope(fx, EnvelopeJson(1e-3, 1e-9, 100, 0, 0));
  GateContext ctx = fx.Context();
  const GateOutcome out = RunThrough(ctx, "decode");
  EXPECT_STATUS(out, GateStatus::kPass);
  EXPECT_EQ(Text(out, "claim"), "correct, not bit-exact");
  EXPECT_DOUBLE_EQ(Real(out, "steps_bar_max_abs_diff"), kFloorMargin * 1e-3);
  EXPECT_DOUBLE_EQ(Real(out, "steps_envelope_max_abs_diff"), 1e-3);
}

// --- version 2: the log-prob and packing envelopes -------------------------------------------

/// `envelope` (EnvelopeJson) made version 2 with one log-prob and one packing envelope in both
/// precisions.
json WithLogprobsAndPacking(json envelope, double lp_mean, double lp_max, double kl_max,
                            double loss_rel, double grad_rel) {
  envelope["version"] = 2;
  for (const char* precision : {"fp32", "bf16"}) {
    envelope[precision]["logprobs"] = {{"mean_abs_diff", lp_mean},
                                       {"mean_abs_diff_from", "attention=sdpa against canonical"},
                                       {"max_abs_diff", lp_max},
                                       {"max_abs_diff_from", "canonical"}};
    envelope[precision]["packing"] = {{"max_abs_diff", 0.0}, {"kl_mean", 0.0},
                                      {"kl_max", kl_max}, {"kl_max_from", "combined"},
                                      {"top1_percent", 100.0}, {"loss_rel", loss_rel},
                                      {"loss_rel_from", "canonical"}, {"grad_rel", grad_rel},
                                      {"grad_rel_from", "norm=fused"}};
  }
  return envelope;
}

// Verifies the reader takes version 2's log-prob and packing envelopes (and a version 1
// envelope without them as absent), and refuses a malformed figure naming it.
TEST(EnvelopeTest, ReadsTheLogprobAndPackingEnvelopes) {
  Fixture fx;
  fx.Write();
  SetEnvelope(fx, WithLogprobsAndPacking(EnvelopeJson(3e-6, 1e-13, 100, 4e-7, 1e-7), 2e-7,
                                         3e-6, 1e-12, 5e-8, 6e-7));
  Result<ReferenceBundle> ref = LoadReference(fx.reference_dir);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const Envelope* e = ref->envelope.For("fp32");
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->logprobs.has_value());
  EXPECT_DOUBLE_EQ(e->logprobs->max_abs_diff, 3e-6);
  EXPECT_EQ(e->logprobs->max_abs_diff_from, "canonical");
  ASSERT_TRUE(e->packing.has_value());
  EXPECT_DOUBLE_EQ(e->packing->grad_rel, 6e-7);
  EXPECT_EQ(e->packing->grad_rel_from, "norm=fused");

  SetEnvelope(fx, EnvelopeJson(3e-6, 1e-13, 100, 4e-7, 1e-7));
  ref = LoadReference(fx.reference_dir);
  ASSERT_TRUE(ref.ok());
  EXPECT_FALSE(ref->envelope.For("bf16")->logprobs.has_value());
  EXPECT_FALSE(ref->envelope.For("bf16")->packing.has_value());

  json bad = WithLogprobsAndPacking(EnvelopeJson(3e-6, 1e-13, 100, 4e-7, 1e-7), 2e-7, 3e-6,
                                    1e-12, 5e-8, 6e-7);
  bad["bf16"]["packing"]["grad_rel"] = "wide";
  SetEnvelope(fx, bad);
  const Result<ReferenceBundle> r = LoadReference(fx.reference_dir);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("envelope.bf16.packing.grad_rel' is \"wide\""));
}

// Verifies the logprob_parity gate's bars come from the log-prob envelope, and that its max
// bar catches a packed forward wrong at each sequence's last column only, which the mean over
// every sampled token lets through; without an envelope the gate says it has no max bar.
TEST(EnvelopeTest, LogprobMaxBarCatchesOneTokenPerSequence) {
  Fixture fx(FixtureOptions{.fake = FakeOptions{.packed_last_column_scale = 0.05}});
  fx.WriteCheckpoint();
  {
    FakeFamily upstream{FakeOptions{}};  // upstream: the same weights, no bug
    std::shared_ptr<CausalLM> model = *upstream.Construct(*fx.args, torch::kFloat32, torch::kCPU);
    torch::NoGradGuard no_grad;
    auto from = fx.model->named_parameters();
    for (auto& item : model->named_parameters()) item.value().copy_(from[item.key()]);
    fx.WriteReference(*model);
  }
  auto run = [&](const json& envelope) {
    SetEnvelope(fx, envelope);
    GateContext ctx = fx.Context();
    EXPECT_EQ(RunThrough(ctx, "load").status, GateStatus::kPass);
    return LogprobParityGate(ctx);
  };
  const json base = EnvelopeJson(0, 0, 100, 0, 0);
  // The mean bar wide (4 nats), the max bar at 4 x 1e-6: the one column per sequence FAILs.
  const GateOutcome caught = run(WithLogprobsAndPacking(base, 1.0, 1e-6, 0, 0, 0));
  EXPECT_STATUS(caught, GateStatus::kFail);
  EXPECT_THAT(caught.reason, HasSubstr("max abs log-prob diff"));
  EXPECT_LT(Real(caught, "mean_abs_diff"), Real(caught, "max_abs_diff") / 2);
  EXPECT_DOUBLE_EQ(Real(caught, "bar_max_abs_diff"), kFloorMargin * 1e-6);
  EXPECT_DOUBLE_EQ(Real(caught, "bar_mean_abs_diff"), kFloorMargin * 1.0);
  EXPECT_DOUBLE_EQ(Real(caught, "envelope_max_abs_diff"), 1e-6);
  EXPECT_THAT(Text(caught, "bars"), HasSubstr("decode-vs-forward log-prob gap"));

  // Both bars wide: PASS.
  EXPECT_STATUS(run(WithLogprobsAndPacking(base, 1.0, 1.0, 0, 0, 0)), GateStatus::kPass);

  // No log-prob envelope: no max bar, and the gate says so.
  const GateOutcome none = run(base);
  EXPECT_THAT(Text(none, "bar_max_abs_diff"), HasSubstr("none"));
}

// Verifies the packing gate's bars come from the packing envelope (margins over it, floored at
// one rounding) and still FAIL a packed forward that counts positions along the whole row.
TEST(EnvelopeTest, PackingBarsFromTheEnvelope) {
  Fixture fx;
  fx.Write();
  SetEnvelope(fx, WithLogprobsAndPacking(EnvelopeJson(0, 0, 100, 0, 0), 1e-6, 1e-6, 0, 2e-7,
                                         3e-6));
  GateContext ctx = fx.Context();
  const GateOutcome out = RunThrough(ctx, "packing");
  EXPECT_STATUS(out, GateStatus::kPass);
  EXPECT_DOUBLE_EQ(Real(out, "bar_grad_rel"), kFloorMargin * 3e-6);
  EXPECT_DOUBLE_EQ(Real(out, "bar_loss_rel"), kFloorMargin * 2e-7);
  EXPECT_DOUBLE_EQ(Real(out, "bar_kl_max"), kFloorMargin * kFloorMargin * KlRoundingFloor("fp32"));
  EXPECT_DOUBLE_EQ(Real(out, "envelope_grad_rel"), 3e-6);
  EXPECT_THAT(Text(out, "bars"), HasSubstr("upstream's own packed-vs-unpacked spread"));

  Fixture bad(FixtureOptions{.fake = FakeOptions{.packed_ignores_positions = true}});
  bad.Write();
  SetEnvelope(bad, WithLogprobsAndPacking(EnvelopeJson(0, 0, 100, 0, 0), 1e-6, 1e-6, 0, 2e-7,
                                          3e-6));
  GateContext b = bad.Context();
  EXPECT_STATUS(RunThrough(b, "packing"), GateStatus::kFail);
}

}  // namespace
}  // namespace gatehouse::worker
