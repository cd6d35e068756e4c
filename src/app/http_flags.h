// The HTTP flags `basalt serve` and `basalt route` share: where to listen,
// TLS, API keys, CORS origins, the transport's limits and timeouts, and the
// log format. add_http_flags() registers them; http_server_options() and
// api_keys() check them (basalt::Error naming the flag) and build what the
// transport and the request handlers take.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/http_server.h"

namespace basalt {

struct HttpFlags {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::vector<std::string> allowed_origins;
  std::string tls_cert;
  std::string tls_key;
  size_t max_body_bytes = 8u << 20;
  double request_timeout = 30;
  double idle_timeout = 60;
  double write_timeout = 30;
  size_t max_connections = 4096;
  int io_threads = 2;
  std::string io_model = "shared";
  std::string log_format = "text";
  bool no_request_log = false;
};

// The defaults are f's values (a command may change them first).
void add_http_flags(CLI::App& cmd, HttpFlags& f);
// Also sets the log format.
HttpServerOptions http_server_options(const HttpFlags& f);
// --api-key and the keys of --api-key-file.
std::vector<std::string> api_keys(const HttpFlags& f);
// "http" or "https", as the flags make the server listen.
std::string http_scheme(const HttpFlags& f);
// Lifts the open-file limit to the hard one (core/file_limit.h) and logs a
// warning when that is still short of --max-connections connections holding
// `per_connection` descriptors each (a gateway's stream holds two: its
// client's and its replica's), and sizes the descriptor table for that many
// (or the limit) at once. Returns the limit in force.
uint64_t raise_file_limit_for_connections(const HttpFlags& f, int per_connection);

}  // namespace basalt
