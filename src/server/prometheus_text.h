// PrometheusText: a writer of the Prometheus text exposition format
// (version 0.0.4): metric families with their HELP and TYPE lines, samples
// with label sets, and histograms from per-bucket counts. A replica's
// /metrics (server/metrics_text.h) is written with it, and so is the
// gateway's, whose families carry a replica or tenant label per sample.
//
// Contract: label values are escaped as the format asks (backslash, double
// quote, newline); names and HELP text are the caller's and are written as
// given. Labels given at construction come first on every sample. Numbers
// are written in the shortest form that reads back to the same double.
// family() writes HELP and TYPE; the samples of that family follow it, as
// the format requires, before the next family() call.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace basalt {

using PrometheusLabels = std::vector<std::pair<std::string, std::string>>;

// A label value as the format writes it between double quotes.
std::string prometheus_escape(std::string_view value);

class PrometheusText {
 public:
  explicit PrometheusText(PrometheusLabels common = {});

  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, double value, const PrometheusLabels& labels = {});

  // A family of one sample.
  void gauge(std::string_view name, std::string_view help, double value);
  void counter(std::string_view name, std::string_view help, double value);

  // A histogram's samples (its family written before): `counts[i]` values
  // fell at or below `bounds[i]` and above the bound before; `count` is
  // every value (those past the last bound too), `sum` their sum.
  void histogram_samples(std::string_view name, std::span<const double> bounds, std::span<const uint64_t> counts,
                         uint64_t count, double sum, const PrometheusLabels& labels = {});
  // A family of one histogram.
  void histogram(std::string_view name, std::string_view help, std::span<const double> bounds,
                 std::span<const uint64_t> counts, uint64_t count, double sum);

  std::string take() { return std::move(out_); }

 private:
  // "{common,labels}" (with `extra` last, already written), or "" when
  // there are none.
  std::string label_set(const PrometheusLabels& labels, std::string_view extra = {}) const;

  std::string common_;  // the common labels, written once
  std::string out_;
};

}  // namespace basalt
