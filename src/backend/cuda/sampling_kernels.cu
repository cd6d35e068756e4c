// The device sampler and its companions (see sampling_kernels.h, and
// reference_ops.h for what sample computes).
//
// One block of kThreads threads per row. Tokens are ranked through an
// order-preserving 32-bit key of their scaled logit (larger key = larger
// value, -0 and +0 the same key), so a rank cut is a pair (key K, index I):
// a token is kept when its key is above K, or equal to K and its index is at
// most I (ties go to the lower index). Cuts are found by radix select over
// the key, 8 bits a pass, with shared-memory histograms of counts (top-k) or
// of masses (top-p). Masses are integers, weight * 2^mass_shift rounded, so
// that every sum is exact and independent of the order of the additions:
// the block's result does not depend on scheduling, and the draw's running
// sums are consistent with the total by construction.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/sampling_kernels.h"

namespace basalt::cuda_kernels {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

using u64 = unsigned long long;

struct Shared {
  unsigned count[256];
  u64 mass[256];
  u64 warp_u64[kWarps];
  unsigned warp_u32[kWarps];
  u64 cum;         // crossing search: the mass above the chosen bin
  unsigned digit;  // crossing search: the chosen bin
  int found;       // crossing search: whether any bin reached the need
  int sel_warp;    // segment searches: the warp that holds the answer
  u64 sel_base;    // segment searches: the total before that warp
  long long index; // segment searches: the answer
};

// Larger float, larger key; -0 and +0 map to one key. Not for NaN.
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t b = __float_as_uint(v);
  if ((b & 0x7fffffffu) == 0) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The float of a key (a zero comes back as +0).
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__device__ __forceinline__ u64 warp_max(u64 v) {
  for (int o = 16; o > 0; o >>= 1) {
    const u64 other = __shfl_xor_sync(kFull, v, o);
    v = other > v ? other : v;
  }
  return v;
}

__device__ __forceinline__ u64 warp_sum(u64 v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ u64 warp_inclusive_scan(u64 v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const u64 t = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

// Block-wide max and sum; every thread gets the result.
__device__ u64 block_max(u64 v, Shared& sh) {
  v = warp_max(v);
  __syncthreads();  // earlier readers of warp_u64 are done
  if ((threadIdx.x & 31) == 0) sh.warp_u64[threadIdx.x >> 5] = v;
  __syncthreads();
  return warp_max(sh.warp_u64[threadIdx.x & 31]);
}

__device__ u64 block_sum(u64 v, Shared& sh) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.warp_u64[threadIdx.x >> 5] = v;
  __syncthreads();
  return warp_sum(sh.warp_u64[threadIdx.x & 31]);
}

// Run by warp 0 alone: scanning the bins from 255 down, the first bin b
// with base + (mass of the bins above b) + mass[b] >= need. Sets sh.found,
// and when found sh.digit = b and sh.cum = base + (mass of the bins above).
__device__ void find_crossing(Shared& sh, u64 base, u64 need) {
  const int lane = threadIdx.x & 31;
  u64 own[8];
  u64 total = 0;
  for (int j = 0; j < 8; ++j) {
    own[j] = sh.mass[255 - 8 * lane - j];
    total += own[j];
  }
  const u64 inclusive = warp_inclusive_scan(total);
  const unsigned reached = __ballot_sync(kFull, base + inclusive >= need);
  if (reached == 0) {
    if (lane == 0) sh.found = 0;
    return;
  }
  if (lane == __ffs(reached) - 1) {
    u64 cum = base + inclusive - total;
    for (int j = 0; j < 8; ++j) {
      if (cum + own[j] >= need) {
        sh.digit = static_cast<unsigned>(255 - 8 * lane - j);
        sh.cum = cum;
        sh.found = 1;
        break;
      }
      cum += own[j];
    }
  }
}

// What the passes read of token i: its key, and its weight where needed.
struct Item {
  uint32_t key;
  float w;
};

// Items in flight per thread in the sweeps below: the passes are bound by
// the latency of L2, so each thread issues kItems loads before using them.
constexpr int kItems = 4;

// Calls body(i, valid, item) for every i < n, block-strided, kItems loads
// issued at once. Every thread makes the same number of calls (valid false
// past the end), so body may use warp collectives.
template <typename Load, typename Body>
__device__ __forceinline__ void sweep(int64_t n, Load load, Body body) {
  for (int64_t base = 0; base < n; base += static_cast<int64_t>(kThreads) * kItems) {
    Item items[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t i = base + static_cast<int64_t>(j) * kThreads + threadIdx.x;
      items[j] = i < n ? load(i) : Item{0, 0.0f};
    }
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t i = base + static_cast<int64_t>(j) * kThreads + threadIdx.x;
      body(i, i < n, items[j]);
    }
  }
}

// The result of a radix select: the cut key, the mass of the candidates
// above it, and the count and mass of the candidates equal to it.
struct Selection {
  bool found;
  uint32_t key;
  u64 above;
  u64 tie_count;
  u64 tie_mass;
};

// Radix select over the candidates of a row, from the largest key down: the
// key K at which the running mass (mass(item) per candidate, larger keys
// first) first reaches `need`. not found when the candidates' total mass
// stays below need. load(i) reads token i, candidate(i, item) says whether
// it takes part, mass(item) is its mass (taken as 1 when kCountOnly).
template <bool kCountOnly, typename Load, typename Candidate, typename Mass>
__device__ Selection radix_select(int64_t n, Load load, Candidate candidate, Mass mass, u64 need, Shared& sh) {
  uint32_t prefix = 0, mask = 0;
  u64 base = 0;
  Selection result{};
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      sh.count[b] = 0;
      sh.mass[b] = 0;
    }
    __syncthreads();
    // Warp-aggregated: the lanes of one bin add their count and mass in one
    // atomic each (the top bins are crowded). A mass is at most 2^44, so its
    // two parts (26 low bits, the rest) sum over 32 lanes within 32 bits.
    sweep(n, load, [&](int64_t i, bool valid, const Item& item) {
      unsigned bin = 256;  // none
      u64 m = 0;
      if (valid && (item.key & mask) == prefix && candidate(i, item)) {
        bin = (item.key >> shift) & 255u;
        if (!kCountOnly) m = mass(item);
      }
      if (!__any_sync(kFull, bin < 256)) return;  // later passes: most steps hold no candidate
      const unsigned peers = __match_any_sync(kFull, bin);
      u64 total = __popc(peers);
      if (!kCountOnly) {
        const unsigned low = __reduce_add_sync(peers, static_cast<unsigned>(m & 0x3ffffffull));
        const unsigned high = __reduce_add_sync(peers, static_cast<unsigned>(m >> 26));
        total = (static_cast<u64>(high) << 26) + low;
      }
      if (bin < 256 && static_cast<int>(threadIdx.x & 31) == __ffs(peers) - 1) {
        atomicAdd(&sh.count[bin], static_cast<unsigned>(__popc(peers)));
        if (total != 0) atomicAdd(&sh.mass[bin], total);
      }
    });
    __syncthreads();
    if (threadIdx.x < 32) find_crossing(sh, base, need);
    __syncthreads();
    if (!sh.found) {
      result.found = false;
      return result;  // uniform: every thread read the same flag
    }
    const unsigned digit = sh.digit;
    base = sh.cum;
    prefix |= digit << shift;
    mask |= 255u << shift;
    result.tie_count = sh.count[digit];
    result.tie_mass = sh.mass[digit];
    __syncthreads();  // everyone has read the bins before the next pass clears them
  }
  result.found = true;
  result.key = prefix;
  result.above = base;
  return result;
}

// Each warp owns one contiguous segment of the row, a multiple of
// 32 * kItems long.
__device__ __forceinline__ void warp_segment(int64_t n, int64_t& begin, int64_t& end) {
  constexpr int64_t kStep = 32 * kItems;
  const int64_t per_warp = (n + kWarps * kStep - 1) / (kWarps * kStep) * kStep;
  begin = static_cast<int64_t>(threadIdx.x >> 5) * per_warp;
  end = begin + per_warp < n ? begin + per_warp : n;
}

// The index of the first token in index order at which the running total
// of value(i, load(i)) (non-negative integers, index order) exceeds
// `target`; every thread gets it. The caller guarantees the row's total
// exceeds it.
template <typename Load, typename Value>
__device__ long long first_exceeding(int64_t n, Load load, Value value, u64 target, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t begin, end;
  warp_segment(n, begin, end);
  u64 total = 0;
  for (int64_t i0 = begin; i0 < end; i0 += 32 * kItems) {
    Item items[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t i = i0 + 32 * j + lane;
      items[j] = i < end ? load(i) : Item{0, 0.0f};
    }
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t i = i0 + 32 * j + lane;
      if (i < end) total += value(i, items[j]);
    }
  }
  total = warp_sum(total);
  __syncthreads();
  if (lane == 0) sh.warp_u64[warp] = total;
  __syncthreads();
  if (warp == 0) {
    const u64 mine = sh.warp_u64[lane];
    const u64 inclusive = warp_inclusive_scan(mine);
    const unsigned over = __ballot_sync(kFull, inclusive > target);
    const int first = over == 0 ? 31 : __ffs(over) - 1;  // the caller's guarantee makes over != 0
    if (lane == first) {
      sh.sel_warp = first;
      sh.sel_base = inclusive - mine;
      sh.index = -1;
    }
  }
  __syncthreads();
  if (warp == sh.sel_warp) {
    // One warp walks its segment 32 tokens at a time.
    u64 running = sh.sel_base;
    for (int64_t i0 = begin; i0 < end; i0 += 32) {
      const int64_t i = i0 + lane;
      const u64 v = i < end ? value(i, load(i)) : 0;
      const u64 inclusive = running + warp_inclusive_scan(v);
      const unsigned over = __ballot_sync(kFull, inclusive > target);
      if (over != 0) {
        if (lane == __ffs(over) - 1) sh.index = i;
        break;  // uniform across the warp
      }
      running = __shfl_sync(kFull, inclusive, 31);
    }
  }
  __syncthreads();
  return sh.index;
}

// The index of the t-th (1-based) token in index order whose key is K.
template <typename Load>
__device__ long long nth_with_key(int64_t n, Load load, uint32_t K, u64 t, Shared& sh) {
  return first_exceeding(
      n, load, [K](int64_t, const Item& item) -> u64 { return item.key == K ? 1 : 0; }, t - 1, sh);
}

// Whether token (key, i) survives the rank cut (K, I).
__device__ __forceinline__ bool rank_kept(uint32_t key, int64_t i, uint32_t K, long long I) {
  return key > K || (key == K && i <= I);
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z;
}

// sampling_uniform (backend/sampling_rng.h), bit for bit.
__device__ __forceinline__ float uniform(uint64_t seed, uint64_t step) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  const uint64_t h = mix64(mix64(seed + kGolden) + (step + 1) * kGolden);
  return __uint2float_rn(static_cast<unsigned>(h >> 40)) * 0x1p-24f;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, const SampleControls* controls, uint32_t* keys_all, float* weights_all,
                  int32_t* out, int64_t n, int mass_shift) {
  __shared__ Shared sh;
  const int64_t row = blockIdx.x;
  const float* x = logits + row * n;
  const SampleControls c = controls[row];

  if (c.temperature == 0.0f) {
    // Greedy: the largest (key, lowest index) of the non-NaN logits; a row
    // of NaN packs to 0 and gives token 0.
    u64 best = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = x[i];
      if (isnan(v)) continue;
      const u64 packed = static_cast<u64>(order_key(v)) << 32 | (0xffffffffu - static_cast<uint32_t>(i));
      best = packed > best ? packed : best;
    }
    best = block_max(best, sh);
    if (threadIdx.x == 0) out[row] = best == 0 ? 0 : static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(best));
    return;
  }

  uint32_t* keys = keys_all + row * n;
  float* w = weights_all + row * n;
  // Step 2: s = logit / temperature (NaN as -inf), its key and the maximum.
  u64 top = 0;
  sweep(
      n, [&](int64_t i) { return Item{0, x[i]}; },
      [&](int64_t i, bool valid, const Item& item) {
        if (!valid) return;
        const float l = item.w;
        const float s = isnan(l) ? -INFINITY : __fdiv_rn(l, c.temperature);
        const uint32_t key = order_key(s);
        keys[i] = key;
        top = key > top ? key : top;
      });
  const float m = key_value(static_cast<uint32_t>(block_max(top, sh)));
  // w = exp(s - m), the f32 difference as the reference takes it; exp in
  // double rounded once to f32 is the correctly rounded value but for
  // ties within 2^-53, which is what the host's expf returns too but for
  // its own rare last-bit misses. (Each thread reads back its own keys.)
  sweep(
      n, [&](int64_t i) { return Item{keys[i], 0.0f}; },
      [&](int64_t i, bool valid, const Item& item) {
        if (!valid) return;
        const float s = key_value(item.key);
        w[i] = s == m ? 1.0f : static_cast<float>(exp(static_cast<double>(s - m)));
      });
  __syncthreads();  // keys and weights are read across threads from here on

  const float scale = __uint_as_float(static_cast<uint32_t>(127 + mass_shift) << 23);  // 2^mass_shift
  const auto load_key = [&](int64_t i) { return Item{keys[i], 0.0f}; };
  const auto load_item = [&](int64_t i) { return Item{keys[i], w[i]}; };
  const auto mass = [scale](const Item& item) -> u64 { return __float2ull_rn(item.w * scale); };
  // The rank cut so far: everything.
  uint32_t cut_key = 0;
  long long cut_index = n;

  // Step 3: top-k, the first top_k in rank order.
  if (c.top_k > 0 && c.top_k < n) {
    const auto all = [](int64_t, const Item&) { return true; };
    const Selection s = radix_select<true>(n, load_key, all, mass, static_cast<u64>(c.top_k), sh);
    // Found: the row has more than top_k tokens.
    cut_key = s.key;
    const u64 ties = static_cast<u64>(c.top_k) - s.above;
    if (ties < s.tie_count) cut_index = nth_with_key(n, load_key, cut_key, ties, sh);
  }
  // Step 4: top-p over the survivors, by mass in rank order.
  if (c.top_p < 1.0f) {
    const auto survivor = [&](int64_t i, const Item& item) { return rank_kept(item.key, i, cut_key, cut_index); };
    u64 total = 0;
    sweep(n, load_item, [&](int64_t i, bool valid, const Item& item) {
      if (valid && survivor(i, item)) total += mass(item);
    });
    total = block_sum(total, sh);
    // A token stays while the mass ranked before it is below top_p * Z,
    // that is below need = ceil(top_p * Z) for integer masses.
    const u64 need = static_cast<u64>(ceil(static_cast<double>(c.top_p) * static_cast<double>(total)));
    const Selection s = radix_select<false>(n, load_item, survivor, mass, need > 0 ? need : 1, sh);
    if (s.found) {
      // The tied tokens at s.key share one mass; the j-th of them (from 0,
      // index order) has s.above + j * each before it.
      const u64 each = s.tie_mass / s.tie_count;  // > 0: this bin reached need
      u64 ties = (need - s.above + each - 1) / each;
      if (ties > s.tie_count) ties = s.tie_count;
      if (ties < s.tie_count) {
        cut_index = nth_with_key(n, load_key, s.key, ties, sh);
      } else if (s.key != cut_key) {
        cut_index = n;  // every token of a key above the old cut survived top-k
      }
      cut_key = s.key;
    }
  }
  // Steps 5 and 6: min-p, then the draw among the kept tokens, index order.
  const float min_p = c.min_p;
  const auto kept_mass = [&](int64_t i, const Item& item) -> u64 {
    return rank_kept(item.key, i, cut_key, cut_index) && item.w >= min_p ? mass(item) : 0;
  };
  u64 total = 0;
  sweep(n, load_item, [&](int64_t i, bool valid, const Item& item) {
    if (valid) total += kept_mass(i, item);
  });
  total = block_sum(total, sh);  // >= 2^mass_shift: the top token is always kept
  const double u = uniform(c.seed, c.step);
  const u64 target = static_cast<u64>(floor(u * static_cast<double>(total)));
  const long long token = first_exceeding(n, load_item, kept_mass, target < total ? target : total - 1, sh);
  if (threadIdx.x == 0) out[row] = static_cast<int32_t>(token);
}

// One thread per logit; a word of the mask serves 32 neighbouring threads.
__global__ void bitmask_kernel(float* logits, const int32_t* bitmask, int64_t rows, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, t = i % cols;
  const auto word = static_cast<uint32_t>(bitmask[r * ((cols + 31) / 32) + t / 32]);
  if (((word >> (t % 32)) & 1u) == 0) logits[i] = -INFINITY;
}

__global__ void adjust_kernel(float* logits, const EditRecord* edits, int64_t count, int64_t cols) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= count) return;
  const EditRecord edit = edits[e];
  float* p = logits + static_cast<int64_t>(edit.row) * cols + edit.token;
  if (edit.suppress) {
    *p = -INFINITY;
    return;
  }
  // apply_logit_edit (backend.h), one rounding per operation.
  float x = __fadd_rn(*p, edit.bias);
  x = x > 0.0f ? __fdiv_rn(x, edit.repetition) : __fmul_rn(x, edit.repetition);
  *p = __fsub_rn(x, edit.subtract);
}

// top_k_rows' key: NaN below every number.
__device__ __forceinline__ uint32_t value_key(float v) { return isnan(v) ? 0u : order_key(v); }

__global__ void __launch_bounds__(kThreads)
    top_k_kernel(const float* x_all, int64_t n, int k, float* values, int32_t* ids) {
  __shared__ Shared sh;
  __shared__ uint32_t picked_key[64];
  __shared__ int64_t picked_index[64];
  __shared__ int picked;
  const float* x = x_all + static_cast<int64_t>(blockIdx.x) * n;
  const auto load_key = [&](int64_t i) { return Item{value_key(x[i]), 0.0f}; };
  const auto all = [](int64_t, const Item&) { return true; };
  const auto one = [](const Item&) -> u64 { return 1; };
  // k <= n, so the selection is found.
  const Selection s = radix_select<true>(n, load_key, all, one, static_cast<u64>(k), sh);
  const u64 ties = static_cast<u64>(k) - s.above;
  const long long cut_index = ties < s.tie_count ? nth_with_key(n, load_key, s.key, ties, sh) : n;
  if (threadIdx.x == 0) picked = 0;
  __syncthreads();
  sweep(n, load_key, [&](int64_t i, bool valid, const Item& item) {
    if (valid && rank_kept(item.key, i, s.key, cut_index)) {
      const int slot = atomicAdd(&picked, 1);
      if (slot < 64) {
        picked_key[slot] = item.key;
        picked_index[slot] = i;
      }
    }
  });
  __syncthreads();
  // Exactly k were picked; each finds its place in (key desc, index asc).
  if (threadIdx.x < k) {
    const uint32_t key = picked_key[threadIdx.x];
    const int64_t index = picked_index[threadIdx.x];
    int rank = 0;
    for (int j = 0; j < k; ++j)
      rank += picked_key[j] > key || (picked_key[j] == key && picked_index[j] < index);
    const int64_t at = static_cast<int64_t>(blockIdx.x) * k + rank;
    values[at] = x[index];
    ids[at] = static_cast<int32_t>(index);
  }
}

__global__ void gather_kernel(const float* x, const int32_t* cols, float* out, int64_t rows, int64_t num_cols) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int32_t c = cols[r];
  out[r] = c >= 0 && c < num_cols ? x[r * num_cols + c] : __int_as_float(0x7fc00000);
}

// One block of 256 threads per row: each counts its strided share, then
// the block sums the counts.
__global__ void __launch_bounds__(256)
    rank_kernel(const float* x, const int32_t* cols, int32_t* out, int64_t num_cols) {
  const int64_t r = blockIdx.x;
  const int32_t c = cols[r];
  if (c < 0 || c >= num_cols) {
    if (threadIdx.x == 0) out[r] = 0;
    return;
  }
  const float* row = x + r * num_cols;
  const float at = row[c];
  int count = 0;
  for (int64_t j = threadIdx.x; j < num_cols; j += blockDim.x) count += row[j] > at ? 1 : 0;
  for (int offset = 16; offset > 0; offset /= 2)
    count += __shfl_down_sync(0xffffffffu, count, offset);
  __shared__ int warp_counts[8];
  if (threadIdx.x % 32 == 0) warp_counts[threadIdx.x / 32] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < 8; ++w) total += warp_counts[w];
    out[r] = 1 + total;
  }
}
__global__ void copy_indexed_kernel(const int32_t* src, const int32_t* src_index, int64_t src_len, int32_t* dst,
                                    const int32_t* dst_index, int64_t dst_len, int64_t count) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= count) return;
  const int32_t from = src_index[k], to = dst_index[k];
  if (from >= 0 && from < src_len && to >= 0 && to < dst_len) dst[to] = src[from];
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

cudaError_t sample(const float* logits, const SampleControls* controls, uint32_t* keys, float* weights,
                   int32_t* out, int64_t rows, int64_t cols, int mass_shift, cudaStream_t stream) {
  sample_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, controls, keys, weights, out, cols,
                                                                       mass_shift);
  return cudaGetLastError();
}

cudaError_t apply_token_bitmask(float* logits, const int32_t* bitmask, int64_t rows, int64_t cols,
                                cudaStream_t stream) {
  bitmask_kernel<<<blocks_for(rows * cols, 256), 256, 0, stream>>>(logits, bitmask, rows, cols);
  return cudaGetLastError();
}

cudaError_t adjust_logits(float* logits, const EditRecord* edits, int64_t count, int64_t cols,
                          cudaStream_t stream) {
  adjust_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(logits, edits, count, cols);
  return cudaGetLastError();
}

cudaError_t top_k_rows(const float* x, int64_t rows, int64_t cols, int k, float* values, int32_t* ids,
                       cudaStream_t stream) {
  top_k_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, k, values, ids);
  return cudaGetLastError();
}

cudaError_t gather_rows(const float* x, const int32_t* cols, float* out, int64_t rows, int64_t num_cols,
                        cudaStream_t stream) {
  gather_kernel<<<blocks_for(rows, 256), 256, 0, stream>>>(x, cols, out, rows, num_cols);
  return cudaGetLastError();
}

cudaError_t rank_rows(const float* x, const int32_t* cols, int32_t* out, int64_t rows,
                      int64_t num_cols, cudaStream_t stream) {
  rank_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, cols, out, num_cols);
  return cudaGetLastError();
}
cudaError_t copy_indexed(const int32_t* src, const int32_t* src_index, int64_t src_len, int32_t* dst,
                         const int32_t* dst_index, int64_t dst_len, int64_t count, cudaStream_t stream) {
  copy_indexed_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(src, src_index, src_len, dst, dst_index, dst_len,
                                                                   count);
  return cudaGetLastError();
}

}  // namespace basalt::cuda_kernels
