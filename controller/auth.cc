#include "controller/auth.h"

#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cctype>

#include "common/sha256.h"

namespace gatehouse::controller {
namespace {

constexpr auto kTouchInterval = std::chrono::minutes(1);
constexpr size_t kMaxNameLength = 100;
constexpr size_t kMaxTokenLength = 256;

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string JoinScopes(const std::vector<Scope>& scopes) {
  std::string out;
  for (Scope s : scopes) {
    if (!out.empty()) out += ",";
    out += ScopeName(s);
  }
  return out;
}

}  // namespace

std::string_view ScopeName(Scope scope) {
  switch (scope) {
    case Scope::kRead:
      return "read";
    case Scope::kSubmit:
      return "submit";
    case Scope::kAdmin:
      return "admin";
  }
  return "?";
}

Result<Scope> ParseScope(std::string_view name) {
  for (Scope s : {Scope::kRead, Scope::kSubmit, Scope::kAdmin}) {
    if (name == ScopeName(s)) return s;
  }
  return Status::InvalidArgument("scope '" + std::string(name) +
                                 "': expected read, submit or admin");
}

std::string_view TokenKindName(TokenKind kind) {
  return kind == TokenKind::kAgent ? "agent" : "api";
}

Result<TokenKind> ParseTokenKind(std::string_view name) {
  if (name == "api") return TokenKind::kApi;
  if (name == "agent") return TokenKind::kAgent;
  return Status::InvalidArgument("token kind '" + std::string(name) + "': expected api or agent");
}

bool Principal::Has(Scope scope) const {
  return std::any_of(scopes.begin(), scopes.end(),
                     [scope](Scope s) { return s == scope || s == Scope::kAdmin; });
}

std::vector<Scope> ScopesOf(const TokenRecord& token) {
  std::vector<Scope> out;
  size_t start = 0;
  while (start <= token.scopes.size()) {
    size_t end = token.scopes.find(',', start);
    if (end == std::string::npos) end = token.scopes.size();
    if (auto s = ParseScope(std::string_view(token.scopes).substr(start, end - start)); s.ok()) {
      out.push_back(*s);
    }
    start = end + 1;
  }
  return out;
}

Result<std::string> NewTokenSecret(TokenKind kind) {
  std::array<unsigned char, 32> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return Status::Internal("RAND_bytes failed: no token issued");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string secret = kind == TokenKind::kAgent ? "ghagent_" : "ghapi_";
  for (unsigned char b : bytes) {
    secret += kHex[b >> 4];
    secret += kHex[b & 15];
  }
  return secret;
}

Authenticator::Authenticator(Store& store, AuthConfig config)
    : store_(store), config_(config) {}

Result<TokenRecord> Authenticator::Lookup(std::string_view authorization) {
  // "Bearer <token>": the scheme is case-insensitive (RFC 6750 §2.1, RFC 9110 §11.1).
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() + 1 ||
      !EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme) ||
      authorization[kScheme.size()] != ' ') {
    return Status::Unauthenticated("expected an 'Authorization: Bearer <token>' header");
  }
  std::string_view token = authorization.substr(kScheme.size() + 1);
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  if (token.empty() || token.size() > kMaxTokenLength) {
    return Status::Unauthenticated("malformed bearer token");
  }
  auto found = store_.FindToken(Sha256Hex(token));
  if (!found.ok()) return found.status();
  if (!found->has_value()) return Status::Unauthenticated("unknown token");
  if (!(*found)->revoked_at.empty()) {
    return Status::Unauthenticated("token '" + (*found)->name + "' was revoked at " +
                                   (*found)->revoked_at);
  }
  NoteUse((*found)->id);
  return std::move(**found);
}

void Authenticator::NoteUse(int64_t token_id) {
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(touched_mu_);
    auto [it, inserted] = touched_.try_emplace(token_id, now);
    if (!inserted) {
      if (now - it->second < kTouchInterval) return;
      it->second = now;
    }
  }
  (void)store_.TouchToken(token_id);  // best effort: a failed touch must not fail the call
}

Result<Principal> Authenticator::AuthorizeApi(std::string_view authorization, Scope needed,
                                              bool read_only) {
  if (!config_.required) {
    return Principal{0, "anonymous", TokenKind::kApi, {Scope::kAdmin}};
  }
  if (authorization.empty() && config_.anonymous_read && read_only && needed == Scope::kRead) {
    return Principal{0, "anonymous", TokenKind::kApi, {Scope::kRead}};
  }
  if (authorization.empty()) {
    return Status::Unauthenticated("this route needs a bearer token with scope '" +
                                   std::string(ScopeName(needed)) + "'");
  }
  auto token = Lookup(authorization);
  if (!token.ok()) return token.status();
  if (token->kind != "api") {
    return Status::PermissionDenied("token '" + token->name +
                                    "' is an agent token; agent tokens cannot call the REST API");
  }
  Principal p{token->id, token->name, TokenKind::kApi, ScopesOf(*token)};
  if (!p.Has(needed)) {
    return Status::PermissionDenied("token '" + token->name + "' lacks scope '" +
                                    std::string(ScopeName(needed)) + "' (it has '" +
                                    token->scopes + "')");
  }
  return p;
}

Result<Principal> Authenticator::AuthorizeAgent(std::string_view authorization) {
  if (!config_.required) return Principal{0, "anonymous", TokenKind::kAgent, {}};
  if (authorization.empty()) {
    return Status::Unauthenticated("the agent stream needs 'authorization: Bearer <agent token>'");
  }
  auto token = Lookup(authorization);
  if (!token.ok()) return token.status();
  if (token->kind != "agent") {
    return Status::PermissionDenied("token '" + token->name +
                                    "' is an API token; the agent stream needs an agent token");
  }
  return Principal{token->id, token->name, TokenKind::kAgent, {}};
}

Result<IssuedToken> Authenticator::Issue(const std::string& name, TokenKind kind,
                                         std::vector<Scope> scopes) {
  if (!ValidName(name)) {
    return Status::InvalidArgument("field 'name': expected 1 to 100 characters of "
                                   "[A-Za-z0-9._-], got '" + name.substr(0, 120) + "'");
  }
  if (kind == TokenKind::kApi && scopes.empty()) {
    return Status::InvalidArgument("field 'scopes': an api token needs at least one scope");
  }
  if (kind == TokenKind::kAgent && !scopes.empty()) {
    return Status::InvalidArgument("field 'scopes': agent tokens have no scopes");
  }
  std::sort(scopes.begin(), scopes.end());
  scopes.erase(std::unique(scopes.begin(), scopes.end()), scopes.end());
  auto secret = NewTokenSecret(kind);
  if (!secret.ok()) return secret.status();
  TokenRecord record;
  record.name = name;
  record.kind = std::string(TokenKindName(kind));
  record.scopes = JoinScopes(scopes);
  auto stored = store_.CreateToken(record, Sha256Hex(*secret));
  if (!stored.ok()) return stored.status();
  return IssuedToken{std::move(*stored), std::move(*secret)};
}

}  // namespace gatehouse::controller
