#include "http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

namespace gatehouse::testing {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;

template <class Stream>
HttpResponse Exchange(Stream& stream, const std::string& method, const std::string& target,
                      const std::string& body, const std::string& bearer) {
  HttpResponse out;
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, "127.0.0.1");
  if (!bearer.empty()) req.set(http::field::authorization, "Bearer " + bearer);
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(stream, buffer, res);
  out.status = static_cast<int>(res.result_int());
  out.body = res.body();
  return out;
}

net::ip::tcp::endpoint Loopback(int port) {
  return {net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)};
}

}  // namespace

HttpResponse HttpRequest(int port, const std::string& method, const std::string& target,
                         const std::string& body, const std::string& bearer) {
  HttpResponse out;
  try {
    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::seconds(30));
    stream.connect(Loopback(port));
    out = Exchange(stream, method, target, body, bearer);
    beast::error_code ec;
    stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

HttpResponse HttpsRequest(int port, const std::string& ca_file, const std::string& method,
                          const std::string& target, const std::string& body,
                          const std::string& bearer) {
  HttpResponse out;
  try {
    net::io_context ioc;
    ssl::context ctx(ssl::context::tls_client);
    ctx.load_verify_file(ca_file);
    ctx.set_verify_mode(ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> stream(ioc, ctx);
    // The test certificate is for IP 127.0.0.1.
    stream.set_verify_callback(ssl::host_name_verification("127.0.0.1"));
    beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(30));
    beast::get_lowest_layer(stream).connect(Loopback(port));
    stream.handshake(ssl::stream_base::client);
    out = Exchange(stream, method, target, body, bearer);
    beast::error_code ec;
    beast::get_lowest_layer(stream).socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

}  // namespace gatehouse::testing
