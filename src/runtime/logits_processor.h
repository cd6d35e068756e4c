// LogitsProcessor: the per-request logit adjustments that run on the host
// before the sample op: min_tokens suppression, logit bias and the
// repetition, frequency and presence penalties.
//
// Contract: a LogitsProcessor belongs to one sequence. It is built from
// validated SamplingParams (it validates them again), the vocabulary size,
// the ids that end a sequence and the prompt; the caller then alternates
// apply() on the step's f32 logits row and append() of the sampled token.
// Token counts are kept incrementally: append() is O(1) and apply() touches
// only the distinct tokens seen so far (plus the biased and stop ids), never
// the whole vocabulary or the whole sequence.
//
// apply() transforms the row in vLLM V1's order (vllm/v1/sample/sampler.py:
// bad words, the non-argmax-invariant processors min_tokens then logit_bias,
// then apply_all_penalties with repetition, frequency, presence):
//  0. bad_words_ids: for each sequence whose ids but the last are the last
//     output tokens (all of them for a one-id sequence), its last id gets
//     -inf (vllm/v1/sample/ops/bad_words.py: only the output is matched).
//  1. min_tokens: while the output has fewer than min_tokens tokens, the
//     stop ids (eos unless ignore_eos, and stop_token_ids) get -inf. At
//     exactly min_tokens output tokens the suppression is lifted.
//  2. logit_bias: logit[id] += bias.
//  3. repetition_penalty r, for each id in the prompt or the output:
//     logit > 0 ? logit / r : logit * r (vLLM's apply_penalties, HF's
//     RepetitionPenaltyLogitsProcessor).
//  4. frequency_penalty f and presence_penalty p, for each id with
//     count c > 0 occurrences in the output: logit -= f * c + p.
// The four steps are expressed as Backend LogitEdits (backend.h), one per
// touched token, merged: edits() lists them for the engine to apply on the
// device with Backend::adjust_logits, and apply() applies the same edits with
// apply_logit_edit, so there is one definition of the arithmetic. The merged
// edit gives the value of the four steps done in turn (see LogitEdit).
// Temperature, top-k, top-p and min-p follow in the sample op. The reported
// logprobs are taken before all of this (vLLM's default logprobs_mode
// "raw_logprobs"): they are the model's own distribution.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "runtime/sampling_params.h"

namespace basalt {

class LogitsProcessor {
 public:
  // eos_ids are the model's end-of-sequence ids (suppressed under min_tokens
  // unless params.ignore_eos); ids outside the vocabulary throw.
  LogitsProcessor(const SamplingParams& params, int32_t vocab_size,
                  std::span<const int32_t> eos_ids, std::span<const int32_t> prompt);

  // Whether apply() may change anything at the current step; when false the
  // caller may skip the host round trip of the logits.
  bool active() const;
  // Adjusts one row of logits [vocab_size] in place.
  void apply(std::span<float> logits) const;
  // Appends the current step's edits for logits row `row`, one per touched
  // token, in increasing token order (none when !active()).
  void edits(int32_t row, std::vector<LogitEdit>& out) const;
  // Records one sampled output token.
  void append(int32_t id);
  // Forgets the last n appended tokens (n <= those appended): a
  // verification step sees each draft row's edits with the drafts before it
  // appended, then takes them back.
  void rollback(int n);

  int num_output_tokens() const { return num_output_; }

 private:
  int32_t vocab_size_;
  int min_tokens_;
  float repetition_penalty_;
  float frequency_penalty_;
  float presence_penalty_;
  std::vector<std::pair<int32_t, float>> bias_;
  std::vector<std::vector<int32_t>> bad_words_;
  std::vector<int32_t> suppressed_;  // stop ids held back until min_tokens
  // Repetition penalty: which ids appear in the prompt or the output, and
  // the list of those ids.
  std::vector<uint8_t> seen_;
  std::vector<int32_t> seen_ids_;
  // Frequency and presence: per-id output counts and the ids with count > 0.
  std::vector<int32_t> counts_;
  std::vector<int32_t> output_ids_;
  int num_output_ = 0;
  // Per appended token, what rollback() undoes: the id, and whether it was
  // first seen (seen_ids_) or first counted (output_ids_) by that append.
  struct Appended {
    int32_t id;
    bool first_seen, first_counted;
  };
  std::vector<Appended> appended_;
};

}  // namespace basalt
