// Request checks that `basalt serve` and `basalt route` share: API keys
// (`Authorization: Bearer KEY`), and which client request ids are safe to
// echo.
//
// Contract: bearer_authorized() is true when `keys` is empty, or the
// request's Authorization header is "Bearer " followed by one of them,
// compared in time that does not depend on where they differ. A client id
// (X-Request-Id, a body's request_id) is valid when it is 1-256 printable
// ASCII characters without spaces: safe in a header and a log line.
// read_api_key_file() reads one key per line, skipping blank lines and `#`
// comments, and throws basalt::Error naming the file (and `flag`) when it
// cannot be read or holds no key.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/http_server.h"

namespace basalt {

bool constant_time_equal(std::string_view a, std::string_view b);
bool bearer_authorized(const HttpRequest& request, const std::vector<std::string>& keys);
bool valid_client_id(std::string_view id);
std::vector<std::string> read_api_key_file(const std::string& path, std::string_view flag = "--api-key-file");

}  // namespace basalt
