// The tests' HTTP client is the CLI's (cli/api_client.h), pointed at 127.0.0.1.
#include "http_client.h"

#include "cli/api_client.h"

namespace gatehouse::testing {
namespace {

HttpResponse Send(const cli::ApiClient& api, const std::string& method, const std::string& target,
                  const std::string& body) {
  HttpResponse out;
  auto r = api.Call(method, target, body);
  if (!r.ok()) {
    out.error = r.status().message();
    return out;
  }
  out.status = r->status;
  out.body = r->body;
  return out;
}

}  // namespace

HttpResponse HttpRequest(int port, const std::string& method, const std::string& target,
                         const std::string& body, const std::string& bearer) {
  return Send(cli::ApiClient(cli::ControllerUrl{false, "127.0.0.1", port}, bearer, {},
                             std::chrono::seconds(30)),
              method, target, body);
}

HttpResponse HttpsRequest(int port, const std::string& ca_file, const std::string& method,
                          const std::string& target, const std::string& body,
                          const std::string& bearer) {
  // The test certificate is for IP 127.0.0.1, which the client verifies.
  return Send(cli::ApiClient(cli::ControllerUrl{true, "127.0.0.1", port}, bearer, ca_file,
                             std::chrono::seconds(30)),
              method, target, body);
}

}  // namespace gatehouse::testing
