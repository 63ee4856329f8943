#include "http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace gatehouse::testing {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;

HttpResponse HttpRequest(int port, const std::string& method, const std::string& target,
                         const std::string& body) {
  HttpResponse out;
  try {
    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::seconds(30));
    stream.connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"),
                                          static_cast<unsigned short>(port)));
    http::request<http::string_body> req{http::string_to_verb(method), target, 11};
    req.set(http::field::host, "127.0.0.1");
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
    beast::error_code ec;
    stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

}  // namespace gatehouse::testing
