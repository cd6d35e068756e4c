// Load-test results: the metrics of one run, as JSON, a terminal table and
// an SVG picture.
//
// Contract:
//  * compute_metrics reads a RunResult. A request counts as completed when
//    its result has no error. Its output tokens are the server's
//    usage.completion_tokens when the stream carried usage, else the number
//    of text-carrying events. TTFT is first token minus send time; ITL is
//    every gap between consecutive token events of a request (pooled over
//    requests); TPOT is (e2e - TTFT) / (output tokens - 1) per request with
//    more than one token; E2E is end minus send time. All in milliseconds.
//    Throughputs divide by the run's wall time. Goodput counts completed
//    requests meeting the SLOs (stats.h). Errors are counted by kind, with up
//    to two distinct example messages of each kind (prefixed with the kind).
//  * The client's own cost: CPU seconds (user + system) over the run, CPU
//    microseconds per output token, CPU/wall ratio, and arrival lag (mean,
//    P99, max over on-schedule requests). client_bottleneck is set, with its
//    reasons, when CPU/wall >= 0.9 in a run of at least a second (the one
//    client thread was saturated) or requests went out late enough to change
//    the arrival process: a P99 arrival lag over a tenth of the mean gap
//    between arrivals (1/rate), and over 1 ms (timer jitter); at an
//    unlimited rate, over 10 ms. At 4 requests/s a 17 ms lag is 7% of the
//    250 ms gap, noise; at 2,000 requests/s 2 ms is four gaps.
//  * metrics_json gives every figure above (a stable key layout: see the
//    code); metrics_table renders the same as aligned text; render_svg draws,
//    for one or more runs, the CDFs of TTFT, ITL, TPOT and E2E and the output
//    token throughput over time (1-second bins), one colour per run, with
//    axes, ticks and a legend; labels are XML-escaped.
//  * Speculation: the server's own counters of draft tokens verified and
//    accepted over the run (the difference of two scrapes of its /metrics,
//    read by spec_counters: Basalt's basalt_spec_* and
//    basalt_jump_forward_tokens_total, vLLM's vllm:spec_decode_*), shown
//    next to ITL when the server has them.
#pragma once

#include <map>
#include <optional>
#include <string_view>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loadgen/runner.h"
#include "loadgen/stats.h"

namespace basalt::loadgen {

// Draft tokens a server verified and accepted, from its Prometheus text:
// the sums over every series of the known counter names. nullopt when the
// text has none of them (a server without speculation counters).
struct SpecCounters {
  double drafted = 0, accepted = 0, jump_forward = 0;
};
std::optional<SpecCounters> spec_counters(std::string_view prometheus_text);

// One request of a run, as --save-detailed writes it: its place in the
// trace (`index`: the conversation, in the workload's order; `turn`), when
// it was due (seconds from the run's start), its TTFT and E2E (ms; -1 when
// it failed, TTFT also when no token came), its prompt and output tokens
// (counted as the run's totals are), and its error (empty: completed).
struct RequestDetail {
  int64_t index = 0, turn = 0;
  double scheduled_s = 0;
  double ttft_ms = -1, e2e_ms = -1;
  int64_t input_tokens = 0, output_tokens = 0;
  std::string error;
};
// An array of objects with those keys; `basalt sim --save-detailed` writes
// the same, so the two can be joined by index.
nlohmann::json request_details_json(const std::vector<RequestDetail>& details);

struct Metrics {
  std::string label;
  double rate = 0;  // requests/s asked (0: unlimited)
  int64_t max_concurrency = 0;
  int64_t requests = 0, completed = 0, failed = 0, abandoned_turns = 0;
  int64_t input_tokens = 0, output_tokens = 0, good = 0;
  double duration_s = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0, goodput = 0;
  SloLimits slo;
  Summary ttft, itl, tpot, e2e, output_len;
  std::map<std::string, int64_t> errors;  // by kind name
  std::optional<SpecCounters> speculation;  // over the run; unset: not known
  std::vector<std::string> error_examples;
  // Client overhead.
  double cpu_s = 0, cpu_us_per_token = 0, cpu_fraction = 0;
  Summary lag_ms;
  int64_t held_by_limit = 0;
  bool client_bottleneck = false;
  std::vector<std::string> bottleneck_reasons;
  // For the picture.
  std::vector<double> ttft_ms, itl_ms, tpot_ms, e2e_ms;  // sorted
  std::vector<double> tokens_per_second;                 // per 1-second bin
  // compute_metrics(..., detailed) only: every request, by (index, turn);
  // metrics_json adds them as "details" when there are any.
  std::vector<RequestDetail> details;
};

// `rate`: the requests per second the run asked for (0: unlimited), which
// the arrival lag is judged against.
Metrics compute_metrics(const RunResult& run, const SloLimits& slo, double rate = 0, bool detailed = false);
nlohmann::json metrics_json(const Metrics& m);
std::string metrics_table(const Metrics& m);
std::string render_svg(const std::vector<Metrics>& runs, const std::string& title);

}  // namespace basalt::loadgen
