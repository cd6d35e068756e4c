// Multi-head latent attention kernels (DeepSeek V2/V3): the cache write, the
// expanded form's gathers, and the absorbed form's attention core. See
// mla_kernels.h for the launch contract and mla.h for the op semantics.
//
// Attention core. The absorbed query of (token, head) is q_full = [q_nope ·
// W_uk(h) | q_pe] (L + R wide); every head of a sequence attends over the
// same cached rows (one shared key head), values are the rows' first L
// features. Rows r = query i * heads + head h of a sequence are served in
// passes of RT rows; a block takes the passes p with p % row_splits ==
// its row split, and its key split: the keys the pass can see, [0, hi), are
// cut into `splits` equal chunks on the device (from the lengths it reads),
// so grids depend on sizes only. splits == 1 writes the normalised latent
// output; otherwise (max, sum, output) partials that mla_combine_kernel
// merges.
//  * mla_mma_kernel (bf16 cache and q_full, L = 512, R = 64): 64 rows per
//    pass, 8 warps. Warp (rg, half) owns rows 16 rg .. 16 rg + 15; for S =
//    Q Kᵀ it takes keys 16 half .. + 15 of each 32-key tile (all 576 dims),
//    the pair shares the row maxima and the probabilities P (bf16) through
//    shared memory, and for O += P V it owns output columns 256 half .. +
//    255 over all 32 keys (V is the tile's first 512 features: the same
//    shared-memory rows as K). mma.sync m16n8k16, bf16 operands, f32
//    accumulation and f32 online softmax; tiles gathered by slot with
//    cp.async into three stages (two in flight while one is used), the q
//    tile stays in shared memory for the whole pass. q and P are rounded to
//    bf16 (errors ~1e-3..1e-2 relative, as the prefill attention kernel).
//  * mla_wgmma_kernel (mla_wgmma_kernels.cu; same dims, sm_90a): the same
//    semantics on warpgroup MMA with 64-key tiles; preferred where it runs.
//  * mla_core_kernel (any other dims or an f32 cache): CUDA cores, f32
//    arithmetic; 4 rows per pass, 4 warps taking keys round-robin, a lane
//    holding dims lane + 32 k of the row (latent sums in registers, L <=
//    512); warps merged through shared memory.
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "backend/cuda/element_types.cuh"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/mla_core.cuh"
#include "backend/cuda/mla_kernels.h"

namespace basalt::cuda_kernels {
namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

template <typename F>
cudaError_t dispatch2(Elem a, Elem b, F&& f) {
  if (a == Elem::kF32 && b == Elem::kF32) f(float{}, float{});
  else if (a == Elem::kF32) f(float{}, bf16{});
  else if (b == Elem::kF32) f(bf16{}, float{});
  else f(bf16{}, bf16{});
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------
// Cache write: one block per token.
constexpr int kStoreThreads = 128;

template <typename Norm, typename Cache>
__global__ void __launch_bounds__(kStoreThreads)
    mla_store_kernel(const float* kv_a, const Norm* norm, float eps, const int32_t* positions, const float* inv_freq,
                     float scaling, bool interleaved, const int32_t* slots, Cache* cache, int L, int R,
                     int64_t num_slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;  // padding: nothing stored
  const float* a = kv_a + t * (L + R);
  __shared__ float partial[kStoreThreads / 32];
  float ss = 0.0f;
  for (int i = threadIdx.x; i < L; i += kStoreThreads) ss += a[i] * a[i];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kStoreThreads / 32; ++w) total += partial[w];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(L) + eps);
  Cache* row = cache + slot * (L + R);
  for (int i = threadIdx.x; i < L; i += kStoreThreads) row[i] = from_f32<Cache>((a[i] * inv) * to_f32(norm[i]));
  const float position = static_cast<float>(positions[t]);
  const int half = R / 2;
  for (int i = threadIdx.x; i < half; i += kStoreThreads) {
    float s, c;
    sincosf(position * inv_freq[i], &s, &c);
    c *= scaling;
    s *= scaling;
    const int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    const float x = a[L + ia], y = a[L + ib];
    row[L + ia] = from_f32<Cache>(x * c - y * s);
    row[L + ib] = from_f32<Cache>(y * c + x * s);
  }
}

// ---------------------------------------------------------------------------
// FP8 weight to bf16 (once per weight; the backend caches the result).
__global__ void mla_dequant_fp8_kernel(const uint8_t* w, const float* scale_inv, bf16* out, int64_t n, int64_t k) {
  const int64_t kb = (k + 127) / 128;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * k; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / k, c = i % k;
    __nv_fp8_e4m3 v;
    v.__x = w[i];
    out[i] = __float2bfloat16_rn(static_cast<float>(v) * scale_inv[(r / 128) * kb + c / 128]);
  }
}

// ---------------------------------------------------------------------------
// Expanded form: latent rows gathered by slot, then kv split into k and v.
template <typename Cache, typename Out>
__global__ void mla_gather_latent_kernel(const Cache* cache, const int32_t* slots, Out* out, int L, int R,
                                         int64_t num_slots) {
  const int64_t i = blockIdx.x;
  const int64_t slot = slots[i];
  const bool ok = slot >= 0 && slot < num_slots;
  for (int c = threadIdx.x; c < L; c += blockDim.x)
    out[i * L + c] = from_f32<Out>(ok ? to_f32(cache[slot * (L + R) + c]) : quiet_nan());
}

template <typename Cache, typename Out>
__global__ void mla_split_kv_kernel(const Cache* cache, const int32_t* slots, const float* kv, Out* k, Out* v,
                                    int heads, int L, int R, int Dn, int Dv, int64_t num_slots) {
  const int64_t i = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t slot = slots[i];
  const bool ok = slot >= 0 && slot < num_slots;
  const float* src = kv + (i * heads + h) * (Dn + Dv);
  Out* kd = k + (i * heads + h) * (Dn + R);
  Out* vd = v + (i * heads + h) * Dv;
  for (int d = threadIdx.x; d < Dn; d += blockDim.x) kd[d] = from_f32<Out>(src[d]);
  for (int r = threadIdx.x; r < R; r += blockDim.x)
    kd[Dn + r] = from_f32<Out>(ok ? to_f32(cache[slot * (L + R) + L + r]) : quiet_nan());
  for (int d = threadIdx.x; d < Dv; d += blockDim.x) vd[d] = from_f32<Out>(src[Dn + d]);
}

template <typename Q, typename QFull>
__global__ void mla_copy_q_rope_kernel(const Q* q, QFull* q_full, int heads, int Dn, int R, int L) {
  const int64_t t = blockIdx.x;
  for (int idx = threadIdx.x; idx < heads * R; idx += blockDim.x) {
    const int h = idx / R, r = idx % R;
    q_full[(t * heads + h) * (L + R) + L + r] = from_f32<QFull>(to_f32(q[(t * heads + h) * (Dn + R) + Dn + r]));
  }
}

// ---------------------------------------------------------------------------
// Small-batch absorptions (T <= kMlaSmallBatch), templated on TB, the batch
// rounded up to 1, 2, 4, 8 or 16 (the accumulators are registers).
//
// absorb_q: one block per (head, 128 latent columns), 256 threads; thread
// (g, c) = (tid / 16, tid % 16) owns columns 8c .. 8c + 7 of the block's 128
// (one 16-byte load of a W_uk row) for the d = g, g + 16, ... rows, so a
// thread has Dn / 16 loads in flight and a block reads its 32 KB slice of
// W_uk(h) at once. The 16 groups' sums meet by a shuffle (two groups per
// warp) and then in shared memory. The tokens' q_nope rows sit in shared
// memory as f32.
constexpr int kAbsorbThreads = 256;
constexpr int kAbsorbCols = 128;
constexpr int kAbsorbWarps = kAbsorbThreads / 32;

__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

template <int TB, typename Q, typename QFull>
__global__ void __launch_bounds__(kAbsorbThreads)
    mla_absorb_q_small_kernel(const Q* q, const bf16* kv_b, QFull* q_full, int T, int Dn, int R, int L, int Dv) {
  extern __shared__ float absorb_smem[];
  float* qs = absorb_smem;             // [TB][Dn]
  float* red = absorb_smem + TB * Dn;  // [kAbsorbWarps][TB][kAbsorbCols]
  const int h = blockIdx.x, heads = gridDim.x;
  // Token block blockIdx.z (more than TB tokens: the batch-invariant form).
  q += static_cast<int64_t>(blockIdx.z) * TB * heads * (Dn + R);
  q_full += static_cast<int64_t>(blockIdx.z) * TB * heads * (L + R);
  T = min(T - static_cast<int>(blockIdx.z) * TB, TB);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = tid / 16, c = tid % 16;
  for (int i = tid; i < TB * Dn; i += kAbsorbThreads) {
    const int t = i / Dn, d = i % Dn;
    qs[i] = t < T ? to_f32(q[(static_cast<int64_t>(t) * heads + h) * (Dn + R) + d]) : 0.0f;
  }
  if (blockIdx.y == 0) {  // the rope part goes straight across
    for (int i = tid; i < T * R; i += kAbsorbThreads) {
      const int t = i / R, r = i % R;
      q_full[(static_cast<int64_t>(t) * heads + h) * (L + R) + L + r] =
          from_f32<QFull>(to_f32(q[(static_cast<int64_t>(t) * heads + h) * (Dn + R) + Dn + r]));
    }
  }
  __syncthreads();
  const int col0 = blockIdx.y * kAbsorbCols, col = col0 + 8 * c;
  const bool live = col < L;
  const bf16* w = kv_b + static_cast<int64_t>(h) * (Dn + Dv) * L + col;
  float acc[TB][8];
#pragma unroll
  for (int t = 0; t < TB; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[t][j] = 0.0f;
#pragma unroll 8
  for (int d = g; d < Dn; d += 16) {
    float wf[8];
    unpack8(live ? *reinterpret_cast<const uint4*>(w + static_cast<int64_t>(d) * L) : make_uint4(0, 0, 0, 0), wf);
#pragma unroll
    for (int t = 0; t < TB; ++t) {
      const float x = qs[t * Dn + d];
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[t][j] = fmaf(x, wf[j], acc[t][j]);
    }
  }
#pragma unroll
  for (int t = 0; t < TB; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[t][j] += __shfl_xor_sync(0xffffffffu, acc[t][j], 16);
  if (lane < 16) {
#pragma unroll
    for (int t = 0; t < TB; ++t)
#pragma unroll
      for (int j = 0; j < 8; ++j) red[(warp * TB + t) * kAbsorbCols + 8 * c + j] = acc[t][j];
  }
  __syncthreads();
  for (int i = tid; i < T * kAbsorbCols; i += kAbsorbThreads) {
    const int t = i / kAbsorbCols, k = i % kAbsorbCols;
    if (col0 + k >= L) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w8 = 0; w8 < kAbsorbWarps; ++w8) sum += red[(w8 * TB + t) * kAbsorbCols + k];
    q_full[(static_cast<int64_t>(t) * heads + h) * (L + R) + col0 + k] = from_f32<QFull>(sum);
  }
}

// absorb_out: 8 warps per block, each warp 4 W_uv rows (head h, value
// columns v) at once: lane k reads 16-byte chunks k, k + 32, ... of the four
// rows (all four in flight) and the warp sums by shuffles. The block's
// head's o_lat rows sit in shared memory as f32.
constexpr int kAbsorbOutRowsPerWarp = 4;
constexpr int kAbsorbOutRows = kAbsorbWarps * kAbsorbOutRowsPerWarp;  // rows (v) per block

template <int TB, typename O, typename Out>
__global__ void __launch_bounds__(kAbsorbThreads)
    mla_absorb_out_small_kernel(const O* o_lat, const bf16* kv_b, Out* out, int T, int Dn, int L, int Dv) {
  extern __shared__ float absorb_smem[];  // [TB][L]
  const int h = blockIdx.y, heads = gridDim.y;
  o_lat += static_cast<int64_t>(blockIdx.z) * TB * heads * L;  // token block blockIdx.z, as above
  out += static_cast<int64_t>(blockIdx.z) * TB * heads * Dv;
  T = min(T - static_cast<int>(blockIdx.z) * TB, TB);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < TB * L; i += kAbsorbThreads) {
    const int t = i / L, l = i % L;
    absorb_smem[i] = t < T ? to_f32(o_lat[(static_cast<int64_t>(t) * heads + h) * L + l]) : 0.0f;
  }
  __syncthreads();
  const int v0 = blockIdx.x * kAbsorbOutRows + warp * kAbsorbOutRowsPerWarp;
  const bf16* rows = kv_b + (static_cast<int64_t>(h) * (Dn + Dv) + Dn) * L;
  float acc[kAbsorbOutRowsPerWarp][TB];
#pragma unroll
  for (int r = 0; r < kAbsorbOutRowsPerWarp; ++r)
#pragma unroll
    for (int t = 0; t < TB; ++t) acc[r][t] = 0.0f;
  for (int col = lane * 8; col < L; col += 32 * 8) {
    float wf[kAbsorbOutRowsPerWarp][8];
#pragma unroll
    for (int r = 0; r < kAbsorbOutRowsPerWarp; ++r) {
      const int v = v0 + r;
      unpack8(v < Dv ? *reinterpret_cast<const uint4*>(rows + static_cast<int64_t>(v) * L + col)
                     : make_uint4(0, 0, 0, 0),
              wf[r]);
    }
#pragma unroll
    for (int t = 0; t < TB; ++t) {
      const float4 x0 = *reinterpret_cast<const float4*>(absorb_smem + t * L + col);
      const float4 x1 = *reinterpret_cast<const float4*>(absorb_smem + t * L + col + 4);
      const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int r = 0; r < kAbsorbOutRowsPerWarp; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][t] = fmaf(x[j], wf[r][j], acc[r][t]);
    }
  }
#pragma unroll
  for (int r = 0; r < kAbsorbOutRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < TB; ++t) {
      const float sum = warp_sum(acc[r][t]);
      if (lane == 0 && t < T && v0 + r < Dv) out[(static_cast<int64_t>(t) * heads + h) * Dv + v0 + r] = from_f32<Out>(sum);
    }
  }
}

// ---------------------------------------------------------------------------
// CUDA-core kernel (any L <= 512, R <= 256; f32 or bf16 cache; f32 q_full).
constexpr int kCoreWarps = 4;
constexpr int kCoreThreads = kCoreWarps * 32;
constexpr int kCoreRows = 4;
constexpr int kCoreLatentPerLane = kMlaMaxLatent / 32;

size_t core_smem_bytes(int L, int R) {
  return sizeof(float) * (static_cast<size_t>(kCoreRows) * (L + R) + static_cast<size_t>(kCoreWarps) * kCoreRows * L);
}

template <typename Cache, typename O>
__global__ void __launch_bounds__(kCoreThreads) mla_core_kernel(MlaArgs a) {
  constexpr int NW = kCoreWarps, RT = kCoreRows, LPL = kCoreLatentPerLane;
  constexpr float kNegInf = -INFINITY;
  extern __shared__ float core_smem[];
  const int L = a.L, D = a.L + a.R, heads = a.heads;
  float* q_s = core_smem;           // [RT][D]
  float* red_o = q_s + RT * D;      // [NW][RT][L]
  __shared__ float red_m[NW][RT], red_l[NW][RT];
  const int split = blockIdx.x % a.splits, row_split = blockIdx.x / a.splits, seq = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const MlaBounds b = mla_seq_bounds(a, seq);
  const int64_t total_rows = b.q_len * heads;
  const float* q = static_cast<const float*>(a.q);
  const Cache* cache = static_cast<const Cache*>(a.cache);
  const int32_t* slots = a.kv_slots + (b.bad ? 0 : b.kv_begin);
  const int64_t rows_all = a.q_tokens * heads;

  for (int64_t r0 = int64_t{row_split} * RT; r0 < total_rows; r0 += int64_t{RT} * a.row_splits) {  // uniform
    const MlaKeyRange keys = mla_split_keys(a, b, split, r0, RT);
    if (split >= keys.splits) continue;  // uniform: this pass takes fewer splits
    const int64_t c0 = keys.begin, c1 = keys.end;
    int64_t pos[RT];
#pragma unroll
    for (int i = 0; i < RT; ++i) {
      const int64_t r = r0 + i;
      pos[i] = r < total_rows && !b.bad ? b.kv_len - b.q_len + r / heads : int64_t{-1};
    }
    for (int idx = tid; idx < RT * D; idx += kCoreThreads) {
      const int i = idx / D, d = idx % D;
      const int64_t r = r0 + i;
      q_s[idx] = r < total_rows ? q[((b.q_begin + r / heads) * heads + r % heads) * D + d] : 0.0f;
    }
    __syncthreads();
    float m[RT], l[RT], o[RT][LPL];
#pragma unroll
    for (int i = 0; i < RT; ++i) {
      m[i] = kNegInf;
      l[i] = 0.0f;
#pragma unroll
      for (int k = 0; k < LPL; ++k) o[i][k] = 0.0f;
    }
    bool bad_slot = false;
    for (int64_t j = c0 + warp; j < c1; j += NW) {  // uniform over the warp
      const int64_t slot = slots[j];
      if (slot < 0 || slot >= a.num_slots) {
        bad_slot = true;
        continue;
      }
      const Cache* row = cache + slot * D;
      float x[LPL], dot[RT];
#pragma unroll
      for (int i = 0; i < RT; ++i) dot[i] = 0.0f;
#pragma unroll
      for (int k = 0; k < LPL; ++k) {
        const int c = lane + 32 * k;
        x[k] = 0.0f;
        if (c < L) {
          x[k] = to_f32(row[c]);
#pragma unroll
          for (int i = 0; i < RT; ++i) dot[i] += q_s[i * D + c] * x[k];
        }
      }
      for (int c = L + lane; c < D; c += 32) {
        const float xr = to_f32(row[c]);
#pragma unroll
        for (int i = 0; i < RT; ++i) dot[i] += q_s[i * D + c] * xr;
      }
#pragma unroll
      for (int i = 0; i < RT; ++i) {
        const float s = warp_sum(dot[i]) * a.scale_log2;
        if (j <= pos[i]) {
          const float m_new = fmaxf(m[i], s);
          const float corr = exp2f(m[i] - m_new), p = exp2f(s - m_new);
          l[i] = l[i] * corr + p;
#pragma unroll
          for (int k = 0; k < LPL; ++k) o[i][k] = o[i][k] * corr + p * x[k];
          m[i] = m_new;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < RT; ++i) {
#pragma unroll
      for (int k = 0; k < LPL; ++k) {
        const int c = lane + 32 * k;
        if (c < L) red_o[(warp * RT + i) * L + c] = o[i][k];
      }
      if (lane == 0) {
        red_m[warp][i] = m[i];
        red_l[warp][i] = l[i];
      }
    }
    const bool poisoned = __syncthreads_or(bad_slot || b.bad) != 0;
    for (int idx = tid; idx < RT * L; idx += kCoreThreads) {
      const int i = idx / L, c = idx % L;
      const int64_t r = r0 + i;
      if (r >= total_rows) continue;
      float m_all = kNegInf;
#pragma unroll
      for (int w = 0; w < NW; ++w) m_all = fmaxf(m_all, red_m[w][i]);
      float l_all = 0.0f, o_all = 0.0f;
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        const float f = red_m[w][i] == kNegInf ? 0.0f : exp2f(red_m[w][i] - m_all);
        l_all += red_l[w][i] * f;
        o_all += red_o[(w * RT + i) * L + c] * f;
      }
      const int64_t at = (b.q_begin + r / heads) * heads + r % heads;
      if (a.part_n != nullptr && split == 0 && c == 0) a.part_n[at] = keys.splits;
      if (keys.splits == 1) {
        static_cast<O*>(a.o)[at * L + c] = from_f32<O>(poisoned ? quiet_nan() : (l_all > 0.0f ? o_all / l_all : 0.0f));
      } else {
        const int64_t part = split * rows_all + at;
        a.part_o[part * L + c] = poisoned ? quiet_nan() : o_all;
        if (c == 0) {
          a.part_ml[part * 2] = m_all;
          a.part_ml[part * 2 + 1] = poisoned ? quiet_nan() : l_all;
        }
      }
    }
    __syncthreads();  // q_s and red_* are rewritten by the next pass
  }
}

// ---------------------------------------------------------------------------
// Tensor-core kernel (bf16 cache and q_full, L = 512, R = 64).

constexpr int kMmaRows = 64;     // rows per pass
constexpr int kMmaKeys = 32;     // keys per tile
constexpr int kMmaStages = 3;
constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaD = kMlaMmaLatent + kMlaMmaRope;  // 576
constexpr int kMmaL = kMlaMmaLatent;
constexpr int kMmaLD = kMmaD + 8;      // padded row: ldmatrix phases hit distinct banks
constexpr int kMmaPLD = kMmaKeys + 8;  // padded P row
constexpr int kMmaChunks = kMmaD / 8;  // 16-byte chunks per row
constexpr size_t kMmaSmemBytes =
    sizeof(bf16) * (static_cast<size_t>(kMmaRows) * kMmaLD + static_cast<size_t>(kMmaStages) * kMmaKeys * kMmaLD +
                    static_cast<size_t>(4) * 16 * kMmaPLD);

template <typename O>
__global__ void __launch_bounds__(kMmaThreads, 1) mla_mma_kernel(MlaArgs a) {
  constexpr int BN = kMmaKeys, NS = kMmaStages, LD = kMmaLD, PLD = kMmaPLD, CH = kMmaChunks;
  constexpr int kPer = BN * CH / kMmaThreads;  // chunks each thread copies per tile
  static_assert(BN * CH % kMmaThreads == 0);
  constexpr float kNegInf = -INFINITY;
  extern __shared__ __align__(128) unsigned char mla_smem[];
  bf16* q_s = reinterpret_cast<bf16*>(mla_smem);  // [64][LD]
  bf16* kv_s = q_s + kMmaRows * LD;                // [NS][BN][LD]
  bf16* p_s = kv_s + NS * BN * LD;                 // [4][16][PLD]
  __shared__ float red_max[2][kMmaRows], red_l[2][kMmaRows];
  __shared__ bool key_ok[NS][BN];

  const int split = blockIdx.x % a.splits, row_split = blockIdx.x / a.splits, seq = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int rg = warp % 4, half = warp / 4;
  const MlaBounds b = mla_seq_bounds(a, seq);
  const int heads = a.heads;
  const int64_t total_rows = b.q_len * heads;
  const bf16* q = static_cast<const bf16*>(a.q);
  const bf16* cache = static_cast<const bf16*>(a.cache);
  const int32_t* slots = a.kv_slots + (b.bad ? 0 : b.kv_begin);
  const int64_t rows_all = a.q_tokens * heads;
  bf16* p_w = p_s + rg * 16 * PLD;  // this row group's P [16][PLD]

  for (int64_t r0 = int64_t{row_split} * kMmaRows; r0 < total_rows; r0 += int64_t{kMmaRows} * a.row_splits) {
    const MlaKeyRange keys = mla_split_keys(a, b, split, r0, kMmaRows);
    if (split >= keys.splits) continue;  // uniform: this pass takes fewer splits
    const int64_t c0 = keys.begin, c1 = keys.end;
    const int64_t tiles = c1 > c0 ? (c1 - c0 + BN - 1) / BN : 0;
    int64_t pos_r[2];  // positions of this lane's rows g and g + 8 (-1: none)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = r0 + rg * 16 + g + 8 * h;
      pos_r[h] = r < total_rows && !b.bad ? b.kv_len - b.q_len + r / heads : int64_t{-1};
    }
    // The q tile (part of the first cp.async group).
    for (int idx = tid; idx < kMmaRows * CH; idx += kMmaThreads) {
      const int i = idx / CH, ch = idx % CH;
      const int64_t r = r0 + i;
      bf16* dst = q_s + i * LD + ch * 8;
      if (r < total_rows) cp_async_16(dst, q + ((b.q_begin + r / heads) * heads + r % heads) * kMmaD + ch * 8);
      else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
    bool bad_slot = false;
    int32_t pre[kPer];  // slots of the next tile to issue
    const auto fetch_slots = [&](int64_t t) {
#pragma unroll
      for (int p = 0; p < kPer; ++p) {
        const int row = (tid + p * kMmaThreads) / CH;
        const int64_t j = c0 + t * BN + row;
        pre[p] = t < tiles && j < c1 ? slots[j] : -1;
      }
    };
    const auto issue = [&](int64_t t) {
      if (t >= tiles) return;  // uniform
      const int st = static_cast<int>(t % NS);
#pragma unroll
      for (int p = 0; p < kPer; ++p) {
        const int idx = tid + p * kMmaThreads, row = idx / CH, ch = idx % CH;
        const int64_t j = c0 + t * BN + row;
        const int64_t slot = pre[p];
        const bool in_range = slot >= 0 && slot < a.num_slots;
        bad_slot |= j < c1 && !in_range;
        const bool ok = j < c1 && in_range;
        if (ch == 0) key_ok[st][row] = ok;
        bf16* dst = kv_s + (st * BN + row) * LD + ch * 8;
        if (ok) cp_async_16(dst, cache + slot * kMmaD + ch * 8);
        else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);  // zero rows keep 0 * garbage out
      }
    };
    fetch_slots(0);
#pragma unroll
    for (int t = 0; t < NS - 1; ++t) {
      issue(t);
      cp_async_commit();
      fetch_slots(t + 1);
    }

    float o[32][4];  // rows g, g + 8; columns 256 half + 8 n + 2 t4 (+1)
#pragma unroll
    for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_row[2] = {kNegInf, kNegInf}, l_row[2] = {0.0f, 0.0f};
    const bf16* qa_base = q_s + (rg * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + (lane / 16) * 8;

    for (int64_t t = 0; t < tiles; ++t) {  // uniform
      issue(t + NS - 1);
      cp_async_commit();
      fetch_slots(t + NS);
      cp_async_wait<NS - 1>();  // tile t (and the q tile) landed for this thread ...
      __syncthreads();          // ... and for everyone, with the zero fills and key_ok
      const int st = static_cast<int>(t % NS);
      const bf16* ks = kv_s + st * BN * LD;

      // S = Q Kᵀ over this warp's 16 keys.
      float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      const bf16* kb_base = ks + (half * 16 + (lane % 8) + (lane / 16) * 8) * LD + ((lane / 8) % 2) * 8;
#pragma unroll 6
      for (int k = 0; k < kMmaD / 16; ++k) {
        uint32_t qa[4], kb[4];
        ldmatrix_x4(qa, qa_base + k * 16);
        ldmatrix_x4(kb, kb_base + k * 16);
        mma_bf16(s[0], qa, kb[0], kb[1]);
        mma_bf16(s[1], qa, kb[2], kb[3]);
      }
      float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2, kl = half * 16 + n * 8 + 2 * t4 + (e & 1);
          const int64_t j = c0 + t * BN + kl;
          const bool visible = key_ok[st][kl] && j <= pos_r[h];
          s[n][e] = visible ? s[n][e] * a.scale_log2 : kNegInf;
          tile_max[h] = fmaxf(tile_max[h], s[n][e]);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        if (t4 == 0) red_max[half][rg * 16 + g + 8 * h] = tile_max[h];
      }
      __syncthreads();  // both halves' maxima
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = rg * 16 + g + 8 * h;
        const float m_new = fmaxf(m_row[h], fmaxf(red_max[0][row], red_max[1][row]));
        corr[h] = m_new == kNegInf ? 1.0f : exp2f(m_row[h] - m_new);
        m_row[h] = m_new;
        l_row[h] *= corr[h];
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float p0 = m_row[h] == kNegInf ? 0.0f : exp2f(s[n][2 * h] - m_row[h]);
          const float p1 = m_row[h] == kNegInf ? 0.0f : exp2f(s[n][2 * h + 1] - m_row[h]);
          l_row[h] += p0 + p1;
          *reinterpret_cast<uint32_t*>(p_w + (g + 8 * h) * PLD + half * 16 + n * 8 + 2 * t4) = pack_bf16(p0, p1);
        }
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
      }
      __syncthreads();  // both halves' P
      // O += P V over the tile's 32 keys, this warp's 256 columns.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t pa[4];
        ldmatrix_x4(pa, p_w + ((lane % 8) + ((lane / 8) % 2) * 8) * PLD + kk * 16 + (lane / 16) * 8);
        const bf16* vb_base = ks + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + half * 256 + (lane / 16) * 8;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, vb_base + n * 16);
          mma_bf16(o[2 * n], pa, vb[0], vb[1]);
          mma_bf16(o[2 * n + 1], pa, vb[2], vb[3]);
        }
      }
      __syncthreads();  // this stage and P are rewritten later
    }
    cp_async_wait<0>();  // only empty groups (or an unused q tile) remain

#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 1);
      l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 2);
      if (t4 == 0) red_l[half][rg * 16 + g + 8 * h] = l_row[h];
    }
    const bool poisoned = __syncthreads_or(bad_slot || b.bad) != 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = rg * 16 + g + 8 * h;
      const int64_t r = r0 + row;
      if (r < total_rows) {
        const float l_all = red_l[0][row] + red_l[1][row];
        const int64_t at = (b.q_begin + r / heads) * heads + r % heads;
        if (a.part_n != nullptr && split == 0 && half == 0 && t4 == 0) a.part_n[at] = keys.splits;
        if (keys.splits == 1) {
          const float inv = poisoned ? quiet_nan() : (l_all > 0.0f ? 1.0f / l_all : 0.0f);
          O* dst = static_cast<O*>(a.o) + at * kMmaL + half * 256 + 2 * t4;
#pragma unroll
          for (int n = 0; n < 32; ++n) mla_store_pair(dst + n * 8, o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
        } else {
          const int64_t part = split * rows_all + at;
          float* dst = a.part_o + part * kMmaL + half * 256 + 2 * t4;
          const float f = poisoned ? quiet_nan() : 1.0f;
#pragma unroll
          for (int n = 0; n < 32; ++n) mla_store_pair(dst + n * 8, o[n][2 * h] * f, o[n][2 * h + 1] * f);
          if (half == 0 && t4 == 0) {
            a.part_ml[part * 2] = m_row[h];
            a.part_ml[part * 2 + 1] = poisoned ? quiet_nan() : l_all;
          }
        }
      }
    }
    __syncthreads();  // q_s, red_* and the stages are rewritten by the next pass
  }
}

// ---------------------------------------------------------------------------
// Merge of the key splits' partials: one block per (token, head) row, over
// the splits its pass took.
constexpr int kCombineThreads = 128;

// acc += w * v, lane by lane (a multiply-add each, as the one-column loop's).
__device__ __forceinline__ void add_scaled(float4& acc, float w, const float4& v) {
  acc.x += w * v.x;
  acc.y += w * v.y;
  acc.z += w * v.z;
  acc.w += w * v.w;
}

template <typename O>
__global__ void __launch_bounds__(kCombineThreads)
    mla_combine_kernel(const float* part_o, const float* part_ml, const int32_t* part_n, O* o, int64_t rows,
                       int max_splits, int L) {
  const int64_t at = blockIdx.x;
  __shared__ float weight[kMlaMaxSplits];
  __shared__ float inv_den;
  __shared__ int splits;
  if (threadIdx.x < 32) {
    // The partials of every split the launch had are loaded before the row's
    // count (its pass's) is known, so that its load is not a second round
    // trip ahead of theirs; splits past the count are ignored. kMlaMaxSplits
    // is 64: two per lane.
    static_assert(kMlaMaxSplits <= 64);
    const int lane = threadIdx.x;
    float m[2], l[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int s = lane + 32 * h;
      m[h] = s < max_splits ? part_ml[(s * rows + at) * 2] : -INFINITY;
      l[h] = s < max_splits ? part_ml[(s * rows + at) * 2 + 1] : 0.0f;
    }
    // 1: the core kernel wrote the row; 0 (a row no pass covers: a token
    // outside every sequence): no output.
    const int n = part_n[at];
    float m_all = -INFINITY;
#pragma unroll
    for (int h = 0; h < 2; ++h) m_all = lane + 32 * h < n ? fmaxf(m_all, m[h]) : m_all;
    m_all = warp_max(m_all);
    float den = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int s = lane + 32 * h;
      if (s >= n) continue;
      const float w = m[h] == -INFINITY ? 0.0f : exp2f(m[h] - m_all);
      weight[s] = w;
      den += w * l[h];
    }
    den = warp_sum(den);
    if (lane == 0) {
      inv_den = isnan(den) ? quiet_nan() : (den > 0.0f ? 1.0f / den : 0.0f);
      splits = n;
    }
  }
  __syncthreads();
  const int n = splits;
  if (n <= 1 || n > max_splits) return;  // uniform
  const float inv = inv_den;
  // Four columns a thread, eight splits' loads issued before their sums:
  // one block per row and 4 warps an SM hold too few loads in flight
  // otherwise (at batch 1 x 4096 keys, 128 rows x 32 splits, a column a
  // thread read the 8 MB of partials in ~22 us on an H100; with this form
  // the whole core went from 28.5 to 21.7 us on an H200, bench/README.md).
  // Each column is still summed split by split in order, so the bits are
  // those of one column at a time.
  if (L % 4 == 0 && reinterpret_cast<uintptr_t>(part_o) % 16 == 0) {  // uniform
    const int64_t split_stride = rows * L / 4;  // one split apart, in float4s
    const float4* base = reinterpret_cast<const float4*>(part_o + at * L);
    for (int c4 = threadIdx.x; c4 < L / 4; c4 += kCombineThreads) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4* p = base + c4;
      int s = 0;
      for (; s + 8 <= n; s += 8) {
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = p[(s + u) * split_stride];
#pragma unroll
        for (int u = 0; u < 8; ++u) add_scaled(acc, weight[s + u], v[u]);
      }
      for (; s < n; ++s) add_scaled(acc, weight[s], p[s * split_stride]);
      O* dst = o + at * L + 4 * c4;
      dst[0] = from_f32<O>(acc.x * inv);
      dst[1] = from_f32<O>(acc.y * inv);
      dst[2] = from_f32<O>(acc.z * inv);
      dst[3] = from_f32<O>(acc.w * inv);
    }
    return;
  }
  for (int c = threadIdx.x; c < L; c += kCombineThreads) {
    float acc = 0.0f;
    for (int s = 0; s < n; ++s) acc += weight[s] * part_o[(s * rows + at) * L + c];
    o[at * L + c] = from_f32<O>(acc * inv);
  }
}

template <typename O>
cudaError_t launch_mma(const MlaArgs& a, dim3 grid, cudaStream_t stream) {
  static const cudaError_t configured = cudaFuncSetAttribute(
      mla_mma_kernel<O>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMmaSmemBytes));
  if (configured != cudaSuccess) return configured;
  mla_mma_kernel<O><<<grid, kMmaThreads, kMmaSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t mla_store(Elem norm_elem, Elem cache, const float* kv_a, const void* norm, float eps,
                      const int32_t* positions, const float* inv_freq, float rope_scaling, bool interleaved,
                      const int32_t* slots, void* cache_data, int64_t tokens, int latent, int rope,
                      int64_t num_slots, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  return dispatch2(norm_elem, cache, [&](auto n, auto c) {
    using N = decltype(n);
    using C = decltype(c);
    mla_store_kernel<N, C><<<static_cast<unsigned>(tokens), kStoreThreads, 0, stream>>>(
        kv_a, static_cast<const N*>(norm), eps, positions, inv_freq, rope_scaling, interleaved, slots,
        static_cast<C*>(cache_data), latent, rope, num_slots);
  });
}

cudaError_t mla_dequant_fp8(const uint8_t* w, const float* scale_inv, void* out, int64_t n, int64_t k,
                            cudaStream_t stream) {
  if (n * k == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((n * k + 255) / 256, 65536);
  mla_dequant_fp8_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(w, scale_inv, static_cast<bf16*>(out), n,
                                                                           k);
  return cudaGetLastError();
}

cudaError_t mla_gather_latent(Elem cache, Elem out_elem, const void* cache_data, const int32_t* slots, void* out,
                              int64_t count, int latent, int rope, int64_t num_slots, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return dispatch2(cache, out_elem, [&](auto c, auto o) {
    using C = decltype(c);
    using O = decltype(o);
    mla_gather_latent_kernel<C, O><<<static_cast<unsigned>(count), 128, 0, stream>>>(
        static_cast<const C*>(cache_data), slots, static_cast<O*>(out), latent, rope, num_slots);
  });
}

cudaError_t mla_split_kv(Elem cache, Elem out_elem, const void* cache_data, const int32_t* slots, const float* kv,
                         void* k, void* v, int64_t count, int heads, int latent, int rope, int nope, int v_dim,
                         int64_t num_slots, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>(heads));
  return dispatch2(cache, out_elem, [&](auto c, auto o) {
    using C = decltype(c);
    using O = decltype(o);
    mla_split_kv_kernel<C, O><<<grid, 64, 0, stream>>>(static_cast<const C*>(cache_data), slots, kv,
                                                       static_cast<O*>(k), static_cast<O*>(v), heads, latent, rope,
                                                       nope, v_dim, num_slots);
  });
}

namespace {

// Shared memory of the two kernels at the rounded batch TB, and the most
// either may use (both raise their limit to it once).
constexpr size_t kAbsorbMaxSmem = 160 * 1024;
size_t absorb_q_smem(int tb, int nope) {
  return sizeof(float) * static_cast<size_t>(tb) * (static_cast<size_t>(nope) + kAbsorbWarps * kAbsorbCols);
}
size_t absorb_out_smem(int tb, int latent) { return sizeof(float) * static_cast<size_t>(tb) * latent; }

int absorb_tb(int64_t tokens) { return tokens <= 1 ? 1 : tokens <= 2 ? 2 : tokens <= 4 ? 4 : tokens <= 8 ? 8 : 16; }

// Calls f(std::integral_constant<int, TB>) for the rounded batch.
template <typename F>
void with_tb(int tb, F&& f) {
  switch (tb) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: f(std::integral_constant<int, 16>{}); break;
  }
}

template <typename Kernel>
cudaError_t allow_absorb_smem(Kernel kernel) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kAbsorbMaxSmem));
}

}  // namespace

bool mla_absorb_any_batch_ok(int nope, int latent, int v_dim, const void* kv_b) {
  return mla_small_batch_ok(kMlaSmallBatch, nope, latent, v_dim, kv_b);
}

bool mla_small_batch_ok(int64_t tokens, int nope, int latent, int v_dim, const void* kv_b) {
  return tokens >= 1 && tokens <= kMlaSmallBatch && nope % 8 == 0 && latent % 8 == 0 && v_dim % 8 == 0 &&
         reinterpret_cast<uintptr_t>(kv_b) % 16 == 0 && absorb_q_smem(absorb_tb(tokens), nope) <= kAbsorbMaxSmem &&
         absorb_out_smem(absorb_tb(tokens), latent) <= kAbsorbMaxSmem;
}

cudaError_t mla_absorb_q_small(Elem q_elem, Elem q_full_elem, const void* q, const void* kv_b, void* q_full,
                               int64_t tokens, int heads, int nope, int rope, int latent, int v_dim,
                               cudaStream_t stream) {
  const int tb = absorb_tb(tokens);
  const size_t smem = absorb_q_smem(tb, nope);
  const dim3 grid(static_cast<unsigned>(heads), static_cast<unsigned>((latent + kAbsorbCols - 1) / kAbsorbCols),
                  static_cast<unsigned>((tokens + tb - 1) / tb));
  cudaError_t setup = cudaSuccess;
  const cudaError_t launch = dispatch2(q_elem, q_full_elem, [&](auto a, auto b) {
    using Q = decltype(a);
    using F = decltype(b);
    with_tb(tb, [&](auto tb_constant) {
      const auto kernel = mla_absorb_q_small_kernel<decltype(tb_constant)::value, Q, F>;
      static const cudaError_t allowed = allow_absorb_smem(kernel);
      if ((setup = allowed) != cudaSuccess) return;
      kernel<<<grid, kAbsorbThreads, smem, stream>>>(static_cast<const Q*>(q), static_cast<const bf16*>(kv_b),
                                                    static_cast<F*>(q_full), static_cast<int>(tokens), nope, rope,
                                                    latent, v_dim);
    });
  });
  return setup != cudaSuccess ? setup : launch;
}

cudaError_t mla_absorb_out_small(Elem o_lat_elem, Elem out_elem, const void* o_lat, const void* kv_b, void* out,
                                 int64_t tokens, int heads, int nope, int latent, int v_dim, cudaStream_t stream) {
  const int tb = absorb_tb(tokens);
  const size_t smem = absorb_out_smem(tb, latent);
  const dim3 grid(static_cast<unsigned>((v_dim + kAbsorbOutRows - 1) / kAbsorbOutRows), static_cast<unsigned>(heads),
                  static_cast<unsigned>((tokens + tb - 1) / tb));
  cudaError_t setup = cudaSuccess;
  const cudaError_t launch = dispatch2(o_lat_elem, out_elem, [&](auto a, auto b) {
    using O = decltype(a);
    using Out = decltype(b);
    with_tb(tb, [&](auto tb_constant) {
      const auto kernel = mla_absorb_out_small_kernel<decltype(tb_constant)::value, O, Out>;
      static const cudaError_t allowed = allow_absorb_smem(kernel);
      if ((setup = allowed) != cudaSuccess) return;
      kernel<<<grid, kAbsorbThreads, smem, stream>>>(static_cast<const O*>(o_lat), static_cast<const bf16*>(kv_b),
                                                    static_cast<Out*>(out), static_cast<int>(tokens), nope, latent,
                                                    v_dim);
    });
  });
  return setup != cudaSuccess ? setup : launch;
}

cudaError_t mla_copy_q_rope(Elem q_elem, Elem q_full_elem, const void* q, void* q_full, int64_t tokens, int heads,
                            int nope, int rope, int latent, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  return dispatch2(q_elem, q_full_elem, [&](auto a, auto b) {
    using Q = decltype(a);
    using F = decltype(b);
    mla_copy_q_rope_kernel<Q, F><<<static_cast<unsigned>(tokens), 128, 0, stream>>>(
        static_cast<const Q*>(q), static_cast<F*>(q_full), heads, nope, rope, latent);
  });
}

bool mla_attention_uses_mma(Elem cache, Elem q_full, const MlaAttentionShape& shape) {
  return cache == Elem::kBF16 && q_full == Elem::kBF16 && shape.latent == kMlaMmaLatent && shape.rope == kMlaMmaRope;
}

int mla_attention_row_splits(const MlaAttentionShape& shape, bool mma) {
  if (shape.num_seqs <= 0) return 1;
  const int64_t rows = mma ? kMmaRows : kCoreRows;
  const int64_t avg_rows = (shape.q_tokens * shape.heads + shape.num_seqs - 1) / shape.num_seqs;
  return static_cast<int>(std::clamp<int64_t>((avg_rows + rows - 1) / rows, 1, 4096));
}

int mla_attention_passes_per_token(int heads, bool mma) {
  const int rows = mma ? kMmaRows : kCoreRows;
  return heads < 1 ? 1 : (heads + rows - 1) / rows;
}

int mla_attention_splits_on(const MlaAttentionShape& shape, bool mma, int64_t sms) {
  if (shape.num_seqs <= 0) return 1;
  const int64_t avg_keys = std::max<int64_t>(shape.kv_slots_len / shape.num_seqs, 1);
  return mla_splits_for_keys(avg_keys, int64_t{shape.num_seqs} * mla_attention_passes_per_token(shape.heads, mma),
                             sms, mma);
}

int mla_attention_splits(const MlaAttentionShape& shape, bool mma) {
  return mla_attention_splits_on(shape, mma, sm_count());
}

MlaSplitTable mla_split_table(int64_t base, int64_t sms, bool mma) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, bool>, MlaSplitTable> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(base, sms, mma);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  MlaSplitTable table{};
  constexpr int64_t kMostKeys = std::numeric_limits<int32_t>::max();
  for (int s = 2; s <= kMlaMaxSplits; ++s) {
    // The least keys in [0, kMostKeys] with s splits or more (the rule never
    // falls as keys grow); kMostKeys where it has fewer even there.
    int64_t lo = 0, hi = kMostKeys;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (mla_splits_for_keys(mid, base, sms, mma) >= s) hi = mid;
      else lo = mid + 1;
    }
    table.min_keys[s - 2] = static_cast<int32_t>(lo);
  }
  cache.emplace(key, table);
  return table;
}

int64_t mla_attention_scratch_floats(const MlaAttentionShape& shape, int splits) {
  if (splits <= 1) return 0;
  // part_o and part_ml per split, and part_n (int32 in float slots).
  return (int64_t{splits} * (shape.latent + 2) + 1) * shape.q_tokens * shape.heads;
}

cudaError_t mla_attention(Elem q_elem, Elem cache, Elem o_elem, const void* q_full, const void* cache_data,
                          const int32_t* q_start, const int32_t* kv_start, const int32_t* kv_slots,
                          const MlaAttentionShape& shape, int splits, bool splits_by_pass, int row_splits,
                          MlaCoreKernel kernel, float* scratch, void* o_lat, cudaStream_t stream) {
  if (shape.q_tokens == 0 || shape.num_seqs == 0) return cudaSuccess;
  MlaArgs a{};
  a.q = q_full;
  a.cache = cache_data;
  a.o = o_lat;
  const int64_t rows = shape.q_tokens * shape.heads;
  a.part_o = splits > 1 ? scratch : nullptr;
  a.part_ml = splits > 1 ? scratch + int64_t{splits} * rows * shape.latent : nullptr;
  a.part_n = splits > 1 ? reinterpret_cast<int32_t*>(scratch + int64_t{splits} * rows * (shape.latent + 2)) : nullptr;
  a.q_start = q_start;
  a.kv_start = kv_start;
  a.kv_slots = kv_slots;
  a.q_tokens = shape.q_tokens;
  a.kv_slots_len = shape.kv_slots_len;
  a.num_slots = shape.num_slots;
  a.heads = shape.heads;
  a.L = shape.latent;
  a.R = shape.rope;
  a.splits = splits;
  a.row_splits = row_splits;
  const bool mma = kernel != MlaCoreKernel::kCudaCores;
  a.splits_by_pass = splits_by_pass && splits > 1;
  if (a.splits_by_pass)
    a.split_table =
        mla_split_table(int64_t{shape.num_seqs} * mla_attention_passes_per_token(shape.heads, mma), sm_count(), mma);
  a.scale_log2 = shape.scale * kLog2e;
  const dim3 grid(static_cast<unsigned>(splits * row_splits), static_cast<unsigned>(shape.num_seqs));
  if (kernel != MlaCoreKernel::kCudaCores) {
    if (!mla_attention_uses_mma(cache, q_elem, shape)) return cudaErrorInvalidValue;
    const bool f32_out = o_elem == Elem::kF32;
    const cudaError_t status = kernel == MlaCoreKernel::kWgmma ? launch_mla_wgmma(a, grid, f32_out, stream)
                               : f32_out                       ? launch_mma<float>(a, grid, stream)
                                                               : launch_mma<bf16>(a, grid, stream);
    if (status != cudaSuccess) return status;
  } else {
    if (q_elem != Elem::kF32) return cudaErrorInvalidValue;
    const size_t smem = core_smem_bytes(shape.latent, shape.rope);
    dispatch2(cache, o_elem, [&](auto c, auto o) {
      using C = decltype(c);
      using O = decltype(o);
      mla_core_kernel<C, O><<<grid, kCoreThreads, smem, stream>>>(a);
    });
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  if (splits > 1) {
    if (o_elem == Elem::kF32) {
      mla_combine_kernel<float><<<static_cast<unsigned>(rows), kCombineThreads, 0, stream>>>(
          a.part_o, a.part_ml, a.part_n, static_cast<float*>(o_lat), rows, splits, shape.latent);
    } else {
      mla_combine_kernel<bf16><<<static_cast<unsigned>(rows), kCombineThreads, 0, stream>>>(
          a.part_o, a.part_ml, a.part_n, static_cast<bf16*>(o_lat), rows, splits, shape.latent);
    }
  }
  return cudaGetLastError();
}

}  // namespace basalt::cuda_kernels
