// HttpServer: the HTTP/1.1 transport under `basalt serve` (Boost.Asio for
// the sockets and TLS, Boost.Beast's parser for requests).
//
// Contract:
//  * A fixed number of I/O threads run every connection (io_model: they share
//    one io_context, or each runs its own and a connection stays on one);
//    each connection is serialized on its own strand, so a handler and the
//    pulls of its response never run concurrently for one connection.
//  * The Handler is called once per complete request, on an I/O thread. It
//    must not block: it either answers at once (HttpResponse) or returns a
//    ResponseProducer that the server pulls from whenever the producer's
//    wake-up fires (from any thread, e.g. the engine's scheduler).
//  * Limits, each answered without calling the handler: a body over
//    max_body_bytes gets 413, headers over max_header_bytes 431, a request
//    that does not parse 400 (each then closes the connection); a request
//    that does not arrive in full within request_timeout, or a kept-alive
//    connection idle for idle_timeout, is closed; a write that makes no
//    progress for write_timeout (a client that stopped reading) closes the
//    connection. Past max_connections, new connections get 503 and close.
//  * A client that goes away while its response is being produced is noticed
//    at once (the socket is always being read) and the producer's abort() is
//    called exactly once, so the request can be cancelled and its KV freed.
//    abort() is also called for producers still running at stop().
//  * Streamed responses (a head without `done`) use chunked transfer
//    encoding on HTTP/1.1 and close-delimited bodies on HTTP/1.0.
//  * A HEAD request gets the status line and headers of the handler's
//    response (Content-Length included) without its body.
//  * Every request the server answers itself (413, 431, 400, 503 past
//    max_connections) is reported to on_rejection, if set, from an I/O
//    thread.
//  * CORS, where allowed_origins is set: a request whose Origin is allowed
//    gets Access-Control-Allow-Origin (the origin, with Vary: Origin; or *)
//    and Access-Control-Expose-Headers (X-Request-Id, Retry-After) on its
//    response, streamed or whole; a preflight from an allowed origin (an
//    OPTIONS request with Access-Control-Request-Method) is answered 204
//    by the transport, without the handler (a preflight carries no
//    credentials), allowing GET, POST and OPTIONS, the headers it asked
//    for, and a 600 s cache. Other requests, and every request when the
//    list is empty (the default), get no CORS headers: a browser then
//    refuses the response, as the same-origin policy asks.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace basalt {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path plus query
  std::string path;    // target up to '?'
  // Header names lower-cased, in arrival order.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string remote;  // peer address, for logs
  bool keep_alive = true;
  bool http10 = false;  // an HTTP/1.0 request

  // The first header of that (lower-case) name.
  std::optional<std::string_view> header(std::string_view lower_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones
  std::string body;
};

// A response produced later or in pieces (long requests, event streams).
class ResponseProducer {
 public:
  struct Output {
    // The status line and headers, set exactly once, on the first pull that
    // has them. With done also set on that pull, the response is sent whole
    // (Content-Length) with head->body followed by data; otherwise the body
    // streams: head->body and data, then each later pull's data, until a
    // pull sets done.
    std::optional<HttpResponse> head;
    std::string data;
    bool done = false;
  };
  virtual ~ResponseProducer() = default;
  // Called once, before the first pull; `wake` may be called from any thread
  // whenever pull may have something new (spurious calls are harmless).
  virtual void start(std::function<void()> wake) = 0;
  // Appends what is ready; called on the connection's strand.
  virtual void pull(Output& out) = 0;
  // The client went away or the server is stopping before done. Once.
  virtual void abort() = 0;
};

struct HandlerResult {
  HttpResponse response;                        // used when producer is null
  std::unique_ptr<ResponseProducer> producer;
};

using HttpHandler = std::function<HandlerResult(HttpRequest&)>;

// A request the transport answered without calling the handler. Method and
// path are empty where the request never parsed that far.
struct TransportRejection {
  int status = 0;
  std::string remote;
  std::string method;
  std::string path;
  std::string reason;
};

// How the I/O threads share the connections: kShared, one io_context that
// every thread runs (a connection's handlers may run on any of them, one at a
// time); kPerThread, one io_context per thread, made for one thread (Asio's
// concurrency hint 1, its single-thread optimisations: handlers posted from
// its own thread skip the shared queue), each accepted connection given to
// the next in turn for its life: no scheduler or epoll set shared between
// threads, and no balancing of busy connections across them either.
enum class IoModel { kShared, kPerThread };

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (see HttpServer::port())
  int io_threads = 2;
  IoModel io_model = IoModel::kShared;
  size_t max_body_bytes = 8u << 20;
  size_t max_header_bytes = 64u << 10;
  std::chrono::milliseconds request_timeout{30000};
  std::chrono::milliseconds idle_timeout{60000};
  std::chrono::milliseconds write_timeout{30000};
  size_t max_connections = 4096;
  // PEM files; both set: HTTPS only.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::function<void(const TransportRejection&)> on_rejection;
  // Origins whose pages may call the server from a browser: exact origins
  // ("https://app.example.com") or "*" for any. Empty: no CORS.
  std::vector<std::string> allowed_origins;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts the I/O threads; throws basalt::Error (address in use,
  // bad TLS files, ...).
  void start();
  // The bound port (after start).
  uint16_t port() const;
  // Closes the listening socket; open connections carry on.
  void stop_accepting();
  // Closes every connection (aborting running producers) and joins threads.
  void stop();
  size_t open_connections() const;
  // Responses from producers not yet written out in full.
  int64_t responses_in_progress() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

class LogLine;
// The `request` log line (a warning) of a request the transport answered
// itself: remote, method when known, path as `route` names it (when given),
// status, outcome rejected_by_transport, reason.
LogLine transport_rejection_line(const TransportRejection& rejection, std::string_view route);

// "200 OK" style reason phrases for the statuses the server uses.
std::string_view http_reason(int status);

}  // namespace basalt
