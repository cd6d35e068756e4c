// PrometheusReader: the Prometheus text exposition format (0.0.4) read
// back, for what the gateway learns from its replicas' /metrics
// (router/replica_metrics.h). The writer is server/prometheus_text.h.
//
// Contract: read_prometheus_text() reads `name{label="value",...} value
// [timestamp]` lines (label values unescaped: \\, \", \n); `#` lines and
// blank ones are skipped. A line that does not follow the format is counted
// in bad_lines and skipped; nothing in the text can make it throw, or read
// past the text. At most max_samples samples are kept. Values are doubles
// as the format writes them, NaN and ±Inf included; the timestamp, when
// present, must be an integer and is not kept.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "server/prometheus_text.h"

namespace basalt::router {

struct PrometheusSample {
  std::string name;
  PrometheusLabels labels;
  double value = 0;
};

struct PrometheusRead {
  std::vector<PrometheusSample> samples;
  size_t bad_lines = 0;
};

PrometheusRead read_prometheus_text(std::string_view text, size_t max_samples = 100000);

}  // namespace basalt::router
