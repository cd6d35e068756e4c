// `basalt bench`: a load generator for OpenAI-compatible servers (Basalt,
// vLLM, SGLang, ...). It builds a workload (random prompts, shared-prefix
// groups, growing multi-turn conversations or a ShareGPT file) with the
// model's tokenizer, sends it streamed on a Poisson schedule (optionally with
// a burst, a concurrency limit, or a sweep over rates) from one thread, and
// reports TTFT, ITL, TPOT, E2E, throughput, goodput and errors as a table,
// JSON and an SVG picture, with the client's own CPU cost (src/loadgen/).
// With --cold-start it measures instead how long `basalt serve` takes to
// start (app/cold_start_bench.h).
#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "app/cold_start_bench.h"
#include "app/commands.h"
#include "app/model_dir.h"
#include "app/workload_flags.h"
#include "core/error.h"
#include "core/file_limit.h"
#include "loadgen/client.h"
#include "loadgen/report.h"
#include "loadgen/runner.h"
#include "loadgen/workflow_load.h"
#include "loadgen/workload.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

using namespace loadgen;
using nlohmann::json;

// The load test's flags beside the shared workload and arrival ones.
struct BenchFlags : WorkloadFlags {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string served_model_name;
  std::string api_key;
  std::string model;
  bool ignore_eos = false;
  bool no_usage = false;
  double temperature = 0;
  std::string sweep_rates;
  int64_t max_concurrency = 0;
  uint64_t seed = 0;
  double timeout = 600;
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  std::string output_json;
  bool save_detailed = false;
  std::string output_svg;
  bool no_progress = false;
  bool insecure = false;
  std::string label;
  std::string workflow;
  std::string workflow_input = "{}";
  bool cold_start = false;
  int cold_start_runs = 5;
  std::string cold_start_cache = "both";
  bool json = false;
  std::vector<std::string> serve_args;
};

// The first model id of GET /v1/models, or "" when the server does not say.
std::string ask_model_name(boost::asio::io_context& io, CompletionClient& client, const std::string& base_url) {
  std::string name;
  std::string problem;
  bool unreachable = false;
  client.set_epoch(Clock::now());
  client.send("GET", "/v1/models", "", false, false, [&](ExchangeResult&& r) {
    if (r.error != ErrorKind::kNone) {
      problem = "GET /v1/models: " + r.error_message;
      unreachable = r.error == ErrorKind::kConnect || r.error == ErrorKind::kTimeout;
      return;
    }
    json j = json::parse(r.body, nullptr, false);
    if (j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
        j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string())
      name = j["data"][0]["id"].get<std::string>();
    else
      problem = "GET /v1/models: the answer lists no model";
  });
  io.restart();
  io.run();
  if (!problem.empty()) {
    // A server that cannot be reached at all is worth stopping for.
    BASALT_CHECK(!unreachable, "--base-url {}: {}", base_url, problem);
    std::fprintf(stderr, "basalt bench: %s; sending no \"model\" field (set --served-model-name)\n", problem.c_str());
  }
  return name;
}

// The server's speculation counters now (GET /metrics); nullopt when it has
// none or the scrape fails (the report then says nothing about them).
std::optional<SpecCounters> scrape_spec_counters(boost::asio::io_context& io, CompletionClient& client) {
  std::optional<SpecCounters> counters;
  client.send("GET", "/metrics", "", false, false, [&](ExchangeResult&& r) {
    if (r.error == ErrorKind::kNone) counters = spec_counters(r.body);
  });
  io.restart();
  io.run();
  return counters;
}

// `--workflow NAME`: the gateway's workflow runs as the load (docs/WORKFLOWS.md).
void run_workflow_bench(const BenchFlags& f, const std::string& api_key) {
  BASALT_CHECK(f.max_concurrency >= 0, "--max-concurrency must be >= 0 (0: no limit)");
  BASALT_CHECK(f.num_prompts >= 1 && f.num_prompts <= 1000000, "--num-prompts (runs): 1 to 1000000");
  BASALT_CHECK(f.sweep_rates.empty(), "--sweep-rates is not for --workflow (give --request-rate)");
  BASALT_CHECK(std::all_of(f.workflow.begin(), f.workflow.end(),
                           [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; }),
               "--workflow '{}': a workflow name is a-z, 0-9, _ and -", f.workflow);
  json input;
  std::string text = f.workflow_input;
  if (!text.empty() && text[0] != '{') {
    std::ifstream in(text, std::ios::binary);
    BASALT_CHECK(in.good(), "--workflow-input {}: cannot read it (a JSON object, or a file holding one)", text);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  input = json::parse(text, nullptr, false);
  BASALT_CHECK(input.is_object(), "--workflow-input: not a JSON object");
  LoadShape shape = load_shape(f, parse_rate(f.request_rate, "--request-rate"), f.seed);
  shape.validate();
  raise_open_file_limit();
  boost::asio::io_context io(1);
  HttpClientOptions copts;
  copts.timeout_s = f.timeout;
  copts.insecure = f.insecure;
  HttpClient client(io, parse_url(f.base_url), copts);
  WorkflowLoadOptions o;
  o.path = "/v1/workflows/" + f.workflow + "/runs";
  o.body = json{{"input", input}}.dump();
  o.api_key = api_key;
  o.runs = f.num_prompts;
  o.max_concurrency = f.max_concurrency;
  o.shape = shape;
  std::fprintf(stderr, "basalt bench: %lld runs of workflow %s at %s/s, to %s\n",
               static_cast<long long>(o.runs), f.workflow.c_str(), f.request_rate.c_str(), f.base_url.c_str());
  const json summary = summarize_workflow_load(run_workflow_load(io, client, o));
  std::fputs(workflow_load_table(summary, fmt::format("workflow {} ({} runs, rate {})", f.workflow, o.runs,
                                                      f.request_rate))
                 .c_str(),
             stdout);
  std::fflush(stdout);
  if (!f.output_json.empty()) {
    std::ofstream out(f.output_json);
    BASALT_CHECK(out.good(), "--output-json {}: cannot write it", f.output_json);
    const json config = {{"base_url", f.base_url}, {"workflow", f.workflow}, {"input", input},
                         {"runs", o.runs}, {"request_rate", f.request_rate}, {"max_concurrency", f.max_concurrency},
                         {"seed", f.seed}};
    out << json{{"config", config}, {"results", summary}}.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    BASALT_CHECK(out.good(), "--output-json {}: write failed", f.output_json);
  }
}

std::string api_key_of(const BenchFlags& f) {
  if (!f.api_key.empty()) return f.api_key;
  for (const char* env : {"BASALT_API_KEY", "OPENAI_API_KEY"})
    if (const char* v = std::getenv(env); v != nullptr && *v != '\0') return v;
  return {};
}

void run_bench(const BenchFlags& f, const CLI::App& cmd) {
  if (f.cold_start) {
    // The bench starts its own servers: the flags of a load test do not apply.
    for (const char* load_flag : {"--base-url", "--workflow", "--sweep-rates", "--request-rate", "--dataset",
                                  "--num-prompts", "--output-svg", "--save-detailed"})
      BASALT_CHECK(cmd.count(load_flag) == 0, "--cold-start starts its own servers; {} is for a load test",
                   load_flag);
    ColdStartOptions o;
    o.model = f.model;
    o.runs = f.cold_start_runs;
    o.cache = f.cold_start_cache;
    o.serve_args = f.serve_args;
    o.timeout_s = f.timeout;
    o.api_key = api_key_of(f);
    o.json = f.json;
    o.output_json = f.output_json;
    return run_cold_start_bench(o);
  }
  BASALT_CHECK(f.serve_args.empty(), "arguments after -- are `basalt serve`'s, for --cold-start (got '{}')",
               f.serve_args.front());
  BASALT_CHECK(!f.save_detailed || (!f.output_json.empty() && f.workflow.empty()),
               "--save-detailed adds a load test's requests to --output-json: give --output-json (and no --workflow)");
  BASALT_CHECK(!f.json && cmd.count("--cold-start-runs") == 0 && cmd.count("--cold-start-cache") == 0,
               "--json, --cold-start-runs and --cold-start-cache are for --cold-start (a load test's JSON: "
               "--output-json)");
  const std::string endpoint = f.endpoint;
  BASALT_CHECK(!endpoint.empty() && endpoint[0] == '/', "--endpoint '{}' must be a path starting with '/'", endpoint);
  const bool chat = endpoint.size() >= 17 && endpoint.compare(endpoint.size() - 17, 17, "/chat/completions") == 0;
  const bool completions = !chat && endpoint.size() >= 12 && endpoint.compare(endpoint.size() - 12, 12, "/completions") == 0;
  BASALT_CHECK(chat || completions, "--endpoint '{}': expected /v1/completions or /v1/chat/completions", endpoint);
  BASALT_CHECK(std::isfinite(f.temperature), "--temperature must be a number");
  BASALT_CHECK(f.slo_ttft_ms >= 0 && f.slo_tpot_ms >= 0, "--slo-ttft-ms and --slo-tpot-ms must be >= 0");
  BASALT_CHECK(f.max_concurrency >= 0, "--max-concurrency must be >= 0 (0: no limit)");
  std::vector<double> rates;
  if (!f.sweep_rates.empty()) {
    size_t start = 0;
    while (start <= f.sweep_rates.size()) {
      const size_t comma = f.sweep_rates.find(',', start);
      const std::string item = f.sweep_rates.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      rates.push_back(parse_rate(item, "--sweep-rates"));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else {
    rates.push_back(parse_rate(f.request_rate, "--request-rate"));
  }
  for (double r : rates) {
    load_shape(f, r, f.seed).validate();
  }
  BASALT_CHECK(f.burst_factor == 1 || f.burst_duration > 0, "--burst-factor needs --burst-duration");

  const std::string api_key = api_key_of(f);

  if (!f.workflow.empty()) return run_workflow_bench(f, api_key);
  const Url url = parse_url(f.base_url);
  const std::string dir = model_dir_or_bundled(f.model);
  TokenizerBundle tokenizer = load_tokenizer_dir(dir);
  TextMaker maker(tokenizer.tokenizer);
  // Each rate of a sweep gets its own prompts (seed + the rate's index), so a
  // server's prefix cache does not carry one rate's prompts into the next.
  std::vector<std::vector<Conversation>> workloads;
  for (size_t i = 0; i < rates.size(); ++i) workloads.push_back(make_workload(f, maker, f.seed + i, /*multi_turn=*/true));

  // Every stream is a socket: lift the soft descriptor limit (often 1024)
  // to the hard one, so high concurrency is not cut short by EMFILE, and
  // size the descriptor table for the most streams at once (each request of
  // the largest workload, or --max-concurrency), so its growth does not
  // stall a connect in the middle of the measurement.
  const uint64_t files = raise_open_file_limit();
  size_t most_streams = 0;
  for (const std::vector<Conversation>& w : workloads) most_streams = std::max(most_streams, w.size());
  if (f.max_concurrency > 0) most_streams = std::min(most_streams, static_cast<size_t>(f.max_concurrency));
  reserve_descriptor_table(std::min<uint64_t>(files, most_streams + 64));

  boost::asio::io_context io(1);
  ClientOptions copts;
  copts.api_key = api_key;
  copts.timeout_s = f.timeout;
  copts.insecure = f.insecure;
  CompletionClient client(io, url, copts);
  const std::string model = f.served_model_name.empty() ? ask_model_name(io, client, f.base_url) : f.served_model_name;

  int64_t requests = 0;
  for (const Conversation& c : workloads[0]) requests += static_cast<int64_t>(c.turns.size());
  std::fprintf(stderr, "basalt bench: %s, %lld conversations, %lld requests%s, to %s%s\n", f.dataset.c_str(),
               static_cast<long long>(workloads[0].size()), static_cast<long long>(requests),
               rates.size() > 1 ? " per rate" : "", f.base_url.c_str(), endpoint.c_str());

  std::vector<Metrics> all;
  json results = json::array();
  for (size_t i = 0; i < rates.size(); ++i) {
    const double rate = rates[i];
    const std::vector<Conversation>& workload = workloads[i];
    RunOptions o;
    o.path = endpoint;
    o.chat = chat;
    o.model = model;
    o.ignore_eos = f.ignore_eos;
    o.include_usage = !f.no_usage;
    o.temperature = f.temperature;
    o.max_concurrency = f.max_concurrency;
    o.shape = load_shape(f, rate, f.seed + i);
    o.progress = !f.no_progress;
    o.label = std::isfinite(rate) ? fmt::format("rate {:g}", rate) : "rate inf";
    const std::optional<SpecCounters> spec_before = scrape_spec_counters(io, client);
    RunResult run = run_load(io, client, workload, o);
    const std::optional<SpecCounters> spec_after = scrape_spec_counters(io, client);
    Metrics m = compute_metrics(run, {f.slo_ttft_ms, f.slo_tpot_ms}, rate, f.save_detailed);
    if (spec_before && spec_after)
      m.speculation = SpecCounters{spec_after->drafted - spec_before->drafted,
                                   spec_after->accepted - spec_before->accepted,
                                   spec_after->jump_forward - spec_before->jump_forward};
    m.label = f.label;
    m.max_concurrency = f.max_concurrency;
    std::fputs(metrics_table(m).c_str(), stdout);
    std::fflush(stdout);
    json block = metrics_json(m);
    block["seed"] = f.seed + i;
    results.push_back(std::move(block));
    all.push_back(std::move(m));
  }

  if (!f.output_json.empty()) {
    json config = {{"base_url", f.base_url},
                   {"endpoint", endpoint},
                   {"model", model},
                   {"tokenizer", dir},
                   {"dataset", f.dataset},
                   {"dataset_path", f.dataset_path},
                   {"num_prompts", f.num_prompts},
                   {"requests", requests},
                   {"input_len", f.input_len},
                   {"output_len", f.output_len},
                   {"range_ratio", f.range_ratio},
                   {"ignore_eos", f.ignore_eos},
                   {"max_concurrency", f.max_concurrency},
                   {"burst", {{"factor", f.burst_factor}, {"start_s", f.burst_start}, {"duration_s", f.burst_duration}}},
                   {"diurnal", {{"amplitude", f.diurnal_amplitude}, {"period_s", f.diurnal_period}}},
                   {"seed", f.seed}};
    if (f.dataset == "shared-prefix")
      config["shared_prefix"] = {{"groups", f.sp_groups},
                                 {"prompts_per_group", f.sp_prompts_per_group},
                                 {"system_len", f.sp_system_len},
                                 {"question_len", f.sp_question_len}};
    if (f.dataset == "multi-turn") config["turns"] = f.mt_turns;
    std::ofstream out(f.output_json);
    BASALT_CHECK(out.good(), "--output-json {}: cannot write it", f.output_json);
    out << json{{"config", config}, {"results", results}}.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    BASALT_CHECK(out.good(), "--output-json {}: write failed", f.output_json);
  }
  if (!f.output_svg.empty()) {
    std::ofstream out(f.output_svg);
    BASALT_CHECK(out.good(), "--output-svg {}: cannot write it", f.output_svg);
    out << render_svg(all, fmt::format("basalt bench: {} on {}{}", f.dataset, f.base_url, endpoint));
    BASALT_CHECK(out.good(), "--output-svg {}: write failed", f.output_svg);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  BenchFlags& f = *flags;
  CLI::App* cmd = app.add_subcommand("bench", "Load-test an OpenAI-compatible server: TTFT, ITL, TPOT, E2E, goodput");
  cmd->add_option("--base-url", f.base_url, "Server, http[s]://HOST[:PORT][/PREFIX] (default http://127.0.0.1:8000)");
  cmd->add_option("--endpoint", f.endpoint, "/v1/completions (default) or /v1/chat/completions");
  cmd->add_option("--served-model-name", f.served_model_name,
                  "The request's \"model\" (default: the first of GET /v1/models)");
  cmd->add_option("--api-key", f.api_key, "Bearer key (default: $BASALT_API_KEY, then $OPENAI_API_KEY)");
  cmd->add_option("--model", f.model, "Model directory whose tokenizer sizes prompts (default: the bundled model)");
  cmd->add_option("--dataset", f.dataset, "random (default), shared-prefix, multi-turn or sharegpt");
  cmd->add_option("--dataset-path", f.dataset_path, "ShareGPT JSON or JSONL file (--dataset sharegpt)");
  cmd->add_option("--num-prompts", f.num_prompts, "Prompts (random, sharegpt) or conversations (multi-turn); default 100");
  cmd->add_option("--input-len", f.input_len, "Prompt tokens (random) or question tokens per turn (multi-turn); default 256");
  cmd->add_option("--output-len", f.output_len, "max_tokens per request (default 128; sharegpt: the answer's length)")
      ->each([&f](const std::string&) { f.output_len_set = true; });
  cmd->add_option("--range-ratio", f.range_ratio,
                  "Spread lengths uniformly over [L(1-r), L(1+r)] (default 0: fixed)");
  cmd->add_option("--sp-groups", f.sp_groups, "shared-prefix: groups, each with its own system prompt (default 4)");
  cmd->add_option("--sp-prompts-per-group", f.sp_prompts_per_group, "shared-prefix: questions per group (default 8)");
  cmd->add_option("--sp-system-len", f.sp_system_len, "shared-prefix: system prompt tokens (default 512)");
  cmd->add_option("--sp-question-len", f.sp_question_len, "shared-prefix: question tokens (default 64)");
  cmd->add_option("--mt-turns", f.mt_turns, "multi-turn: turns per conversation (default 4)");
  cmd->add_option("--max-input-len", f.max_input_len, "sharegpt: skip prompts longer than this (default 1024)");
  cmd->add_flag("--ignore-eos", f.ignore_eos, "Send ignore_eos so every answer is exactly max_tokens (vLLM, Basalt)");
  cmd->add_flag("--no-usage", f.no_usage, "Do not ask for stream_options.include_usage (count chunks only)");
  cmd->add_option("--temperature", f.temperature, "Sampling temperature (default 0; < 0: not sent)");
  cmd->add_option("--request-rate", f.request_rate, "Poisson arrivals per second, or inf: all at once (default inf)");
  cmd->add_option("--sweep-rates", f.sweep_rates,
                  "Run once per rate, e.g. 1,2,4,inf (one result block each; rate k uses seed + k, so fresh prompts)");
  cmd->add_option("--max-concurrency", f.max_concurrency, "Requests in flight at most (default 0: no limit)");
  cmd->add_option("--burst-factor", f.burst_factor, "Multiply the rate by this during the burst (default 1)");
  cmd->add_option("--burst-start", f.burst_start, "Seconds into the run the burst begins (default 0)");
  cmd->add_option("--burst-duration", f.burst_duration, "Seconds the burst lasts (default 0: no burst)");
  cmd->add_option("--diurnal-amplitude", f.diurnal_amplitude,
                  "Swing the rate by 1 + A sin(2 pi t / period), A in [0, 1] (default 0: steady)");
  cmd->add_option("--diurnal-period", f.diurnal_period, "Seconds of one diurnal cycle (default 86400)");
  cmd->add_option("--seed", f.seed, "Seed for prompts and arrivals (default 0)");
  cmd->add_option("--timeout", f.timeout, "Seconds one request may take before it counts as a timeout (default 600)");
  cmd->add_option("--slo-ttft-ms", f.slo_ttft_ms, "Goodput SLO: time to first token at most this (default: none)");
  cmd->add_option("--slo-tpot-ms", f.slo_tpot_ms, "Goodput SLO: time per output token at most this (default: none)");
  cmd->add_option("--output-json", f.output_json, "Write config and results as JSON here");
  cmd->add_flag("--save-detailed", f.save_detailed,
                "Add every request to --output-json: its index in the trace, when it was due, TTFT, E2E, tokens "
                "and error (`basalt sim --save-detailed` writes the same)");
  cmd->add_option("--output-svg", f.output_svg, "Write latency CDFs and throughput over time as SVG here");
  cmd->add_option("--label", f.label, "A name for this run in the table, JSON and picture");
  cmd->add_flag("--no-progress", f.no_progress, "No progress output on stderr");
  cmd->add_option("--workflow", f.workflow,
                  "Drive this workflow of a `basalt route --workflows` gateway instead: --num-prompts runs at "
                  "--request-rate (and --max-concurrency), reporting end-to-end percentiles");
  cmd->add_option("--workflow-input", f.workflow_input,
                  "The runs' input (--workflow): a JSON object, or a file holding one (default {})");
  cmd->add_flag("--insecure", f.insecure, "https: do not verify the server's certificate");
  cmd->add_flag("--cold-start", f.cold_start,
                "Measure `basalt serve`'s start instead: start it --cold-start-runs times on --model (arguments "
                "after -- go to serve), time each start phase and the first request, and compare with reading "
                "the weights at the disk's and the page cache's measured rates (--timeout: seconds to ready)");
  cmd->add_option("--cold-start-runs", f.cold_start_runs, "--cold-start: starts per cache state (default 5)");
  cmd->add_option("--cold-start-cache", f.cold_start_cache,
                  "--cold-start: cold (the weights' pages dropped from the page cache before each start), warm, "
                  "or both (default)");
  cmd->add_flag("--json", f.json, "--cold-start: print the report as JSON instead of a table");
  cmd->add_option("serve_args", f.serve_args, "--cold-start: after --, arguments for `basalt serve`");
  cmd->callback([flags, cmd] { run_bench(*flags, *cmd); });
}

}  // namespace basalt
