#include "controller/rest_render.h"

namespace gatehouse::controller {
namespace {

using nlohmann::json;

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

}  // namespace

json CellJson(const CellDetail& d) {
  json spec = json::parse(d.cell.spec_json, nullptr, false);
  json attempts = json::array();
  for (const auto& a : d.attempts) attempts.push_back(AttemptJson(a));
  json phases = json::array();
  for (const auto& p : d.phases) phases.push_back(PhaseJson(p));
  json artifacts = json::array();
  for (const ArtifactRecord& a : d.artifacts) {
    artifacts.push_back({{"attempt_id", a.attempt_id},
                         {"name", a.name},
                         {"digest", a.digest},
                         {"size", a.size},
                         {"created_at", a.created_at},
                         {"expired_at", NullIfEmpty(a.expired_at)}});
  }
  json deliveries = json::array();
  for (const WebhookDelivery& w : d.webhook_deliveries) {
    deliveries.push_back({{"attempt_id", w.attempt_id},
                          {"state", w.state},
                          {"tries", w.tries},
                          {"last_status", w.last_status},
                          {"last_error", w.last_error},
                          {"next_try_at", w.state == "pending" ? json(w.next_try_at) : json(nullptr)},
                          {"delivered_at", NullIfEmpty(w.delivered_at)}});
  }
  json visibility = json::array();
  for (const CellVisibilityAction& v : d.visibility) {
    visibility.push_back(
        {{"action", v.action}, {"actor", v.actor}, {"reason", v.reason}, {"at", v.at}});
  }
  json memory = nullptr;
  if (!d.memory_estimate.empty()) {
    json processes = json::array();
    for (const ProcessMemory& p : d.memory_estimate.processes) {
      processes.push_back({{"role", p.role},
                           {"count", p.count},
                           {"host_bytes", p.host_bytes},
                           {"device_bytes", p.device_bytes},
                           {"basis", p.basis}});
    }
    memory = {{"host_bytes", d.memory_estimate.host_bytes()},
              {"device_bytes_per_gpu", d.memory_estimate.device_bytes_per_gpu()},
              {"summary", d.memory_estimate.Describe()},
              {"processes", processes}};
  }
  return {{"id", d.cell.id},
          {"status", AttemptStateName(d.status)},
          {"spec", spec.is_discarded() ? json(d.cell.spec_json) : spec},
          {"labels",
           {{"branch", d.cell.branch}, {"submitter", d.cell.submitter}, {"priority", d.cell.priority}}},
          {"created_at", d.cell.created_at},
          {"attempts", attempts},
          {"phases", phases},
          {"waiting_reason", NullIfEmpty(d.waiting_reason)},
          {"artifacts", artifacts},
          {"webhook_deliveries", deliveries},
          {"hidden", d.cell.hidden},
          {"visibility", visibility},
          {"memory_estimate", memory}};
}

json DesignationJson(const BranchDesignation& d) {
  const RepositoryBranches& row = d.stored;
  json configured = nullptr;
  if (row.designated) {
    configured = {{"branches", *row.designated},
                  {"by", row.designated_by},
                  {"reason", row.designated_reason},
                  {"at", row.designated_at}};
  }
  return {{"repository", d.repository},
          {"source", d.source},
          {"branches", d.source == "unknown" ? json(nullptr) : json(d.branches)},
          {"default_branch", NullIfEmpty(row.default_branch)},
          {"default_branch_seen_at", NullIfEmpty(row.default_seen_at)},
          {"configured", configured}};
}

json ReadinessJson(const ReadinessView& view) {
  json out = json::array();
  for (const ReadinessCombination& c : view.combinations) {
    json commits = json::array();
    for (const ReadinessCommit& r : c.commits) {
      json commit{{"repository", r.repository},
                  {"branch", r.branch},
                  {"commit", r.commit},
                  {"readiness", r.readiness},
                  {"status", AttemptStateName(r.status)},
                  {"cell", r.cell_id},
                  {"created_at", r.created_at}};
      if (!r.fp32_readiness.empty()) commit["fp32_readiness"] = r.fp32_readiness;
      commits.push_back(std::move(commit));
    }
    out.push_back({{"model_family", c.model_family},
                   {"checkpoint", {{"path", c.checkpoint.path}, {"digest", c.checkpoint.digest}}},
                   {"device", c.device},
                   {"precision", c.precision},
                   {"topology", TopologyJson(c.topology)},
                   {"mode", c.mode},
                   {"phases", c.phases},
                   {"torch", c.torch},
                   {"commits", commits}});
    if (!c.numerics.empty()) out.back()["numerics"] = c.numerics;
  }
  json body = {{"branches", view.all_branches ? "all" : "designated"}, {"combinations", out}};
  if (!view.all_branches) {
    json designated = json::array();
    for (const BranchDesignation& d : view.designations) designated.push_back(DesignationJson(d));
    body["designated"] = std::move(designated);
  }
  return body;
}

json MatrixJson(const Matrix& matrix, const MatrixChoices& choices, const MatrixFilter& filter,
                const std::string& status, bool all_branches) {
  json columns = json::array();
  for (const MatrixColumn& c : matrix.columns) {
    columns.push_back({{"key", c.key},
                       {"device", c.device},
                       {"precision", c.precision},
                       {"topology", TopologyJson(c.topology)},
                       {"mode", c.mode}});
  }
  json rows = json::array();
  for (const MatrixRow& r : matrix.rows) {
    json squares = json::object();
    for (const auto& [key, q] : r.squares) {
      squares[key] = {{"cell", q.cell_id},
                      {"status", AttemptStateName(q.status)},
                      {"readiness", ReadinessOf(q.status)},
                      {"repository", q.repository},
                      {"branch", q.branch},
                      {"commit", q.commit_sha},
                      {"created_at", q.created_at},
                      {"cells", q.cells}};
      if (!q.waiting_reason.empty()) squares[key]["waiting_reason"] = q.waiting_reason;
    }
    rows.push_back({{"model_family", r.model_family},
                    {"checkpoint", {{"path", r.checkpoint.path}, {"digest", r.checkpoint.digest}}},
                    {"readiness", r.readiness},
                    {"counts", r.counts},
                    {"squares", squares}});
  }
  json repositories = json::array();
  for (const auto& [repository, branches] : choices.repositories) {
    repositories.push_back({{"repository", repository}, {"branches", branches}});
  }
  return {{"filter",
           {{"repository", filter.repository},
            {"branch", filter.branch},
            {"commit", filter.commit},
            {"model_family", filter.model_family},
            {"status", status},
            {"branches", all_branches || !filter.branch.empty() ? "all" : "designated"}}},
          {"choices", {{"repositories", repositories}, {"model_families", choices.model_families}}},
          {"columns", columns},
          {"rows", rows}};
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
          {"running", a.running_cells.size()},
          {"running_cells", a.running_cells},
          {"capabilities", capabilities},
          {"registered_at", a.record.registered_at},
          {"last_heartbeat_at", NullIfEmpty(a.record.last_heartbeat_at)},
          {"last_seen_at", NullIfEmpty(a.last_seen_at)}};
}

json CellSummaryJson(const CellSummary& s) {
  return {{"id", s.cell.id},
          {"status", AttemptStateName(s.status)},
          {"model_family", s.cell.model_family},
          {"repository", s.cell.repository},
          {"branch", s.cell.branch},
          {"commit", s.cell.commit_sha},
          {"created_at", s.cell.created_at},
          {"hidden", s.cell.hidden}};
}

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

HttpResponse ErrorResponse(const Status& status) {
  return ErrorResponse(HttpStatusOf(status), status.message());
}

}  // namespace gatehouse::controller
