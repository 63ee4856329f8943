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
          {"labels", {{"branch", d.cell.branch}, {"submitter", d.cell.submitter}}},
          {"created_at", d.cell.created_at},
          {"attempts", attempts},
          {"phases", phases},
          {"waiting_reason", NullIfEmpty(d.waiting_reason)}};
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
    case StatusCode::kDataLoss:
    case StatusCode::kInternal:
      return 500;
  }
  return 500;
}

HttpResponse ErrorResponse(int http_status, const std::string& message) {
  return JsonResponse(http_status, json{{"error", message}});
}

RestApi::RestApi(ControllerCore& core, fs::path web_dir)
    : core_(core), web_dir_(std::move(web_dir)) {}

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

  if (seg.size() == 1 && seg[0] == "healthz") {
    if (m != "GET" && m != "HEAD") return MethodNotAllowed(m, path, "GET");
    return TextResponse(200, "text/plain; charset=utf-8", "ok");
  }

  if (seg.size() >= 3 && seg[0] == "api" && seg[1] == "v1" && seg[2] == "cells") {
    if (seg.size() == 3) {
      if (m == "POST") {
        auto submitter = req.headers.find("x-gatehouse-submitter");
        auto outcome =
            core_.Submit(req.body, submitter == req.headers.end() ? "" : submitter->second);
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
