#include "backend/cuda/elementwise_kernels.h"

#include "backend/cuda/element_types.cuh"

#include <algorithm>
#include <climits>

namespace basalt::cuda_kernels {
namespace {

constexpr int kThreads = 256;

// Sum over the block of each thread's value; every thread gets the total.
__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  __syncthreads();  // partial may be reused by a later call
  return total;
}

// ---------------------------------------------------------------------------

template <typename Act, typename W>
__global__ void embedding_kernel(const int32_t* ids, const W* __restrict__ table, Act* __restrict__ out,
                                 int64_t vocab, int64_t hidden) {
  let_consumer_start();  // a GEMV after this may start streaming its weights
  wait_for_producer();   // launched early itself: inputs are the kernels' before
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
#pragma unroll 8
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x)
    out[t * hidden + h] = from_f32<Act>(valid ? to_f32(table[id * hidden + h]) : __int_as_float(0x7fc00000));
}

// One block per row. With `residual`, residual += x first (and x is the sum).
template <typename Act, typename Out, typename W>
__global__ void rms_norm_kernel(Act* residual, const Act* x, const W* weight, Out* out, int64_t hidden, float eps) {
  let_consumer_start();  // a GEMV after this may start streaming its weights
  wait_for_producer();   // launched early itself: inputs are the kernels' before
  const int64_t row = blockIdx.x;
  const Act* in = x + row * hidden;
  Act* res = residual ? residual + row * hidden : nullptr;
  float sum = 0.0f;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    float v = to_f32(in[h]);
    if (res) {
      const Act stored = from_f32<Act>(to_f32(res[h]) + v);
      res[h] = stored;
      v = to_f32(stored);
    }
    sum += v * v;
  }
  const float inv = rsqrtf(block_sum(sum) / static_cast<float>(hidden) + eps);
  const Act* src = res ? res : in;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    const float normed = to_f32(from_f32<Act>(to_f32(src[h]) * inv));
    out[row * hidden + h] = from_f32<Out>(normed * to_f32(weight[h]));
  }
}

// rms_norm_kernel's arithmetic with the row held in registers: one block of
// up to 1024 threads per row, four elements per thread and chunk, at most
// kWideChunks chunks per thread, every load issued before the reduction (the
// scalar loop above waits for memory once per iteration, twice per element).
constexpr int kWideChunks = 4;
constexpr int kWideMaxThreads = 1024;

template <typename T>
__device__ __forceinline__ float4 load4(const T* p) {
  if constexpr (sizeof(T) == 4) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const T* h = reinterpret_cast<const T*>(&raw);
    return make_float4(to_f32(h[0]), to_f32(h[1]), to_f32(h[2]), to_f32(h[3]));
  }
}

template <typename T>
__device__ __forceinline__ void store4(T* p, float4 v) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(p) = v;
  } else {
    uint2 raw;
    T* h = reinterpret_cast<T*>(&raw);
    h[0] = from_f32<T>(v.x), h[1] = from_f32<T>(v.y), h[2] = from_f32<T>(v.z), h[3] = from_f32<T>(v.w);
    *reinterpret_cast<uint2*>(p) = raw;
  }
}

template <typename T>
__device__ __forceinline__ float4 round4(float4 v) {
  return make_float4(to_f32(from_f32<T>(v.x)), to_f32(from_f32<T>(v.y)), to_f32(from_f32<T>(v.z)),
                     to_f32(from_f32<T>(v.w)));
}

// Sum over a block of any multiple of 32 threads up to 1024.
__device__ float block_sum_wide(float v) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? partial[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  return partial[0];
}

template <typename Act, typename Out, typename W>
__global__ void __launch_bounds__(kWideMaxThreads)
    rms_norm_wide_kernel(Act* residual, const Act* x, const W* __restrict__ weight, Out* out, int64_t hidden,
                         float eps) {
  let_consumer_start();  // a GEMV after this may start streaming its weights
  wait_for_producer();   // launched early itself: inputs are the kernels' before
  const int64_t row = blockIdx.x;
  const Act* in = x + row * hidden;
  Act* res = residual ? residual + row * hidden : nullptr;
  const int64_t chunks = hidden / 4;
  float4 v[kWideChunks];
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kWideChunks; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (c < chunks) {
      float4 a = load4(in + 4 * c);
      if (res) {
        const float4 r = load4(res + 4 * c);
        a = round4<Act>(make_float4(r.x + a.x, r.y + a.y, r.z + a.z, r.w + a.w));
      }
      v[j] = a;
      sum += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
  }
  if (res) {
#pragma unroll
    for (int j = 0; j < kWideChunks; ++j) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (c < chunks) store4(res + 4 * c, v[j]);
    }
  }
  const float inv = rsqrtf(block_sum_wide(sum) / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int j = 0; j < kWideChunks; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (c < chunks) {
      const float4 n = round4<Act>(make_float4(v[j].x * inv, v[j].y * inv, v[j].z * inv, v[j].w * inv));
      const float4 w = load4(weight + 4 * c);
      store4(out + row * hidden + 4 * c, make_float4(n.x * w.x, n.y * w.y, n.z * w.z, n.w * w.w));
    }
  }
}

template <typename Act, typename Out>
__global__ void silu_and_mul_kernel(const Act* gate_up, Out* __restrict__ out, int64_t tokens,
                                    int64_t inter) {
  let_consumer_start();  // a GEMV after this may start streaming its weights
  wait_for_producer();   // launched early itself: inputs are the kernels' before
  const int64_t n = tokens * inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / inter, j = i % inter;
    const float g = to_f32(gate_up[t * 2 * inter + j]);
    const float u = to_f32(gate_up[t * 2 * inter + inter + j]);
    out[i] = from_f32<Out>(g / (1.0f + expf(-g)) * u);
  }
}

// The same arithmetic four elements at a time (inter a multiple of 4,
// aligned rows): 16-byte loads of gate and up, one store per four outputs.
template <typename Act, typename Out>
__global__ void silu_and_mul4_kernel(const Act* gate_up, Out* __restrict__ out, int64_t tokens,
                                     int64_t inter) {
  let_consumer_start();
  wait_for_producer();
  const int64_t quads = inter / 4, n = tokens * quads;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / quads, j = (i % quads) * 4;
    const float4 g = load4(gate_up + t * 2 * inter + j);
    const float4 u = load4(gate_up + t * 2 * inter + inter + j);
    const auto f = [](float gv, float uv) { return gv / (1.0f + expf(-gv)) * uv; };
    store4(out + t * inter + j, make_float4(f(g.x, u.x), f(g.y, u.y), f(g.z, u.z), f(g.w, u.w)));
  }
}

template <typename Act>
__global__ void add_kernel(const Act* a, const Act* b, Act* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_f32<Act>(to_f32(a[i]) + to_f32(b[i]));
}

// One block per token; threads cover (head, frequency) pairs.
template <typename Act>
__global__ void rope_kernel(Act* x, const int32_t* positions, const float* inv_freq, int heads, int head_dim,
                            int rotary, int offset, bool interleaved, float scaling) {
  const int64_t t = blockIdx.x;
  const int half = rotary / 2;
  const float position = static_cast<float>(positions[t]);
  for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
    const int h = k / half, i = k % half;
    const float angle = position * inv_freq[i];
    const float c = cosf(angle) * scaling, s = sinf(angle) * scaling;
    Act* head = x + (t * heads + h) * head_dim + offset;
    const int ia = interleaved ? 2 * i : i;
    const int ib = interleaved ? 2 * i + 1 : i + half;
    const float a = to_f32(head[ia]), b = to_f32(head[ib]);
    head[ia] = from_f32<Act>(a * c - b * s);
    head[ib] = from_f32<Act>(b * c + a * s);
  }
}


template <typename From, typename To>
__global__ void cast_kernel(const From* in, To* out, int64_t n) {
  let_consumer_start();  // a GEMV after this may start streaming its weights
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_f32<To>(to_f32(in[i]));
}

__device__ float block_max(float v) {
  __shared__ float partial[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, partial[w]);
  __syncthreads();
  return m;
}

// One block per row.
__global__ void softmax_kernel(const float* x, float* out, int64_t cols, bool log) {
  const float* in = x + blockIdx.x * cols;
  float* dst = out + blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, in[c]);
  m = block_max(m);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(in[c] - m);
  sum = block_sum(sum);
  const float log_sum = logf(sum), inv = 1.0f / sum;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dst[c] = log ? in[c] - m - log_sum : expf(in[c] - m) * inv;
}

// argmax: one block of kArgmaxThreads per row. Each thread keeps the best
// (value, column) of its columns, read four at a time where the row is
// 16-byte aligned, so a row of a vocabulary's logits is two loads a thread
// rather than a long chain of dependent ones; then each warp and the block
// reduce the pairs. NaN never wins, ties go to the lower column, a row of
// NaN gives 0.
constexpr int kArgmaxThreads = 1024;

__device__ __forceinline__ void keep_better(float& best, int& index, float v, int i) {
  if (i >= 0 && (index < 0 || v > best || (v == best && i < index))) {
    best = v;
    index = i;
  }
}

__device__ __forceinline__ void consider(float& best, int& index, float v, int i) {
  if (!isnan(v)) keep_better(best, index, v, i);
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* x, int32_t* out, int cols) {
  const float* in = x + static_cast<int64_t>(blockIdx.x) * cols;
  float best = -INFINITY;
  int index = -1;
  int tail = 0;
  if ((reinterpret_cast<uintptr_t>(in) & 15) == 0) {
    const int quads = cols / 4;
    const float4* in4 = reinterpret_cast<const float4*>(in);
    for (int q = threadIdx.x; q < quads; q += kArgmaxThreads) {
      const float4 v = in4[q];
      consider(best, index, v.x, 4 * q);
      consider(best, index, v.y, 4 * q + 1);
      consider(best, index, v.z, 4 * q + 2);
      consider(best, index, v.w, 4 * q + 3);
    }
    tail = quads * 4;
  }
  for (int c = tail + threadIdx.x; c < cols; c += kArgmaxThreads) consider(best, index, in[c], c);
  for (int offset = 16; offset > 0; offset /= 2)
    keep_better(best, index, __shfl_down_sync(0xffffffffu, best, offset), __shfl_down_sync(0xffffffffu, index, offset));
  __shared__ float warp_best[kArgmaxThreads / 32];
  __shared__ int warp_index[kArgmaxThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_best[warp] = best;
    warp_index[warp] = index;
  }
  __syncthreads();
  if (warp != 0) return;
  best = warp_best[lane];
  index = warp_index[lane];
  for (int offset = 16; offset > 0; offset /= 2)
    keep_better(best, index, __shfl_down_sync(0xffffffffu, best, offset), __shfl_down_sync(0xffffffffu, index, offset));
  if (lane == 0) out[blockIdx.x] = index < 0 ? 0 : index;
}

// qkv_rope_store: one block per token, one warp per head at a time. A head is
// staged in shared memory, normalised (q and k heads, when a norm weight is
// given), rotated (q and k), then written to q_out or the caches. The
// arithmetic is rms_norm_kernel's and rope_kernel's, so the result is what
// they give on the split columns.
constexpr int kQkvWarps = 32;
constexpr int kQkvMaxHeadDim = 256;

template <typename In, typename Q, typename Cache, typename W>
__global__ void __launch_bounds__(kQkvWarps * 32) qkv_rope_store_kernel(QkvRopeStoreArgs a) {
  let_consumer_start();  // a GEMV after this may start streaming its weights
  wait_for_producer();   // launched early itself: inputs are the kernels' before
  __shared__ float staged[kQkvWarps][kQkvMaxHeadDim];
  __shared__ float cos_s[kQkvMaxHeadDim / 2], sin_s[kQkvMaxHeadDim / 2];
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int D = a.head_dim, half = a.rotary / 2;
  const int heads = a.num_heads + 2 * a.num_kv_heads;
  const In* row = static_cast<const In*>(a.qkv) + t * heads * D;
  const int64_t slot = a.slots[t];
  const bool store = slot >= 0 && slot < a.num_slots;
  const float position = static_cast<float>(a.positions[t]);
  // The angles depend on the token only: once per token, not per head.
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = position * a.inv_freq[i];
    cos_s[i] = cosf(angle) * a.scaling;
    sin_s[i] = sinf(angle) * a.scaling;
  }
  __syncthreads();
  float* buf = staged[warp];
  for (int h = warp; h < heads; h += kQkvWarps) {
    const bool is_q = h < a.num_heads, is_v = h >= a.num_heads + a.num_kv_heads;
    if (!is_q && !is_v && !store) continue;  // a k head with nowhere to go
    if (is_v && !store) continue;
    float sumsq = 0.0f;
    for (int i = lane; i < D; i += 32) {
      const float v = to_f32(row[h * D + i]);
      buf[i] = v;
      sumsq += v * v;
    }
    const W* norm = static_cast<const W*>(is_q ? a.q_norm : a.k_norm);
    if (!is_v && norm != nullptr) {
      for (int offset = 16; offset > 0; offset /= 2) sumsq += __shfl_xor_sync(0xffffffffu, sumsq, offset);
      const float inv = rsqrtf(sumsq / static_cast<float>(D) + a.eps);
      __syncwarp();
      for (int i = lane; i < D; i += 32) buf[i] = buf[i] * inv * to_f32(norm[i]);
    }
    __syncwarp();
    if (!is_v) {
      for (int i = lane; i < half; i += 32) {
        const float c = cos_s[i], s = sin_s[i];
        const int ia = a.offset + (a.interleaved ? 2 * i : i);
        const int ib = a.offset + (a.interleaved ? 2 * i + 1 : i + half);
        const float x0 = buf[ia], x1 = buf[ib];
        buf[ia] = x0 * c - x1 * s;
        buf[ib] = x1 * c + x0 * s;
      }
      __syncwarp();
    }
    if (is_q) {
      Q* dst = static_cast<Q*>(a.q_out) + (t * a.num_heads + h) * D;
      for (int i = lane; i < D; i += 32) dst[i] = from_f32<Q>(buf[i]);
    } else {
      const int kv_head = is_v ? h - a.num_heads - a.num_kv_heads : h - a.num_heads;
      Cache* dst = static_cast<Cache*>(is_v ? a.v_cache : a.k_cache) + (slot * a.num_kv_heads + kv_head) * D;
      for (int i = lane; i < D; i += 32) dst[i] = from_f32<Cache>(buf[i]);
    }
    __syncwarp();
  }
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535));
}

// Calls f(Act{}) with the element type of `code` (f32 or bf16 activations).
template <typename F>
void with_activation(Elem code, F&& f) {
  if (code == Elem::kF32) f(float{});
  else f(bf16{});
}

template <typename F>
void with_weight(Elem code, F&& f) {
  if (code == Elem::kF32) f(float{});
  else if (code == Elem::kBF16) f(bf16{});
  else f(__half{});
}

}  // namespace

cudaError_t embedding(Elem act, Elem table, const int32_t* ids, const void* table_data, void* out, int64_t tokens,
                      int64_t vocab, int64_t hidden, cudaStream_t stream) {
  cudaError_t status = cudaSuccess;
  with_activation(act, [&](auto a) {
    using Act = decltype(a);
    with_weight(table, [&](auto w) {
      using W = decltype(w);
      status = launch_dependent(embedding_kernel<Act, W>, dim3(static_cast<unsigned>(tokens)), dim3(kThreads), stream,
                                ids, static_cast<const W*>(table_data), static_cast<Act*>(out), vocab, hidden);
    });
  });
  return status;
}

cudaError_t rms_norm(Elem act, Elem out_elem, Elem weight, void* residual, const void* x, const void* weight_data,
                     void* out, int64_t rows, int64_t hidden, float eps, cudaStream_t stream) {
  cudaError_t status = cudaSuccess;
  with_activation(act, [&](auto a) {
    using Act = decltype(a);
    with_activation(out_elem, [&](auto o) {
      using Out = decltype(o);
      with_weight(weight, [&](auto w) {
        using W = decltype(w);
        // The register-resident kernel when rows split into aligned chunks
        // of 4 that fit; the strided loop otherwise (odd sizes, huge rows).
        const auto aligned = [](const void* p, size_t bytes) {
          return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
        };
        const int64_t chunks = hidden / 4;
        const bool wide = hidden % 4 == 0 && chunks <= int64_t{kWideChunks} * kWideMaxThreads &&
                          aligned(residual, 4 * sizeof(Act)) && aligned(x, 4 * sizeof(Act)) &&
                          aligned(weight_data, 4 * sizeof(W)) && aligned(out, 4 * sizeof(Out));
        if (wide) {
          const int64_t per_thread = (chunks + kWideMaxThreads - 1) / kWideMaxThreads;
          const int64_t threads = ((chunks + per_thread - 1) / per_thread + 31) / 32 * 32;
          status = launch_dependent(rms_norm_wide_kernel<Act, Out, W>, dim3(static_cast<unsigned>(rows)),
                                    dim3(static_cast<unsigned>(threads)), stream, static_cast<Act*>(residual),
                                    static_cast<const Act*>(x), static_cast<const W*>(weight_data),
                                    static_cast<Out*>(out), hidden, eps);
        } else {
          status = launch_dependent(rms_norm_kernel<Act, Out, W>, dim3(static_cast<unsigned>(rows)), dim3(kThreads),
                                    stream, static_cast<Act*>(residual), static_cast<const Act*>(x),
                                    static_cast<const W*>(weight_data), static_cast<Out*>(out), hidden, eps);
        }
      });
    });
  });
  return status;
}

cudaError_t silu_and_mul(Elem act, Elem out_elem, const void* gate_up, void* out, int64_t tokens, int64_t inter,
                         cudaStream_t stream) {
  cudaError_t status = cudaSuccess;
  with_activation(act, [&](auto a) {
    using Act = decltype(a);
    with_activation(out_elem, [&](auto o) {
      using Out = decltype(o);
      const bool vector = inter % 4 == 0 && reinterpret_cast<uintptr_t>(gate_up) % (4 * sizeof(Act)) == 0 &&
                          reinterpret_cast<uintptr_t>(out) % (4 * sizeof(Out)) == 0;
      if (vector) {
        status = launch_dependent(silu_and_mul4_kernel<Act, Out>, dim3(grid_for(tokens * inter / 4)), dim3(kThreads),
                                  stream, static_cast<const Act*>(gate_up), static_cast<Out*>(out), tokens, inter);
      } else {
        status = launch_dependent(silu_and_mul_kernel<Act, Out>, dim3(grid_for(tokens * inter)), dim3(kThreads),
                                  stream, static_cast<const Act*>(gate_up), static_cast<Out*>(out), tokens, inter);
      }
    });
  });
  return status;
}

cudaError_t add(Elem act, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  with_activation(act, [&](auto tag) {
    using Act = decltype(tag);
    add_kernel<Act><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const Act*>(a), static_cast<const Act*>(b),
                                                           static_cast<Act*>(out), n);
  });
  return cudaGetLastError();
}

cudaError_t rope(Elem act, void* x, const int32_t* positions, const float* inv_freq, int64_t tokens, int heads,
                 int head_dim, int rotary, int offset, bool interleaved, float scaling, cudaStream_t stream) {
  with_activation(act, [&](auto a) {
    using Act = decltype(a);
    rope_kernel<Act><<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(
        static_cast<Act*>(x), positions, inv_freq, heads, head_dim, rotary, offset, interleaved, scaling);
  });
  return cudaGetLastError();
}

cudaError_t cast(Elem from, Elem to, const void* in, void* out, int64_t n, cudaStream_t stream) {
  with_weight(from, [&](auto f) {
    using From = decltype(f);
    with_weight(to, [&](auto t) {
      using To = decltype(t);
      cast_kernel<From, To><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const From*>(in),
                                                                   static_cast<To*>(out), n);
    });
  });
  return cudaGetLastError();
}

__global__ void read_through_kernel(const uint4* p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads; the flush buffer never holds this
}

cudaError_t read_through(const void* p, int64_t bytes, uint32_t* sink, cudaStream_t stream) {
  const int64_t n = bytes / 16;
  read_through_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const uint4*>(p), n, sink);
  return cudaGetLastError();
}

cudaError_t softmax(const float* x, float* out, int64_t rows, int64_t cols, bool log, cudaStream_t stream) {
  softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, out, cols, log);
  return cudaGetLastError();
}

cudaError_t argmax(const float* x, int32_t* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols > INT32_MAX) return cudaErrorInvalidValue;
  argmax_kernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, stream>>>(x, out, static_cast<int>(cols));
  return cudaGetLastError();
}

cudaError_t qkv_rope_store(Elem in, Elem q_out, Elem cache, Elem norm, const QkvRopeStoreArgs& args, int64_t tokens,
                           cudaStream_t stream) {
  if (args.head_dim > kQkvMaxHeadDim) return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  with_activation(in, [&](auto i) {
    using In = decltype(i);
    with_activation(q_out, [&](auto q) {
      using Q = decltype(q);
      with_activation(cache, [&](auto c) {
        using Cache = decltype(c);
        with_weight(norm, [&](auto w) {
          using W = decltype(w);
          status = launch_dependent(qkv_rope_store_kernel<In, Q, Cache, W>, dim3(static_cast<unsigned>(tokens)),
                                    dim3(kQkvWarps * 32), stream, args);
        });
      });
    });
  });
  return status;
}

}  // namespace basalt::cuda_kernels
