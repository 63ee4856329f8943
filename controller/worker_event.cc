#include "controller/worker_event.h"

#include <nlohmann/json.hpp>

#include "common/phases.h"

namespace gatehouse::controller {
namespace {

using nlohmann::json;

Result<std::string> MemberString(const json& e, const char* name, bool required) {
  auto it = e.find(name);
  if (it == e.end() || it->is_null()) {
    if (required) return Status::InvalidArgument(std::string("event: missing '") + name + "'");
    return std::string();
  }
  if (!it->is_string()) {
    return Status::InvalidArgument(std::string("event: '") + name + "' must be a string, got " +
                                   it->dump());
  }
  return it->get<std::string>();
}

Result<std::string> MemberStatus(const json& e) {
  GH_ASSIGN_OR_RETURN(std::string status, MemberString(e, "status", true));
  if (!ParseGateStatus(status)) {
    return Status::InvalidArgument("event: unknown status '" + status + "'");
  }
  return status;
}

}  // namespace

Result<EventEffect> ParseWorkerEvent(std::string_view text) {
  json e = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (e.is_discarded() || !e.is_object()) {
    return Status::InvalidArgument("event: not a JSON object");
  }
  GH_ASSIGN_OR_RETURN(std::string kind, MemberString(e, "event", true));
  EventEffect effect;
  // Ranks of a tensor-parallel group tag their events; rank 0's are the evidence (§4).
  if (auto rank = e.find("rank"); rank != e.end()) {
    const bool valid = rank->is_number_unsigned() ||
                       (rank->is_number_integer() && rank->get<int64_t>() >= 0);
    if (!valid) {
      return Status::InvalidArgument("event: 'rank' must be a non-negative integer, got " +
                                     rank->dump());
    }
    if (rank->get<uint64_t>() != 0) return effect;  // kNone: stored for the record only
  }
  using Kind = EventEffect::Kind;
  if (kind == "phase_start") {
    effect.kind = Kind::kPhaseStart;
    GH_ASSIGN_OR_RETURN(effect.phase, MemberString(e, "phase", true));
  } else if (kind == "figure") {
    effect.kind = Kind::kFigure;
    GH_ASSIGN_OR_RETURN(effect.phase, MemberString(e, "phase", true));
    GH_ASSIGN_OR_RETURN(effect.name, MemberString(e, "name", true));
    GH_ASSIGN_OR_RETURN(effect.unit, MemberString(e, "unit", false));
    auto value = e.find("value");
    if (value == e.end() || !(value->is_number() || value->is_string() || value->is_boolean())) {
      return Status::InvalidArgument("event: figure '" + effect.name +
                                     "' needs a number or string 'value'");
    }
    effect.value_json = value->dump();
  } else if (kind == "phase_end") {
    effect.kind = Kind::kPhaseEnd;
    GH_ASSIGN_OR_RETURN(effect.phase, MemberString(e, "phase", true));
    GH_ASSIGN_OR_RETURN(effect.status, MemberStatus(e));
    GH_ASSIGN_OR_RETURN(effect.reason, MemberString(e, "reason", false));
    GH_ASSIGN_OR_RETURN(effect.classification, MemberString(e, "classification", false));
    auto d = e.find("duration_ms");
    if (d != e.end() && d->is_number()) effect.duration_ms = d->get<int64_t>();
  } else if (kind == "run_end") {
    effect.kind = Kind::kRunEnd;
    GH_ASSIGN_OR_RETURN(effect.status, MemberStatus(e));
  }
  return effect;
}

}  // namespace gatehouse::controller
