#include "sim/workload.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>

#include "core/error.h"

namespace basalt::sim {

std::vector<SimRequest> requests_from(const std::vector<loadgen::Conversation>& pool,
                                      const std::vector<double>& arrivals, uint64_t seed) {
  BASALT_CHECK(!pool.empty() || arrivals.empty(), "the workload has no conversations");
  std::map<std::string, int64_t> groups;  // leading text -> group
  std::vector<SimRequest> shapes;
  for (size_t i = 0; i < pool.size(); ++i) {
    const loadgen::Conversation& c = pool[i];
    BASALT_CHECK(c.turns.size() == 1,
                 "conversation {} has {} turns: the simulator replays single-turn workloads only", i, c.turns.size());
    SimRequest q;
    q.prompt_tokens = c.leading_tokens + c.turns[0].question_tokens;
    q.output_tokens = c.turns[0].max_tokens;
    if (!c.leading.empty()) {
      std::string key;
      for (const loadgen::Message& m : c.leading) key += m.role + '\n' + m.content + '\n';
      q.prefix_group = groups.emplace(key, static_cast<int64_t>(groups.size())).first->second;
      q.prefix_tokens = c.leading_tokens;
    }
    shapes.push_back(q);
  }
  std::vector<SimRequest> out;
  out.reserve(arrivals.size());
  const bool draw = arrivals.size() > shapes.size();
  std::mt19937_64 rng(seed);
  for (size_t k = 0; k < arrivals.size(); ++k) {
    SimRequest q = shapes[draw ? std::uniform_int_distribution<size_t>(0, shapes.size() - 1)(rng) : k];
    q.arrival_s = arrivals[k];
    out.push_back(q);
  }
  return out;
}

std::vector<double> trace_arrivals(const loadgen::LoadShape& shape, int64_t count, double duration_s) {
  shape.validate();
  if (duration_s <= 0) return loadgen::arrival_times(count, shape);
  BASALT_CHECK(std::isfinite(duration_s), "--duration must be finite, got {}", duration_s);
  BASALT_CHECK(!shape.unlimited(), "--duration needs a finite --request-rate");
  // Enough draws to pass duration_s: the peak rate times the duration, with margin.
  const double peak = shape.rate * std::max(1.0, shape.burst_factor) * (1 + shape.diurnal_amplitude);
  const double expected = peak * duration_s;
  BASALT_CHECK(expected <= 2e9, "--request-rate x --duration is too many requests ({:.3g})", expected);
  std::vector<double> t = loadgen::arrival_times(static_cast<int64_t>(expected * 1.1 + 10 * std::sqrt(expected) + 16),
                                                 shape);
  t.erase(std::lower_bound(t.begin(), t.end(), duration_s), t.end());
  return t;
}

}  // namespace basalt::sim
