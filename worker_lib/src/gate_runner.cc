// The gate runner: runs the requested phases in order, each through RunOneGate (exceptions
// become FAIL with a blame class), streams figures, artifacts and phase ends, stops later
// phases after a FAIL, BLOCKED or UNKNOWN (docs/architecture.md "Phases, statuses and blame").
#include "gatehouse/worker/gates.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "gatehouse/worker/log.h"
#include "gates_internal.h"

namespace gatehouse::worker {

// --- GateOutcome ---------------------------------------------------------------------------

GateOutcome& GateOutcome::Set(GateStatus s, std::string why, FailureClass c) {
  status = s;
  reason = std::move(why);
  classification = c;
  return *this;
}

const Figure* GateOutcome::Find(std::string_view name) const {
  for (const auto& f : figures) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

void GateOutcome::Lead(const std::vector<std::string_view>& names) {
  auto rank = [&](const Figure& f) {
    const auto it = std::find(names.begin(), names.end(), f.name);
    return static_cast<size_t>(it - names.begin());  // names.size() when not named
  };
  std::stable_sort(figures.begin(), figures.end(),
                   [&](const Figure& a, const Figure& b) { return rank(a) < rank(b); });
}

// --- runner --------------------------------------------------------------------------------

std::vector<GateDef> DefaultGates() {
  return {{"identity", IdentityGate},
          {"config", ConfigGate},
          {"construct", ConstructGate},
          {"load", LoadGate},
          {"inference", InferenceGate},
          {"decode", DecodeGate},
          {"packing", PackingGate},
          {"logprob_parity", LogprobParityGate},
          {"training", TrainingGate},
          {"save", SaveGate},
          {"parallel", ParallelGate},
          {"cuda_graph", CudaGraphGate},
          {"performance", PerformanceGate}};
}

namespace {

GateOutcome RunOneGate(const GateDef& def, GateContext& ctx) {
  GateOutcome out;
  try {
    return def.fn(ctx);
  } catch (const c10::Error& e) {
    out.Fail(FailureClass::kNativeRuntime, std::string("LibTorch error: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    out.Fail(FailureClass::kUnknown, std::string("exception: ") + e.what());
  } catch (...) {
    out.Fail(FailureClass::kUnknown, "unknown exception");
  }
  return out;
}

}  // namespace

GateStatus RunGates(GateContext& ctx, EventWriter& events, const std::vector<GateDef>& gates) {
  internal::UseFixedMmapThreshold();  // each phase's peak is its own (gates_internal.h)
  bool any_fail = false, any_blocked = false, any_unknown = false;
  std::string stopped_by;  // "<phase> ended <STATUS>"
  for (const GateDef& def : gates) {
    if (!ctx.spec.Requested(def.phase)) {
      events.PhaseEnd(def.phase, GateStatus::kSkipped, "not requested", "", 0);
      continue;
    }
    if (ctx.rank > 0 && std::find(std::begin(kPhasesOnEveryRank), std::end(kPhasesOnEveryRank),
                                  def.phase) == std::end(kPhasesOnEveryRank)) {
      events.PhaseEnd(def.phase, GateStatus::kSkipped,
                      "rank " + std::to_string(ctx.rank) + " of " +
                          std::to_string(ctx.world_size) + ": phase " + std::string(def.phase) +
                          " runs on rank 0 only",
                      "", 0);
      continue;
    }
    if (!stopped_by.empty()) {
      events.PhaseEnd(def.phase, GateStatus::kSkipped, "skipped: earlier phase " + stopped_by, "", 0);
      continue;
    }
    events.PhaseStart(def.phase);
    log::Info("phase " + std::string(def.phase) + ": start");
    const int64_t t0 = events.NowMs();
    const bool peak_reset = internal::ResetPeakRss();
    // What the earlier phases left resident: the phase's own peak is peak_rss_bytes less this.
    const std::optional<int64_t> rss_start = internal::ReadResidentMemory().current_bytes;
    GateOutcome out = RunOneGate(def, ctx);
    // After every phase (so also before the next one): rss_end_bytes counts what the phase
    // left alive, and its freed heap does not count in the next phase's peak.
    internal::ReturnFreedMemory();
    const internal::ResidentMemory memory = internal::ReadResidentMemory();
    if (peak_reset && memory.peak_bytes) out.Bytes("peak_rss_bytes", *memory.peak_bytes);
    if (rss_start) out.Bytes("rss_start_bytes", *rss_start);
    if (memory.current_bytes) out.Bytes("rss_end_bytes", *memory.current_bytes);
    for (const Figure& f : out.figures) events.EmitFigure(def.phase, f);
    for (const Artifact& a : out.artifacts) events.EmitArtifact(def.phase, a);
    if (out.status != GateStatus::kPass && out.reason.empty()) {
      out.reason = "gate ended " + std::string(GateStatusName(out.status)) + " without a reason";
    }
    const std::string_view cls =
        out.status == GateStatus::kFail ? FailureClassName(out.classification) : "";
    events.PhaseEnd(def.phase, out.status, out.reason, cls, events.NowMs() - t0);
    log::Info("phase " + std::string(def.phase) + ": " + std::string(GateStatusName(out.status)) +
              (out.reason.empty() ? "" : ": " + out.reason));
    any_fail |= out.status == GateStatus::kFail;
    any_blocked |= out.status == GateStatus::kBlocked;
    any_unknown |= out.status == GateStatus::kUnknown;
    if (StopsLaterPhases(out.status)) {
      stopped_by = std::string(def.phase) + " ended " + std::string(GateStatusName(out.status));
    }
  }
  const GateStatus overall = any_fail      ? GateStatus::kFail
                             : any_blocked ? GateStatus::kBlocked
                             : any_unknown ? GateStatus::kUnknown
                                           : GateStatus::kPass;
  events.RunEnd(overall);
  return overall;
}

}  // namespace gatehouse::worker
