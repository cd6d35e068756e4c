#include "runtime/sampling_params.h"

#include <cmath>
#include <random>

#include "backend/sampling_rng.h"
#include "core/error.h"

namespace basalt {

void SamplingParams::validate(int32_t vocab_size, int max_logprobs) const {
  BASALT_CHECK(n >= 1, "n must be at least 1, got {}", n);
  BASALT_CHECK(std::isfinite(temperature) && temperature >= 0,
               "temperature must be a non-negative number, got {}", temperature);
  BASALT_CHECK(top_k >= -1, "top_k must be -1, 0 (off) or positive, got {}", top_k);
  BASALT_CHECK(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got {}", top_p);
  BASALT_CHECK(min_p >= 0 && min_p <= 1, "min_p must be in [0, 1], got {}", min_p);
  BASALT_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0,
               "repetition_penalty must be greater than 0, got {}", repetition_penalty);
  BASALT_CHECK(frequency_penalty >= -2 && frequency_penalty <= 2,
               "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  BASALT_CHECK(presence_penalty >= -2 && presence_penalty <= 2,
               "presence_penalty must be in [-2, 2], got {}", presence_penalty);
  for (const auto& [id, bias] : logit_bias) {
    BASALT_CHECK(id >= 0 && id < vocab_size,
                 "logit_bias: token id {} is outside the vocabulary (0..{})", id, vocab_size - 1);
    BASALT_CHECK(bias >= -100 && bias <= 100,
                 "logit_bias: the bias of token {} must be in [-100, 100], got {}", id, bias);
  }
  BASALT_CHECK(max_tokens >= 0, "max_tokens must be non-negative, got {}", max_tokens);
  BASALT_CHECK(min_tokens >= 0, "min_tokens must be non-negative, got {}", min_tokens);
  BASALT_CHECK(min_tokens <= max_tokens, "min_tokens ({}) must not exceed max_tokens ({})",
               min_tokens, max_tokens);
  for (const std::string& s : stop) BASALT_CHECK(!s.empty(), "stop: stop strings must not be empty");
  for (int32_t id : stop_token_ids)
    BASALT_CHECK(id >= 0 && id < vocab_size,
                 "stop_token_ids: token id {} is outside the vocabulary (0..{})", id, vocab_size - 1);
  for (int32_t id : allowed_token_ids)
    BASALT_CHECK(id >= 0 && id < vocab_size,
                 "allowed_token_ids: token id {} is outside the vocabulary (0..{})", id, vocab_size - 1);
  for (const std::vector<int32_t>& word : bad_words_ids) {
    BASALT_CHECK(!word.empty(), "bad_words: a word has no tokens");
    for (int32_t id : word)
      BASALT_CHECK(id >= 0 && id < vocab_size, "bad_words: token id {} is outside the vocabulary (0..{})", id,
                   vocab_size - 1);
  }
  BASALT_CHECK(logprobs >= 0 && logprobs <= max_logprobs, "logprobs must be in 0..{}, got {}",
               max_logprobs, logprobs);
  BASALT_CHECK(prompt_logprobs >= -1 && prompt_logprobs <= max_logprobs,
               "prompt_logprobs must be in 0..{} (or -1: off), got {}", max_logprobs,
               prompt_logprobs);
  BASALT_CHECK(
      prompt_logprobs < 0 || max_tokens >= 1,
      "prompt_logprobs needs max_tokens >= 1 (the prompt is scored on the way to the first token)");
}

SamplingRow SamplingParams::row(uint64_t seed_value, uint64_t step) const {
  return SamplingRow{temperature, top_k < 0 ? 0 : top_k, top_p, min_p, seed_value, step};
}

uint64_t random_seed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
}

uint64_t sample_seed(uint64_t seed, int index) {
  if (index == 0) return seed;
  return sampling_mix64(seed ^ sampling_mix64(static_cast<uint64_t>(index)));
}

}  // namespace basalt
