// CpuBackend's aliasing cases (add_rms_norm and add writing over an input),
// copy's conversions, empty batches, and the shape checks every op makes.
// Each op against the reference is in the table of backend/backend_ops_test.cc;
// linear, attention and sampling sweep their kernels' paths in files of their own.
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
