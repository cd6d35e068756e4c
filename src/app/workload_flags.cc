#include "app/workload_flags.h"

#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace basalt {

std::vector<loadgen::Conversation> make_workload(const WorkloadFlags& f, const loadgen::TextMaker& maker,
                                                 uint64_t seed, bool multi_turn) {
  using namespace loadgen;
  if (f.dataset == "random") return make_random(maker, {f.num_prompts, f.input_len, f.output_len, f.range_ratio}, seed);
  if (f.dataset == "shared-prefix") {
    const SharedPrefixSpec s{f.sp_groups,       f.sp_prompts_per_group, f.sp_system_len,
                             f.sp_question_len, f.output_len,           f.range_ratio};
    return make_shared_prefix(maker, s, seed);
  }
  if (f.dataset == "multi-turn" && multi_turn)
    return make_multi_turn(maker, {f.num_prompts, f.mt_turns, f.input_len, f.output_len, f.range_ratio}, seed);
  if (f.dataset == "sharegpt") {
    BASALT_CHECK(!f.dataset_path.empty(), "--dataset sharegpt needs --dataset-path FILE");
    return load_sharegpt(f.dataset_path, maker, {f.num_prompts, f.output_len_set ? f.output_len : 0, f.max_input_len},
                         seed);
  }
  fail("--dataset '{}': expected random, shared-prefix, {}sharegpt", f.dataset, multi_turn ? "multi-turn or " : "or ");
}

loadgen::LoadShape load_shape(const WorkloadFlags& f, double rate, uint64_t seed) {
  loadgen::LoadShape s{rate, seed, f.burst_factor, f.burst_start, f.burst_duration};
  s.diurnal_amplitude = f.diurnal_amplitude;
  s.diurnal_period_s = f.diurnal_period;
  return s;
}

double parse_rate(const std::string& text, const char* flag) {
  std::string t = text;
  while (!t.empty() && t.back() == ' ') t.pop_back();
  while (!t.empty() && t.front() == ' ') t.erase(t.begin());
  if (t == "inf" || t == "INF" || t == "Inf") return INFINITY;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  BASALT_CHECK(!t.empty() && end == t.c_str() + t.size() && std::isfinite(v) && v > 0,
               "{} '{}': expected a positive number of requests per second or inf", flag, text);
  return v;
}

}  // namespace basalt
