// Interpretation of worker events (docs/protocols.md §4) as relayed by agents.
#pragma once

#include <string_view>

#include "common/status.h"
#include "controller/records.h"

namespace gatehouse::controller {

/// What an event line does to the stored evidence. Events of other kinds ("artifact", "log",
/// or ones added later) give Kind::kNone: they are kept, but change nothing else. So does any
/// event with a "rank" member > 0 (a tensor-parallel rank other than rank 0, whose events alone
/// are the evidence; the others' are stored for the record).
/// Errors: INVALID_ARGUMENT when the line is not a JSON object with a string "event", "rank" is
/// present but not a non-negative integer, or a phase_start/figure/phase_end/run_end (of rank 0)
/// lacks a member it needs or has a bad status.
Result<EventEffect> ParseWorkerEvent(std::string_view json);

}  // namespace gatehouse::controller
