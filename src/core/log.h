// Log lines for the long-running commands (`basalt serve`): one event per
// line on stderr, with a UTC timestamp, a level, an event name and typed
// key-value fields, as text or as JSON (one object per line, for log
// collectors).
//
//   2026-12-01T10:42:07.123Z info request id=cmpl-1 status=200 ttft_s=0.0123
//   {"ts":"2026-12-01T10:42:07.123Z","level":"info","event":"request","id":"cmpl-1","status":200,"ttft_s":0.0123}
//
// Contract: LogLine collects fields and writes the whole line in one call
// under a process-wide lock, so lines from different threads never
// interleave. Text values with spaces, quotes or control characters are
// quoted JSON strings in the text format; numbers are written as numbers.
// The format and the sink (stderr unless a test redirects it) are
// process-wide settings.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace basalt {

enum class LogFormat { kText, kJson };
enum class LogLevel { kInfo, kWarning, kError };

void set_log_format(LogFormat format);
LogFormat log_format();
// "text" or "json"; throws basalt::Error for anything else.
LogFormat parse_log_format(std::string_view name);
// Where lines go (default stderr); tests pass a temporary file.
void set_log_sink(std::FILE* sink);

class LogLine {
 public:
  explicit LogLine(std::string_view event, LogLevel level = LogLevel::kInfo);
  LogLine& add(std::string_view key, std::string_view value);
  LogLine& add(std::string_view key, const char* value) { return add(key, std::string_view(value)); }
  LogLine& add(std::string_view key, const std::string& value) { return add(key, std::string_view(value)); }
  LogLine& add(std::string_view key, int64_t value);
  LogLine& add(std::string_view key, int value) { return add(key, static_cast<int64_t>(value)); }
  LogLine& add(std::string_view key, uint64_t value);
  LogLine& add(std::string_view key, double value);
  LogLine& add(std::string_view key, bool value);
  // The line as it would be written (no newline), with the given timestamp.
  std::string render(std::string_view timestamp) const;
  // Writes the line with the current time.
  void emit() const;

 private:
  using Value = std::variant<std::string, int64_t, uint64_t, double, bool>;
  std::string event_;
  LogLevel level_;
  std::vector<std::pair<std::string, Value>> fields_;
};

// "2026-12-01T10:42:07.123Z" for now.
std::string log_timestamp();

}  // namespace basalt
