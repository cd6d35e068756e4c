// The Prometheus text exposition (format 0.0.4) of a Basalt replica: the
// engine's counters, gauges and histograms, the HTTP front's counters, and
// the vLLM-named gauges that Kubernetes inference gateways and autoscalers
// read (vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc and its older name vllm:gpu_cache_usage_perc).
// docs/SERVER.md documents every metric.
//
// Contract: render_metrics is a pure function of its input; every family
// gets HELP and TYPE lines; label values are escaped.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/startup.h"
#include "runtime/engine_metrics.h"

namespace basalt {

struct MetricsInput {
  EngineMetrics engine;
  std::string model_name;
  int64_t in_flight = 0;  // engine requests submitted by the server, unfinished
  int64_t open_connections = 0;
  uint64_t client_disconnects = 0;
  std::map<std::pair<std::string, int>, uint64_t> http_requests;  // (route, status) -> count
  std::vector<StartupPhase> startup_phases;  // basalt_engine_startup_seconds{phase}; none: no family
};

std::string render_metrics(const MetricsInput& in);

}  // namespace basalt
