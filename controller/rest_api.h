// REST routes of the controller (docs/protocols.md §1) and the dashboard's static files.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/url/url_view.hpp>

#include "controller/auth.h"
#include "controller/controller_core.h"
#include "controller/http_types.h"

namespace gatehouse::controller {

class RestApi;

/// What a handler is given: the request, its target parsed once (a view into
/// request.target), the route's {parameters} in order and the caller's token name (empty
/// without a token).
struct RouteCall {
  const HttpRequest& request;
  boost::urls::url_view url;
  std::vector<std::string> params;  // e.g. {"<cell id>"} for /api/v1/cells/{id}
  std::string principal;
};

/// One endpoint: the method (a GET route answers HEAD too), the path pattern ("{id}" matches
/// one segment), the scope its caller needs (none: no token asked, the route holds no data),
/// and the named handler. The table (RestApi::Routes) is the only place these are written:
/// the scope check and the 405's Allow header are derived from it.
struct Route {
  std::string_view method;
  std::string_view pattern;
  std::optional<Scope> scope;
  std::string_view name;
  HttpResponse (RestApi::*handler)(const RouteCall&);
};

/// Routes HTTP requests to ControllerCore and the token registry through the route table, and
/// serves the dashboard's files under `web_dir` for any other path outside /api (/ ->
/// index.html, /<file>, /static/<file>; no path leaves web_dir; no token: they hold no data).
/// Every /api/v1 route but openapi.json needs a bearer token of the route's scope. Order of
/// checks: route known (else 404 after the token check), token and scope (401/403), method
/// (405 with Allow, only told to a caller who may use the path). Errors are JSON
/// {"error": "<message>"} with 400/401/403/404/405/409/413/500/503; a 401 carries
/// WWW-Authenticate: Bearer. A submit whose directory digests are still being computed is a
/// 202 {"state": "resolving", ...} with Retry-After, and stores nothing.
///
/// Threading: thread-safe (stateless beside the core). Handle never throws. Blocking: a POST
/// fetches git (never waits for hashing); run it on a worker thread, not an event loop.
class RestApi {
 public:
  RestApi(ControllerCore& core, Authenticator& auth, std::filesystem::path web_dir);

  HttpResponse Handle(const HttpRequest& request);

  /// The route table, in matching order.
  static const std::vector<Route>& Routes();

 private:
  HttpResponse Dispatch(const HttpRequest& request);
  HttpResponse ServeStatic(const std::string& path, const std::vector<std::string>& segments,
                           const std::string& method);

  HttpResponse Healthz(const RouteCall& call);
  HttpResponse OpenApi(const RouteCall& call);
  HttpResponse SubmitCell(const RouteCall& call);
  HttpResponse ListCells(const RouteCall& call);
  HttpResponse GetCell(const RouteCall& call);
  HttpResponse CancelCell(const RouteCall& call);
  HttpResponse RetryCell(const RouteCall& call);
  HttpResponse HideCell(const RouteCall& call);
  HttpResponse ShowCell(const RouteCall& call);
  HttpResponse Readiness(const RouteCall& call);
  HttpResponse CellMatrix(const RouteCall& call);
  HttpResponse ListDesignatedBranches(const RouteCall& call);
  HttpResponse SetDesignatedBranches(const RouteCall& call);
  HttpResponse CellReport(const RouteCall& call);
  HttpResponse CellLog(const RouteCall& call);
  HttpResponse GetArtifact(const RouteCall& call);
  HttpResponse ListAgents(const RouteCall& call);
  HttpResponse ListTokens(const RouteCall& call);
  HttpResponse IssueToken(const RouteCall& call);
  HttpResponse RevokeToken(const RouteCall& call);

  ControllerCore& core_;
  Authenticator& auth_;
  std::filesystem::path web_dir_;
};

/// The scope a REST call needs, from the route table: the scope of the route for `method` at
/// `path` when there is one; for another method on a known path, the strongest scope among the
/// path's routes and at least submit for a method that is not GET or HEAD (so a 405 is only
/// told to a caller who may use the route); for an unknown /api path, read for GET/HEAD and
/// submit otherwise. nullopt: no token needed.
std::optional<Scope> RequiredScope(const std::string& method, const std::string& path);

/// The OpenAPI 3 document of this API (controller/openapi.json, embedded at build time).
std::string_view OpenApiDocument();

}  // namespace gatehouse::controller
