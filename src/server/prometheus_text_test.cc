// PrometheusText: the exact exposition text of families, labelled samples
// and histograms, with label values escaped.
#include "server/prometheus_text.h"

#include <gtest/gtest.h>

#include <array>

#include "core/error.h"

namespace basalt {
namespace {

TEST(PrometheusText, FamiliesSamplesAndCommonLabels) {
  PrometheusText text(PrometheusLabels{{"model_name", "m"}});
  text.gauge("up", "Whether it is up.", 1);
  text.family("requests_total", "counter", "Requests, by replica.");
  text.sample("requests_total", 3, {{"replica", "http://a:1"}, {"status", "200"}});
  text.sample("requests_total", 0.5, {{"replica", "http://b:2"}, {"status", "503"}});
  EXPECT_EQ(text.take(),
            "# HELP up Whether it is up.\n# TYPE up gauge\nup{model_name=\"m\"} 1\n"
            "# HELP requests_total Requests, by replica.\n# TYPE requests_total counter\n"
            "requests_total{model_name=\"m\",replica=\"http://a:1\",status=\"200\"} 3\n"
            "requests_total{model_name=\"m\",replica=\"http://b:2\",status=\"503\"} 0.5\n");
}

TEST(PrometheusText, NoLabelsWritesTheBareName) {
  PrometheusText text;
  text.counter("ticks_total", "Ticks.", 12);
  text.sample("ticks_total", 1e-4);
  EXPECT_EQ(text.take(), "# HELP ticks_total Ticks.\n# TYPE ticks_total counter\nticks_total 12\nticks_total 0.0001\n");
}

TEST(PrometheusText, LabelValuesAreEscaped) {
  EXPECT_EQ(prometheus_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  PrometheusText text(PrometheusLabels{{"model_name", "x\"y"}});
  text.sample("s", 2, {{"tenant", "t\n1"}});
  EXPECT_EQ(text.take(), "s{model_name=\"x\\\"y\",tenant=\"t\\n1\"} 2\n");
}

TEST(PrometheusText, HistogramsAreCumulativeWithInfSumAndCount) {
  PrometheusText text;
  const std::array<double, 3> bounds = {0.1, 1, 10};
  const std::array<uint64_t, 3> counts = {2, 0, 3};
  text.histogram("latency_seconds", "Latency.", bounds, counts, 6, 42.5);
  text.histogram_samples("latency_seconds", bounds, counts, 5, 7, {{"replica", "r"}});
  EXPECT_EQ(text.take(),
            "# HELP latency_seconds Latency.\n# TYPE latency_seconds histogram\n"
            "latency_seconds_bucket{le=\"0.1\"} 2\nlatency_seconds_bucket{le=\"1\"} 2\n"
            "latency_seconds_bucket{le=\"10\"} 5\nlatency_seconds_bucket{le=\"+Inf\"} 6\n"
            "latency_seconds_sum 42.5\nlatency_seconds_count 6\n"
            "latency_seconds_bucket{replica=\"r\",le=\"0.1\"} 2\nlatency_seconds_bucket{replica=\"r\",le=\"1\"} 2\n"
            "latency_seconds_bucket{replica=\"r\",le=\"10\"} 5\nlatency_seconds_bucket{replica=\"r\",le=\"+Inf\"} 5\n"
            "latency_seconds_sum{replica=\"r\"} 7\nlatency_seconds_count{replica=\"r\"} 5\n");
  const std::array<uint64_t, 2> short_counts = {1, 1};
  EXPECT_THROW(text.histogram_samples("h", bounds, short_counts, 2, 1), Error);
}

}  // namespace
}  // namespace basalt
