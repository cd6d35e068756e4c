// HttpClient: an asynchronous HTTP/1.1 client for one origin (Boost.Asio
// sockets, Boost.Beast's response parser, TLS through OpenSSL when the
// build has it). Under `basalt bench` (loadgen/client.h reads OpenAI
// streams over it) and the gateway's calls to its replicas.
//
// Contract:
//  * Executor-bound: the client runs on a strand of the io_context it is
//    given. send() and cancel() may be called from any thread; every
//    callback runs on that strand, one at a time, so a client's callbacks
//    never run concurrently with each other. It starts no threads and holds
//    none per request.
//  * send() makes one exchange and calls, in order: on_head once when the
//    status line and headers have arrived; on_data with the body's bytes as
//    they arrive (a chunked body de-chunked, chunk by chunk); on_done exactly
//    once, with how it ended. A status other than 200 is not a failure here:
//    on_head says what it was. on_head and on_data may be left empty.
//  * Failures (HttpFailure), never thrown:
//      kConnect    resolving, connecting, the TLS handshake or the request's
//                  write failed, or the connection closed before any byte
//                  of the response;
//      kTimeout    the exchange outlived options.timeout_s;
//      kBroken     the response broke off, did not parse as HTTP, or its
//                  body passed options.max_body_bytes, after its first byte;
//      kCancelled  cancel() came first (on_done still runs, once).
//  * Keep-alive: a connection whose response ended cleanly and that the
//    server keeps open goes back to an idle pool (at most
//    options.max_idle) and is reused by the next send(). An exchange whose
//    reused connection fails before any response byte (the server closed
//    it while idle) is retried once on a fresh connection. Sockets have
//    TCP_NODELAY: a request is one write and should not wait on Nagle.
//  * The client may be destroyed while exchanges are in flight: they hold
//    its state, and end as they would have (cancel() them to end them).
//  * parse_base_url validates a base URL: http or https, a host, an optional
//    port (1-65535), an optional path prefix; no query, fragment or
//    credentials. Errors (basalt::Error) name `what` (a flag, say).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace basalt {

struct BaseUrl {
  std::string scheme;  // "http" or "https"
  std::string host;
  std::string port;    // always set (80/443 by default)
  std::string prefix;  // path prefix without a trailing '/', maybe empty
};
BaseUrl parse_base_url(const std::string& text, std::string_view what = "the URL");
// Whether this build speaks https.
bool http_client_tls_supported();

enum class HttpFailure { kNone = 0, kConnect, kTimeout, kBroken, kCancelled };
const char* http_failure_name(HttpFailure failure);

struct OutgoingRequest {
  std::string method = "GET";
  std::string path;  // appended to the base URL's prefix; may carry a query
  // Extra headers (Host, Content-Length and the User-Agent are set).
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

struct IncomingHead {
  int status = 0;
  // Names lower-cased, in arrival order.
  std::vector<std::pair<std::string, std::string>> headers;
  // The first header of that (lower-case) name.
  std::optional<std::string_view> header(std::string_view lower_name) const;
};

struct HttpClientOptions {
  double timeout_s = 600;  // per exchange, from send() to the body's end
  bool insecure = false;   // https: no certificate verification
  size_t max_body_bytes = size_t{64} << 20;
  size_t max_idle = 8192;  // idle keep-alive connections kept
  std::string user_agent = "basalt";
};

struct ExchangeCallbacks {
  std::function<void(const IncomingHead&)> on_head;
  std::function<void(std::string_view)> on_data;
  std::function<void(HttpFailure, const std::string& message)> on_done;
};

// A handle on one exchange; cancel() ends it (on_done with kCancelled,
// unless it has ended already). Copyable; harmless after the end.
class ExchangeHandle {
 public:
  ExchangeHandle() = default;
  void cancel() const;
  struct Control;
  explicit ExchangeHandle(std::weak_ptr<Control> control) : control_(std::move(control)) {}

 private:
  std::weak_ptr<Control> control_;
};

class HttpClient {
 public:
  // Resolves the host at once (throws basalt::Error when that fails, or for
  // https in a build without TLS).
  HttpClient(boost::asio::io_context& io, BaseUrl url, HttpClientOptions options = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  ExchangeHandle send(OutgoingRequest request, ExchangeCallbacks callbacks);
  // Closes the idle connections (on the strand).
  void close_idle();
  const BaseUrl& url() const;
  // Connections opened so far (for tests and metrics).
  size_t connections_opened() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace basalt
