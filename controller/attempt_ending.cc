#include "controller/attempt_ending.h"

#include <algorithm>

#include "common/phases.h"

namespace gatehouse::controller {

size_t PhaseOrder(std::string_view phase) {
  return PhaseIndex(phase).value_or(kPhases.size());
}

AttemptEnding EndingOf(std::string_view outcome, std::string_view reason, int exit_code,
                       std::string_view run_status, std::vector<PhaseRecord> phases) {
  AttemptEnding end;
  if (outcome == "finished") {
    if (run_status.empty()) {
      end.reason = "the worker finished without a run_end event (exit code " +
                   std::to_string(exit_code) + ")";
      return end;
    }
    if (run_status == "PASS") {
      end.state = AttemptState::kPassed;
      return end;
    }
    // FAIL is the verdict. BLOCKED: an input from outside the adapter could not be used;
    // UNKNOWN: a gate could not decide. Neither is a verdict on the adapter.
    end.state = run_status == "BLOCKED"   ? AttemptState::kBlocked
                : run_status == "UNKNOWN" ? AttemptState::kError
                                          : AttemptState::kFailed;
    end.reason = "run_end status " + std::string(run_status);
    std::stable_sort(phases.begin(), phases.end(), [](const auto& x, const auto& y) {
      return PhaseOrder(x.phase) < PhaseOrder(y.phase);
    });
    for (const PhaseRecord& p : phases) {
      auto status = ParseGateStatus(p.status);
      if (status && StopsLaterPhases(*status)) {
        end.reason +=
            "; phase '" + p.phase + "' " + p.status + (p.reason.empty() ? "" : ": " + p.reason);
        break;
      }
    }
    return end;
  }
  end.reason = reason.empty() ? "the agent reported an error (exit code " +
                                    std::to_string(exit_code) + ")"
                              : std::string(reason);
  if (outcome != "error" && outcome != "lost") {
    end.reason = "unknown outcome '" + std::string(outcome) + "': " + end.reason;
  }
  return end;
}

}  // namespace gatehouse::controller
