#include "backend/cuda/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/device.h"
#include "core/error.h"

namespace basalt {
namespace {

using cuda_kernels::Elem;

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

Elem elem(DType dtype) { return dtype == DType::kF32 ? Elem::kF32 : Elem::kBF16; }

void require_device(const Tensor& t, const char* op, const char* name) {
  BASALT_CHECK(t.device() == Device::kCuda, "cuda {}: {} must be on the device, got {}", op, name, t.describe());
}

void require_f32_or_bf16(const Tensor& t, const char* op, const char* name) {
  require_device(t, op, name);
  BASALT_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16, "cuda {}: {} must be f32 or bf16, got {}",
               op, name, t.describe());
}

void require_i32_vector(const Tensor& t, const char* op, const char* name) {
  require_device(t, op, name);
  BASALT_CHECK(t.dtype() == DType::kI32 && t.rank() == 1, "cuda {}: {} must be i32 [n], got {}", op, name,
               t.describe());
  BASALT_CHECK(t.dim(0) <= kI32Max, "cuda {}: {} {} is too long", op, name, t.describe());
}

// A cache holds rows of `width` elements: rank >= 2, dim 0 the slots.
void require_cache(const Tensor& cache, int64_t width, const char* op, const char* name) {
  require_f32_or_bf16(cache, op, name);
  BASALT_CHECK(cache.rank() >= 2 && cache.dim(0) > 0 && cache.dim(0) <= kI32Max &&
                   cache.numel() == cache.dim(0) * width,
               "cuda {}: {} {} must be [num_slots, {}]", op, name, cache.describe(), width);
}

void launched(cudaError_t status, const char* op) {
  BASALT_CHECK(status == cudaSuccess, "cuda {}: launch failed: {}", op, cudaGetErrorString(status));
}

}  // namespace

void cuda_store_kv(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache, Tensor& v_cache,
                   cudaStream_t stream) {
  require_f32_or_bf16(k, "store_kv", "k");
  require_f32_or_bf16(v, "store_kv", "v");
  BASALT_CHECK(k.rank() == 2 && v.rank() == 2 && k.dtype() == v.dtype() && k.dim(0) == v.dim(0),
               "cuda store_kv: k {} and v {} must be [tokens, width] of one dtype", k.describe(), v.describe());
  require_i32_vector(slots, "store_kv", "slots");
  const int64_t tokens = k.dim(0);
  BASALT_CHECK(slots.dim(0) == tokens, "cuda store_kv: slots {} must be [{}]", slots.describe(), tokens);
  require_cache(k_cache, k.dim(1), "store_kv", "k_cache");
  require_cache(v_cache, v.dim(1), "store_kv", "v_cache");
  BASALT_CHECK(k_cache.dtype() == v_cache.dtype() && k_cache.dim(0) == v_cache.dim(0),
               "cuda store_kv: caches {} and {} must have one dtype and one slot count", k_cache.describe(),
               v_cache.describe());
  if (tokens == 0) return;
  launched(cuda_kernels::store_kv(elem(k.dtype()), elem(k_cache.dtype()), k.raw(), v.raw(),
                                  slots.data<const int32_t>(), k_cache.raw(), v_cache.raw(), tokens, k.dim(1),
                                  v.dim(1), k_cache.dim(0), stream),
           "store_kv");
}

void cuda_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionLayout& layout,
                    const AttentionParams& params, Tensor& out, cudaStream_t stream, CudaAttentionPath path,
                    int decode_splits) {
  const int64_t heads = params.num_heads, kv_heads = params.num_kv_heads;
  const int64_t head_dim = params.head_dim, v_head_dim = params.v_head_dim;
  constexpr int64_t kMaxDim = cuda_kernels::kAttentionMaxHeadDim;
  BASALT_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && v_head_dim > 0 &&
                   params.sliding_window >= 0 && std::isfinite(params.scale),
               "cuda attention: bad params (heads {}, kv_heads {}, head_dim {}, v_head_dim {}, sliding_window {}, "
               "scale {})",
               heads, kv_heads, head_dim, v_head_dim, params.sliding_window, params.scale);
  BASALT_CHECK(heads <= 65535, "cuda attention: too many heads ({})", heads);
  BASALT_CHECK(head_dim <= kMaxDim && v_head_dim <= kMaxDim,
               "cuda attention: head_dim {} / v_head_dim {} unsupported (at most {})", head_dim, v_head_dim, kMaxDim);
  require_f32_or_bf16(q, "attention", "q");
  require_f32_or_bf16(out, "attention", "out");
  BASALT_CHECK(q.rank() == 2 && q.dim(1) == heads * head_dim, "cuda attention: q {} must be [tokens, {}]",
               q.describe(), heads * head_dim);
  const int64_t tokens = q.dim(0);
  BASALT_CHECK(tokens <= kI32Max, "cuda attention: too many query tokens ({})", tokens);
  BASALT_CHECK(out.rank() == 2 && out.dim(0) == tokens && out.dim(1) == heads * v_head_dim,
               "cuda attention: out {} must be [{}, {}]", out.describe(), tokens, heads * v_head_dim);
  require_cache(k_cache, kv_heads * head_dim, "attention", "k_cache");
  require_cache(v_cache, kv_heads * v_head_dim, "attention", "v_cache");
  BASALT_CHECK(k_cache.dtype() == v_cache.dtype() && k_cache.dim(0) == v_cache.dim(0),
               "cuda attention: caches {} and {} must have one dtype and one slot count", k_cache.describe(),
               v_cache.describe());
  require_i32_vector(layout.q_start, "attention", "q_start");
  require_i32_vector(layout.kv_start, "attention", "kv_start");
  require_i32_vector(layout.kv_slots, "attention", "kv_slots");
  const int64_t seqs = layout.q_start.dim(0) - 1;
  BASALT_CHECK(seqs >= 0 && layout.kv_start.dim(0) == seqs + 1,
               "cuda attention: q_start {} and kv_start {} must both have num_seqs + 1 entries",
               layout.q_start.describe(), layout.kv_start.describe());
  BASALT_CHECK(tokens == 0 || seqs > 0, "cuda attention: {} query tokens but no sequences", tokens);
  if (tokens == 0) return;
  cuda_kernels::AttentionShape shape;
  shape.q_tokens = tokens;
  shape.num_seqs = static_cast<int>(seqs);
  shape.kv_slots_len = layout.kv_slots.dim(0);
  shape.num_slots = k_cache.dim(0);
  shape.num_heads = static_cast<int>(heads);
  shape.num_kv_heads = static_cast<int>(kv_heads);
  shape.head_dim = static_cast<int>(head_dim);
  shape.v_head_dim = static_cast<int>(v_head_dim);
  shape.scale = params.scale;
  shape.sliding_window = params.sliding_window;

  // The kernels, from shapes and the cache dtype only (see attention.h). The
  // decode grid's y is the sequence count, which CUDA caps at 65535.
  cuda_kernels::AttentionLaunch launch;
  const bool f32_cache = k_cache.dtype() == DType::kF32;
  if (path == CudaAttentionPath::kAuto) {
    if (f32_cache || (tokens <= kDecodeMaxAverageRows * seqs && tokens < seqs + kPrefillMinExtraRows)) {
      launch.decode = true, launch.prefill = false;  // decode-like: every sequence to the decode kernel
    } else {
      launch.decode = true, launch.prefill = true;  // per sequence
      launch.decode_max_q = kDecodeMaxAverageRows;
    }
  } else if (path == CudaAttentionPath::kRowInvariant) {
    // Every row through the decode kernel, unsplit, keys from 0: a row's
    // sums then depend on its own keys alone (attention.h).
    BASALT_CHECK(seqs <= 65535, "cuda attention: the batch-invariant path takes at most 65535 sequences, got {}",
                 seqs);
    launch.decode = true, launch.prefill = false, launch.keys_from_zero = true;
  } else {
    launch.decode = path == CudaAttentionPath::kDecode || path == CudaAttentionPath::kDecodeCudaCores;
    launch.prefill = !launch.decode;
    launch.decode_max_q = 0;
    launch.decode_cuda_cores = path == CudaAttentionPath::kDecodeCudaCores;
    launch.prefill_mma_sync = path == CudaAttentionPath::kPrefillMmaSync;
  }
  if (seqs > 65535) launch.decode = false, launch.prefill = true, launch.decode_max_q = 0;
  Tensor decode_scratch, tile_starts;  // back to the device cache after the op: stream-ordered reuse
  if (launch.decode) {
    launch.splits = path == CudaAttentionPath::kRowInvariant ? 1
                    : decode_splits > 0 ? std::min(decode_splits, cuda_kernels::kAttentionMaxSplits)
                                        : cuda_kernels::attention_decode_splits(elem(k_cache.dtype()), elem(q.dtype()),
                                                                                shape);
    const int64_t floats = cuda_kernels::attention_decode_scratch_floats(shape, launch.splits);
    if (floats > 0) {
      decode_scratch = cuda_empty({floats}, DType::kF32);
      launch.decode_scratch = decode_scratch.data<float>();
    }
  }
  if (launch.prefill) {
    tile_starts = cuda_empty({seqs + 1}, DType::kI32);
    launch.tile_starts = tile_starts.data<int32_t>();
  }
  launched(cuda_kernels::attention(elem(q.dtype()), elem(out.dtype()), elem(k_cache.dtype()), q.raw(), k_cache.raw(),
                                   v_cache.raw(), layout.q_start.data<const int32_t>(),
                                   layout.kv_start.data<const int32_t>(), layout.kv_slots.data<const int32_t>(), shape,
                                   launch, out.raw(), stream),
           "attention");
}

}  // namespace basalt
