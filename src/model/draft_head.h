// DraftHead: a small model that drafts the next tokens from the target
// model's final hidden states (DeepSeek's multi-token-prediction layer; an
// EAGLE-style head), for speculative decoding and for measuring how often a
// draft would be accepted.
//
// Contract: token i of `batch` follows the target model's token at the same
// position, and hidden f32 [T, hidden_size] holds the target's final hidden
// state (Model::forward's `hidden`, after the final norm) at that position.
// forward() runs the head at batch.positions with its own KV cache (from
// allocate_kv, indexed by the same kind of slots as the target's) and writes
// logits f32 [L, vocab] for batch.logit_rows, predicting the token after
// token i; with hidden_out it also writes its own hidden state f32
// [T, hidden_size] before its output norm (what vLLM's MTP feeds back as the
// next `hidden` when it drafts several tokens in a chain).
// A head belongs to its model: it lives as long as the model and is used by
// the model's thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"
#include "model/forward_batch.h"

namespace basalt {

struct KvBuffers;

class DraftHead {
 public:
  virtual ~DraftHead() = default;
  // KV storage for num_slots token slots of the head's own layers.
  virtual KvBuffers allocate_kv(int64_t num_slots, DType dtype = DType::kF32) const = 0;
  // Bytes of that storage per token slot.
  virtual size_t kv_bytes_per_slot(DType dtype) const = 0;
  virtual void forward(const ForwardBatch& batch, const Tensor& hidden, KvBuffers& kv, Tensor& logits,
                       Tensor* hidden_out = nullptr) = 0;
};

}  // namespace basalt
