#include "backend/cuda/attention_kernels.h"

#include "backend/cuda/element_types.cuh"

#include <cmath>

namespace basalt::cuda_kernels {
namespace {

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

// ---------------------------------------------------------------------------
// store_kv: one block per token; a slot outside [0, num_slots) writes nothing.

constexpr int kStoreThreads = 128;

template <typename Act, typename Cache>
__global__ void store_kv_kernel(const Act* k, const Act* v, const int32_t* slots, Cache* k_cache, Cache* v_cache,
                                int64_t k_width, int64_t v_width, int64_t num_slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;
  for (int64_t i = threadIdx.x; i < k_width; i += blockDim.x)
    k_cache[slot * k_width + i] = from_f32<Cache>(to_f32(k[t * k_width + i]));
  for (int64_t i = threadIdx.x; i < v_width; i += blockDim.x)
    v_cache[slot * v_width + i] = from_f32<Cache>(to_f32(v[t * v_width + i]));
}

// ---------------------------------------------------------------------------
// attention: one block per (query row, kv head, chunk of up to kHeadsPerBlock
// query heads of that kv head's GQA group). The block's kWarps warps split
// the row's keys round-robin (warp w takes keys first + w, first + w + kWarps,
// ...); each warp reads one key row at a time (lane l holds features l,
// l + 32, ..., so every load is coalesced), forms the dot products with all
// of the block's query heads (warp butterfly sums, so every lane holds the
// same score) and updates its own online softmax state (running max, running
// sum, unnormalised output in registers). The warps' states are then merged
// in a fixed order through shared memory. Scores are kept in the log2 domain
// (q is pre-multiplied by scale * log2(e)) so exp is one exp2f.

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kHeadsPerBlock = 8;

struct Args {
  const void* q;
  const void* k_cache;
  const void* v_cache;
  void* out;
  const int32_t* q_start;
  const int32_t* kv_start;
  const int32_t* kv_slots;
  int num_seqs;
  int64_t kv_slots_len;
  int64_t num_slots;
  int num_heads, num_kv_heads, group, head_chunks, head_dim, v_head_dim;
  float scale_log2;
  int sliding_window;
};

// kPerLane: features per lane, ceil(max(head_dim, v_head_dim) / 32) rounded
// up to 2, 4 or 8 (features past the head dim are zero / not stored).
template <typename Act, typename Cache, int kPerLane>
__global__ void __launch_bounds__(kThreads) attention_kernel(Args a) {
  constexpr int kWidth = kPerLane * 32;
  constexpr float kNegInf = -INFINITY;
  __shared__ float q_s[kHeadsPerBlock * kWidth];
  __shared__ float acc_s[kHeadsPerBlock * kWidth];
  __shared__ float m_s[kWarps][kHeadsPerBlock];
  __shared__ float l_s[kWarps][kHeadsPerBlock];
  __shared__ float max_s[kHeadsPerBlock];
  __shared__ float sum_s[kHeadsPerBlock];
  __shared__ int bad_s;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t row = blockIdx.x;
  const int kv_head = blockIdx.y / a.head_chunks, chunk = blockIdx.y % a.head_chunks;
  const int head0 = kv_head * a.group + chunk * kHeadsPerBlock;
  const int heads = min(kHeadsPerBlock, a.group - chunk * kHeadsPerBlock);
  const int D = a.head_dim, Dv = a.v_head_dim;
  Act* out = static_cast<Act*>(a.out) + (row * a.num_heads + head0) * Dv;

  // The sequence of this row: the last s with q_start[s] <= row (empty
  // sequences share their start with the next one).
  int lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.q_start[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  const int64_t q_begin = a.q_start[lo], q_end = a.q_start[lo + 1];
  const int64_t kv_begin = a.kv_start[lo], kv_end = a.kv_start[lo + 1];
  const int64_t position = (kv_end - kv_begin) - (q_end - q_begin) + (row - q_begin);
  const int64_t first = a.sliding_window > 0 ? max(int64_t{0}, position - a.sliding_window + 1) : int64_t{0};
  // A layout that does not cover this row sensibly: NaN, as a bad slot gives.
  if (row < q_begin || row >= q_end || position < 0 || kv_begin < 0 || kv_end > a.kv_slots_len) {
    for (int i = tid; i < heads * Dv; i += kThreads) out[i] = from_f32<Act>(quiet_nan());
    return;
  }

  const Act* q = static_cast<const Act*>(a.q) + (row * a.num_heads + head0) * D;
  for (int i = tid; i < kHeadsPerBlock * kWidth; i += kThreads) {
    const int h = i / kWidth, d = i % kWidth;
    q_s[i] = h < heads && d < D ? to_f32(q[h * D + d]) * a.scale_log2 : 0.0f;
    acc_s[i] = 0.0f;
  }
  if (tid == 0) bad_s = 0;
  __syncthreads();

  float m[kHeadsPerBlock], l[kHeadsPerBlock], acc[kHeadsPerBlock][kPerLane];
#pragma unroll
  for (int h = 0; h < kHeadsPerBlock; ++h) {
    m[h] = kNegInf;
    l[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[h][i] = 0.0f;
  }
  bool bad = false;
  const Cache* k_cache = static_cast<const Cache*>(a.k_cache);
  const Cache* v_cache = static_cast<const Cache*>(a.v_cache);
  const int32_t* slots = a.kv_slots + kv_begin;

  int64_t j = first + warp;
  int next_slot = j <= position ? slots[j] : 0;
  for (; j <= position; j += kWarps) {
    const int64_t slot = next_slot;
    if (j + kWarps <= position) next_slot = slots[j + kWarps];
    if (slot < 0 || slot >= a.num_slots) {
      bad = true;
      continue;
    }
    const Cache* k_row = k_cache + (slot * a.num_kv_heads + kv_head) * D;
    const Cache* v_row = v_cache + (slot * a.num_kv_heads + kv_head) * Dv;
    float kf[kPerLane], vf[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      kf[i] = d < D ? to_f32(k_row[d]) : 0.0f;
      vf[i] = d < Dv ? to_f32(v_row[d]) : 0.0f;
    }
#pragma unroll
    for (int h = 0; h < kHeadsPerBlock; ++h) {
      if (h < heads) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) dot = fmaf(kf[i], q_s[h * kWidth + lane + 32 * i], dot);
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        // The butterfly leaves the same bits in every lane: the branch is uniform.
        if (dot > m[h]) {
          const float correction = exp2f(m[h] - dot);
          m[h] = dot;
          l[h] = fmaf(l[h], correction, 1.0f);
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) acc[h][i] = fmaf(acc[h][i], correction, vf[i]);
        } else {
          const float p = exp2f(dot - m[h]);
          l[h] += p;
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) acc[h][i] = fmaf(p, vf[i], acc[h][i]);
        }
      }
    }
  }

  // Merge the warps' states: the block's max and sum per head, then each
  // warp's rescaled output added in warp order (a fixed order, so the result
  // does not depend on timing).
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < kHeadsPerBlock; ++h) {
      m_s[warp][h] = m[h];
      l_s[warp][h] = l[h];
    }
    if (bad) bad_s = 1;
  }
  __syncthreads();
  if (tid < heads) {
    float block_max = kNegInf;
    for (int w = 0; w < kWarps; ++w) block_max = fmaxf(block_max, m_s[w][tid]);
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (m_s[w][tid] != kNegInf) sum += l_s[w][tid] * exp2f(m_s[w][tid] - block_max);
    max_s[tid] = block_max;
    sum_s[tid] = sum;
  }
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int h = 0; h < kHeadsPerBlock; ++h) {
        if (h < heads && m[h] != kNegInf) {
          const float factor = exp2f(m[h] - max_s[h]);
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) acc_s[h * kWidth + lane + 32 * i] += acc[h][i] * factor;
        }
      }
    }
    __syncthreads();
  }
  const bool poisoned = bad_s != 0;
  for (int i = tid; i < heads * Dv; i += kThreads) {
    const int h = i / Dv, d = i % Dv;
    out[i] = from_f32<Act>(poisoned ? quiet_nan() : acc_s[h * kWidth + d] / sum_s[h]);
  }
}

template <typename F>
void with_type(Elem code, F&& f) {
  if (code == Elem::kF32) f(float{});
  else f(bf16{});
}

template <typename Act, typename Cache, int kPerLane>
void launch_attention(const Args& args, dim3 grid, cudaStream_t stream) {
  attention_kernel<Act, Cache, kPerLane><<<grid, kThreads, 0, stream>>>(args);
}

}  // namespace

cudaError_t store_kv(Elem act, Elem cache, const void* k, const void* v, const int32_t* slots, void* k_cache,
                     void* v_cache, int64_t tokens, int64_t k_width, int64_t v_width, int64_t num_slots,
                     cudaStream_t stream) {
  with_type(act, [&](auto a) {
    using Act = decltype(a);
    with_type(cache, [&](auto c) {
      using Cache = decltype(c);
      store_kv_kernel<Act, Cache><<<static_cast<unsigned>(tokens), kStoreThreads, 0, stream>>>(
          static_cast<const Act*>(k), static_cast<const Act*>(v), slots, static_cast<Cache*>(k_cache),
          static_cast<Cache*>(v_cache), k_width, v_width, num_slots);
    });
  });
  return cudaGetLastError();
}

cudaError_t attention(Elem act, Elem cache, const void* q, const void* k_cache, const void* v_cache,
                      const int32_t* q_start, const int32_t* kv_start, const int32_t* kv_slots,
                      const AttentionShape& shape, void* out, cudaStream_t stream) {
  Args args{};
  args.q = q;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.out = out;
  args.q_start = q_start;
  args.kv_start = kv_start;
  args.kv_slots = kv_slots;
  args.num_seqs = shape.num_seqs;
  args.kv_slots_len = shape.kv_slots_len;
  args.num_slots = shape.num_slots;
  args.num_heads = shape.num_heads;
  args.num_kv_heads = shape.num_kv_heads;
  args.group = shape.num_heads / shape.num_kv_heads;
  args.head_chunks = (args.group + kHeadsPerBlock - 1) / kHeadsPerBlock;
  args.head_dim = shape.head_dim;
  args.v_head_dim = shape.v_head_dim;
  args.scale_log2 = shape.scale * 1.4426950408889634f;
  args.sliding_window = shape.sliding_window;
  const dim3 grid(static_cast<unsigned>(shape.q_tokens), static_cast<unsigned>(shape.num_kv_heads * args.head_chunks));
  const int widest = shape.head_dim > shape.v_head_dim ? shape.head_dim : shape.v_head_dim;
  with_type(act, [&](auto a) {
    using Act = decltype(a);
    with_type(cache, [&](auto c) {
      using Cache = decltype(c);
      if (widest <= 64) launch_attention<Act, Cache, 2>(args, grid, stream);
      else if (widest <= 128) launch_attention<Act, Cache, 4>(args, grid, stream);
      else launch_attention<Act, Cache, 8>(args, grid, stream);
    });
  });
  return cudaGetLastError();
}

}  // namespace basalt::cuda_kernels
