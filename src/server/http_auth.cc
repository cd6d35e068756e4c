#include "server/http_auth.h"

#include <algorithm>
#include <fstream>

#include "core/error.h"

namespace basalt {

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool bearer_authorized(const HttpRequest& request, const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  const std::optional<std::string_view> header = request.header("authorization");
  if (!header) return false;
  std::string_view value = *header;
  constexpr std::string_view kBearer = "Bearer ";
  if (value.size() < kBearer.size() || value.substr(0, kBearer.size()) != kBearer) return false;
  value.remove_prefix(kBearer.size());
  bool ok = false;
  for (const std::string& key : keys) ok |= constant_time_equal(value, key);
  return ok;
}

bool valid_client_id(std::string_view id) {
  if (id.empty() || id.size() > 256) return false;
  for (unsigned char ch : id)
    if (ch < 0x21 || ch > 0x7e) return false;
  return true;
}

std::vector<std::string> read_api_key_file(const std::string& path, std::string_view flag) {
  std::ifstream in(path);
  BASALT_CHECK(in.good(), "{} {}: cannot read it", flag, path);
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    keys.push_back(line.substr(start));
  }
  BASALT_CHECK(!keys.empty(), "{} {}: no keys in it (one per line)", flag, path);
  return keys;
}

}  // namespace basalt
