#include "loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace basalt::loadgen {

double percentile(const std::vector<double>& sorted, double p) {
  BASALT_CHECK(p >= 0 && p <= 100, "percentile {} is outside [0, 100]", p);
  if (sorted.empty()) return 0;
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Summary summarize(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = static_cast<int64_t>(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  s.min = values.front();
  s.max = values.back();
  s.median = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p95 = percentile(values, 95);
  s.p99 = percentile(values, 99);
  return s;
}

bool meets_slo(const RequestLatency& r, const SloLimits& slo) {
  if (slo.ttft_ms > 0 && r.ttft_ms > slo.ttft_ms) return false;
  if (slo.tpot_ms > 0 && r.tpot_ms > slo.tpot_ms) return false;
  return true;
}

int64_t count_good(const std::vector<RequestLatency>& requests, const SloLimits& slo) {
  int64_t good = 0;
  for (const RequestLatency& r : requests) good += meets_slo(r, slo) ? 1 : 0;
  return good;
}

double time_per_output_token_ms(double e2e_ms, double ttft_ms, int64_t output_tokens) {
  if (output_tokens <= 1) return 0;
  return std::max(0.0, e2e_ms - ttft_ms) / static_cast<double>(output_tokens - 1);
}

}  // namespace basalt::loadgen
