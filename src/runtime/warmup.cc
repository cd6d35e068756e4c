#include "runtime/warmup.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "core/error.h"

namespace basalt {

WarmupReport warm_up(Engine& engine, const WarmupOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& config = engine.model_config();
  const int decode = std::max(1, options.decode_tokens);
  // Lengths 1, 2, 4, ... while the prompts so far fit in half the pool and
  // each leaves room for its output under the context length.
  int64_t limit = options.max_prompt_tokens;
  if (config.max_position_embeddings > 0) limit = std::min<int64_t>(limit, config.max_position_embeddings - decode);
  std::vector<int64_t> lengths;
  int64_t total = 0;
  for (int64_t n = 1; n <= limit; n *= 2) {
    if (2 * (total + n + decode) > engine.kv_capacity()) break;
    lengths.push_back(n);
    total += n + decode;
  }
  std::mt19937 rng(20261204);
  const int32_t vocab = static_cast<int32_t>(config.vocab_size);
  std::uniform_int_distribution<int32_t> id(std::min(vocab - 1, 100), vocab - 1);
  std::vector<RequestHandle> handles;
  WarmupReport report;
  for (const int64_t n : lengths) {
    EngineRequest r;
    r.prompt.resize(static_cast<size_t>(n));
    for (int32_t& t : r.prompt) t = id(rng);
    r.params.max_tokens = decode;
    r.params.temperature = 0.0f;
    r.params.ignore_eos = true;
    handles.push_back(engine.submit(std::move(r)));
    ++report.requests;
    report.prompt_tokens += n;
    report.longest_prompt = n;
  }
  for (const RequestHandle& h : handles) {
    const RequestOutput out = collect(*h);
    if (out.reason == FinishReason::kError) fail("warm-up: a request failed: {}", out.error);
    report.output_tokens += static_cast<int64_t>(out.output_ids.size());
  }
  engine.drain_and_clear_cache();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace basalt
