#include "backend/host_qkv.h"

#include <cstring>

#include "core/error.h"

namespace basalt {

void host_qkv_rope_store(Backend& ops, const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                         const Tensor& positions, const RopeParams& rope, int num_heads, int num_kv_heads,
                         const Tensor& slots, Tensor& k_cache, Tensor& v_cache, Tensor& q_out) {
  const int64_t D = rope.head_dim;
  BASALT_CHECK(num_heads > 0 && num_kv_heads > 0 && D > 0, "qkv_rope_store: {} heads, {} kv heads, head_dim {}",
               num_heads, num_kv_heads, D);
  const int64_t q_width = num_heads * D, kv_width = num_kv_heads * D;
  BASALT_CHECK(qkv.device() == Device::kCpu && qkv.dtype() == DType::kF32 && qkv.rank() == 2 &&
                   qkv.dim(1) == q_width + 2 * kv_width,
               "qkv_rope_store: qkv must be f32 [tokens, {}] on the host, got {}", q_width + 2 * kv_width,
               qkv.describe());
  const int64_t T = qkv.dim(0);
  BASALT_CHECK(q_out.device() == Device::kCpu && q_out.dtype() == DType::kF32 && q_out.rank() == 2 &&
                   q_out.dim(0) == T && q_out.dim(1) == q_width,
               "qkv_rope_store: q_out must be f32 [{}, {}] on the host, got {}", T, q_width, q_out.describe());
  Tensor q = Tensor::empty({T, q_width}, DType::kF32);
  Tensor k = Tensor::empty({T, kv_width}, DType::kF32);
  Tensor v = Tensor::empty({T, kv_width}, DType::kF32);
  const float* src = qkv.data<const float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* row = src + t * (q_width + 2 * kv_width);
    std::memcpy(q.data<float>() + t * q_width, row, static_cast<size_t>(q_width) * sizeof(float));
    std::memcpy(k.data<float>() + t * kv_width, row + q_width, static_cast<size_t>(kv_width) * sizeof(float));
    std::memcpy(v.data<float>() + t * kv_width, row + q_width + kv_width,
                static_cast<size_t>(kv_width) * sizeof(float));
  }
  if (q_norm != nullptr) {
    Tensor heads = q.reshape({T * num_heads, D});
    ops.rms_norm(heads, *q_norm, eps, heads);
  }
  if (k_norm != nullptr) {
    Tensor heads = k.reshape({T * num_kv_heads, D});
    ops.rms_norm(heads, *k_norm, eps, heads);
  }
  RopeParams q_rope = rope, k_rope = rope;
  q_rope.num_heads = num_heads;
  k_rope.num_heads = num_kv_heads;
  ops.rope(q, positions, q_rope);
  ops.rope(k, positions, k_rope);
  ops.store_kv(k, v, slots, k_cache, v_cache);
  std::memcpy(q_out.data<float>(), q.data<const float>(), q.nbytes());
}

}  // namespace basalt
