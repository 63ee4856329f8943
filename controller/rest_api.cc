#include "controller/rest_api.h"

#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include <algorithm>
#include <charconv>
#include <exception>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

namespace gatehouse::controller {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kDefaultListLimit = 50;
constexpr int kMaxListLimit = 500;

HttpResponse JsonResponse(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  // Invalid UTF-8 in a stored string or an error message becomes U+FFFD instead of an
  // exception (which would turn any response into a 500).
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  r.headers["Cache-Control"] = "no-store";
  return r;
}

HttpResponse TextResponse(int status, std::string content_type, std::string body) {
  HttpResponse r;
  r.status = status;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  r.headers["Cache-Control"] = "no-store";
  return r;
}

HttpResponse MethodNotAllowed(const std::string& method, const std::string& path,
                              const std::string& allow) {
  HttpResponse r = ErrorResponse(405, "method " + method + " not allowed on " + path);
  r.headers["Allow"] = allow;
  return r;
}

json NullIfEmpty(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

json AttemptJson(const AttemptRecord& a) {
  return {{"id", a.id},
          {"number", a.number},
          {"state", AttemptStateName(a.state)},
          {"agent", NullIfEmpty(a.agent_id)},
          {"reason", a.reason},
          {"cancel_reason", NullIfEmpty(a.cancel_reason)},
          {"retry_of", a.retry_of > 0 ? json(a.retry_of) : json(nullptr)},
          {"created_at", a.created_at},
          {"started_at", NullIfEmpty(a.started_at)},
          {"ended_at", NullIfEmpty(a.ended_at)}};
}

json PhaseJson(const PhaseRecord& p) {
  json figures = json::array();
  for (const FigureRecord& f : p.figures) {
    json value = json::parse(f.value_json, nullptr, false);
    if (value.is_discarded()) value = f.value_json;
    figures.push_back({{"name", f.name}, {"value", value}, {"unit", f.unit}});
  }
  return {{"phase", p.phase},
          {"status", p.status},
          {"reason", p.reason},
          {"classification", p.classification},
          {"duration_ms", p.duration_ms ? json(*p.duration_ms) : json(nullptr)},
          {"figures", figures}};
}

json CellJson(const CellDetail& d) {
  json spec = json::parse(d.cell.spec_json, nullptr, false);
  json attempts = json::array();
  for (const auto& a : d.attempts) attempts.push_back(AttemptJson(a));
  json phases = json::array();
  for (const auto& p : d.phases) phases.push_back(PhaseJson(p));
  return {{"id", d.cell.id},
          {"status", AttemptStateName(d.status)},
          {"spec", spec.is_discarded() ? json(d.cell.spec_json) : spec},
          {"labels",
           {{"branch", d.cell.branch}, {"submitter", d.cell.submitter}, {"priority", d.cell.priority}}},
          {"created_at", d.cell.created_at},
          {"attempts", attempts},
          {"phases", phases},
          {"waiting_reason", NullIfEmpty(d.waiting_reason)}};
}

json TokenJson(const TokenRecord& t) {
  json scopes = json::array();
  for (Scope s : ScopesOf(t)) scopes.push_back(ScopeName(s));
  return {{"id", t.id},
          {"name", t.name},
          {"kind", t.kind},
          {"scopes", scopes},
          {"created_at", t.created_at},
          {"last_used_at", NullIfEmpty(t.last_used_at)},
          {"revoked_at", NullIfEmpty(t.revoked_at)}};
}

json AgentJson(const AgentStatus& a) {
  json capabilities = json::parse(a.record.capabilities_json, nullptr, false);
  if (!capabilities.is_object()) capabilities = json::object();
  return {{"id", a.record.id},
          {"name", a.record.name},
          {"state", a.record.state},
          {"attached", a.attached},
          {"silent", a.silent},
          {"drain_reason", NullIfEmpty(a.drain_reason)},
          {"slots", a.slots},
          {"running", a.running},
          {"capabilities", capabilities},
          {"registered_at", a.record.registered_at},
          {"last_heartbeat_at", NullIfEmpty(a.record.last_heartbeat_at)},
          {"last_seen_at", NullIfEmpty(a.last_seen_at)}};
}

json SummaryJson(const CellSummary& s) {
  return {{"id", s.cell.id},
          {"status", AttemptStateName(s.status)},
          {"model_family", s.cell.model_family},
          {"repository", s.cell.repository},
          {"branch", s.cell.branch},
          {"commit", s.cell.commit_sha},
          {"created_at", s.cell.created_at}};
}

// A query parameter as a non-negative integer; `fallback` when absent.
Result<int> IntParam(const boost::urls::url_view& url, const char* name, int fallback, int max) {
  auto it = url.params().find(name);
  if (it == url.params().end()) return fallback;
  const std::string value = (*it).value;
  int v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < 0 || v > max) {
    return Status::InvalidArgument("query parameter '" + std::string(name) +
                                   "': expected an integer in [0, " + std::to_string(max) +
                                   "], got '" + value + "'");
  }
  return v;
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

}  // namespace

int HttpStatusOf(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
      return 409;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kResourceExhausted:
      return 413;
    case StatusCode::kDeadlineExceeded:
      return 504;
    case StatusCode::kDataLoss:
    case StatusCode::kInternal:
      return 500;
  }
  return 500;
}

HttpResponse ErrorResponse(int http_status, const std::string& message) {
  return JsonResponse(http_status, json{{"error", message}});
}

Scope RequiredScope(const std::string& method, const std::vector<std::string>& segments) {
  if (segments.size() >= 3 && segments[2] == "tokens") return Scope::kAdmin;
  return method == "GET" || method == "HEAD" ? Scope::kRead : Scope::kSubmit;
}

RestApi::RestApi(ControllerCore& core, Authenticator& auth, fs::path web_dir)
    : core_(core), auth_(auth), web_dir_(std::move(web_dir)) {}

HttpResponse RestApi::Handle(const HttpRequest& request) {
  try {
    return Route(request);
  } catch (const std::exception& e) {
    spdlog::error("{} {}: {}", request.method, request.target, e.what());
    return ErrorResponse(500, std::string("internal error: ") + e.what());
  } catch (...) {
    spdlog::error("{} {}: unknown exception", request.method, request.target);
    return ErrorResponse(500, "internal error");
  }
}

HttpResponse RestApi::Route(const HttpRequest& req) {
  auto parsed = boost::urls::parse_origin_form(req.target);
  if (!parsed) return ErrorResponse(400, "malformed request target '" + req.target + "'");
  const boost::urls::url_view url = *parsed;
  std::vector<std::string> seg;
  for (auto s : url.segments()) seg.push_back(s);
  if (!seg.empty() && seg.back().empty()) seg.pop_back();  // tolerate a trailing '/'
  const std::string path = url.path();
  const std::string& m = req.method;
  std::string principal_name;

  if (seg.size() == 1 && seg[0] == "healthz") {
    if (m != "GET" && m != "HEAD") return MethodNotAllowed(m, path, "GET");
    return TextResponse(200, "text/plain; charset=utf-8", "ok");
  }

  if (seg.size() == 3 && seg[0] == "api" && seg[1] == "v1" && seg[2] == "openapi.json") {
    if (m != "GET" && m != "HEAD") return MethodNotAllowed(m, path, "GET");
    return TextResponse(200, "application/json", std::string(OpenApiDocument()));
  }

  if (!seg.empty() && seg[0] == "api") {
    auto header = req.headers.find("authorization");
    auto principal =
        auth_.AuthorizeApi(header == req.headers.end() ? "" : header->second,
                           RequiredScope(m, seg), m == "GET" || m == "HEAD");
    if (!principal.ok()) {
      HttpResponse r = ErrorResponse(HttpStatusOf(principal.status()),
                                     principal.status().message());
      if (principal.status().code() == StatusCode::kUnauthenticated) {
        r.headers["WWW-Authenticate"] = "Bearer realm=\"gatehouse\"";
      }
      return r;
    }
    principal_name = principal->token_id != 0 ? principal->name : "";
  }

  if (seg.size() >= 3 && seg[0] == "api" && seg[1] == "v1" && seg[2] == "tokens") {
    return Tokens(req, seg, path);
  }

  if (seg.size() == 3 && seg[0] == "api" && seg[1] == "v1" && seg[2] == "agents") {
    if (m != "GET") return MethodNotAllowed(m, path, "GET");
    auto agents = core_.ListAgents();
    if (!agents.ok()) return ErrorResponse(HttpStatusOf(agents.status()), agents.status().message());
    json list = json::array();
    for (const AgentStatus& a : *agents) list.push_back(AgentJson(a));
    return JsonResponse(200, {{"agents", list}});
  }

  if (seg.size() >= 3 && seg[0] == "api" && seg[1] == "v1" && seg[2] == "cells") {
    if (seg.size() == 3) {
      if (m == "POST") {
        // The submitter is the token's name; the X-Gatehouse-Submitter header only names one
        // when the caller has no token (auth off, tests).
        std::string submitter = principal_name;
        if (auto h = req.headers.find("x-gatehouse-submitter");
            submitter.empty() && h != req.headers.end()) {
          submitter = h->second;
        }
        auto outcome = core_.Submit(req.body, submitter);
        if (!outcome.ok()) {
          return ErrorResponse(HttpStatusOf(outcome.status()), outcome.status().message());
        }
        json body = CellJson(outcome->cell);
        body["created"] = outcome->created;
        return JsonResponse(outcome->created ? 201 : 200, body);
      }
      if (m != "GET") return MethodNotAllowed(m, path, "GET, POST");
      auto limit = IntParam(url, "limit", kDefaultListLimit, kMaxListLimit);
      if (!limit.ok()) return ErrorResponse(400, limit.status().message());
      auto offset = IntParam(url, "offset", 0, std::numeric_limits<int>::max());
      if (!offset.ok()) return ErrorResponse(400, offset.status().message());
      auto cells = core_.ListCells(std::max(*limit, 1), *offset);
      if (!cells.ok()) return ErrorResponse(HttpStatusOf(cells.status()), cells.status().message());
      json list = json::array();
      for (const auto& c : *cells) list.push_back(SummaryJson(c));
      return JsonResponse(200,
                          {{"cells", list}, {"limit", std::max(*limit, 1)}, {"offset", *offset}});
    }
    const std::string& id = seg[3];
    if (seg.size() == 5 && seg[4] == "cancel") {
      if (m != "POST") return MethodNotAllowed(m, path, "POST");
      // Optional body {"reason": "..."}; the reason is stored and shown, never executed.
      std::string reason;
      if (!req.body.empty()) {
        const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
        if (!body.is_object()) return ErrorResponse(400, "body: expected a JSON object");
        for (auto it = body.begin(); it != body.end(); ++it) {
          if (it.key() != "reason") return ErrorResponse(400, "unknown field '" + it.key() + "'");
        }
        if (body.contains("reason")) {
          if (!body["reason"].is_string() || body["reason"].get_ref<const std::string&>().size() > 1000) {
            return ErrorResponse(400, "field 'reason': expected a string of at most 1000 bytes");
          }
          reason = body["reason"].get<std::string>();
        }
      }
      auto cell = core_.CancelCell(id, reason);
      if (!cell.ok()) return ErrorResponse(HttpStatusOf(cell.status()), cell.status().message());
      return JsonResponse(202, CellJson(*cell));
    }
    if (m != "GET") return MethodNotAllowed(m, path, "GET");
    if (seg.size() == 4) {
      auto cell = core_.GetCell(id);
      if (!cell.ok()) return ErrorResponse(HttpStatusOf(cell.status()), cell.status().message());
      return JsonResponse(200, CellJson(*cell));
    }
    if (seg.size() == 5 && seg[4] == "report") {
      auto report = core_.Report(id);
      if (!report.ok())
        return ErrorResponse(HttpStatusOf(report.status()), report.status().message());
      return TextResponse(200, "text/markdown; charset=utf-8", std::move(*report));
    }
    if (seg.size() == 5 && seg[4] == "log") {
      std::string stream = "worker";
      if (auto it = url.params().find("stream"); it != url.params().end()) stream = (*it).value;
      std::optional<int> number;
      if (url.params().contains("attempt")) {
        auto n = IntParam(url, "attempt", 0, std::numeric_limits<int>::max());
        if (!n.ok()) return ErrorResponse(400, n.status().message());
        number = *n;
      }
      auto log = core_.ReadLog(id, stream, number);
      if (!log.ok()) return ErrorResponse(HttpStatusOf(log.status()), log.status().message());
      return TextResponse(200, "text/plain; charset=utf-8", std::move(*log));
    }
    return ErrorResponse(404, "no route for " + path);
  }
  if (!seg.empty() && seg[0] == "api") return ErrorResponse(404, "no route for " + path);

  // Dashboard files.
  if (m != "GET" && m != "HEAD") return MethodNotAllowed(m, path, "GET");
  std::vector<std::string> rel(seg.begin(), seg.end());
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
  return ServeStatic(relative);
}

HttpResponse RestApi::Tokens(const HttpRequest& req, const std::vector<std::string>& seg,
                             const std::string& path) {
  const std::string& m = req.method;
  if (seg.size() == 3) {
    if (m == "GET") {
      auto tokens = auth_.ListTokens();
      if (!tokens.ok()) return ErrorResponse(HttpStatusOf(tokens.status()), tokens.status().message());
      json list = json::array();
      for (const auto& t : *tokens) list.push_back(TokenJson(t));
      return JsonResponse(200, {{"tokens", list}});
    }
    if (m != "POST") return MethodNotAllowed(m, path, "GET, POST");
    const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object()) return ErrorResponse(400, "body: expected a JSON object");
    for (auto it = body.begin(); it != body.end(); ++it) {
      if (it.key() != "name" && it.key() != "kind" && it.key() != "scopes") {
        return ErrorResponse(400, "unknown field '" + it.key() + "'");
      }
    }
    if (!body.contains("name") || !body["name"].is_string()) {
      return ErrorResponse(400, "field 'name': expected a string");
    }
    TokenKind kind = TokenKind::kApi;
    if (body.contains("kind")) {
      if (!body["kind"].is_string()) return ErrorResponse(400, "field 'kind': expected a string");
      auto k = ParseTokenKind(body["kind"].get<std::string>());
      if (!k.ok()) return ErrorResponse(400, "field 'kind': " + k.status().message());
      kind = *k;
    }
    std::vector<Scope> scopes;
    if (body.contains("scopes")) {
      if (!body["scopes"].is_array()) {
        return ErrorResponse(400, "field 'scopes': expected an array of strings");
      }
      for (const json& v : body["scopes"]) {
        if (!v.is_string()) return ErrorResponse(400, "field 'scopes': expected strings");
        auto sc = ParseScope(v.get<std::string>());
        if (!sc.ok()) return ErrorResponse(400, "field 'scopes': " + sc.status().message());
        scopes.push_back(*sc);
      }
    }
    auto issued = auth_.Issue(body["name"].get<std::string>(), kind, std::move(scopes));
    if (!issued.ok()) return ErrorResponse(HttpStatusOf(issued.status()), issued.status().message());
    return JsonResponse(201, {{"token", TokenJson(issued->record)}, {"secret", issued->secret}});
  }
  if (seg.size() == 4) {
    if (m != "DELETE") return MethodNotAllowed(m, path, "DELETE");
    int64_t id = 0;
    const std::string& text = seg[3];
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
    if (ec != std::errc() || end != text.data() + text.size() || id <= 0) {
      return ErrorResponse(404, "no token '" + text + "'");
    }
    auto revoked = auth_.Revoke(id);
    if (!revoked.ok()) return ErrorResponse(HttpStatusOf(revoked.status()), revoked.status().message());
    spdlog::info("token {} '{}' revoked", revoked->id, revoked->name);
    return JsonResponse(200, TokenJson(*revoked));
  }
  return ErrorResponse(404, "no route for " + path);
}

HttpResponse RestApi::ServeStatic(const std::string& relative) {
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
