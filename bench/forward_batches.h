// Host ForwardBatches for the whole-model benchmarks: B sequences decoding
// one token (or verifying a few) over cached context, or B prompts
// prefilled together.
//
// Contract: sequence s owns KV slots [s * stride, s * stride + context]
// (stride > context); token ids are spread over [0, vocab). The batches are
// host tensors (the models upload them, or a GraphedModel copies them into
// its recorded inputs).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/forward_batch.h"

namespace basalt::bench {

inline ForwardBatch host_batch(const std::vector<int32_t>& ids, const std::vector<int32_t>& positions,
                               const std::vector<int32_t>& out_slots, const std::vector<int32_t>& q_start,
                               const std::vector<int32_t>& kv_start, const std::vector<int32_t>& kv_slots,
                               const std::vector<int32_t>& logit_rows) {
  return host_forward_batch(ids, positions, out_slots, q_start, kv_start, kv_slots, logit_rows);
}

// B sequences, each with `context` cached tokens, decoding one token at
// position `context` (its slot right after them); logits for every row.
// With rows > 1, each sequence verifies rows tokens at positions context ..
// context + rows - 1 (a speculative verification: the last token and its
// drafts; stride > context + rows - 1), logits for every row.
inline ForwardBatch decode_batch(int64_t batch, int64_t context, int64_t stride, int64_t vocab, int64_t rows = 1) {
  std::vector<int32_t> ids, positions, out_slots, q_start{0}, kv_start{0}, kv_slots, logit_rows;
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t r = 0; r < rows; ++r) {
      ids.push_back(static_cast<int32_t>((s * 7919 + r * 104729 + 13) % vocab));
      positions.push_back(static_cast<int32_t>(context + r));
      out_slots.push_back(static_cast<int32_t>(s * stride + context + r));
      logit_rows.push_back(static_cast<int32_t>(logit_rows.size()));
    }
    for (int64_t p = 0; p < context + rows; ++p) kv_slots.push_back(static_cast<int32_t>(s * stride + p));
    q_start.push_back(static_cast<int32_t>(ids.size()));
    kv_start.push_back(static_cast<int32_t>(kv_slots.size()));
  }
  return host_batch(ids, positions, out_slots, q_start, kv_start, kv_slots, logit_rows);
}

// B prompts of `context` tokens, prefilled together; the last row of each
// gets logits.
inline ForwardBatch prefill_batch(int64_t batch, int64_t context, int64_t stride, int64_t vocab) {
  std::vector<int32_t> ids, positions, out_slots, q_start{0}, kv_start{0}, kv_slots, logit_rows;
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t p = 0; p < context; ++p) {
      ids.push_back(static_cast<int32_t>((s * 131 + p * 7919 + 13) % vocab));
      positions.push_back(static_cast<int32_t>(p));
      out_slots.push_back(static_cast<int32_t>(s * stride + p));
      kv_slots.push_back(static_cast<int32_t>(s * stride + p));
    }
    q_start.push_back(static_cast<int32_t>(ids.size()));
    kv_start.push_back(static_cast<int32_t>(kv_slots.size()));
    logit_rows.push_back(static_cast<int32_t>(ids.size() - 1));
  }
  return host_batch(ids, positions, out_slots, q_start, kv_start, kv_slots, logit_rows);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace basalt::bench
