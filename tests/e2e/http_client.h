// A minimal blocking HTTP/1.1 client for tests (Boost.Beast), 127.0.0.1 only.
#pragma once

#include <chrono>
#include <string>

namespace gatehouse::testing {

struct HttpResponse {
  int status = 0;          // 0 when the request could not be sent
  std::string body;
  std::string error;       // transport error, if any
};

/// Sends one request (`method` "GET"/"POST"/...) to 127.0.0.1:`port` and reads the whole
/// response; `bearer`, when set, goes in "Authorization: Bearer <bearer>". Never throws; a
/// transport failure leaves status 0 and sets error. Timeout 30 s.
HttpResponse HttpRequest(int port, const std::string& method, const std::string& target,
                         const std::string& body = "", const std::string& bearer = "");

/// POST /api/v1/cells of `body` as the CLI posts it (cli/submit.h): the same body again, each
/// Retry-After, while the controller answers 202 "resolving" (still digesting the checkpoint or
/// reference: docs/protocols.md §1); the first other answer. Still resolving after `timeout`:
/// status 0 and error set.
HttpResponse SubmitCell(int port, const std::string& body, const std::string& bearer = "",
                        std::chrono::seconds timeout = std::chrono::seconds(600));

/// The same over TLS, verifying the server's certificate against the PEM `ca_file` and the
/// name 127.0.0.1. A failed handshake (wrong CA, plain HTTP server) leaves status 0 and error.
HttpResponse HttpsRequest(int port, const std::string& ca_file, const std::string& method,
                          const std::string& target, const std::string& body = "",
                          const std::string& bearer = "");

}  // namespace gatehouse::testing
