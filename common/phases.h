// The vocabulary shared by worker, agent and controller: phases (gates) in order, gate
// statuses and failure classifications (see docs/architecture.md, "Phases").
#pragma once

#include <array>
#include <optional>
#include <string_view>

namespace gatehouse {

/// Every phase, in the order a worker runs them. A later phase never runs after an earlier
/// required phase ended FAIL, BLOCKED or UNKNOWN; it is reported SKIPPED with that reason.
inline constexpr std::array<std::string_view, 13> kPhases = {
    "identity", "config",         "construct", "load", "inference",  "decode",     "packing",
    "logprob_parity", "training", "save",      "parallel", "cuda_graph", "performance"};

/// Phases requested when a cell names none: all but performance (which needs a GPU peer run).
inline constexpr std::array<std::string_view, 12> kDefaultPhases = {
    "identity", "config",         "construct", "load", "inference", "decode",    "packing",
    "logprob_parity", "training", "save",      "parallel", "cuda_graph"};

/// The phases of a reference cell (common/cell_spec.h), in order: identity (the runtime pins
/// and the checkpoint digest on the node) and reference (upstream makes the bundle).
inline constexpr std::array<std::string_view, 2> kReferenceCellPhases = {"identity", "reference"};

/// Position of `phase` in kPhases, or nullopt for an unknown name.
inline std::optional<size_t> PhaseIndex(std::string_view phase) {
  for (size_t i = 0; i < kPhases.size(); ++i) {
    if (kPhases[i] == phase) return i;
  }
  return std::nullopt;
}

/// The phase whose result `phase` works on, or nullopt when it needs none: construct builds
/// from the args config parses, load fills the model construct built, and every phase after
/// load computes with the loaded model (the worker's gates report UNKNOWN "no loaded model"
/// without it). A submitted cell must request each prerequisite of its phases, transitively.
inline std::optional<std::string_view> PhasePrerequisite(std::string_view phase) {
  if (phase == "identity" || phase == "config") return std::nullopt;
  if (phase == "construct") return "config";
  if (phase == "load") return "construct";
  if (!PhaseIndex(phase)) return std::nullopt;  // a reference cell's phase or an unknown name
  return "load";
}

/// Outcome of one gate.
enum class GateStatus { kPass, kFail, kBlocked, kUnknown, kSkipped };

inline std::string_view GateStatusName(GateStatus s) {
  switch (s) {
    case GateStatus::kPass: return "PASS";
    case GateStatus::kFail: return "FAIL";
    case GateStatus::kBlocked: return "BLOCKED";
    case GateStatus::kUnknown: return "UNKNOWN";
    case GateStatus::kSkipped: return "SKIPPED";
  }
  return "UNKNOWN";
}

inline std::optional<GateStatus> ParseGateStatus(std::string_view s) {
  if (s == "PASS") return GateStatus::kPass;
  if (s == "FAIL") return GateStatus::kFail;
  if (s == "BLOCKED") return GateStatus::kBlocked;
  if (s == "UNKNOWN") return GateStatus::kUnknown;
  if (s == "SKIPPED") return GateStatus::kSkipped;
  return std::nullopt;
}

/// True for statuses after which later phases must not run.
inline bool StopsLaterPhases(GateStatus s) {
  return s == GateStatus::kFail || s == GateStatus::kBlocked || s == GateStatus::kUnknown;
}

/// Who is to blame for a FAIL (docs/architecture.md "Phases, statuses and blame"): the
/// adapter's contract, the native runtime, a connector, a resource limit, or not known.
enum class FailureClass { kAdapterContract, kNativeRuntime, kConnector, kResource, kUnknown };

inline std::string_view FailureClassName(FailureClass c) {
  switch (c) {
    case FailureClass::kAdapterContract: return "adapter_contract";
    case FailureClass::kNativeRuntime: return "native_runtime";
    case FailureClass::kConnector: return "connector";
    case FailureClass::kResource: return "resource";
    case FailureClass::kUnknown: return "unknown";
  }
  return "unknown";
}

}  // namespace gatehouse
