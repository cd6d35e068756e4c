#include "loadgen/client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>
#include <type_traits>

#ifdef BASALT_LOADGEN_TLS
#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#endif

#include "core/error.h"
#include "loadgen/chunk.h"
#include "server/sse.h"

namespace basalt::loadgen {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

Url parse_url(const std::string& text) {
  Url u;
  const size_t sep = text.find("://");
  BASALT_CHECK(sep != std::string::npos, "--base-url '{}': expected http://HOST[:PORT][/PREFIX]", text);
  u.scheme = text.substr(0, sep);
  for (char& c : u.scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  BASALT_CHECK(u.scheme == "http" || u.scheme == "https", "--base-url '{}': the scheme must be http or https", text);
  std::string rest = text.substr(sep + 3);
  BASALT_CHECK(rest.find_first_of("?#") == std::string::npos, "--base-url '{}': no query or fragment allowed", text);
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  u.prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  BASALT_CHECK(authority.find('@') == std::string::npos, "--base-url '{}': credentials in the URL are not supported "
               "(use --api-key)", text);
  std::string port;
  if (!authority.empty() && authority[0] == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    BASALT_CHECK(close != std::string::npos, "--base-url '{}': unterminated IPv6 address", text);
    u.host = authority.substr(1, close - 1);
    std::string after = authority.substr(close + 1);
    if (!after.empty()) {
      BASALT_CHECK(after[0] == ':', "--base-url '{}': junk after the IPv6 address", text);
      port = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  BASALT_CHECK(!u.host.empty(), "--base-url '{}': no host", text);
  if (port.empty()) {
    port = u.scheme == "https" ? "443" : "80";
  } else {
    BASALT_CHECK(port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos,
                 "--base-url '{}': the port '{}' is not a number", text, port);
    const int p = std::stoi(port);
    BASALT_CHECK(p >= 1 && p <= 65535, "--base-url '{}': the port {} is not in 1-65535", text, p);
  }
  u.port = port;
  return u;
}

bool tls_supported() {
#ifdef BASALT_LOADGEN_TLS
  return true;
#else
  return false;
#endif
}

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kNone: return "none";
    case ErrorKind::kConnect: return "connect";
    case ErrorKind::kHttpStatus: return "http_status";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kStream: return "stream";
  }
  return "unknown";
}

namespace {

using PlainStream = beast::tcp_stream;
#ifdef BASALT_LOADGEN_TLS
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
#endif

template <class Stream>
struct Conn {
  template <class... A>
  explicit Conn(A&&... args) : stream(std::forward<A>(args)...) {}
  Stream stream;
  beast::flat_buffer buffer;
};

constexpr size_t kMaxErrorBody = 512;
constexpr size_t kMaxPool = 8192;

}  // namespace

struct HttpClient::Impl {
  asio::io_context& io;
  Url url;
  ClientOptions options;
  tcp::resolver::results_type endpoints;
  std::string host_header;
  std::vector<std::unique_ptr<Conn<PlainStream>>> plain_pool;
#ifdef BASALT_LOADGEN_TLS
  std::optional<asio::ssl::context> ssl;
  std::vector<std::unique_ptr<Conn<TlsStream>>> tls_pool;
#endif

  template <class Stream>
  std::vector<std::unique_ptr<Conn<Stream>>>& pool() {
#ifdef BASALT_LOADGEN_TLS
    if constexpr (std::is_same_v<Stream, TlsStream>) return tls_pool;
    else
#endif
      return plain_pool;
  }

  template <class Stream>
  std::unique_ptr<Conn<Stream>> fresh() {
#ifdef BASALT_LOADGEN_TLS
    if constexpr (std::is_same_v<Stream, TlsStream>) return std::make_unique<Conn<TlsStream>>(io, *ssl);
    else
#endif
      return std::make_unique<Conn<PlainStream>>(io);
  }

  double now_s() const { return std::chrono::duration<double>(Clock::now() - options.epoch).count(); }
};

namespace {

template <class Stream>
class Exchange : public std::enable_shared_from_this<Exchange<Stream>> {
 public:
  Exchange(HttpClient::Impl& impl, http::request<http::string_body> req, bool stream, bool keep_text,
           HttpClient::Done done)
      : impl_(impl),
        req_(std::move(req)),
        stream_(stream),
        keep_text_(keep_text),
        done_(std::move(done)),
        sse_([this](std::string_view data) { on_event(data); }) {
    chunk_cb_ = [this](uint64_t, std::string_view body, beast::error_code&) -> uint64_t {
      on_body(body);
      return body.size();
    };
  }

  void start() {
    result_.sent_s = impl_.now_s();
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(impl_.options.timeout_s));
    auto& pool = impl_.template pool<Stream>();
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

  void connect() {
    reused_ = false;
    conn_ = impl_.template fresh<Stream>();
    lowest().expires_at(deadline_);
    lowest().async_connect(impl_.endpoints,
                           [self = this->shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                             if (ec) return self->fail_io(ec, "connect");
                             self->lowest().socket().set_option(tcp::no_delay(true), ec);
                             self->handshake();
                           });
  }

  void handshake() {
#ifdef BASALT_LOADGEN_TLS
    if constexpr (std::is_same_v<Stream, TlsStream>) {
      if (!SSL_set_tlsext_host_name(conn_->stream.native_handle(), impl_.url.host.c_str()))
        return finish_error(ErrorKind::kConnect, "TLS: cannot set the server name");
      if (!impl_.options.insecure)
        conn_->stream.set_verify_callback(asio::ssl::host_name_verification(impl_.url.host));
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
    parser_.emplace();
    parser_->body_limit(64u << 20);
    parser_->on_chunk_body(chunk_cb_);
    header_seen_ = false;
    lowest().expires_at(deadline_);
    http::async_write(conn_->stream, req_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->fail_io(ec, "write");
      self->read();
    });
  }

  void read() {
    lowest().expires_at(deadline_);
    http::async_read_some(conn_->stream, conn_->buffer, *parser_,
                          [self = this->shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec) return fail_io(ec, "read");
    if (!header_seen_ && parser_->is_header_done()) {
      header_seen_ = true;
      result_.http_status = static_cast<int>(parser_->get().result_int());
    }
    if (parser_->is_done()) return complete();
    read();
  }

  void on_body(std::string_view body) {
    if (stream_ && result_.http_status == 200) {
      if (!sse_.feed(body) && !stream_failed_) {
        stream_failed_ = true;
        stream_message_ = sse_.error();
      }
    } else if (body_.size() < (stream_ ? kMaxErrorBody : (64u << 20))) {
      body_.append(body.substr(0, (stream_ ? kMaxErrorBody : (64u << 20)) - body_.size()));
    }
  }

  void on_event(std::string_view data) {
    const ChunkInfo info = read_chunk(data);
    if (info.usage_completion_tokens >= 0) result_.usage_completion_tokens = info.usage_completion_tokens;
    if (info.usage_prompt_tokens >= 0) result_.usage_prompt_tokens = info.usage_prompt_tokens;
    switch (info.kind) {
      case ChunkInfo::Kind::kToken: {
        const double t = impl_.now_s();
        if (result_.first_token_s < 0) result_.first_token_s = t;
        result_.token_times.push_back(t);
        ++result_.chunk_tokens;
        if (keep_text_) result_.text += info.text;
        break;
      }
      case ChunkInfo::Kind::kDone: saw_done_ = true; break;
      case ChunkInfo::Kind::kError:
      case ChunkInfo::Kind::kMalformed:
        if (!stream_failed_) {
          stream_failed_ = true;
          stream_message_ = (info.kind == ChunkInfo::Kind::kError ? "error event: " : "") + info.text;
        }
        break;
      case ChunkInfo::Kind::kOther: break;
    }
  }

  void complete() {
    std::string& whole = parser_->get().body();  // a body that was not chunked
    if (!whole.empty()) on_body(whole);
    if (stream_ && result_.http_status == 200) sse_.finish();
    if (result_.http_status != 200) {
      result_.body = std::move(body_);
      return finish_error(ErrorKind::kHttpStatus,
                          "HTTP " + std::to_string(result_.http_status) + ": " + result_.body.substr(0, 200), true);
    }
    if (stream_failed_) return finish_error(ErrorKind::kStream, stream_message_, true);
    if (stream_ && !saw_done_) return finish_error(ErrorKind::kStream, "the stream ended without data: [DONE]", true);
    if (!stream_) result_.body = std::move(body_);
    finish(true);
  }

  void fail_io(beast::error_code ec, const char* what) {
    if (ec == beast::error::timeout) return finish_error(ErrorKind::kTimeout, std::string(what) + ": timed out");
    const bool nothing_back = !parser_ || !parser_->got_some();
    if (nothing_back && reused_ && !retried_) {
      retried_ = true;
      conn_.reset();
      return connect();
    }
    if (nothing_back) return finish_error(ErrorKind::kConnect, std::string(what) + ": " + ec.message());
    finish_error(ErrorKind::kStream, std::string(what) + " after the response began: " + ec.message());
  }

  void finish_error(ErrorKind kind, std::string message, bool reusable = false) {
    result_.error = kind;
    result_.error_message = std::move(message);
    finish(reusable);
  }

  void finish(bool reusable) {
    result_.end_s = impl_.now_s();
    if (reusable && conn_ && parser_ && parser_->keep_alive() && sse_.error().empty() &&
        impl_.template pool<Stream>().size() < kMaxPool) {
      lowest().expires_never();
      impl_.template pool<Stream>().push_back(std::move(conn_));
    }
    conn_.reset();
    HttpClient::Done done = std::move(done_);
    done(std::move(result_));
  }

  HttpClient::Impl& impl_;
  http::request<http::string_body> req_;
  bool stream_;
  bool keep_text_;
  HttpClient::Done done_;
  SseParser sse_;
  std::function<uint64_t(uint64_t, std::string_view, beast::error_code&)> chunk_cb_;
  std::unique_ptr<Conn<Stream>> conn_;
  std::optional<http::response_parser<http::string_body>> parser_;
  Clock::time_point deadline_;
  ExchangeResult result_;
  std::string body_;
  bool reused_ = false;
  bool retried_ = false;
  bool header_seen_ = false;
  bool saw_done_ = false;
  bool stream_failed_ = false;
  std::string stream_message_;
};

}  // namespace

HttpClient::HttpClient(asio::io_context& io, Url url, ClientOptions options)
    : impl_(std::make_unique<Impl>(Impl{io, std::move(url), std::move(options), {}, {}, {}
#ifdef BASALT_LOADGEN_TLS
                                        ,
                                        {}, {}
#endif
      })) {
  Impl& m = *impl_;
  BASALT_CHECK(m.options.timeout_s > 0 && m.options.timeout_s < 1e7, "--timeout must be positive seconds, got {}",
               m.options.timeout_s);
  if (m.url.scheme == "https") {
#ifdef BASALT_LOADGEN_TLS
    m.ssl.emplace(asio::ssl::context::tls_client);
    m.ssl->set_default_verify_paths();
    m.ssl->set_verify_mode(m.options.insecure ? asio::ssl::verify_none : asio::ssl::verify_peer);
#else
    fail("--base-url {}://...: this build has no TLS support (OpenSSL was not found)", m.url.scheme);
#endif
  }
  tcp::resolver resolver(io);
  beast::error_code ec;
  m.endpoints = resolver.resolve(m.url.host, m.url.port, ec);
  BASALT_CHECK(!ec, "--base-url: cannot resolve {}:{}: {}", m.url.host, m.url.port, ec.message());
  const bool default_port = (m.url.scheme == "http" && m.url.port == "80") || (m.url.scheme == "https" && m.url.port == "443");
  const bool v6 = m.url.host.find(':') != std::string::npos;
  m.host_header = (v6 ? "[" + m.url.host + "]" : m.url.host) + (default_port ? "" : ":" + m.url.port);
}

HttpClient::~HttpClient() = default;

double HttpClient::now_s() const { return impl_->now_s(); }
void HttpClient::set_epoch(Clock::time_point epoch) { impl_->options.epoch = epoch; }

void HttpClient::close_idle() {
  impl_->plain_pool.clear();
#ifdef BASALT_LOADGEN_TLS
  impl_->tls_pool.clear();
#endif
}

void HttpClient::send(const std::string& method, const std::string& path, std::string body, bool stream,
                      bool keep_text, Done done) {
  Impl& m = *impl_;
  http::request<http::string_body> req;
  req.method_string(method);
  req.target(m.url.prefix + path);
  req.version(11);
  req.set(http::field::host, m.host_header);
  req.set(http::field::user_agent, "basalt-bench");
  if (!m.options.api_key.empty()) req.set(http::field::authorization, "Bearer " + m.options.api_key);
  if (stream) req.set(http::field::accept, "text/event-stream");
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  req.body() = std::move(body);
  req.prepare_payload();
#ifdef BASALT_LOADGEN_TLS
  if (m.url.scheme == "https") {
    std::make_shared<Exchange<TlsStream>>(m, std::move(req), stream, keep_text, std::move(done))->start();
    return;
  }
#endif
  std::make_shared<Exchange<PlainStream>>(m, std::move(req), stream, keep_text, std::move(done))->start();
}

}  // namespace basalt::loadgen
