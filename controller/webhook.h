// Webhooks on cell end (docs/protocols.md §8): every attempt that ends has a delivery row in the
// store's outbox (migrations/0008_webhooks.sql); WebhookSender posts due rows, signed, and
// records each try with its backoff. The HTTP client is injected (WebhookPoster), so this layer
// knows no transport.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "controller/clock.h"
#include "controller/records.h"

namespace gatehouse::controller {

class Store;

/// Where and how cell ends are posted (gatehouse-controller --webhook-*).
struct WebhookConfig {
  std::string url;     // http:// or https://; empty: no webhook (deliveries recorded skipped)
  std::string secret;  // HMAC-SHA256 key of the signature header; empty: no signature
  int max_tries = 8;   // POSTs per delivery before it is recorded failed
  std::chrono::milliseconds first_backoff{2000};  // wait after the first failed try
  std::chrono::milliseconds max_backoff{600000};  // the wait doubles per try up to this
  std::chrono::milliseconds timeout{10000};       // connect + send + answer, per try
};

/// One POST for the poster to make.
struct WebhookRequest {
  std::string url;
  std::string body;  // JSON
  std::vector<std::pair<std::string, std::string>> headers;
  std::chrono::milliseconds timeout{10000};
};

/// Makes the POST. Returns the HTTP status the receiver answered (any status), or an error
/// (UNAVAILABLE, DEADLINE_EXCEEDED, INVALID_ARGUMENT for a bad URL) when none answered.
using WebhookPoster = std::function<Result<int>(const WebhookRequest&)>;

/// "sha256=" + lowercase hex HMAC-SHA256(secret, body): the X-Gatehouse-Signature-256 header
/// (the form GitHub's X-Hub-Signature-256 uses, so receivers' verifiers apply unchanged).
std::string WebhookSignature(std::string_view secret, std::string_view body);

/// `url` without what may carry a credential, for logs: userinfo ("user:pass@") and the query
/// and fragment are replaced by "***".
std::string RedactedUrl(std::string_view url);

/// The wait before try `tries_made + 1` after `tries_made` failed tries (>= 1):
/// first_backoff * 2^(tries_made - 1), capped at max_backoff.
std::chrono::milliseconds WebhookBackoff(const WebhookConfig& config, int tries_made);

/// Posts the store's due webhook deliveries. Not thread-safe: one thread runs it
/// (ControllerCore's webhook loop).
class WebhookSender {
 public:
  WebhookSender(Store& store, WebhookConfig config, WebhookPoster post, Clock clock);

  /// Tries every delivery due now, oldest first, once each; returns how many it handled.
  /// A 2xx answer delivers; any other answer or none (or a body the store cannot give) is a
  /// failed try, retried after WebhookBackoff until max_tries. Without a URL, or for a lost attempt that was retried
  /// (its cell goes on), the delivery is recorded skipped with why. Store errors are logged.
  int RunOnce();

  /// The JSON body of `d` (protocols.md §8), built from the store. Errors: the store's.
  Result<std::string> Payload(const WebhookDelivery& d);

  /// Makes a RunOnce in progress return after its current POST (call before stopping the
  /// thread that runs it, so shutdown waits for one timeout at most). Thread-safe.
  void RequestStop() { stopping_.store(true); }

 private:
  Store& store_;
  const WebhookConfig config_;
  const WebhookPoster post_;
  const Clock clock_;
  std::atomic<bool> stopping_{false};
};

}  // namespace gatehouse::controller
