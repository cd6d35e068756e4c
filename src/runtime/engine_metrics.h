// EngineMetrics: the engine's counters, gauges and latency histograms, as a
// plain struct the server can export (Prometheus-style cumulative buckets).
//
// Contract: the scheduler thread updates its own copy; Engine::metrics()
// returns a consistent snapshot taken at the end of a step.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace basalt {

// Durations in seconds, bucketed by upper bounds from 100 µs to 100 s.
struct Histogram {
  static constexpr std::array<double, 13> kBounds = {1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1,
                                                     0.3,  1.0,  3.0,  10.0, 30.0, 100.0};
  std::array<uint64_t, kBounds.size() + 1> buckets{};  // last: above every bound
  uint64_t count = 0;
  double sum = 0;
  double max = 0;

  void observe(double seconds) {
    size_t i = 0;
    while (i < kBounds.size() && seconds > kBounds[i]) ++i;
    ++buckets[i];
    ++count;
    sum += seconds;
    if (seconds > max) max = seconds;
  }
  // Adds other's observations (the histograms of several engines as one).
  void merge(const Histogram& other) {
    for (size_t i = 0; i < buckets.size(); ++i) buckets[i] += other.buckets[i];
    count += other.count;
    sum += other.sum;
    if (other.max > max) max = other.max;
  }
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
  // The upper bound of the bucket holding quantile q (max for the last one).
  double quantile(double q) const {
    if (count == 0) return 0;
    const double target = q * static_cast<double>(count);
    uint64_t seen = 0;
    for (size_t i = 0; i < buckets.size(); ++i) {
      seen += buckets[i];
      if (static_cast<double>(seen) >= target) return i < kBounds.size() ? kBounds[i] : max;
    }
    return max;
  }
};

struct EngineMetrics {
  // Gauges.
  int64_t running = 0;
  int64_t queued = 0;
  int64_t kv_capacity = 0;
  int64_t kv_used = 0;       // locked + held slots
  int64_t kv_cached = 0;     // slots in the radix cache (evictable + locked)
  // Counters.
  uint64_t requests_submitted = 0;
  uint64_t requests_finished = 0;  // completed: a stop (eos, stop string or id) or the length limit
  uint64_t requests_stopped = 0;   // of those, by a stop
  uint64_t requests_cancelled = 0;
  uint64_t requests_failed = 0;   // error events
  uint64_t requests_expired = 0;  // deadlines
  uint64_t prompt_tokens = 0;         // of admitted requests (each admission)
  uint64_t cached_prompt_tokens = 0;  // of those, found in the radix cache
  uint64_t prefill_tokens = 0;        // prompt tokens computed
  uint64_t output_tokens = 0;
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  // Tokens sampled and dropped: for requests that had already finished (with
  // overlap, a request that stops on step N's token is in step N+1 too, and
  // that row is computed and dropped), and the rows after a rejected draft.
  uint64_t discarded_tokens = 0;
  // Output tokens jump-forward drafted (text a grammar forces) and
  // verification accepted: each saved a step.
  uint64_t jump_forward_tokens = 0;
  // Speculative decoding: draft tokens verified, those accepted, and the
  // accepted ones by their place among the drafts (0: the first draft).
  uint64_t draft_tokens = 0;
  uint64_t accepted_draft_tokens = 0;
  std::vector<uint64_t> accepted_by_position;
  // Histograms (seconds).
  Histogram queue_time;     // submit -> first admission
  Histogram ttft;           // submit -> first token
  Histogram inter_token;    // between a request's consecutive tokens
  Histogram end_to_end;     // submit -> finished
  Histogram schedule_time;  // scheduler CPU time per step (everything but the model and sampler)
  Histogram step_time;      // whole step (with overlap: one scheduler iteration)
  Histogram execute_time;   // the model and the sampler, per step (wall)
  // Per step: how long the executor sat idle between the previous step and
  // this one while the scheduler worked (the "bubble"; idle periods with no
  // request are not counted). Overlap hides the scheduler's work in it.
  Histogram bubble;

  // Adds other's gauges, counters and histograms: several engines (the DP
  // ranks of one model, runtime/engine_group.h) seen as one.
  void merge(const EngineMetrics& other) {
    running += other.running;
    queued += other.queued;
    kv_capacity += other.kv_capacity;
    kv_used += other.kv_used;
    kv_cached += other.kv_cached;
    for (auto [mine, theirs] : {std::pair{&requests_submitted, other.requests_submitted},
                                {&requests_finished, other.requests_finished},
                                {&requests_stopped, other.requests_stopped},
                                {&requests_cancelled, other.requests_cancelled},
                                {&requests_failed, other.requests_failed},
                                {&requests_expired, other.requests_expired},
                                {&prompt_tokens, other.prompt_tokens},
                                {&cached_prompt_tokens, other.cached_prompt_tokens},
                                {&prefill_tokens, other.prefill_tokens},
                                {&output_tokens, other.output_tokens},
                                {&preemptions, other.preemptions},
                                {&steps, other.steps},
                                {&discarded_tokens, other.discarded_tokens},
                                {&jump_forward_tokens, other.jump_forward_tokens},
                                {&draft_tokens, other.draft_tokens},
                                {&accepted_draft_tokens, other.accepted_draft_tokens}})
      *mine += theirs;
    if (accepted_by_position.size() < other.accepted_by_position.size())
      accepted_by_position.resize(other.accepted_by_position.size());
    for (size_t i = 0; i < other.accepted_by_position.size(); ++i)
      accepted_by_position[i] += other.accepted_by_position[i];
    for (auto [mine, theirs] : {std::pair{&queue_time, &other.queue_time},
                                {&ttft, &other.ttft},
                                {&inter_token, &other.inter_token},
                                {&end_to_end, &other.end_to_end},
                                {&schedule_time, &other.schedule_time},
                                {&step_time, &other.step_time},
                                {&execute_time, &other.execute_time},
                                {&bubble, &other.bubble}})
      mine->merge(*theirs);
  }

  double cache_hit_rate() const {
    return prompt_tokens ? static_cast<double>(cached_prompt_tokens) / static_cast<double>(prompt_tokens)
                         : 0.0;
  }
};

}  // namespace basalt
