// Launchers of the multi-head latent attention kernels (mla_kernels.cu), with
// a plain interface: raw device pointers, element-type codes and sizes, so
// that the .cu file needs no host-library headers. mla.h is the checked API
// on top; call that instead.
//
// Contract: each launcher enqueues its kernels on `stream` and returns
// cudaGetLastError() (cudaSuccess when the launches were accepted). Sizes are
// trusted (the caller checked shapes, dtypes, placement and the limits below);
// slot and layout contents are not: a slot outside [0, num_slots) stores
// nothing (store), or gives NaN rows (expand, attention). Grids and split
// counts depend only on the sizes given here, never on device data, so every
// launch can be captured in a CUDA graph and replayed with new contents.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/elementwise_kernels.h"

namespace basalt::cuda_kernels {

// The tensor-core attention core's fixed dims (DeepSeek V2, V2-lite and V3):
// latent 512, rope 64. Other dims take the CUDA-core kernel.
inline constexpr int kMlaMmaLatent = 512;
inline constexpr int kMlaMmaRope = 64;
// The CUDA-core kernel keeps a row's latent sums in registers: L <= this.
inline constexpr int kMlaMaxLatent = 512;
inline constexpr int kMlaMaxSplits = 64;

// cache[slots[t]] = [rms_norm(kv_a[t, :L]) * norm | rope(kv_a[t, L:])];
// kv_a f32 [T, L + R]; norm `norm_elem` [L]; cache `cache` [num_slots, L + R].
cudaError_t mla_store(Elem norm_elem, Elem cache, const float* kv_a, const void* norm, float eps,
                      const int32_t* positions, const float* inv_freq, float rope_scaling, bool interleaved,
                      const int32_t* slots, void* cache_data, int64_t tokens, int latent, int rope,
                      int64_t num_slots, cudaStream_t stream);

// out bf16 [n, k] = fp8 e4m3 w [n, k] * scale_inv[n / 128, k / 128].
cudaError_t mla_dequant_fp8(const uint8_t* w, const float* scale_inv, void* out, int64_t n, int64_t k,
                            cudaStream_t stream);

// latent `out_elem` [S, L] = cache[slots[i], :L] (NaN rows for bad slots).
cudaError_t mla_gather_latent(Elem cache, Elem out_elem, const void* cache_data, const int32_t* slots, void* out,
                              int64_t count, int latent, int rope, int64_t num_slots, cudaStream_t stream);

// From kv f32 [S, heads, Dn + Dv] (the latent · kv_bᵀ product) and the cache:
// k [S, heads, Dn + R] = [kv[:Dn] | cache[slots[i], L:]], v [S, heads, Dv],
// both of type out_elem.
cudaError_t mla_split_kv(Elem cache, Elem out_elem, const void* cache_data, const int32_t* slots, const float* kv,
                         void* k, void* v, int64_t count, int heads, int latent, int rope, int nope, int v_dim,
                         int64_t num_slots, cudaStream_t stream);

// q_full[t, h, L + r] = q[t, h, Dn + r] for r < R (the rope part of the
// latent-space query), converted to q_full's type.
cudaError_t mla_copy_q_rope(Elem q_elem, Elem q_full_elem, const void* q, void* q_full, int64_t tokens, int heads,
                            int nope, int rope, int latent, cudaStream_t stream);

// The absorbed form's two per-head products for decode-sized batches (T <=
// kMlaSmallBatch), each one kernel reading a bf16 kv_b [heads * (Dn + Dv), L]
// once (cuBLAS's strided-batched GEMMs take several launches and ~3x the
// byte time there). Needs Dn, L and Dv multiples of 8 and a 16-byte aligned
// kv_b. Sums in f32 over the bf16 weights. A token's sums do not depend on
// the other tokens of the call; more than kMlaSmallBatch tokens run in
// blocks of 16 (what the batch-invariant mode takes for any T, when
// mla_absorb_any_batch_ok).
inline constexpr int kMlaSmallBatch = 16;
bool mla_small_batch_ok(int64_t tokens, int nope, int latent, int v_dim, const void* kv_b);
bool mla_absorb_any_batch_ok(int nope, int latent, int v_dim, const void* kv_b);
// q_full[t, h] = [q[t, h, :Dn] · W_uk(h) | q[t, h, Dn:]] (W_uk(h) = kv_b rows
// h (Dn + Dv) .. + Dn), converted to q_full's type; q f32 or bf16.
cudaError_t mla_absorb_q_small(Elem q_elem, Elem q_full_elem, const void* q, const void* kv_b, void* q_full,
                               int64_t tokens, int heads, int nope, int rope, int latent, int v_dim,
                               cudaStream_t stream);
// out[t, h, v] = o_lat[t, h, :] · W_uv(h)[v, :] (W_uv(h) = kv_b rows
// h (Dn + Dv) + Dn .. + Dv); o_lat f32 or bf16, out f32 or bf16.
cudaError_t mla_absorb_out_small(Elem o_lat_elem, Elem out_elem, const void* o_lat, const void* kv_b, void* out,
                                 int64_t tokens, int heads, int nope, int latent, int v_dim, cudaStream_t stream);

struct MlaAttentionShape {
  int64_t q_tokens = 0;
  int num_seqs = 0;
  int64_t kv_slots_len = 0;
  int64_t num_slots = 0;
  int heads = 0;
  int latent = 0;  // L: values are a row's first L features
  int rope = 0;    // R: keys are L + R wide
  float scale = 0.0f;
};

// Whether the tensor cores can serve this call (bf16 cache and q_full, L =
// 512, R = 64); the split counts below take the answer as `mma`.
bool mla_attention_uses_mma(Elem cache, Elem q_full, const MlaAttentionShape& shape);
// The attention core's kernels: CUDA cores (any dims, f32 q_full), mma.sync
// and wgmma (tensor cores, as above; wgmma on sm_90a only, kernel_caps.h).
enum class MlaCoreKernel : uint8_t { kCudaCores, kMmaSync, kWgmma };
// Key splits (1 .. kMlaMaxSplits) and row splits, from sizes only: the split
// rule (mla_splits_for_keys) at the average sequence's keys. With splits
// chosen per pass (mla_attention's `splits_by_pass`) the count is the
// launch's bound, which a pass's own count never passes at batch 1 (the one
// sequence holds every slot); in a batch, the passes of a sequence longer
// than the average are held to it. (A bound from the longest sequence a
// batch could hold, all slots but one per other sequence, made batch 128 x
// 4096 keys launch 17 splits of mostly idle blocks and their merge: 18%
// slower on an H100.)
int mla_attention_splits(const MlaAttentionShape& shape, bool mma);
// The same on `sms` multiprocessors (host arithmetic, for tests).
int mla_attention_splits_on(const MlaAttentionShape& shape, bool mma, int64_t sms);
int mla_attention_row_splits(const MlaAttentionShape& shape, bool mma);
// Row passes (of 64 rows on the tensor cores, 4 on the CUDA cores) a query
// token's heads fill.
int mla_attention_passes_per_token(int heads, bool mma);
// f32 scratch the split path needs (splits > 1).
int64_t mla_attention_scratch_floats(const MlaAttentionShape& shape, int splits);

// The key splits a row pass over `keys` keys takes when `base` passes run per
// split (sequences x passes per token) on `sms` multiprocessors. Tensor
// cores: one block per SM, so blocks run in waves of sms; a block costs about
// its keys plus a fixed ~192 keys' worth (the q tile, its partials, its share
// of the merge); the count with the least waves x block cost wins (the
// fewest on a tie), a split keeping at least 128 keys (4 tiles). Fitted
// to the H200 (the MLA bench's forced-split sweep, V3 dims over 4096 keys):
// batch 1 -> 32 splits (30.7 us, against 43.0 at the 16 of an earlier rule),
// batch 32 -> 2, batch 128 -> 1. CUDA cores: enough splits to fill the SMs,
// each at least 128 keys. Integer arithmetic only. Never decreasing in keys
// (a test sweeps it), so the count at a sequence's keys bounds that of each
// of its passes and the rule is a table of thresholds (MlaSplitTable); an
// earlier form that kept fewer splits unless one was 2 % cheaper was not
// monotone.
constexpr int mla_splits_for_keys(int64_t keys, int64_t base, int64_t sms, bool mma) {
  if (base < 1) base = 1;
  if (sms < 1) sms = 1;
  if (mma) {
    int best = 1;
    int64_t best_num = (base + sms - 1) / sms * (keys + 192), best_den = 1;  // cost = num / den
    for (int s = 2; s <= kMlaMaxSplits; ++s) {
      if (keys < int64_t{128} * s) break;
      const int64_t num = (base * s + sms - 1) / sms * (keys + int64_t{192} * s);
      if (num * best_den < best_num * s) best = s, best_num = num, best_den = s;
    }
    return best;
  }
  const int64_t to_fill = (sms + base - 1) / base, by_keys = keys / 128 > 1 ? keys / 128 : 1;
  const int64_t s = to_fill < by_keys ? to_fill : by_keys;
  return static_cast<int>(s < 1 ? 1 : s > kMlaMaxSplits ? kMlaMaxSplits : s);
}

// mla_splits_for_keys as a table, so that a pass looks its count up rather
// than running the rule's loop (its 64-bit divisions) in every block:
// min_keys[s - 1] is the least key count at which the rule reaches s + 1
// splits (INT32_MAX where it never does below 2^31 keys). Built once per
// (base, sms, mma) and cached (mla_split_table).
struct MlaSplitTable {
  int32_t min_keys[kMlaMaxSplits - 1];
};
MlaSplitTable mla_split_table(int64_t base, int64_t sms, bool mma);
// min(bound, mla_splits_for_keys(keys, base, sms, mma)) from the table of
// (base, sms, mma): exact because the rule never falls as keys grow. A binary
// search (six steps at most) over the thresholds below the bound.
constexpr int mla_pass_splits(const MlaSplitTable& table, int64_t keys, int bound) {
  int lo = 1, hi = bound < kMlaMaxSplits ? bound : kMlaMaxSplits;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (keys >= table.min_keys[mid - 2]) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// o_lat `o_elem` [T, heads, L] = softmax(q_full · cacheᵀ * scale) · cache[:, :L]
// per (token, head), causal over the layout (attention.h's semantics; rows
// at negative positions are 0). q_full `q_elem` [T, heads, L + R]. With
// splits > 1, scratch holds mla_attention_scratch_floats floats.
//
// splits_by_pass false: every row pass cuts its keys into `splits` parts.
// True: a pass over keys [0, hi) takes min(splits, mla_splits_for_keys(hi,
// num_seqs x passes per token, SMs, tensor cores)) -- the count a decode
// step at that position takes -- so where a pass holds one query token's
// rows (heads a multiple of the pass's rows: V3's 128 heads on the tensor
// cores, any head count a multiple of 4 on the CUDA cores), a row of a
// multi-token call (a speculative verification) is summed over the same
// key ranges, in the same order, as the one-token decode step it stands for,
// and gives its bits.
cudaError_t mla_attention(Elem q_elem, Elem cache, Elem o_elem, const void* q_full, const void* cache_data,
                          const int32_t* q_start, const int32_t* kv_start, const int32_t* kv_slots,
                          const MlaAttentionShape& shape, int splits, bool splits_by_pass, int row_splits,
                          MlaCoreKernel kernel, float* scratch, void* o_lat, cudaStream_t stream);

}  // namespace basalt::cuda_kernels
