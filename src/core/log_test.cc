// Log lines: both formats carry the timestamp, level, event and typed fields;
// text values that would break key=value parsing are quoted; JSON lines are
// valid JSON whatever the values hold.
#include "core/log.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace basalt {
namespace {

class LogFormatGuard {
 public:
  explicit LogFormatGuard(LogFormat f) : saved_(log_format()) { set_log_format(f); }
  ~LogFormatGuard() { set_log_format(saved_); }

 private:
  LogFormat saved_;
};

TEST(Log, TextLinesAreKeyValue) {
  LogFormatGuard guard(LogFormat::kText);
  const std::string line = LogLine("request")
                               .add("id", "cmpl-1")
                               .add("status", 200)
                               .add("ttft_s", 0.0125)
                               .add("stream", true)
                               .add("path", "/v1/a b")
                               .add("empty", "")
                               .render("2026-12-01T10:00:00.000Z");
  EXPECT_EQ(line,
            "2026-12-01T10:00:00.000Z info request id=cmpl-1 status=200 ttft_s=0.0125 stream=true "
            "path=\"/v1/a b\" empty=\"\"");
}

TEST(Log, JsonLinesAreObjects) {
  LogFormatGuard guard(LogFormat::kJson);
  const std::string line = LogLine("cut", LogLevel::kWarning)
                               .add("msg", "a \"quote\"\n\x01")
                               .add("n", uint64_t{7})
                               .add("x", -3)
                               .render("T");
  EXPECT_EQ(line, R"({"ts":"T","level":"warning","event":"cut","msg":"a \"quote\"\n\u0001","n":7,"x":-3})");
}

TEST(Log, TimestampsAreUtcIso8601WithMilliseconds) {
  const std::string ts = log_timestamp();
  ASSERT_EQ(ts.size(), 24u) << ts;
  EXPECT_EQ(ts[4], '-');
  EXPECT_EQ(ts[10], 'T');
  EXPECT_EQ(ts[19], '.');
  EXPECT_EQ(ts.back(), 'Z');
}

TEST(Log, EmitWritesOneLineToTheSink) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  set_log_sink(f);
  LogLine("hello").add("k", 1).emit();
  set_log_sink(nullptr);
  std::rewind(f);
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string text(buf, n);
  EXPECT_NE(text.find(" info hello k=1\n"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
}

TEST(Log, FormatNames) {
  EXPECT_EQ(parse_log_format("json"), LogFormat::kJson);
  EXPECT_EQ(parse_log_format("text"), LogFormat::kText);
  EXPECT_THROW(parse_log_format("xml"), Error);
}

}  // namespace
}  // namespace basalt
