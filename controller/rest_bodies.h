// Typed readers of REST request bodies and query strings (docs/protocols.md §1). Each names the
// field and the value it refuses (INVALID_ARGUMENT, a 400). The submit body has its own reader,
// common/cell_spec.h ParseSubmitBody.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/url/url_view.hpp>

#include "common/status.h"
#include "controller/auth.h"
#include "controller/records.h"

namespace gatehouse::controller {

/// POST /api/v1/cells/{id}/cancel: an optional body {"reason": "<at most 1000 bytes>"}; an
/// empty body is no reason. The reason is stored and shown, never executed.
Result<std::string> ParseCancelReason(std::string_view body);

/// POST /api/v1/cells/{id}/hide and /show: {"reason": "<1 to 1000 bytes>"}, required (an
/// operator's action on shared evidence says why).
Result<std::string> ParseVisibilityReason(std::string_view body);

/// The `include_hidden` query parameter of GET /api/v1/readiness and /api/v1/matrix: "true"
/// or "false" (absent: false).
Result<bool> ParseIncludeHidden(const boost::urls::url_view& url);

/// The `branches` query parameter of GET /api/v1/readiness and /api/v1/matrix: "designated"
/// (absent: the default) counts the cells on each repository's designated branches, "all"
/// every cell. Returns true for "all".
Result<bool> ParseAllBranches(const boost::urls::url_view& url);

/// The `repository` query parameter of /api/v1/designated-branches, as cells store it: a URL
/// (scheme://...) kept as given, or an absolute path made lexically normal without a trailing
/// '/' (common/cell_spec.cc reads a submit's the same way); at most 4096 bytes. Absent: empty,
/// or INVALID_ARGUMENT when `required`.
Result<std::string> ParseRepositoryParam(const boost::urls::url_view& url, bool required);

/// PUT /api/v1/designated-branches: {"branches": ["main", ...], "reason": "..."}: 0 to
/// kMaxDesignatedBranches distinct branch names (git's rules for a branch name; 1 to 1024
/// bytes), an empty list going back to the repository's default branch; `reason` optional, at
/// most 1000 bytes.
struct DesignatedBranchesRequest {
  std::vector<std::string> branches;
  std::string reason;
};
inline constexpr size_t kMaxDesignatedBranches = 64;
Result<DesignatedBranchesRequest> ParseDesignatedBranches(std::string_view body);

/// POST /api/v1/tokens: {"name": "...", "kind": "api"|"agent", "scopes": ["read", ...]}.
struct TokenRequest {
  std::string name;
  TokenKind kind = TokenKind::kApi;
  std::vector<Scope> scopes;
};
Result<TokenRequest> ParseTokenRequest(std::string_view body);

/// GET /api/v1/cells?limit=L&offset=O: L in 1..500 (default 50; 0 reads as 1), O >= 0.
struct ListQuery {
  int limit = 50;
  int offset = 0;
};
Result<ListQuery> ParseListQuery(const boost::urls::url_view& url);

/// GET /api/v1/cells/{id}/log?stream=S&attempt=N&offset=B: S defaults to "worker"; N (>= 0)
/// absent is the latest attempt; B (>= 0, default 0) the first byte to return.
struct LogQuery {
  std::string stream = "worker";
  std::optional<int> attempt;
  int64_t offset = 0;
};
Result<LogQuery> ParseLogQuery(const boost::urls::url_view& url);

/// GET /api/v1/matrix?repository=R&branch=B&commit=C&model_family=F&status=S: each absent or
/// empty matches everything; C is 40 hex; S an attempt state ("failed") or a readiness word
/// ("validated", controller/readiness.h); include_hidden as ParseIncludeHidden; branches as
/// ParseAllBranches.
struct MatrixQuery {
  MatrixFilter filter;
  std::string status;
  bool all_branches = false;  // branches=all (ParseAllBranches)
};
Result<MatrixQuery> ParseMatrixQuery(const boost::urls::url_view& url);

}  // namespace gatehouse::controller
