// HTTP/1.1 server (Boost.Beast). The only translation unit of the controller that includes
// Beast; routing lives in rest_api.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "controller/http_types.h"

namespace gatehouse::controller {

/// Listens on one address, parses requests and hands them to a handler on a worker pool, so a
/// slow request (a git fetch) does not stall other connections. A body over `body_limit` is
/// answered 413, a malformed request 400; both close that connection, never the server.
/// Keep-alive is supported.
///
/// Threading: one network thread plus `handler_threads` read workers and
/// `write_handler_threads` write workers; the handler must be
/// thread-safe and should not throw (exceptions are caught and answered 500).
class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  struct Options {
    std::string address = "127.0.0.1";
    uint16_t port = 0;                // 0: an ephemeral port; see port()
    size_t body_limit = 1024 * 1024;  // bytes
    int handler_threads = 4;        // GET/HEAD
    int write_handler_threads = 4;  // POST and the rest (submits may wait on git and hashing)
    /// PEM files; both set: HTTPS only (TLS 1.2+), both empty: plain HTTP.
    std::string tls_cert_file;
    std::string tls_key_file;
  };

  /// Binds and starts serving. Errors: UNAVAILABLE naming the address when it cannot bind,
  /// INVALID_ARGUMENT for a malformed address or unusable TLS certificate/key, NOT_FOUND for a
  /// missing TLS file.
  static Result<std::unique_ptr<HttpServer>> Start(const Options& options, Handler handler);

  ~HttpServer();  // Stop()s.
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// The bound port.
  uint16_t port() const;

  /// Stops accepting and serving, and joins the threads. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gatehouse::controller
