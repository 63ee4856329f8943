// The REST route table and its handlers (docs/protocols.md §1). Bodies and queries are read by
// controller/rest_bodies.h, answers rendered by controller/rest_render.h.
#include "controller/rest_api.h"

#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include <algorithm>
#include <charconv>
#include <exception>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "controller/rest_bodies.h"
#include "controller/rest_render.h"

namespace gatehouse::controller {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Seconds a submit answered 202 "resolving" asks the client to wait before posting again.
constexpr int kSubmitRetryAfterS = 1;

std::vector<std::string> Segments(std::string_view path) {
  std::vector<std::string> out;
  size_t at = path.empty() || path[0] != '/' ? 0 : 1;
  while (at <= path.size()) {
    const size_t slash = path.find('/', at);
    const size_t end = slash == std::string_view::npos ? path.size() : slash;
    out.emplace_back(path.substr(at, end - at));
    at = end + 1;
  }
  if (!out.empty() && out.back().empty()) out.pop_back();  // tolerate a trailing '/'
  return out;
}

/// Whether `segments` match the pattern split in `want`; `params` receives the {parameter}
/// segments.
bool Matches(const std::vector<std::string>& want, const std::vector<std::string>& segments,
             std::vector<std::string>* params) {
  if (want.size() != segments.size()) return false;
  std::vector<std::string> found;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i].size() > 2 && want[i].front() == '{' && want[i].back() == '}') {
      if (segments[i].empty()) return false;
      found.push_back(segments[i]);
    } else if (want[i] != segments[i]) {
      return false;
    }
  }
  if (params) *params = std::move(found);
  return true;
}

bool MethodMatches(std::string_view route_method, std::string_view method) {
  return route_method == method || (route_method == "GET" && method == "HEAD");
}

bool IsApi(const std::vector<std::string>& segments) {
  return !segments.empty() && segments[0] == "api";
}

std::string ContentTypeOf(const fs::path& p) {
  const std::string ext = p.extension().string();
  if (ext == ".html") return "text/html; charset=utf-8";
  if (ext == ".css") return "text/css; charset=utf-8";
  if (ext == ".js") return "text/javascript; charset=utf-8";
  if (ext == ".json") return "application/json";
  if (ext == ".svg") return "image/svg+xml";
  if (ext == ".png") return "image/png";
  if (ext == ".ico") return "image/x-icon";
  if (ext == ".txt" || ext == ".md") return "text/plain; charset=utf-8";
  return "application/octet-stream";
}

HttpResponse MethodNotAllowed(const std::string& method, const std::string& path,
                              const std::string& allow) {
  HttpResponse r = ErrorResponse(405, "method " + method + " not allowed on " + path);
  r.headers["Allow"] = allow;
  return r;
}

/// What the route table says about one method on one path.
struct PathMatch {
  const Route* route = nullptr;     // the route for the method; nullptr: none
  std::vector<std::string> params;  // its {parameters}
  std::string allow;                // the path's methods, in table order ("GET, POST")
  std::optional<Scope> scope;       // what the caller needs (RequiredScope)
};

PathMatch MatchPath(const std::string& method, const std::vector<std::string>& segments);

}  // namespace

const std::vector<Route>& RestApi::Routes() {
  static const std::vector<Route> routes = {
      {"GET", "/healthz", std::nullopt, "healthz", &RestApi::Healthz},
      {"GET", "/api/v1/openapi.json", std::nullopt, "openapi", &RestApi::OpenApi},
      {"GET", "/api/v1/cells", Scope::kRead, "list_cells", &RestApi::ListCells},
      {"POST", "/api/v1/cells", Scope::kSubmit, "submit_cell", &RestApi::SubmitCell},
      {"GET", "/api/v1/cells/{id}", Scope::kRead, "get_cell", &RestApi::GetCell},
      {"POST", "/api/v1/cells/{id}/cancel", Scope::kSubmit, "cancel_cell", &RestApi::CancelCell},
      {"POST", "/api/v1/cells/{id}/retry", Scope::kSubmit, "retry_cell", &RestApi::RetryCell},
      {"POST", "/api/v1/cells/{id}/hide", Scope::kAdmin, "hide_cell", &RestApi::HideCell},
      {"POST", "/api/v1/cells/{id}/show", Scope::kAdmin, "show_cell", &RestApi::ShowCell},
      {"GET", "/api/v1/readiness", Scope::kRead, "readiness", &RestApi::Readiness},
      {"GET", "/api/v1/matrix", Scope::kRead, "matrix", &RestApi::CellMatrix},
      {"GET", "/api/v1/designated-branches", Scope::kRead, "list_designated_branches",
       &RestApi::ListDesignatedBranches},
      {"PUT", "/api/v1/designated-branches", Scope::kAdmin, "set_designated_branches",
       &RestApi::SetDesignatedBranches},
      {"GET", "/api/v1/cells/{id}/report", Scope::kRead, "cell_report", &RestApi::CellReport},
      {"GET", "/api/v1/cells/{id}/log", Scope::kRead, "cell_log", &RestApi::CellLog},
      {"GET", "/api/v1/artifacts/{digest}", Scope::kRead, "get_artifact", &RestApi::GetArtifact},
      {"GET", "/api/v1/agents", Scope::kRead, "list_agents", &RestApi::ListAgents},
      {"GET", "/api/v1/tokens", Scope::kAdmin, "list_tokens", &RestApi::ListTokens},
      {"POST", "/api/v1/tokens", Scope::kAdmin, "issue_token", &RestApi::IssueToken},
      {"DELETE", "/api/v1/tokens/{id}", Scope::kAdmin, "revoke_token", &RestApi::RevokeToken},
  };
  return routes;
}

namespace {

PathMatch MatchPath(const std::string& method, const std::vector<std::string>& segments) {
  static const std::vector<std::vector<std::string>> patterns = [] {
    std::vector<std::vector<std::string>> out;
    for (const Route& route : RestApi::Routes()) out.push_back(Segments(route.pattern));
    return out;
  }();
  const std::vector<Route>& routes = RestApi::Routes();
  PathMatch m;
  std::optional<Scope> strongest;
  for (size_t i = 0; i < routes.size(); ++i) {
    std::vector<std::string> params;
    if (!Matches(patterns[i], segments, &params)) continue;
    const Route& route = routes[i];
    if (m.allow.find(route.method) == std::string::npos) {
      m.allow += (m.allow.empty() ? "" : ", ") + std::string(route.method);
    }
    if (route.scope && (!strongest || *route.scope > *strongest)) strongest = route.scope;
    if (m.route == nullptr && MethodMatches(route.method, method)) {
      m.route = &route;
      m.params = std::move(params);
    }
  }
  const bool read_only = method == "GET" || method == "HEAD";
  if (m.route != nullptr) {
    m.scope = m.route->scope;
  } else if (!m.allow.empty()) {
    // Another method on a known path: a 405 is only told to a caller who may use the path.
    if (strongest) m.scope = read_only ? *strongest : std::max(*strongest, Scope::kSubmit);
  } else if (IsApi(segments)) {
    m.scope = read_only ? Scope::kRead : Scope::kSubmit;  // unknown /api path: 404 after auth
  }
  return m;
}

}  // namespace

std::optional<Scope> RequiredScope(const std::string& method, const std::string& path) {
  return MatchPath(method, Segments(path)).scope;
}

RestApi::RestApi(ControllerCore& core, Authenticator& auth, fs::path web_dir)
    : core_(core), auth_(auth), web_dir_(std::move(web_dir)) {}

HttpResponse RestApi::Handle(const HttpRequest& request) {
  try {
    return Dispatch(request);
  } catch (const std::exception& e) {
    spdlog::error("{} {}: {}", request.method, request.target, e.what());
    return ErrorResponse(500, std::string("internal error: ") + e.what());
  } catch (...) {
    spdlog::error("{} {}: unknown exception", request.method, request.target);
    return ErrorResponse(500, "internal error");
  }
}

HttpResponse RestApi::Dispatch(const HttpRequest& req) {
  auto parsed = boost::urls::parse_origin_form(req.target);
  if (!parsed) return ErrorResponse(400, "malformed request target '" + req.target + "'");
  const boost::urls::url_view url = *parsed;
  std::vector<std::string> segments;
  for (auto s : url.segments()) segments.push_back(s);
  if (!segments.empty() && segments.back().empty()) segments.pop_back();
  const std::string path = url.path();
  const std::string& method = req.method;

  PathMatch match = MatchPath(method, segments);
  if (match.allow.empty() && !IsApi(segments)) return ServeStatic(path, segments, method);
  RouteCall call{req, url, std::move(match.params), ""};

  if (const std::optional<Scope> scope = match.scope) {
    auto header = req.headers.find("authorization");
    auto principal = auth_.AuthorizeApi(header == req.headers.end() ? "" : header->second, *scope,
                                        method == "GET" || method == "HEAD");
    if (!principal.ok()) {
      HttpResponse r = ErrorResponse(principal.status());
      if (principal.status().code() == StatusCode::kUnauthenticated) {
        r.headers["WWW-Authenticate"] = "Bearer realm=\"gatehouse\"";
      }
      return r;
    }
    call.principal = principal->token_id != 0 ? principal->name : "";
  }
  if (match.allow.empty()) return ErrorResponse(404, "no route for " + path);
  if (match.route == nullptr) return MethodNotAllowed(method, path, match.allow);
  return (this->*match.route->handler)(call);
}

HttpResponse RestApi::Healthz(const RouteCall&) {
  return TextResponse(200, "text/plain; charset=utf-8", "ok");
}

HttpResponse RestApi::OpenApi(const RouteCall&) {
  return TextResponse(200, "application/json", std::string(OpenApiDocument()));
}

HttpResponse RestApi::SubmitCell(const RouteCall& call) {
  // The submitter is the token's name; the X-Gatehouse-Submitter header only names one when
  // the caller has no token (auth off, tests).
  std::string submitter = call.principal;
  if (auto h = call.request.headers.find("x-gatehouse-submitter");
      submitter.empty() && h != call.request.headers.end()) {
    submitter = h->second;
  }
  auto outcome = core_.Submit(call.request.body, submitter);
  if (!outcome.ok()) return ErrorResponse(outcome.status());
  if (const std::optional<DigestPending>& pending = outcome->pending) {
    // No cell yet: its id hashes the digests still being computed. The same body again later.
    HttpResponse r = JsonResponse(202, {{"state", "resolving"},
                                        {"reason", pending->reason},
                                        {"bytes_hashed", pending->bytes_hashed},
                                        {"bytes_total", pending->bytes_total},
                                        {"retry_after_s", kSubmitRetryAfterS}});
    r.headers["Retry-After"] = std::to_string(kSubmitRetryAfterS);
    return r;
  }
  json body = CellJson(outcome->cell);
  body["created"] = outcome->created;
  return JsonResponse(outcome->created ? 201 : 200, body);
}

HttpResponse RestApi::ListCells(const RouteCall& call) {
  auto query = ParseListQuery(call.url);
  if (!query.ok()) return ErrorResponse(query.status());
  auto cells = core_.ListCells(query->limit, query->offset);
  if (!cells.ok()) return ErrorResponse(cells.status());
  json list = json::array();
  for (const auto& c : *cells) list.push_back(CellSummaryJson(c));
  return JsonResponse(200, {{"cells", list}, {"limit", query->limit}, {"offset", query->offset}});
}

HttpResponse RestApi::GetCell(const RouteCall& call) {
  auto cell = core_.GetCell(call.params.at(0));
  if (!cell.ok()) return ErrorResponse(cell.status());
  return JsonResponse(200, CellJson(*cell));
}

HttpResponse RestApi::CancelCell(const RouteCall& call) {
  auto reason = ParseCancelReason(call.request.body);
  if (!reason.ok()) return ErrorResponse(reason.status());
  auto cell = core_.CancelCell(call.params.at(0), *reason);
  if (!cell.ok()) return ErrorResponse(cell.status());
  return JsonResponse(202, CellJson(*cell));
}

HttpResponse RestApi::HideCell(const RouteCall& call) {
  auto reason = ParseVisibilityReason(call.request.body);
  if (!reason.ok()) return ErrorResponse(reason.status());
  auto cell = core_.SetHidden(call.params.at(0), true, call.principal, *reason);
  if (!cell.ok()) return ErrorResponse(cell.status());
  return JsonResponse(200, CellJson(*cell));
}

HttpResponse RestApi::ShowCell(const RouteCall& call) {
  auto reason = ParseVisibilityReason(call.request.body);
  if (!reason.ok()) return ErrorResponse(reason.status());
  auto cell = core_.SetHidden(call.params.at(0), false, call.principal, *reason);
  if (!cell.ok()) return ErrorResponse(cell.status());
  return JsonResponse(200, CellJson(*cell));
}

HttpResponse RestApi::Readiness(const RouteCall& call) {
  auto include_hidden = ParseIncludeHidden(call.url);
  if (!include_hidden.ok()) return ErrorResponse(include_hidden.status());
  auto all_branches = ParseAllBranches(call.url);
  if (!all_branches.ok()) return ErrorResponse(all_branches.status());
  auto view = core_.Readiness(*include_hidden, *all_branches);
  if (!view.ok()) return ErrorResponse(view.status());
  return JsonResponse(200, ReadinessJson(*view));
}

HttpResponse RestApi::CellMatrix(const RouteCall& call) {
  auto query = ParseMatrixQuery(call.url);
  if (!query.ok()) return ErrorResponse(query.status());
  auto matrix = core_.CellMatrix(query->filter, query->status, query->all_branches);
  if (!matrix.ok()) return ErrorResponse(matrix.status());
  return JsonResponse(200, MatrixJson(matrix->first, matrix->second, query->filter, query->status,
                                      query->all_branches));
}

HttpResponse RestApi::ListDesignatedBranches(const RouteCall& call) {
  auto repository = ParseRepositoryParam(call.url, /*required=*/false);
  if (!repository.ok()) return ErrorResponse(repository.status());
  auto designations = core_.Designations(*repository);
  if (!designations.ok()) return ErrorResponse(designations.status());
  json list = json::array();
  for (const BranchDesignation& d : *designations) list.push_back(DesignationJson(d));
  return JsonResponse(200, {{"repositories", list}});
}

HttpResponse RestApi::SetDesignatedBranches(const RouteCall& call) {
  auto repository = ParseRepositoryParam(call.url, /*required=*/true);
  if (!repository.ok()) return ErrorResponse(repository.status());
  auto request = ParseDesignatedBranches(call.request.body);
  if (!request.ok()) return ErrorResponse(request.status());
  auto designation =
      core_.SetDesignatedBranches(*repository, request->branches, call.principal, request->reason);
  if (!designation.ok()) return ErrorResponse(designation.status());
  return JsonResponse(200, DesignationJson(*designation));
}

HttpResponse RestApi::RetryCell(const RouteCall& call) {
  auto cell = core_.RetryCell(call.params.at(0));
  if (!cell.ok()) return ErrorResponse(cell.status());
  return JsonResponse(202, CellJson(*cell));
}

HttpResponse RestApi::CellReport(const RouteCall& call) {
  auto report = core_.Report(call.params.at(0));
  if (!report.ok()) return ErrorResponse(report.status());
  return TextResponse(200, "text/markdown; charset=utf-8", std::move(*report));
}

HttpResponse RestApi::CellLog(const RouteCall& call) {
  auto query = ParseLogQuery(call.url);
  if (!query.ok()) return ErrorResponse(query.status());
  auto log = core_.ReadLog(call.params.at(0), query->stream, query->attempt, query->offset);
  if (!log.ok()) return ErrorResponse(log.status());
  const int64_t next = query->offset + static_cast<int64_t>(log->size());
  HttpResponse r = TextResponse(200, "text/plain; charset=utf-8", std::move(*log));
  // A live log is followed by asking again from here (bytes; the body may end mid-character).
  r.headers["X-Log-Next-Offset"] = std::to_string(next);
  return r;
}

HttpResponse RestApi::GetArtifact(const RouteCall& call) {
  auto path = core_.ArtifactPath(call.params.at(0));
  if (!path.ok()) return ErrorResponse(path.status());
  HttpResponse r;
  r.content_type = "application/octet-stream";
  r.file_path = path->string();
  r.headers["X-Gatehouse-Digest"] = call.params.at(0);
  return r;
}

HttpResponse RestApi::ListAgents(const RouteCall&) {
  auto agents = core_.ListAgents();
  if (!agents.ok()) return ErrorResponse(agents.status());
  json list = json::array();
  for (const AgentStatus& a : *agents) list.push_back(AgentJson(a));
  return JsonResponse(200, {{"agents", list}});
}

HttpResponse RestApi::ListTokens(const RouteCall&) {
  auto tokens = auth_.ListTokens();
  if (!tokens.ok()) return ErrorResponse(tokens.status());
  json list = json::array();
  for (const auto& t : *tokens) list.push_back(TokenJson(t));
  return JsonResponse(200, {{"tokens", list}});
}

HttpResponse RestApi::IssueToken(const RouteCall& call) {
  auto request = ParseTokenRequest(call.request.body);
  if (!request.ok()) return ErrorResponse(request.status());
  auto issued = auth_.Issue(request->name, request->kind, std::move(request->scopes));
  if (!issued.ok()) return ErrorResponse(issued.status());
  return JsonResponse(201, {{"token", TokenJson(issued->record)}, {"secret", issued->secret}});
}

HttpResponse RestApi::RevokeToken(const RouteCall& call) {
  const std::string& text = call.params.at(0);
  int64_t id = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (ec != std::errc() || end != text.data() + text.size() || id <= 0) {
    return ErrorResponse(404, "no token '" + text + "'");
  }
  auto revoked = auth_.Revoke(id);
  if (!revoked.ok()) return ErrorResponse(revoked.status());
  spdlog::info("token {} '{}' revoked", revoked->id, revoked->name);
  return JsonResponse(200, TokenJson(*revoked));
}

HttpResponse RestApi::ServeStatic(const std::string& path,
                                  const std::vector<std::string>& segments,
                                  const std::string& method) {
  if (method != "GET" && method != "HEAD") return MethodNotAllowed(method, path, "GET");
  std::vector<std::string> rel(segments.begin(), segments.end());
  if (!rel.empty() && rel[0] == "static") rel.erase(rel.begin());
  std::string relative;
  for (const std::string& s : rel) {
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos ||
        s.find('\\') != std::string::npos || s.find('\0') != std::string::npos) {
      return ErrorResponse(400, "invalid path '" + path + "'");
    }
    relative += (relative.empty() ? "" : "/") + s;
  }
  if (relative.empty()) relative = "index.html";

  std::error_code ec;
  const fs::path root = fs::canonical(web_dir_, ec);
  if (ec) return ErrorResponse(404, "no dashboard files (web dir '" + web_dir_.string() + "')");
  const fs::path file = fs::canonical(root / relative, ec);
  if (ec) return ErrorResponse(404, "no file '/" + relative + "'");
  // After symlinks are resolved the file must still lie under the web dir.
  auto [root_end, file_it] = std::mismatch(root.begin(), root.end(), file.begin(), file.end());
  if (root_end != root.end() || !fs::is_regular_file(file, ec)) {
    return ErrorResponse(404, "no file '/" + relative + "'");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return ErrorResponse(404, "no file '/" + relative + "'");
  std::ostringstream content;
  content << in.rdbuf();
  HttpResponse r;
  r.status = 200;
  r.content_type = ContentTypeOf(file);
  r.body = std::move(content).str();
  r.headers["Cache-Control"] = "no-cache";
  return r;
}

}  // namespace gatehouse::controller
