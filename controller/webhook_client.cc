#include "controller/webhook_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include <openssl/ssl.h>

namespace gatehouse::controller {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct Target {
  bool tls = false;
  std::string host;
  std::string port;
  std::string path;  // origin form: "/path?query"
};

Result<Target> ParseTarget(const std::string& url) {
  auto parsed = boost::urls::parse_uri(url);
  if (!parsed) {
    return Status::InvalidArgument("webhook URL '" + url + "': " + parsed.error().message());
  }
  const boost::urls::url_view u = *parsed;
  Target t;
  const std::string scheme(u.scheme());
  if (scheme != "http" && scheme != "https") {
    return Status::InvalidArgument("webhook URL '" + url + "': scheme must be http or https");
  }
  t.tls = scheme == "https";
  t.host = std::string(u.host());
  if (t.host.empty()) return Status::InvalidArgument("webhook URL '" + url + "': no host");
  t.port = u.has_port() ? std::string(u.port()) : (t.tls ? "443" : "80");
  t.path = std::string(u.encoded_path());
  if (t.path.empty()) t.path = "/";
  if (u.has_query()) t.path += "?" + std::string(u.encoded_query());
  return t;
}

Status Failed(const std::string& what, const beast::error_code& ec) {
  if (ec == beast::error::timeout) return Status::DeadlineExceeded(what + ": timed out");
  return Status::Unavailable(what + ": " + ec.message());
}

/// Runs one asynchronous operation to completion on `io` (the stream's deadline bounds it:
/// Beast applies tcp_stream timeouts to asynchronous operations only).
template <class Start>
beast::error_code Await(asio::io_context& io, Start start) {
  beast::error_code result = asio::error::would_block;
  start([&result](beast::error_code ec, auto&&...) { result = ec; });
  io.restart();
  io.run();
  return result;
}

/// Sends `request` on a connected stream and reads the answer's status.
template <class Stream>
Result<int> Exchange(asio::io_context& io, Stream& stream,
                     http::request<http::string_body>& request, const std::string& where) {
  beast::error_code ec =
      Await(io, [&](auto done) { http::async_write(stream, request, std::move(done)); });
  if (ec) return Failed("POST " + where, ec);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 * 1024);  // the body is not used; a long one is not read
  ec = Await(io, [&](auto done) { http::async_read(stream, buffer, parser, std::move(done)); });
  if (ec && ec != http::error::body_limit) return Failed("answer from " + where, ec);
  return static_cast<int>(parser.get().result_int());
}

Result<int> Post(const WebhookRequest& r, const std::string& ca_file) {
  GH_ASSIGN_OR_RETURN(Target t, ParseTarget(r.url));
  const std::string where = t.host + ":" + t.port;
  asio::io_context io;
  beast::error_code ec;
  tcp::resolver resolver(io);
  const auto endpoints = resolver.resolve(t.host, t.port, ec);
  if (ec) return Failed("resolve " + where, ec);

  http::request<http::string_body> request{http::verb::post, t.path, 11};
  request.set(http::field::host, t.host);
  for (const auto& [name, value] : r.headers) request.set(name, value);
  request.body() = r.body;
  request.prepare_payload();

  if (!t.tls) {
    beast::tcp_stream stream(io);
    stream.expires_after(r.timeout);  // one deadline for connect, send and answer
    ec = Await(io, [&](auto done) { stream.async_connect(endpoints, std::move(done)); });
    if (ec) return Failed("connect " + where, ec);
    auto status = Exchange(io, stream, request, where);
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    return status;
  }
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  if (ca_file.empty()) {
    ctx.set_default_verify_paths(ec);
  } else {
    ctx.load_verify_file(ca_file, ec);
  }
  if (ec) return Status::FailedPrecondition("webhook CA certificates: " + ec.message());
  ctx.set_verify_mode(asio::ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream(io, ctx);
  stream.set_verify_callback(asio::ssl::host_name_verification(t.host));
  if (!SSL_set_tlsext_host_name(stream.native_handle(), t.host.c_str())) {
    return Status::Internal("TLS server name " + t.host);
  }
  beast::get_lowest_layer(stream).expires_after(r.timeout);
  ec = Await(io, [&](auto done) {
    beast::get_lowest_layer(stream).async_connect(endpoints, std::move(done));
  });
  if (ec) return Failed("connect " + where, ec);
  ec = Await(io, [&](auto done) {
    stream.async_handshake(asio::ssl::stream_base::client, std::move(done));
  });
  if (ec) return Failed("TLS handshake with " + where, ec);
  auto status = Exchange(io, stream, request, where);
  // No TLS close_notify exchange: the status is read, and a receiver may just close.
  beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_both, ec);
  return status;
}

}  // namespace

WebhookPoster MakeHttpWebhookPoster(std::string ca_file) {
  return [ca_file = std::move(ca_file)](const WebhookRequest& r) { return Post(r, ca_file); };
}

}  // namespace gatehouse::controller
