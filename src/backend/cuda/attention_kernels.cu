#include "backend/cuda/attention_kernels.h"

#include "backend/cuda/attention_core.cuh"
#include "backend/cuda/element_types.cuh"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/mma.cuh"

#include <cmath>
#include <climits>
#include <cstdint>

namespace basalt::cuda_kernels {
namespace {

// ---------------------------------------------------------------------------
// store_kv: one block per token; a slot outside [0, num_slots) (a negative
// padding slot in particular) writes nothing.

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

template <typename F>
void with_type(Elem code, F&& f) {
  if (code == Elem::kF32) f(float{});
  else f(bf16{});
}

// ===========================================================================
// Decode path (split-KV, "flash-decoding"), CUDA cores, f32 arithmetic.
//
// Grid (splits * row_splits, num_kv_heads, num_seqs), 128 threads. A block
// serves query rows of its sequence with every query head of its kv head's
// GQA group together ("rows" r = query i * group + head h, RT rows per pass),
// so each key and value row is read from memory once per pass. A decode
// sequence is one pass; when sequences have many rows (prompts over f32
// caches), the passes are dealt round-robin over row_splits blocks (pass p
// to block p % row_splits), row_splits chosen from shapes. The keys the pass's
// rows can see, [lo, hi), are cut into `splits` equal chunks; the block takes
// chunk blockIdx.x, computed on the device from the lengths it reads, so an
// empty chunk (short sequence, padding sequence) just writes neutral partials
// (max -inf, sum 0, output 0).
//
// Inside the block a "lane group" of LPK lanes holds one key row: lane sub
// of the group holds the 16-byte chunks sub, sub + LPK, ... (CPL chunks of
// VEC elements; VEC = 16 bytes / element size for the vector path, 1 for the
// scalar fallback), so a group's loads of a row are contiguous and
// coalesced. Every lane keeps its chunks of the RT query rows (pre-scaled by
// scale * log2 e) in registers; a dot product is a per-lane partial reduced
// with xor shuffles inside the group. Each group keeps its own online
// softmax state (max, sum, output chunk) per row and takes keys
// j = chunk_begin + step * (NW * KG * U) + u * NW * KG + warp * KG + group,
// U keys per step (loads of all U keys issued before any math). The groups
// of a warp are merged by shuffles, the warps through shared memory, in a
// fixed order.
//
// Two variants: kStaged (16-byte vector rows of one chunk per lane, f32 or
// bf16 caches) gathers each step's keys as a tile with cp.async into
// kDecodeStages stages of shared memory, three tiles in flight while one is
// used, the slots loaded a tile ahead, and takes one max and one rescale per
// row for the U = 4 keys of a step; the other (scalar rows, f32 rows over
// 128) loads from global memory directly. bf16 caches with head dims up to
// 128 go to decode_mma_kernel (tensor cores) instead; this kernel serves
// them only when forced (CudaAttentionPath::kDecodeCudaCores). On the H200
// the staged variant reads ~1.5 TB/s at batch 256 x 4096 keys (it is bound
// by instruction issue: ~100 instructions per key and warp), the
// tensor-core kernel ~2.45 TB/s.
//
// splits == 1 writes the normalised output directly; otherwise the block
// writes (output, max, sum) partials and decode_combine_kernel merges them.

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeUnroll = 2;
// The staged variant (cp.async into shared memory, kDecodeStages tiles in
// flight) takes kDecodeStagedUnroll keys per lane group and tile.
constexpr int kDecodeStagedUnroll = 4;
constexpr int kDecodeStages = 4;

// f[0 .. VEC) = the VEC elements at p, as f32 (p is 16-byte aligned when VEC > 1).
template <typename T, int VEC>
__device__ __forceinline__ void load_chunk(const T* p, float* f) {
  if constexpr (VEC == 1) {
    f[0] = to_f32(p[0]);
  } else if constexpr (sizeof(T) == 4) {
    static_assert(VEC == 4);
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
  } else {
    static_assert(VEC == 8 && sizeof(T) == 2);
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // bf16 -> f32 is a 16-bit shift; the lower half is the lower index.
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}

// The same 16-byte chunk from shared memory (staged decode).
template <typename T, int VEC>
__device__ __forceinline__ void load_chunk_smem(const T* p, float* f) {
  if constexpr (sizeof(T) == 4) {
    static_assert(VEC == 4);
    const float4 v = *reinterpret_cast<const float4*>(p);
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
  } else {
    static_assert(VEC == 8 && sizeof(T) == 2);
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}

template <int LPK, int CPL, int VEC, typename Cache>
constexpr size_t decode_staged_smem_bytes() {
  constexpr int keys = kDecodeWarps * (32 / LPK) * kDecodeStagedUnroll;
  return size_t{2} * kDecodeStages * keys * LPK * CPL * VEC * sizeof(Cache);
}

// The decode kernels' end of a pass: merges the NW warps' (max, sum,
// unnormalised output) of the pass's rows r0 .. r0 + RT - 1 (those below
// total_rows) and writes them: the normalised output when splits is 1, the
// split's partials otherwise. red_o(w, i, d) is warp w's output of row i,
// feature d. A poisoned pass (bad slot or layout) writes NaN.
template <int NW, int RT, typename RedO>
__device__ __forceinline__ void write_pass_rows(const AttentionArgs& a, const SeqBounds& b, int64_t r0,
                                                int64_t total_rows, int kv_head, int split, bool poisoned,
                                                const float (&red_m)[NW][RT], const float (&red_l)[NW][RT],
                                                RedO red_o) {
  const int group = a.group, Dv = a.v_head_dim;
  const int pass_rows = static_cast<int>(min(int64_t{RT}, total_rows - r0));
  for (int idx = threadIdx.x; idx < pass_rows * Dv; idx += kDecodeThreads) {
    const int i = idx / Dv, d = idx % Dv;
    const int64_t r = r0 + i;
    const int64_t token = b.q_begin + r / group;
    const int head = kv_head * group + static_cast<int>(r % group);
    if (token < 0 || token >= a.q_tokens) continue;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; ++w) m_all = fmaxf(m_all, red_m[w][i]);
    float l_all = 0.0f, o_all = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float f = red_m[w][i] == -INFINITY ? 0.0f : exp2f(red_m[w][i] - m_all);
      l_all += red_l[w][i] * f;
      o_all += red_o(w, i, d) * f;
    }
    const int64_t at = token * a.num_heads + head;
    if (a.splits == 1) {
      store_out(a, at * Dv + d, poisoned ? quiet_nan() : (l_all > 0.0f ? o_all / l_all : 0.0f));
    } else {
      const int64_t part = split * a.q_tokens * a.num_heads + at;
      a.part_o[part * Dv + d] = poisoned ? quiet_nan() : o_all;
      if (d == 0) {
        a.part_ml[part * 2] = m_all;
        a.part_ml[part * 2 + 1] = poisoned ? quiet_nan() : l_all;
      }
    }
  }
}

template <typename Cache, int VEC, int LPK, int CPL, int RT, bool kStaged>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(AttentionArgs a) {
  constexpr int NW = kDecodeWarps, KG = 32 / LPK, EPL = CPL * VEC;
  constexpr int U = kStaged ? kDecodeStagedUnroll : kDecodeUnroll;
  constexpr int kWidth = LPK * EPL;  // >= max(head_dim, v_head_dim)
  constexpr int kKeysPerStep = NW * KG * U;
  constexpr float kNegInf = -INFINITY;
  static_assert(kWidth <= kAttentionMaxHeadDim && 32 % LPK == 0);
  static_assert(!kStaged || (CPL == 1 && VEC * sizeof(Cache) == 16));
  __shared__ float red_m[NW][RT], red_l[NW][RT];
  __shared__ float red_o[NW][RT][kWidth];
  __shared__ bool key_ok_s[kStaged ? kDecodeStages : 1][kKeysPerStep];  // staged: slot of the tile's key valid
  extern __shared__ __align__(16) unsigned char decode_smem[];  // staged: [2][kDecodeStages][keys][kWidth] Cache

  const int split = blockIdx.x % a.splits, row_split = blockIdx.x / a.splits;
  const int seq = blockIdx.z, kv_head = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, grp = lane / LPK, sub = lane % LPK;
  const SeqBounds b = seq_bounds(a, seq);
  if (b.q_len > a.decode_max_q) return;  // the prefill kernel's (uniform over the block)
  const int group = a.group, D = a.head_dim, Dv = a.v_head_dim;
  const int64_t total_rows = b.q_len * group;
  const Cache* k_cache = static_cast<const Cache*>(a.k_cache);
  const Cache* v_cache = static_cast<const Cache*>(a.v_cache);
  const int32_t* slots = a.kv_slots + (b.bad ? 0 : b.kv_begin);

  for (int64_t r0 = int64_t{row_split} * RT; r0 < total_rows; r0 += int64_t{RT} * a.row_splits) {  // uniform
    // This pass's rows: query i = r / group (position kv_len - q_len + i),
    // head kv_head * group + r % group.
    const int64_t pos_first = b.kv_len - b.q_len + r0 / group;
    const int64_t pos_last = b.kv_len - b.q_len + min(r0 + RT - 1, total_rows - 1) / group;
    const int64_t lo = a.sliding_window > 0 && !a.keys_from_zero
                           ? max(int64_t{0}, pos_first - a.sliding_window + 1)
                           : int64_t{0};
    const int64_t hi = b.bad ? 0 : pos_last + 1;  // keys [lo, hi); pos_last < kv_len
    const int64_t span = hi > lo ? hi - lo : 0;
    const int64_t per_split = (span + a.splits - 1) / a.splits;
    const int64_t c0 = lo + split * per_split, c1 = min(hi, c0 + per_split);

    float q[RT][EPL];
    int64_t pos[RT];
#pragma unroll
    for (int i = 0; i < RT; ++i) {
      const int64_t r = r0 + i;
      const bool row_ok = r < total_rows && !b.bad;  // a bad layout may name rows past q
      pos[i] = row_ok ? b.kv_len - b.q_len + r / group : int64_t{-1};
      const int64_t q_off = row_ok ? ((b.q_begin + r / group) * a.num_heads + kv_head * group + r % group) * D : 0;
#pragma unroll
      for (int c = 0; c < CPL; ++c)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int d = (c * LPK + sub) * VEC + e;
          q[i][c * VEC + e] = row_ok && d < D ? load_q(a, q_off + d) * a.scale_log2 : 0.0f;
        }
    }

    float m[RT], l[RT], acc[RT][EPL];
#pragma unroll
    for (int i = 0; i < RT; ++i) {
      m[i] = kNegInf;
      l[i] = 0.0f;
#pragma unroll
      for (int e = 0; e < EPL; ++e) acc[i][e] = 0.0f;
    }
    bool bad_slot = false;

    if constexpr (kStaged) {
      // Tile t = keys c0 + t * kKeysPerStep .. (the non-staged step's keys),
      // in stage t % kDecodeStages; each thread copies chunk tid % CH of
      // rows tid / CH + p * kRowsPer, p < kPer, of K and V. The slots of the
      // next tile to copy are loaded one tile ahead (pre), so their latency
      // hides under the math.
      constexpr int NS = kDecodeStages, CH = kWidth / VEC;
      constexpr int kRowsPer = kDecodeThreads / CH;
      constexpr int kPer = kKeysPerStep / kRowsPer;
      static_assert(kDecodeThreads % CH == 0 && kKeysPerStep % kRowsPer == 0);
      Cache* stage_k = reinterpret_cast<Cache*>(decode_smem);
      Cache* stage_v = stage_k + NS * kKeysPerStep * kWidth;
      const int my_row = tid / CH, my_d = (tid % CH) * VEC;
      const int64_t tiles = c1 > c0 ? (c1 - c0 + kKeysPerStep - 1) / kKeysPerStep : 0;
      int32_t pre[kPer];
      const auto fetch_slots = [&](int64_t t) {
#pragma unroll
        for (int p = 0; p < kPer; ++p) {
          const int64_t j = c0 + t * kKeysPerStep + my_row + p * kRowsPer;
          pre[p] = t < tiles && j < c1 ? slots[j] : -1;
        }
      };
      const auto issue = [&](int64_t t) {
        if (t >= tiles) return;  // uniform
        const int st = static_cast<int>(t % NS);
#pragma unroll
        for (int p = 0; p < kPer; ++p) {
          const int row = my_row + p * kRowsPer;
          const int64_t j = c0 + t * kKeysPerStep + row;
          const int64_t slot = pre[p];
          const bool in_range = slot >= 0 && slot < a.num_slots;
          bad_slot |= j < c1 && !in_range;
          const bool ok = j < c1 && in_range;
          if (my_d == 0) key_ok_s[st][row] = ok;
          if (ok && my_d < D)
            cp_async_16(stage_k + (st * kKeysPerStep + row) * kWidth + my_d,
                        k_cache + (slot * a.num_kv_heads + kv_head) * D + my_d);
          if (ok && my_d < Dv)
            cp_async_16(stage_v + (st * kKeysPerStep + row) * kWidth + my_d,
                        v_cache + (slot * a.num_kv_heads + kv_head) * Dv + my_d);
        }
      };
      fetch_slots(0);
#pragma unroll
      for (int t = 0; t < NS - 1; ++t) {
        issue(t);
        cp_async_commit();
        fetch_slots(t + 1);
      }
      for (int64_t t = 0; t < tiles; ++t) {  // uniform
        issue(t + NS - 1);
        cp_async_commit();
        fetch_slots(t + NS);
        cp_async_wait<NS - 1>();  // tile t has landed (this thread's copies) ...
        __syncthreads();          // ... and everyone's, and key_ok_s
        const int st = static_cast<int>(t % NS);
        const Cache* ks = stage_k + st * kKeysPerStep * kWidth;
        const Cache* vs = stage_v + st * kKeysPerStep * kWidth;
        float s[RT][U];
        bool ok[U];
        const int d = sub * VEC;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int kl = u * NW * KG + warp * KG + grp;
          const int64_t j = c0 + t * kKeysPerStep + kl;
          ok[u] = key_ok_s[st][kl];
          float kf[VEC];
          if (ok[u] && d < D) {
            load_chunk_smem<Cache, VEC>(ks + kl * kWidth + d, kf);
          } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) kf[e] = 0.0f;
          }
#pragma unroll
          for (int i = 0; i < RT; ++i) {
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; ++e) dot = fmaf(q[i][e], kf[e], dot);
#pragma unroll
            for (int o = LPK / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            const bool visible =
                ok[u] && j <= pos[i] && (a.sliding_window <= 0 || pos[i] - j < a.sliding_window);
            s[i][u] = visible ? dot : kNegInf;
          }
        }
        // One max and one rescale per row for the U keys; s becomes p.
#pragma unroll
        for (int i = 0; i < RT; ++i) {
          float step_max = m[i];
#pragma unroll
          for (int u = 0; u < U; ++u) step_max = fmaxf(step_max, s[i][u]);
          if (step_max == kNegInf) {
#pragma unroll
            for (int u = 0; u < U; ++u) s[i][u] = 0.0f;
            continue;  // nothing visible yet: state unchanged
          }
          const float correction = exp2f(m[i] - step_max);  // m = -inf gives 0
          m[i] = step_max;
          l[i] *= correction;
#pragma unroll
          for (int e = 0; e < EPL; ++e) acc[i][e] *= correction;
#pragma unroll
          for (int u = 0; u < U; ++u) {
            s[i][u] = exp2f(s[i][u] - step_max);  // -inf gives 0
            l[i] += s[i][u];
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int kl = u * NW * KG + warp * KG + grp;
          float vf[VEC];
          if (ok[u] && d < Dv) {
            load_chunk_smem<Cache, VEC>(vs + kl * kWidth + d, vf);
          } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) vf[e] = 0.0f;
          }
#pragma unroll
          for (int i = 0; i < RT; ++i)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[i][e] = fmaf(s[i][u], vf[e], acc[i][e]);
        }
        __syncthreads();  // this stage is refilled by a later iteration's copies
      }
      cp_async_wait<0>();  // only empty groups remain; keeps the next pass clean
    } else {
    for (int64_t j0 = c0; j0 < c1; j0 += kKeysPerStep) {  // uniform
      int64_t j[U];
      bool key_ok[U];
      float kf[U][EPL], vf[U][EPL];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        j[u] = j0 + u * NW * KG + warp * KG + grp;
        const int64_t slot = j[u] < c1 ? slots[j[u]] : int64_t{-1};
        const bool in_range = slot >= 0 && slot < a.num_slots;
        bad_slot |= j[u] < c1 && !in_range;
        key_ok[u] = j[u] < c1 && in_range;
        const Cache* k_row = k_cache + (slot * a.num_kv_heads + kv_head) * D;
        const Cache* v_row = v_cache + (slot * a.num_kv_heads + kv_head) * Dv;
#pragma unroll
        for (int c = 0; c < CPL; ++c) {
          const int d = (c * LPK + sub) * VEC;  // VEC divides D and Dv on the vector path
          if (key_ok[u] && d < D) {
            load_chunk<Cache, VEC>(k_row + d, &kf[u][c * VEC]);
          } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) kf[u][c * VEC + e] = 0.0f;
          }
          if (key_ok[u] && d < Dv) {
            load_chunk<Cache, VEC>(v_row + d, &vf[u][c * VEC]);
          } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) vf[u][c * VEC + e] = 0.0f;
          }
        }
      }
#pragma unroll
      for (int i = 0; i < RT; ++i) {
        float s[U];
        float step_max = m[i];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < EPL; ++e) dot = fmaf(q[i][e], kf[u][e], dot);
#pragma unroll
          for (int o = LPK / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
          const bool visible = key_ok[u] && j[u] <= pos[i] &&
                               (a.sliding_window <= 0 || pos[i] - j[u] < a.sliding_window);
          s[u] = visible ? dot : kNegInf;
          step_max = fmaxf(step_max, s[u]);
        }
        if (step_max == kNegInf) continue;  // nothing visible yet: state unchanged
        const float correction = exp2f(m[i] - step_max);  // m = -inf gives 0
        m[i] = step_max;
        l[i] *= correction;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[i][e] *= correction;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const float p = exp2f(s[u] - step_max);  // -inf gives 0
          l[i] += p;
#pragma unroll
          for (int e = 0; e < EPL; ++e) acc[i][e] = fmaf(p, vf[u][e], acc[i][e]);
        }
      }
    }
    }  // kStaged

    // Merge the KG lane groups of the warp (xor partners hold the same chunks).
#pragma unroll
    for (int o = LPK; o < 32; o *= 2) {
#pragma unroll
      for (int i = 0; i < RT; ++i) {
        const float m_other = __shfl_xor_sync(0xffffffffu, m[i], o);
        const float l_other = __shfl_xor_sync(0xffffffffu, l[i], o);
        const float m_new = fmaxf(m[i], m_other);
        const float f_self = m[i] == kNegInf ? 0.0f : exp2f(m[i] - m_new);
        const float f_other = m_other == kNegInf ? 0.0f : exp2f(m_other - m_new);
        l[i] = l[i] * f_self + l_other * f_other;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          const float acc_other = __shfl_xor_sync(0xffffffffu, acc[i][e], o);
          acc[i][e] = acc[i][e] * f_self + acc_other * f_other;
        }
        m[i] = m_new;
      }
    }
    if (lane < LPK) {
#pragma unroll
      for (int i = 0; i < RT; ++i) {
#pragma unroll
        for (int c = 0; c < CPL; ++c)
#pragma unroll
          for (int e = 0; e < VEC; ++e) red_o[warp][i][(c * LPK + sub) * VEC + e] = acc[i][c * VEC + e];
        if (lane == 0) {
          red_m[warp][i] = m[i];
          red_l[warp][i] = l[i];
        }
      }
    }
    const bool poisoned = __syncthreads_or(bad_slot || b.bad) != 0;

    write_pass_rows<NW, RT>(a, b, r0, total_rows, kv_head, split, poisoned, red_m, red_l,
                            [&](int w, int i, int d) { return red_o[w][i][d]; });
    __syncthreads();  // red_* are rewritten by the next pass
  }
}

// Merges the splits' partials of one query row and head: grid (q_tokens,
// num_heads), kCombineThreads threads, a programmatic dependent of the decode
// kernel. Warp 0 turns the splits' (max, sum) pairs into weights; then each
// thread sums the splits' partial outputs of its features, the loads of eight
// splits issued together (the partials are in L2: a loop of dependent loads
// would wait out one latency per split). A row that no sequence covers is NaN.
constexpr int kCombineThreads = 128;

__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(AttentionArgs a) {
  __shared__ float weight[kAttentionMaxSplits];
  const int64_t row = blockIdx.x;
  const int head = static_cast<int>(blockIdx.y);
  const int tid = threadIdx.x;
  const int S = a.splits, Dv = a.v_head_dim;
  // The row's sequence: the last s with q_start[s] <= row (the layout went up
  // before the step's first kernel, so it is read before the wait).
  int lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.q_start[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  const bool covered = a.q_start[lo] <= row && row < a.q_start[lo + 1];
  if (covered && int64_t{a.q_start[lo + 1]} - a.q_start[lo] > a.decode_max_q) return;  // written by prefill
  wait_for_producer();  // the partials are the decode kernel's
  let_consumer_start();
  const int64_t at = row * a.num_heads + head;
  const int64_t split_stride = a.q_tokens * a.num_heads;  // rows of one split's partials
  if (tid < 32) {
    const int lane = tid;
    float m_all = -INFINITY;
    for (int s = lane; s < S; s += 32) m_all = fmaxf(m_all, a.part_ml[(s * split_stride + at) * 2]);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) m_all = fmaxf(m_all, __shfl_xor_sync(0xffffffffu, m_all, o));
    float l_all = 0.0f;
    for (int s = lane; s < S; s += 32) {
      const float* ml = a.part_ml + (s * split_stride + at) * 2;
      const float f = ml[0] == -INFINITY ? 0.0f : exp2f(ml[0] - m_all);
      weight[s] = f;
      l_all += ml[1] * f;  // a NaN sum (bad slot) poisons the row
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) l_all += __shfl_xor_sync(0xffffffffu, l_all, o);
    // No visible key at all (a query at a negative position): zeros.
    const float inv = !covered ? quiet_nan() : (l_all > 0.0f ? 1.0f / l_all : (l_all == 0.0f ? 0.0f : quiet_nan()));
    for (int s = lane; s < S; s += 32) weight[s] *= inv;
  }
  __syncthreads();
  const float* part = a.part_o + at * Dv;
  const int64_t part_stride = split_stride * Dv;
  for (int d = tid; d < Dv; d += kCombineThreads) {
    float o = 0.0f;
    int s = 0;
    for (; s + 8 <= S; s += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = part[(s + u) * part_stride + d];
#pragma unroll
      for (int u = 0; u < 8; ++u) o = fmaf(weight[s + u], v[u], o);
    }
    for (; s < S; ++s) o = fmaf(weight[s], part[s * part_stride + d], o);
    // weight 0 times a NaN partial (bad slot in a chunk) must still poison.
    if (!covered) o = quiet_nan();
    store_out(a, at * Dv + d, o);
  }
}

// ===========================================================================
// Prefill path: tensor-core flash attention (mma.sync m16n8k16, bf16
// operands, f32 accumulation), FlashAttention-2 style.
//
// Grid (tiles, num_heads), 128 threads (4 warps). A block computes BM = 64
// query rows of one sequence for one query head; warp w owns rows
// 16w .. 16w + 15. blockIdx.x numbers the (sequence, query tile) pairs of
// the sequences this kernel serves (q_len > decode_max_q): plan_kernel has
// written their prefix on the device and each block binary-searches it (the
// grid, attention_prefill_tiles(), bounds the count from shapes; surplus
// blocks exit at once). Tiles of a sequence are taken last-first, so the
// longest causal rows start first.
//
// Shared memory: the Q tile [BM][LD] bf16, and PrefillTile::kStages stages
// of K and V tiles [BN][LD] bf16 (LD = DMAX + 8: a 16-byte pad makes the 8
// row addresses of every ldmatrix phase hit distinct banks). K/V rows are
// gathered by slot: with a bf16 cache and 16-byte aligned rows by cp.async
// (16 bytes per instruction, kStages - 1 tiles in flight while one is used,
// their slots loaded a tile ahead);
// otherwise (f32 cache, odd dims) by plain loads converted to bf16. Rows of
// keys outside the tile's range, and columns past the head dims, are zeroed
// (a zero value row keeps 0 * garbage out of the sum).
//
// Per key tile: S = Q Kᵀ (log2 domain after scaling), masked (causal,
// window, range), online softmax in registers, then O += P V with P rounded
// to bf16. q is rounded to bf16 too: on this path queries, keys, values and
// probabilities are bf16 (the relative error is ~1e-2 / sqrt of the terms
// summed; tests allow 2e-2), scores, softmax and sums are f32.
//
// PTX ISA fragment layouts relied on (mma.m16n8k16 .bf16, "g" = lane / 4,
// "t" = lane % 4; each .b32 register holds two bf16, the lower-indexed one
// in the low half):
//   A (16 x 16, row):  a0 = A[g][2t, 2t+1]     a1 = A[g+8][2t, 2t+1]
//                      a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, col):   b0 = B[2t, 2t+1][g]     b1 = B[2t+8, 2t+9][g]
//   C/D (16 x 8, f32): c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
//   ldmatrix .x4: lane L gives the address of row L % 8 of matrix L / 8;
//   register i receives matrix i's elements [L / 4][2 (L % 4), +1], or with
//   .trans the elements [2 (L % 4), +1][L / 4] (one per half).
// So for S = Q Kᵀ, B[k = d][n = key] = K[key][d]: K's smem rows (key-major)
// are B's columns and plain ldmatrix gives b0/b1. For O = P V, B[k = key][n
// = d] = V[key][d] is row-major in smem, so ldmatrix .trans gives b0/b1. The
// C fragments of S for key tiles 2k and 2k + 1 are exactly P's A fragment
// for the k-th 16-key step (the FA2 register reuse).

// The online softmax's step shared by the mma.sync kernels, for a lane's
// two rows (h = 0, 1) of the m16n8 accumulator layout: the tile's row maxima
// over the quad of lanes holding a row, the new running maxima, and the
// factor by which the running sums (here) and O (scale_rows) are rescaled.
// kFast: ex2.approx.ftz instead of exp2f.
template <bool kFast>
__device__ __forceinline__ void advance_row_max(float (&tile_max)[2], float (&m_row)[2], float (&l_row)[2],
                                                float (&correction)[2]) {
  constexpr float kNegInf = -INFINITY;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    const float m_new = fmaxf(m_row[h], tile_max[h]);
    const float moved = m_row[h] - m_new;  // m_row = -inf gives a factor of 0
    correction[h] = m_new == kNegInf ? 1.0f : kFast ? fast_exp2(moved) : exp2f(moved);
    m_row[h] = m_new;
    l_row[h] *= correction[h];
  }
}

// O's accumulators (N n8 tiles) times each row's factor.
template <int N>
__device__ __forceinline__ void scale_rows(float (&o)[N][4], const float (&correction)[2]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    o[n][0] *= correction[0];
    o[n][1] *= correction[0];
    o[n][2] *= correction[1];
    o[n][3] *= correction[1];
  }
}

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;
constexpr int kPrefillBM = 16 * kPrefillWarps;

template <int DMAX>
struct PrefillTile {
  // Key tiles of BN keys in kStages stages (kStages - 1 tiles in flight
  // while one is used); two 128-thread blocks fit on an SM.
  static constexpr int BN = DMAX == 256 ? 16 : DMAX == 128 ? 32 : 64;
  static constexpr int kStages = 4;
  static constexpr int LD = DMAX + 8;
  static constexpr size_t kSmemBytes = sizeof(bf16) * static_cast<size_t>(LD) * (kPrefillBM + 2 * kStages * BN);
};

// kAsync: bf16 cache, head dims multiples of 8 and 16-byte aligned bases.
template <int DMAX, typename Cache, bool kAsync>
__global__ void __launch_bounds__(kPrefillThreads) prefill_kernel(AttentionArgs a) {
  using Tile = PrefillTile<DMAX>;
  constexpr int BM = kPrefillBM, BN = Tile::BN, LD = Tile::LD;
  constexpr float kNegInf = -INFINITY;
  static_assert(!kAsync || sizeof(Cache) == 2);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* q_s = reinterpret_cast<bf16*>(smem_raw);  // [BM][LD]
  constexpr int NS = Tile::kStages;
  bf16* k_s = q_s + BM * LD;                       // [NS][BN][LD]
  bf16* v_s = k_s + NS * BN * LD;                  // [NS][BN][LD]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head = blockIdx.y, kv_head = head / a.group;
  const int D = a.head_dim, Dv = a.v_head_dim;

  // Tile blockIdx.x of the plan (attention_core.cuh).
  PrefillTileRows tile;
  if (!find_prefill_tile(a, blockIdx.x, BM, tile)) return;  // a surplus block (uniform)
  const SeqBounds& b = tile.b;
  const int64_t q0 = tile.q0, pos0 = tile.pos0;  // pos0: the position of local row 0
  const int rows_here = tile.rows;
  if (b.bad) return poison_prefill_tile(a, tile, head, tid, kPrefillThreads);

  const int kd = (D + 15) / 16 * 16;    // key width padded to the mma k-step
  const int kdv = (Dv + 15) / 16 * 16;  // value width padded to two n-tiles
  const int64_t lo = a.sliding_window > 0 ? max(int64_t{0}, pos0 - a.sliding_window + 1) : int64_t{0};
  const int64_t hi = min(b.kv_len, pos0 + rows_here);  // keys [lo, hi)
  const int num_tiles = hi > lo ? static_cast<int>((hi - lo + BN - 1) / BN) : 0;

  // The Q tile, as bf16 (rows past the sequence and columns past D are 0),
  // kQBatch loads per thread issued before their stores (a loop of
  // load-store pairs would wait out one memory latency per element).
  constexpr int kQBatch = 16;
  static_assert(BM * DMAX % (kQBatch * kPrefillThreads) == 0);
  for (int base = 0; base < BM * DMAX; base += kQBatch * kPrefillThreads) {
    float qv[kQBatch];
#pragma unroll
    for (int k = 0; k < kQBatch; ++k) {
      const int idx = base + tid + k * kPrefillThreads, r = idx / DMAX, d = idx % DMAX;
      qv[k] = r < rows_here && d < D ? load_q(a, ((b.q_begin + q0 + r) * a.num_heads + head) * D + d) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kQBatch; ++k) {
      const int idx = base + tid + k * kPrefillThreads;
      q_s[(idx / DMAX) * LD + idx % DMAX] = __float2bfloat16_rn(qv[k]);
    }
  }

  const Cache* k_cache = static_cast<const Cache*>(a.k_cache);
  const Cache* v_cache = static_cast<const Cache*>(a.v_cache);
  const int32_t* slots = a.kv_slots + b.kv_begin;
  bool bad_slot = false;
  // kAsync: each thread copies 16-byte chunk tid % CHM of rows tid / CHM +
  // p * kRowsPer (p < kPer) of the K and V tiles; the slots of the next tile
  // to gather are loaded a tile ahead into pre, so their latency hides under
  // the current tile's math.
  constexpr int CHM = DMAX / 8;
  constexpr int kRowsPer = kPrefillThreads / CHM;
  constexpr int kPer = BN / kRowsPer;
  static_assert(kPrefillThreads % CHM == 0 && BN % kRowsPer == 0);
  const int my_row = tid / CHM, my_c = tid % CHM;
  int32_t pre[kPer];
  const auto fetch_slots = [&](int t) {
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      const int64_t j = lo + int64_t{t} * BN + my_row + p * kRowsPer;
      pre[p] = t < num_tiles && j < hi ? slots[j] : -1;
    }
  };
  // Gathers key tile `t` (keys lo + t * BN ...) into stage `stage`.
  const auto load_tile = [&](int t, int stage) {
    bf16* ks = k_s + stage * BN * LD;
    bf16* vs = v_s + stage * BN * LD;
    const int64_t kt = lo + int64_t{t} * BN;
    if constexpr (kAsync) {
#pragma unroll
      for (int p = 0; p < kPer; ++p) {
        const int row = my_row + p * kRowsPer;
        const int64_t j = kt + row;
        int64_t slot = pre[p];
        if (j < hi && (slot < 0 || slot >= a.num_slots)) bad_slot = true;
        if (j >= hi || slot < 0 || slot >= a.num_slots) slot = -1;
        const int d = my_c * 8;
        if (d < kd) {
          bf16* dst = ks + row * LD + d;
          if (slot >= 0 && d < D) cp_async_16(dst, k_cache + (slot * a.num_kv_heads + kv_head) * D + d);
          else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
        }
        if (d < kdv) {
          bf16* dst = vs + row * LD + d;
          if (slot >= 0 && d < Dv) cp_async_16(dst, v_cache + (slot * a.num_kv_heads + kv_head) * Dv + d);
          else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
        }
      }
    } else {
      for (int idx = tid; idx < BN * (kd + kdv); idx += kPrefillThreads) {
        const bool is_k = idx < BN * kd;
        const int rel = is_k ? idx : idx - BN * kd;
        const int row = rel / (is_k ? kd : kdv), d = rel % (is_k ? kd : kdv);
        const int64_t j = kt + row;
        const int width = is_k ? D : Dv;
        float v = 0.0f;
        if (j < hi && d < width) {
          const int64_t slot = slots[j];
          if (slot < 0 || slot >= a.num_slots) bad_slot = true;
          else v = to_f32((is_k ? k_cache : v_cache)[(slot * a.num_kv_heads + kv_head) * width + d]);
        }
        (is_k ? ks : vs)[row * LD + d] = __float2bfloat16_rn(v);
      }
    }
  };

  float o[DMAX / 8][4];
#pragma unroll
  for (int n = 0; n < DMAX / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_row[2] = {kNegInf, kNegInf}, l_row[2] = {0.0f, 0.0f};  // rows g, g + 8 (l: this lane's part)
  const int g = lane / 4, t4 = lane % 4;
  const int row_a = warp * 16 + g;  // local rows row_a, row_a + 8

  if constexpr (kAsync) fetch_slots(0);
#pragma unroll
  for (int t = 0; t < NS - 1; ++t) {
    if (t < num_tiles) load_tile(t, t);
    cp_async_commit();
    if constexpr (kAsync) fetch_slots(t + 1);
  }
  for (int t = 0; t < num_tiles; ++t) {  // uniform
    if (t + NS - 1 < num_tiles) load_tile(t + NS - 1, (t + NS - 1) % NS);
    cp_async_commit();
    if constexpr (kAsync) fetch_slots(t + NS);
    cp_async_wait<NS - 1>();  // tile t has landed (this thread's copies) ...
    __syncthreads();          // ... and everyone's, and the Q tile and zero fills
    const bf16* ks = k_s + (t % NS) * BN * LD;
    const bf16* vs = v_s + (t % NS) * BN * LD;
    const int64_t kt = lo + int64_t{t} * BN;
    // This warp's rows sit at positions wp0 .. wp0 + 15. A tile none of
    // whose keys they see leaves their state unchanged: skip its math. A
    // tile all of whose keys they see needs no mask.
    const int64_t wp0 = pos0 + warp * 16;
    const bool warp_active =
        kt <= wp0 + 15 && (a.sliding_window <= 0 || wp0 - (kt + BN - 1) < a.sliding_window);
    const bool unmasked =
        kt + BN <= hi && kt + BN - 1 <= wp0 && (a.sliding_window <= 0 || wp0 + 15 - kt < a.sliding_window);
    if (warp_active) {
    float s[BN / 8][4];
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < DMAX / 16; ++k) {
      if (k * 16 < kd) {
        uint32_t qa[4];
        // Matrices: rows 0-7 / 8-15 of the warp's 16, columns k0 / k0 + 8.
        ldmatrix_x4(qa, q_s + (warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + k * 16 + (lane / 16) * 8);
#pragma unroll
        for (int n = 0; n < BN / 16; ++n) {
          uint32_t kb[4];
          // Matrices: keys n0..n0+7 at d k0, k0 + 8; keys n0+8.. at d k0, k0 + 8.
          ldmatrix_x4(kb, ks + (n * 16 + (lane % 8) + (lane / 16) * 8) * LD + k * 16 + ((lane / 8) % 2) * 8);
          mma_bf16(s[2 * n], qa, kb[0], kb[1]);
          mma_bf16(s[2 * n + 1], qa, kb[2], kb[3]);
        }
      }
    }

    // Scale, mask, and the online softmax of rows row_a (h = 0), row_a + 8 (h = 1).
    float tile_max[2] = {kNegInf, kNegInf};
    if (unmasked) {
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] *= a.scale_log2;
          tile_max[e / 2] = fmaxf(tile_max[e / 2], s[n][e]);
        }
    } else
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, r = row_a + 8 * h;
        const int64_t j = kt + n * 8 + 2 * t4 + (e & 1);
        const int64_t p = pos0 + r;
        const bool visible =
            r < rows_here && j < hi && j <= p && (a.sliding_window <= 0 || p - j < a.sliding_window);
        s[n][e] = visible ? s[n][e] * a.scale_log2 : kNegInf;
        tile_max[h] = fmaxf(tile_max[h], s[n][e]);
      }
    float correction[2];
    advance_row_max<false>(tile_max, m_row, l_row, correction);
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const float p = m_row[h] == kNegInf ? 0.0f : exp2f(s[n][e] - m_row[h]);
        s[n][e] = p;
        l_row[h] += p;
      }
    scale_rows(o, correction);

    // O += P V, 16 keys per step.
#pragma unroll
    for (int k = 0; k < BN / 16; ++k) {
      const uint32_t pa[4] = {pack_bf16(s[2 * k][0], s[2 * k][1]), pack_bf16(s[2 * k][2], s[2 * k][3]),
                              pack_bf16(s[2 * k + 1][0], s[2 * k + 1][1]),
                              pack_bf16(s[2 * k + 1][2], s[2 * k + 1][3])};
#pragma unroll
      for (int n = 0; n < DMAX / 16; ++n) {
        if (n * 16 < kdv) {
          uint32_t vb[4];
          // Matrices (.trans): keys k0..k0+7 / k0+8.. at d n0; the same at d n0 + 8.
          ldmatrix_x4_trans(vb, vs + (k * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + n * 16 + (lane / 16) * 8);
          mma_bf16(o[2 * n], pa, vb[0], vb[1]);
          mma_bf16(o[2 * n + 1], pa, vb[2], vb[3]);
        }
      }
    }
    }  // warp_active
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }
  cp_async_wait<0>();

  const bool poisoned = __syncthreads_or(bad_slot) != 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 1);
    l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_a + 8 * h;
    if (r >= rows_here) continue;
    const int64_t token = b.q_begin + q0 + r;
    const float inv = l_row[h] > 0.0f ? 1.0f / l_row[h] : 0.0f;  // no visible key: zeros
    const int64_t base = (token * a.num_heads + head) * Dv;
#pragma unroll
    for (int n = 0; n < DMAX / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = n * 8 + 2 * t4 + e;
        if (d < Dv) store_out(a, base + d, poisoned ? quiet_nan() : o[n][2 * h + e] * inv);
      }
  }
}

// ===========================================================================
// Decode path on the tensor cores (bf16 caches whose head dims are multiples
// of 8, at most 128 wide): the split-KV decode kernel's grid, sequence
// bounds, key chunks, row passes, merge and outputs, with S = Q Kᵀ and
// O += P V on mma.sync m16n8k16. A pass is 16 rows (the mma's M: query i *
// group + head h, as in decode_kernel; a decode step of a GQA-4 model fills
// 4 of them). Keys come in tiles of 64 (warp w takes keys 16w .. 16w + 15),
// gathered by slot with cp.async into kMmaDecodeStages stages of shared
// memory (the slots a tile ahead, as in the staged decode kernel); the
// fragments, ldmatrix addressing and online softmax are the prefill
// kernel's (see there), each warp keeping its own state for the 16 rows over
// its keys, merged through shared memory at the end of the pass.
//
// Accuracy: K and V are bf16 already. Scores are q . k in f32, scaled by
// scale * log2 e afterwards: a bf16 q is exact in one bf16 operand, an f32 q
// is split into a bf16 high part and a bf16 remainder (QLO: two mma per
// product), so either keeps ~16 mantissa bits; the probabilities are split
// the same way. Errors stay ~1e-5 relative, like the f32 CUDA-core kernel,
// where plain bf16 rounding would give ~1e-3.
//
// Occupancy: the kernel is bound by latency, not by DRAM (Nsight Compute at
// batch 256 x 512 keys: DRAM 56% of peak with two blocks per SM), so with a
// bf16 q (no low part) the stages are two and the registers capped at 168:
// three blocks fit an SM. For the same reason the usual head dims (both equal
// to DMAX) get their own instantiation, kFullDims: with the widths known the
// k-steps are straight-line code and each one's ldmatrix is issued ahead of
// the last one's MMAs (1.14x at batch 64, 1.26x at 256 x 512 keys, H200); the
// gather's instructions matter less (one bulk copy per row measured slower,
// bench/README.md). The scores of a tile sum into two accumulators per
// n-tile (even and odd k-steps), halving the chain of dependent mma; a
// thread copies two chunks of each of its rows, so a row's slot and
// addresses serve both.
constexpr int kMmaDecodeRows = 16;
constexpr int kMmaDecodeBN = 16 * kDecodeWarps;

template <int DMAX, bool QLO>
struct MmaDecodeTile {
  static constexpr int kStages = QLO ? 3 : 2;
  static constexpr int LD = DMAX + 8;  // the prefill kernel's padded row
  static constexpr size_t kStagesBytes = sizeof(bf16) * size_t{2} * kStages * kMmaDecodeBN * LD;
  // q's high part, and its low part for an f32 q.
  static constexpr size_t kSmemBytes = kStagesBytes + sizeof(bf16) * size_t{QLO ? 2 : 1} * kMmaDecodeRows * LD;
  // The warps' merge reuses the stages.
  static_assert(sizeof(float) * kDecodeWarps * kMmaDecodeRows * DMAX <= kStagesBytes);
};

template <int DMAX, bool QLO, bool kFullDims>
__global__ void __launch_bounds__(kDecodeThreads, QLO ? 2 : 3) decode_mma_kernel(AttentionArgs a) {
  using Tile = MmaDecodeTile<DMAX, QLO>;
  constexpr int NW = kDecodeWarps, RT = kMmaDecodeRows, BN = kMmaDecodeBN, NS = Tile::kStages, LD = Tile::LD;
  constexpr float kNegInf = -INFINITY;
  extern __shared__ __align__(128) unsigned char mma_decode_smem[];
  bf16* k_st = reinterpret_cast<bf16*>(mma_decode_smem);  // [NS][BN][LD]
  bf16* v_st = k_st + NS * BN * LD;                        // [NS][BN][LD]
  bf16* q_hi = v_st + NS * BN * LD;                        // [RT][LD]
  bf16* q_lo = q_hi + RT * LD;                             // [RT][LD], QLO only
  float* red_o = reinterpret_cast<float*>(mma_decode_smem);  // after a pass's keys: [NW][RT][DMAX]
  __shared__ float red_m[NW][RT], red_l[NW][RT];
  __shared__ bool key_ok_s[NS][BN];

  const int split = blockIdx.x % a.splits, row_split = blockIdx.x / a.splits;
  const int seq = blockIdx.z, kv_head = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const SeqBounds b = seq_bounds(a, seq);
  if (b.q_len > a.decode_max_q) return;  // the prefill kernel's (uniform over the block)
  // kFullDims: both head dims are DMAX, known to the compiler, so the k-steps
  // below are straight-line code it can schedule across (with runtime widths
  // each k-step is a branch, and its ldmatrix waits behind the last one's MMAs).
  const int group = a.group, D = kFullDims ? DMAX : a.head_dim, Dv = kFullDims ? DMAX : a.v_head_dim;
  const int kd = (D + 15) / 16 * 16, kdv = (Dv + 15) / 16 * 16;
  const int64_t total_rows = b.q_len * group;
  const bf16* k_cache = static_cast<const bf16*>(a.k_cache);
  const bf16* v_cache = static_cast<const bf16*>(a.v_cache);
  const int32_t* slots = a.kv_slots + (b.bad ? 0 : b.kv_begin);

  for (int64_t r0 = int64_t{row_split} * RT; r0 < total_rows; r0 += int64_t{RT} * a.row_splits) {  // uniform
    const int64_t pos_first = b.kv_len - b.q_len + r0 / group;
    const int64_t pos_last = b.kv_len - b.q_len + min(r0 + RT - 1, total_rows - 1) / group;
    const int64_t lo = a.sliding_window > 0 && !a.keys_from_zero
                           ? max(int64_t{0}, pos_first - a.sliding_window + 1)
                           : int64_t{0};
    const int64_t hi = b.bad ? 0 : pos_last + 1;  // keys [lo, hi)
    const int64_t span = hi > lo ? hi - lo : 0;
    const int64_t per_split = (span + a.splits - 1) / a.splits;
    const int64_t c0 = lo + split * per_split, c1 = min(hi, c0 + per_split);

    int64_t pos_r[2];  // positions of this lane's rows g and g + 8 (-1: no row)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = r0 + g + 8 * h;
      pos_r[h] = r < total_rows && !b.bad ? b.kv_len - b.q_len + r / group : int64_t{-1};
    }
    float o[DMAX / 8][4];
#pragma unroll
    for (int n = 0; n < DMAX / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_row[2] = {kNegInf, kNegInf}, l_row[2] = {0.0f, 0.0f};
    bool bad_slot = false;

    // Each thread copies the 8-element chunks at columns my_d + c * DMAX /
    // kChunks (c < kChunks) of rows tid / TPR + p * kRowsPer: a row's
    // slot, bounds and addresses serve kChunks chunks of K and of V.
    constexpr int kChunks = DMAX >= 128 ? 2 : 1, TPR = DMAX / 8 / kChunks;
    constexpr int kRowsPer = kDecodeThreads / TPR, kPer = BN / kRowsPer;
    static_assert(kDecodeThreads % TPR == 0 && BN % kRowsPer == 0);
    const int my_row = tid / TPR, my_d = (tid % TPR) * 8;
    const int64_t tiles = c1 > c0 ? (c1 - c0 + BN - 1) / BN : 0;
    // Slots are loaded two tiles before their copies are issued (pre[0]: the
    // next tile to issue, pre[1]: the one after), the prologue's all at once.
    int32_t pre[NS + 1][kPer];
    const auto fetch_slots = [&](int64_t t, int32_t(&dst)[kPer]) {
#pragma unroll
      for (int p = 0; p < kPer; ++p) {
        const int64_t j = c0 + t * BN + my_row + p * kRowsPer;
        dst[p] = t < tiles && j < c1 ? slots[j] : -1;
      }
    };
    const auto issue = [&](int64_t t, const int32_t(&src)[kPer]) {
      if (t >= tiles) return;  // uniform
      const int st = static_cast<int>(t % NS);
#pragma unroll
      for (int p = 0; p < kPer; ++p) {
        const int row = my_row + p * kRowsPer;
        const int64_t j = c0 + t * BN + row;
        const int64_t slot = src[p];
        const bool in_range = slot >= 0 && slot < a.num_slots;
        bad_slot |= j < c1 && !in_range;
        const bool ok = j < c1 && in_range;
        if (my_d == 0) key_ok_s[st][row] = ok;
        // Rows of missing keys and the columns up to the mma width are zeros
        // (a zero value row keeps 0 * garbage out of the sums).
        const int64_t head_row = ok ? slot * a.num_kv_heads + kv_head : 0;
        const bf16* ksrc = k_cache + head_row * D;
        const bf16* vsrc = v_cache + head_row * Dv;
        bf16* kdst = k_st + (st * BN + row) * LD;
        bf16* vdst = v_st + (st * BN + row) * LD;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int d = my_d + c * (DMAX / kChunks);
          if (d < kd) {
            if (ok && d < D) cp_async_16(kdst + d, ksrc + d);
            else *reinterpret_cast<uint4*>(kdst + d) = make_uint4(0, 0, 0, 0);
          }
          if (d < kdv) {
            if (ok && d < Dv) cp_async_16(vdst + d, vsrc + d);
            else *reinterpret_cast<uint4*>(vdst + d) = make_uint4(0, 0, 0, 0);
          }
        }
      }
    };
#pragma unroll
    for (int t = 0; t < NS + 1; ++t) fetch_slots(t, pre[t]);
    // Launched as a programmatic dependent: the layout (bounds, slots) went
    // up before the step's first kernel, but q and the new tokens' keys are
    // the previous kernel's.
    wait_for_producer();
    {
      // The pass's q as bf16 high and (QLO) low parts (rows past the
      // sequence and columns past D are 0); every load is issued before the
      // first store (a loop of load-store pairs would wait out one memory
      // latency per element).
      constexpr int kQPer = RT * DMAX / kDecodeThreads;
      float qv[kQPer];
#pragma unroll
      for (int k = 0; k < kQPer; ++k) {
        const int idx = tid + k * kDecodeThreads, i = idx / DMAX, d = idx % DMAX;
        const int64_t r = r0 + i;
        qv[k] = r < total_rows && !b.bad && d < D
                    ? load_q(a, ((b.q_begin + r / group) * a.num_heads + kv_head * group + r % group) * D + d)
                    : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kQPer; ++k) {
        const int idx = tid + k * kDecodeThreads, i = idx / DMAX, d = idx % DMAX;
        const bf16 h = __float2bfloat16_rn(qv[k]);
        q_hi[i * LD + d] = h;
        if constexpr (QLO) q_lo[i * LD + d] = __float2bfloat16_rn(qv[k] - __bfloat162float(h));
      }
    }
#pragma unroll
    for (int t = 0; t < NS - 1; ++t) {
      issue(t, pre[t]);
      cp_async_commit();
    }
    for (int64_t t = 0; t < tiles; ++t) {  // uniform
      // pre[NS - 1] holds tile t + NS - 1's slots, pre[NS] tile t + NS's.
      issue(t + NS - 1, pre[NS - 1]);
      cp_async_commit();
#pragma unroll
      for (int p = 0; p < kPer; ++p) pre[NS - 1][p] = pre[NS][p];
      fetch_slots(t + NS + 1, pre[NS]);
      cp_async_wait<NS - 1>();  // tile t has landed (this thread's copies) ...
      __syncthreads();          // ... and everyone's, the zero fills, key_ok_s and the q tile
      const int st = static_cast<int>(t % NS);
      const bf16* ks = k_st + (st * BN + warp * 16) * LD;  // this warp's 16 keys
      const bf16* vs = v_st + (st * BN + warp * 16) * LD;

      // acc[p][n]: the k-steps of parity p for keys n * 8 .. n * 8 + 7.
      float acc[2][2][4] = {};
#pragma unroll
      for (int k = 0; k < DMAX / 16; ++k) {
        if (k * 16 < kd) {
          uint32_t qh[4], kb[4];
          ldmatrix_x4(qh, q_hi + ((lane % 8) + ((lane / 8) % 2) * 8) * LD + k * 16 + (lane / 16) * 8);
          ldmatrix_x4(kb, ks + ((lane % 8) + (lane / 16) * 8) * LD + k * 16 + ((lane / 8) % 2) * 8);
          mma_bf16(acc[k % 2][0], qh, kb[0], kb[1]);
          mma_bf16(acc[k % 2][1], qh, kb[2], kb[3]);
          if constexpr (QLO) {
            uint32_t ql[4];
            ldmatrix_x4(ql, q_lo + ((lane % 8) + ((lane / 8) % 2) * 8) * LD + k * 16 + (lane / 16) * 8);
            mma_bf16(acc[k % 2][0], ql, kb[0], kb[1]);
            mma_bf16(acc[k % 2][1], ql, kb[2], kb[3]);
          }
        }
      }
      float s[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = (acc[0][n][e] + acc[1][n][e]) * a.scale_log2;
      // Mask, then the online softmax of rows g (h = 0) and g + 8 (h = 1).
      // A tile inside the split whose every key every row of the pass sees
      // (below the first row's position, within the window of the last) is
      // not masked (uniform over the block); a key whose slot is out of range
      // poisons the pass anyway.
      const int64_t j0 = c0 + t * BN;
      const bool interior = j0 + BN <= c1 && j0 + BN - 1 <= pos_first &&
                            (a.sliding_window <= 0 || pos_last - j0 < a.sliding_window);
      float tile_max[2] = {kNegInf, kNegInf};
      if (interior) {
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[n][e]);
      } else {
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e / 2, kl = warp * 16 + n * 8 + 2 * t4 + (e & 1);
            const int64_t j = j0 + kl;
            const bool visible = key_ok_s[st][kl] && j <= pos_r[h] &&
                                 (a.sliding_window <= 0 || pos_r[h] - j < a.sliding_window);
            s[n][e] = visible ? s[n][e] : kNegInf;
            tile_max[h] = fmaxf(tile_max[h], s[n][e]);
          }
      }
      float correction[2];
      advance_row_max<true>(tile_max, m_row, l_row, correction);
      uint32_t pa_hi[4], pa_lo[4];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int h = e / 2;
          const float p0 = m_row[h] == kNegInf ? 0.0f : fast_exp2(s[n][e] - m_row[h]);
          const float p1 = m_row[h] == kNegInf ? 0.0f : fast_exp2(s[n][e + 1] - m_row[h]);
          l_row[h] += p0 + p1;
          const __nv_bfloat162 ph = __floats2bfloat162_rn(p0, p1);
          pa_hi[2 * n + h] = *reinterpret_cast<const uint32_t*>(&ph);
          pa_lo[2 * n + h] = pack_bf16(p0 - __low2float(ph), p1 - __high2float(ph));
        }
      // O is rescaled only when a row's max moved (uniform over the warp).
      if (__any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) scale_rows(o, correction);
#pragma unroll
      for (int n = 0; n < DMAX / 16; ++n) {
        if (n * 16 < kdv) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, vs + ((lane % 8) + ((lane / 8) % 2) * 8) * LD + n * 16 + (lane / 16) * 8);
          mma_bf16(o[2 * n], pa_hi, vb[0], vb[1]);
          mma_bf16(o[2 * n + 1], pa_hi, vb[2], vb[3]);
          mma_bf16(o[2 * n], pa_lo, vb[0], vb[1]);
          mma_bf16(o[2 * n + 1], pa_lo, vb[2], vb[3]);
        }
      }
      __syncthreads();  // this stage is refilled by a later iteration's copies
    }
    cp_async_wait<0>();  // only empty groups remain
    __syncthreads();     // the stages are free for red_o (also when there were no tiles)

#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 1);
      l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 2);
    }
#pragma unroll
    for (int n = 0; n < DMAX / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        red_o[(warp * RT + g + 8 * (e / 2)) * DMAX + n * 8 + 2 * t4 + (e & 1)] = o[n][e];
    if (t4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        red_m[warp][g + 8 * h] = m_row[h];
        red_l[warp][g + 8 * h] = l_row[h];
      }
    }
    const bool poisoned = __syncthreads_or(bad_slot || b.bad) != 0;

    write_pass_rows<NW, RT>(a, b, r0, total_rows, kv_head, split, poisoned, red_m, red_l,
                            [&](int w, int i, int d) { return red_o[(w * RT + i) * DMAX + d]; });
    __syncthreads();  // red_*, the q tile and the stages are rewritten by the next pass
  }
  // Only now may the next kernel (the combine, or the output projection)
  // launch: letting it in before the wait above measured 4.34 / 6.87 ms per
  // Llama-8B step at batch 1 / 8, against 4.15 / 4.91 this way (its blocks,
  // and those of the kernels it lets start in turn, crowd this kernel's).
  let_consumer_start();
}

// The prefill plan: tile_start[s] = the number of prefill tiles of the
// sequences before s (a sequence with q_len > decode_max_q has ceil(q_len /
// prefill_rows) tiles, the others none), tile_start[num_seqs] = the total. One block
// scans the layout 256 sequences at a time (warp scans, then the warps'
// totals through shared memory).
constexpr int kPlanThreads = 256;

__global__ void __launch_bounds__(kPlanThreads) plan_kernel(AttentionArgs a) {
  __shared__ int64_t warp_sums[kPlanThreads / 32];
  __shared__ int64_t carry_s;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) carry_s = 0;
  __syncthreads();
  for (int base = 0; base < a.num_seqs; base += kPlanThreads) {  // uniform
    const int s = base + tid;
    int64_t count = 0;
    if (s < a.num_seqs) {
      const int64_t q_len = int64_t{a.q_start[s + 1]} - a.q_start[s];
      if (q_len > a.decode_max_q && q_len > 0) count = (q_len + a.prefill_rows - 1) / a.prefill_rows;
    }
    int64_t inclusive = count;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int64_t v = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (lane >= o) inclusive += v;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    int64_t before = carry_s, total = 0;
    for (int w = 0; w < kPlanThreads / 32; ++w) {
      if (w < warp) before += warp_sums[w];
      total += warp_sums[w];
    }
    if (s < a.num_seqs) a.tile_start[s] = static_cast<int32_t>(min(before + inclusive - count, int64_t{INT32_MAX}));
    __syncthreads();  // every thread has read carry_s and warp_sums
    if (tid == 0) carry_s += total;
    __syncthreads();
  }
  if (tid == 0) a.tile_start[a.num_seqs] = static_cast<int32_t>(min(carry_s, int64_t{INT32_MAX}));
}

// ---------------------------------------------------------------------------
// Launch helpers.

// The decode kernel's geometry for a cache type and the widest head dim.
struct DecodeGeometry {
  int vec, lpk, cpl;
};

bool decode_vector_ok(Elem cache, const AttentionShape& s) {
  const int vec = cache == Elem::kF32 ? 4 : 8;
  return s.head_dim % vec == 0 && s.v_head_dim % vec == 0;
}

DecodeGeometry decode_geometry(Elem cache, const AttentionShape& s, bool vector) {
  if (!vector) return {1, 32, 8};
  const int vec = cache == Elem::kF32 ? 4 : 8;
  const int widest = s.head_dim > s.v_head_dim ? s.head_dim : s.v_head_dim;
  const int chunks = (widest + vec - 1) / vec;
  if (chunks <= 8) return {vec, 8, 1};
  if (chunks <= 16) return {vec, 16, 1};
  if (chunks <= 32) return {vec, 32, 1};
  return {vec, 32, 2};
}

// The tensor-core decode kernel takes bf16 caches with head dims that are
// multiples of 8 and at most 128 (16-byte aligned caches, which cuda_empty
// gives, are checked at launch; an unaligned one falls back to the CUDA-core
// kernel, correct with any row_splits).
bool decode_uses_mma(Elem cache, const AttentionShape& s) {
  return cache == Elem::kBF16 && s.head_dim % 8 == 0 && s.v_head_dim % 8 == 0 && s.head_dim <= 128 &&
         s.v_head_dim <= 128;
}

int decode_rows_per_pass(const AttentionShape& s) {
  const int64_t rows = (s.q_tokens + s.num_seqs - 1) / s.num_seqs * (s.num_heads / s.num_kv_heads);
  return rows <= 4 ? 4 : 8;
}

template <typename Cache, int VEC, int LPK, int CPL, int RT, bool kStaged>
void launch_decode_kernel(const AttentionArgs& args, dim3 grid, cudaStream_t stream) {
  if constexpr (kStaged) {
    constexpr size_t smem = decode_staged_smem_bytes<LPK, CPL, VEC, Cache>();
    static const cudaError_t configured = [] {
      const auto kernel = decode_kernel<Cache, VEC, LPK, CPL, RT, true>;
      cudaError_t status =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (status == cudaSuccess)
        status = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
      return status;
    }();
    // Launched even if the setup failed: the launch then fails as well, so
    // every call reports it through cudaGetLastError(), not only the first.
    (void)configured;
    decode_kernel<Cache, VEC, LPK, CPL, RT, true><<<grid, kDecodeThreads, smem, stream>>>(args);
  } else {
    decode_kernel<Cache, VEC, LPK, CPL, RT, false><<<grid, kDecodeThreads, 0, stream>>>(args);
  }
}

template <typename Cache, int VEC, int LPK, int CPL>
void launch_decode_rt(const AttentionArgs& args, int rt, bool staged, dim3 grid, cudaStream_t stream) {
  if constexpr (CPL == 1 && VEC * sizeof(Cache) == 16) {
    if (staged) {
      if (rt == 4) launch_decode_kernel<Cache, VEC, LPK, CPL, 4, true>(args, grid, stream);
      else launch_decode_kernel<Cache, VEC, LPK, CPL, 8, true>(args, grid, stream);
      return;
    }
  }
  if (rt == 4) launch_decode_kernel<Cache, VEC, LPK, CPL, 4, false>(args, grid, stream);
  else launch_decode_kernel<Cache, VEC, LPK, CPL, 8, false>(args, grid, stream);
}

template <typename Cache>
void launch_decode(const AttentionArgs& args, const DecodeGeometry& geo, int rt, bool staged, dim3 grid,
                   cudaStream_t stream) {
  constexpr int V = 16 / sizeof(Cache);
  if (geo.vec == 1) launch_decode_rt<Cache, 1, 32, 8>(args, rt, false, grid, stream);
  else if (geo.lpk == 8) launch_decode_rt<Cache, V, 8, 1>(args, rt, staged, grid, stream);
  else if (geo.lpk == 16) launch_decode_rt<Cache, V, 16, 1>(args, rt, staged, grid, stream);
  else if (geo.cpl == 1) launch_decode_rt<Cache, V, 32, 1>(args, rt, staged, grid, stream);
  else if constexpr (V == 4) launch_decode_rt<Cache, V, 32, 2>(args, rt, false, grid, stream);  // f32 rows over 128
}

template <int DMAX, bool QLO, bool kFullDims>
void launch_decode_mma_dims(const AttentionArgs& args, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = MmaDecodeTile<DMAX, QLO>::kSmemBytes;
  const auto kernel = decode_mma_kernel<DMAX, QLO, kFullDims>;
  static const cudaError_t configured = [kernel] {
    cudaError_t status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (status == cudaSuccess)
      status = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    return status;
  }();
  // Launched even if the setup failed: the launch then fails as well, so
  // every call reports it through cudaGetLastError(), not only the first.
  (void)configured;
  launch_dependent_smem(kernel, grid, dim3(kDecodeThreads), smem, stream, args);
}

template <int DMAX, bool QLO>
void launch_decode_mma(const AttentionArgs& args, dim3 grid, cudaStream_t stream) {
  if (args.head_dim == DMAX && args.v_head_dim == DMAX) launch_decode_mma_dims<DMAX, QLO, true>(args, grid, stream);
  else launch_decode_mma_dims<DMAX, QLO, false>(args, grid, stream);
}

template <int DMAX, typename Cache, bool kAsync>
void launch_prefill_dmax(const AttentionArgs& args, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = PrefillTile<DMAX>::kSmemBytes;
  // Raise the dynamic shared-memory limit once per instantiation (it is a
  // function attribute, not a stream operation, so capture is unaffected).
  static const cudaError_t configured = cudaFuncSetAttribute(
      prefill_kernel<DMAX, Cache, kAsync>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  // Launched even if the setup failed: the launch then fails as well, so
  // every call reports it through cudaGetLastError(), not only the first.
  (void)configured;
  prefill_kernel<DMAX, Cache, kAsync><<<grid, kPrefillThreads, smem, stream>>>(args);
}

template <typename Cache, bool kAsync>
void launch_prefill(const AttentionArgs& args, int widest, dim3 grid, cudaStream_t stream) {
  if (widest <= 64) launch_prefill_dmax<64, Cache, kAsync>(args, grid, stream);
  else if (widest <= 128) launch_prefill_dmax<128, Cache, kAsync>(args, grid, stream);
  else launch_prefill_dmax<256, Cache, kAsync>(args, grid, stream);
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

int attention_decode_row_splits(Elem cache, const AttentionShape& s) {
  if (s.num_seqs <= 0) return 1;
  const int rt = decode_uses_mma(cache, s) ? kMmaDecodeRows : decode_rows_per_pass(s);
  const int64_t rows = (s.q_tokens + s.num_seqs - 1) / s.num_seqs * (s.num_heads / s.num_kv_heads);
  const int64_t passes = (rows + rt - 1) / rt;
  return static_cast<int>(passes < 1 ? 1 : passes > 1024 ? 1024 : passes);
}

int attention_decode_splits(Elem cache, Elem q, const AttentionShape& s) {
  if (s.num_seqs <= 0) return 1;
  // Blocks of one key split; a wave is what the chip holds at once (the
  // decode kernel's occupancy for this geometry).
  const int64_t base = int64_t{s.num_seqs} * s.num_kv_heads * attention_decode_row_splits(cache, s);
  const int sms = sm_count();
  // Resident 128-thread blocks per SM: the tensor-core kernel's shared
  // memory allows 3 with a bf16 q (two stages), 2 with an f32 one; the
  // CUDA-core kernels' registers (ptxas -v: ~170 with 4 rows per pass, ~250
  // with 8) 3 or 2.
  const bool mma = decode_uses_mma(cache, s);
  const int per_sm = mma ? (q == Elem::kBF16 ? 3 : 2) : decode_rows_per_pass(s) != 4 ? 2 : 3;
  // For the tensor-core kernel, a block on every SM already reads at its
  // rate: splitting then only adds blocks' fixed costs (H100, batch 32 x
  // 4096 keys: 195 us unsplit, 205 in 3 splits; 32 x 512: 34 against 48).
  if (mma && base >= sms) return 1;
  const int64_t wave = int64_t{sms} * per_sm;
  // Each split should keep at least ~64 keys (two staged tiles at head dim
  // 128) of the average sequence.
  const int64_t avg_keys = s.kv_slots_len / s.num_seqs;
  int64_t max_splits = avg_keys / 64;
  if (max_splits > kAttentionMaxSplits) max_splits = kAttentionMaxSplits;
  if (max_splits < 1) max_splits = 1;
  // Tensor cores: time ~ waves x (key tiles per block + a block's fixed
  // cost: its slots and q before the first tile lands, the merge and the
  // combine after the last, ~1.5 tiles' time). CUDA cores: time ~ waves /
  // splits. Take the fewest splits within 5% of the best.
  constexpr double kFixedTiles = 1.5;
  double best = 1e30;
  int best_splits = 1;
  for (int64_t sp = 1; sp <= max_splits; ++sp) {
    const double waves = static_cast<double>((base * sp + wave - 1) / wave);
    const double tiles = static_cast<double>((avg_keys + sp * kMmaDecodeBN - 1) / (sp * kMmaDecodeBN));
    const double cost = mma ? waves * (tiles + kFixedTiles)
                            : waves / static_cast<double>(sp) * (1.0 + 0.01 * static_cast<double>(sp > 1));
    if (cost < best * 0.95) {
      best = cost;
      best_splits = static_cast<int>(sp);
    }
  }
  return best_splits;
}

int64_t attention_decode_scratch_floats(const AttentionShape& s, int splits) {
  if (splits <= 1) return 0;
  return int64_t{splits} * s.q_tokens * s.num_heads * (s.v_head_dim + 2);
}

int64_t attention_prefill_tiles(const AttentionShape& s, int64_t decode_max_q, int rows_per_tile) {
  // Each prefill sequence has more than decode_max_q rows, so there are at
  // most T / (decode_max_q + 1) of them, each adding at most one partial tile.
  int64_t long_seqs = s.q_tokens / (decode_max_q + 1);
  if (long_seqs > s.num_seqs) long_seqs = s.num_seqs;
  return (s.q_tokens + rows_per_tile - 1) / rows_per_tile + long_seqs;
}

bool attention_prefill_on_wgmma(Elem cache, const void* q, const void* k_cache, const void* v_cache, const void* out,
                                const AttentionShape& shape) {
  const auto aligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return cache == Elem::kBF16 && attention_prefill_wgmma_fits(shape.head_dim, shape.v_head_dim) &&
         aligned(q, 16) && aligned(k_cache, 16) && aligned(v_cache, 16) && aligned(out, 8) && wgmma_available();
}

cudaError_t attention(Elem q_type, Elem out_type, Elem cache, const void* q, const void* k_cache, const void* v_cache,
                      const int32_t* q_start, const int32_t* kv_start, const int32_t* kv_slots,
                      const AttentionShape& shape, const AttentionLaunch& launch, void* out, cudaStream_t stream) {
  AttentionArgs args{};
  args.q = q;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.out = out;
  args.q_start = q_start;
  args.kv_start = kv_start;
  args.kv_slots = kv_slots;
  args.num_seqs = shape.num_seqs;
  args.q_tokens = shape.q_tokens;
  args.kv_slots_len = shape.kv_slots_len;
  args.num_slots = shape.num_slots;
  args.num_heads = shape.num_heads;
  args.num_kv_heads = shape.num_kv_heads;
  args.group = shape.num_heads / shape.num_kv_heads;
  args.head_dim = shape.head_dim;
  args.v_head_dim = shape.v_head_dim;
  args.scale_log2 = shape.scale * kLog2e;
  args.sliding_window = shape.sliding_window;
  args.q_bf16 = q_type == Elem::kBF16;
  args.out_bf16 = out_type == Elem::kBF16;
  args.decode_max_q = launch.prefill ? launch.decode_max_q : INT64_MAX;
  args.keys_from_zero = launch.keys_from_zero;
  args.tile_start = launch.tile_starts;
  const int widest = shape.head_dim > shape.v_head_dim ? shape.head_dim : shape.v_head_dim;
  const bool aligned = reinterpret_cast<uintptr_t>(k_cache) % 16 == 0 && reinterpret_cast<uintptr_t>(v_cache) % 16 == 0;

  if (launch.prefill) {
    args.splits = 1;
    const bool wgmma =
        !launch.prefill_mma_sync && attention_prefill_on_wgmma(cache, q, k_cache, v_cache, out, shape);
    args.prefill_rows = wgmma ? kWgmmaPrefillRows : kPrefillBM;
    plan_kernel<<<1, kPlanThreads, 0, stream>>>(args);
    const int64_t tiles = attention_prefill_tiles(shape, args.decode_max_q, args.prefill_rows);
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(shape.num_heads));
    const bool async = cache == Elem::kBF16 && aligned && shape.head_dim % 8 == 0 && shape.v_head_dim % 8 == 0;
    cudaError_t status = cudaSuccess;
    if (wgmma) status = launch_attention_prefill_wgmma(args, grid, stream);
    else if (cache == Elem::kF32) launch_prefill<float, false>(args, widest, grid, stream);
    else if (async) launch_prefill<bf16, true>(args, widest, grid, stream);
    else launch_prefill<bf16, false>(args, widest, grid, stream);
    if (status == cudaSuccess) status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  if (launch.decode) {
    args.splits = launch.splits < 1 ? 1 : launch.splits;
    if (args.splits > 1) {
      args.part_o = launch.decode_scratch;
      args.part_ml =
          launch.decode_scratch + int64_t{args.splits} * shape.q_tokens * shape.num_heads * shape.v_head_dim;
    }
    const DecodeGeometry geo = decode_geometry(cache, shape, aligned && decode_vector_ok(cache, shape));
    const int rt = decode_rows_per_pass(shape);
    args.row_splits = attention_decode_row_splits(cache, shape);
    // Kv heads in y, sequences in z: the blocks of one sequence's kv heads run
    // together, so its slots come from DRAM once and its rows' head segments
    // are read close in time.
    const dim3 grid(static_cast<unsigned>(args.splits * args.row_splits), static_cast<unsigned>(shape.num_kv_heads),
                    static_cast<unsigned>(shape.num_seqs));
    const bool staged = geo.vec > 1 && geo.cpl == 1;
    if (decode_uses_mma(cache, shape) && aligned && !launch.decode_cuda_cores) {
      if (widest <= 64 && args.q_bf16) launch_decode_mma<64, false>(args, grid, stream);
      else if (widest <= 64) launch_decode_mma<64, true>(args, grid, stream);
      else if (args.q_bf16) launch_decode_mma<128, false>(args, grid, stream);
      else launch_decode_mma<128, true>(args, grid, stream);
    } else if (cache == Elem::kF32) {
      launch_decode<float>(args, geo, rt, staged, grid, stream);
    } else {
      launch_decode<bf16>(args, geo, rt, staged, grid, stream);
    }
    if (args.splits > 1) {
      const cudaError_t status = cudaGetLastError();
      if (status != cudaSuccess) return status;
      const dim3 cgrid(static_cast<unsigned>(shape.q_tokens), static_cast<unsigned>(shape.num_heads));
      launch_dependent(decode_combine_kernel, cgrid, dim3(kCombineThreads), stream, args);
    }
  }
  return cudaGetLastError();
}

}  // namespace basalt::cuda_kernels
