// CompletionClient: OpenAI completion exchanges for `basalt bench`, over
// the generic HttpClient (server/http_client.h), which owns the sockets,
// TLS, keep-alive pool and timeouts.
//
// Contract:
//  * Everything runs on the io_context the client is given (the HttpClient's
//    strand on it); one thread drives any number of concurrent streams.
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
//    events as it arrives; each event that carries text counts as one
//    output token and its arrival time is recorded; usage
//    (stream_options.include_usage) is reported when sent.
//  * Idle keep-alive connections are reused (HttpClient's rules).
//  * parse_url validates a base URL (parse_base_url, errors naming
//    --base-url).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/http_client.h"

namespace basalt::loadgen {

using Clock = std::chrono::steady_clock;

using Url = BaseUrl;
Url parse_url(const std::string& text);
inline bool tls_supported() { return http_client_tls_supported(); }

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

class CompletionClient {
 public:
  // Resolves the host at once (throws basalt::Error when that fails or
  // https is asked of a build without TLS).
  CompletionClient(boost::asio::io_context& io, Url url, ClientOptions options);
  ~CompletionClient();
  CompletionClient(const CompletionClient&) = delete;
  CompletionClient& operator=(const CompletionClient&) = delete;

  using Done = std::function<void(ExchangeResult&&)>;
  // path is appended to the URL's prefix; body empty means no body.
  void send(const std::string& method, const std::string& path, std::string body, bool stream, bool keep_text,
            Done done);
  double now_s() const;
  // Sets the epoch that times are measured from.
  void set_epoch(Clock::time_point epoch);
  // Closes idle connections.
  void close_idle();
  // Connections opened so far.
  size_t connections_opened() const { return http_.connections_opened(); }

 private:
  HttpClient http_;
  ClientOptions options_;
};

}  // namespace basalt::loadgen
