// HttpClient: the asynchronous HTTP/1.1 client under `basalt bench`
// (Boost.Asio sockets, Boost.Beast's response parser, TLS through OpenSSL
// when the build has it).
//
// Contract:
//  * Everything runs on the io_context the client is given; the client
//    starts no threads and holds no thread per request, so one thread drives
//    any number of concurrent streams. Calls must come from that thread (or
//    before it runs).
//  * send() performs one request and calls `done` exactly once, on the
//    io_context, with an ExchangeResult. It never throws for anything the
//    network or the server does; every failure is classified:
//      kConnect     resolving, connecting, the TLS handshake, or the
//                   connection closing before any response byte;
//      kTimeout     the whole exchange took longer than the timeout;
//      kHttpStatus  a status other than 200 (its body, cut to 512 bytes, is
//                   kept in body);
//      kStream      the response broke off or did not parse as HTTP after
//                   its first byte, an event line was over 16 MiB,
//                   an event was not a valid chunk, the server sent an
//                   error event, or a stream ended without `data: [DONE]`.
//  * For a streamed request (stream = true) the body is read as server-sent
//    events: a chunked body as each chunk arrives (what Basalt, vLLM and
//    SGLang send), any other body when it ends; each event that carries text
//    counts as one output token and its arrival time is recorded; usage
//    (stream_options.include_usage) is reported when sent.
//  * Idle keep-alive connections are reused. A request whose reused
//    connection fails before any response byte (the server closed it while
//    idle) is retried once on a fresh connection.
//  * parse_url validates a base URL: http or https, a host, an optional
//    port (1-65535), an optional path prefix; no query or fragment. Throws
//    basalt::Error naming the problem.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace basalt::loadgen {

using Clock = std::chrono::steady_clock;

struct Url {
  std::string scheme;  // "http" or "https"
  std::string host;
  std::string port;    // always set (80/443 by default)
  std::string prefix;  // path prefix without a trailing '/', maybe empty
};

Url parse_url(const std::string& text);
bool tls_supported();

enum class ErrorKind { kNone = 0, kConnect, kHttpStatus, kTimeout, kStream };
const char* error_kind_name(ErrorKind kind);

struct ExchangeResult {
  ErrorKind error = ErrorKind::kNone;
  std::string error_message;
  int http_status = 0;
  // Seconds since the client's epoch.
  double sent_s = 0;
  double first_token_s = -1;
  double end_s = 0;
  std::vector<double> token_times;  // one per text-carrying event
  int64_t chunk_tokens = 0;
  int64_t usage_completion_tokens = -1;
  int64_t usage_prompt_tokens = -1;
  std::string text;  // the streamed text, when keep_text
  std::string body;  // a non-streamed body, or an error body (cut)
};

struct ClientOptions {
  std::string api_key;     // empty: no Authorization header
  double timeout_s = 600;  // per exchange
  bool insecure = false;   // https: skip certificate verification
  Clock::time_point epoch = Clock::now();
};

class HttpClient {
 public:
  // Resolves the host at once (throws basalt::Error when that fails or
  // https is asked of a build without TLS).
  HttpClient(boost::asio::io_context& io, Url url, ClientOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  using Done = std::function<void(ExchangeResult&&)>;
  // path is appended to the URL's prefix; body empty means no body.
  void send(const std::string& method, const std::string& path, std::string body, bool stream, bool keep_text,
            Done done);
  double now_s() const;
  // Sets the epoch that times are measured from.
  void set_epoch(Clock::time_point epoch);
  // Closes idle connections.
  void close_idle();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace basalt::loadgen
