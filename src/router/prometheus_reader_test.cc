// The Prometheus text reader: the format's corners, malformed lines one by
// one, random bytes, and every prefix of a replica's own text.
#include "router/prometheus_reader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "server/metrics_text.h"

namespace basalt::router {
namespace {

TEST(PrometheusText, ReadsTheFormatsCorners) {
  const PrometheusRead read = read_prometheus_text(
      "# HELP x help\r\n"
      "  a 1\n"
      "b{} +Inf\n"
      "c{l=\"a\\\\b\\nc\",m = \"\", } -2.5e3 1700000000000\n"
      "d NaN\n"
      "e:f_g 0x10\n"  // from_chars without a prefix: not a number here
      "vllm:num_requests_waiting{model_name=\"m\"} 4\n");
  ASSERT_EQ(read.samples.size(), 5u);
  EXPECT_EQ(read.bad_lines, 1u);
  EXPECT_EQ(read.samples[0].name, "a");
  EXPECT_TRUE(std::isinf(read.samples[1].value));
  EXPECT_EQ(read.samples[2].value, -2500);
  ASSERT_EQ(read.samples[2].labels.size(), 2u);
  EXPECT_EQ(read.samples[2].labels[0].second, "a\\b\nc");
  EXPECT_TRUE(std::isnan(read.samples[3].value));
  EXPECT_EQ(read.samples[4].name, "vllm:num_requests_waiting");
}

TEST(PrometheusText, GarbageIsCountedAndSkippedNeverRead) {
  const char* bad[] = {"1abc 1",
                       "a",
                       "a{",
                       "a{l=\"x} 1",
                       "a{l=x} 1",
                       "a{l=\"x\"",
                       "a{l=\"\\q\"} 1",
                       "a{l=\"x\"}1",
                       "a 1 2 3",
                       "a 1 notime",
                       "a{:l=\"x\"} 1",
                       "a{l=\"x\" m=\"y\"} 1",
                       "a - ",
                       "a 1e999999",
                       "{} 1",
                       "a{l=\"x\\",
                       "a \xff"};
  for (const char* line : bad) {
    const PrometheusRead read = read_prometheus_text(std::string(line) + "\nok 1\n");
    EXPECT_EQ(read.samples.size(), 1u) << line;
    EXPECT_EQ(read.bad_lines, 1u) << line;
  }
  // Random bytes, and every prefix of a replica's text: no crash, no
  // sample past the text.
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string noise(rng() % 400, ' ');
    for (char& c : noise) c = static_cast<char>(rng() % 256);
    read_prometheus_text(noise);
  }
  MetricsInput in;
  in.model_name = "m";
  const std::string text = render_metrics(in);  // what a replica writes
  for (size_t n = 0; n <= text.size(); ++n) {
    const PrometheusRead prefix = read_prometheus_text(std::string_view(text).substr(0, n));
    EXPECT_LE(prefix.bad_lines, 1u) << n;  // at most the cut line
  }
  EXPECT_EQ(read_prometheus_text(text).bad_lines, 0u);
  EXPECT_EQ(read_prometheus_text(text, 4).samples.size(), 4u);  // the sample bound
}

}  // namespace
}  // namespace basalt::router
