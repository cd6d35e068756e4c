// SamplingParams: one request's sampling and stopping controls, with the
// meaning and limits of vLLM's SamplingParams and the OpenAI API.
//
// Contract: a SamplingParams is plain data; validate() checks every field
// against its documented range (and token ids against the vocabulary) and
// throws basalt::Error naming the field and the bad value. Code that consumes
// the params (LogitsProcessor, StopChecker, the generator) validates first,
// so the rest of the runtime may rely on valid values.
//
// Where the controls act (see logits_processor.h for the exact order):
//  * the LogitsProcessor, on the host, before sampling: bad_words_ids,
//    min_tokens suppression, logit_bias, repetition_penalty,
//    frequency_penalty, presence_penalty;
//  * the backend's sample op (backend/backend.h): temperature, top_k, top_p,
//    min_p, drawn from the seed;
//  * a TokenConstraint (runtime/allowed_tokens.h) that the scheduler gives a
//    request whose allowed_token_ids is not empty: only those ids are
//    sampled;
//  * the generator and StopChecker, after sampling: eos (unless ignore_eos),
//    stop_token_ids, stop strings, max_tokens.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace basalt {

// vLLM's default --max-logprobs: the most alternatives a request may ask for.
inline constexpr int kDefaultMaxLogprobs = 20;

struct SamplingParams {
  // Completions to sample for the prompt (>= 1). The single-request
  // generator runs exactly one; n > 1 is the engine's scheduler's business.
  int n = 1;

  // --- the sample op -------------------------------------------------------
  float temperature = 1.0f;  // >= 0, finite; 0 is greedy
  int top_k = 0;             // 0 or -1: off; else keep the k most likely tokens
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  // The random draw is a pure function of (seed, step). Absent: the request
  // gets a fresh random seed (random_seed()), so two runs differ.
  std::optional<uint64_t> seed;

  // --- the LogitsProcessor -------------------------------------------------
  // Hugging Face / vLLM: for every token in the prompt or the output so far,
  // a positive logit is divided by it and a negative one multiplied. > 0; 1: off.
  float repetition_penalty = 1.0f;
  // OpenAI: logit -= frequency_penalty * count + presence_penalty * (count > 0),
  // with count the token's occurrences in the output so far (not the
  // prompt). Each in [-2, 2]; 0: off.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // Until the output has min_tokens tokens, eos (unless ignore_eos) and
  // stop_token_ids get logit -inf and stop strings do not match.
  int min_tokens = 0;

  // --- stopping ------------------------------------------------------------
  // Tokens to generate at most (>= 0; the generator returns nothing for 0).
  int max_tokens = 16;
  bool include_stop_str_in_output = false;
  // Generation stops after any of these ids (whatever ignore_eos says).
  std::vector<int32_t> stop_token_ids;
  // Keep going after the model's end-of-sequence ids.
  bool ignore_eos = false;

  // --- output --------------------------------------------------------------
  // Alternatives to report per output token (0: none), at most max_logprobs.
  int logprobs = 0;
  // Report the drawn token's own logprob (the OpenAI API's token_logprobs),
  // also when logprobs is 0.
  bool sampled_logprob = false;
  // vLLM's prompt_logprobs: -1 off; else for every prompt token after the
  // first, its logprob and rank given the tokens before it, and this many
  // alternatives (at most max_logprobs). The prompt is then computed whole:
  // no prefix of it is taken from the radix cache.
  int prompt_logprobs = -1;
  bool skip_special_tokens = true;

  // --- containers, last: the scheduler reads the scalar fields above for
  // every running request every step, and they stay on few cache lines.
  // The LogitsProcessor's: added to the token's logit; ids in the
  // vocabulary, biases in [-100, 100].
  std::map<int32_t, float> logit_bias;
  // Stopping: generation stops when the text contains one of these
  // (non-empty) strings; the string itself is left out of the text unless
  // include_stop_str_in_output.
  std::vector<std::string> stop;
  // vLLM's allowed_token_ids: when not empty, only these ids are sampled
  // (ids in the vocabulary; the eos ids only if listed, so a request that
  // leaves them out runs to max_tokens or a stop string).
  std::vector<int32_t> allowed_token_ids;
  // vLLM's bad_words as token sequences (the server tokenizes the words,
  // bad_words_token_ids): a sequence's last id gets logit -inf wherever the
  // output so far ends with the ids before it (a one-id sequence: always).
  // Each sequence non-empty, its ids in the vocabulary.
  std::vector<std::vector<int32_t>> bad_words_ids;

  // Throws basalt::Error naming the first field out of range. vocab_size
  // bounds logit_bias, stop_token_ids, allowed_token_ids and bad_words_ids
  // ids; max_logprobs bounds logprobs and prompt_logprobs.
  void validate(int32_t vocab_size, int max_logprobs = kDefaultMaxLogprobs) const;

  // The sample op's controls for one step, drawn from `seed_value`.
  SamplingRow row(uint64_t seed_value, uint64_t step) const;
};

// A fresh seed from the operating system's entropy source.
uint64_t random_seed();

// The seed of sample `index` (0-based) of a request with seed `seed`: sample
// 0 uses the seed itself, so n = 1 draws what a plain request draws, and the
// other samples get unrelated streams.
uint64_t sample_seed(uint64_t seed, int index);

}  // namespace basalt
