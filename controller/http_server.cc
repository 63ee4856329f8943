#include "controller/http_server.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "controller/http_gzip.h"

namespace gatehouse::controller {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr auto kReadTimeout = std::chrono::seconds(60);
constexpr auto kWriteTimeout = std::chrono::seconds(60);
constexpr auto kDrainTimeout = std::chrono::seconds(5);
constexpr size_t kHeaderLimit = 16 * 1024;
constexpr size_t kDrainLimit = 64 * 1024 * 1024;

std::string ErrorBody(const std::string& message) {
  return nlohmann::json{{"error", message}}.dump();
}

constexpr auto kHandshakeTimeout = std::chrono::seconds(30);

using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

/// One connection over a plain TCP stream or TLS (Stream: PlainStream | TlsStream). Network
/// I/O runs on the server's io_context (one thread); the handler runs on a worker pool and
/// posts the response back: GET/HEAD on the read pool, everything else on the write pool, so a
/// submit stuck in a slow git fetch never delays reads or /healthz.
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  template <class... StreamArgs>
  Session(asio::thread_pool& read_pool, asio::thread_pool& write_pool,
          const HttpServer::Handler& handler, size_t body_limit, StreamArgs&&... stream_args)
      : stream_(std::forward<StreamArgs>(stream_args)...),
        read_pool_(read_pool),
        write_pool_(write_pool),
        handler_(handler),
        body_limit_(body_limit) {}

  void Start() {
    asio::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (std::is_same_v<Stream, TlsStream>) {
        beast::get_lowest_layer(self->stream_).expires_after(kHandshakeTimeout);
        self->stream_.async_handshake(asio::ssl::stream_base::server,
                                      [self](beast::error_code ec) {
                                        if (ec) return self->Close();  // not TLS, bad cert, ...
                                        self->Read();
                                      });
      } else {
        self->Read();
      }
    });
  }

 private:
  auto& Lowest() { return beast::get_lowest_layer(stream_); }

  void Read() {
    parser_.emplace();
    parser_->body_limit(body_limit_);
    parser_->header_limit(kHeaderLimit);
    Lowest().expires_after(kReadTimeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof) return Close();
    if (ec == http::error::body_limit) {
      return Reply(413, ErrorBody("request body over " + std::to_string(body_limit_) + " bytes"),
                   /*keep_alive=*/false, 11);
    }
    if (ec == http::error::header_limit) {
      return Reply(431, ErrorBody("request header fields too large"), false, 11);
    }
    if (ec && ec.category() == beast::http::make_error_code(http::error::bad_target).category()) {
      return Reply(400, ErrorBody("malformed HTTP request: " + ec.message()), false, 11);
    }
    if (ec) return Close();  // timeout, reset: nothing to answer

    http::request<http::string_body> req = parser_->release();
    HttpRequest request;
    request.method = std::string(req.method_string());
    request.target = std::string(req.target());
    for (const auto& field : req) {
      std::string name(field.name_string());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      request.headers[name] = std::string(field.value());
    }
    request.body = std::move(req.body());
    const bool keep_alive = req.keep_alive();
    const unsigned version = req.version();
    const bool head = req.method() == http::verb::head;

    const bool read_only = req.method() == http::verb::get || head;
    asio::thread_pool& pool = read_only ? read_pool_ : write_pool_;
    asio::post(pool, [self = this->shared_from_this(), request = std::move(request), keep_alive, version,
                      head]() mutable {
      HttpResponse response;
      try {
        response = self->handler_(request);
      } catch (const std::exception& e) {
        response.status = 500;
        response.content_type = "application/json";
        response.body = ErrorBody(std::string("internal error: ") + e.what());
      } catch (...) {
        response.status = 500;
        response.content_type = "application/json";
        response.body = ErrorBody("internal error");
      }
      CompressIfAccepted(request, response);  // here, on the pool, not on the I/O thread
      asio::post(self->stream_.get_executor(),
                 [self, response = std::move(response), keep_alive, version, head]() mutable {
                   self->Write(std::move(response), keep_alive, version, head);
                 });
    });
  }

  // Answers a request that could not be read whole, then drains what the client still sends
  // before closing: closing with unread input would reset the connection and could destroy
  // the answer before the client reads it.
  void Reply(int status, std::string json_body, bool keep_alive, unsigned version) {
    HttpResponse r;
    r.status = status;
    r.body = std::move(json_body);
    drain_after_write_ = true;
    Write(std::move(r), keep_alive, version, false);
  }

  void Drain() {
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    Lowest().expires_after(kDrainTimeout);
    Lowest().async_read_some(asio::buffer(drain_buffer_),
                            [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ > kDrainLimit) return self->Close();
                              self->Drain();
                            });
  }

  void Write(HttpResponse response, bool keep_alive, unsigned version, bool head) {
    if (!response.file_path.empty() && !head) {
      auto res = std::make_shared<http::response<http::file_body>>(
          static_cast<http::status>(response.status), version);
      beast::error_code ec;
      res->body().open(response.file_path.c_str(), beast::file_mode::scan, ec);
      if (!ec) {
        res->set(http::field::server, "gatehouse-controller");
        res->set(http::field::content_type, response.content_type);
        for (const auto& [name, value] : response.headers) res->set(name, value);
        res->keep_alive(keep_alive);
        res->prepare_payload();
        // A large file: the write timeout plus a second per MiB (a reader slower than 1 MiB/s
        // is dropped).
        const auto size = res->body().size();
        Lowest().expires_after(kWriteTimeout + std::chrono::seconds(size >> 20));
        http::async_write(
            stream_, *res,
            [self = this->shared_from_this(), res, keep_alive](beast::error_code ec, size_t) {
              if (ec || !keep_alive) return self->Close();
              self->Read();
            });
        return;
      }
      response.status = 500;
      response.content_type = "application/json";
      response.body = R"({"error":"the file could not be opened"})";
    }
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(response.status), version);
    res->set(http::field::server, "gatehouse-controller");
    res->set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) res->set(name, value);
    res->keep_alive(keep_alive);
    res->body() = std::move(response.body);
    res->prepare_payload();
    if (head) res->body().clear();  // Content-Length stays that of the GET answer
    Lowest().expires_after(kWriteTimeout);
    http::async_write(stream_, *res,
                      [self = this->shared_from_this(), res, keep_alive](beast::error_code ec, size_t) {
                        if (!ec && self->drain_after_write_) return self->Drain();
                        if (ec || !keep_alive) return self->Close();
                        self->Read();
                      });
  }

  // Over TLS this closes without a close_notify: every response has a Content-Length, so a
  // client cannot mistake a truncated body for a whole one.
  void Close() {
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    Lowest().socket().close(ignored);
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  asio::thread_pool& read_pool_;
  asio::thread_pool& write_pool_;
  const HttpServer::Handler& handler_;
  size_t body_limit_;
  bool drain_after_write_ = false;
  size_t drained_ = 0;
  std::array<char, 16 * 1024> drain_buffer_{};
};

}  // namespace

struct HttpServer::Impl {
  Impl(const Options& o, Handler h)
      : options(o),
        handler(std::move(h)),
        read_pool(static_cast<size_t>(std::max(o.handler_threads, 1))),
        write_pool(static_cast<size_t>(std::max(o.write_handler_threads, 1))),
        acceptor(asio::make_strand(ioc)) {}

  void Accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec && tls) {
        std::make_shared<Session<TlsStream>>(read_pool, write_pool, handler, options.body_limit,
                                             std::move(socket), *tls)
            ->Start();
      } else if (!ec) {
        std::make_shared<Session<PlainStream>>(read_pool, write_pool, handler,
                                               options.body_limit, std::move(socket))
            ->Start();
      } else {
        spdlog::warn("http accept: {}", ec.message());
      }
      Accept();
    });
  }

  Options options;
  Handler handler;
  std::optional<asio::ssl::context> tls;  // set: serve TLS only
  asio::io_context ioc;  // destroyed after the pool and the acceptor
  asio::thread_pool read_pool;
  asio::thread_pool write_pool;
  tcp::acceptor acceptor;
  std::thread io_thread;
  uint16_t port = 0;
  bool stopped = false;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const Options& options, Handler handler) {
  beast::error_code ec;
  const auto address = asio::ip::make_address(options.address, ec);
  if (ec) {
    return Status::InvalidArgument("http address '" + options.address + "': " + ec.message());
  }
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
      return Status::InvalidArgument("http TLS needs both a certificate and a key file");
    }
    auto cert = ReadFileToString(options.tls_cert_file, "http TLS certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadFileToString(options.tls_key_file, "http TLS key");
    if (!key.ok()) return key.status();
    impl->tls.emplace(asio::ssl::context::tls_server);
    impl->tls->set_options(asio::ssl::context::default_workarounds |
                               asio::ssl::context::no_sslv2 | asio::ssl::context::no_sslv3 |
                               asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1,
                           ec);
    if (!ec) impl->tls->use_certificate_chain(asio::buffer(*cert), ec);
    if (ec) {
      return Status::InvalidArgument("http TLS certificate '" + options.tls_cert_file +
                                     "': " + ec.message());
    }
    impl->tls->use_private_key(asio::buffer(*key), asio::ssl::context::pem, ec);
    if (ec) {
      return Status::InvalidArgument("http TLS key '" + options.tls_key_file +
                                     "': " + ec.message());
    }
  }
  const tcp::endpoint endpoint(address, options.port);
  auto fail = [&](const char* what) {
    return Status::Unavailable("http " + std::string(what) + " " + options.address + ":" +
                               std::to_string(options.port) + ": " + ec.message());
  };
  impl->acceptor.open(endpoint.protocol(), ec);
  if (ec) return fail("open");
  impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  impl->acceptor.bind(endpoint, ec);
  if (ec) return fail("bind");
  impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen");
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  Impl* raw = impl.get();
  impl->io_thread = std::thread([raw] {
    for (;;) {
      try {
        raw->ioc.run();
        return;
      } catch (const std::exception& e) {  // a handler threw: log and keep serving
        spdlog::error("http: {}", e.what());
      }
    }
  });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

uint16_t HttpServer::port() const { return impl_->port; }

void HttpServer::Stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  asio::post(impl_->acceptor.get_executor(), [impl = impl_.get()] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
  });
  impl_->read_pool.join();  // let running handlers finish; their posts to ioc are dropped below
  impl_->write_pool.join();
  impl_->ioc.stop();
  if (impl_->io_thread.joinable()) impl_->io_thread.join();
}

}  // namespace gatehouse::controller
