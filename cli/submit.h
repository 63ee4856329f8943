// Submitting a cell as the `gatehouse` CLI does (docs/cli.md): POST /api/v1/cells again while the
// controller answers 202 "resolving" (its digests of the checkpoint or reference are still
// being computed, so the cell has no id yet: docs/protocols.md §1).
#pragma once

#include <chrono>
#include <functional>
#include <ostream>

#include "cli/api_client.h"
#include "common/status.h"

namespace gatehouse::cli {

/// How PostCell posts and waits; tests inject `post` and `sleep`.
struct PostCellOptions {
  /// One POST /api/v1/cells of the body.
  std::function<Result<ApiResponse>()> post;
  /// Waits between posts (std::this_thread::sleep_for by default).
  std::function<void(std::chrono::milliseconds)> sleep;
  /// Gives up resolving once this has passed.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  /// The steady clock (tests advance a fake one from `sleep`).
  std::function<std::chrono::steady_clock::time_point()> now;
};

/// Posts the body; while the answer is 202 with "state": "resolving", writes its reason to
/// `progress` ("gatehouse: resolving: <reason>") when it differs from the last one written,
/// waits its retry_after_s (1 to 60 s; 1 when absent) and posts the same body again. Returns
/// the first other answer (the cell, 201 or 200, or a refusal), or the transport's error as is.
/// Errors: DEADLINE_EXCEEDED with the last reason when `deadline` passes while resolving.
Result<ApiResponse> PostCell(const PostCellOptions& options, std::ostream& progress);

}  // namespace gatehouse::cli
