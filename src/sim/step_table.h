// StepTable: how long a simulated replica's engine step takes, and what one
// replica holds, read from a small JSON file fitted to measurements
// (bench/sim/*.json, each citing where its numbers come from).
//
// Contract:
//  * The file is a JSON object:
//      name                  text, shown in reports
//      source                text: where the figures come from
//      decode_ms             [[batch, ms], ...]: the time of an engine step that
//                            decodes `batch` requests (one token each) and
//                            prefills nothing; batches >= 1, strictly
//                            increasing, times > 0, at least one point
//      prefill_tokens_per_s  > 0: what a step's prefill tokens cost on top
//                            (tokens / rate)
//      prefill_fixed_ms      >= 0, optional (0): added to a step that prefills
//                            anything (fitted, with the rate, from the time to
//                            first token of two prompt lengths)
//      prefill_ms_per_1m_pairs  >= 0, optional (0): what a prefill chunk's
//                            attention adds per million (query, key) pairs:
//                            a chunk of c tokens after s tokens already in
//                            the KV cache has c x (s + (c + 1) / 2) of them
//      decode_context_tokens >= 0, optional (0): the context (prompt plus
//                            output so far) of each sequence when decode_ms
//                            was measured
//      decode_ms_per_1k_context  >= 0, optional (0): what 1,000 tokens of
//                            context more (summed over the decoding
//                            sequences) than batch x decode_context_tokens
//                            add to a step (attention reads them); less
//                            context saves as much
//      max_running           >= 1: requests a replica runs at once (the
//                            engine's --max-running)
//      step_token_budget     >= 1: decode tokens plus prefill chunks per
//                            step (the scheduler's budget)
//      kv_capacity_tokens    >= 1: the KV pool, tokens
//      gpus_per_replica      >= 1, optional (1): what GPU-hours count
//    An unknown key, a missing or mistyped one, or a value out of range is a
//    basalt::Error naming the file and the key.
//  * step_ms({decode_batch, context_tokens, prefill_tokens, prefill_pairs}) =
//    max(decode(decode_batch) + (context_tokens - decode_batch x
//    decode_context_tokens) / 1000 x decode_ms_per_1k_context, the first
//    point's ms) for a batch >= 1 (0 without decoding) + (prefill_tokens > 0
//    ? prefill_fixed_ms + prefill_tokens * 1000 / prefill_tokens_per_s +
//    prefill_pairs / 1e6 x prefill_ms_per_1m_pairs : 0), context_tokens
//    being the decoding sequences' summed context and prefill_pairs the
//    chunks' summed (query, key) pairs,
//    where decode(0) = 0 and decode(b) interpolates decode_ms linearly
//    between points; below the first point it is the first point's time (a
//    step costs at least what the smallest measured one did); past the last
//    point it extends the last segment's slope (with one point, the time
//    grows in proportion to the batch).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace basalt::sim {

struct StepTable {
  std::string name;
  std::string source;
  std::vector<std::pair<double, double>> decode_ms;  // (batch, ms)
  double prefill_tokens_per_s = 0;
  double prefill_fixed_ms = 0;
  double prefill_ms_per_1m_pairs = 0;
  double decode_context_tokens = 0;
  double decode_ms_per_1k_context = 0;
  int64_t max_running = 64;
  int64_t step_token_budget = 512;
  int64_t kv_capacity_tokens = 0;
  int64_t gpus_per_replica = 1;

  double decode_step_ms(int64_t batch) const;
  struct Step {
    int64_t decode_batch = 0;
    int64_t context_tokens = 0;  // summed over the decoding sequences
    int64_t prefill_tokens = 0;
    double prefill_pairs = 0;  // summed over the prefill chunks
  };
  double step_ms(const Step& step) const;
  // The (query, key) pairs of a chunk of `chunk` tokens after `before` cached ones.
  static double chunk_pairs(int64_t before, int64_t chunk);
};

// Parses and validates the file's text; `label` names it in errors.
StepTable parse_step_table(const std::string& text, const std::string& label);
StepTable load_step_table(const std::string& path);

}  // namespace basalt::sim
