#include "controller/rest_bodies.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/cell_spec.h"
#include "common/json_fields.h"

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

// A name git accepts for a branch (git check-ref-format --branch, refs.c): what the mirror
// could resolve, so a designated branch can match a submitted one.
bool IsBranchName(std::string_view name) {
  if (name.empty() || name.size() > CellSpecLimits::kMaxBranchBytes || name == "@") return false;
  if (name.front() == '-' || name.front() == '/' || name.back() == '/' || name.back() == '.') {
    return false;
  }
  for (const unsigned char c : name) {
    if (c < 0x20 || c == 0x7f || std::string_view(" ~^:?*[\\").find(static_cast<char>(c)) !=
                                     std::string_view::npos) {
      return false;
    }
  }
  if (name.find("..") != std::string_view::npos || name.find("@{") != std::string_view::npos ||
      name.find("//") != std::string_view::npos) {
    return false;
  }
  // Each '/'-separated component: not starting with '.', not ending with ".lock".
  for (size_t at = 0; at <= name.size();) {
    const size_t slash = std::min(name.find('/', at), name.size());
    const std::string_view part = name.substr(at, slash - at);
    if (part.empty() || part.front() == '.' || part.ends_with(".lock")) return false;
    at = slash + 1;
  }
  return true;
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

Result<bool> ParseAllBranches(const boost::urls::url_view& url) {
  auto it = url.params().find("branches");
  if (it == url.params().end()) return false;
  const std::string value((*it).value);
  if (value == "all") return true;
  if (value == "designated") return false;
  return Status::InvalidArgument(
      "query parameter 'branches': expected designated or all, got '" + value + "'");
}

Result<std::string> ParseRepositoryParam(const boost::urls::url_view& url, bool required) {
  auto it = url.params().find("repository");
  if (it == url.params().end() || (*it).value.empty()) {
    if (!required) return std::string();
    return Status::InvalidArgument(
        "query parameter 'repository': required (the repository as cells store it, URL-encoded)");
  }
  const std::string value((*it).value);
  const std::string field = "query parameter 'repository'";
  if (value.size() > CellSpecLimits::kMaxPathBytes) {
    return Status::InvalidArgument(field + ": expected at most " +
                                   std::to_string(CellSpecLimits::kMaxPathBytes) + " bytes, got " +
                                   std::to_string(value.size()));
  }
  if (value.front() == '/') {
    auto path = json_fields::ReadAbsolutePath(json(value), "repository", CellSpecLimits::kMaxPathBytes);
    if (!path.ok()) return Status::InvalidArgument(field + ": " + path.status().message());
    return *path;
  }
  if (value.find("://") == std::string::npos) {
    return Status::InvalidArgument(field + ": expected a URL (scheme://...) or an absolute path, got '" +
                                   value + "'");
  }
  return value;
}

Result<DesignatedBranchesRequest> ParseDesignatedBranches(std::string_view text) {
  GH_ASSIGN_OR_RETURN(const json body, ObjectBody(text, {"branches", "reason"}));
  DesignatedBranchesRequest r;
  const auto branches = body.find("branches");
  if (branches == body.end() || !branches->is_array() ||
      branches->size() > kMaxDesignatedBranches) {
    return json_fields::FieldError(
        "branches", "an array of at most " + std::to_string(kMaxDesignatedBranches) +
                        " branch names ([] for the default branch)",
        branches == body.end() ? json() : *branches);
  }
  for (size_t i = 0; i < branches->size(); ++i) {
    const std::string field = "branches[" + std::to_string(i) + "]";
    const json& v = (*branches)[i];
    if (!v.is_string() || !IsBranchName(v.get_ref<const std::string&>())) {
      return json_fields::FieldError(
          field, "a branch name (1 to 1024 bytes, git's rules: no space, control character, "
                 "'..', '~^:?*[\\', '@{', no leading '-' or '/', no trailing '/', '.' or '.lock')",
          v);
    }
    const std::string& name = v.get_ref<const std::string&>();
    if (std::find(r.branches.begin(), r.branches.end(), name) != r.branches.end()) {
      return json_fields::FieldError(field, "a branch not named before", v);
    }
    r.branches.push_back(name);
  }
  if (const auto reason = body.find("reason"); reason != body.end()) {
    if (!reason->is_string() || reason->get_ref<const std::string&>().size() > kMaxCancelReasonBytes) {
      return json_fields::FieldError(
          "reason", "a string of at most " + std::to_string(kMaxCancelReasonBytes) + " bytes",
          *reason);
    }
    r.reason = reason->get<std::string>();
  }
  return r;
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
  GH_ASSIGN_OR_RETURN(q.all_branches, ParseAllBranches(url));
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
