#include "cli/api_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/url/encode.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/rfc/unreserved_chars.hpp>

namespace gatehouse::cli {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;

template <class Stream>
void WriteRequest(Stream& stream, const std::string& host, std::string_view method,
                  std::string_view target, std::string_view body, const std::string& token) {
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, host);
  req.set(http::field::user_agent, "gatehouse-cli");
  if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = std::string(body);
  }
  req.prepare_payload();
  http::write(stream, req);
}

template <class Stream>
ApiResponse Exchange(Stream& stream, const std::string& host, std::string_view method,
                     std::string_view target, std::string_view body, const std::string& token) {
  WriteRequest(stream, host, method, target, body, token);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(256u << 20);  // logs and reports can be large; not unbounded
  http::read(stream, buffer, parser);
  return ApiResponse{static_cast<int>(parser.get().result_int()), parser.get().body()};
}

/// GET with the body read piece by piece (Beast's buffer_body): a 2xx body goes to `sink`,
/// any other is kept (up to 1 MiB) as the error text.
template <class Stream>
Result<ApiResponse> StreamExchange(Stream& stream, const std::string& host,
                                   std::string_view target, const std::string& token,
                                   std::chrono::seconds idle,
                                   const std::function<Status(std::string_view)>& sink) {
  WriteRequest(stream, host, "GET", target, {}, token);
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);
  http::read_header(stream, buffer, parser);
  ApiResponse r{static_cast<int>(parser.get().result_int()), ""};
  const bool ok = r.status >= 200 && r.status < 300;
  std::string piece(size_t{1} << 20, '\0');
  while (!parser.is_done()) {
    parser.get().body().data = piece.data();
    parser.get().body().size = piece.size();
    beast::get_lowest_layer(stream).expires_after(idle);  // bounds silence, not the transfer
    beast::error_code ec;
    http::read(stream, buffer, parser, ec);
    if (ec && ec != http::error::need_buffer) throw boost::system::system_error(ec);
    const std::string_view got(piece.data(), piece.size() - parser.get().body().size);
    if (ok) {
      GH_RETURN_IF_ERROR(sink(got));
    } else if (r.body.size() < piece.size()) {
      r.body.append(got.substr(0, piece.size() - r.body.size()));
    }
  }
  return r;
}

}  // namespace

Result<ControllerUrl> ParseControllerUrl(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("controller URL '" + std::string(text) + "': " +
                                   std::string(why));
  };
  auto parsed = boost::urls::parse_uri(text);
  if (!parsed) return bad("expected http://host:port or https://host:port");
  ControllerUrl url;
  const std::string scheme(parsed->scheme());
  if (scheme != "http" && scheme != "https") return bad("the scheme must be http or https");
  url.tls = scheme == "https";
  url.host = std::string(parsed->host_address());
  if (url.host.empty()) return bad("no host");
  if (parsed->has_port()) {
    const std::string port(parsed->port());
    if (port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
        std::stoi(port) > 65535) {
      return bad("the port must be 1..65535");
    }
    url.port = std::stoi(port);
  } else {
    url.port = url.tls ? 443 : 80;
  }
  if (!parsed->encoded_path().empty() && parsed->encoded_path() != "/") {
    return bad("no path expected (the API is at /api/v1)");
  }
  return url;
}

std::string EncodeQueryValue(std::string_view value) {
  return boost::urls::encode(value, boost::urls::unreserved_chars);
}

std::string ApiClient::Describe() const {
  return (url_.tls ? "https://" : "http://") + url_.host + ":" + std::to_string(url_.port);
}

Result<ApiResponse> ApiClient::Call(std::string_view method, std::string_view target,
                                    std::string_view body) const {
  return Connected([&](auto& stream) -> Result<ApiResponse> {
    return Exchange(stream, url_.host, method, target, body, token_);
  });
}

Result<ApiResponse> ApiClient::Fetch(std::string_view target,
                                     const std::function<Status(std::string_view)>& sink) const {
  return Connected([&](auto& stream) {
    return StreamExchange(stream, url_.host, target, token_, timeout_, sink);
  });
}

template <class Exchanging>
Result<ApiResponse> ApiClient::Connected(Exchanging&& exchange) const {
  try {
    net::io_context ioc;
    net::ip::tcp::resolver resolver(ioc);
    const auto endpoints = resolver.resolve(url_.host, std::to_string(url_.port));
    if (!url_.tls) {
      beast::tcp_stream stream(ioc);
      stream.expires_after(timeout_);
      stream.connect(endpoints);
      Result<ApiResponse> r = exchange(stream);
      beast::error_code ec;
      stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
      return r;
    }
    ssl::context ctx(ssl::context::tls_client);
    if (ca_file_.empty()) {
      ctx.set_default_verify_paths();
    } else {
      ctx.load_verify_file(ca_file_);
    }
    ctx.set_verify_mode(ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> stream(ioc, ctx);
    stream.set_verify_callback(ssl::host_name_verification(url_.host));
    if (!SSL_set_tlsext_host_name(stream.native_handle(), url_.host.c_str())) {
      return Status::Unavailable("controller " + Describe() + ": cannot set the TLS server name");
    }
    beast::get_lowest_layer(stream).expires_after(timeout_);
    beast::get_lowest_layer(stream).connect(endpoints);
    stream.handshake(ssl::stream_base::client);
    Result<ApiResponse> r = exchange(stream);
    beast::error_code ec;
    beast::get_lowest_layer(stream).socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
    return r;
  } catch (const boost::system::system_error& e) {
    // code().message() alone: what() appends Boost's source location, noise to a CI log.
    return Status::Unavailable("controller " + Describe() + ": " + e.code().message());
  } catch (const std::exception& e) {
    return Status::Unavailable("controller " + Describe() + ": " + e.what());
  }
}

}  // namespace gatehouse::cli
