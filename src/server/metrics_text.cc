#include "server/metrics_text.h"

#include <span>
#include <string>

#include "server/prometheus_text.h"

namespace basalt {
namespace {

// The replica's families: every sample labelled with the model's name.
class Writer {
 public:
  explicit Writer(const std::string& model) : text_(PrometheusLabels{{"model_name", model}}) {}

  void family(const char* name, const char* type, const char* help) { text_.family(name, type, help); }
  void value(const char* name, double v, const PrometheusLabels& labels = {}) { text_.sample(name, v, labels); }
  void gauge(const char* name, const char* help, double v) { text_.gauge(name, help, v); }
  void counter(const char* name, const char* help, double v) { text_.counter(name, help, v); }
  void histogram(const char* name, const char* help, const Histogram& h) {
    text_.histogram(name, help, Histogram::kBounds,
                    std::span<const uint64_t>(h.buckets.data(), Histogram::kBounds.size()), h.count, h.sum);
  }
  std::string take() { return text_.take(); }

 private:
  PrometheusText text_;
};

}  // namespace

std::string render_metrics(const MetricsInput& in) {
  const EngineMetrics& m = in.engine;
  Writer w(in.model_name);
  const double usage = m.kv_capacity > 0 ? static_cast<double>(m.kv_used) / static_cast<double>(m.kv_capacity) : 0.0;

  w.gauge("basalt_requests_running", "Requests in the running batch (prefilling or decoding).",
          static_cast<double>(m.running));
  w.gauge("basalt_requests_waiting", "Requests queued for admission, preempted ones included.",
          static_cast<double>(m.queued));
  w.gauge("basalt_requests_in_flight", "Engine requests submitted through the API and not finished.",
          static_cast<double>(in.in_flight));
  w.gauge("basalt_kv_cache_capacity_tokens", "Token slots in the KV pool.", static_cast<double>(m.kv_capacity));
  w.gauge("basalt_kv_cache_used_tokens", "KV slots held by running requests (locked or owned).",
          static_cast<double>(m.kv_used));
  w.gauge("basalt_kv_cache_usage_ratio", "basalt_kv_cache_used_tokens / basalt_kv_cache_capacity_tokens.", usage);
  w.gauge("basalt_radix_cache_tokens", "KV slots kept by the radix prefix cache (evictable or locked).",
          static_cast<double>(m.kv_cached));
  w.gauge("basalt_prefix_cache_hit_ratio", "Prompt tokens found in the radix cache / prompt tokens admitted.",
          m.cache_hit_rate());
  w.gauge("basalt_http_open_connections", "Open HTTP connections.", static_cast<double>(in.open_connections));

  w.counter("basalt_requests_submitted_total", "Engine requests submitted.",
            static_cast<double>(m.requests_submitted));
  w.family("basalt_requests_finished_total", "counter", "Engine requests finished, by outcome.");
  w.value("basalt_requests_finished_total",
          static_cast<double>(m.requests_finished),
          {{"outcome", "completed"}});
  w.value("basalt_requests_finished_total", static_cast<double>(m.requests_cancelled), {{"outcome", "cancelled"}});
  w.value("basalt_requests_finished_total", static_cast<double>(m.requests_failed), {{"outcome", "error"}});
  w.value("basalt_requests_finished_total", static_cast<double>(m.requests_expired), {{"outcome", "deadline"}});
  w.counter("basalt_prompt_tokens_total", "Prompt tokens of admitted requests (counted at each admission).",
            static_cast<double>(m.prompt_tokens));
  w.counter("basalt_prompt_tokens_cached_total", "Of those, tokens found in the radix cache.",
            static_cast<double>(m.cached_prompt_tokens));
  w.counter("basalt_prefill_tokens_total", "Prompt tokens computed by the model.",
            static_cast<double>(m.prefill_tokens));
  w.counter("basalt_generation_tokens_total", "Output tokens generated.", static_cast<double>(m.output_tokens));
  w.counter("basalt_jump_forward_tokens_total", "Output tokens jump-forward drafted from text a grammar forces and verification accepted.",
            static_cast<double>(m.jump_forward_tokens));
  w.counter("basalt_spec_draft_tokens_total", "Draft tokens speculative decoding verified.",
            static_cast<double>(m.draft_tokens));
  w.counter("basalt_spec_accepted_tokens_total", "Draft tokens speculative decoding accepted.",
            static_cast<double>(m.accepted_draft_tokens));
  if (!m.accepted_by_position.empty()) {
    w.family("basalt_spec_accepted_by_position_total", "counter",
             "Accepted draft tokens by their place among a step's drafts (0: the first).");
    for (size_t i = 0; i < m.accepted_by_position.size(); ++i)
      w.value("basalt_spec_accepted_by_position_total", static_cast<double>(m.accepted_by_position[i]),
              {{"position", std::to_string(i)}});
  }
  w.counter("basalt_preemptions_total", "Running requests preempted for memory (recomputed later).",
            static_cast<double>(m.preemptions));
  w.counter("basalt_engine_steps_total", "Scheduler steps (one model call each).", static_cast<double>(m.steps));
  w.counter("basalt_client_disconnects_total", "Responses abandoned by their client (requests cancelled).",
            static_cast<double>(in.client_disconnects));
  w.family("basalt_http_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const auto& [key, count] : in.http_requests)
    w.value("basalt_http_requests_total", static_cast<double>(count),
            {{"route", key.first}, {"status", std::to_string(key.second)}});

  w.histogram("basalt_queue_time_seconds", "Submit to first admission.", m.queue_time);
  w.histogram("basalt_time_to_first_token_seconds", "Submit to first output token.", m.ttft);
  w.histogram("basalt_inter_token_latency_seconds", "Between a request's consecutive output tokens.",
              m.inter_token);
  w.histogram("basalt_e2e_request_latency_seconds", "Submit to finish.", m.end_to_end);
  w.histogram("basalt_scheduler_cpu_seconds", "Scheduler CPU time per step (all but the model and sampler).",
              m.schedule_time);
  w.histogram("basalt_step_seconds", "Wall time per engine step.", m.step_time);

  // The names vLLM exports, for gateways and autoscalers written against it.
  w.gauge("vllm:num_requests_running", "vLLM-compatible: requests in the running batch.",
          static_cast<double>(m.running));
  w.gauge("vllm:num_requests_waiting", "vLLM-compatible: requests waiting for admission.",
          static_cast<double>(m.queued));
  w.gauge("vllm:kv_cache_usage_perc", "vLLM-compatible: KV cache usage, 0 to 1.", usage);
  w.gauge("vllm:gpu_cache_usage_perc", "vLLM-compatible (older name): KV cache usage, 0 to 1.", usage);
  w.counter("vllm:prompt_tokens_total", "vLLM-compatible: prompt tokens of admitted requests.",
            static_cast<double>(m.prompt_tokens));
  w.counter("vllm:generation_tokens_total", "vLLM-compatible: output tokens generated.",
            static_cast<double>(m.output_tokens));
  w.counter("vllm:num_preemptions_total", "vLLM-compatible: requests preempted for memory.",
            static_cast<double>(m.preemptions));
  w.counter("vllm:prefix_cache_queries_total", "vLLM-compatible: prompt tokens looked up in the prefix cache.",
            static_cast<double>(m.prompt_tokens));
  w.counter("vllm:prefix_cache_hits_total", "vLLM-compatible: of those, tokens found.",
            static_cast<double>(m.cached_prompt_tokens));
  w.family("vllm:request_success_total", "counter", "vLLM-compatible: finished requests, by finish reason.");
  w.value("vllm:request_success_total", static_cast<double>(m.requests_stopped), {{"finished_reason", "stop"}});
  w.value("vllm:request_success_total", static_cast<double>(m.requests_finished - m.requests_stopped),
          {{"finished_reason", "length"}});
  w.value("vllm:request_success_total", static_cast<double>(m.requests_cancelled), {{"finished_reason", "abort"}});
  w.histogram("vllm:time_to_first_token_seconds", "vLLM-compatible: submit to first output token.", m.ttft);
  w.histogram("vllm:inter_token_latency_seconds", "vLLM-compatible: between consecutive output tokens.",
              m.inter_token);
  w.histogram("vllm:time_per_output_token_seconds",
              "vLLM-compatible (older name of vllm:inter_token_latency_seconds).", m.inter_token);
  w.histogram("vllm:e2e_request_latency_seconds", "vLLM-compatible: submit to finish.", m.end_to_end);
  w.histogram("vllm:request_queue_time_seconds", "vLLM-compatible: submit to first admission.", m.queue_time);
  if (!in.startup_phases.empty()) {
    w.family("basalt_engine_startup_seconds", "gauge",
             "When each phase of the replica's start ended, in seconds since its process started.");
    for (const StartupPhase& p : in.startup_phases)
      w.value("basalt_engine_startup_seconds", p.since_start_s, {{"phase", p.name}});
  }
  return w.take();
}

}  // namespace basalt
