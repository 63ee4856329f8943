// Interpretation of worker events (docs/protocols.md §4) as relayed by agents.
#pragma once

#include <string_view>

#include "common/status.h"
#include "controller/records.h"

namespace gatehouse::controller {

/// What an event line does to the stored evidence. Events of other kinds ("artifact", "log",
/// or ones added later) give Kind::kNone: they are kept, but change nothing else.
/// Errors: INVALID_ARGUMENT when the line is not a JSON object with a string "event", or a
/// phase_start/figure/phase_end/run_end lacks a member it needs or has a bad status.
Result<EventEffect> ParseWorkerEvent(std::string_view json);

}  // namespace gatehouse::controller
