#include "server/prometheus_text.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace basalt {
namespace {

// Prometheus spells the non-finite values +Inf, -Inf and NaN.
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

void append_labels(std::string& out, const PrometheusLabels& labels) {
  for (const auto& [key, value] : labels) {
    if (!out.empty()) out += ',';
    out += key;
    out += "=\"";
    out += prometheus_escape(value);
    out += '"';
  }
}

}  // namespace

std::string prometheus_escape(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}

PrometheusText::PrometheusText(PrometheusLabels common) { append_labels(common_, common); }

std::string PrometheusText::label_set(const PrometheusLabels& labels, std::string_view extra) const {
  std::string inner = common_;
  append_labels(inner, labels);
  if (!extra.empty()) {
    if (!inner.empty()) inner += ',';
    inner += extra;
  }
  return inner.empty() ? std::string() : "{" + inner + "}";
}

void PrometheusText::family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void PrometheusText::sample(std::string_view name, double value, const PrometheusLabels& labels) {
  out_ += fmt::format("{}{} {}\n", name, label_set(labels), number(value));
}

void PrometheusText::gauge(std::string_view name, std::string_view help, double value) {
  family(name, "gauge", help);
  sample(name, value);
}

void PrometheusText::counter(std::string_view name, std::string_view help, double value) {
  family(name, "counter", help);
  sample(name, value);
}

void PrometheusText::histogram_samples(std::string_view name, std::span<const double> bounds,
                                       std::span<const uint64_t> counts, uint64_t count, double sum,
                                       const PrometheusLabels& labels) {
  BASALT_CHECK(bounds.size() == counts.size(), "prometheus: {} bucket counts for {} bounds", counts.size(),
               bounds.size());
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += counts[i];
    out_ += fmt::format("{}_bucket{} {}\n", name, label_set(labels, "le=\"" + number(bounds[i]) + "\""), cumulative);
  }
  out_ += fmt::format("{}_bucket{} {}\n", name, label_set(labels, "le=\"+Inf\""), count);
  out_ += fmt::format("{}_sum{} {}\n", name, label_set(labels), number(sum));
  out_ += fmt::format("{}_count{} {}\n", name, label_set(labels), count);
}

void PrometheusText::histogram(std::string_view name, std::string_view help, std::span<const double> bounds,
                               std::span<const uint64_t> counts, uint64_t count, double sum) {
  family(name, "histogram", help);
  histogram_samples(name, bounds, counts, count, sum);
}

}  // namespace basalt
