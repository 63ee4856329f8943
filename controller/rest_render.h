// Rendering of REST answers (docs/protocols.md §1): the JSON objects of cells, attempts, phases,
// agents and tokens, and the response envelopes. No routing here (controller/rest_api.cc).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "controller/auth.h"
#include "controller/controller_core.h"
#include "controller/http_types.h"

namespace gatehouse::controller {

/// The cell object of GET /api/v1/cells/{id} (spec, labels, attempts, phases, waiting_reason).
nlohmann::json CellJson(const CellDetail& cell);
/// One row of GET /api/v1/cells.
nlohmann::json CellSummaryJson(const CellSummary& summary);
/// One agent of GET /api/v1/agents (capabilities as the agent reported them).
nlohmann::json AgentJson(const AgentStatus& agent);
/// One token of GET /api/v1/tokens: never its secret.
nlohmann::json TokenJson(const TokenRecord& token);

/// The readiness document (protocols.md §1): {"branches": "designated"|"all", "designated":
/// [...] (designated only), "combinations": [...]}.
nlohmann::json ReadinessJson(const ReadinessView& view);

/// One repository of GET /api/v1/designated-branches: {"repository", "source", "branches"
/// (null for "unknown": every branch counts), "default_branch", "default_branch_seen_at",
/// "configured": {"branches", "by", "reason", "at"} | null}.
nlohmann::json DesignationJson(const BranchDesignation& d);

/// GET /api/v1/matrix (docs/protocols.md §1): the filter as applied (its "branches":
/// "designated", or "all" for `all_branches` or a filter naming a branch), the choices, the
/// columns and the rows with their squares keyed by column.
nlohmann::json MatrixJson(const Matrix& matrix, const MatrixChoices& choices,
                          const MatrixFilter& filter, const std::string& status,
                          bool all_branches = false);

/// `body` as JSON with `status`; invalid UTF-8 in a stored string becomes U+FFFD rather than
/// an exception (which would turn any answer into a 500). Cache-Control: no-store.
HttpResponse JsonResponse(int status, const nlohmann::json& body);
/// A text body of `content_type` with `status`. Cache-Control: no-store.
HttpResponse TextResponse(int status, std::string content_type, std::string body);

/// HTTP status for a Status code (INVALID_ARGUMENT 400, NOT_FOUND 404, ...).
int HttpStatusOf(const Status& status);
/// {"error": message} with the HTTP code `http_status`.
HttpResponse ErrorResponse(int http_status, const std::string& message);
/// {"error": status.message()} with HttpStatusOf(status).
HttpResponse ErrorResponse(const Status& status);

}  // namespace gatehouse::controller
