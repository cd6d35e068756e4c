#include "backend/cuda/elementwise.h"

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise_kernels.h"
#include "core/error.h"

namespace basalt {
namespace {

using cuda_kernels::Elem;

Elem elem(DType dtype) {
  switch (dtype) {
    case DType::kF32: return Elem::kF32;
    case DType::kBF16: return Elem::kBF16;
    default: return Elem::kF16;
  }
}

void require_device(const Tensor& t, const char* op, const char* name) {
  BASALT_CHECK(t.device() == Device::kCuda, "cuda {}: {} must be on the device, got {}", op, name, t.describe());
}

void require_activation(const Tensor& t, const char* op, const char* name, int rank) {
  require_device(t, op, name);
  BASALT_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16, "cuda {}: {} must be f32 or bf16, got {}",
               op, name, t.describe());
  BASALT_CHECK(t.rank() == rank, "cuda {}: {} must have rank {}, got {}", op, name, rank, t.describe());
}

void require_weight(const Tensor& t, const char* op, const char* name, int rank) {
  require_device(t, op, name);
  BASALT_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16,
               "cuda {}: {} must be f32, bf16 or f16, got {}", op, name, t.describe());
  BASALT_CHECK(t.rank() == rank, "cuda {}: {} must have rank {}, got {}", op, name, rank, t.describe());
}

void launched(cudaError_t status, const char* op) {
  BASALT_CHECK(status == cudaSuccess, "cuda {}: launch failed: {}", op, cudaGetErrorString(status));
}

void rms_norm_common(Tensor* residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                     cudaStream_t stream, const char* op) {
  require_activation(x, op, "x", 2);
  require_activation(out, op, "out", 2);
  require_weight(weight, op, "weight", 1);
  const int64_t rows = x.dim(0), hidden = x.dim(1);
  BASALT_CHECK(out.shape() == x.shape(), "cuda {}: out {} must have x's shape {}", op, out.describe(),
               x.describe());
  BASALT_CHECK(weight.dim(0) == hidden, "cuda {}: weight {} must be [{}]", op, weight.describe(), hidden);
  if (residual) {
    require_activation(*residual, op, "residual", 2);
    BASALT_CHECK(residual->shape() == x.shape() && residual->dtype() == x.dtype(),
                 "cuda {}: residual {} must match x {}", op, residual->describe(), x.describe());
  }
  BASALT_CHECK(std::isfinite(eps) && eps >= 0, "cuda {}: eps must be finite and >= 0", op);
  if (rows == 0 || hidden == 0) return;
  launched(cuda_kernels::rms_norm(elem(x.dtype()), elem(out.dtype()), elem(weight.dtype()),
                                  residual ? residual->raw() : nullptr,
                                  x.raw(), weight.raw(), out.raw(), rows, hidden, eps, stream),
           op);
}

}  // namespace

void cuda_embedding(const Tensor& ids, const Tensor& table, Tensor& out, cudaStream_t stream) {
  require_device(ids, "embedding", "ids");
  BASALT_CHECK(ids.dtype() == DType::kI32 && ids.rank() == 1, "cuda embedding: ids must be i32 [tokens], got {}",
               ids.describe());
  require_weight(table, "embedding", "table", 2);
  require_activation(out, "embedding", "out", 2);
  const int64_t tokens = ids.dim(0), vocab = table.dim(0), hidden = table.dim(1);
  BASALT_CHECK(out.dim(0) == tokens && out.dim(1) == hidden, "cuda embedding: out must be [{}, {}], got {}", tokens,
               hidden, out.describe());
  if (tokens == 0 || hidden == 0) return;
  launched(cuda_kernels::embedding(elem(out.dtype()), elem(table.dtype()), ids.data<const int32_t>(), table.raw(),
                                   out.raw(), tokens, vocab, hidden, stream),
           "embedding");
}

void cuda_rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out, cudaStream_t stream) {
  rms_norm_common(nullptr, x, weight, eps, out, stream, "rms_norm");
}

void cuda_add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                       cudaStream_t stream) {
  rms_norm_common(&residual, x, weight, eps, out, stream, "add_rms_norm");
}

void cuda_silu_and_mul(const Tensor& gate_up, Tensor& out, cudaStream_t stream) {
  require_activation(gate_up, "silu_and_mul", "gate_up", 2);
  require_activation(out, "silu_and_mul", "out", 2);
  const int64_t tokens = gate_up.dim(0), inter = gate_up.dim(1) / 2;
  BASALT_CHECK(gate_up.dim(1) % 2 == 0, "cuda silu_and_mul: odd width {}", gate_up.describe());
  BASALT_CHECK(out.dim(0) == tokens && out.dim(1) == inter, "cuda silu_and_mul: out must be [{}, {}], got {}",
               tokens, inter, out.describe());
  if (tokens * inter == 0) return;
  launched(cuda_kernels::silu_and_mul(elem(gate_up.dtype()), elem(out.dtype()), gate_up.raw(), out.raw(), tokens,
                                      inter, stream),
           "silu_and_mul");
}

void cuda_add(const Tensor& a, const Tensor& b, Tensor& out, cudaStream_t stream) {
  require_device(a, "add", "a");
  require_device(b, "add", "b");
  require_device(out, "add", "out");
  BASALT_CHECK((a.dtype() == DType::kF32 || a.dtype() == DType::kBF16) && a.dtype() == b.dtype() &&
                   a.dtype() == out.dtype() && a.shape() == b.shape() && a.shape() == out.shape(),
               "cuda add: {} + {} into {}", a.describe(), b.describe(), out.describe());
  if (a.numel() == 0) return;
  launched(cuda_kernels::add(elem(out.dtype()), a.raw(), b.raw(), out.raw(), a.numel(), stream), "add");
}

void cuda_rope(Tensor& x, const Tensor& positions, const RopeParams& params, cudaStream_t stream) {
  require_activation(x, "rope", "x", 2);
  require_device(positions, "rope", "positions");
  const int64_t tokens = x.dim(0);
  const int heads = params.num_heads, head_dim = params.head_dim, rotary = params.rotary_dim;
  BASALT_CHECK(heads > 0 && head_dim > 0 && rotary > 0 && rotary % 2 == 0 && params.rotary_offset >= 0 &&
                   params.rotary_offset + rotary <= head_dim,
               "cuda rope: bad params (heads {}, head_dim {}, rotary_dim {}, rotary_offset {})", heads, head_dim,
               rotary, params.rotary_offset);
  BASALT_CHECK(x.dim(1) == static_cast<int64_t>(heads) * head_dim, "cuda rope: x {} must be [tokens, {}]",
               x.describe(), static_cast<int64_t>(heads) * head_dim);
  BASALT_CHECK(positions.dtype() == DType::kI32 && positions.rank() == 1 && positions.dim(0) == tokens,
               "cuda rope: positions must be i32 [{}], got {}", tokens, positions.describe());
  BASALT_CHECK(params.inv_freq != nullptr, "cuda rope: inv_freq is missing");
  require_device(*params.inv_freq, "rope", "inv_freq");
  BASALT_CHECK(params.inv_freq->dtype() == DType::kF32 && params.inv_freq->numel() == rotary / 2,
               "cuda rope: inv_freq must be f32 [{}], got {}", rotary / 2, params.inv_freq->describe());
  if (tokens == 0) return;
  launched(cuda_kernels::rope(elem(x.dtype()), x.raw(), positions.data<const int32_t>(),
                              params.inv_freq->data<const float>(), tokens, heads, head_dim, rotary,
                              params.rotary_offset, params.style == RopeStyle::kInterleaved,
                              params.attention_scaling, stream),
           "rope");
}

void cuda_qkv_rope_store(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                         const Tensor& positions, const RopeParams& rope, int num_heads, int num_kv_heads,
                         const Tensor& slots, Tensor& k_cache, Tensor& v_cache, Tensor& q_out, cudaStream_t stream) {
  const char* op = "qkv_rope_store";
  require_activation(qkv, op, "qkv", 2);
  require_activation(q_out, op, "q_out", 2);
  require_activation(k_cache, op, "k_cache", 2);
  require_activation(v_cache, op, "v_cache", 2);
  require_device(positions, op, "positions");
  require_device(slots, op, "slots");
  const int D = rope.head_dim, rotary = rope.rotary_dim;
  BASALT_CHECK(num_heads > 0 && num_kv_heads > 0 && D > 0 && D <= 256 && rotary > 0 && rotary % 2 == 0 &&
                   rope.rotary_offset >= 0 && rope.rotary_offset + rotary <= D,
               "cuda {}: bad params (heads {}, kv heads {}, head_dim {} (at most 256), rotary_dim {}, offset {})", op,
               num_heads, num_kv_heads, D, rotary, rope.rotary_offset);
  const int64_t tokens = qkv.dim(0), q_width = int64_t{num_heads} * D, kv_width = int64_t{num_kv_heads} * D;
  BASALT_CHECK(qkv.dim(1) == q_width + 2 * kv_width, "cuda {}: qkv {} must be [tokens, {}]", op, qkv.describe(),
               q_width + 2 * kv_width);
  BASALT_CHECK(q_out.dim(0) == tokens && q_out.dim(1) == q_width, "cuda {}: q_out {} must be [{}, {}]", op,
               q_out.describe(), tokens, q_width);
  BASALT_CHECK(k_cache.dtype() == v_cache.dtype() && k_cache.dim(1) == kv_width && v_cache.dim(1) == kv_width &&
                   k_cache.dim(0) == v_cache.dim(0),
               "cuda {}: caches {} and {} must be [slots, {}] of one dtype", op, k_cache.describe(),
               v_cache.describe(), kv_width);
  for (const Tensor* t : {&positions, &slots})
    BASALT_CHECK(t->dtype() == DType::kI32 && t->rank() == 1 && t->dim(0) == tokens,
                 "cuda {}: positions and slots must be i32 [{}], got {}", op, tokens, t->describe());
  BASALT_CHECK(rope.inv_freq != nullptr && rope.inv_freq->device() == Device::kCuda &&
                   rope.inv_freq->dtype() == DType::kF32 && rope.inv_freq->numel() == rotary / 2,
               "cuda {}: inv_freq must be f32 [{}] on the device", op, rotary / 2);
  const Tensor* norm = q_norm != nullptr ? q_norm : k_norm;
  for (const Tensor* n : {q_norm, k_norm})
    if (n != nullptr) {
      require_weight(*n, op, "norm weight", 1);
      BASALT_CHECK(n->dim(0) == D && n->dtype() == norm->dtype(),
                   "cuda {}: q_norm and k_norm must be [{}] of one dtype, got {}", op, D, n->describe());
    }
  BASALT_CHECK(std::isfinite(eps) && eps >= 0, "cuda {}: eps must be finite and >= 0", op);
  if (tokens == 0) return;
  cuda_kernels::QkvRopeStoreArgs a{};
  a.qkv = qkv.raw();
  a.q_norm = q_norm ? q_norm->raw() : nullptr;
  a.k_norm = k_norm ? k_norm->raw() : nullptr;
  a.eps = eps;
  a.positions = positions.data<const int32_t>();
  a.inv_freq = rope.inv_freq->data<const float>();
  a.rotary = rotary;
  a.offset = rope.rotary_offset;
  a.interleaved = rope.style == RopeStyle::kInterleaved;
  a.scaling = rope.attention_scaling;
  a.num_heads = num_heads;
  a.num_kv_heads = num_kv_heads;
  a.head_dim = D;
  a.slots = slots.data<const int32_t>();
  a.num_slots = k_cache.dim(0);
  a.k_cache = k_cache.raw();
  a.v_cache = v_cache.raw();
  a.q_out = q_out.raw();
  launched(cuda_kernels::qkv_rope_store(elem(qkv.dtype()), elem(q_out.dtype()), elem(k_cache.dtype()),
                                        norm ? elem(norm->dtype()) : Elem::kF32, a, tokens, stream),
           op);
}

void cuda_cast(const Tensor& in, Tensor& out, cudaStream_t stream) {
  require_weight(in, "cast", "in", in.rank());
  require_weight(out, "cast", "out", out.rank());
  BASALT_CHECK(in.shape() == out.shape(), "cuda cast: {} into {}", in.describe(), out.describe());
  if (in.numel() == 0) return;
  launched(cuda_kernels::cast(elem(in.dtype()), elem(out.dtype()), in.raw(), out.raw(), in.numel(), stream), "cast");
}

void cuda_softmax(const Tensor& x, Tensor& out, bool log, cudaStream_t stream) {
  require_device(x, "softmax", "x");
  require_device(out, "softmax", "out");
  BASALT_CHECK(x.dtype() == DType::kF32 && x.rank() == 2 && out.dtype() == DType::kF32 && out.shape() == x.shape(),
               "cuda softmax: x {} and out {} must be f32 [rows, cols]", x.describe(), out.describe());
  if (x.numel() == 0) return;
  launched(cuda_kernels::softmax(x.data<const float>(), out.data<float>(), x.dim(0), x.dim(1), log, stream),
           "softmax");
}

void cuda_argmax(const Tensor& logits, Tensor& out, cudaStream_t stream) {
  require_device(logits, "argmax", "logits");
  require_device(out, "argmax", "out");
  BASALT_CHECK(logits.dtype() == DType::kF32 && logits.rank() == 2 && out.dtype() == DType::kI32 &&
                   out.rank() == 1 && out.dim(0) == logits.dim(0),
               "cuda argmax: logits {} must be f32 [rows, cols] and out {} i32 [rows]", logits.describe(),
               out.describe());
  if (logits.dim(0) == 0) return;
  BASALT_CHECK(logits.dim(1) > 0, "cuda argmax: rows are empty");
  launched(cuda_kernels::argmax(logits.data<const float>(), out.data<int32_t>(), logits.dim(0), logits.dim(1),
                                stream),
           "argmax");
}

}  // namespace basalt
