#include "controller/rest_bodies.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include <nlohmann/json.hpp>

namespace gatehouse::controller {
namespace {

using nlohmann::json;

constexpr size_t kMaxCancelReasonBytes = 1000;
constexpr int kDefaultListLimit = 50;
constexpr int kMaxListLimit = 500;

// A JSON object whose members are all in `known`. Errors name the first unknown member.
Result<json> ObjectBody(std::string_view text, std::initializer_list<std::string_view> known) {
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return Status::InvalidArgument("body: expected a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
      return Status::InvalidArgument("unknown field '" + it.key() + "'");
    }
  }
  return body;
}

// A query parameter as an integer in [0, max]; `fallback` when absent.
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

}  // namespace

Result<std::string> ParseCancelReason(std::string_view text) {
  if (text.empty()) return std::string();
  GH_ASSIGN_OR_RETURN(const json body, ObjectBody(text, {"reason"}));
  if (!body.contains("reason")) return std::string();
  const json& reason = body.at("reason");
  if (!reason.is_string() || reason.get_ref<const std::string&>().size() > kMaxCancelReasonBytes) {
    return Status::InvalidArgument("field 'reason': expected a string of at most " +
                                   std::to_string(kMaxCancelReasonBytes) + " bytes");
  }
  return reason.get<std::string>();
}

Result<std::string> ParseVisibilityReason(std::string_view text) {
  GH_ASSIGN_OR_RETURN(const json body, ObjectBody(text, {"reason"}));
  const auto reason = body.find("reason");
  if (reason == body.end() || !reason->is_string() ||
      reason->get_ref<const std::string&>().empty() ||
      reason->get_ref<const std::string&>().size() > kMaxCancelReasonBytes) {
    return Status::InvalidArgument("field 'reason': required, a string of 1 to " +
                                   std::to_string(kMaxCancelReasonBytes) + " bytes");
  }
  return reason->get<std::string>();
}

Result<bool> ParseIncludeHidden(const boost::urls::url_view& url) {
  auto it = url.params().find("include_hidden");
  if (it == url.params().end()) return false;
  const std::string value((*it).value);
  if (value == "true") return true;
  if (value == "false") return false;
  return Status::InvalidArgument("query parameter 'include_hidden': expected true or false, got '" +
                                 value + "'");
}

Result<TokenRequest> ParseTokenRequest(std::string_view text) {
  GH_ASSIGN_OR_RETURN(const json body, ObjectBody(text, {"name", "kind", "scopes"}));
  TokenRequest r;
  if (!body.contains("name") || !body.at("name").is_string()) {
    return Status::InvalidArgument("field 'name': expected a string");
  }
  r.name = body.at("name").get<std::string>();
  if (body.contains("kind")) {
    if (!body.at("kind").is_string()) return Status::InvalidArgument("field 'kind': expected a string");
    auto kind = ParseTokenKind(body.at("kind").get<std::string>());
    if (!kind.ok()) return Status::InvalidArgument("field 'kind': " + kind.status().message());
    r.kind = *kind;
  }
  if (body.contains("scopes")) {
    if (!body.at("scopes").is_array()) {
      return Status::InvalidArgument("field 'scopes': expected an array of strings");
    }
    for (const json& v : body.at("scopes")) {
      if (!v.is_string()) return Status::InvalidArgument("field 'scopes': expected strings");
      auto scope = ParseScope(v.get<std::string>());
      if (!scope.ok()) return Status::InvalidArgument("field 'scopes': " + scope.status().message());
      r.scopes.push_back(*scope);
    }
  }
  return r;
}

Result<ListQuery> ParseListQuery(const boost::urls::url_view& url) {
  ListQuery q;
  GH_ASSIGN_OR_RETURN(const int limit, IntParam(url, "limit", kDefaultListLimit, kMaxListLimit));
  q.limit = std::max(limit, 1);
  GH_ASSIGN_OR_RETURN(q.offset, IntParam(url, "offset", 0, std::numeric_limits<int>::max()));
  return q;
}

Result<LogQuery> ParseLogQuery(const boost::urls::url_view& url) {
  LogQuery q;
  if (auto it = url.params().find("stream"); it != url.params().end()) q.stream = (*it).value;
  if (url.params().contains("attempt")) {
    GH_ASSIGN_OR_RETURN(q.attempt, IntParam(url, "attempt", 0, std::numeric_limits<int>::max()));
  }
  GH_ASSIGN_OR_RETURN(q.offset, IntParam(url, "offset", 0, std::numeric_limits<int>::max()));
  return q;
}

Result<MatrixQuery> ParseMatrixQuery(const boost::urls::url_view& url) {
  MatrixQuery q;
  auto text = [&url](const char* name) {
    auto it = url.params().find(name);
    return it == url.params().end() ? std::string() : std::string((*it).value);
  };
  q.filter.repository = text("repository");
  q.filter.branch = text("branch");
  q.filter.commit = text("commit");
  q.filter.model_family = text("model_family");
  q.status = text("status");
  GH_ASSIGN_OR_RETURN(q.filter.include_hidden, ParseIncludeHidden(url));
  const bool hex40 = q.filter.commit.size() == 40 &&
                     q.filter.commit.find_first_not_of("0123456789abcdef") == std::string::npos;
  if (!q.filter.commit.empty() && !hex40) {
    return Status::InvalidArgument("query parameter 'commit': expected 40 lower-case hex digits, got '" +
                                   q.filter.commit + "'");
  }
  static constexpr std::string_view kReadiness[] = {"validated", "failed", "blocked", "unverified"};
  if (!q.status.empty() && !ParseAttemptState(q.status) &&
      std::find(std::begin(kReadiness), std::end(kReadiness), q.status) == std::end(kReadiness)) {
    return Status::InvalidArgument("query parameter 'status': expected an attempt state (queued, "
                                   "running, passed, failed, ...) or a readiness (validated, "
                                   "failed, blocked, unverified), got '" + q.status + "'");
  }
  return q;
}

}  // namespace gatehouse::controller
