// The engine on a random-weight small Llama on the CPU backend:
//
//  1. a shared-prefix workload (64 requests: a 512-token system prompt plus a
//     32-token question each, 16 greedy output tokens), all submitted at once,
//     with the radix cache on and then off: wall time, output tokens/s,
//     prompt tokens actually computed, the cache hit rate and TTFT;
//  2. overlap scheduling off vs on with 1, 32 and 256 requests decoding
//     together: output tokens/s, the scheduler's own CPU time per step
//     (everything but the model and the sampler: picking requests, slots,
//     building the ForwardBatch, stop checks, events), the model+sampler time
//     per step, and the bubble (the executor idle between steps while the
//     scheduler works), best of --repeats runs.
//
//   basalt_bench_engine [--layers N] [--hidden N] [--requests N] [--prefix N]
//                       [--question N] [--tokens N] [--decode-tokens N] [--repeats N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "bench_util.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "runtime/engine.h"

namespace {

namespace bench = basalt::bench;
using basalt::EngineMetrics;
using basalt::EngineOptions;
using basalt::EngineRequest;
using basalt::RequestHandle;
using basalt::SamplingParams;

struct Run {
  double wall_s = 0;
  EngineMetrics metrics;
};

Run run_requests(basalt::Model& model, basalt::Backend& backend, const EngineOptions& options,
                 const std::vector<EngineRequest>& requests) {
  basalt::Engine engine(model, backend, nullptr, options);
  const auto start = bench::Clock::now();
  std::vector<RequestHandle> handles;
  for (const EngineRequest& r : requests) handles.push_back(engine.submit(r));
  for (RequestHandle& h : handles) {
    const basalt::RequestOutput out = basalt::collect(*h);
    if (out.reason == basalt::FinishReason::kError) {
      std::fprintf(stderr, "request failed: %s\n", out.error.c_str());
      std::exit(1);
    }
  }
  Run run;
  run.wall_s = bench::seconds_since(start);
  run.metrics = engine.metrics();
  return run;
}

SamplingParams greedy(int tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = tokens;
  p.ignore_eos = true;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 4, hidden = 256, num_requests = 64, prefix = 512, question = 32, tokens = 16;
  int decode_tokens = 64, repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--layers") layers = value;
    else if (flag == "--hidden") hidden = value;
    else if (flag == "--requests") num_requests = value;
    else if (flag == "--prefix") prefix = value;
    else if (flag == "--question") question = value;
    else if (flag == "--tokens") tokens = value;
    else if (flag == "--decode-tokens") decode_tokens = value;
    else if (flag == "--repeats") repeats = std::max(1, value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const int64_t H = hidden, I = 4 * hidden, heads = 8, kv_heads = 4, D = hidden / heads, V = 4096;

  const auto dir = std::filesystem::temp_directory_path() /
                   ("basalt_engine_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  nlohmann::json config = {{"model_type", "llama"}, {"vocab_size", V}, {"hidden_size", H},
                           {"intermediate_size", I}, {"num_hidden_layers", layers},
                           {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
                           {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", true},
                           {"max_position_embeddings", 4096}, {"rope_theta", 10000.0}};
  std::ofstream(dir / "config.json") << config.dump(1);
  {
    uint64_t seed = 1;
    std::vector<std::pair<std::string, basalt::Tensor>> tensors;
    tensors.emplace_back("model.embed_tokens.weight", bench::random_bf16({V, H}, 0.05f, seed++));
    tensors.emplace_back("model.norm.weight", bench::random_bf16({H}, 1.0f, seed++));
    for (int l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      tensors.emplace_back(p + "input_layernorm.weight", bench::random_bf16({H}, 1.0f, seed++));
      tensors.emplace_back(p + "post_attention_layernorm.weight", bench::random_bf16({H}, 1.0f, seed++));
      tensors.emplace_back(p + "self_attn.q_proj.weight", bench::random_bf16({heads * D, H}, 0.05f, seed++));
      tensors.emplace_back(p + "self_attn.k_proj.weight", bench::random_bf16({kv_heads * D, H}, 0.05f, seed++));
      tensors.emplace_back(p + "self_attn.v_proj.weight", bench::random_bf16({kv_heads * D, H}, 0.05f, seed++));
      tensors.emplace_back(p + "self_attn.o_proj.weight", bench::random_bf16({H, heads * D}, 0.05f, seed++));
      tensors.emplace_back(p + "mlp.gate_proj.weight", bench::random_bf16({I, H}, 0.05f, seed++));
      tensors.emplace_back(p + "mlp.up_proj.weight", bench::random_bf16({I, H}, 0.05f, seed++));
      tensors.emplace_back(p + "mlp.down_proj.weight", bench::random_bf16({H, I}, 0.05f, seed++));
    }
    basalt::write_safetensors((dir / "model.safetensors").string(), tensors);
  }
  basalt::CpuBackend backend;
  auto model = basalt::load_model(dir.string(), backend);
  std::filesystem::remove_all(dir);
  std::printf("random Llama: %d layers, hidden %d, vocab %lld; %d threads\n\n", layers, hidden,
              static_cast<long long>(V), basalt::ThreadPool::global().size());

  // 1. Shared prefix, cache on vs off.
  bench::Rng rng(7);
  const auto random_ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<int32_t>(2 + rng.next() % static_cast<uint64_t>(V - 2));
    return v;
  };
  const std::vector<int32_t> system = random_ids(prefix);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < num_requests; ++i) {
    EngineRequest r;
    r.prompt = system;
    const auto q = random_ids(question);
    r.prompt.insert(r.prompt.end(), q.begin(), q.end());
    r.params = greedy(tokens);
    requests.push_back(std::move(r));
  }
  std::printf("shared prefix: %d requests x (%d + %d prompt tokens), %d output tokens each\n",
              num_requests, prefix, question, tokens);
  std::printf("%-6s %9s %12s %16s %10s %11s %11s\n", "cache", "wall s", "out tok/s",
              "prompt computed", "hit rate", "TTFT p50 s", "TTFT max s");
  for (bool cache : {true, false}) {
    EngineOptions o;
    o.radix_cache = cache;
    o.kv_slots = static_cast<int64_t>(num_requests) * (prefix + question + tokens);
    o.max_running = num_requests;
    o.step_token_budget = 2048;
    const Run run = run_requests(*model, backend, o, requests);
    const EngineMetrics& m = run.metrics;
    std::printf("%-6s %9.2f %12.1f %9llu/%-6llu %9.1f%% %11.3f %11.3f\n", cache ? "on" : "off",
                run.wall_s, static_cast<double>(m.output_tokens) / run.wall_s,
                static_cast<unsigned long long>(m.prefill_tokens),
                static_cast<unsigned long long>(m.prompt_tokens), 100.0 * m.cache_hit_rate(),
                m.ttft.quantile(0.5), m.ttft.max);
  }

  // 2. Overlap off vs on: throughput, scheduler CPU time and the executor's
  // idle time per step at 1, 32 and 256 running requests.
  std::printf("\ndecode, overlap off vs on (8-token prompts, %d output tokens each)\n", decode_tokens);
  std::printf("%-8s %-8s %8s %11s %14s %12s %12s %12s %10s\n", "running", "overlap", "steps",
              "out tok/s", "sched us/step", "exec us/step", "step us", "bubble us", "discarded");
  for (int n : {1, 32, 256}) {
    std::vector<EngineRequest> batch;
    for (int i = 0; i < n; ++i) {
      EngineRequest r;
      r.prompt = random_ids(8);
      r.params = greedy(decode_tokens);
      batch.push_back(std::move(r));
    }
    for (bool overlap : {false, true}) {
      EngineOptions o;
      o.overlap = overlap;
      o.kv_slots = static_cast<int64_t>(n) * (8 + decode_tokens);
      o.max_running = n;
      o.step_token_budget = std::max(512, 8 * n);
      // The best of `repeats` runs: the machine is shared.
      Run best;
      for (int rep = 0; rep < repeats; ++rep) {
        Run run = run_requests(*model, backend, o, batch);
        if (rep == 0 || run.wall_s < best.wall_s) best = run;
      }
      const EngineMetrics& m = best.metrics;
      std::printf("%-8d %-8s %8llu %11.1f %14.1f %12.1f %12.1f %12.1f %10llu\n", n,
                  overlap ? "on" : "off", static_cast<unsigned long long>(m.execute_time.count),
                  static_cast<double>(m.output_tokens) / best.wall_s, m.schedule_time.mean() * 1e6,
                  m.execute_time.mean() * 1e6, m.step_time.mean() * 1e6, m.bubble.mean() * 1e6,
                  static_cast<unsigned long long>(m.discarded_tokens));
    }
  }
  return 0;
}
