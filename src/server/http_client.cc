#include "server/http_client.h"

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <type_traits>

#ifdef BASALT_TLS
#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#endif

#include "core/error.h"

namespace basalt {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

BaseUrl parse_base_url(const std::string& text, std::string_view what) {
  BaseUrl u;
  const size_t sep = text.find("://");
  BASALT_CHECK(sep != std::string::npos, "{} '{}': expected http://HOST[:PORT][/PREFIX]", what, text);
  u.scheme = text.substr(0, sep);
  for (char& c : u.scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  BASALT_CHECK(u.scheme == "http" || u.scheme == "https", "{} '{}': the scheme must be http or https", what, text);
  std::string rest = text.substr(sep + 3);
  BASALT_CHECK(rest.find_first_of("?#") == std::string::npos, "{} '{}': no query or fragment allowed", what, text);
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  u.prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  BASALT_CHECK(authority.find('@') == std::string::npos,
               "{} '{}': credentials in the URL are not supported (give an API key instead)", what, text);
  std::string port;
  if (!authority.empty() && authority[0] == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    BASALT_CHECK(close != std::string::npos, "{} '{}': unterminated IPv6 address", what, text);
    u.host = authority.substr(1, close - 1);
    std::string after = authority.substr(close + 1);
    if (!after.empty()) {
      BASALT_CHECK(after[0] == ':', "{} '{}': junk after the IPv6 address", what, text);
      port = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  BASALT_CHECK(!u.host.empty(), "{} '{}': no host", what, text);
  if (port.empty()) {
    port = u.scheme == "https" ? "443" : "80";
  } else {
    BASALT_CHECK(port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos,
                 "{} '{}': the port '{}' is not a number", what, text, port);
    const int p = std::stoi(port);
    BASALT_CHECK(p >= 1 && p <= 65535, "{} '{}': the port {} is not in 1-65535", what, text, p);
  }
  u.port = port;
  return u;
}

bool http_client_tls_supported() {
#ifdef BASALT_TLS
  return true;
#else
  return false;
#endif
}

const char* http_failure_name(HttpFailure failure) {
  switch (failure) {
    case HttpFailure::kNone: return "none";
    case HttpFailure::kConnect: return "connect";
    case HttpFailure::kTimeout: return "timeout";
    case HttpFailure::kBroken: return "broken";
    case HttpFailure::kCancelled: return "cancelled";
  }
  return "unknown";
}

std::optional<std::string_view> IncomingHead::header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_name) return std::string_view(value);
  return std::nullopt;
}

struct ExchangeHandle::Control {
  std::function<void()> cancel;  // queues the cancel on the client's strand
};

void ExchangeHandle::cancel() const {
  if (const std::shared_ptr<Control> c = control_.lock()) c->cancel();
}

namespace {

using Strand = asio::strand<asio::io_context::executor_type>;
using PlainStream = beast::basic_stream<tcp, Strand>;
#ifdef BASALT_TLS
using TlsStream = beast::ssl_stream<PlainStream>;
#endif

template <class Stream>
struct Conn {
  template <class... A>
  explicit Conn(A&&... args) : stream(std::forward<A>(args)...) {}
  Stream stream;
  beast::flat_buffer buffer;
};

}  // namespace

struct HttpClient::Impl {
  Impl(asio::io_context& io_context, BaseUrl base, HttpClientOptions o)
      : io(io_context), strand(asio::make_strand(io_context)), url(std::move(base)), options(std::move(o)) {}
  asio::io_context& io;
  Strand strand;
  BaseUrl url;
  HttpClientOptions options;
  tcp::resolver::results_type endpoints;
  std::string host_header;
  std::atomic<size_t> opened{0};
  // The idle pools, on the strand.
  std::vector<std::unique_ptr<Conn<PlainStream>>> plain_pool;
#ifdef BASALT_TLS
  std::optional<asio::ssl::context> ssl;
  std::vector<std::unique_ptr<Conn<TlsStream>>> tls_pool;
#endif

  template <class Stream>
  std::vector<std::unique_ptr<Conn<Stream>>>& pool() {
#ifdef BASALT_TLS
    if constexpr (std::is_same_v<Stream, TlsStream>) return tls_pool;
    else
#endif
      return plain_pool;
  }

  template <class Stream>
  std::unique_ptr<Conn<Stream>> fresh() {
#ifdef BASALT_TLS
    if constexpr (std::is_same_v<Stream, TlsStream>) return std::make_unique<Conn<TlsStream>>(strand, *ssl);
    else
#endif
      return std::make_unique<Conn<PlainStream>>(strand);
  }
};

namespace {

constexpr size_t kReadPiece = 16 << 10;

template <class Stream>
class Exchange : public std::enable_shared_from_this<Exchange<Stream>> {
 public:
  Exchange(std::shared_ptr<HttpClient::Impl> impl, http::request<http::string_body> req, ExchangeCallbacks callbacks)
      : impl_(std::move(impl)), req_(std::move(req)), callbacks_(std::move(callbacks)) {}

  std::shared_ptr<ExchangeHandle::Control> control() {
    auto c = std::make_shared<ExchangeHandle::Control>();
    c->cancel = [weak = this->weak_from_this(), strand = impl_->strand] {
      asio::dispatch(strand, [weak] {
        if (const auto self = weak.lock()) self->cancel();
      });
    };
    control_ = c;
    return c;
  }

  void start() {
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(impl_->options.timeout_s));
    auto& pool = impl_->template pool<Stream>();
    if (!pool.empty()) {
      conn_ = std::move(pool.back());
      pool.pop_back();
      reused_ = true;
      write();
    } else {
      connect();
    }
  }

 private:
  auto& lowest() { return beast::get_lowest_layer(conn_->stream); }

  void cancel() {
    if (ended_ || cancelled_) return;
    cancelled_ = true;
    // The operation in flight completes with an error, which ends the
    // exchange as cancelled.
    if (conn_) lowest().close();
  }

  void connect() {
    reused_ = false;
    conn_ = impl_->template fresh<Stream>();
    lowest().expires_at(deadline_);
    lowest().async_connect(impl_->endpoints, [self = this->shared_from_this()](beast::error_code ec,
                                                                               const tcp::endpoint&) {
      if (ec) return self->fail_io(ec, "connect");
      ++self->impl_->opened;
      self->lowest().socket().set_option(tcp::no_delay(true), ec);
      self->handshake();
    });
  }

  void handshake() {
#ifdef BASALT_TLS
    if constexpr (std::is_same_v<Stream, TlsStream>) {
      if (!SSL_set_tlsext_host_name(conn_->stream.native_handle(), impl_->url.host.c_str()))
        return end(HttpFailure::kConnect, "TLS: cannot set the server name");
      if (!impl_->options.insecure)
        conn_->stream.set_verify_callback(asio::ssl::host_name_verification(impl_->url.host));
      conn_->stream.async_handshake(asio::ssl::stream_base::client,
                                    [self = this->shared_from_this()](beast::error_code ec) {
                                      if (ec) return self->fail_io(ec, "TLS handshake");
                                      self->write();
                                    });
      return;
    }
#endif
    write();
  }

  void write() {
    if (cancelled_) return end(HttpFailure::kCancelled, "cancelled");
    parser_.emplace();
    parser_->body_limit(impl_->options.max_body_bytes);
    head_seen_ = false;
    lowest().expires_at(deadline_);
    http::async_write(conn_->stream, req_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->fail_io(ec, "write");
      self->read();
    });
  }

  void read() {
    parser_->get().body().data = piece_;
    parser_->get().body().size = sizeof piece_;
    lowest().expires_at(deadline_);
    http::async_read_some(conn_->stream, conn_->buffer, *parser_,
                          [self = this->shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::need_buffer) ec = {};  // the piece is full: not an error
    if (ec) return fail_io(ec, "read");
    if (!head_seen_ && parser_->is_header_done()) {
      head_seen_ = true;
      IncomingHead head;
      head.status = static_cast<int>(parser_->get().result_int());
      for (const auto& field : parser_->get()) {
        std::string name(field.name_string());
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        head.headers.emplace_back(std::move(name), std::string(field.value()));
      }
      if (callbacks_.on_head) callbacks_.on_head(head);
      if (cancelled_) return end(HttpFailure::kCancelled, "cancelled");
    }
    const size_t got = sizeof piece_ - parser_->get().body().size;
    if (got > 0 && callbacks_.on_data) {
      callbacks_.on_data(std::string_view(piece_, got));
      if (cancelled_) return end(HttpFailure::kCancelled, "cancelled");
    }
    if (parser_->is_done()) return end(HttpFailure::kNone, "", parser_->keep_alive());
    read();
  }

  void fail_io(beast::error_code ec, const char* what) {
    if (cancelled_) return end(HttpFailure::kCancelled, "cancelled");
    if (ec == beast::error::timeout) return end(HttpFailure::kTimeout, std::string(what) + ": timed out");
    const bool nothing_back = !parser_ || !parser_->got_some();
    if (nothing_back && reused_ && !retried_) {
      // The server closed the idle connection: once more, on a fresh one.
      retried_ = true;
      conn_.reset();
      return connect();
    }
    if (nothing_back) return end(HttpFailure::kConnect, std::string(what) + ": " + ec.message());
    end(HttpFailure::kBroken, std::string(what) + " after the response began: " + ec.message());
  }

  void end(HttpFailure failure, std::string message, bool reusable = false) {
    if (ended_) return;
    ended_ = true;
    auto& pool = impl_->template pool<Stream>();
    if (reusable && conn_ && !cancelled_ && pool.size() < impl_->options.max_idle) {
      lowest().expires_never();
      pool.push_back(std::move(conn_));
    }
    conn_.reset();
    ExchangeCallbacks callbacks = std::move(callbacks_);
    if (callbacks.on_done) callbacks.on_done(failure, message);
  }

  std::shared_ptr<HttpClient::Impl> impl_;
  http::request<http::string_body> req_;
  ExchangeCallbacks callbacks_;
  std::shared_ptr<ExchangeHandle::Control> control_;
  std::unique_ptr<Conn<Stream>> conn_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  std::chrono::steady_clock::time_point deadline_;
  char piece_[kReadPiece];
  bool reused_ = false;
  bool retried_ = false;
  bool head_seen_ = false;
  bool cancelled_ = false;
  bool ended_ = false;
};

template <class Stream>
ExchangeHandle launch(const std::shared_ptr<HttpClient::Impl>& impl, http::request<http::string_body> req,
                      ExchangeCallbacks callbacks) {
  auto exchange = std::make_shared<Exchange<Stream>>(impl, std::move(req), std::move(callbacks));
  ExchangeHandle handle(exchange->control());
  asio::dispatch(impl->strand, [exchange] { exchange->start(); });
  return handle;
}

}  // namespace

HttpClient::HttpClient(asio::io_context& io, BaseUrl url, HttpClientOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(url), std::move(options))) {
  Impl& m = *impl_;
  BASALT_CHECK(m.options.timeout_s > 0 && m.options.timeout_s < 1e7, "the timeout must be positive seconds, got {}",
               m.options.timeout_s);
  if (m.url.scheme == "https") {
#ifdef BASALT_TLS
    m.ssl.emplace(asio::ssl::context::tls_client);
    m.ssl->set_default_verify_paths();
    m.ssl->set_verify_mode(m.options.insecure ? asio::ssl::verify_none : asio::ssl::verify_peer);
#else
    fail("{}://{}: this build has no TLS support (OpenSSL was not found)", m.url.scheme, m.url.host);
#endif
  }
  tcp::resolver resolver(io);
  beast::error_code ec;
  m.endpoints = resolver.resolve(m.url.host, m.url.port, ec);
  BASALT_CHECK(!ec, "cannot resolve {}:{}: {}", m.url.host, m.url.port, ec.message());
  const bool default_port =
      (m.url.scheme == "http" && m.url.port == "80") || (m.url.scheme == "https" && m.url.port == "443");
  const bool v6 = m.url.host.find(':') != std::string::npos;
  m.host_header = (v6 ? "[" + m.url.host + "]" : m.url.host) + (default_port ? "" : ":" + m.url.port);
}

HttpClient::~HttpClient() = default;

const BaseUrl& HttpClient::url() const { return impl_->url; }
size_t HttpClient::connections_opened() const { return impl_->opened.load(); }

void HttpClient::close_idle() {
  asio::dispatch(impl_->strand, [impl = impl_] {
    impl->plain_pool.clear();
#ifdef BASALT_TLS
    impl->tls_pool.clear();
#endif
  });
}

ExchangeHandle HttpClient::send(OutgoingRequest request, ExchangeCallbacks callbacks) {
  Impl& m = *impl_;
  http::request<http::string_body> req;
  req.method_string(request.method);
  req.target(m.url.prefix + request.path);
  req.version(11);
  req.set(http::field::host, m.host_header);
  req.set(http::field::user_agent, m.options.user_agent);
  for (auto& [name, value] : request.headers) req.set(name, value);
  req.keep_alive(true);
  req.body() = std::move(request.body);
  req.prepare_payload();
#ifdef BASALT_TLS
  if (m.url.scheme == "https") return launch<TlsStream>(impl_, std::move(req), std::move(callbacks));
#endif
  return launch<PlainStream>(impl_, std::move(req), std::move(callbacks));
}

}  // namespace basalt
