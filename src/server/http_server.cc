#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#ifdef BASALT_TLS
#include <boost/asio/ssl.hpp>
#endif
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"

namespace basalt {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

std::optional<std::string_view> HttpRequest::header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_name) return std::string_view(value);
  return std::nullopt;
}

std::string_view http_reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

namespace {

// An OpenAI-style error body, for the answers the transport gives itself.
HttpResponse transport_error(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  nlohmann::json body = {{"error",
                          {{"message", message},
                           {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                           {"param", nullptr},
                           {"code", status}}}};
  r.body = body.dump();
  return r;
}

// The CORS headers a request from an allowed origin gets (none for
// others), and whether it is a preflight the transport answers itself.
struct Cors {
  std::vector<std::pair<std::string, std::string>> headers;
  bool preflight = false;
};

Cors cors_for(const std::vector<std::string>& allowed, const HttpRequest& request) {
  Cors cors;
  const std::optional<std::string_view> origin = request.header("origin");
  if (allowed.empty() || !origin) return cors;
  const bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
  if (!any && std::find(allowed.begin(), allowed.end(), *origin) == allowed.end()) return cors;
  cors.headers.emplace_back("Access-Control-Allow-Origin", any ? "*" : std::string(*origin));
  if (!any) cors.headers.emplace_back("Vary", "Origin");
  cors.preflight = request.method == "OPTIONS" && request.header("access-control-request-method").has_value();
  if (cors.preflight) {
    cors.headers.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const std::optional<std::string_view> asked = request.header("access-control-request-headers");
    cors.headers.emplace_back("Access-Control-Allow-Headers",
                              asked ? std::string(*asked) : std::string("Authorization, Content-Type"));
    cors.headers.emplace_back("Access-Control-Max-Age", "600");
  } else {
    cors.headers.emplace_back("Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
  }
  return cors;
}

std::string head_text(const HttpResponse& r, bool http10, bool keep_alive, bool streamed,
                      const std::vector<std::pair<std::string, std::string>>& more = {}) {
  std::string s = http10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  s += std::to_string(r.status);
  s += ' ';
  s += http_reason(r.status);
  s += "\r\nServer: basalt\r\nContent-Type: ";
  s += r.content_type;
  s += "\r\n";
  for (const auto* list : {&r.headers, &more}) {
    for (const auto& [name, value] : *list) {
      s += name;
      s += ": ";
      s += value;
      s += "\r\n";
    }
  }
  if (!streamed) {
    s += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  } else if (!http10) {
    s += "Transfer-Encoding: chunked\r\n";
  }
  s += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  s += "\r\n";
  return s;
}

void append_chunk(std::string& out, std::string_view data, bool http10) {
  if (data.empty()) return;
  if (http10) {
    out += data;
    return;
  }
  char size[32];
  const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  out.append(size, static_cast<size_t>(n));
  out += data;
  out += "\r\n";
}

// Lets a producer wake its connection from any thread, and be cut off when
// the connection closes (after which wake() does nothing).
struct Waker {
  std::mutex mu;
  std::function<void()> post;  // empty once the connection closed
  void wake() {
    std::lock_guard<std::mutex> lock(mu);
    if (post) post();
  }
  void disable() {
    std::lock_guard<std::mutex> lock(mu);
    post = nullptr;
  }
};

class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void close_from_server() = 0;
};

}  // namespace

struct HttpServer::Impl {
  // Declared before the io_context: sessions destroyed with its pending
  // handlers still unregister themselves and use the TLS context.
  mutable std::mutex mu;
  std::unordered_map<uint64_t, std::weak_ptr<SessionBase>> sessions;
  uint64_t next_session = 0;
  bool stopped = false;
  HttpServerOptions options;
  HttpHandler handler;
#ifdef BASALT_TLS
  std::optional<asio::ssl::context> tls;
#endif

  // One io_context run by every I/O thread (kShared), or one per thread
  // (kPerThread, each connection on one of them); the acceptor is on a
  // strand of the first: its completions and the closes posted by
  // stop_accepting() and stop() never run at once (a close next to an
  // async_accept on another I/O thread crashed the server in its drain).
  std::vector<std::unique_ptr<asio::io_context>> contexts;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  size_t next_context = 0;  // the accept handler's: the context of the next connection
  std::vector<std::thread> threads;
  std::atomic<int64_t> responses_in_progress{0};
  uint16_t bound_port = 0;

  Impl(HttpServerOptions o, HttpHandler h) : options(std::move(o)), handler(std::move(h)) {
    const int n = std::max(1, options.io_threads);
    if (options.io_model == IoModel::kPerThread) {
      for (int i = 0; i < n; ++i) contexts.push_back(std::make_unique<asio::io_context>(1));
    } else {
      contexts.push_back(std::make_unique<asio::io_context>(n));
    }
    acceptor.emplace(asio::make_strand(*contexts.front()));
  }

  void accept();
  template <class Stream>
  void launch(Stream stream, bool over_limit, asio::io_context& context);
  void forget(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    sessions.erase(id);
  }
};

namespace {

tcp::socket& lowest(tcp::socket& s) { return s; }
#ifdef BASALT_TLS
tcp::socket& lowest(asio::ssl::stream<tcp::socket>& s) { return s.next_layer(); }
#endif

bool truncated(const error_code& ec) {
#ifdef BASALT_TLS
  return ec == asio::ssl::error::stream_truncated;
#else
  (void)ec;
  return false;
#endif
}

template <class Stream>
constexpr bool kIsTls = !std::is_same_v<Stream, tcp::socket>;

template <class Stream>
class Session : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(HttpServer::Impl& server, uint64_t id, Stream stream, bool over_limit, asio::io_context& context)
      : server_(server),
        id_(id),
        stream_(std::move(stream)),
        strand_(asio::make_strand(context)),
        read_timer_(strand_),
        write_timer_(strand_),
        over_limit_(over_limit) {}

  ~Session() override { server_.forget(id_); }

  void start() {
    asio::dispatch(strand_, [self = this->shared_from_this()] { self->begin(); });
  }

  void close_from_server() override {
    asio::post(strand_, [self = this->shared_from_this()] { self->close(); });
  }

 private:
  void begin() {
    error_code ec;
    const tcp::endpoint peer = lowest(stream_).remote_endpoint(ec);
    if (!ec) remote_ = peer.address().to_string();
    if (over_limit_) {
      keep_alive_ = false;
      reject(503, "too many open connections; try again later");
      return;
    }
    arm_read_timer(server_.options.request_timeout);
#ifdef BASALT_TLS
    if constexpr (kIsTls<Stream>) {
      stream_.async_handshake(asio::ssl::stream_base::server,
                              asio::bind_executor(strand_, [self = this->shared_from_this()](error_code e) {
                                if (e) return self->close();
                                self->read_next();
                              }));
      return;
    }
#endif
    read_next();
  }

  void read_next() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(server_.options.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(std::min<size_t>(server_.options.max_header_bytes, UINT32_MAX)));
    reading_ = true;
    http::async_read(stream_, buffer_, *parser_,
                     asio::bind_executor(strand_, [self = this->shared_from_this()](error_code ec, size_t) {
                       self->on_read(ec);
                     }));
  }

  void on_read(error_code ec) {
    reading_ = false;
    if (closed_) return;
    if (producer_) {
      // A read during a response only watches for the client leaving, or
      // takes a pipelined request to answer afterwards.
      if (ec) return close();
      pending_ = convert();
      return;
    }
    read_timer_.cancel();
    if (ec) {
      keep_alive_ = false;
      if (ec == http::error::body_limit)
        return reject(413,
                      fmt::format("request body is larger than the limit of {} bytes", server_.options.max_body_bytes));
      if (ec == http::error::header_limit) return reject(431, "request headers are too large");
      if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::operation_aborted ||
          ec == asio::error::connection_reset || truncated(ec) || !parser_->got_some())
        return close();
      return reject(400, fmt::format("malformed HTTP request: {}", ec.message()));
    }
    HttpRequest request = convert();
    handle(request);
  }

  // Answers a request the handler never sees, and reports it.
  void reject(int status, const std::string& reason) {
    head_only_ = false;
    if (server_.options.on_rejection) {
      TransportRejection r;
      r.status = status;
      r.remote = remote_;
      r.reason = reason;
      // The start line is parsed before any limit on headers or body trips.
      if (parser_ && parser_->got_some()) {
        r.method = std::string(parser_->get().method_string());
        const std::string target(parser_->get().target());
        r.path = target.substr(0, target.find('?'));
      }
      try {
        server_.options.on_rejection(r);
      } catch (const std::exception&) {
      }
    }
    cors_headers_.clear();  // the request was never read: no origin is known
    send_whole(transport_error(status, reason));
  }

  HttpRequest convert() {
    http::request<http::string_body> msg = parser_->release();
    HttpRequest r;
    r.method = std::string(msg.method_string());
    r.target = std::string(msg.target());
    r.path = r.target.substr(0, r.target.find('?'));
    for (const auto& field : msg) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers.emplace_back(std::move(name), std::string(field.value()));
    }
    r.body = std::move(msg.body());
    r.remote = remote_;
    r.keep_alive = msg.keep_alive();
    r.http10 = msg.version() == 10;
    return r;
  }

  void handle(HttpRequest& request) {
    keep_alive_ = request.keep_alive;
    http10_ = request.http10;
    head_only_ = request.method == "HEAD";
    Cors cors = cors_for(server_.options.allowed_origins, request);
    cors_headers_ = std::move(cors.headers);
    if (cors.preflight) {
      HttpResponse preflight;
      preflight.status = 204;
      preflight.content_type = "text/plain";
      return send_whole(preflight);
    }
    HandlerResult result;
    try {
      result = server_.handler(request);
    } catch (const std::exception& e) {
      result = HandlerResult{transport_error(500, fmt::format("internal error: {}", e.what())), nullptr};
    }
    if (!result.producer) return send_whole(result.response);
    producer_ = std::move(result.producer);
    counted_ = true;
    server_.responses_in_progress.fetch_add(1);
    head_sent_ = false;
    streamed_ = false;
    waker_ = std::make_shared<Waker>();
    waker_->post = [weak = this->weak_from_this(), strand = strand_, flag = wake_flag_] {
      if (flag->exchange(true)) return;
      asio::post(strand, [weak, flag] {
        flag->store(false);
        if (auto self = weak.lock()) self->pump();
      });
    };
    producer_->start([w = waker_] { w->wake(); });
    // Keep reading: a closed socket shows up here at once.
    if (!reading_ && !pending_) read_next();
    pump();
  }

  void send_whole(const HttpResponse& response) {
    out_ = head_text(response, http10_, keep_alive_, false, cors_headers_);
    if (!head_only_) out_ += response.body;
    write([self = this->shared_from_this()] { self->after_response(); });
  }

  // Pulls from the producer and writes what it gave; again after each write.
  void pump() {
    if (closed_ || !producer_ || writing_) return;
    ResponseProducer::Output out;
    try {
      producer_->pull(out);
    } catch (const std::exception& e) {
      if (!head_sent_) {
        out = {};
        out.head = transport_error(500, fmt::format("internal error: {}", e.what()));
        out.done = true;
      } else {
        return close();
      }
    }
    std::string bytes;
    if (!head_sent_) {
      if (!out.head) return;  // nothing yet
      head_sent_ = true;
      if (out.done) {
        producer_.reset();
        waker_->disable();
        out.head->body += out.data;
        return send_whole(*out.head);
      }
      streamed_ = true;
      if (http10_) keep_alive_ = false;
      bytes = head_text(*out.head, http10_, keep_alive_, true, cors_headers_);
      append_chunk(bytes, out.head->body, http10_);
    }
    append_chunk(bytes, out.data, http10_);
    if (out.done) {
      if (!http10_) bytes += "0\r\n\r\n";
      producer_.reset();
      waker_->disable();
    }
    if (bytes.empty()) return;
    out_ = std::move(bytes);
    const bool done = out.done;
    write([self = this->shared_from_this(), done] {
      if (done) return self->after_response();
      self->pump();
    });
  }

  template <class Then>
  void write(Then then) {
    writing_ = true;
    arm_write_timer();
    asio::async_write(stream_, asio::buffer(out_),
                      asio::bind_executor(strand_, [self = this->shared_from_this(), then](error_code ec, size_t) {
                        self->writing_ = false;
                        self->write_timer_.cancel();
                        if (self->closed_) return;
                        if (ec) return self->close();
                        then();
                      }));
  }

  void uncount() {
    if (!counted_) return;
    counted_ = false;
    server_.responses_in_progress.fetch_sub(1);
  }

  void after_response() {
    uncount();
    if (closed_) return;
    if (!keep_alive_) return close();
    if (pending_) {
      HttpRequest r = std::move(*pending_);
      pending_.reset();
      return handle(r);
    }
    // Idle until the next request begins (its read may already be running).
    arm_read_timer(buffer_.size() > 0 ? server_.options.request_timeout : server_.options.idle_timeout);
    if (!reading_) read_next();
  }

  void arm_read_timer(std::chrono::milliseconds after) {
    read_timer_.expires_after(after);
    read_timer_.async_wait([self = this->shared_from_this()](error_code ec) {
      if (!ec) self->close();
    });
  }

  void arm_write_timer() {
    write_timer_.expires_after(server_.options.write_timeout);
    write_timer_.async_wait([self = this->shared_from_this()](error_code ec) {
      if (!ec) self->close();
    });
  }

  void close() {
    uncount();
    if (closed_) return;
    closed_ = true;
    if (waker_) waker_->disable();
    if (producer_) {
      std::unique_ptr<ResponseProducer> p = std::move(producer_);
      try {
        p->abort();
      } catch (const std::exception&) {
      }
    }
    read_timer_.cancel();
    write_timer_.cancel();
    error_code ec;
    lowest(stream_).shutdown(tcp::socket::shutdown_both, ec);
    lowest(stream_).close(ec);
  }

  HttpServer::Impl& server_;
  uint64_t id_;
  Stream stream_;
  asio::strand<asio::io_context::executor_type> strand_;
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<HttpRequest> pending_;
  std::unique_ptr<ResponseProducer> producer_;
  std::shared_ptr<Waker> waker_;
  std::shared_ptr<std::atomic<bool>> wake_flag_ = std::make_shared<std::atomic<bool>>(false);
  std::string out_;
  std::string remote_;
  bool over_limit_ = false;
  bool reading_ = false;
  bool writing_ = false;
  bool closed_ = false;
  bool keep_alive_ = true;
  bool http10_ = false;
  bool head_sent_ = false;
  bool streamed_ = false;
  bool head_only_ = false;  // a HEAD request: no body is sent
  std::vector<std::pair<std::string, std::string>> cors_headers_;  // the current request's
  bool counted_ = false;    // in responses_in_progress
};

}  // namespace

template <class Stream>
void HttpServer::Impl::launch(Stream stream, bool over_limit, asio::io_context& context) {
  std::shared_ptr<Session<Stream>> session;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return;
    const uint64_t id = next_session++;
    session = std::make_shared<Session<Stream>>(*this, id, std::move(stream), over_limit, context);
    sessions[id] = session;
  }
  session->start();
}

void HttpServer::Impl::accept() {
  // Connections are dealt round the contexts (one, when they share it).
  asio::io_context& context = *contexts[next_context];
  next_context = (next_context + 1) % contexts.size();
  acceptor->async_accept(asio::make_strand(context), [this, &context](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
    if (!ec) {
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      bool over_limit = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        over_limit = sessions.size() >= options.max_connections;
      }
#ifdef BASALT_TLS
      if (tls) {
        launch(asio::ssl::stream<tcp::socket>(std::move(socket), *tls), over_limit, context);
        accept();
        return;
      }
#endif
      launch(std::move(socket), over_limit, context);
    }
    accept();
  });
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& s = *impl_;
  const HttpServerOptions& o = s.options;
  BASALT_CHECK(o.tls_cert_file.empty() == o.tls_key_file.empty(),
               "TLS needs both a certificate file and a key file");
#ifdef BASALT_TLS
  if (!o.tls_cert_file.empty()) {
    s.tls.emplace(asio::ssl::context::tls_server);
    s.tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                       asio::ssl::context::no_tlsv1_1);
    error_code ec;
    s.tls->use_certificate_chain_file(o.tls_cert_file, ec);
    BASALT_CHECK(!ec, "TLS certificate {}: {}", o.tls_cert_file, ec.message());
    s.tls->use_private_key_file(o.tls_key_file, asio::ssl::context::pem, ec);
    BASALT_CHECK(!ec, "TLS key {}: {}", o.tls_key_file, ec.message());
  }
#else
  BASALT_CHECK(o.tls_cert_file.empty(), "this build has no TLS support (OpenSSL was not found when it was built)");
#endif
  error_code ec;
  const asio::ip::address address = asio::ip::make_address(o.host, ec);
  BASALT_CHECK(!ec, "--host '{}' is not an IP address", o.host);
  const tcp::endpoint endpoint(address, o.port);
  s.acceptor->open(endpoint.protocol(), ec);
  BASALT_CHECK(!ec, "cannot open a socket: {}", ec.message());
  s.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  s.acceptor->bind(endpoint, ec);
  BASALT_CHECK(!ec, "cannot listen on {}:{}: {}", o.host, o.port, ec.message());
  s.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  BASALT_CHECK(!ec, "cannot listen on {}:{}: {}", o.host, o.port, ec.message());
  s.bound_port = s.acceptor->local_endpoint().port();
  for (auto& context : s.contexts) s.work.push_back(asio::make_work_guard(*context));
  s.accept();
  for (int i = 0; i < std::max(1, o.io_threads); ++i) {
    asio::io_context& context = *s.contexts[static_cast<size_t>(i) % s.contexts.size()];
    s.threads.emplace_back([&context] { context.run(); });
  }
}

uint16_t HttpServer::port() const { return impl_->bound_port; }

void HttpServer::stop_accepting() {
  asio::post(impl_->acceptor->get_executor(), [s = impl_.get()] {
    error_code ec;
    s->acceptor->close(ec);
  });
}

void HttpServer::stop() {
  Impl& s = *impl_;
  std::vector<std::shared_ptr<SessionBase>> live;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopped) return;
    s.stopped = true;
    for (auto& [id, weak] : s.sessions)
      if (auto p = weak.lock()) live.push_back(std::move(p));
  }
  if (s.threads.empty()) return;
  asio::post(s.acceptor->get_executor(), [&s] {
    error_code ec;
    s.acceptor->close(ec);
  });
  for (auto& session : live) session->close_from_server();
  live.clear();
  s.work.clear();
  // Everything was cancelled, so run() returns soon; a last resort after 2 s.
  const auto all_stopped = [&s] {
    return std::all_of(s.contexts.begin(), s.contexts.end(), [](const auto& c) { return c->stopped(); });
  };
  for (int i = 0; i < 200 && !all_stopped(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (auto& context : s.contexts) context->stop();
  for (std::thread& t : s.threads) t.join();
  s.threads.clear();
}

int64_t HttpServer::responses_in_progress() const { return impl_->responses_in_progress.load(); }

size_t HttpServer::open_connections() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->sessions.size();
}

LogLine transport_rejection_line(const TransportRejection& r, std::string_view route) {
  LogLine line("request", LogLevel::kWarning);
  line.add("remote", r.remote);
  if (!r.method.empty()) line.add("method", r.method);
  if (!route.empty()) line.add("path", route);
  line.add("status", r.status).add("outcome", "rejected_by_transport").add("reason", r.reason);
  return line;
}

}  // namespace basalt
