// REST routes of the controller (docs/protocols.md §1) and the dashboard's static files.
#pragma once

#include <filesystem>

#include "controller/controller_core.h"
#include "controller/http_types.h"

namespace gatehouse::controller {

/// Routes HTTP requests to ControllerCore and renders the answers:
///   POST /api/v1/cells, GET /api/v1/cells, GET /api/v1/cells/{id},
///   GET /api/v1/cells/{id}/report, GET /api/v1/cells/{id}/log?stream=worker[&attempt=N],
///   GET /healthz, and GET of dashboard files under `web_dir` (/ -> index.html, /<file>,
///   /static/<file>; no path leaves web_dir).
/// Errors are JSON {"error": "<message>"} with 400/404/405/409/500/503.
///
/// Threading: thread-safe (stateless beside the core). Handle never throws. Blocking: a POST
/// fetches git; run it on a worker thread, not an event loop.
class RestApi {
 public:
  RestApi(ControllerCore& core, std::filesystem::path web_dir);

  HttpResponse Handle(const HttpRequest& request);

 private:
  HttpResponse Route(const HttpRequest& request);
  HttpResponse ServeStatic(const std::string& relative);

  ControllerCore& core_;
  std::filesystem::path web_dir_;
};

/// HTTP status for a Status code (INVALID_ARGUMENT 400, NOT_FOUND 404, ...).
int HttpStatusOf(const Status& status);

/// {"error": message} with the status's HTTP code.
HttpResponse ErrorResponse(int http_status, const std::string& message);

}  // namespace gatehouse::controller
