// qkv_rope_store for host backends, composed of the backend's own ops.
//
// Contract: host_qkv_rope_store(ops, ...) computes Backend::qkv_rope_store
// (backend.h) on host tensors by copying the q, k and v columns of qkv into
// f32 tensors of their own, then calling ops.rms_norm (per head), ops.rope and
// ops.store_kv on them, and copying q into q_out. So a host backend's fused
// op gives exactly its unfused ops' bits. Arguments are checked here and by
// those ops; a mismatch throws basalt::Error.
#pragma once

#include "backend/backend.h"

namespace basalt {

void host_qkv_rope_store(Backend& ops, const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                         const Tensor& positions, const RopeParams& rope, int num_heads, int num_kv_heads,
                         const Tensor& slots, Tensor& k_cache, Tensor& v_cache, Tensor& q_out);

}  // namespace basalt
