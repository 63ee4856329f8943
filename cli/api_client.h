// ApiClient: the controller's REST API (docs/protocols.md §1) as the `gatehouse` CLI calls it,
// over HTTP or HTTPS, one blocking request at a time (Boost.Beast).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace gatehouse::cli {

/// Where the controller listens: "http://host:port" or "https://host:port" (a path after the
/// authority is refused: the API lives at /api/v1).
struct ControllerUrl {
  bool tls = false;
  std::string host;
  int port = 0;
};

/// Parses a controller URL; the port defaults to 80 / 443. Errors: INVALID_ARGUMENT naming the
/// URL (not http or https, no host, a bad port, a path).
Result<ControllerUrl> ParseControllerUrl(std::string_view url);

/// `value` percent-encoded for a query string (unreserved characters pass through).
std::string EncodeQueryValue(std::string_view value);

/// One HTTP response: status code and body.
struct ApiResponse {
  int status = 0;
  std::string body;
};

/// Sends requests with "Authorization: Bearer <token>" (when a token is set). Stateless between
/// calls (one connection per request); thread-compatible.
class ApiClient {
 public:
  /// `ca_file`: PEM file of the CA that signs the controller's certificate; empty uses the
  /// system's trust store. Ignored for http.
  ApiClient(ControllerUrl url, std::string token, std::string ca_file = {},
            std::chrono::seconds timeout = std::chrono::seconds(60))
      : url_(std::move(url)), token_(std::move(token)), ca_file_(std::move(ca_file)),
        timeout_(timeout) {}

  /// `method` "GET" / "POST", `target` "/api/v1/...", `body` JSON (sent when not empty).
  /// Any HTTP status is a value; UNAVAILABLE names the controller when it cannot be reached or
  /// the exchange fails (connection refused, TLS handshake, timeout).
  Result<ApiResponse> Call(std::string_view method, std::string_view target,
                           std::string_view body = {}) const;

  /// GET `target` and hand a 2xx answer's body to `sink` in pieces as it arrives (at most
  /// 1 MiB each, in order; no size limit, nothing held in memory): an artifact can be larger
  /// than memory should hold. The timeout bounds each piece's wait, not the whole transfer. The returned body is empty for a 2xx answer and the error text
  /// (at most 1 MiB) for any other. A sink error stops the transfer and is returned.
  /// UNAVAILABLE as Call.
  Result<ApiResponse> Fetch(std::string_view target,
                            const std::function<Status(std::string_view)>& sink) const;

  /// "http://host:port", for messages.
  std::string Describe() const;

 private:
  /// Connects (TLS when the URL says https), runs `exchange(stream)` and closes; UNAVAILABLE
  /// naming the controller when any step fails.
  template <class Exchanging>
  Result<ApiResponse> Connected(Exchanging&& exchange) const;

  ControllerUrl url_;
  std::string token_;
  std::string ca_file_;
  std::chrono::seconds timeout_;
};

}  // namespace gatehouse::cli
