// How an attempt the agent ended on its own (not stopped on request, not lost) ends: the
// agent's outcome and the worker's run_end decide the state, the first phase that stopped the
// run names the reason. Pure logic, shared by the controller (ControllerCore::EndAttempt) and
// `gatehouse run` (local/local_run.h), so a local run ends exactly as a frozen one would.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "controller/attempt_state.h"
#include "controller/records.h"

namespace gatehouse::controller {

/// A phase's place in kPhases (common/phases.h); unknown names sort after every known one.
size_t PhaseOrder(std::string_view phase);

/// The state an attempt ends in and why ("" for passed).
struct AttemptEnding {
  AttemptState state = AttemptState::kError;
  std::string reason;
};

/// outcome "finished" with run_end PASS: passed; FAIL: failed; BLOCKED: blocked; UNKNOWN:
/// error (a gate could not decide: no verdict on the adapter). The reason of a non-PASS run is
/// "run_end status <S>; phase '<p>' <STATUS>: <reason>" for the first phase in kPhases order
/// whose status stops later phases. "finished" without run_end, "error", or an unknown outcome:
/// error, with `reason` or one naming the exit code. `phases` are the attempt's, any order.
AttemptEnding EndingOf(std::string_view outcome, std::string_view reason, int exit_code,
                       std::string_view run_status, std::vector<PhaseRecord> phases);

}  // namespace gatehouse::controller
