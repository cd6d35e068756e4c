// `basalt serve`: the OpenAI-compatible server (server/api_server.h) over one
// engine, on the CPU or (--device cuda) the GPU backend.
//
// Lifecycle: the port is bound first, so /health answers and /ready says 503
// while the model loads; then /ready turns 200. Each phase of the start
// (core/startup.h) logs a `startup` line with the seconds since the process
// started, and /metrics carries them as basalt_engine_startup_seconds.
// SIGTERM or SIGINT starts a drain: the listening socket closes, /ready
// answers 503, new generation requests get 503, running ones finish until
// --drain-timeout, the rest are cut off (a 503, or an error event on a
// stream, logged as cut by the server), and the process exits 0. A second
// signal skips the wait.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <pthread.h>
#include <string>
#include <thread>
#include <vector>

#include "app/commands.h"
#include "app/http_flags.h"
#include "app/model_dir.h"
#include "app/device_choice.h"
#include "app/parallel_flags.h"
#include "app/speculation_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "core/startup.h"
#include "model/config.h"
#include "model/graphed_model.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/warmup.h"
#include "runtime/kv_pool.h"
#include "server/api_server.h"
#include "server/http_auth.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

struct ServeFlags {
  HttpFlags http;
  std::string model;
  std::string served_model_name;
  int max_running = 64;
  int max_queue = 1024;
  int max_n = 0;
  int threads = 0;
  ParallelFlags parallel;
  double kv_fraction = -1;  // unset: the device's default (kv_budget_bytes)
  int64_t kv_slots = 0;
  int64_t max_model_len = 0;
  int64_t step_token_budget = 512;
  bool no_radix_cache = false;
  bool overlap = false;
  bool jump_forward = false;
  bool no_jump_forward = false;
  SpeculationFlags speculation;
  int page_size = 1;
  std::string policy = "lpm";
  double drain_timeout = 30;
  bool log_text = false;
  std::string tool_call_parser = "auto";
  std::string reasoning_parser;
  std::string device = "cpu";
  std::string fp8_compute = "auto";
  bool batch_invariant = false;
  std::string dtype = "auto";
  bool enforce_eager = false;
  std::string warmup = "auto";
  std::string kv_cache_dtype = "auto";
};

std::chrono::milliseconds millis(double seconds) {
  BASALT_CHECK(seconds > 0 && seconds < 1e7, "timeouts must be positive seconds, got {}", seconds);
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

void log_lifecycle(const char* event, std::initializer_list<std::pair<const char*, std::string>> fields) {
  LogLine line(event);
  for (const auto& [key, value] : fields) line.add(key, value);
  line.emit();
}

void run_serve(const ServeFlags& f) {
  HttpServerOptions http = http_server_options(f.http);
  BASALT_CHECK(f.max_n >= 0, "--max-n must be >= 0");
  BASALT_CHECK(f.threads >= 0 && f.threads <= 4096, "--threads must be in [0, 4096], got {}", f.threads);
  BASALT_CHECK(f.max_running >= 1, "--max-running must be >= 1");
  BASALT_CHECK(f.max_queue >= 0, "--max-queue must be >= 0");
  BASALT_CHECK(f.kv_fraction == -1 || (f.kv_fraction > 0 && f.kv_fraction <= 1),
               "--kv-cache-fraction must be in (0, 1]");
  BASALT_CHECK(f.page_size >= 1 && f.page_size <= 4096, "--page-size must be in [1, 4096]");
  BASALT_CHECK(f.policy == "lpm" || f.policy == "fcfs", "--schedule-policy must be lpm or fcfs");
  check_parallel_flags(f.parallel, f.speculation.algorithm);
  check_batch_invariant(f.batch_invariant, f.fp8_compute, f.device, f.parallel.tp > 1 && !f.parallel.dp_attention);
  check_fp8_compute(f.fp8_compute, f.device);
  check_dtype(f.dtype, f.device);
  start_startup_timeline();
  const std::string dir = model_dir_or_bundled(f.model);
  // The context limit is checked before the weights load, so a wrong flag
  // fails in a second.
  const ModelConfig config = ModelConfig::load(dir);
  BASALT_CHECK(f.max_model_len >= 0, "--max-model-len must be >= 0");
  BASALT_CHECK(f.max_model_len <= config.max_position_embeddings,
               "--max-model-len {} is above the model's context length ({}, max_position_embeddings in "
               "{}/config.json)",
               f.max_model_len, config.max_position_embeddings, dir);

  // A node other than 0 of a model over several machines runs its ranks
  // for node 0, which serves (model/multi_node.h); it has no server.
  if (f.parallel.node_rank > 0) {
    // SIGTERM does not end a worker: its group's pods get it together, and
    // node 0 first drains its requests, which need this node's ranks; node
    // 0 stopping (or the link breaking) ends it, within the pod's grace.
    std::signal(SIGTERM, SIG_IGN);
    serve_as_node_worker(dir, *make_flagged_backend(f.device, f.threads, f.fp8_compute, f.batch_invariant, f.dtype),
                         f.parallel);
    return;
  }

  const std::vector<std::string> keys = api_keys(f.http);

  // Signals are taken by sigwait on this thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  const uint64_t open_files = raise_file_limit_for_connections(f.http, 1);

  std::atomic<ApiServer*> api{nullptr};
  const bool request_log = !f.http.no_request_log;
  http.on_rejection = [&api, request_log](const TransportRejection& r) {
    if (ApiServer* a = api.load()) return a->note_rejection(r.status, r.remote, r.method, r.path, r.reason);
    if (request_log) transport_rejection_line(r, {}).emit();
  };
  HttpServer server(http, [&api, request_log](HttpRequest& request) -> HandlerResult {
    if (ApiServer* a = api.load()) return a->handle(request);
    HttpResponse r;
    if (request.path == "/health") {
      r.body = R"({"status":"ok"})";
    } else {
      r.status = 503;
      r.body = error_body(503, "the model is still loading", "server_error");
      r.headers.emplace_back("Retry-After", "5");
      if (request_log)
        LogLine("request").add("remote", request.remote).add("path", request.path).add("status", 503).add("outcome", "loading").emit();
    }
    return HandlerResult{std::move(r), nullptr};
  });
  server.start();
  mark_startup_phase("listening");
  log_lifecycle("listening",
                {{"url", fmt::format("{}://{}:{}", http_scheme(f.http), f.http.host, server.port())}, {"model_dir", dir}});

  // The tokenizer (a large tokenizer.json takes a while to parse) loads on
  // a thread of its own while the weights load; the engine is the first to
  // need it.
  // (A broken tokenizer is reported once the weights have loaded.)
  std::future<TokenizerBundle> tokenizer_loading = std::async(std::launch::async, [&dir] {
    const auto start = Clock::now();
    TokenizerBundle loaded = load_tokenizer_dir(dir);
    LogLine("tokenizer")
        .add("seconds", std::chrono::duration<double>(Clock::now() - start).count())
        .add("since_start_s", seconds_since_process_start())
        .emit();
    return loaded;
  });
  std::optional<TokenizerBundle> tokenizer_loaded;
  std::unique_ptr<Backend> backend_owner =
      make_flagged_backend(f.device, f.threads, f.fp8_compute, f.batch_invariant, f.dtype);
  Backend& backend = *backend_owner;
  EngineOptions options;
  options.max_running = f.max_running;
  options.step_token_budget = f.step_token_budget;
  options.radix_cache = !f.no_radix_cache;
  options.overlap = f.overlap;
  options.jump_forward = jump_forward_choice(f.jump_forward, f.no_jump_forward, backend);
  apply_speculation_flags(f.speculation, backend, options, f.enforce_eager ? 0 : std::min(f.max_running, 4096));
  options.page_size = f.page_size;
  options.kv_dtype = kv_cache_dtype(f.kv_cache_dtype, backend);
  options.policy = f.policy == "fcfs" ? SchedulePolicy::kFcfs : SchedulePolicy::kLongestPrefixMatch;
  options.kv_slots = f.kv_slots;
  // One engine over the model (on `backend`, or tensor-parallel over --tp
  // ranks), or with --dp-attention an engine per rank behind one group.
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> single;
  DpAttentionEngines dp;
  std::vector<Engine*> engines;
  const int graph_batch = f.enforce_eager ? 0 : std::min(f.max_running, 4096);
  if (f.parallel.dp_attention) {
    if (options.kv_slots == 0) options.kv_budget_bytes = kv_budget_bytes(f.device, f.kv_fraction);
    dp = DpAttentionEngines::load(dir, f.parallel, backend, {}, graph_batch);
    tokenizer_loaded.emplace(tokenizer_loading.get());
    dp.start(&tokenizer_loaded->tokenizer, options);
    for (int r = 0; r < dp.engines->size(); ++r) engines.push_back(&dp.engines->engine(r));
  } else {
    model = attach_speculation_head(f.speculation, load_model_for_tp(dir, backend, f.parallel, {}, graph_batch), dir,
                                    backend);
    // Over GPU ranks each rank records its own graphs (load_model_for_tp).
    if (graph_batch > 0 && f.parallel.tp == 1)
      model = make_graphed_model(std::move(model), backend, {.max_batch = graph_batch});
    // The KV budget is taken from what the weights left free.
    if (options.kv_slots == 0) options.kv_budget_bytes = kv_budget_bytes(f.device, f.kv_fraction);
    tokenizer_loaded.emplace(tokenizer_loading.get());
    single = std::make_unique<Engine>(*model, backend, &tokenizer_loaded->tokenizer, options);
    engines.push_back(single.get());
  }
  EngineClient& engine = single ? static_cast<EngineClient&>(*single) : *dp.engines;
  const TokenizerBundle& tokenizer = *tokenizer_loaded;

  // The first work, before /ready: on a GPU, the kernels, GEMM plans and
  // memory the first requests would otherwise wait for (runtime/warmup.h).
  if (f.warmup == "on" || (f.warmup == "auto" && backend.device() != Device::kCpu)) {
    for (Engine* e : engines) {
      const WarmupReport w = warm_up(*e, {.max_prompt_tokens = std::max<int64_t>(f.step_token_budget * 2, 1024)});
      LogLine("warmup")
          .add("requests", w.requests)
          .add("prompt_tokens", w.prompt_tokens)
          .add("longest_prompt", w.longest_prompt)
          .add("seconds", w.seconds)
          .emit();
    }
    mark_startup_phase("warmup");
  }

  ApiServerOptions api_options;
  api_options.served_model_name =
      f.served_model_name.empty() ? std::filesystem::path(dir).filename().string() : f.served_model_name;
  api_options.api_keys = keys;
  api_options.max_queue = f.max_queue;
  api_options.max_running = f.max_running;
  api_options.max_n = f.max_n;
  api_options.max_model_len = f.max_model_len;
  api_options.log_requests = !f.http.no_request_log;
  api_options.log_text = f.log_text;
  api_options.tool_call_parser = f.tool_call_parser;
  api_options.reasoning_parser = f.reasoning_parser;
  ApiServer api_server(engine, tokenizer.tokenizer, tokenizer.config, api_options);
  api_server.set_connection_counter([&server] { return server.open_connections(); });
  mark_startup_phase("ready");
  api_server.set_startup_phases(startup_phases());
  api_server.set_ready(true);
  api.store(&api_server);
  LogLine("ready")
      .add("model", api_options.served_model_name)
      .add("device", f.device)
      .add("tp", f.parallel.tp)
      .add("dp_attention", f.parallel.dp_attention)
      .add("dp", f.parallel.dp_attention ? f.parallel.dp_groups() : 1)
      .add("kv_slots", engine.kv_capacity())
      .add("max_model_len", api_server.max_model_len())
      .add("tool_call_parser", api_server.tool_call_parser())
      .add("api_keys", !keys.empty())
      .add("open_files", open_files)
      .add("since_start_s", startup_phases().back().since_start_s)
      .emit();

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  LogLine("draining")
      .add("signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT")
      .add("drain_timeout_s", f.drain_timeout)
      .add("in_flight", api_server.in_flight())
      .emit();
  api_server.start_draining();
  server.stop_accepting();
  const auto deadline = Clock::now() + millis(f.drain_timeout);
  const timespec tick{0, 20 * 1000 * 1000};
  while (api_server.in_flight() > 0 && Clock::now() < deadline) {
    if (sigtimedwait(&signals, nullptr, &tick) > 0) break;  // a second signal: stop now
  }
  // What is left is cut: each response ends with a 503 or an error event,
  // given up to 2 s to reach its client before the connections close.
  api_server.cut_in_flight();
  const auto flush_deadline = Clock::now() + std::chrono::seconds(2);
  while (server.responses_in_progress() > 0 && Clock::now() < flush_deadline) nanosleep(&tick, nullptr);
  server.stop();
  api.store(nullptr);
  LogLine("stopped").add("requests_cut", api_server.server_cuts()).emit();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over the OpenAI-compatible HTTP API");
  ServeFlags& f = *flags;
  add_http_flags(*cmd, f.http);
  cmd->add_option("--model", f.model, "Hugging Face model directory (default: the bundled model)");
  cmd->add_option("--served-model-name", f.served_model_name,
                  "The model name clients use (default: the model directory's name)");
  cmd->add_option("--max-running", f.max_running, "Requests decoded together at most (default 64)");
  cmd->add_option("--max-queue", f.max_queue,
                  "Requests allowed to wait beyond --max-running; more get 429 (default 1024)");
  cmd->add_option("--max-n", f.max_n,
                  "Samples ('n' times prompts) one request may ask for; more get 400 (default 0: half of "
                  "--max-running, at least 1, so one request cannot take every running slot)");
  cmd->add_option("--threads", f.threads,
                  "CPU backend threads (default 0: the BASALT_NUM_THREADS environment variable, else one per "
                  "hardware thread)");
  cmd->add_option("--kv-cache-fraction", f.kv_fraction,
                  "Fraction of memory for the KV pool: of host memory on the CPU (default 0.1), of the GPU memory "
                  "left after the weights with --device cuda (default 0.8)");
  cmd->add_option("--kv-slots", f.kv_slots, "KV pool size in tokens, overriding --kv-cache-fraction (default 0: unset)");
  cmd->add_option("--max-model-len", f.max_model_len,
                  "Context length limit, at most the model's (default 0: the model's)");
  cmd->add_option("--step-token-budget", f.step_token_budget,
                  "Tokens per engine step: decode tokens plus prefill chunks (default 512)");
  cmd->add_flag("--no-radix-cache", f.no_radix_cache, "Turn the radix prefix cache off");
  cmd->add_flag("--jump-forward", f.jump_forward,
                "Structured output: draft the text the grammar forces (keys, punctuation) and verify it in one step; "
                "the output is token for token that of plain decoding (default on with --device cuda, off on the CPU, "
                "where the extra rows cost compute)");
  cmd->add_flag("--no-jump-forward", f.no_jump_forward, "Structured output: sample every token (see --jump-forward)");
  add_speculation_flags(*cmd, f.speculation);
  cmd->add_flag("--overlap", f.overlap,
                "Schedule step N+1 while step N runs on an executor thread (default off: on the CPU "
                "backend the model already uses every core)");
  cmd->add_option("--page-size", f.page_size,
                  "KV slots per page: each request's KV is page-aligned and the prefix cache shares whole pages "
                  "(default 1)");
  cmd->add_option("--schedule-policy", f.policy, "lpm (longest prefix match first) or fcfs (default lpm)");
  cmd->add_option("--drain-timeout", f.drain_timeout,
                  "Seconds running requests may take to finish after SIGTERM (default 30)");
  cmd->add_flag("--log-requests-text", f.log_text, "Also log completion text (off: logs carry ids, sizes, timings)");
  cmd->add_option("--tool-call-parser", f.tool_call_parser,
                  "Chat tool calls: hermes, llama3_json, mistral, deepseek_v3 or deepseek_v31 parses the model's "
                  "calls into tool_calls and lets tool_choice force one; auto detects the format from the chat "
                  "template; none returns calls as text (default auto)");
  cmd->add_option("--reasoning-parser", f.reasoning_parser,
                  "Reasoning models: deepseek_r1 or qwen3 moves the <think> text to reasoning_content (default: "
                  "none)");
  add_parallel_flags(*cmd, f.parallel);
  cmd->add_option("--device", f.device, std::string("Backend: ") + available_devices() + " (default cpu)");
  cmd->add_option("--dtype", f.dtype,
                  kDtypeHelp);
  cmd->add_option("--fp8-compute", f.fp8_compute,
                  "How block-FP8 weights multiply: w8a8 quantizes the activations per 1x128 group (DeepSeek-V3's inference, the GPU default), w8a16 keeps them (weight-only: exact up to the weights' own rounding; on a GPU it keeps a bf16 copy of every FP8 weight); auto: the device's default");
  cmd->add_flag("--batch-invariant", f.batch_invariant, kBatchInvariantHelp);
  cmd->add_option("--kv-cache-dtype", f.kv_cache_dtype,
                  "KV cache element type: auto (bf16 on a GPU, f32 on the CPU), bf16 or f32 (default auto)");
  cmd->add_option("--warmup", f.warmup,
                  "Run synthetic requests before /ready turns 200 (prompts of 1, 2, 4, ... tokens up to twice the "
                  "step budget, at least 1,024), so the first requests do not wait for kernels to load, GEMM plans "
                  "and memory: auto (on for a GPU, off on the CPU), on or off (default auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_flag("--enforce-eager", f.enforce_eager,
                "Launch every decode step's kernels one by one instead of replaying CUDA graphs (GPU only)");
  cmd->callback([flags] { run_serve(*flags); });
}

}  // namespace basalt
