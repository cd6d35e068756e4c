#include "app/http_flags.h"

#include <algorithm>
#include <chrono>
#include <fmt/format.h>

#include "core/error.h"
#include "core/file_limit.h"
#include "core/log.h"
#include "server/http_auth.h"

namespace basalt {
namespace {

std::chrono::milliseconds millis(double seconds, const char* flag) {
  BASALT_CHECK(seconds > 0 && seconds < 1e7, "{} must be positive seconds, got {}", flag, seconds);
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

}  // namespace

void add_http_flags(CLI::App& cmd, HttpFlags& f) {
  cmd.add_option("--host", f.host, "Address to listen on (default 127.0.0.1; 0.0.0.0 for all)");
  cmd.add_option("--port", f.port, "TCP port (default 8000; 0: any free port)");
  cmd.add_option("--api-key", f.api_keys, "Require this API key as 'Authorization: Bearer KEY' (repeatable)");
  cmd.add_option("--api-key-file", f.api_key_file, "Read API keys from this file, one per line ('#' comments)");
  cmd.add_option("--allowed-origins", f.allowed_origins,
                 "Let browser pages from these origins call the API (CORS), e.g. https://app.example.com, or * "
                 "for any; repeatable or comma-separated (default: none)")
      ->delimiter(',');
  cmd.add_option("--tls-cert", f.tls_cert, "PEM certificate chain: serve HTTPS (needs --tls-key)");
  cmd.add_option("--tls-key", f.tls_key, "PEM private key for --tls-cert");
  cmd.add_option("--max-body-bytes", f.max_body_bytes, "Largest request body; bigger gets 413 (default 8388608)");
  cmd.add_option("--request-timeout", f.request_timeout, "Seconds for a client to send a whole request (default 30)");
  cmd.add_option("--idle-timeout", f.idle_timeout, "Seconds a kept-alive connection may idle (default 60)");
  cmd.add_option("--write-timeout", f.write_timeout,
                 "Seconds a response write may stall before the client is dropped (default 30)");
  cmd.add_option("--max-connections", f.max_connections,
                 fmt::format("Open connections at most; more get 503 (default {})", f.max_connections));
  cmd.add_option("--io-threads", f.io_threads, "Threads running the HTTP connections (default 2)");
  cmd.add_option("--io-model", f.io_model,
                 "How the --io-threads share the connections: shared (one event loop all of them run) or "
                 "per-thread (an event loop per thread, each connection kept on one) (default shared)");
  cmd.add_option("--log-format", f.log_format,
                 "Log lines as text (timestamp, level, event, key=value fields) or json (one object per line) "
                 "(default text)");
  cmd.add_flag("--no-request-log", f.no_request_log, "Do not log one line per request");
}

HttpServerOptions http_server_options(const HttpFlags& f) {
  set_log_format(parse_log_format(f.log_format));
  BASALT_CHECK(f.port >= 0 && f.port <= 65535, "--port {} is not a TCP port", f.port);
  BASALT_CHECK(f.io_threads >= 1 && f.io_threads <= 64, "--io-threads must be in [1, 64]");
  HttpServerOptions http;
  http.host = f.host;
  http.port = static_cast<uint16_t>(f.port);
  http.io_threads = f.io_threads;
  BASALT_CHECK(f.io_model == "shared" || f.io_model == "per-thread", "--io-model must be shared or per-thread, got {}",
               f.io_model);
  http.io_model = f.io_model == "per-thread" ? IoModel::kPerThread : IoModel::kShared;
  http.max_body_bytes = f.max_body_bytes;
  http.request_timeout = millis(f.request_timeout, "--request-timeout");
  http.idle_timeout = millis(f.idle_timeout, "--idle-timeout");
  http.write_timeout = millis(f.write_timeout, "--write-timeout");
  http.max_connections = f.max_connections;
  http.tls_cert_file = f.tls_cert;
  http.tls_key_file = f.tls_key;
  for (const std::string& origin : f.allowed_origins) {
    // An origin is scheme://host[:port], as browsers send it; a path or a
    // trailing slash would never match.
    BASALT_CHECK(origin == "*" || ((origin.rfind("http://", 0) == 0 || origin.rfind("https://", 0) == 0) &&
                                   origin.find('/', origin.find("//") + 2) == std::string::npos),
                 "--allowed-origins {}: give origins as scheme://host[:port] (no path), or *", origin);
  }
  http.allowed_origins = f.allowed_origins;
  return http;
}

std::vector<std::string> api_keys(const HttpFlags& f) {
  std::vector<std::string> keys = f.api_keys;
  if (!f.api_key_file.empty())
    for (std::string& k : read_api_key_file(f.api_key_file)) keys.push_back(std::move(k));
  for (const std::string& k : keys) BASALT_CHECK(!k.empty(), "API keys must not be empty");
  return keys;
}

std::string http_scheme(const HttpFlags& f) { return f.tls_cert.empty() ? "http" : "https"; }

uint64_t raise_file_limit_for_connections(const HttpFlags& f, int per_connection) {
  const uint64_t limit = raise_open_file_limit();
  // Beside the connections: the listening socket, logs, model files, the
  // probes of a gateway; 64 is plenty.
  const uint64_t needed = static_cast<uint64_t>(f.max_connections) * static_cast<uint64_t>(per_connection) + 64;
  if (limit < needed)
    LogLine("open_files", LogLevel::kWarning)
        .add("limit", limit)
        .add("needed", needed)
        .add("max_connections", static_cast<uint64_t>(f.max_connections))
        .add("hint", "raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower --max-connections")
        .emit();
  // The table sized now, not one doubling at a time under load
  // (core/file_limit.h says what each doubling costs).
  reserve_descriptor_table(std::min(limit, needed));
  return limit;
}

}  // namespace basalt
