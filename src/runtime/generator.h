// Generator: runs one request to completion on a model, without batching.
//
// Contract: generate() prefills the prompt in one step, then decodes one token
// per step, with the sequence's KV in slots 0..n-1 of a private KV buffer.
// Each step: the model's logits; the raw logprobs, if asked for (the full
// softmax at temperature 1, before any adjustment: vLLM's default
// "raw_logprobs"); the LogitsProcessor (min_tokens, logit_bias, penalties;
// runtime/logits_processor.h); the backend's sample op (temperature, top-k,
// top-p, min-p). Sampling is deterministic in the seed; without one a random
// seed is drawn and reported in the result.
//
// Finishing, checked after each token, in this order:
//  * an eos id (options.eos_ids, unless ignore_eos) or one of stop_token_ids:
//    "stop", the token stays in output_ids; stop_reason is the id for
//    stop_token_ids and empty for eos, as vLLM reports them. Its text is left
//    out of `text` unless include_stop_str_in_output.
//  * a stop string in the text (needs a tokenizer): "stop", stop_reason the
//    string; output_ids end with the token that completed it and `text` ends
//    before the string (or after it with include_stop_str_in_output).
//  * max_tokens tokens: "length".
// Stop ids and stop strings do not act before min_tokens tokens are out.
//
// With a tokenizer, the text is built as it streams: IncrementalDecoder, then
// StopChecker (runtime/stop_checker.h), so on_text receives exactly the
// pieces whose concatenation is result.text, never text past a stop string.
// Ids the tokenizer does not know (models pad their embedding rows past the
// vocabulary) carry no text. Without a tokenizer, stop strings are an error
// and the text is empty.
//
// This is the offline path `basalt generate` uses until the
// continuous-batching engine exists; it is also the reference the engine's
// outputs are compared against. It runs one sequence: n must be 1.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/request.h"
#include "runtime/sampling_params.h"
#include "tokenizer/tokenizer.h"

namespace basalt {

struct GenerateOptions : SamplingParams {
  GenerateOptions() { max_tokens = 64; }
  // The model's end-of-sequence ids (usually ModelConfig::eos_token_ids);
  // they finish generation unless ignore_eos.
  std::vector<int32_t> eos_ids;
  // The most alternatives `logprobs` may ask for.
  int max_logprobs = kDefaultMaxLogprobs;
};

struct GenerateResult {
  std::vector<int32_t> output_ids;
  // One list per output token (when options.logprobs > 0): the top
  // alternatives by natural-log probability of the full softmax at
  // temperature 1, before any adjustment or filter.
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  std::string finish_reason;  // "length" or "stop"
  StopReason stop_reason;
  // The detokenized output (empty without a tokenizer).
  std::string text;
  // The seed the draws used (options.seed, or the one drawn for the request).
  uint64_t seed = 0;
};

struct GenerateCallbacks {
  std::function<void(int32_t)> on_token;         // each token as it is sampled
  std::function<void(std::string_view)> on_text;  // text as it becomes final
};

GenerateResult generate(Model& model, Backend& backend, const Tokenizer* tokenizer,
                        std::span<const int32_t> prompt, const GenerateOptions& options,
                        const GenerateCallbacks& callbacks = {});

// Without a tokenizer: on_token(id) is called as each token is produced.
GenerateResult generate(Model& model, Backend& backend, std::span<const int32_t> prompt,
                        const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token = {});

// The k largest entries of one row of log-probabilities, by value then lower id.
std::vector<TokenLogprob> top_k_logprobs(std::span<const float> logprobs, int k);

}  // namespace basalt
