// The CUDA elementwise kernels against the scalar reference ops, on random
// odd shapes, with f32 and bf16 activations and f32/bf16/f16 weights; outputs
// are poisoned with NaN before each call. Skips where no device is present.
#include "backend/cuda/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/cuda/device.h"
#include "backend/reference_ops.h"
#include "core/error.h"

namespace basalt {
namespace {

using testing::TestRng;

#define REQUIRE_DEVICE() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

Tensor random_host(TestRng& rng, Shape shape, DType dtype, float stddev = 1.0f) {
  return testing::random_tensor(rng, std::move(shape), dtype, stddev);
}
Tensor as_f32(const Tensor& t) { return t.to_f32(); }
// Relative error norm; infinite when the output kept a NaN of the poison.
double rel_error(const Tensor& got, const Tensor& want) { return testing::relative_error(got, want); }

Tensor device_poisoned(Shape shape, DType dtype) {
  Tensor t = cuda_empty(std::move(shape), dtype);
  cuda_fill_bytes(t, 0xFF);
  return t;
}

// bf16 results are the f32 result rounded: ~2^-9 relative per element.
double tolerance(DType act) { return act == DType::kF32 ? 2e-6 : 8e-3; }

const DType kActs[] = {DType::kF32, DType::kBF16};
const DType kWeights[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(CudaElementwise, RmsNormAndAddRmsNorm) {
  REQUIRE_DEVICE();
  TestRng rng;
  for (DType act : kActs)
    for (DType wt : kWeights)
      for (auto [rows, hidden] : {std::pair<int64_t, int64_t>{1, 7}, {5, 4096}, {33, 1000}, {3, 13}}) {
        const Tensor x = random_host(rng, {rows, hidden}, act), w = random_host(rng, {hidden}, wt);
        const Tensor r = random_host(rng, {rows, hidden}, act);
        Tensor want = Tensor::empty({rows, hidden}, DType::kF32);
        reference::rms_norm(as_f32(x), as_f32(w), 1e-6f, want);
        Tensor out = device_poisoned({rows, hidden}, act);
        cuda_rms_norm(cuda_to_device(x), cuda_to_device(w), 1e-6f, out);
        EXPECT_LT(rel_error(cuda_to_host(out), want), tolerance(act)) << dtype_name(act) << " " << hidden;

        Tensor residual_ref = as_f32(r);
        Tensor want2 = Tensor::empty({rows, hidden}, DType::kF32);
        reference::add_rms_norm(residual_ref, as_f32(x), as_f32(w), 1e-6f, want2);
        Tensor residual = cuda_to_device(r);
        Tensor out2 = device_poisoned({rows, hidden}, act);
        cuda_add_rms_norm(residual, cuda_to_device(x), cuda_to_device(w), 1e-6f, out2);
        EXPECT_LT(rel_error(cuda_to_host(residual), residual_ref), tolerance(act));
        EXPECT_LT(rel_error(cuda_to_host(out2), want2), 2 * tolerance(act));
      }
}

TEST(CudaElementwise, SiluAndMulAndAdd) {
  REQUIRE_DEVICE();
  TestRng rng;
  for (DType act : kActs)
    for (auto [tokens, inter] : {std::pair<int64_t, int64_t>{1, 1}, {7, 300}, {64, 1376}}) {
      const Tensor gu = random_host(rng, {tokens, 2 * inter}, act, 2.0f);
      Tensor want = Tensor::empty({tokens, inter}, DType::kF32);
      reference::silu_and_mul(as_f32(gu), want);
      Tensor out = device_poisoned({tokens, inter}, act);
      cuda_silu_and_mul(cuda_to_device(gu), out);
      EXPECT_LT(rel_error(cuda_to_host(out), want), tolerance(act)) << dtype_name(act);

      const Tensor a = random_host(rng, {tokens, inter}, act), b = random_host(rng, {tokens, inter}, act);
      Tensor sum_want = Tensor::empty({tokens, inter}, DType::kF32);
      reference::add(as_f32(a), as_f32(b), sum_want);
      Tensor sum = device_poisoned({tokens, inter}, act);
      cuda_add(cuda_to_device(a), cuda_to_device(b), sum);
      EXPECT_LT(rel_error(cuda_to_host(sum), sum_want), tolerance(act));
    }
}

// The mixed form the dense model uses on the GPU: an f32 residual stream in,
// the bf16 input of the next linear out.
TEST(CudaElementwise, NormsAndSiluWriteBf16FromF32) {
  REQUIRE_DEVICE();
  TestRng rng;
  for (auto [rows, hidden] : {std::pair<int64_t, int64_t>{1, 4096}, {17, 1000}}) {
    const Tensor x = random_host(rng, {rows, hidden}, DType::kF32), w = random_host(rng, {hidden}, DType::kBF16);
    const Tensor r = random_host(rng, {rows, hidden}, DType::kF32);
    Tensor want = Tensor::empty({rows, hidden}, DType::kF32);
    reference::rms_norm(x, as_f32(w), 1e-5f, want);
    Tensor out = device_poisoned({rows, hidden}, DType::kBF16);
    cuda_rms_norm(cuda_to_device(x), cuda_to_device(w), 1e-5f, out);
    EXPECT_LT(rel_error(cuda_to_host(out), want), tolerance(DType::kBF16));

    Tensor residual_ref = testing::clone(r);
    reference::add_rms_norm(residual_ref, x, as_f32(w), 1e-5f, want);
    Tensor residual = cuda_to_device(r);
    cuda_add_rms_norm(residual, cuda_to_device(x), cuda_to_device(w), 1e-5f, out);
    EXPECT_LT(rel_error(cuda_to_host(residual), residual_ref), tolerance(DType::kF32));
    EXPECT_LT(rel_error(cuda_to_host(out), want), tolerance(DType::kBF16));

    const Tensor gu = random_host(rng, {rows, 2 * hidden}, DType::kF32, 2.0f);
    Tensor act_want = Tensor::empty({rows, hidden}, DType::kF32);
    reference::silu_and_mul(gu, act_want);
    Tensor act = device_poisoned({rows, hidden}, DType::kBF16);
    cuda_silu_and_mul(cuda_to_device(gu), act);
    EXPECT_LT(rel_error(cuda_to_host(act), act_want), tolerance(DType::kBF16));
  }
}

// qkv_rope_store against the reference backend's composition of rms_norm,
// rope and store_kv on the split columns.
TEST(CudaElementwise, QkvRopeStoreMatchesTheSplitOps) {
  REQUIRE_DEVICE();
  TestRng rng;
  struct Case {
    int heads, kv_heads, head_dim, rotary, offset;
    RopeStyle style;
    bool qk_norm;
  };
  const Case cases[] = {{32, 8, 128, 128, 0, RopeStyle::kRotateHalf, false},
                        {4, 2, 64, 64, 0, RopeStyle::kRotateHalf, true},
                        {6, 6, 80, 32, 16, RopeStyle::kInterleaved, false},
                        {3, 1, 256, 256, 0, RopeStyle::kRotateHalf, true},
                        {2, 1, 10, 4, 2, RopeStyle::kInterleaved, true}};
  for (const Case& c : cases)
    for (DType cache_dtype : kActs) {
      const int64_t tokens = 11, slots = 40, D = c.head_dim;
      const int64_t q_width = c.heads * D, kv_width = c.kv_heads * D;
      const Tensor qkv = random_host(rng, {tokens, q_width + 2 * kv_width}, DType::kF32);
      const Tensor q_norm = random_host(rng, {D}, DType::kBF16), k_norm = random_host(rng, {D}, DType::kBF16);
      std::vector<float> inv(c.rotary / 2);
      for (size_t i = 0; i < inv.size(); ++i)
        inv[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(c.rotary));
      std::vector<int32_t> pos(tokens), slot(tokens);
      for (int64_t t = 0; t < tokens; ++t) {
        pos[t] = static_cast<int32_t>(rng.integer(0, 40000));
        slot[t] = t == 3 ? -1 : static_cast<int32_t>((t * 7 + 5) % slots);  // token 3 stores nothing
      }
      const Tensor inv_host = Tensor::from_f32({c.rotary / 2}, inv);
      const Tensor pos_host = Tensor::from_i32({tokens}, pos), slot_host = Tensor::from_i32({tokens}, slot);
      RopeParams rope{0, c.head_dim, c.rotary, c.style, &inv_host, 1.1f, c.offset};
      const Tensor k_init = random_host(rng, {slots, kv_width}, cache_dtype);
      const Tensor v_init = random_host(rng, {slots, kv_width}, cache_dtype);

      // The reference: split ops (store_kv skips the negative slot's token by
      // leaving it out).
      Tensor q_want = Tensor::empty({tokens, q_width}, DType::kF32);
      Tensor k_want = testing::clone(k_init), v_want = testing::clone(v_init);
      {
        std::vector<int32_t> kept;
        for (int64_t t = 0; t < tokens; ++t)
          if (slot[t] >= 0) kept.push_back(static_cast<int32_t>(t));
        const int64_t n = static_cast<int64_t>(kept.size());
        Tensor sub = Tensor::empty({n, qkv.dim(1)}, DType::kF32), sub_q = Tensor::empty({n, q_width}, DType::kF32);
        std::vector<int32_t> sub_pos, sub_slot;
        for (int64_t i = 0; i < n; ++i) {
          std::memcpy(sub.data<float>() + i * qkv.dim(1), qkv.data<const float>() + kept[i] * qkv.dim(1),
                      static_cast<size_t>(qkv.dim(1)) * sizeof(float));
          sub_pos.push_back(pos[kept[i]]);
          sub_slot.push_back(slot[kept[i]]);
        }
        ReferenceBackend ref;
        ref.qkv_rope_store(sub, c.qk_norm ? &q_norm : nullptr, c.qk_norm ? &k_norm : nullptr, 1e-6f,
                           Tensor::from_i32({n}, sub_pos), rope, c.heads, c.kv_heads, Tensor::from_i32({n}, sub_slot),
                           k_want, v_want, sub_q);
        // q of every token, including the one that stores nothing.
        Tensor k_scratch = testing::clone(k_init), v_scratch = testing::clone(v_init);
        ref.qkv_rope_store(qkv, c.qk_norm ? &q_norm : nullptr, c.qk_norm ? &k_norm : nullptr, 1e-6f, pos_host, rope,
                           c.heads, c.kv_heads, Tensor::from_i32({tokens}, std::vector<int32_t>(tokens, 0)),
                           k_scratch, v_scratch, q_want);
      }
      const Tensor inv_dev = cuda_to_device(inv_host);
      rope.inv_freq = &inv_dev;
      const Tensor qn = cuda_to_device(q_norm), kn = cuda_to_device(k_norm);
      Tensor k_dev = cuda_to_device(k_init), v_dev = cuda_to_device(v_init);
      Tensor q_dev = device_poisoned({tokens, q_width}, DType::kF32);
      cuda_qkv_rope_store(cuda_to_device(qkv), c.qk_norm ? &qn : nullptr, c.qk_norm ? &kn : nullptr, 1e-6f,
                          cuda_to_device(pos_host), rope, c.heads, c.kv_heads, cuda_to_device(slot_host), k_dev, v_dev,
                          q_dev);
      const std::string what = "head_dim " + std::to_string(D) + " cache " + std::string(dtype_name(cache_dtype));
      EXPECT_LT(rel_error(cuda_to_host(q_dev), q_want), 1e-5) << what;
      const double cache_tol = cache_dtype == DType::kF32 ? 1e-5 : tolerance(cache_dtype);
      EXPECT_LT(rel_error(cuda_to_host(k_dev).to_f32(), k_want.to_f32()), cache_tol) << what;
      EXPECT_LT(rel_error(cuda_to_host(v_dev).to_f32(), v_want.to_f32()), cache_tol) << what;
    }
}

TEST(CudaElementwise, EmbeddingCopiesRowsAndPoisonsBadIds) {
  REQUIRE_DEVICE();
  TestRng rng;
  for (DType act : kActs)
    for (DType wt : kWeights) {
      const int64_t vocab = 301, hidden = 129, tokens = 17;
      const Tensor table = random_host(rng, {vocab, hidden}, wt);
      std::vector<int32_t> ids(tokens);
      for (auto& id : ids) id = static_cast<int32_t>(rng.integer(0, vocab - 1));
      const Tensor host_ids = Tensor::from_i32({tokens}, ids);
      Tensor want = Tensor::empty({tokens, hidden}, DType::kF32);
      reference::embedding(host_ids, table, want);
      Tensor out = device_poisoned({tokens, hidden}, act);
      cuda_embedding(cuda_to_device(host_ids), cuda_to_device(table), out);
      // A copy: exact unless the row is rounded into bf16 activations.
      EXPECT_LE(rel_error(cuda_to_host(out), want), act == DType::kF32 ? 0.0 : tolerance(act));
    }
  const Tensor table = cuda_to_device(Tensor::from_f32({2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6}));
  const std::vector<int32_t> ids = {1, 2, -1};
  Tensor out = device_poisoned({3, 3}, DType::kF32);
  cuda_embedding(cuda_to_device(Tensor::from_i32({3}, ids)), table, out);
  const Tensor host = cuda_to_host(out);
  EXPECT_EQ(host.data<float>()[0], 4.0f);
  for (int i = 3; i < 9; ++i) EXPECT_TRUE(std::isnan(host.data<float>()[i])) << i;
}

TEST(CudaElementwise, RopeBothStylesWithOffsetsAndScaling) {
  REQUIRE_DEVICE();
  TestRng rng;
  struct Case {
    int heads, head_dim, rotary, offset;
    RopeStyle style;
    float scaling;
  };
  const Case cases[] = {{4, 64, 64, 0, RopeStyle::kRotateHalf, 1.0f},
                        {3, 128, 64, 0, RopeStyle::kRotateHalf, 1.0f},
                        {5, 192, 64, 128, RopeStyle::kInterleaved, 1.2f},
                        {1, 10, 4, 2, RopeStyle::kInterleaved, 0.9f}};
  for (DType act : kActs)
    for (const Case& c : cases) {
      const int64_t tokens = 9;
      const Tensor x = random_host(rng, {tokens, c.heads * c.head_dim}, act);
      std::vector<float> inv(c.rotary / 2);
      for (size_t i = 0; i < inv.size(); ++i)
        inv[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(c.rotary));
      std::vector<int32_t> pos(tokens);
      for (auto& p : pos) p = static_cast<int32_t>(rng.integer(0, 40000));
      const Tensor inv_host = Tensor::from_f32({c.rotary / 2}, inv), pos_host = Tensor::from_i32({tokens}, pos);
      RopeParams params{c.heads, c.head_dim, c.rotary, c.style, &inv_host, c.scaling, c.offset};
      Tensor want = as_f32(x);
      reference::rope(want, pos_host, params);
      const Tensor inv_dev = cuda_to_device(inv_host);
      params.inv_freq = &inv_dev;
      Tensor dev = cuda_to_device(x);
      cuda_rope(dev, cuda_to_device(pos_host), params);
      EXPECT_LT(rel_error(cuda_to_host(dev), want), act == DType::kF32 ? 1e-5 : tolerance(act))
          << dtype_name(act) << " head_dim " << c.head_dim;
    }
}

TEST(CudaElementwise, CastSoftmaxAndArgmax) {
  REQUIRE_DEVICE();
  TestRng rng;
  const Tensor x = random_host(rng, {37, 1001}, DType::kF32, 3.0f);
  for (DType to : kWeights) {
    Tensor out = device_poisoned({37, 1001}, to);
    cuda_cast(cuda_to_device(x), out);
    Tensor want = Tensor::empty({37, 1001}, to);
    for (int64_t i = 0; i < x.numel(); ++i) testing::store_value(want, i, x.data<float>()[i]);
    const Tensor got = cuda_to_host(out);
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << dtype_name(to);
  }
  for (bool log : {false, true}) {
    Tensor want = Tensor::empty({37, 1001}, DType::kF32);
    if (log) reference::log_softmax(x, want);
    else reference::softmax(x, want);
    Tensor out = device_poisoned({37, 1001}, DType::kF32);
    cuda_softmax(cuda_to_device(x), out, log);
    EXPECT_LT(rel_error(cuda_to_host(out), want), 1e-6) << "log " << log;
  }
  // argmax: random rows, plus rows with ties, NaN and all-NaN.
  Tensor logits = testing::clone(x);
  float* row1 = logits.data<float>() + 1001;
  row1[5] = row1[900] = 100.0f;  // tie: the lower index wins
  float* row2 = logits.data<float>() + 2 * 1001;
  row2[0] = std::nanf("");
  row2[7] = 50.0f;
  float* row3 = logits.data<float>() + 3 * 1001;
  for (int i = 0; i < 1001; ++i) row3[i] = std::nanf("");
  Tensor want = Tensor::empty({37}, DType::kI32);
  reference::argmax(logits, want);
  Tensor out = device_poisoned({37}, DType::kI32);
  cuda_argmax(cuda_to_device(logits), out);
  const Tensor got = cuda_to_host(out);
  for (int r = 0; r < 37; ++r) EXPECT_EQ(got.data<int32_t>()[r], want.data<int32_t>()[r]) << "row " << r;
  EXPECT_EQ(got.data<int32_t>()[1], 5);
  EXPECT_EQ(got.data<int32_t>()[2], 7);
  EXPECT_EQ(got.data<int32_t>()[3], 0);
  // A vocabulary-sized row (aligned, four columns a load) and an odd one:
  // the best in the last column, a tie across warps, -inf everywhere.
  for (const int64_t cols : {int64_t{8192}, int64_t{8191}}) {
    Tensor wide = Tensor::empty({3, cols}, DType::kF32);
    for (int64_t i = 0; i < 3 * cols; ++i) wide.data<float>()[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f;
    wide.data<float>()[cols - 1] = 5.0f;
    wide.data<float>()[cols + 4000] = wide.data<float>()[cols + 33] = 7.0f;
    for (int64_t i = 2 * cols; i < 3 * cols; ++i) wide.data<float>()[i] = -INFINITY;
    Tensor wide_out = device_poisoned({3}, DType::kI32);
    cuda_argmax(cuda_to_device(wide), wide_out);
    const Tensor w = cuda_to_host(wide_out);
    EXPECT_EQ(w.data<int32_t>()[0], cols - 1) << cols;
    EXPECT_EQ(w.data<int32_t>()[1], 33) << cols;
    EXPECT_EQ(w.data<int32_t>()[2], 0) << cols;
  }
}

TEST(CudaElementwise, ShapeAndPlacementErrorsThrowBeforeLaunching) {
  REQUIRE_DEVICE();
  const Tensor host = Tensor::zeros({2, 4}, DType::kF32);
  Tensor dev = cuda_empty({2, 4}, DType::kF32);
  const Tensor w = cuda_empty({5}, DType::kF32);
  EXPECT_THROW(cuda_rms_norm(host, w, 1e-6f, dev), Error);
  EXPECT_THROW(cuda_rms_norm(dev, w, 1e-6f, dev), Error);  // weight [5] vs hidden 4
  Tensor i32 = cuda_empty({2, 4}, DType::kI32);
  EXPECT_THROW(cuda_add(dev, dev, i32), Error);
  Tensor odd = cuda_empty({2, 3}, DType::kF32);
  EXPECT_THROW(cuda_silu_and_mul(odd, dev), Error);
}

}  // namespace
}  // namespace basalt
