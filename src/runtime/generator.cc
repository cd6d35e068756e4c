#include "runtime/generator.h"

#include <algorithm>

#include "core/error.h"

namespace basalt {

std::vector<TokenLogprob> top_k_logprobs(std::span<const float> logprobs, int k) {
  std::vector<int32_t> order(logprobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  const size_t n = std::min(order.size(), static_cast<size_t>(std::max(k, 0)));
  std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(n), order.end(),
                    [&](int32_t a, int32_t b) {
                      if (logprobs[static_cast<size_t>(a)] != logprobs[static_cast<size_t>(b)])
                        return logprobs[static_cast<size_t>(a)] > logprobs[static_cast<size_t>(b)];
                      return a < b;
                    });
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < n; ++i) out.push_back({order[i], logprobs[static_cast<size_t>(order[i])]});
  return out;
}

GenerateResult generate(Model& model, Backend& backend, std::span<const int32_t> prompt,
                        const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token) {
  const ModelConfig& config = model.config();
  BASALT_CHECK(!prompt.empty(), "the prompt is empty");
  BASALT_CHECK(options.max_tokens >= 0, "max_tokens must be non-negative");
  for (int32_t id : prompt)
    BASALT_CHECK(id >= 0 && id < config.vocab_size, "prompt token id {} is outside the vocabulary (0..{})", id, config.vocab_size - 1);
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + options.max_tokens;
  BASALT_CHECK(capacity <= config.max_position_embeddings,
               "prompt ({} tokens) plus max_tokens ({}) exceeds the model's context length ({})",
               prompt.size(), options.max_tokens, config.max_position_embeddings);

  GenerateResult result;
  result.finish_reason = "length";
  if (options.max_tokens == 0) return result;

  KvBuffers kv = model.allocate_kv(capacity);
  Tensor logits = backend.empty({1, config.vocab_size}, DType::kF32);
  Tensor logprobs = backend.empty({1, config.vocab_size}, DType::kF32);
  Tensor next = backend.empty({1}, DType::kI32);
  Tensor host_logprobs = Tensor::empty({1, config.vocab_size}, DType::kF32);
  Tensor host_next = Tensor::empty({1}, DType::kI32);

  std::vector<int32_t> step_tokens(prompt.begin(), prompt.end());
  int64_t position = 0;
  for (int step = 0; step < options.max_tokens; ++step) {
    ForwardBatch batch = single_sequence_batch(step_tokens, position);
    model.forward(batch, kv, logits);
    position += static_cast<int64_t>(step_tokens.size());

    if (options.top_logprobs > 0) {
      backend.log_softmax(logits, logprobs);
      backend.copy(logprobs, host_logprobs);
      result.top_logprobs.push_back(top_k_logprobs(
          std::span<const float>(host_logprobs.data<float>(), static_cast<size_t>(config.vocab_size)),
          options.top_logprobs));
    }
    const SamplingRow row{options.temperature, options.top_k, options.top_p, options.min_p,
                          options.seed, static_cast<uint64_t>(step)};
    backend.sample(logits, std::span<const SamplingRow>(&row, 1), next);
    backend.copy(next, host_next);
    const int32_t token = host_next.data<int32_t>()[0];
    result.output_ids.push_back(token);
    if (on_token) on_token(token);
    if (!options.ignore_eos &&
        std::find(options.stop_ids.begin(), options.stop_ids.end(), token) != options.stop_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
    step_tokens.assign(1, token);
  }
  return result;
}

}  // namespace basalt
