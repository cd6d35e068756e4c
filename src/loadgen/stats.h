// Statistics for load-test results: percentiles, summaries and goodput.
//
// Contract:
//  * percentile(sorted, p) takes values sorted ascending and p in [0, 100]
//    and interpolates linearly between the two closest ranks (numpy's
//    default "linear" method: rank = p/100 * (n-1)). An empty input gives 0;
//    p outside [0, 100] throws basalt::Error.
//  * summarize(values) sorts a copy and reports count, mean, min, median
//    (p50), p90, p95, p99 and max; all zero for an empty input.
//  * Goodput counts requests that succeeded and met every SLO that is set
//    (a limit <= 0 means "not set"): TTFT <= slo_ttft_ms and TPOT <=
//    slo_tpot_ms. TPOT of a request with one output token or fewer is 0
//    (it has no decode phase), so it meets any TPOT SLO.
#pragma once

#include <cstdint>
#include <vector>

namespace basalt::loadgen {

double percentile(const std::vector<double>& sorted, double p);

struct Summary {
  int64_t count = 0;
  double mean = 0, min = 0, median = 0, p90 = 0, p95 = 0, p99 = 0, max = 0;
};

Summary summarize(std::vector<double> values);

struct SloLimits {
  double ttft_ms = 0;  // <= 0: no limit
  double tpot_ms = 0;  // <= 0: no limit
};

// One successful request's latencies, in milliseconds.
struct RequestLatency {
  double ttft_ms = 0;
  double tpot_ms = 0;
};

bool meets_slo(const RequestLatency& r, const SloLimits& slo);
// How many of `requests` meet `slo`.
int64_t count_good(const std::vector<RequestLatency>& requests, const SloLimits& slo);

// Time per output token: (e2e - ttft) / (output_tokens - 1), 0 for <= 1 token.
double time_per_output_token_ms(double e2e_ms, double ttft_ms, int64_t output_tokens);

}  // namespace basalt::loadgen
