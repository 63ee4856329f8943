#include "webhook_receiver.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cctype>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace gatehouse::testing {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

WebhookReceiver::WebhookReceiver(int fail_first)
    : fail_first_(fail_first),
      acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
  port_ = acceptor_.local_endpoint().port();
  thread_ = std::thread([this] { Serve(); });
}

WebhookReceiver::~WebhookReceiver() {
  stopping_ = true;
  beast::error_code ec;
  // Wake the blocking accept with a connection of our own.
  tcp::socket poke(io_);
  poke.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_), ec);
  thread_.join();
}

std::vector<WebhookReceiver::Delivery> WebhookReceiver::deliveries() {
  std::lock_guard lock(mu_);
  return deliveries_;
}

void WebhookReceiver::Serve() {
  while (!stopping_) {
    beast::error_code ec;
    tcp::socket socket(io_);
    acceptor_.accept(socket, ec);
    if (ec || stopping_) continue;
    beast::flat_buffer buffer;
    http::request<http::string_body> request;
    http::read(socket, buffer, request, ec);
    if (ec) continue;
    Delivery d;
    for (const auto& field : request) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      d.headers[name] = std::string(field.value());
    }
    d.body = request.body();
    {
      std::lock_guard lock(mu_);
      d.answered = static_cast<int>(deliveries_.size()) < fail_first_ ? 503 : 200;
      deliveries_.push_back(d);
    }
    http::response<http::string_body> response{static_cast<http::status>(d.answered), 11};
    response.body() = "{}";
    response.prepare_payload();
    http::write(socket, response, ec);
    socket.shutdown(tcp::socket::shutdown_both, ec);
  }
}

std::string HmacSha256Header(const std::string& secret, const std::string& body) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(body.data()), body.size(), mac, &n);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256=";
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kHex[mac[i] >> 4]);
    out.push_back(kHex[mac[i] & 0xf]);
  }
  return out;
}

}  // namespace gatehouse::testing
