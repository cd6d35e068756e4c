// ForwardBatch: everything one model step needs to know about its tokens.
//
// Contract: the caller (the offline generator now, the scheduler later) fills
// it; the model only reads it. Prefill, chunked prefill, decode and
// speculative verification are all this one structure with different shapes:
// T new tokens with their positions and the KV slot each writes, the slots
// each sequence reads (attention layout, in position order, ending with the
// new tokens' own slots) and the rows whose logits are wanted.
#pragma once

#include "backend/backend.h"
#include "core/tensor.h"

#include <span>

namespace basalt {

// How a step's rows relate to their requests, as SGLang's ForwardMode names
// it. Models may specialise on it (a decode-only step replays a CUDA graph);
// the tensors below are the same structure in every mode.
enum class ForwardMode : uint8_t {
  kExtend,  // prefill chunks only
  kDecode,  // one token per sequence, one logits row each
  kMixed,   // decodes and prefill chunks together
  kVerify,  // a sequence's last token and its draft tokens, every row with logits
  kDraft,   // a draft model's own steps
};
const char* to_string(ForwardMode mode);

struct ForwardBatch {
  ForwardMode mode = ForwardMode::kMixed;
  Tensor token_ids;   // i32 [T]
  Tensor positions;   // i32 [T]
  Tensor out_slots;   // i32 [T]: the KV slot each new token writes
  AttentionLayout attention;
  Tensor logit_rows;  // i32 [L]: rows of the T tokens whose logits are computed

  int64_t num_tokens() const { return token_ids.numel(); }
};

}  // namespace basalt

namespace basalt {

// The same batch on the backend's device: each tensor copied there with
// backend.empty + copy (the batch itself when the backend is the CPU's, or
// the tensors already live on the device). Models call it first in forward.
ForwardBatch on_backend(const ForwardBatch& batch, Backend& backend);

// A batch of host tensors from its arrays (their meaning above), in the
// default mode (kMixed: nothing assumed of its shape).
ForwardBatch host_forward_batch(std::span<const int32_t> token_ids, std::span<const int32_t> positions,
                                std::span<const int32_t> out_slots, std::span<const int32_t> q_start,
                                std::span<const int32_t> kv_start, std::span<const int32_t> kv_slots,
                                std::span<const int32_t> logit_rows);

// The batch for one sequence whose KV occupies slots 0..start+n-1 in position
// order (slot == position): new_tokens sit at positions start..start+n-1 and
// only the last token's logits are wanted. Host tensors.
ForwardBatch single_sequence_batch(std::span<const int32_t> new_tokens, int64_t start_position,
                                   bool all_logits = false);

}  // namespace basalt
