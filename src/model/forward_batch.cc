#include "model/forward_batch.h"

#include <numeric>
#include <vector>

#include "core/error.h"

namespace basalt {

ForwardBatch single_sequence_batch(std::span<const int32_t> new_tokens, int64_t start_position,
                                   bool all_logits) {
  const int64_t n = static_cast<int64_t>(new_tokens.size());
  BASALT_CHECK(n > 0, "a forward batch needs at least one token");
  BASALT_CHECK(start_position >= 0 && start_position + n < (int64_t{1} << 31),
               "position {} out of range", start_position + n);
  ForwardBatch b;
  b.token_ids = Tensor::from_i32({n}, new_tokens);
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(start_position));
  b.positions = Tensor::from_i32({n}, positions);
  b.out_slots = Tensor::from_i32({n}, positions);
  const int32_t kv_len = static_cast<int32_t>(start_position + n);
  const std::vector<int32_t> q_start = {0, static_cast<int32_t>(n)};
  const std::vector<int32_t> kv_start = {0, kv_len};
  std::vector<int32_t> slots(static_cast<size_t>(kv_len));
  std::iota(slots.begin(), slots.end(), 0);
  b.attention.q_start = Tensor::from_i32({2}, q_start);
  b.attention.kv_start = Tensor::from_i32({2}, kv_start);
  b.attention.kv_slots = Tensor::from_i32({kv_len}, slots);
  if (all_logits) {
    std::vector<int32_t> rows(static_cast<size_t>(n));
    std::iota(rows.begin(), rows.end(), 0);
    b.logit_rows = Tensor::from_i32({n}, rows);
  } else {
    const int32_t last = static_cast<int32_t>(n - 1);
    b.logit_rows = Tensor::from_i32({1}, std::span<const int32_t>(&last, 1));
  }
  return b;
}

namespace {

Tensor to_device(const Tensor& t, Backend& backend) {
  if (t.device() == backend.device() || t.raw() == nullptr) return t;
  Tensor out = backend.empty(t.shape(), t.dtype());
  backend.copy(t, out);
  return out;
}

}  // namespace

ForwardBatch on_backend(const ForwardBatch& batch, Backend& backend) {
  if (backend.device() == Device::kCpu) return batch;
  ForwardBatch out;
  out.token_ids = to_device(batch.token_ids, backend);
  out.positions = to_device(batch.positions, backend);
  out.out_slots = to_device(batch.out_slots, backend);
  out.attention.q_start = to_device(batch.attention.q_start, backend);
  out.attention.kv_start = to_device(batch.attention.kv_start, backend);
  out.attention.kv_slots = to_device(batch.attention.kv_slots, backend);
  out.logit_rows = to_device(batch.logit_rows, backend);
  return out;
}

}  // namespace basalt
