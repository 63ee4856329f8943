// REST routes of the controller (docs/protocols.md §1) and the dashboard's static files.
#pragma once

#include <filesystem>

#include "controller/auth.h"
#include "controller/controller_core.h"
#include "controller/http_types.h"

namespace gatehouse::controller {

/// Routes HTTP requests to ControllerCore and renders the answers:
///   POST /api/v1/cells, GET /api/v1/cells, GET /api/v1/cells/{id},
///   GET /api/v1/cells/{id}/report, GET /api/v1/cells/{id}/log?stream=worker[&attempt=N],
///   POST /api/v1/cells/{id}/cancel, GET /api/v1/agents, GET|POST /api/v1/tokens,
///   DELETE /api/v1/tokens/{id},
///   GET /api/v1/openapi.json (controller/openapi.json), GET /healthz, and GET of dashboard
///   files under `web_dir` (/ -> index.html, /<file>, /static/<file>; no path leaves web_dir).
/// Every /api/v1 route but openapi.json needs a bearer token (RequiredScope); the dashboard's
/// files and /healthz need none (they hold no data).
/// Errors are JSON {"error": "<message>"} with 400/401/403/404/405/409/413/500/503; a 401
/// carries WWW-Authenticate: Bearer.
///
/// Threading: thread-safe (stateless beside the core). Handle never throws. Blocking: a POST
/// fetches git; run it on a worker thread, not an event loop.
class RestApi {
 public:
  RestApi(ControllerCore& core, Authenticator& auth, std::filesystem::path web_dir);

  HttpResponse Handle(const HttpRequest& request);

 private:
  HttpResponse Route(const HttpRequest& request);
  HttpResponse ServeStatic(const std::string& relative);
  HttpResponse Tokens(const HttpRequest& req, const std::vector<std::string>& seg,
                      const std::string& path);

  ControllerCore& core_;
  Authenticator& auth_;
  std::filesystem::path web_dir_;
};

/// The scope a REST call needs: admin under /api/v1/tokens, read for GET/HEAD elsewhere,
/// submit for any other method (the method is checked after the token, so a 405 is only told
/// to a caller who may use the route).
Scope RequiredScope(const std::string& method, const std::vector<std::string>& segments);

/// The OpenAPI 3 document of this API (controller/openapi.json, embedded at build time).
std::string_view OpenApiDocument();

/// HTTP status for a Status code (INVALID_ARGUMENT 400, NOT_FOUND 404, ...).
int HttpStatusOf(const Status& status);

/// {"error": message} with the status's HTTP code.
HttpResponse ErrorResponse(int http_status, const std::string& message);

}  // namespace gatehouse::controller
