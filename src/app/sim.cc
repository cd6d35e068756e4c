// `basalt sim`: the fleet simulator (docs/DEPLOY.md §6, docs/SCALING.md). It
// builds the trace `basalt bench` would send (the same workload generators,
// the same seeded arrival process), replays it in virtual time against
// simulated replicas whose step times come from a step table
// (bench/sim/*.json), through the gateway's own routing policy, admission
// queue and autoscaler, and reports SLO attainment, TTFT, ITL, throughput,
// GPU-hours, cold starts and the largest queues (src/sim/).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/commands.h"
#include "app/model_dir.h"
#include "app/workload_flags.h"
#include "core/error.h"
#include "loadgen/workload.h"
#include "router/autoscaler.h"
#include "router/policy.h"
#include "sim/fleet.h"
#include "sim/step_table.h"
#include "sim/workload.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

using nlohmann::json;

// The simulator's flags beside the shared workload and arrival ones.
struct SimFlags : WorkloadFlags {
  std::string step_table;
  int64_t replicas = 1;
  std::string autoscale;
  double cold_start = 60;
  std::string policy = "cache-aware";
  double cache_threshold = 0.3;
  bool saturation_gate = false;
  double queue_deadline = 300;
  int64_t scrape_interval_ms = 1000;
  double assumed_prefill_rate = 2000;
  std::string model;
  int64_t num_requests = 0;
  double duration = 0;
  uint64_t seed = 0;
  double slo_ttft_ms = 1000;
  bool json_out = false;
  std::string output_json;
  bool timeline = false;
  bool save_detailed = false;
};

void run_sim(const SimFlags& f) {
  sim::FleetConfig config;
  config.table = sim::load_step_table(f.step_table);
  config.policy = router::parse_policy(f.policy, "--policy");
  BASALT_CHECK(std::isfinite(f.cache_threshold) && f.cache_threshold >= 0 && f.cache_threshold <= 1,
               "--cache-threshold must be in [0, 1], got {}", f.cache_threshold);
  config.cache_threshold = f.cache_threshold;
  config.replicas = f.replicas;
  if (!f.autoscale.empty()) {
    config.autoscale = router::parse_autoscale(f.autoscale, "--autoscale");
    BASALT_CHECK(config.autoscale->pool.empty(), "--autoscale: the simulator has one pool; leave pool= out");
  }
  config.cold_start_s = f.cold_start;
  config.saturation_gate = f.saturation_gate;
  config.queue_deadline_s = f.queue_deadline;
  BASALT_CHECK(f.scrape_interval_ms >= 1 && f.scrape_interval_ms <= 60000,
               "--scrape-interval-ms must be in [1, 60000], got {}", f.scrape_interval_ms);
  config.scrape.interval = std::chrono::milliseconds(f.scrape_interval_ms);
  config.scrape.stale_after = 3 * config.scrape.interval;
  config.assumed_prefill_rate = f.assumed_prefill_rate;
  config.slo_ttft_ms = f.slo_ttft_ms;
  config.seed = f.seed;
  config.timeline = f.timeline;
  config.detailed = f.save_detailed;
  BASALT_CHECK(f.num_requests >= 0, "--num-requests must be >= 0, got {}", f.num_requests);
  BASALT_CHECK(std::isfinite(f.duration) && f.duration >= 0, "--duration must be >= 0 seconds, got {}", f.duration);
  BASALT_CHECK(f.burst_factor == 1 || f.burst_duration > 0, "--burst-factor needs --burst-duration");

  const loadgen::LoadShape shape = load_shape(f, parse_rate(f.request_rate, "--request-rate"), f.seed);
  const std::string dir = model_dir_or_bundled(f.model);
  TokenizerBundle tokenizer = load_tokenizer_dir(dir);
  loadgen::TextMaker maker(tokenizer.tokenizer);
  const std::vector<loadgen::Conversation> pool = make_workload(f, maker, f.seed, /*multi_turn=*/false);
  const int64_t count = f.num_requests > 0 ? f.num_requests : static_cast<int64_t>(pool.size());
  const std::vector<double> arrivals = sim::trace_arrivals(shape, count, f.duration);
  const std::vector<sim::SimRequest> requests = sim::requests_from(pool, arrivals, f.seed);
  std::fprintf(stderr, "basalt sim: %zu requests (%s, %zu distinct), table %s, policy %s\n", requests.size(),
               f.dataset.c_str(), pool.size(), config.table.name.c_str(), router::policy_name(config.policy));

  const sim::SimResult result = sim::simulate(config, requests);
  const json config_json = {{"step_table", config.table.name},
                            {"step_table_file", f.step_table},
                            {"replicas", f.replicas},
                            {"autoscale", f.autoscale},
                            {"cold_start_s", f.cold_start},
                            {"policy", router::policy_name(config.policy)},
                            {"saturation_gate", f.saturation_gate},
                            {"dataset", f.dataset},
                            {"num_prompts", f.num_prompts},
                            {"input_len", f.input_len},
                            {"output_len", f.output_len},
                            {"range_ratio", f.range_ratio},
                            {"request_rate", f.request_rate},
                            {"requests", requests.size()},
                            {"duration_s", f.duration},
                            {"burst", {{"factor", f.burst_factor}, {"start_s", f.burst_start},
                                       {"duration_s", f.burst_duration}}},
                            {"diurnal", {{"amplitude", f.diurnal_amplitude}, {"period_s", f.diurnal_period}}},
                            {"seed", f.seed}};
  const json out = {{"config", config_json}, {"results", sim::sim_result_json(result)}};
  if (f.json_out) {
    std::fputs((out.dump(2) + "\n").c_str(), stdout);
  } else {
    std::fputs(sim::sim_result_table(result, fmt::format("basalt sim: {} on {} replicas ({}), rate {}", f.dataset,
                                                         f.autoscale.empty() ? std::to_string(f.replicas)
                                                                             : "autoscaled",
                                                         config.table.name, f.request_rate))
                   .c_str(),
               stdout);
  }
  if (!f.output_json.empty()) {
    std::ofstream file(f.output_json);
    BASALT_CHECK(file.good(), "--output-json {}: cannot write it", f.output_json);
    file << out.dump(2) << "\n";
    BASALT_CHECK(file.good(), "--output-json {}: write failed", f.output_json);
  }
}

}  // namespace

void add_sim_command(CLI::App& app) {
  auto flags = std::make_shared<SimFlags>();
  SimFlags& f = *flags;
  CLI::App* cmd = app.add_subcommand(
      "sim", "Simulate a fleet in virtual time: SLO attainment, TTFT, GPU-hours and cold starts for a trace");
  cmd->add_option("--step-table", f.step_table, "Step-time table, JSON (bench/sim/*.json)")->required();
  cmd->add_option("--replicas", f.replicas, "Replicas ready at the start (default 1)");
  cmd->add_option("--autoscale", f.autoscale,
                  "The gateway's autoscaler, as `basalt route --autoscale` takes it ('metric=concurrency target=8 "
                  "min=0 max=8 up_after=30s down_after=5m'); default: a fixed fleet");
  cmd->add_option("--cold-start", f.cold_start, "Seconds a new replica takes to become ready (default 60)");
  cmd->add_option("--policy", f.policy, "cache-aware (default), round-robin, least-load, power-of-two or session");
  cmd->add_option("--cache-threshold", f.cache_threshold, "cache-aware: the least cached share that counts (0.3)");
  cmd->add_flag("--saturation-gate", f.saturation_gate,
                "Hold every request in the gateway's admission queue until its replica is below saturation "
                "(what tenants' requests get)");
  cmd->add_option("--queue-deadline", f.queue_deadline,
                  "Seconds a request may wait in the gateway before it fails (default 300)");
  cmd->add_option("--scrape-interval-ms", f.scrape_interval_ms,
                  "The gateway's scrape and autoscale interval (default 1000)");
  cmd->add_option("--assumed-prefill-rate", f.assumed_prefill_rate,
                  "Prefill tokens/s the gateway assumes before it has measured a replica (default 2000)");
  cmd->add_option("--model", f.model, "Model directory whose tokenizer sizes prompts (default: the bundled model)");
  cmd->add_option("--dataset", f.dataset, "random (default), shared-prefix or sharegpt");
  cmd->add_option("--dataset-path", f.dataset_path, "ShareGPT JSON or JSONL file (--dataset sharegpt)");
  cmd->add_option("--num-prompts", f.num_prompts,
                  "Distinct prompts generated (random, sharegpt), in order, then drawn at random for a longer "
                  "trace (default 100)");
  cmd->add_option("--input-len", f.input_len, "Prompt tokens (random; default 256)");
  cmd->add_option("--output-len", f.output_len, "Output tokens per request (default 128; sharegpt: the answer's)")
      ->each([&f](const std::string&) { f.output_len_set = true; });
  cmd->add_option("--range-ratio", f.range_ratio, "Spread lengths uniformly over [L(1-r), L(1+r)] (default 0)");
  cmd->add_option("--sp-groups", f.sp_groups, "shared-prefix: groups, each with its own system prompt (default 4)");
  cmd->add_option("--sp-prompts-per-group", f.sp_prompts_per_group, "shared-prefix: questions per group (default 8)");
  cmd->add_option("--sp-system-len", f.sp_system_len, "shared-prefix: system prompt tokens (default 512)");
  cmd->add_option("--sp-question-len", f.sp_question_len, "shared-prefix: question tokens (default 64)");
  cmd->add_option("--max-input-len", f.max_input_len, "sharegpt: skip prompts longer than this (default 1024)");
  cmd->add_option("--request-rate", f.request_rate, "Poisson arrivals per second, or inf: all at once (default inf)");
  cmd->add_option("--num-requests", f.num_requests, "Requests in the trace (default: one per distinct prompt)");
  cmd->add_option("--duration", f.duration, "Seconds of arrivals instead of a count (needs a finite rate)");
  cmd->add_option("--burst-factor", f.burst_factor, "Multiply the rate by this during the burst (default 1)");
  cmd->add_option("--burst-start", f.burst_start, "Seconds into the run the burst begins (default 0)");
  cmd->add_option("--burst-duration", f.burst_duration, "Seconds the burst lasts (default 0: no burst)");
  cmd->add_option("--diurnal-amplitude", f.diurnal_amplitude,
                  "Swing the rate by 1 + A sin(2 pi t / period), A in [0, 1] (default 0: steady)");
  cmd->add_option("--diurnal-period", f.diurnal_period, "Seconds of one diurnal cycle (default 86400)");
  cmd->add_option("--seed", f.seed, "Seed for prompts, arrivals and power-of-two's draws (default 0)");
  cmd->add_option("--slo-ttft-ms", f.slo_ttft_ms, "The TTFT objective SLO attainment counts against (default 1000)");
  cmd->add_flag("--json", f.json_out, "Print config and results as JSON instead of the table");
  cmd->add_option("--output-json", f.output_json, "Also write config and results as JSON here");
  cmd->add_flag("--timeline", f.timeline, "Add a point per scrape interval (replicas, queues) to the JSON");
  cmd->add_flag("--save-detailed", f.save_detailed,
                "Add every request to the JSON (as `basalt bench --save-detailed` writes them: index in the trace, "
                "arrival, TTFT, E2E, tokens)");
  cmd->callback([flags] { run_sim(*flags); });
}

}  // namespace basalt
