#include "model/forward_batch.h"

#include <algorithm>
#include <iterator>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace basalt {

const char* to_string(ForwardMode mode) {
  switch (mode) {
    case ForwardMode::kExtend: return "extend";
    case ForwardMode::kDecode: return "decode";
    case ForwardMode::kMixed: return "mixed";
    case ForwardMode::kVerify: return "verify";
    case ForwardMode::kDraft: return "draft";
  }
  return "?";
}

ForwardBatch host_forward_batch(std::span<const int32_t> token_ids, std::span<const int32_t> positions,
                                std::span<const int32_t> out_slots, std::span<const int32_t> q_start,
                                std::span<const int32_t> kv_start, std::span<const int32_t> kv_slots,
                                std::span<const int32_t> logit_rows) {
  const auto t = [](std::span<const int32_t> v) { return Tensor::from_i32({static_cast<int64_t>(v.size())}, v); };
  ForwardBatch b;
  b.token_ids = t(token_ids);
  b.positions = t(positions);
  b.out_slots = t(out_slots);
  b.attention.q_start = t(q_start);
  b.attention.kv_start = t(kv_start);
  b.attention.kv_slots = t(kv_slots);
  b.logit_rows = t(logit_rows);
  return b;
}

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

ForwardBatch on_backend(const ForwardBatch& batch, Backend& backend) {
  if (backend.device() == Device::kCpu) return batch;
  const Tensor* parts[] = {&batch.token_ids,         &batch.positions,          &batch.out_slots,
                           &batch.attention.q_start, &batch.attention.kv_start, &batch.attention.kv_slots,
                           &batch.logit_rows};
  // The host tensors go up in one copy (a transfer costs far more than its
  // bytes at these sizes); tensors already on the device are used as they are.
  int64_t total = 0;
  for (const Tensor* p : parts)
    if (p->device() == Device::kCpu && p->raw() != nullptr) {
      BASALT_CHECK(p->dtype() == DType::kI32 && p->rank() == 1, "forward batch: {} must be i32 [n]",
                   p->describe());
      total += p->numel();
    }
  ForwardBatch out = batch;
  if (total == 0) return out;
  Tensor packed = Tensor::empty({total}, DType::kI32);
  int64_t at = 0;
  for (const Tensor* p : parts)
    if (p->device() == Device::kCpu && p->raw() != nullptr) {
      std::copy_n(p->data<const int32_t>(), p->numel(), packed.data<int32_t>() + at);
      at += p->numel();
    }
  Tensor device = backend.empty({total}, DType::kI32);
  backend.upload(packed, device);  // queued behind the work before it, without a wait
  Tensor* outs[] = {&out.token_ids,         &out.positions,          &out.out_slots,
                    &out.attention.q_start, &out.attention.kv_start, &out.attention.kv_slots,
                    &out.logit_rows};
  at = 0;
  for (size_t i = 0; i < std::size(parts); ++i)
    if (parts[i]->device() == Device::kCpu && parts[i]->raw() != nullptr) {
      *outs[i] = device.rows(at, parts[i]->numel());
      at += parts[i]->numel();
    }
  return out;
}

}  // namespace basalt
