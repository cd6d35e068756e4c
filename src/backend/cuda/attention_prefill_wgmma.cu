// The attention prefill on Hopper's warpgroup MMA (sm_90a; wgmma.cuh): the
// mma.sync prefill kernel's semantics (attention_kernels.cu: the plan's
// tiles, causal and window masks, poisoned rows, q, K, V and the
// probabilities rounded to bf16, scores, softmax and sums in f32) for bf16
// caches whose head dims are multiples of 8, at four padded widths (keys x
// values: 64 x 64, 128 x 128, 192 x 128, 256 x 256; a head dim pads to the
// first that holds it with zero features, which add nothing to a score and
// are not stored). The design follows FlashAttention-3's consumer
// warpgroups (read, not copied), without its producer warpgroup.
//
// A block is 256 threads, two warpgroups, and serves a tile of 128 query
// rows of one sequence and one query head; warpgroup w owns rows 64 w .. 64 w
// + 63 (one wgmma M) and keeps their online softmax and output in registers.
// Shared memory holds the q tile and two stages of BN keys (128, or 64 at the
// 256 x 256 width) of K and V rows gathered by slot with cp.async, each tile
// stored as column blocks of 64 features x rows of 128 bytes in wgmma's
// 128-byte swizzle; the next stage's copy runs under this one's math and its
// slots are read a tile ahead. Per key tile, each warpgroup whose rows see
// any of its keys:
//  1. S = Q Kᵀ over the head dim (m64nBNk16, both operands in shared memory);
//  2. scale to the log2 domain, mask (causal, window, range) unless the
//     whole tile is visible to all its rows, online softmax in registers;
//  3. O += P V (m64nDVk16, P from registers: S's accumulator layout is the A
//     fragment's, rounded to bf16; V read MN-major from its shared rows).
// The warpgroups take turns (FlashAttention-3's ping-pong): warpgroup 1
// starts its S once warpgroup 0's is done, so each one's softmax runs while
// the other's MMAs do; both meet at the stage barrier once per tile.
#include <cstdint>

#include "backend/cuda/attention_core.cuh"
#include "backend/cuda/element_types.cuh"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace basalt::cuda_kernels {
namespace {

constexpr int kRows = kWgmmaPrefillRows;  // query rows per block: one wgmma M per warpgroup
constexpr int kThreads = 256;
constexpr int32_t kNoKey = INT32_MIN;  // a slot entry past the tile's keys

template <int DK, int DV>
struct WgmmaPrefillTile {
  static constexpr int BN = DK + DV > 384 ? 64 : 128;  // keys per tile
  static constexpr int kStages = 2;
  static constexpr int kQBytes = kRows * DK * 2;
  static constexpr int kKBytes = BN * DK * 2;
  static constexpr int kStageBytes = kKBytes + BN * DV * 2;
  static constexpr int kSmemBytes = kQBytes + kStages * kStageBytes + kStages * BN * 4 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "one block per SM");
  static_assert(BN * (DK + DV) / 8 % kThreads == 0 && kRows * DK / 8 % kThreads == 0, "whole copy rounds");
};

// Byte offset of 16-byte chunk ch of row r in a tile of `rows` rows.
__device__ __forceinline__ uint32_t tile_offset(int rows, int r, int ch) {
  return static_cast<uint32_t>((ch / 8) * rows * 128 + r * 128 + (((ch % 8) ^ (r % 8)) << 4));
}

// Named barrier 1 (0 is __syncthreads'): bar.sync waits for `threads`
// arrivals counting its own warps', bar.arrive adds its warps' and goes on.
constexpr int kPingPongBarrier = 1;
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int BN>
__device__ __forceinline__ void mma_scores(float (&s)[BN / 2], uint64_t desc_q, uint64_t desc_k, bool accumulate) {
  if constexpr (BN == 128) wgmma_m64n128k16_bf16(s, desc_q, desc_k, accumulate);
  else wgmma_m64n64k16_bf16(s, desc_q, desc_k, accumulate);
}

template <int DV>
__device__ __forceinline__ void mma_values(float (&o)[DV / 2], const uint32_t (&p)[4], uint64_t desc_v) {
  if constexpr (DV == 256) wgmma_m64n256k16_bf16_rs(o, p, desc_v, true);
  else if constexpr (DV == 128) wgmma_m64n128k16_bf16_rs(o, p, desc_v, true);
  else wgmma_m64n64k16_bf16_rs(o, p, desc_v, true);
}

template <int DK, int DV>
__global__ void __launch_bounds__(kThreads, 1) prefill_wgmma_kernel(AttentionArgs a) {
  using Tile = WgmmaPrefillTile<DK, DV>;
  constexpr int BN = Tile::BN, NS = Tile::kStages;
  constexpr float kNegInf = -INFINITY;
  extern __shared__ __align__(1024) uint8_t prefill_smem[];
  uint8_t* const base = prefill_smem + ((1024 - (smem_addr(prefill_smem) & 1023)) & 1023);
  const uint32_t q_s = smem_addr(base), kv_s = q_s + Tile::kQBytes;  // stage st: K at kv_s + st * kStageBytes, V after
  int32_t* const slot_s = reinterpret_cast<int32_t*>(base + Tile::kQBytes + NS * Tile::kStageBytes);  // [NS][BN]

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int head = blockIdx.y, kv_head = head / a.group;
  const int D = a.head_dim, Dv = a.v_head_dim;

  PrefillTileRows tile;
  if (!find_prefill_tile(a, blockIdx.x, kRows, tile)) return;  // a surplus block (uniform)
  const SeqBounds& b = tile.b;
  const int64_t q0 = tile.q0, pos0 = tile.pos0;  // pos0: the position of local row 0
  const int rows_here = tile.rows;
  if (b.bad) return poison_prefill_tile(a, tile, head, tid, kThreads);

  const int64_t lo = a.sliding_window > 0 ? max(int64_t{0}, pos0 - a.sliding_window + 1) : int64_t{0};
  const int64_t hi = min(b.kv_len, pos0 + rows_here);  // keys [lo, hi)
  const int num_tiles = hi > lo ? static_cast<int>((hi - lo + BN - 1) / BN) : 0;
  const int32_t* slots = a.kv_slots + b.kv_begin;
  const bf16* k_cache = static_cast<const bf16*>(a.k_cache);
  const bf16* v_cache = static_cast<const bf16*>(a.v_cache);

  const auto slot_of = [&](int t, int key) -> int32_t {
    const int64_t j = lo + int64_t{t} * BN + key;
    return t < num_tiles && j < hi ? slots[j] : kNoKey;
  };
  if (tid < BN)
#pragma unroll
    for (int st = 0; st < NS; ++st) slot_s[st * BN + tid] = slot_of(st, tid);

  // The q tile as bf16 (zeros past the sequence's rows and the head dim).
  constexpr int kQChunks = DK / 8;
#pragma unroll 4
  for (int p = 0; p < kRows * kQChunks / kThreads; ++p) {
    const int idx = tid + p * kThreads, r = idx / kQChunks, ch = idx % kQChunks;
    const bool ok = r < rows_here && ch * 8 < D;
    const int64_t at = ((b.q_begin + q0 + r) * a.num_heads + head) * D + ch * 8;
    const uint32_t off = tile_offset(kRows, r, ch);
    if (a.q_bf16) {
      cp_async_16_or_zero(q_s + off, static_cast<const bf16*>(a.q) + (ok ? at : 0), ok);
    } else {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (ok) {
        const float4 x = *reinterpret_cast<const float4*>(static_cast<const float*>(a.q) + at);
        const float4 y = *reinterpret_cast<const float4*>(static_cast<const float*>(a.q) + at + 4);
        v = make_uint4(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w), pack_bf16(y.x, y.y), pack_bf16(y.z, y.w));
      }
      *reinterpret_cast<uint4*>(base + off) = v;
    }
  }
  __syncthreads();  // the first stages' slots

  // Gathers key tile t into its stage. Thread tid copies 16-byte chunk tid %
  // 8 of each 64-feature column block of rows tid / 8 + 32 i (i < BN / 32),
  // K's blocks and then V's: eight threads read 128 contiguous bytes of a
  // row, and a thread reads its rows' slots once per tile.
  constexpr int kRowsPerThread = BN / 32;
  const int my_chunk = tid % 8, my_row = tid / 8;
  bool bad_slot = false;
  const auto issue = [&](int t) {
    if (t >= num_tiles) return;  // uniform
    const int st = t % NS;
    const uint32_t k_dst = kv_s + st * Tile::kStageBytes, v_dst = k_dst + Tile::kKBytes;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = my_row + 32 * i;
      const int32_t slot = slot_s[st * BN + row];
      const bool in_range = slot >= 0 && slot < a.num_slots;
      bad_slot |= slot != kNoKey && !in_range;
      const int64_t at = (int64_t{in_range ? slot : 0} * a.num_kv_heads + kv_head);
      const bf16* k_row = k_cache + at * D + my_chunk * 8;
      const bf16* v_row = v_cache + at * Dv + my_chunk * 8;
      const uint32_t dst = static_cast<uint32_t>(row * 128 + ((my_chunk ^ (row % 8)) << 4));
#pragma unroll
      for (int cb = 0; cb < DK / 64; ++cb) {
        const bool ok = in_range && cb * 64 + my_chunk * 8 < D;
        cp_async_16_or_zero(k_dst + cb * BN * 128 + dst, ok ? k_row + cb * 64 : k_cache, ok);
      }
#pragma unroll
      for (int cb = 0; cb < DV / 64; ++cb) {
        const bool ok = in_range && cb * 64 + my_chunk * 8 < Dv;
        cp_async_16_or_zero(v_dst + cb * BN * 128 + dst, ok ? v_row + cb * 64 : v_cache, ok);
      }
    }
  };
  issue(0);
  cp_async_commit();  // with the q tile

  float o[DV / 2];  // rows g, g + 8 of this warp's 16; value features 8 j + 2 t4 (+1) in o[4 j + 2 h (+1)]
#pragma unroll
  for (int i = 0; i < DV / 2; ++i) o[i] = 0.0f;
  float m_row[2] = {kNegInf, kNegInf}, l_row[2] = {0.0f, 0.0f};
  const int wg_rows = max(0, min(64, rows_here - 64 * wg));
  const int64_t wp0 = pos0 + 64 * wg;  // position of this warpgroup's first row
  const int row_a = 64 * wg + 16 * warp + g;  // local rows row_a, row_a + 8

  for (int t = 0; t < num_tiles; ++t) {  // uniform
    cp_async_wait<0>();
    fence_proxy_async_shared();  // the copies and q stores are visible to wgmma's reads ...
    __syncthreads();             // ... for everyone; stage (t + 1) % NS is free again
    const int32_t next_slot = tid < BN ? slot_of(t + NS, tid) : kNoKey;
    issue(t + 1);
    cp_async_commit();
    const int st = t % NS;
    const int64_t kt = lo + int64_t{t} * BN;
    const bool active =
        wg_rows > 0 && kt <= wp0 + wg_rows - 1 && (a.sliding_window <= 0 || wp0 - (kt + BN - 1) < a.sliding_window);
    const uint32_t k_tile = kv_s + st * Tile::kStageBytes;
    float s[BN / 2];  // rows g, g + 8; keys kt + 8 j + 2 t4 (+1) in s[4 j + 2 h (+1)]
    // Ping-pong: warpgroup 1 starts its S = Q Kᵀ once warpgroup 0's is done,
    // so each one's softmax runs under the other's MMAs. Both pass the
    // barrier once per tile, active or not.
    if (wg == 1) named_barrier_sync(kPingPongBarrier, kThreads);
    if (active) {  // uniform over the warpgroup
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) s[i] = 0.0f;
      const uint64_t desc_q = wgmma_desc_sw128(q_s + wg * 64 * 128), desc_k = wgmma_desc_sw128(k_tile);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk)
        mma_scores<BN>(s, desc_q + (((kk / 4) * kRows * 128 + (kk % 4) * 32) >> 4),
                       desc_k + (((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(s);
    }
    if (wg == 0) named_barrier_arrive(kPingPongBarrier, kThreads);
    if (active) {
      // Scores stay unscaled until the exponent (exp2(s * scale - m), one
      // FFMA): the running max m is kept scaled, masked scores are -inf.
      const bool unmasked =
          kt + BN <= hi && kt + BN - 1 <= wp0 && (a.sliding_window <= 0 || wp0 + 63 - kt < a.sliding_window);
      float tile_max[2] = {kNegInf, kNegInf};
      if (unmasked) {
#pragma unroll
        for (int e = 0; e < BN / 2; ++e) tile_max[(e % 4) / 2] = fmaxf(tile_max[(e % 4) / 2], s[e]);
      } else {
        // Key offsets within the tile against each row's limits, in 32 bits.
        // A row sees offsets [first, last] (causal, window) below key_end.
        const int key_end = static_cast<int>(min(hi - kt, int64_t{BN}));
        int first[2], last[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t rel = pos0 + row_a + 8 * h - kt;  // the row's position - kt
          last[h] = static_cast<int>(max(int64_t{-1}, min(rel, int64_t{BN})));
          first[h] = a.sliding_window > 0
                         ? static_cast<int>(max(int64_t{0}, min(rel - a.sliding_window + 1, int64_t{BN})))
                         : 0;
        }
#pragma unroll
        for (int e = 0; e < BN / 2; ++e) {
          const int h = (e % 4) / 2, key = 8 * (e / 4) + 2 * t4 + (e & 1);
          const bool visible = key < key_end && key <= last[h] && key >= first[h];
          s[e] = visible ? s[e] : kNegInf;
          tile_max[h] = fmaxf(tile_max[h], s[e]);
        }
      }
      float corr[2], m_use[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        const float m_new = fmaxf(m_row[h], tile_max[h] * a.scale_log2);
        m_use[h] = m_new == kNegInf ? 0.0f : m_new;  // a row with no visible key yet: every p is 0
        corr[h] = fast_exp2(m_row[h] - m_use[h]);
        m_row[h] = m_new;
        l_row[h] *= corr[h];
      }
      uint32_t pf[BN / 16][4];  // P's A fragments, one per 16-key step
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        float p[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int h = (e % 4) / 2;
          p[e] = fast_exp2(fmaf(s[8 * kk + e], a.scale_log2, -m_use[h]));
          l_row[h] += p[e];
        }
        pf[kk][0] = pack_bf16(p[0], p[1]), pf[kk][1] = pack_bf16(p[2], p[3]);
        pf[kk][2] = pack_bf16(p[4], p[5]), pf[kk][3] = pack_bf16(p[6], p[7]);
      }
      // Rescale O only where a row's max moved (rare past the first tiles).
      if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f))
#pragma unroll
        for (int i = 0; i < DV / 2; ++i) o[i] *= corr[(i % 4) / 2];
      const uint64_t desc_v = wgmma_desc_sw128_mn(k_tile + Tile::kKBytes, BN * 128, 1024);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) mma_values<DV>(o, pf[kk], desc_v + ((kk * 16 * 128) >> 4));
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(o);
    }
    if (tid < BN) slot_s[st * BN + tid] = next_slot;  // tile t + NS's, for its issue after the next barrier
  }
  cp_async_wait<0>();  // only an empty group (or an unused q tile) remains

  const bool poisoned = __syncthreads_or(bad_slot) != 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 1);
    l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 2);
    const int r = row_a + 8 * h;
    if (r >= rows_here) continue;
    const int64_t token = b.q_begin + q0 + r;
    const float inv = poisoned ? quiet_nan() : (l_row[h] > 0.0f ? 1.0f / l_row[h] : 0.0f);  // no visible key: zeros
    const int64_t at = (token * a.num_heads + head) * Dv;
#pragma unroll
    for (int j = 0; j < DV / 8; ++j) {
      const int d = 8 * j + 2 * t4;  // Dv is a multiple of 8: both features or neither
      if (d >= Dv) continue;
      const float x = o[4 * j + 2 * h] * inv, y = o[4 * j + 2 * h + 1] * inv;
      if (a.out_bf16)
        *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(a.out) + at + d) = __floats2bfloat162_rn(x, y);
      else
        *reinterpret_cast<float2*>(static_cast<float*>(a.out) + at + d) = make_float2(x, y);
    }
  }
}

template <int DK, int DV>
cudaError_t launch(const AttentionArgs& a, dim3 grid, cudaStream_t stream) {
  constexpr int smem = WgmmaPrefillTile<DK, DV>::kSmemBytes;
  static const cudaError_t configured =
      cudaFuncSetAttribute(prefill_wgmma_kernel<DK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (configured != cudaSuccess) return configured;
  prefill_wgmma_kernel<DK, DV><<<grid, kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

bool attention_prefill_wgmma_fits(int head_dim, int v_head_dim) {
  return head_dim > 0 && v_head_dim > 0 && head_dim % 8 == 0 && v_head_dim % 8 == 0 && head_dim <= 256 &&
         v_head_dim <= 256;
}

cudaError_t launch_attention_prefill_wgmma(const AttentionArgs& a, dim3 grid, cudaStream_t stream) {
  if (!wgmma_available() || a.prefill_rows != kRows || !attention_prefill_wgmma_fits(a.head_dim, a.v_head_dim))
    return cudaErrorInvalidDeviceFunction;
  const int dk = (a.head_dim + 63) / 64 * 64, dv = (a.v_head_dim + 63) / 64 * 64;
  if (dk <= 64 && dv <= 64) return launch<64, 64>(a, grid, stream);
  if (dk <= 128 && dv <= 128) return launch<128, 128>(a, grid, stream);
  if (dk <= 192 && dv <= 128) return launch<192, 128>(a, grid, stream);
  return launch<256, 256>(a, grid, stream);
}

}  // namespace basalt::cuda_kernels
