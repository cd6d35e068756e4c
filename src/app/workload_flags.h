// The workload and arrival flags `basalt bench` and `basalt sim` share:
// which conversations to send (a dataset and its lengths) and when they
// arrive (a Poisson rate with an optional burst and diurnal swing). Each
// command registers the options with its own help text (what a prompt count
// means differs between a load test and a trace); what the values turn into
// is decided here, once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loadgen/schedule.h"
#include "loadgen/workload.h"

namespace basalt {

struct WorkloadFlags {
  std::string dataset = "random";
  std::string dataset_path;
  int64_t num_prompts = 100;
  int64_t input_len = 256;
  int64_t output_len = 128;
  bool output_len_set = false;
  double range_ratio = 0;
  int64_t sp_groups = 4;
  int64_t sp_prompts_per_group = 8;
  int64_t sp_system_len = 512;
  int64_t sp_question_len = 64;
  int64_t mt_turns = 4;
  int64_t max_input_len = 1024;
  std::string request_rate = "inf";
  double burst_factor = 1;
  double burst_start = 0;
  double burst_duration = 0;
  double diurnal_amplitude = 0;
  double diurnal_period = 86400;
};

// The conversations of f's dataset (random, shared-prefix, sharegpt, and
// multi-turn where `multi_turn` allows it) drawn with `seed`; a dataset name
// the command does not take is an error naming the ones it does.
std::vector<loadgen::Conversation> make_workload(const WorkloadFlags& f, const loadgen::TextMaker& maker,
                                                 uint64_t seed, bool multi_turn);

// The arrival schedule of f at `rate` requests per second.
loadgen::LoadShape load_shape(const WorkloadFlags& f, double rate, uint64_t seed);

// A rate flag's value: a positive number of requests per second, or inf
// (all at once); anything else is an error naming `flag`.
double parse_rate(const std::string& text, const char* flag);

}  // namespace basalt
