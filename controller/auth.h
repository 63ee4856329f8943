// Bearer tokens: who may call the REST API (scopes read, submit, admin) and who may open the
// agent stream (agent tokens). Tokens are stored hashed (SHA-256; migrations/0003_tokens.sql);
// the secret is shown once, when it is issued. Knows no HTTP and no gRPC: transports pass the
// Authorization header's value and map the Status (REST 401/403, gRPC UNAUTHENTICATED /
// PERMISSION_DENIED).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "controller/records.h"
#include "controller/store/store.h"

namespace gatehouse::controller {

/// What an API token allows. admin allows everything; read and submit are independent (a CI
/// token usually has both).
enum class Scope { kRead, kSubmit, kAdmin };

/// "read" | "submit" | "admin".
std::string_view ScopeName(Scope scope);
/// INVALID_ARGUMENT naming the value for anything but the three names.
Result<Scope> ParseScope(std::string_view name);

/// api tokens call the REST API; agent tokens only open the agent stream.
enum class TokenKind { kApi, kAgent };
std::string_view TokenKindName(TokenKind kind);  // "api" | "agent"
Result<TokenKind> ParseTokenKind(std::string_view name);

/// How requests are authenticated (controller flags --auth, --anonymous-read).
struct AuthConfig {
  /// false (--auth none): no token is asked for; every caller may do everything. Only for a
  /// controller whose listeners are all on loopback (main.cc refuses otherwise).
  bool required = true;
  /// true: GET/HEAD requests without an Authorization header are allowed the read scope (a
  /// dashboard on a trusted network). A header that is present must still be valid.
  bool anonymous_read = false;
};

/// Who made a request.
struct Principal {
  int64_t token_id = 0;  // 0: no token (anonymous, or auth off)
  std::string name;      // the token's name; "anonymous" without a token
  TokenKind kind = TokenKind::kApi;
  std::vector<Scope> scopes;

  /// True when the principal holds `scope` or admin.
  bool Has(Scope scope) const;
};

/// A newly issued token: its stored row and the secret, which is not stored anywhere.
struct IssuedToken {
  TokenRecord record;
  std::string secret;  // "ghapi_<64 hex>" or "ghagent_<64 hex>"
};

/// Checks bearer tokens against the store.
///
/// Threading: thread-safe. Each check is one indexed SQLite lookup; last_used_at is written at
/// most once a minute per token, so reads do not turn into writes.
class Authenticator {
 public:
  Authenticator(Store& store, AuthConfig config);

  /// For a REST call that needs `needed`: `authorization` is the Authorization header's value
  /// ("" when absent). `read_only` marks GET/HEAD (for anonymous_read). Errors:
  /// UNAUTHENTICATED (no, malformed, unknown or revoked token), PERMISSION_DENIED (an agent
  /// token, or a token without the scope; the message names the scope).
  Result<Principal> AuthorizeApi(std::string_view authorization, Scope needed, bool read_only);

  /// For the agent stream: UNAUTHENTICATED as above, PERMISSION_DENIED for an api token.
  Result<Principal> AuthorizeAgent(std::string_view authorization);

  /// Issues a token. Errors: INVALID_ARGUMENT (name not 1..100 of [A-Za-z0-9._-]; api token
  /// without scopes; agent token with scopes), ALREADY_EXISTS (an active token has the name).
  Result<IssuedToken> Issue(const std::string& name, TokenKind kind, std::vector<Scope> scopes);

  /// All tokens (no secrets), by id.
  Result<std::vector<TokenRecord>> ListTokens() { return store_.ListTokens(); }
  /// Revokes a token at once (its next call is UNAUTHENTICATED); NOT_FOUND when absent.
  /// Revoking twice keeps the first revoked_at.
  Result<TokenRecord> Revoke(int64_t token_id) { return store_.RevokeToken(token_id); }

 private:
  Result<TokenRecord> Lookup(std::string_view authorization);
  void NoteUse(int64_t token_id);

  Store& store_;
  AuthConfig config_;
  std::mutex touched_mu_;
  std::unordered_map<int64_t, std::chrono::steady_clock::time_point> touched_;
};

/// The scopes of a stored token ("read,submit"); unknown names are dropped.
std::vector<Scope> ScopesOf(const TokenRecord& token);

/// A fresh secret for `kind`: its prefix and 32 random bytes (OpenSSL RAND_bytes) in hex.
/// INTERNAL when the random generator fails.
Result<std::string> NewTokenSecret(TokenKind kind);

}  // namespace gatehouse::controller
