// The tests' HTTP client is the CLI's (cli/api_client.h), pointed at 127.0.0.1.
#include "http_client.h"

#include <sstream>

#include "cli/api_client.h"
#include "cli/submit.h"

namespace gatehouse::testing {
namespace {

HttpResponse ResponseOf(const Result<cli::ApiResponse>& r) {
  HttpResponse out;
  if (!r.ok()) {
    out.error = r.status().message();
    return out;
  }
  out.status = r->status;
  out.body = r->body;
  return out;
}

HttpResponse Send(const cli::ApiClient& api, const std::string& method, const std::string& target,
                  const std::string& body) {
  return ResponseOf(api.Call(method, target, body));
}

}  // namespace

HttpResponse HttpRequest(int port, const std::string& method, const std::string& target,
                         const std::string& body, const std::string& bearer) {
  return Send(cli::ApiClient(cli::ControllerUrl{false, "127.0.0.1", port}, bearer, {},
                             std::chrono::seconds(30)),
              method, target, body);
}

HttpResponse SubmitCell(int port, const std::string& body, const std::string& bearer,
                        std::chrono::seconds timeout) {
  const cli::ApiClient api(cli::ControllerUrl{false, "127.0.0.1", port}, bearer, {},
                           std::chrono::seconds(30));
  cli::PostCellOptions post;
  post.post = [&api, &body] { return api.Call("POST", "/api/v1/cells", body); };
  post.deadline = std::chrono::steady_clock::now() + timeout;
  std::ostringstream progress;  // the resolving reasons: not needed here
  return ResponseOf(cli::PostCell(post, progress));
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
