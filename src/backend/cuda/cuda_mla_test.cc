// CudaBackend's MLA ops (mla_store_kv, mla_attention, mla_expand_kv) against
// the CPU backend on random inputs: 1, 16 and 128 heads; DeepSeek-V3 dims
// (L 512, R 64, Dn 128, Dv 128: the tensor-core attention core under a bf16
// cache) and odd small dims (L 40, R 8, Dn 12, Dv 20: the CUDA-core core);
// bf16 and f32 caches; bf16, f32 and block-FP8 kv_b; one mixed batch per
// case (decodes over 0..600 keys, a prefill, an extend, a padding sequence
// with q_len > kv_len and slot -1, a sequence without queries, unused
// kv_slots entries), with the automatic and a forced split count, and the
// CUDA-core path forced at V3 dims. Also: a recorded graph replayed with new
// layout contents, absorbed vs expanded + attention on the device, and the
// limits. Outputs are poisoned before each call. Errors are ||gpu - cpu|| /
// ||cpu||: 2e-4 where everything is f32, 2e-2 where q, P or the latent
// output are rounded to bf16. Skips where no device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/mla.h"
#include "backend/cuda/mla_kernels.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::random_tensor;
using testing::relative_error;
using testing::TestRng;

#define REQUIRE_DEVICE() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

struct Dims {
  const char* name;
  int64_t L, R, Dn, Dv;
};
constexpr Dims kV3{"v3", 512, 64, 128, 128};
constexpr Dims kOdd{"odd", 40, 8, 12, 20};
constexpr Dims kMini{"mini", 64, 16, 32, 32};  // the bundled model's: the CUDA-core core, the one-kernel absorptions

enum class KvB { kBF16, kF32, kFP8 };
const char* kvb_name(KvB k) { return k == KvB::kBF16 ? "bf16" : k == KvB::kF32 ? "f32" : "fp8"; }

int64_t blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

LinearWeight make_kv_b(TestRng& rng, KvB kind, int64_t n, int64_t k) {
  if (kind == KvB::kFP8) {
    LinearWeight w;
    w.weight = random_tensor(rng, {n, k}, DType::kF8E4M3, 2.0f);
    w.scale_inv = Tensor::empty({blocks(n), blocks(k)}, DType::kF32);
    for (int64_t i = 0; i < w.scale_inv.numel(); ++i) w.scale_inv.data<float>()[i] = rng.uniform(0.002f, 0.03f);
    return w;
  }
  return LinearWeight{random_tensor(rng, {n, k}, kind == KvB::kBF16 ? DType::kBF16 : DType::kF32,
                                    0.5f / std::sqrt(static_cast<float>(k))),
                      Tensor()};
}

Tensor to_bf16(const Tensor& f32) {
  Tensor t = Tensor::empty(f32.shape(), DType::kBF16);
  for (int64_t i = 0; i < t.numel(); ++i) testing::store_value(t, i, f32.data<const float>()[i]);
  return t;
}

LinearWeight to_device(const LinearWeight& w) {
  return LinearWeight{cuda_to_device(w.weight), w.scale_inv.raw() ? cuda_to_device(w.scale_inv) : Tensor()};
}

struct Rope {
  Tensor inv_freq;
  RopeParams params;
};

Rope make_rope(int64_t R, const Tensor* device_inv) {
  std::vector<float> inv(static_cast<size_t>(R / 2));
  for (int64_t i = 0; i < R / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(R));
  Rope r;
  r.inv_freq = Tensor::from_f32({R / 2}, inv);
  r.params = RopeParams{1, static_cast<int>(R), static_cast<int>(R), RopeStyle::kInterleaved,
                        device_inv ? device_inv : &r.inv_freq, 1.1f, 0};
  return r;
}

// One mixed batch: (q_len, kv_len) per sequence over a shuffled slot pool.
struct Batch {
  std::vector<int32_t> q_start{0}, kv_start{0}, kv_slots;
  int64_t tokens = 0;
};

Batch make_batch(TestRng& rng, const std::vector<std::pair<int, int>>& seqs, int64_t num_slots, int extra_slots) {
  Batch b;
  std::vector<int32_t> pool(static_cast<size_t>(num_slots));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng.engine());
  size_t next = 0;
  for (auto [q_len, kv_len] : seqs) {
    b.q_start.push_back(b.q_start.back() + q_len);
    b.kv_start.push_back(b.kv_start.back() + kv_len);
    for (int j = 0; j < kv_len; ++j) b.kv_slots.push_back(pool[next++ % pool.size()]);
  }
  for (int i = 0; i < extra_slots; ++i) b.kv_slots.push_back(-7);  // never read
  b.tokens = b.q_start.back();
  return b;
}

AttentionLayout host_layout(const Batch& b) {
  return AttentionLayout{testing::i32_tensor(b.q_start), testing::i32_tensor(b.kv_start),
                         testing::i32_tensor(b.kv_slots)};
}
AttentionLayout device_layout(const AttentionLayout& l) {
  return AttentionLayout{cuda_to_device(l.q_start), cuda_to_device(l.kv_start), cuda_to_device(l.kv_slots)};
}
// The CPU backend checks every slot up to kv_start[num_seqs]; it never reads the rest.
AttentionLayout cpu_layout(const Batch& b) {
  Batch c = b;
  c.kv_slots.resize(static_cast<size_t>(b.kv_start.back()));
  return host_layout(c);
}

const std::vector<std::pair<int, int>> kMixed = {
    {1, 600}, {1, 1}, {20, 20}, {1, 0} /* padding */, {5, 300}, {0, 7}, {1, 129}, {3, 2} /* q_len > kv_len */};

MlaParams params_for(const Dims& d, int64_t heads) {
  return MlaParams{static_cast<int>(heads), static_cast<int>(d.L), static_cast<int>(d.Dn), static_cast<int>(d.R),
                   static_cast<int>(d.Dv), 0.3f};
}

// A cache filled with random rows (both backends get the same contents).
Tensor random_cache(TestRng& rng, int64_t slots, int64_t width, DType dtype) {
  return random_tensor(rng, {slots, width}, dtype, 0.5f);
}

TEST(CudaMla, StoreKvMatchesCpuBackend) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  CpuBackend cpu;
  for (const Dims& d : {kV3, kOdd}) {
    for (DType cache_dtype : {DType::kBF16, DType::kF32}) {
      for (DType norm_dtype : {DType::kBF16, DType::kF32}) {
        const int64_t T = 37, S = 64, W = d.L + d.R;
        const Tensor kv_a = random_tensor(rng, {T, W}, DType::kF32, 2.0f);
        const Tensor norm = random_tensor(rng, {d.L}, norm_dtype, 0.3f);
        std::vector<int32_t> slots(static_cast<size_t>(T)), positions(static_cast<size_t>(T));
        std::vector<int32_t> pool(static_cast<size_t>(S));
        std::iota(pool.begin(), pool.end(), 0);
        std::shuffle(pool.begin(), pool.end(), rng.engine());
        for (int64_t t = 0; t < T; ++t) {
          slots[t] = t % 5 == 3 ? -1 : pool[t];  // some padding tokens
          positions[t] = static_cast<int32_t>(rng.integer(0, 70000));
        }
        Tensor want = random_cache(rng, S, W, cache_dtype);
        Tensor got = cuda_to_device(want);
        Rope host_rope = make_rope(d.R, nullptr);
        cpu.mla_store_kv(kv_a, norm, 1e-6f, testing::i32_tensor(positions), host_rope.params,
                         testing::i32_tensor(slots), want);
        const Tensor d_inv = cuda_to_device(host_rope.inv_freq);
        Rope dev_rope = make_rope(d.R, &d_inv);
        cuda.mla_store_kv(cuda_to_device(kv_a), cuda_to_device(norm), 1e-6f,
                          cuda_to_device(testing::i32_tensor(positions)), dev_rope.params,
                          cuda_to_device(testing::i32_tensor(slots)), got);
        cuda.synchronize();
        const Tensor host = cuda_to_host(got);
        // Untouched rows keep their bits; written rows agree to rounding.
        EXPECT_LT(relative_error(host, want), cache_dtype == DType::kF32 ? 1e-5 : 4e-3)
            << d.name << " cache " << dtype_name(cache_dtype) << " norm " << dtype_name(norm_dtype);
        for (int64_t t = 0; t < T; ++t)
          if (slots[t] < 0) {
            const Tensor a = host.rows(pool[t], 1), b = want.rows(pool[t], 1);
            EXPECT_TRUE(testing::bytes_equal(a, b)) << "padding token " << t << " wrote slot " << pool[t];
          }
      }
    }
  }
}

struct AttentionCase {
  Dims dims;
  int64_t heads;
  DType cache_dtype;
  KvB kv_b;
};

double attention_tolerance(const AttentionCase& c) {
  return c.cache_dtype == DType::kF32 && c.kv_b == KvB::kF32 ? 2e-4 : 2e-2;
}

TEST(CudaMla, AttentionMatchesCpuBackend) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  CpuBackend cpu;
  std::vector<AttentionCase> cases;
  for (const Dims& d : {kV3, kOdd})
    for (int64_t heads : {1, 16, 128})
      for (DType cache_dtype : {DType::kBF16, DType::kF32})
        for (KvB kv_b : {KvB::kBF16, KvB::kFP8, KvB::kF32}) cases.push_back({d, heads, cache_dtype, kv_b});
  for (const AttentionCase& c : cases) {
    const Dims& d = c.dims;
    const MlaParams p = params_for(d, c.heads);
    const int64_t S = 700, W = d.L + d.R;
    const Batch batch = make_batch(rng, kMixed, S, 9);
    const Tensor cache = random_cache(rng, S, W, c.cache_dtype);
    const LinearWeight kv_b = make_kv_b(rng, c.kv_b, c.heads * (d.Dn + d.Dv), d.L);
    const Tensor q = random_tensor(rng, {batch.tokens, c.heads * (d.Dn + d.R)}, DType::kF32);
    Tensor want = testing::poisoned({batch.tokens, c.heads * d.Dv});
    cpu.mla_attention(q, cache, kv_b, cpu_layout(batch), p, want);

    const Tensor d_cache = cuda_to_device(cache);
    const LinearWeight d_kv_b = to_device(kv_b);
    const AttentionLayout layout = device_layout(host_layout(batch));
    for (DType q_dtype : {DType::kF32, DType::kBF16}) {
      if (q_dtype == DType::kBF16 && c.heads != 16) continue;  // one q-dtype sweep is enough
      Tensor d_q = cuda_to_device(q_dtype == DType::kF32 ? q : to_bf16(q));
      Tensor out = cuda_empty({batch.tokens, c.heads * d.Dv}, DType::kF32);
      cuda_fill_bytes(out, 0xFF);
      cuda.mla_attention(d_q, d_cache, d_kv_b, layout, p, out);
      cuda.synchronize();
      const Tensor got = cuda_to_host(out);
      EXPECT_EQ(testing::count_nan(got), 0);
      const double tol = q_dtype == DType::kBF16 ? 2e-2 : attention_tolerance(c);
      EXPECT_LT(relative_error(got, want), tol) << d.name << " heads " << c.heads << " cache "
                                                << dtype_name(c.cache_dtype) << " kv_b " << kvb_name(c.kv_b)
                                                << " q " << dtype_name(q_dtype);
      // Padding rows (negative positions) are exactly zero.
      for (size_t s = 0; s + 1 < batch.q_start.size(); ++s) {
        const int q_len = batch.q_start[s + 1] - batch.q_start[s], kv_len = batch.kv_start[s + 1] - batch.kv_start[s];
        for (int i = 0; i < q_len; ++i) {
          if (kv_len - q_len + i >= 0) continue;
          for (int64_t e = 0; e < c.heads * d.Dv; ++e) {
            ASSERT_EQ(got.data<const float>()[(batch.q_start[s] + i) * c.heads * d.Dv + e], 0.0f)
                << "padding row " << batch.q_start[s] + i;
          }
        }
      }
    }
  }
}

// Decode-sized batches (T <= 16) over a bf16 or FP8 kv_b take the
// one-kernel absorptions (mla_kernels.h, mla_absorb_*_small): V3 dims and a
// small shape with dims that are multiples of 8, q f32 and bf16, out f32 and
// bf16, 1 to 16 query rows (padding rows included), against the CPU backend.
TEST(CudaMla, SmallBatchAbsorptionsMatchCpuBackend) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  CpuBackend cpu;
  constexpr Dims kEven{"even", 64, 16, 32, 24};
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{1, 300}},
      {{1, 600}, {1, 0} /* padding */, {1, 129}},
      {{2, 40}, {1, 1}, {1, 77}, {3, 3}, {1, 200}, {1, 50}, {2, 90}, {1, 9}, {1, 31}, {1, 64}, {1, 0}, {1, 5}}};
  for (const Dims& d : {kV3, kEven})
    for (int64_t heads : {1, 16, 128})
      for (KvB kind : {KvB::kBF16, KvB::kFP8})
        for (const auto& seqs : batches) {
          const MlaParams p = params_for(d, heads);
          const int64_t S = 700, W = d.L + d.R;
          const Batch batch = make_batch(rng, seqs, S, 2);
          ASSERT_LE(batch.tokens, 16);
          const Tensor cache = random_cache(rng, S, W, DType::kBF16);
          const LinearWeight kv_b = make_kv_b(rng, kind, heads * (d.Dn + d.Dv), d.L);
          const Tensor q = random_tensor(rng, {batch.tokens, heads * (d.Dn + d.R)}, DType::kF32);
          Tensor want = testing::poisoned({batch.tokens, heads * d.Dv});
          cpu.mla_attention(q, cache, kv_b, cpu_layout(batch), p, want);
          const Tensor d_cache = cuda_to_device(cache);
          const LinearWeight d_kv_b = to_device(kv_b);
          const AttentionLayout layout = device_layout(host_layout(batch));
          for (DType q_dtype : {DType::kF32, DType::kBF16})
            for (DType out_dtype : {DType::kF32, DType::kBF16}) {
              Tensor out = cuda_empty({batch.tokens, heads * d.Dv}, out_dtype);
              cuda_fill_bytes(out, 0xFF);
              cuda.mla_attention(cuda_to_device(q_dtype == DType::kF32 ? q : to_bf16(q)), d_cache, d_kv_b, layout, p,
                                 out);
              cuda.synchronize();
              const Tensor got = cuda_to_host(out).to_f32();
              EXPECT_EQ(testing::count_nan(got), 0);
              EXPECT_LT(relative_error(got, want), 2e-2)
                  << d.name << " heads " << heads << " kv_b " << kvb_name(kind) << " tokens " << batch.tokens
                  << " q " << dtype_name(q_dtype) << " out " << dtype_name(out_dtype);
            }
        }
}

// The split path and the CUDA-core path at V3 dims, against the CPU backend.
TEST(CudaMla, ForcedSplitsAndPathsMatchCpuBackend) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;  // for the stream only
  CpuBackend cpu;
  CudaMla mla(cuda.stream());
  for (const Dims& d : {kV3, kOdd}) {
    for (DType cache_dtype : {DType::kBF16, DType::kF32}) {
      const int64_t heads = 16, S = 700, W = d.L + d.R;
      const MlaParams p = params_for(d, heads);
      const Batch batch = make_batch(rng, kMixed, S, 3);
      const Tensor cache = random_cache(rng, S, W, cache_dtype);
      const LinearWeight kv_b = make_kv_b(rng, KvB::kBF16, heads * (d.Dn + d.Dv), d.L);
      const Tensor q = random_tensor(rng, {batch.tokens, heads * (d.Dn + d.R)}, DType::kF32);
      Tensor want = testing::poisoned({batch.tokens, heads * d.Dv});
      cpu.mla_attention(q, cache, kv_b, cpu_layout(batch), p, want);
      const Tensor d_cache = cuda_to_device(cache), d_q = cuda_to_device(q);
      const LinearWeight d_kv_b = to_device(kv_b);
      const AttentionLayout layout = device_layout(host_layout(batch));
      for (CudaMlaPath path : {CudaMlaPath::kAuto, CudaMlaPath::kMmaSync, CudaMlaPath::kCudaCores})
        for (int splits : {1, 3, 64}) {
          Tensor out = cuda_empty({batch.tokens, heads * d.Dv}, DType::kF32);
          cuda_fill_bytes(out, 0xFF);
          mla.attention(d_q, d_cache, d_kv_b, layout, p, out, path, splits);
          cuda.synchronize();
          EXPECT_LT(relative_error(cuda_to_host(out), want), 2e-2)
              << d.name << " cache " << dtype_name(cache_dtype) << " path " << static_cast<int>(path) << " splits "
              << splits;
        }
    }
  }
}

// The batch-invariant mode (set_row_invariant): each row of a call gives the
// bits a one-row call on it gives, whatever else the call holds (decodes, a
// verification's rows, a prompt past the small-batch kernels' 16 tokens):
// the absorptions at every T, the core unsplit. V3 dims (the tensor-core
// core) and the bundled model's (L 64, R 16, Dn 32, Dv 32: the CUDA-core
// core); bf16 and FP8 kv_b; and still right against the CPU backend.
TEST(CudaMla, RowInvariantRowsAreWhatOneRowCallsGive) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;  // for the stream only
  CpuBackend cpu;
  CudaMla mla(cuda.stream());
  mla.set_row_invariant(true);
  constexpr Dims kMini{"mini", 64, 16, 32, 32};
  const std::vector<std::pair<int, int>> seqs = {{1, 300}, {5, 700}, {40, 40}, {3, 1500}};
  for (const Dims& d : {kV3, kMini})
    for (KvB kind : {KvB::kBF16, KvB::kFP8}) {
      const int64_t heads = 16, S = 2600, W = d.L + d.R;
      const MlaParams p = params_for(d, heads);
      const Batch batch = make_batch(rng, seqs, S, 0);
      const Tensor cache = random_cache(rng, S, W, DType::kBF16);
      const LinearWeight kv_b = make_kv_b(rng, kind, heads * (d.Dn + d.Dv), d.L);
      const Tensor q = random_tensor(rng, {batch.tokens, heads * (d.Dn + d.R)}, DType::kF32);
      const Tensor d_cache = cuda_to_device(cache), d_q = cuda_to_device(q);
      const LinearWeight d_kv_b = to_device(kv_b);
      Tensor out = cuda_empty({batch.tokens, heads * d.Dv}, DType::kF32);
      cuda_fill_bytes(out, 0xFF);
      mla.attention(d_q, d_cache, d_kv_b, device_layout(host_layout(batch)), p, out, CudaMlaPath::kAuto, 7);
      const Tensor all = cuda_to_host(out);
      Tensor want = testing::poisoned({batch.tokens, heads * d.Dv});
      cpu.mla_attention(q, cache, kv_b, cpu_layout(batch), p, want);
      EXPECT_LT(relative_error(all, want), kind == KvB::kFP8 ? 3e-2 : 2e-2) << d.name << " " << kvb_name(kind);
      const int64_t width = heads * d.Dv;
      for (size_t s = 0; s < seqs.size(); ++s)
        for (int i = 0; i < seqs[s].first; ++i) {
          if (s == 2 && i % 13 != 0 && i != seqs[s].first - 1) continue;
          const int keys = seqs[s].second - seqs[s].first + i + 1;
          Batch one;
          one.q_start = {0, 1};
          one.kv_start = {0, keys};
          one.kv_slots.assign(batch.kv_slots.begin() + batch.kv_start[s],
                              batch.kv_slots.begin() + batch.kv_start[s] + keys);
          const int64_t token = batch.q_start[s] + i;
          Tensor single = cuda_empty({1, width}, DType::kF32);
          cuda_fill_bytes(single, 0xFF);
          mla.attention(d_q.rows(token, 1), d_cache, d_kv_b, device_layout(host_layout(one)), p, single);
          const Tensor got = cuda_to_host(single);
          EXPECT_EQ(std::memcmp(got.raw(), all.data<const float>() + token * width,
                                static_cast<size_t>(width) * sizeof(float)),
                    0)
              << d.name << " " << kvb_name(kind) << ": sequence " << s << " row " << i;
        }
    }
  // Dims off the kernels' 8-element grid have no batch-invariant form.
  const MlaParams odd = params_for(kOdd, 2);
  const Batch batch = make_batch(rng, {{1, 5}}, 8, 0);
  Tensor out = cuda_empty({1, 2 * kOdd.Dv}, DType::kF32);
  EXPECT_THROW(mla.attention(cuda_to_device(random_tensor(rng, {1, 2 * (kOdd.Dn + kOdd.R)}, DType::kF32)),
                             cuda_to_device(random_cache(rng, 8, kOdd.L + kOdd.R, DType::kBF16)),
                             to_device(make_kv_b(rng, KvB::kBF16, 2 * (kOdd.Dn + kOdd.Dv), kOdd.L)),
                             device_layout(host_layout(batch)), odd, out),
               Error);
}

// The wgmma core (sm_90a) against the mma.sync core on the same bf16 q_full
// and cache. Both round q and P to bf16 and sum in f32, so they differ by
// the rounding of P under different running maxima (64- against 32-key
// tiles). Cases: 1, 16 and 128 heads (one partial row pass, one, two);
// the mixed batch and verification-sized rows over partial and whole
// 64-key tiles (up to 4,100 keys); automatic, 1 and 3 key splits; f32 and
// bf16 outputs. Then a slot outside the cache: that sequence's rows are NaN
// in both kernels, the other sequence's are not.
TEST(CudaMla, WgmmaCoreMatchesMmaSyncCore) {
  REQUIRE_DEVICE();
  if (!cuda_kernels::wgmma_available()) GTEST_SKIP() << "the wgmma kernel needs sm_90a";
  TestRng rng;
  CudaBackend cuda;
  CudaMla mla(cuda.stream());
  const Dims d = kV3;
  const int64_t S = 5000, W = d.L + d.R;
  const std::vector<std::pair<int, int>> verify = {{3, 1000}, {5, 64}, {2, 65}, {4, 4100}, {1, 1}, {2, 128}};
  const auto run = [&](const Tensor& q_full, const Tensor& cache, const AttentionLayout& layout, const MlaParams& p,
                       CudaMlaPath path, int splits, DType out_dtype) {
    Tensor out = cuda_empty({q_full.dim(0), p.num_heads * d.L}, out_dtype);
    cuda_fill_bytes(out, 0xFF);
    mla.attention_core(q_full, cache, layout, p, out, path, splits);
    cuda.synchronize();
    return cuda_to_host(out).to_f32();
  };
  const Tensor cache = cuda_to_device(random_cache(rng, S, W, DType::kBF16));
  for (int64_t heads : {1, 16, 128})
    for (const auto* seqs : {&kMixed, &verify})
      for (DType out_dtype : {DType::kF32, DType::kBF16}) {
        const MlaParams p = params_for(d, heads);
        const Batch batch = make_batch(rng, *seqs, S, 3);
        const Tensor q_full = cuda_to_device(random_tensor(rng, {batch.tokens, heads * W}, DType::kBF16, 0.3f));
        const AttentionLayout layout = device_layout(host_layout(batch));
        for (int splits : {0, 1, 3}) {
          const Tensor want = run(q_full, cache, layout, p, CudaMlaPath::kMmaSync, splits, out_dtype);
          const Tensor got = run(q_full, cache, layout, p, CudaMlaPath::kAuto, splits, out_dtype);
          EXPECT_EQ(testing::count_nan(got), 0);
          EXPECT_LT(relative_error(got, want), 4e-3)
              << "heads " << heads << (seqs == &kMixed ? " mixed" : " verify") << " splits " << splits << " out "
              << dtype_name(out_dtype);
        }
      }
  const int64_t heads = 16;
  const MlaParams p = params_for(d, heads);
  Batch batch = make_batch(rng, {{1, 300}, {2, 200}}, S, 0);
  batch.kv_slots[150] = static_cast<int32_t>(S + 5);
  const Tensor q_full = cuda_to_device(random_tensor(rng, {batch.tokens, heads * W}, DType::kBF16, 0.3f));
  const AttentionLayout layout = device_layout(host_layout(batch));
  for (CudaMlaPath path : {CudaMlaPath::kAuto, CudaMlaPath::kMmaSync})
    for (int splits : {0, 1, 3}) {
      const Tensor got = run(q_full, cache, layout, p, path, splits, DType::kF32);
      const int64_t row = heads * d.L;
      for (int64_t e = 0; e < got.numel(); ++e) {
        const bool bad_seq = e < row;  // sequence 0 is token 0
        ASSERT_EQ(std::isnan(got.data<const float>()[e]), bad_seq)
            << "path " << static_cast<int>(path) << " splits " << splits << " element " << e;
      }
    }
}

TEST(CudaMla, ExpandKvMatchesCpuBackend) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  CpuBackend cpu;
  for (const Dims& d : {kV3, kOdd})
    for (int64_t heads : {1, 16, 128})
      for (DType cache_dtype : {DType::kBF16, DType::kF32})
        for (KvB kind : {KvB::kBF16, KvB::kFP8, KvB::kF32})
          for (DType out_dtype : {DType::kF32, DType::kBF16}) {
          const int64_t S = 300, n = 213, W = d.L + d.R;
          const MlaParams p = params_for(d, heads);
          const Tensor cache = random_cache(rng, S, W, cache_dtype);
          const LinearWeight kv_b = make_kv_b(rng, kind, heads * (d.Dn + d.Dv), d.L);
          std::vector<int32_t> slots(static_cast<size_t>(n));
          for (auto& s : slots) s = static_cast<int32_t>(rng.integer(0, S - 1));
          Tensor k_want = testing::poisoned({n, heads * (d.Dn + d.R)}), v_want = testing::poisoned({n, heads * d.Dv});
          cpu.mla_expand_kv(cache, testing::i32_tensor(slots), kv_b, p, k_want, v_want);
          Tensor k = cuda_empty(k_want.shape(), out_dtype), v = cuda_empty(v_want.shape(), out_dtype);
          cuda_fill_bytes(k, 0xFF);
          cuda_fill_bytes(v, 0xFF);
          cuda.mla_expand_kv(cuda_to_device(cache), cuda_to_device(testing::i32_tensor(slots)), to_device(kv_b), p, k,
                             v);
          cuda.synchronize();
          // f32 caches under bf16/FP8 kv_b are rounded to bf16 for the GEMM,
          // and an FP8 kv_b is dequantized to bf16 (weight * scale rounded);
          // bf16 outputs are rounded once more.
          const double tol = out_dtype == DType::kBF16                                  ? 1e-2
                             : kind == KvB::kBF16 && cache_dtype == DType::kBF16 ? 1e-5
                             : kind == KvB::kF32                                ? 1e-5
                                                                                : 1e-2;
          EXPECT_LT(relative_error(cuda_to_host(k), k_want), tol)
              << d.name << " heads " << heads << " " << dtype_name(cache_dtype) << " " << kvb_name(kind);
          EXPECT_LT(relative_error(cuda_to_host(v), v_want), tol)
              << d.name << " heads " << heads << " " << dtype_name(cache_dtype) << " " << kvb_name(kind);
          }
  Tensor k16 = cuda_empty({4, kV3.Dn + kV3.R}, DType::kBF16), v32 = cuda_empty({4, kV3.Dv}, DType::kF32);
  EXPECT_THROW(cuda.mla_expand_kv(cuda_empty({8, kV3.L + kV3.R}, DType::kBF16),
                                  cuda_to_device(testing::i32_tensor({0, 1, 2, 3})),
                                  to_device(make_kv_b(rng, KvB::kBF16, kV3.Dn + kV3.Dv, kV3.L)), params_for(kV3, 1), k16,
                                  v32),
               Error);
}

// The two forms agree on the device: mla_attention vs mla_expand_kv + attention.
TEST(CudaMla, AbsorbedMatchesExpandedOnDevice) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  for (KvB kind : {KvB::kFP8, KvB::kBF16}) {
    const Dims d = kV3;
    const int64_t heads = 128, S = 700, W = d.L + d.R;
    const MlaParams p = params_for(d, heads);
    const Batch batch = make_batch(rng, kMixed, S, 0);
    const Tensor cache = cuda_to_device(random_cache(rng, S, W, DType::kBF16));
    const LinearWeight kv_b = to_device(make_kv_b(rng, kind, heads * (d.Dn + d.Dv), d.L));
    const Tensor q = cuda_to_device(random_tensor(rng, {batch.tokens, heads * (d.Dn + d.R)}, DType::kF32));
    const AttentionLayout layout = device_layout(host_layout(batch));
    Tensor absorbed = cuda_empty({batch.tokens, heads * d.Dv}, DType::kF32);
    cuda.mla_attention(q, cache, kv_b, layout, p, absorbed);
    const int64_t n = static_cast<int64_t>(batch.kv_slots.size());
    Tensor k = cuda_empty({n, heads * (d.Dn + d.R)}, DType::kF32), v = cuda_empty({n, heads * d.Dv}, DType::kF32);
    cuda.mla_expand_kv(cache, layout.kv_slots, kv_b, p, k, v);
    std::vector<int32_t> iota(static_cast<size_t>(n));
    std::iota(iota.begin(), iota.end(), 0);
    const AttentionLayout dense{layout.q_start, layout.kv_start, cuda_to_device(testing::i32_tensor(iota))};
    Tensor expanded = cuda_empty({batch.tokens, heads * d.Dv}, DType::kF32);
    cuda.attention(q, k, v, dense,
                   AttentionParams{static_cast<int>(heads), static_cast<int>(heads), static_cast<int>(d.Dn + d.R),
                                   static_cast<int>(d.Dv), p.scale, 0},
                   expanded);
    cuda.synchronize();
    EXPECT_LT(relative_error(cuda_to_host(absorbed), cuda_to_host(expanded)), 3e-2) << kvb_name(kind);
  }
}

// The per-pass split rule bounds every pass of a call by its count at the
// call's most keys (mla_attention_splits) and is looked up as a table of
// thresholds, both of which hold only if the count never falls as keys grow.
// Host arithmetic; no device needed.
TEST(CudaMla, SplitCountNeverFallsAsKeysGrow) {
  for (const bool mma : {true, false})
    for (const int64_t sms : {78, 114, 132, 144})
      for (int64_t base = 1; base <= 300; base += base < 70 ? 1 : 23) {
        int previous = 1;
        for (int64_t keys = 0; keys <= 40000; keys += 7) {
          const int s = cuda_kernels::mla_splits_for_keys(keys, base, sms, mma);
          ASSERT_GE(s, previous) << "mma " << mma << " sms " << sms << " base " << base << " keys " << keys;
          ASSERT_LE(s, cuda_kernels::kMlaMaxSplits);
          previous = s;
        }
      }
  // The table the kernels look a pass's count up in gives the rule's count
  // under any bound.
  for (const bool mma : {true, false})
    for (const int64_t base : {1, 2, 7, 64, 256}) {
      const cuda_kernels::MlaSplitTable table = cuda_kernels::mla_split_table(base, 132, mma);
      for (int64_t keys = 0; keys <= 40000; keys += 13)
        for (const int bound : {1, 5, cuda_kernels::kMlaMaxSplits}) {
          ASSERT_EQ(cuda_kernels::mla_pass_splits(table, keys, bound),
                    std::min(bound, cuda_kernels::mla_splits_for_keys(keys, base, 132, mma)))
              << "mma " << mma << " base " << base << " keys " << keys << " bound " << bound;
        }
    }
  // What it was fitted to (V3 on the H200's 132 SMs, 4096 keys, two passes a
  // token): 32 splits at batch 1, 2 at batch 32, 1 at batch 128.
  EXPECT_EQ(cuda_kernels::mla_splits_for_keys(4096, 2, 132, true), 32);
  EXPECT_EQ(cuda_kernels::mla_splits_for_keys(4096, 64, 132, true), 2);
  EXPECT_EQ(cuda_kernels::mla_splits_for_keys(4096, 256, 132, true), 1);
  // A launch's bound comes from the average sequence: at batch 128 x 4096
  // keys one split, not the many a sequence holding nearly all 512K slots
  // would take (a bound from that launched mostly idle blocks and a merge).
  for (const int64_t seqs : {1, 32, 128}) {
    cuda_kernels::MlaAttentionShape shape;
    shape.q_tokens = seqs;
    shape.num_seqs = static_cast<int>(seqs);
    shape.kv_slots_len = seqs * 4096;
    shape.heads = 128;
    shape.latent = 512;
    shape.rope = 64;
    EXPECT_EQ(cuda_kernels::mla_attention_splits_on(shape, true, 132), seqs == 1 ? 32 : seqs == 32 ? 2 : 1)
        << seqs << " sequences";
  }
}

// A speculative verification computes a request's last token and its drafts
// as T query rows of one call over keys [0, p + T); the decode steps they
// stand for compute each as one row over keys [0, p + i + 1). Each row of
// the call must be the bits of its decode step, also where the split count
// a decode step takes changes inside the call's span (every 128 keys at
// batch 1): p + 1 .. p + T straddles 1024 and 4096 keys on the tensor cores
// (V3 dims, 128 heads: two passes of 64 rows a token) and 256 on the CUDA
// cores (the bundled model's dims, 8 and 16 heads: passes of 4 rows). Dims
// the one-kernel absorptions take (multiples of 8): cuBLAS's batched GEMMs,
// which serve the others, pick their algorithm by the call's size.
TEST(CudaMla, VerificationRowsAreTheDecodeStepsBits) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  struct Case {
    Dims d;
    int64_t heads, p, T;
  };
  for (const Case& c : {Case{kV3, 128, 1020, 6}, Case{kV3, 128, 4093, 5}, Case{kMini, 8, 253, 5},
                        Case{kMini, 16, 250, 8}}) {
    const Dims d = c.d;
    const int64_t W = d.L + d.R, S = c.p + c.T + 16;
    const MlaParams p = params_for(d, c.heads);
    const Batch batch = make_batch(rng, {{static_cast<int>(c.T), static_cast<int>(c.p + c.T)}}, S, 0);
    const Tensor cache = cuda_to_device(random_cache(rng, S, W, DType::kBF16));
    const LinearWeight kv_b = to_device(make_kv_b(rng, KvB::kBF16, c.heads * (d.Dn + d.Dv), d.L));
    const Tensor q = random_tensor(rng, {c.T, c.heads * (d.Dn + d.R)}, DType::kF32);
    Tensor all = cuda_empty({c.T, c.heads * d.Dv}, DType::kF32);
    cuda.mla_attention(cuda_to_device(q), cache, kv_b, device_layout(host_layout(batch)), p, all);
    const Tensor all_host = cuda_to_host(all);
    for (int64_t i = 0; i < c.T; ++i) {
      Batch one;
      one.q_start = {0, 1};
      one.kv_start = {0, static_cast<int32_t>(c.p + i + 1)};
      one.kv_slots.assign(batch.kv_slots.begin(), batch.kv_slots.begin() + c.p + i + 1);
      Tensor out = cuda_empty({1, c.heads * d.Dv}, DType::kF32);
      cuda.mla_attention(cuda_to_device(q.rows(i, 1)), cache, kv_b, device_layout(host_layout(one)), p, out);
      const Tensor got = cuda_to_host(out);
      EXPECT_EQ(std::memcmp(got.raw(), all_host.data<const float>() + i * c.heads * d.Dv,
                            static_cast<size_t>(c.heads * d.Dv) * sizeof(float)),
                0)
          << d.name << " heads " << c.heads << ": row " << i << " of " << c.T << " at " << c.p + i + 1 << " keys";
    }
  }
}

// A recorded store + attention replayed with new layout contents and queries
// (the first FP8 use happens inside the capture).
TEST(CudaMla, RecordAndReplay) {
  REQUIRE_DEVICE();
  TestRng rng;
  CudaBackend cuda;
  CpuBackend cpu;
  const Dims d = kV3;
  const int64_t heads = 128, S = 512, W = d.L + d.R, B = 4;
  const MlaParams p = params_for(d, heads);
  const LinearWeight kv_b = make_kv_b(rng, KvB::kFP8, heads * (d.Dn + d.Dv), d.L);
  const LinearWeight d_kv_b = to_device(kv_b);
  Tensor cache = random_cache(rng, S, W, DType::kBF16);
  Tensor d_cache = cuda_to_device(cache);
  const Tensor norm = random_tensor(rng, {d.L}, DType::kBF16, 0.3f);
  const Tensor d_norm = cuda_to_device(norm);
  Rope host_rope = make_rope(d.R, nullptr);
  const Tensor d_inv = cuda_to_device(host_rope.inv_freq);
  Rope dev_rope = make_rope(d.R, &d_inv);
  // Fixed-shape device inputs, rewritten between replays.
  const int64_t kv_cap = 4 * 200;
  Tensor d_q = cuda_empty({B, heads * (d.Dn + d.R)}, DType::kF32), d_kv_a = cuda_empty({B, W}, DType::kF32);
  Tensor d_pos = cuda_empty({B}, DType::kI32), d_slots = cuda_empty({B}, DType::kI32);
  AttentionLayout layout{cuda_empty({B + 1}, DType::kI32), cuda_empty({B + 1}, DType::kI32),
                         cuda_empty({kv_cap}, DType::kI32)};
  Tensor out = cuda_empty({B, heads * d.Dv}, DType::kF32);
  auto graph = cuda.record([&] {
    cuda.mla_store_kv(d_kv_a, d_norm, 1e-6f, d_pos, dev_rope.params, d_slots, d_cache);
    cuda.mla_attention(d_q, d_cache, d_kv_b, layout, p, out);
  });
  ASSERT_NE(graph, nullptr);
  for (int step = 0; step < 3; ++step) {
    // Decodes of different lengths; the last sequence is padding (slot -1).
    std::vector<std::pair<int, int>> seqs = {{1, static_cast<int>(rng.integer(1, 200))},
                                             {1, static_cast<int>(rng.integer(1, 200))},
                                             {1, static_cast<int>(rng.integer(1, 200))},
                                             {1, 0}};
    Batch batch = make_batch(rng, seqs, S, 0);
    std::vector<int32_t> new_slots, positions;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int kv_len = seqs[s].second;
      new_slots.push_back(kv_len > 0 ? batch.kv_slots[batch.kv_start[s + 1] - 1] : -1);
      positions.push_back(std::max(kv_len - 1, 0));
    }
    Batch padded = batch;
    padded.kv_slots.resize(static_cast<size_t>(kv_cap), -3);
    const Tensor q = random_tensor(rng, {B, heads * (d.Dn + d.R)}, DType::kF32);
    const Tensor kv_a = random_tensor(rng, {B, W}, DType::kF32);
    const AttentionLayout h = host_layout(padded);
    cuda.copy(q, d_q);
    cuda.copy(kv_a, d_kv_a);
    cuda.copy(testing::i32_tensor(positions), d_pos);
    cuda.copy(testing::i32_tensor(new_slots), d_slots);
    cuda.copy(h.q_start, layout.q_start);
    cuda.copy(h.kv_start, layout.kv_start);
    cuda.copy(h.kv_slots, layout.kv_slots);
    cuda_fill_bytes(out, 0xFF);
    graph->replay();
    cuda.synchronize();
    cpu.mla_store_kv(kv_a, norm, 1e-6f, testing::i32_tensor(positions), host_rope.params,
                     testing::i32_tensor(new_slots), cache);
    Tensor want = testing::poisoned({B, heads * d.Dv});
    cpu.mla_attention(q, cache, kv_b, cpu_layout(batch), p, want);
    EXPECT_LT(relative_error(cuda_to_host(out), want), 2e-2) << "step " << step;
    EXPECT_LT(relative_error(cuda_to_host(d_cache), cache), 4e-3) << "step " << step;
  }
}

TEST(CudaMla, RejectsUnsupportedShapes) {
  REQUIRE_DEVICE();
  CudaBackend cuda;
  const MlaParams wide{4, 640, 16, 8, 16, 0.1f};  // L over 512
  const Tensor cache = cuda_empty({8, 648}, DType::kBF16);
  const LinearWeight kv_b{cuda_empty({4 * 32, 640}, DType::kBF16), Tensor()};
  Tensor q = cuda_empty({1, 4 * 24}, DType::kF32), out = cuda_empty({1, 4 * 16}, DType::kF32);
  const AttentionLayout layout{cuda_to_device(testing::i32_tensor({0, 1})), cuda_to_device(testing::i32_tensor({0, 1})),
                               cuda_to_device(testing::i32_tensor({0}))};
  EXPECT_THROW(cuda.mla_attention(q, cache, kv_b, layout, wide, out), Error);
  const MlaParams ok{4, 64, 16, 8, 16, 0.1f};
  const LinearWeight f16{cuda_empty({4 * 32, 64}, DType::kF16), Tensor()};
  const Tensor small = cuda_empty({8, 72}, DType::kBF16);
  EXPECT_THROW(cuda.mla_attention(q, small, f16, layout, ok, out), Error);  // f16 kv_b
  Tensor wrong_out = cuda_empty({1, 4 * 15}, DType::kF32);
  const LinearWeight bf16{cuda_empty({4 * 32, 64}, DType::kBF16), Tensor()};
  EXPECT_THROW(cuda.mla_attention(q, small, bf16, layout, ok, wrong_out), Error);
}

}  // namespace
}  // namespace basalt
