// CpuBackend's element-wise and row-wise ops against the reference ops, on
// random inputs of awkward sizes, plus the shape checks every op must make.
// Linear, attention and sampling have their own files.
#include "backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/reference_ops.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::bytes_equal;
using testing::clone;
using testing::count_nan;
using testing::i32_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::relative_error;
using testing::TestRng;

// Sizes straddling every vector width and unroll boundary.
const std::vector<int64_t> kOddSizes = {1, 3, 17, 63, 64, 65, 127, 129, 1000};
const std::vector<DType> kWeightDtypes = {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3};

TEST(CpuBackend, EmbeddingIsExactForEveryTableDtype) {
  TestRng rng;
  CpuBackend backend;
  for (DType dtype : kWeightDtypes) {
    for (int64_t hidden : {1, 17, 64, 129}) {
      const int64_t vocab = 37, tokens = 23;
      const Tensor table = random_tensor(rng, {vocab, hidden}, dtype);
      std::vector<int32_t> ids(tokens);
      for (auto& id : ids) id = static_cast<int32_t>(rng.integer(0, vocab - 1));
      Tensor out = poisoned({tokens, hidden}), ref = poisoned({tokens, hidden});
      backend.embedding(i32_tensor(ids), table, out);
      reference::embedding(i32_tensor(ids), table, ref);
      EXPECT_TRUE(bytes_equal(out, ref)) << dtype_name(dtype) << " hidden " << hidden;
    }
  }
}

TEST(CpuBackend, RmsNormMatchesReference) {
  TestRng rng;
  CpuBackend backend;
  for (DType dtype : kWeightDtypes) {
    for (int64_t hidden : kOddSizes) {
      for (int64_t tokens : {1, 5}) {
        const Tensor x = random_tensor(rng, {tokens, hidden}, DType::kF32, 3.0f);
        const Tensor weight = random_tensor(rng, {hidden}, dtype);
        Tensor out = poisoned({tokens, hidden}), ref = poisoned({tokens, hidden});
        backend.rms_norm(x, weight, 1e-5f, out);
        reference::rms_norm(x, weight, 1e-5f, ref);
        EXPECT_EQ(count_nan(out), 0);
        EXPECT_LT(relative_error(out, ref), 1e-5) << dtype_name(dtype) << " hidden " << hidden;
      }
    }
  }
}

TEST(CpuBackend, AddRmsNormUpdatesResidualAndAllowsAliasing) {
  TestRng rng;
  CpuBackend backend;
  for (int64_t hidden : kOddSizes) {
    const int64_t tokens = 7;
    const Tensor residual0 = random_tensor(rng, {tokens, hidden}, DType::kF32);
    const Tensor x = random_tensor(rng, {tokens, hidden}, DType::kF32);
    const Tensor weight = random_tensor(rng, {hidden}, DType::kBF16);
    Tensor residual = clone(residual0), ref_residual = clone(residual0);
    Tensor out = poisoned({tokens, hidden}), ref = poisoned({tokens, hidden});
    backend.add_rms_norm(residual, x, weight, 1e-6f, out);
    reference::add_rms_norm(ref_residual, x, weight, 1e-6f, ref);
    EXPECT_TRUE(bytes_equal(residual, ref_residual)) << "hidden " << hidden;
    EXPECT_LT(relative_error(out, ref), 1e-5) << "hidden " << hidden;

    // out aliasing x: the usual in-place use.
    Tensor aliased = clone(x);
    residual = clone(residual0);
    backend.add_rms_norm(residual, aliased, weight, 1e-6f, aliased);
    EXPECT_LT(relative_error(aliased, ref), 1e-5) << "hidden " << hidden;
  }
}

TEST(CpuBackend, RopeMatchesReferenceForBothStyles) {
  TestRng rng;
  CpuBackend backend;
  struct Case {
    int heads, head_dim, rotary_dim;
  };
  for (const Case c : {Case{1, 2, 2}, Case{3, 64, 64}, Case{2, 128, 64}, Case{5, 34, 18},
                       Case{4, 96, 96}}) {
    for (RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved}) {
      for (float scaling : {1.0f, 1.25f}) {
        const int64_t tokens = 9;
        Tensor inv_freq = Tensor::empty({c.rotary_dim / 2}, DType::kF32);
        for (int i = 0; i < c.rotary_dim / 2; ++i) {
          inv_freq.data<float>()[i] = std::pow(500000.0f, -2.0f * i / c.rotary_dim);
        }
        std::vector<int32_t> positions(tokens);
        for (auto& p : positions) p = static_cast<int32_t>(rng.integer(0, 131071));
        const RopeParams params{c.heads, c.head_dim, c.rotary_dim, style, &inv_freq, scaling};
        const Tensor x0 = random_tensor(rng, {tokens, int64_t{c.heads} * c.head_dim}, DType::kF32);
        Tensor x = clone(x0), ref = clone(x0);
        backend.rope(x, i32_tensor(positions), params);
        reference::rope(ref, i32_tensor(positions), params);
        EXPECT_LT(relative_error(x, ref), 1e-6)
            << c.heads << "x" << c.head_dim << " rotary " << c.rotary_dim;
        // Features past rotary_dim are untouched, bit for bit.
        for (int64_t t = 0; t < tokens; ++t) {
          for (int h = 0; h < c.heads; ++h) {
            for (int d = c.rotary_dim; d < c.head_dim; ++d) {
              const int64_t i = (t * c.heads + h) * c.head_dim + d;
              ASSERT_EQ(x.data<float>()[i], x0.data<float>()[i]);
            }
          }
        }
      }
    }
  }
}

TEST(CpuBackend, StoreKvIsExactIntoShuffledSlots) {
  TestRng rng;
  CpuBackend backend;
  for (DType cache_dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t tokens : {1, 17, 64}) {
      const int64_t slots = 100, kv_heads = 2, head_dim = 24, v_head_dim = 16;
      std::vector<int32_t> perm(slots);
      for (int i = 0; i < slots; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng.engine());
      perm.resize(tokens);
      const Tensor k = random_tensor(rng, {tokens, kv_heads * head_dim}, DType::kF32);
      const Tensor v = random_tensor(rng, {tokens, kv_heads * v_head_dim}, DType::kF32);
      Tensor k_cache = poisoned({slots, kv_heads, head_dim}, cache_dtype);
      Tensor v_cache = poisoned({slots, kv_heads * v_head_dim}, cache_dtype);
      Tensor k_ref = clone(k_cache), v_ref = clone(v_cache);
      backend.store_kv(k, v, i32_tensor(perm), k_cache, v_cache);
      reference::store_kv(k, v, i32_tensor(perm), k_ref, v_ref);
      EXPECT_TRUE(bytes_equal(k_cache, k_ref)) << dtype_name(cache_dtype);
      EXPECT_TRUE(bytes_equal(v_cache, v_ref)) << dtype_name(cache_dtype);
      // Exactly the named slots were written.
      EXPECT_EQ(count_nan(k_cache), (slots - tokens) * kv_heads * head_dim);
    }
  }
}

TEST(CpuBackend, SiluAndMulMatchesReference) {
  TestRng rng;
  CpuBackend backend;
  for (int64_t inter : kOddSizes) {
    for (int64_t tokens : {1, 4}) {
      Tensor gate_up = random_tensor(rng, {tokens, 2 * inter}, DType::kF32, 4.0f);
      gate_up.data<float>()[0] = -200.0f;  // exp overflow territory
      Tensor out = poisoned({tokens, inter}), ref = poisoned({tokens, inter});
      backend.silu_and_mul(gate_up, out);
      reference::silu_and_mul(gate_up, ref);
      EXPECT_LT(relative_error(out, ref), 1e-6) << "inter " << inter;
    }
  }
}

TEST(CpuBackend, AddMatchesReferenceAndAllowsAliasing) {
  TestRng rng;
  CpuBackend backend;
  for (int64_t n : {1, 17, 4097, 100000}) {
    const Tensor a = random_tensor(rng, {n}, DType::kF32);
    const Tensor b = random_tensor(rng, {n}, DType::kF32);
    Tensor out = poisoned({n}), ref = poisoned({n});
    backend.add(a, b, out);
    reference::add(a, b, ref);
    EXPECT_TRUE(bytes_equal(out, ref));
    Tensor in_place = clone(a);
    backend.add(in_place, b, in_place);
    EXPECT_TRUE(bytes_equal(in_place, ref));
  }
}

TEST(CpuBackend, SoftmaxAndLogSoftmaxMatchReference) {
  TestRng rng;
  CpuBackend backend;
  for (int64_t cols : kOddSizes) {
    for (bool log : {false, true}) {
      Tensor x = random_tensor(rng, {3, cols}, DType::kF32, 10.0f);
      x.data<float>()[0] += 80.0f;  // stability: a huge logit must not overflow
      if (cols > 1) x.data<float>()[cols + 1] = -std::numeric_limits<float>::infinity();
      Tensor out = poisoned({3, cols}), ref = poisoned({3, cols});
      if (log) {
        backend.log_softmax(x, out);
        reference::log_softmax(x, ref);
      } else {
        backend.softmax(x, out);
        reference::softmax(x, ref);
      }
      if (log && cols > 1) {
        // -inf stays -inf; compare the finite rest.
        EXPECT_EQ(out.data<float>()[cols + 1], -std::numeric_limits<float>::infinity());
        out.data<float>()[cols + 1] = ref.data<float>()[cols + 1] = 0.0f;
      }
      EXPECT_LT(relative_error(out, ref), 1e-5) << (log ? "log_softmax" : "softmax") << " " << cols;
      // In place.
      Tensor in_place = clone(x);
      if (log) {
        backend.log_softmax(in_place, in_place);
        if (cols > 1) in_place.data<float>()[cols + 1] = 0.0f;
      } else {
        backend.softmax(in_place, in_place);
      }
      EXPECT_LT(relative_error(in_place, ref), 1e-5);
    }
  }
}

TEST(CpuBackend, ArgmaxMatchesReferenceWithTiesAndNan) {
  TestRng rng;
  CpuBackend backend;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t vocab : {1, 2, 15, 16, 17, 63, 64, 65, 1000, 32000}) {
    const int64_t rows = 6;
    Tensor logits = random_tensor(rng, {rows, vocab}, DType::kF32);
    float* l = logits.data<float>();
    // Row 1: a tie of the maximum at two random places.
    const int64_t i = rng.integer(0, vocab - 1), j = rng.integer(0, vocab - 1);
    l[vocab + i] = l[vocab + j] = 50.0f;
    // Row 2: all equal; row 3: NaNs sprinkled in; row 4: all NaN; row 5: all -inf.
    for (int64_t c = 0; c < vocab; ++c) {
      l[2 * vocab + c] = 1.0f;
      if (c % 3 == 0) l[3 * vocab + c] = nan;
      l[4 * vocab + c] = nan;
      l[5 * vocab + c] = -std::numeric_limits<float>::infinity();
    }
    Tensor out = poisoned({rows}, DType::kI32), ref = poisoned({rows}, DType::kI32);
    backend.argmax(logits, out);
    reference::argmax(logits, ref);
    EXPECT_TRUE(bytes_equal(out, ref)) << "vocab " << vocab;
    EXPECT_EQ(out.data<int32_t>()[1], std::min(i, j));
    EXPECT_EQ(out.data<int32_t>()[2], 0);
  }
}

TEST(CpuBackend, CopyIsExactAndConvertsFloats) {
  TestRng rng;
  CpuBackend backend;
  const Tensor src = random_tensor(rng, {129, 65}, DType::kF32);
  Tensor dst = poisoned({65, 129});
  backend.copy(src, dst);
  EXPECT_EQ(std::memcmp(src.raw(), dst.raw(), src.nbytes()), 0);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF8E4M3}) {
    Tensor narrow = poisoned({129, 65}, dtype), ref = poisoned({129, 65}, dtype);
    backend.copy(src, narrow);
    reference::copy(src, ref);
    EXPECT_TRUE(bytes_equal(narrow, ref)) << dtype_name(dtype);
    Tensor wide = poisoned({129, 65}), wide_ref = poisoned({129, 65});
    backend.copy(narrow, wide);
    reference::copy(narrow, wide_ref);
    EXPECT_TRUE(bytes_equal(wide, wide_ref)) << dtype_name(dtype);
  }
  const Tensor ids = i32_tensor({1, 2, 3});
  Tensor ids_copy = poisoned({3}, DType::kI32);
  backend.copy(ids, ids_copy);
  EXPECT_TRUE(bytes_equal(ids, ids_copy));
}

TEST(CpuBackend, EmptyBatchesAreNoOps) {
  CpuBackend backend;
  const Tensor x = Tensor::empty({0, 8}, DType::kF32);
  const Tensor weight = Tensor::from_f32({8}, std::vector<float>(8, 1.0f));
  Tensor out = Tensor::empty({0, 8}, DType::kF32);
  backend.rms_norm(x, weight, 1e-5f, out);
  backend.add(x, x, out);
  backend.softmax(x, out);
  Tensor ids = Tensor::empty({0}, DType::kI32);
  backend.argmax(x, ids);
}

// --- Hostile shapes ------------------------------------------------------------

TEST(CpuBackendChecks, ElementwiseOpsRejectMismatches) {
  CpuBackend backend;
  const Tensor x = Tensor::zeros({2, 8}, DType::kF32);
  const Tensor w8 = Tensor::zeros({8}, DType::kF32);
  const Tensor w7 = Tensor::zeros({7}, DType::kF32);
  Tensor out = Tensor::zeros({2, 8}, DType::kF32);
  Tensor out_wrong = Tensor::zeros({2, 7}, DType::kF32);
  Tensor out_bf16 = Tensor::zeros({2, 8}, DType::kBF16);
  Tensor i32_out = Tensor::zeros({2}, DType::kI32);
  Tensor i32_out_wrong = Tensor::zeros({3}, DType::kI32);

  EXPECT_THROW(backend.rms_norm(x, w7, 1e-5f, out), Error);
  EXPECT_THROW(backend.rms_norm(x, w8, 1e-5f, out_wrong), Error);
  EXPECT_THROW(backend.rms_norm(x, w8, 1e-5f, out_bf16), Error);
  EXPECT_THROW(backend.rms_norm(x.reshape({16}), w8, 1e-5f, out), Error);
  Tensor residual = Tensor::zeros({2, 8}, DType::kF32);
  EXPECT_THROW(backend.add_rms_norm(residual, Tensor::zeros({2, 7}, DType::kF32), w8, 1e-5f, out),
               Error);
  EXPECT_THROW(backend.add(x, Tensor::zeros({8, 2}, DType::kF32), out), Error);
  EXPECT_THROW(backend.add(x, x, out_bf16), Error);
  EXPECT_THROW(backend.silu_and_mul(x, out), Error);                               // out [2, 4] needed
  EXPECT_THROW(backend.silu_and_mul(Tensor::zeros({2, 7}, DType::kF32), out), Error);  // odd width
  EXPECT_THROW(backend.softmax(x, out_wrong), Error);
  EXPECT_THROW(backend.log_softmax(x, out_bf16), Error);
  EXPECT_THROW(backend.argmax(x, i32_out_wrong), Error);
  EXPECT_THROW(backend.argmax(x, out), Error);
  EXPECT_THROW(backend.copy(x, out_wrong), Error);
  EXPECT_THROW(backend.copy(x, i32_out), Error);

  // A device tensor is refused by name.
  const Tensor device = Tensor::wrap(x.raw(), {2, 8}, DType::kF32, nullptr, Device::kCuda);
  try {
    backend.rms_norm(device, w8, 1e-5f, out);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm"), std::string::npos) << e.what();
  }
}

TEST(CpuBackendChecks, EmbeddingRopeAndStoreKvRejectMismatches) {
  CpuBackend backend;
  const Tensor table = Tensor::zeros({10, 4}, DType::kBF16);
  Tensor out = Tensor::zeros({2, 4}, DType::kF32);
  EXPECT_THROW(backend.embedding(i32_tensor({1, 10}), table, out), Error);  // id out of range
  EXPECT_THROW(backend.embedding(i32_tensor({1, -1}), table, out), Error);
  EXPECT_THROW(backend.embedding(i32_tensor({1, 2, 3}), table, out), Error);
  EXPECT_THROW(backend.embedding(Tensor::zeros({2}, DType::kI64), table, out), Error);
  EXPECT_THROW(backend.embedding(i32_tensor({1, 2}), Tensor::zeros({10, 4}, DType::kI32), out),
               Error);

  const Tensor inv_freq = Tensor::zeros({4}, DType::kF32);
  Tensor x = Tensor::zeros({2, 16}, DType::kF32);
  const Tensor positions = i32_tensor({0, 1});
  EXPECT_THROW(backend.rope(x, positions, {2, 8, 8, RopeStyle::kRotateHalf, nullptr, 1.0f}), Error);
  EXPECT_THROW(backend.rope(x, positions, {2, 8, 6, RopeStyle::kRotateHalf, &inv_freq, 1.0f}),
               Error);  // inv_freq length
  EXPECT_THROW(backend.rope(x, positions, {2, 8, 10, RopeStyle::kRotateHalf, &inv_freq, 1.0f}),
               Error);  // rotary_dim > head_dim
  EXPECT_THROW(backend.rope(x, positions, {2, 8, 7, RopeStyle::kRotateHalf, &inv_freq, 1.0f}),
               Error);  // odd rotary_dim
  EXPECT_THROW(backend.rope(x, positions, {3, 8, 8, RopeStyle::kRotateHalf, &inv_freq, 1.0f}),
               Error);  // heads × head_dim != width
  EXPECT_THROW(backend.rope(x, i32_tensor({0}), {2, 8, 8, RopeStyle::kRotateHalf, &inv_freq, 1.0f}),
               Error);

  const Tensor k = Tensor::zeros({2, 8}, DType::kF32);
  const Tensor v = Tensor::zeros({2, 4}, DType::kF32);
  Tensor k_cache = Tensor::zeros({5, 8}, DType::kF32);
  Tensor v_cache = Tensor::zeros({5, 4}, DType::kBF16);
  Tensor v_cache_f16 = Tensor::zeros({5, 4}, DType::kF16);
  Tensor small_cache = Tensor::zeros({4, 4}, DType::kF32);
  EXPECT_THROW(backend.store_kv(k, v, i32_tensor({0, 5}), k_cache, v_cache), Error);
  // A negative slot is a padding token: skipped, not an error (backend.h).
  backend.store_kv(Tensor::from_f32({2, 8}, std::vector<float>(16, 1.0f)),
                   Tensor::from_f32({2, 4}, std::vector<float>(8, 2.0f)), i32_tensor({3, -3}), k_cache,
                   v_cache);
  for (int64_t i = 0; i < 40; ++i)
    EXPECT_EQ(k_cache.data<float>()[i], i / 8 == 3 ? 1.0f : 0.0f) << i;
  for (int64_t i = 0; i < 20; ++i)
    EXPECT_EQ(reference::load_f32(v_cache, i), i / 4 == 3 ? 2.0f : 0.0f) << i;
  EXPECT_THROW(backend.store_kv(k, v, i32_tensor({0}), k_cache, v_cache), Error);
  EXPECT_THROW(backend.store_kv(k, v, i32_tensor({0, 1}), k_cache, v_cache_f16), Error);
  EXPECT_THROW(backend.store_kv(k, v, i32_tensor({0, 1}), k_cache, small_cache), Error);
  EXPECT_THROW(backend.store_kv(v, k, i32_tensor({0, 1}), k_cache, v_cache), Error);
}

}  // namespace
}  // namespace basalt
