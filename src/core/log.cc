#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fmt/format.h>
#include <mutex>

#include "core/error.h"

namespace basalt {
namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};
std::mutex g_mu;
std::FILE* g_sink = nullptr;  // null: stderr

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}

// A JSON string literal (control characters escaped, UTF-8 passed through).
void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

bool needs_quotes(std::string_view s) {
  if (s.empty()) return true;
  for (unsigned char c : s)
    if (c <= 0x20 || c == '"' || c == '\\' || c == '=' || c == 0x7f) return true;
  return false;
}

}  // namespace

void set_log_format(LogFormat format) { g_format.store(format); }
LogFormat log_format() { return g_format.load(); }

LogFormat parse_log_format(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  fail("--log-format must be text or json, not '{}'", name);
}

void set_log_sink(std::FILE* sink) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_sink = sink;
}

std::string log_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &utc);
  return fmt::format("{}.{:03d}Z", buf, static_cast<int>(millis));
}

LogLine::LogLine(std::string_view event, LogLevel level) : event_(event), level_(level) {}

LogLine& LogLine::add(std::string_view key, std::string_view value) {
  fields_.emplace_back(std::string(key), std::string(value));
  return *this;
}
LogLine& LogLine::add(std::string_view key, int64_t value) {
  fields_.emplace_back(std::string(key), value);
  return *this;
}
LogLine& LogLine::add(std::string_view key, uint64_t value) {
  fields_.emplace_back(std::string(key), value);
  return *this;
}
LogLine& LogLine::add(std::string_view key, double value) {
  fields_.emplace_back(std::string(key), value);
  return *this;
}
LogLine& LogLine::add(std::string_view key, bool value) {
  fields_.emplace_back(std::string(key), value);
  return *this;
}

std::string LogLine::render(std::string_view timestamp) const {
  const bool json = log_format() == LogFormat::kJson;
  std::string out;
  if (json) {
    out += "{\"ts\":";
    append_json_string(out, timestamp);
    out += ",\"level\":";
    append_json_string(out, level_name(level_));
    out += ",\"event\":";
    append_json_string(out, event_);
  } else {
    out += timestamp;
    out += ' ';
    out += level_name(level_);
    out += ' ';
    out += event_;
  }
  for (const auto& [key, value] : fields_) {
    if (json) {
      out += ',';
      append_json_string(out, key);
      out += ':';
    } else {
      out += ' ';
      out += key;
      out += '=';
    }
    if (const auto* s = std::get_if<std::string>(&value)) {
      if (json || needs_quotes(*s)) append_json_string(out, *s);
      else out += *s;
    } else if (const auto* i = std::get_if<int64_t>(&value)) {
      out += std::to_string(*i);
    } else if (const auto* u = std::get_if<uint64_t>(&value)) {
      out += std::to_string(*u);
    } else if (const auto* d = std::get_if<double>(&value)) {
      if (std::isfinite(*d)) out += fmt::format("{:.6g}", *d);
      else out += json ? "null" : "nan";
    } else {
      out += std::get<bool>(value) ? "true" : "false";
    }
  }
  if (json) out += '}';
  return out;
}

void LogLine::emit() const {
  const std::string line = render(log_timestamp()) + "\n";
  std::lock_guard<std::mutex> lock(g_mu);
  std::FILE* sink = g_sink != nullptr ? g_sink : stderr;
  std::fwrite(line.data(), 1, line.size(), sink);
  std::fflush(sink);
}

}  // namespace basalt
