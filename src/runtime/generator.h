// Generator: runs one request to completion on a model, without batching.
//
// Contract: generate() prefills the prompt in one step, then decodes one token
// per step, with the sequence's KV in slots 0..n-1 of a private KV buffer.
// It stops after max_tokens tokens ("length") or after a stop id unless
// ignore_eos ("stop"; the stop token is part of output_ids). Sampling is
// deterministic in the seed. This is the offline path `basalt generate` uses
// until the continuous-batching engine exists; it is also the reference the
// engine's outputs are compared against.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace basalt {

struct GenerateOptions {
  int max_tokens = 64;
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  int top_logprobs = 0;  // how many alternatives to report per token (0: none)
  bool ignore_eos = false;
  std::vector<int32_t> stop_ids;  // usually the model's eos ids
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct GenerateResult {
  std::vector<int32_t> output_ids;
  // One list per output token: the top alternatives by natural-log
  // probability of the full softmax at temperature 1, before any filter.
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  std::string finish_reason;  // "length" or "stop"
};

// on_token(id) is called as each token is produced (for streaming output).
GenerateResult generate(Model& model, Backend& backend, std::span<const int32_t> prompt,
                        const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token = {});

// The k largest entries of one row of log-probabilities, by value then lower id.
std::vector<TokenLogprob> top_k_logprobs(std::span<const float> logprobs, int k);

}  // namespace basalt
