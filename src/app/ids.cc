#include <cstdio>
#include <charconv>

#include "app/commands.h"
#include "core/error.h"

namespace basalt {

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t i = 0;
  const size_t n = text.size();
  auto skip_spaces = [&] {
    while (i < n && (text[i] == ' ' || text[i] == '\t')) ++i;
  };
  skip_spaces();
  if (i == n) return ids;
  for (;;) {
    skip_spaces();
    int32_t value = 0;
    auto [end, ec] = std::from_chars(text.data() + i, text.data() + n, value);
    BASALT_CHECK(ec == std::errc() && end != text.data() + i,
                 "{} must be a comma-separated list of integers, got '{}'", flag, text);
    BASALT_CHECK(value >= 0, "{}: token ids must be non-negative, got {}", flag, value);
    ids.push_back(value);
    i = static_cast<size_t>(end - text.data());
    skip_spaces();
    if (i == n) break;
    BASALT_CHECK(text[i] == ',', "{} must be a comma-separated list of integers, got '{}'", flag, text);
    ++i;
  }
  return ids;
}

std::string read_text_file(const std::string& path, const char* flag) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  BASALT_CHECK(file != nullptr, "{}: cannot open '{}'", flag, path);
  std::string content;
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) content.append(buffer, n);
  std::fclose(file);
  return content;
}

}  // namespace basalt
