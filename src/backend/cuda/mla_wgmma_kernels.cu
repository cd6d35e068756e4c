// The MLA decode core on Hopper's warpgroup MMA (sm_90a; wgmma.cuh):
// DeepSeek's absorbed attention over a bf16 latent cache with L = 512, R = 64
// (rows 576 wide, values their first 512 features), for any number of query
// rows per sequence. The division of the work follows FlashMLA's design
// (read, not copied): two warpgroups share a 64-row query tile and a 64-key
// cache tile, split the keys for S = Q Kᵀ and the value features for O += P
// V, and meet twice a tile in shared memory.
//
// A block is 256 threads (warpgroups 0 and 1) and holds, in 227 KB of shared
// memory, the pass's 64 query rows (q_full) and two 64-key stages of cache
// rows gathered by slot, each tile stored as nine 64-feature column blocks
// of 64 rows x 128 bytes in wgmma's 128-byte swizzle. Per tile:
//  1. warpgroup w computes S_w = Q K_wᵀ for the tile's keys 32 w .. 32 w + 31
//     over all 576 features (36 m64n32k16, both operands in shared memory);
//  2. the rows' maxima meet in shared memory, so both warpgroups rescale by
//     the same running max; each keeps its own half of the running sums;
//  3. P, rounded to bf16, goes to shared memory already in the register
//     order of wgmma's A fragments, so a thread loads the fragments of its
//     rows for all 64 keys with four 16-byte loads;
//  4. warpgroup w computes O_w += P V_w for value features 256 w .. 256 w +
//     255 (4 m64n256k16, A from registers; V is read MN-major from the same
//     shared rows as K: no second copy and no transpose).
// The next tile is gathered with cp.async while this one is computed, and
// the slots of the one after are read while this one is computed too.
// Semantics, splits, partials and poisoning are mla_mma_kernel's
// (mla_kernels.cu, mla_core.cuh): q and P rounded to bf16, products and
// sums in f32.
#include <cstdint>

#include "backend/cuda/element_types.cuh"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/mla_core.cuh"
#include "backend/cuda/mla_kernels.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace basalt::cuda_kernels {
namespace {

constexpr int kRows = 64;   // query rows per pass: one wgmma M
constexpr int kKeys = 64;   // keys per tile
constexpr int kThreads = 256;
constexpr int kD = kMlaMmaLatent + kMlaMmaRope;  // 576
constexpr int kBlockBytes = kKeys * 128;         // one 64-feature column block of a tile
constexpr int kTileBytes = kD / 64 * kBlockBytes;  // 73,728
constexpr int kChunksPerRow = kD / 8;              // 16-byte chunks
constexpr int kChunksPerThread = kKeys * kChunksPerRow / kThreads;
static_assert(kRows == kKeys && kKeys * kChunksPerRow % kThreads == 0, "q and key tiles load alike");
constexpr int kFragBytes = 4 * 4 * 32 * 16;  // P fragments [k16 step][warp][lane], 16 bytes each
constexpr int kSmemBytes = 3 * kTileBytes + kFragBytes + 2 * kKeys * 4 + 4 * kRows * 4 + 1024;
constexpr int32_t kNoKey = INT32_MIN;  // a slot entry past the split's keys

// Byte offset of 16-byte chunk ch (0 .. 71) of row r in a tile.
__device__ __forceinline__ uint32_t tile_offset(int r, int ch) {
  return static_cast<uint32_t>((ch / 8) * kBlockBytes + r * 128 + (((ch % 8) ^ (r % 8)) << 4));
}

template <typename O>
__global__ void __launch_bounds__(kThreads, 1) mla_wgmma_kernel(MlaArgs a) {
  constexpr float kNegInf = -INFINITY;
  extern __shared__ __align__(1024) uint8_t wgmma_smem[];
  uint8_t* const base = wgmma_smem + ((1024 - (smem_addr(wgmma_smem) & 1023)) & 1023);
  const uint32_t q_s = smem_addr(base), kv_s = q_s + kTileBytes;  // stage st at kv_s + st * kTileBytes
  uint4* const frags = reinterpret_cast<uint4*>(base + 3 * kTileBytes);
  int32_t* const slot_s = reinterpret_cast<int32_t*>(base + 3 * kTileBytes + kFragBytes);  // [2][kKeys]
  float* const red_max = reinterpret_cast<float*>(slot_s + 2 * kKeys);                      // [2][kRows]
  float* const red_l = red_max + 2 * kRows;                                                 // [2][kRows]

  const int split = blockIdx.x % a.splits, row_split = blockIdx.x / a.splits, seq = blockIdx.y;
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const MlaBounds b = mla_seq_bounds(a, seq);
  const int heads = a.heads;
  const int64_t total_rows = b.q_len * heads;
  const bf16* q = static_cast<const bf16*>(a.q);
  const bf16* cache = static_cast<const bf16*>(a.cache);
  const int32_t* slots = a.kv_slots + (b.bad ? 0 : b.kv_begin);
  const int64_t rows_all = a.q_tokens * heads;

  for (int64_t r0 = int64_t{row_split} * kRows; r0 < total_rows; r0 += int64_t{kRows} * a.row_splits) {  // uniform
    const MlaKeyRange keys = mla_split_keys(a, b, split, r0, kRows);
    if (split >= keys.splits) continue;  // uniform: this pass takes fewer splits
    // Key indices within a sequence fit 32 bits (its slots are int32 rows).
    const int c0 = static_cast<int>(keys.begin), c1 = static_cast<int>(keys.end);
    const int tiles = c1 > c0 ? (c1 - c0 + kKeys - 1) / kKeys : 0;
    // The pass's first row's position: the lowest of its rows'.
    const int pass_first_pos = b.bad ? -1 : static_cast<int>(b.kv_len - b.q_len + r0 / heads);
    int pos_r[2];  // positions of this thread's rows g and g + 8 of its warp's 16 (-1: none)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = r0 + warp * 16 + g + 8 * h;
      pos_r[h] = r < total_rows && !b.bad ? static_cast<int>(b.kv_len - b.q_len + r / heads) : -1;
    }
    const auto slot_of = [&](int t, int key) -> int32_t {
      const int j = c0 + t * kKeys + key;
      if (t >= tiles || j >= c1) return kNoKey;
      const int32_t slot = slots[j];
      return slot == kNoKey ? -1 : slot;  // still a bad slot, not "no key"
    };
    if (tid < 2 * kKeys) slot_s[tid] = slot_of(tid / kKeys, tid % kKeys);
    __syncthreads();  // tiles 0 and 1's slots

    // The q tile (zeros past the sequence's rows) and key tile 0: one group.
#pragma unroll
    for (int p = 0; p < kChunksPerThread; ++p) {
      const int idx = tid + p * kThreads, row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
      const int64_t r = r0 + row;
      const bool ok = r < total_rows;
      cp_async_16_or_zero(q_s + tile_offset(row, ch),
                          ok ? q + ((b.q_begin + r / heads) * heads + r % heads) * kD + ch * 8 : q, ok);
    }
    bool bad_slot = false;
    const auto issue = [&](int t) {
      if (t >= tiles) return;  // uniform
      const int st = t % 2;
      const uint32_t dst = kv_s + st * kTileBytes;
#pragma unroll 9
      for (int p = 0; p < kChunksPerThread; ++p) {
        const int idx = tid + p * kThreads, row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
        const int32_t slot = slot_s[st * kKeys + row];
        const bool in_range = slot >= 0 && slot < a.num_slots;
        bad_slot |= slot != kNoKey && !in_range;
        cp_async_16_or_zero(dst + tile_offset(row, ch), in_range ? cache + int64_t{slot} * kD + ch * 8 : cache,
                            in_range);
      }
    };
    issue(0);
    cp_async_commit();

    float o[128];  // rows g, g + 8 of this warp's 16; value features 256 wg + 8 j + 2 t4 (+1)
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float m_row[2] = {kNegInf, kNegInf}, l_row[2] = {0.0f, 0.0f};

    for (int t = 0; t < tiles; ++t) {  // uniform
      cp_async_wait<0>();
      fence_proxy_async_shared();  // the copies (and zero fills) are visible to wgmma's reads ...
      __syncthreads();             // ... for everyone; stage (t + 1) % 2 and the fragments are free again
      // Tile t + 2's slots, read now and stored after this tile's last use of
      // its stage's slots (the end of this iteration).
      const int32_t next_slot = tid < kKeys ? slot_of(t + 2, tid) : kNoKey;
      issue(t + 1);
      cp_async_commit();
      const int st = t % 2;
      const uint32_t k_tile = kv_s + st * kTileBytes;

      // 1. S_w = Q K_wᵀ: keys 32 wg + 8 j + 2 t4 (+1) in s[4 j + i].
      float s[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = 0.0f;
      // Descriptors advance by adding to the address field (16-byte units):
      // immediates, not 72 descriptors kept in registers across tiles.
      const uint64_t desc_q = wgmma_desc_sw128(q_s), desc_k = wgmma_desc_sw128(k_tile + wg * 32 * 128);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t off = ((kk / 4) * kBlockBytes + (kk % 4) * 32) >> 4;
        wgmma_m64n32k16_bf16(s, desc_q + off, desc_k + off, kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(s);

      // 2. Masks and the rows' maxima over both halves. Scores stay unscaled
      // until the exponent (exp2(s * scale - m), one FFMA; m is kept scaled);
      // a key is masked by its index alone (a bad slot poisons the rows), and
      // only in tiles some row does not wholly see.
      const int key0 = c0 + t * kKeys;
      float tile_max[2] = {kNegInf, kNegInf};
      if (key0 + kKeys <= c1 && key0 + kKeys - 1 <= pass_first_pos) {
#pragma unroll
        for (int e = 0; e < 16; ++e) tile_max[(e % 4) / 2] = fmaxf(tile_max[(e % 4) / 2], s[e]);
      } else {
#pragma unroll
        for (int e = 0; e < 16; ++e) {
          const int h = (e % 4) / 2, key = key0 + wg * 32 + (e / 4) * 8 + 2 * t4 + (e & 1);
          s[e] = key < c1 && key <= pos_r[h] ? s[e] : kNegInf;
          tile_max[h] = fmaxf(tile_max[h], s[e]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        if (t4 == 0) red_max[wg * kRows + warp * 16 + g + 8 * h] = tile_max[h];
      }
      __syncthreads();  // both halves' maxima
      float corr[2], m_use[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp * 16 + g + 8 * h;
        const float m_new = fmaxf(m_row[h], fmaxf(red_max[row], red_max[kRows + row]) * a.scale_log2);
        m_use[h] = m_new == kNegInf ? 0.0f : m_new;  // no visible key yet: every p is 0
        corr[h] = fast_exp2(m_row[h] - m_use[h]);
        m_row[h] = m_new;
        l_row[h] *= corr[h];
      }
      // 3. P in A-fragment order: k16 step 2 wg + kl holds keys 32 wg + 16 kl
      // .. + 15, i.e. s blocks j = 2 kl and 2 kl + 1.
#pragma unroll
      for (int kl = 0; kl < 2; ++kl) {
        float p[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int h = (e % 4) / 2;
          p[e] = fast_exp2(fmaf(s[8 * kl + e], a.scale_log2, -m_use[h]));
          l_row[h] += p[e];
        }
        frags[((wg * 2 + kl) * 4 + warp) * 32 + lane] =
            make_uint4(pack_bf16(p[0], p[1]), pack_bf16(p[2], p[3]), pack_bf16(p[4], p[5]), pack_bf16(p[6], p[7]));
      }
      // O is rescaled only where a row's max moved (rare past the first tiles).
      if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f))
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= corr[(i % 4) / 2];
      __syncthreads();  // both halves' P

      // 4. O_w += P V_w over the tile's 64 keys (the fragments loaded before
      // the fence, so the compiler need not fence each MMA on its own).
      uint32_t af[kKeys / 16][4];
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const uint4 f = frags[(kk * 4 + warp) * 32 + lane];
        af[kk][0] = f.x, af[kk][1] = f.y, af[kk][2] = f.z, af[kk][3] = f.w;
      }
      const uint64_t desc_v = wgmma_desc_sw128_mn(k_tile + wg * 4 * kBlockBytes, kBlockBytes, 1024);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk)
        wgmma_m64n256k16_bf16_rs(o, af[kk], desc_v + ((kk * 16 * 128) >> 4), true);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      if (tid < kKeys) slot_s[st * kKeys + tid] = next_slot;
    }
    cp_async_wait<0>();  // only an empty group (or an unused q tile) remains

#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 1);
      l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 2);
      if (t4 == 0) red_l[wg * kRows + warp * 16 + g + 8 * h] = l_row[h];
    }
    const bool poisoned = __syncthreads_or(bad_slot || b.bad) != 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + g + 8 * h;
      const int64_t r = r0 + row;
      if (r >= total_rows) continue;
      const float l_all = red_l[row] + red_l[kRows + row];
      const int64_t at = (b.q_begin + r / heads) * heads + r % heads;
      if (a.part_n != nullptr && split == 0 && wg == 0 && t4 == 0) a.part_n[at] = keys.splits;
      if (keys.splits == 1) {
        const float inv = poisoned ? quiet_nan() : (l_all > 0.0f ? 1.0f / l_all : 0.0f);
        O* dst = static_cast<O*>(a.o) + at * kMlaMmaLatent + wg * 256 + 2 * t4;
#pragma unroll
        for (int j = 0; j < 32; ++j) mla_store_pair(dst + j * 8, o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      } else {
        const int64_t part = split * rows_all + at;
        float* dst = a.part_o + part * kMlaMmaLatent + wg * 256 + 2 * t4;
        const float f = poisoned ? quiet_nan() : 1.0f;
#pragma unroll
        for (int j = 0; j < 32; ++j) mla_store_pair(dst + j * 8, o[4 * j + 2 * h] * f, o[4 * j + 2 * h + 1] * f);
        if (wg == 0 && t4 == 0) {
          a.part_ml[part * 2] = m_row[h];
          a.part_ml[part * 2 + 1] = poisoned ? quiet_nan() : l_all;
        }
      }
    }
    __syncthreads();  // the tiles, slots and sums are rewritten by the next pass
  }
}

template <typename O>
cudaError_t launch(const MlaArgs& a, dim3 grid, cudaStream_t stream) {
  static const cudaError_t configured =
      cudaFuncSetAttribute(mla_wgmma_kernel<O>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (configured != cudaSuccess) return configured;
  mla_wgmma_kernel<O><<<grid, kThreads, kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_mla_wgmma(const MlaArgs& a, dim3 grid, bool f32_out, cudaStream_t stream) {
  if (!wgmma_available()) return cudaErrorInvalidDeviceFunction;
  return f32_out ? launch<float>(a, grid, stream) : launch<bf16>(a, grid, stream);
}

}  // namespace basalt::cuda_kernels
