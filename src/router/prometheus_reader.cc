#include "router/prometheus_reader.h"

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>

namespace basalt::router {
namespace {

bool name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }

// A cursor over one line; every read checks the end.
struct LineReader {
  std::string_view line;
  size_t at = 0;

  bool end() const { return at >= line.size(); }
  char peek() const { return end() ? '\0' : line[at]; }
  size_t skip_spaces() {
    const size_t from = at;
    while (!end() && (line[at] == ' ' || line[at] == '\t')) ++at;
    return at - from;
  }
  // A metric name, or a label name (no ':').
  std::optional<std::string> name(bool label) {
    const size_t from = at;
    if (end() || !name_start(line[at]) || (label && line[at] == ':')) return std::nullopt;
    while (!end() && name_char(line[at]) && !(label && line[at] == ':')) ++at;
    return std::string(line.substr(from, at - from));
  }
  // A quoted label value with the format's escapes (\\, \", \n).
  std::optional<std::string> quoted() {
    if (peek() != '"') return std::nullopt;
    ++at;
    std::string out;
    while (!end()) {
      const char c = line[at++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (end()) return std::nullopt;
      const char e = line[at++];
      if (e == 'n')
        out += '\n';
      else if (e == '\\' || e == '"')
        out += e;
      else
        return std::nullopt;
    }
    return std::nullopt;  // no closing quote
  }
  std::string_view token() {
    const size_t from = at;
    while (!end() && line[at] != ' ' && line[at] != '\t') ++at;
    return line.substr(from, at - from);
  }
};

std::optional<double> parse_value(std::string_view text) {
  if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (text == "+Inf" || text == "Inf") return std::numeric_limits<double>::infinity();
  if (text == "-Inf") return -std::numeric_limits<double>::infinity();
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  if (text.empty()) return std::nullopt;
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<PrometheusSample> parse_sample(std::string_view line) {
  constexpr size_t kMaxLabels = 64;
  LineReader r{line};
  PrometheusSample s;
  auto name = r.name(false);
  if (!name) return std::nullopt;
  s.name = std::move(*name);
  if (r.peek() == '{') {
    ++r.at;
    while (true) {
      r.skip_spaces();
      if (r.peek() == '}') {
        ++r.at;
        break;
      }
      auto label = r.name(true);
      if (!label) return std::nullopt;
      r.skip_spaces();
      if (r.peek() != '=') return std::nullopt;
      ++r.at;
      r.skip_spaces();
      auto value = r.quoted();
      if (!value || s.labels.size() >= kMaxLabels) return std::nullopt;
      s.labels.emplace_back(std::move(*label), std::move(*value));
      r.skip_spaces();
      if (r.peek() == ',') {
        ++r.at;
      } else if (r.peek() != '}') {
        return std::nullopt;
      }
    }
  }
  if (r.skip_spaces() == 0) return std::nullopt;
  const auto value = parse_value(r.token());
  if (!value) return std::nullopt;
  s.value = *value;
  if (r.skip_spaces() > 0 && !r.end()) {
    // A timestamp: an integer (milliseconds), read and not used.
    const std::string_view ts = r.token();
    int64_t ms = 0;
    const auto [end, ec] = std::from_chars(ts.data(), ts.data() + ts.size(), ms);
    if (ec != std::errc() || end != ts.data() + ts.size()) return std::nullopt;
    r.skip_spaces();
  }
  if (!r.end()) return std::nullopt;
  return s;
}

}  // namespace

PrometheusRead read_prometheus_text(std::string_view text, size_t max_samples) {
  PrometheusRead out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (line.empty() || line.front() == '#') continue;
    auto sample = parse_sample(line);
    if (!sample) {
      ++out.bad_lines;
      continue;
    }
    if (out.samples.size() >= max_samples) break;
    out.samples.push_back(std::move(*sample));
  }
  return out;
}

}  // namespace basalt::router
