// A webhook receiver on 127.0.0.1 for end-to-end tests: records every POST the controller makes
// (headers, body) and answers from a script, so a test can check signed deliveries and retries
// (docs/protocols.md §8). Independent of the controller's code: Boost.Beast and OpenSSL only.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace gatehouse::testing {

class WebhookReceiver {
 public:
  struct Delivery {
    std::map<std::string, std::string> headers;  // names lower-case
    std::string body;
    int answered = 0;  // the status this receiver answered
  };

  /// Listens on an ephemeral port of 127.0.0.1; the first `fail_first` requests are answered
  /// 503, the rest 200.
  explicit WebhookReceiver(int fail_first = 0);
  ~WebhookReceiver();  // stops and joins
  WebhookReceiver(const WebhookReceiver&) = delete;
  WebhookReceiver& operator=(const WebhookReceiver&) = delete;

  int port() const { return port_; }
  std::vector<Delivery> deliveries();

 private:
  void Serve();

  const int fail_first_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::vector<Delivery> deliveries_;
  std::thread thread_;
};

/// "sha256=" + hex HMAC-SHA256(secret, body), computed here with OpenSSL.
std::string HmacSha256Header(const std::string& secret, const std::string& body);

}  // namespace gatehouse::testing
