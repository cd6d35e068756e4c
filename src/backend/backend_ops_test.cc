// Every op of the Backend interface, on every backend this binary was built
// for, against the scalar references of backend/reference_ops.h: one table of
// cases, after llama.cpp's test-backend-ops.
//
// A case draws its inputs on the host (random, odd shapes, the dtypes the
// contract allows), computes the reference result there, runs the op on the
// backend under test through its public interface (inputs copied to the
// device, outputs poisoned with NaN first so that an unwritten element
// fails), and compares: bit for bit where the contract fixes the bits
// (copies, masks, selections, integer results), by relative error norm
// otherwise, with a bound for host backends (f32 arithmetic against the
// reference's doubles) and one for a GPU backend (whose tensor-core paths
// round operands to bf16 or quantize them to FP8). Cases that use bf16
// activations run only where the backend computes in bf16.
//
// The file is built twice: into the CPU test binary, where it runs on the
// CPU backend and on ReferenceBackend (which checks the table itself), and,
// with BASALT_OPS_TEST_CUDA, into the CUDA test binary (label cuda), where
// it runs on CudaBackend and skips without a device. Kernel-path tests
// (forced splits, GEMV variants, graph replay, batch invariance) and error
// tests stay next to each backend.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/forwarding_backend.h"
#include "backend/reference_ops.h"
#include "testing/backend_test_util.h"
#include "testing/error_test_util.h"

#ifdef BASALT_OPS_TEST_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#else
#include "backend/cpu/cpu_backend.h"
#endif

namespace basalt {
namespace {

using testing::i32_tensor;
using testing::random_tensor;
using testing::TestRng;

constexpr float kInf = std::numeric_limits<float>::infinity();

// --- The backends under test --------------------------------------------------

struct BackendUnderTest {
  const char* name;
  std::function<std::unique_ptr<Backend>()> make;  // null: not available here
};

std::vector<BackendUnderTest> backends_under_test() {
#ifdef BASALT_OPS_TEST_CUDA
  return {{"cuda", [] { return cuda_available() ? std::make_unique<CudaBackend>() : nullptr; }}};
#else
  // The CPU with f32 activations throughout (--dtype float32), held to the
  // reference's exact sums; its default for bf16 weights, activations rounded
  // to bf16, is checked bit for bit in cpu/bf16_linear_test.cc and
  // cpu/cpu_linear_test.cc.
  return {{"cpu", [] { return std::make_unique<CpuBackend>(&ThreadPool::global(), cpu::Bf16Activations::kF32); }},
          {"reference", [] { return std::make_unique<ReferenceBackend>(); }}};
#endif
}

// --- The harness a case runs in -------------------------------------------------

class Harness {
 public:
  Harness(Backend& backend, TestRng& rng) : backend_(backend), rng_(rng) {}

  Backend& backend() { return backend_; }
  TestRng& rng() { return rng_; }
  bool gpu() const { return backend_.device() != Device::kCpu; }
  bool bf16_activations() const { return backend_.activation_dtype(DType::kBF16) == DType::kBF16; }
  // The bound for this backend: `host` for host backends, `device` for a GPU.
  double bound(double host, double device) const { return gpu() ? device : host; }

  // A copy of host tensor t in the backend's memory.
  Tensor up(const Tensor& t) {
    Tensor d = backend_.empty(t.shape(), t.dtype());
    backend_.copy(t, d);
    return d;
  }
  LinearWeight up(const LinearWeight& w) {
    LinearWeight d{up(w.weight), w.block_fp8() ? up(w.scale_inv) : Tensor()};
    if (w.int_quantized()) {
      d.scales = up(w.scales);
      d.int_layout = w.int_layout;
    }
    return d;
  }
  // An output in the backend's memory, poisoned (NaN, or a sentinel for integers).
  Tensor out(Shape shape, DType dtype = DType::kF32) {
    return up(testing::poisoned(std::move(shape), dtype));
  }
  // A host copy of backend tensor t.
  Tensor down(const Tensor& t) {
    Tensor h = Tensor::empty(t.shape(), t.dtype());
    backend_.copy(t, h);
    return h;
  }

  // got (backend memory) within `bound` of want (host) by relative error norm.
  void close(const char* what, const Tensor& got, const Tensor& want, double bound) {
    const Tensor host = down(got);
    EXPECT_EQ(testing::count_nan(host), testing::count_nan(want)) << what << ": NaN count";
    EXPECT_LE(testing::relative_error(host, want), bound) << what;
  }
  // got (backend memory) has want's (host) dtype, shape and bits; a NaN
  // matches any NaN (a GPU writes the canonical NaN where a CPU carries the
  // input's payload).
  void same(const char* what, const Tensor& got, const Tensor& want) {
    const Tensor host = down(got);
    ASSERT_EQ(host.shape(), want.shape()) << what;
    ASSERT_EQ(host.dtype(), want.dtype()) << what;
    int64_t differing = 0, first = -1;
    const size_t width = dtype_size(host.dtype());
    const bool f32 = host.dtype() == DType::kF32;
    for (int64_t i = 0; i < host.numel(); ++i)
      if (std::memcmp(static_cast<const char*>(host.raw()) + i * width,
                      static_cast<const char*>(want.raw()) + i * width, width) != 0 &&
          !(f32 && std::isnan(host.data<float>()[i]) && std::isnan(want.data<float>()[i]))) {
        ++differing;
        if (first < 0) first = i;
      }
    EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << host.numel()
                            << " elements differ, the first at " << first;
  }

 private:
  Backend& backend_;
  TestRng& rng_;
};

// --- Inputs ------------------------------------------------------------------------

Tensor rand(Harness& h, Shape shape, DType dtype = DType::kF32, float stddev = 1.0f) {
  return random_tensor(h.rng(), std::move(shape), dtype, stddev);
}

// Token ids or slots: n values in [lo, hi].
Tensor rand_i32(Harness& h, int64_t n, int64_t lo, int64_t hi) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = static_cast<int32_t>(h.rng().integer(lo, hi));
  return i32_tensor(v);
}

// n distinct slots of `slots`, in random order.
std::vector<int32_t> distinct_slots(Harness& h, int64_t n, int64_t slots) {
  std::vector<int32_t> all(static_cast<size_t>(slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), h.rng().engine());
  all.resize(static_cast<size_t>(n));
  return all;
}

// Rows of small integers / 4 (many exact ties) with -inf, +inf, NaN and -0.
Tensor awkward_rows(Harness& h, int64_t rows, int64_t cols) {
  Tensor x = Tensor::empty({rows, cols}, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t kind = h.rng().integer(0, 40);
    x.data<float>()[i] = kind == 0   ? -kInf
                         : kind == 1 ? std::numeric_limits<float>::quiet_NaN()
                         : kind == 2 ? -0.0f
                         : kind == 3 ? kInf
                                     : static_cast<float>(h.rng().integer(-40, 40)) / 4.0f;
  }
  return x;
}

// Llama-style inverse frequencies for `rotary` dims.
Tensor inv_freq(int64_t rotary, double base = 10000.0) {
  std::vector<float> v(static_cast<size_t>(rotary / 2));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(
        1.0 / std::pow(base, 2.0 * static_cast<double>(i) / static_cast<double>(rotary)));
  return Tensor::from_f32({rotary / 2}, v);
}

LinearWeight dense_weight(Harness& h, int64_t n, int64_t k, DType dtype) {
  return LinearWeight{rand(h, {n, k}, dtype, 1.0f / std::sqrt(static_cast<float>(k))), Tensor()};
}

LinearWeight fp8_weight(Harness& h, int64_t n, int64_t k) {
  const auto blocks = [](int64_t d) { return (d + kFp8BlockSize - 1) / kFp8BlockSize; };
  LinearWeight w{rand(h, {n, k}, DType::kF8E4M3, 2.0f),
                 Tensor::empty({blocks(n), blocks(k)}, DType::kF32)};
  for (int64_t i = 0; i < w.scale_inv.numel(); ++i)
    w.scale_inv.data<float>()[i] = h.rng().uniform(0.002f, 0.05f);
  return w;
}

// A weight [n, k] of random values quantized to an integer format.
LinearWeight int_weight(Harness& h, int64_t n, int64_t k, int bits, int64_t group) {
  LinearWeight w;
  w.int_layout = {bits, group, k};
  const IntWeightLayout& l = w.int_layout;
  const Tensor f = rand(h, {n, k}, DType::kF32, 1.0f / std::sqrt(static_cast<float>(k)));
  w.weight = Tensor::empty({n, l.code_columns()}, bits == 8 ? DType::kI8 : DType::kU8);
  w.scales = Tensor::empty({n, l.scale_columns()}, DType::kF16);
  for (int64_t r = 0; r < n; ++r)
    quantize_int_row(l, f.data<const float>() + r * k, w.weight.data<uint8_t>() + r * l.code_columns(),
                     w.scales.data<uint16_t>() + r * l.scale_columns());
  return w;
}

// An attention layout over sequences of (q_len, kv_len), keys on distinct
// shuffled slots of a cache with `spare` slots more than needed.
struct Layout {
  AttentionLayout host;
  int64_t tokens = 0, slots = 0;
};
Layout make_layout(Harness& h, const std::vector<std::pair<int, int>>& seqs, int64_t spare = 5) {
  std::vector<int32_t> q_start = {0}, kv_start = {0};
  for (auto [q_len, kv_len] : seqs) {
    q_start.push_back(q_start.back() + q_len);
    kv_start.push_back(kv_start.back() + kv_len);
  }
  Layout l;
  l.tokens = q_start.back();
  l.slots = kv_start.back() + spare;
  l.host = {i32_tensor(q_start), i32_tensor(kv_start),
            i32_tensor(distinct_slots(h, kv_start.back(), l.slots))};
  return l;
}
AttentionLayout up(Harness& h, const AttentionLayout& l) {
  return {h.up(l.q_start), h.up(l.kv_start), h.up(l.kv_slots)};
}

// --- The cases ------------------------------------------------------------------------

struct OpCase {
  BackendOp op;
  std::string name;
  std::function<void(Harness&)> run;
};

void embedding_case(Harness& h, DType table_dtype, DType out_dtype) {
  const Tensor table = rand(h, {50, 37}, table_dtype);
  const Tensor ids = rand_i32(h, 9, 0, 49);
  Tensor want = Tensor::empty({9, 37}, DType::kF32);
  reference::embedding(ids, table, want);
  Tensor out = h.out({9, 37}, out_dtype);
  h.backend().embedding(h.up(ids), h.up(table), out);
  if (out_dtype == DType::kF32)
    h.same("out", out, want);
  else
    h.close("out", out, want, 4e-3);  // one bf16 rounding
}

void linear_case(Harness& h, int64_t tokens, int64_t in, int64_t outs, DType w_dtype, bool bias) {
  const Tensor x = rand(h, {tokens, in});
  const Tensor w = rand(h, {outs, in}, w_dtype, 1.0f / std::sqrt(static_cast<float>(in)));
  const Tensor b = rand(h, {outs});
  Tensor want = Tensor::empty({tokens, outs}, DType::kF32);
  reference::linear(x, w, bias ? &b : nullptr, want);
  Tensor out = h.out({tokens, outs});
  const Tensor db = h.up(b);
  h.backend().linear(h.up(x), h.up(w), bias ? &db : nullptr, out);
  // A GPU multiplies bf16/f16 weights with activations rounded to their dtype.
  h.close("out", out, want, h.bound(1e-5, w_dtype == DType::kF32 ? 1e-5 : 1e-2));
}

void rms_norm_case(Harness& h, DType act, DType w_dtype) {
  const Tensor x = rand(h, {7, 300}, act, 3.0f), w = rand(h, {300}, w_dtype);
  Tensor want = Tensor::empty({7, 300}, DType::kF32);
  reference::rms_norm(x.to_f32(), w, 1e-5f, want);
  Tensor out = h.out({7, 300}, act);
  h.backend().rms_norm(h.up(x), h.up(w), 1e-5f, out);
  h.close("out", out, want, act == DType::kF32 ? 1e-5 : 8e-3);
}

void add_rms_norm_case(Harness& h, DType act) {
  const Tensor residual = rand(h, {5, 129}, act), x = rand(h, {5, 129}, act), w = rand(h, {129});
  Tensor want_residual = residual.to_f32(), want = Tensor::empty({5, 129}, DType::kF32);
  reference::add_rms_norm(want_residual, x.to_f32(), w, 1e-6f, want);
  Tensor r = h.up(residual), out = h.out({5, 129}, act);
  h.backend().add_rms_norm(r, h.up(x), h.up(w), 1e-6f, out);
  h.close("residual", r, want_residual, act == DType::kF32 ? 1e-6 : 8e-3);
  h.close("out", out, want, act == DType::kF32 ? 1e-5 : 8e-3);
}

void rope_case(Harness& h, RopeStyle style, int head_dim, int rotary, int offset, float scaling) {
  const Tensor freqs = inv_freq(rotary);
  RopeParams p{3, head_dim, rotary, style, &freqs, scaling, offset};
  const Tensor x = rand(h, {6, 3 * head_dim}), positions = rand_i32(h, 6, 0, 4000);
  Tensor want = testing::clone(x);
  reference::rope(want, positions, p);
  const Tensor dfreqs = h.up(freqs);
  RopeParams dp = p;
  dp.inv_freq = &dfreqs;
  Tensor dx = h.up(x);
  h.backend().rope(dx, h.up(positions), dp);
  h.close("x", dx, want, 1e-5);
}

void store_kv_case(Harness& h, DType cache_dtype, DType act) {
  const int64_t T = 6, S = 11;
  const Tensor k = rand(h, {T, 32}, act), v = rand(h, {T, 16}, act);
  std::vector<int32_t> slot = distinct_slots(h, T, S);
  slot[2] = -1;  // a padding token: nothing stored
  const Tensor slots = i32_tensor(slot);
  const Tensor k_cache = rand(h, {S, 2, 16}, cache_dtype), v_cache = rand(h, {S, 16}, cache_dtype);
  Tensor want_k = testing::clone(k_cache), want_v = testing::clone(v_cache);
  reference::store_kv(k.to_f32(), v.to_f32(), slots, want_k, want_v);
  Tensor dk = h.up(k_cache), dv = h.up(v_cache);
  h.backend().store_kv(h.up(k), h.up(v), h.up(slots), dk, dv);
  h.same("k_cache", dk, want_k);
  h.same("v_cache", dv, want_v);
}

void qkv_rope_store_case(Harness& h, bool norms) {
  const int heads = 4, kv_heads = 2, D = 32, T = 5, S = 9;
  const Tensor freqs = inv_freq(D);
  RopeParams rope{0, D, D, RopeStyle::kRotateHalf, &freqs, 1.0f, 0};
  const Tensor qkv = rand(h, {T, (heads + 2 * kv_heads) * D}), q_norm = rand(h, {D}),
               k_norm = rand(h, {D});
  const Tensor positions = rand_i32(h, T, 0, 300), slots = i32_tensor(distinct_slots(h, T, S));
  const Tensor k_cache = rand(h, {S, kv_heads * D}), v_cache = rand(h, {S, kv_heads * D});
  ReferenceBackend reference_backend;
  Tensor want_k = testing::clone(k_cache), want_v = testing::clone(v_cache),
         want_q = Tensor::empty({T, heads * D}, DType::kF32);
  reference_backend.qkv_rope_store(qkv, norms ? &q_norm : nullptr, norms ? &k_norm : nullptr, 1e-6f,
                                   positions, rope, heads, kv_heads, slots, want_k, want_v, want_q);
  const Tensor dfreqs = h.up(freqs), dq_norm = h.up(q_norm), dk_norm = h.up(k_norm);
  RopeParams drope = rope;
  drope.inv_freq = &dfreqs;
  Tensor dk = h.up(k_cache), dv = h.up(v_cache), q = h.out({T, heads * D});
  h.backend().qkv_rope_store(h.up(qkv), norms ? &dq_norm : nullptr, norms ? &dk_norm : nullptr,
                             1e-6f, h.up(positions), drope, heads, kv_heads, h.up(slots), dk, dv,
                             q);
  h.close("q_out", q, want_q, 1e-5);
  h.close("k_cache", dk, want_k, 1e-5);
  h.same("v_cache", dv, want_v);
}

void attention_case(Harness& h, const std::vector<std::pair<int, int>>& seqs, int heads,
                    int kv_heads, int head_dim, int v_head_dim, int window, DType cache_dtype) {
  const Layout l = make_layout(h, seqs);
  const AttentionParams p{
      heads, kv_heads, head_dim, v_head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim)),
      window};
  const Tensor q = rand(h, {l.tokens, int64_t{heads} * head_dim});
  const Tensor k_cache = rand(h, {l.slots, int64_t{kv_heads} * head_dim}, cache_dtype, 2.0f);
  const Tensor v_cache = rand(h, {l.slots, int64_t{kv_heads} * v_head_dim}, cache_dtype);
  Tensor want = Tensor::empty({l.tokens, int64_t{heads} * v_head_dim}, DType::kF32);
  reference::attention(q, k_cache, v_cache, l.host, p, want);
  Tensor out = h.out(want.shape());
  h.backend().attention(h.up(q), h.up(k_cache), h.up(v_cache), up(h, l.host), p, out);
  // The GPU's prefill path multiplies in bf16 on the tensor cores.
  h.close("out", out, want, h.bound(1e-5, 2e-2));
}

void silu_and_mul_case(Harness& h, DType act) {
  const Tensor gate_up = rand(h, {7, 90}, act, 2.0f);
  Tensor want = Tensor::empty({7, 45}, DType::kF32);
  reference::silu_and_mul(gate_up.to_f32(), want);
  Tensor out = h.out({7, 45}, act);
  h.backend().silu_and_mul(h.up(gate_up), out);
  h.close("out", out, want, act == DType::kF32 ? 1e-5 : 8e-3);
}

void add_case(Harness& h, DType act) {
  const Tensor a = rand(h, {3, 5, 7}, act), b = rand(h, {3, 5, 7}, act);
  Tensor want = Tensor::empty({3, 5, 7}, DType::kF32);
  reference::add(a.to_f32(), b.to_f32(), want);
  Tensor out = h.out({3, 5, 7}, act);
  h.backend().add(h.up(a), h.up(b), out);
  if (act == DType::kF32)
    h.same("out", out, want);
  else
    h.close("out", out, want, 4e-3);
}

void softmax_case(Harness& h, bool log) {
  const Tensor x = rand(h, {5, 1000}, DType::kF32, 4.0f);
  Tensor want = Tensor::empty({5, 1000}, DType::kF32);
  (log ? reference::log_softmax : reference::softmax)(x, want);
  Tensor out = h.out({5, 1000});
  const auto op = log ? &Backend::log_softmax : &Backend::softmax;
  (h.backend().*op)(h.up(x), out);
  h.close("out", out, want, 1e-5);
}

void argmax_case(Harness& h) {
  Tensor x = awkward_rows(h, 6, 777);
  for (int64_t c = 0; c < 777; ++c)
    x.data<float>()[5 * 777 + c] = std::numeric_limits<float>::quiet_NaN();
  Tensor want = Tensor::empty({6}, DType::kI32);
  reference::argmax(x, want);
  Tensor out = h.out({6}, DType::kI32);
  h.backend().argmax(h.up(x), out);
  h.same("out", out, want);
}

void sample_case(Harness& h) {
  const int64_t R = 12, V = 300;
  const Tensor logits = rand(h, {R, V}, DType::kF32, 3.0f);
  std::vector<SamplingRow> rows(static_cast<size_t>(R));
  for (size_t r = 0; r < rows.size(); ++r) {
    SamplingRow& s = rows[r];
    s.seed = static_cast<uint64_t>(h.rng().integer(0, 1 << 30));
    s.step = r;
    s.temperature = r % 4 == 0 ? 0.0f : h.rng().uniform(0.3f, 1.5f);
    if (r % 3 == 1) s.top_k = static_cast<int>(h.rng().integer(1, 50));
    if (r % 3 == 2) s.top_p = h.rng().uniform(0.2f, 0.95f);
    if (r % 5 == 3) s.min_p = h.rng().uniform(0.01f, 0.3f);
  }
  Tensor want = Tensor::empty({R}, DType::kI32);
  reference::sample(logits, rows, want);
  Tensor out = h.out({R}, DType::kI32);
  h.backend().sample(h.up(logits), rows, out);
  const Tensor got = h.down(out);
  int64_t differing = 0;
  for (int64_t r = 0; r < R; ++r) {
    const bool same = got.data<int32_t>()[r] == want.data<int32_t>()[r];
    // Greedy rows are exact everywhere; a GPU's exp may move a draw that
    // falls within rounding of a boundary (see reference_ops.h: sample).
    if (rows[static_cast<size_t>(r)].temperature == 0.0f || !h.gpu()) {
      EXPECT_TRUE(same) << "row " << r;
    }
    differing += same ? 0 : 1;
  }
  EXPECT_LE(differing, 1);
}

void adjust_logits_case(Harness& h) {
  const int64_t R = 4, V = 300;
  const Tensor x = awkward_rows(h, R, V);
  std::vector<LogitEdit> edits;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t < V; ++t) {
      if (h.rng().integer(0, 3) != 0) continue;
      LogitEdit e{.row = static_cast<int32_t>(r), .token = static_cast<int32_t>(t)};
      if (h.rng().integer(0, 1)) e.bias = h.rng().uniform(-100.0f, 100.0f);
      if (h.rng().integer(0, 1)) e.repetition = h.rng().uniform(0.5f, 2.0f);
      if (h.rng().integer(0, 1)) e.subtract = h.rng().uniform(-4.0f, 4.0f);
      e.suppress = h.rng().integer(0, 6) == 0;
      edits.push_back(e);
    }
  std::shuffle(edits.begin(), edits.end(), h.rng().engine());
  Tensor want = testing::clone(x);
  reference::adjust_logits(want, edits);
  Tensor got = h.up(x);
  h.backend().adjust_logits(got, edits);
  h.same("logits", got, want);
}

void token_bitmask_case(Harness& h, int64_t rows, int64_t cols) {
  const Tensor x = awkward_rows(h, rows, cols);
  Tensor mask = Tensor::empty({rows, (cols + 31) / 32}, DType::kI32);
  for (int64_t i = 0; i < mask.numel(); ++i)
    mask.data<int32_t>()[i] =
        h.rng().integer(0, 3) == 0 ? -1 : static_cast<int32_t>(h.rng().integer(0, 1 << 30) * 3);
  Tensor want = testing::clone(x);
  reference::apply_token_bitmask(want, mask);
  Tensor got = h.up(x);
  h.backend().apply_token_bitmask(got, h.up(mask));
  h.same("logits", got, want);
}

void top_k_rows_case(Harness& h, int64_t cols, int k) {
  const Tensor x = awkward_rows(h, 7, cols);
  Tensor want_values = testing::poisoned({7, k}), want_ids = testing::poisoned({7, k}, DType::kI32);
  reference::top_k_rows(x, k, want_values, want_ids);
  Tensor values = h.out({7, k}), ids = h.out({7, k}, DType::kI32);
  h.backend().top_k_rows(h.up(x), k, values, ids);
  h.same("values", values, want_values);
  h.same("ids", ids, want_ids);
}

void gather_rows_case(Harness& h) {
  const Tensor x = awkward_rows(h, 9, 130), cols = rand_i32(h, 9, 0, 129);
  Tensor want = Tensor::empty({9}, DType::kF32);
  reference::gather_rows(x, cols, want);
  Tensor out = h.out({9});
  h.backend().gather_rows(h.up(x), h.up(cols), out);
  h.same("out", out, want);
}

// Rows of many ties, NaNs and infinities; the picked entries include them.
void rank_rows_case(Harness& h, int64_t rows, int64_t cols) {
  const Tensor x = awkward_rows(h, rows, cols), picked = rand_i32(h, rows, 0, cols - 1);
  Tensor want = Tensor::empty({rows}, DType::kI32);
  reference::rank_rows(x, picked, want);
  Tensor out = h.out({rows}, DType::kI32);
  h.backend().rank_rows(h.up(x), h.up(picked), out);
  h.same("out", out, want);
}

// count elements of a random src [n] into distinct random places of a random
// dst [m]; the rest of dst keeps its values.
void copy_indexed_case(Harness& h, int64_t n, int64_t m, int64_t count) {
  const Tensor src = rand_i32(h, n, -1000, 1000), dst = rand_i32(h, m, -1000, 1000);
  const Tensor from = rand_i32(h, count, 0, n - 1), to = i32_tensor(distinct_slots(h, count, m));
  Tensor want = Tensor::empty({m}, DType::kI32);
  std::copy_n(dst.data<const int32_t>(), m, want.data<int32_t>());
  reference::copy_indexed(src, from, want, to);
  Tensor out = h.up(dst);
  h.backend().copy_indexed(h.up(src), h.up(from), out, h.up(to));
  h.same("dst", out, want);
}

// Results that came back as rows, one per (token, choice) in any order, a
// few pairs skipped (negative position).
void moe_combine_case(Harness& h, int64_t tokens, int64_t k, int64_t hidden) {
  const int64_t pairs = tokens * k, skipped = std::min<int64_t>(3, pairs), P = pairs - skipped;
  std::vector<int32_t> where(static_cast<size_t>(pairs));
  std::iota(where.begin(), where.end(), 0);
  for (int64_t i = pairs - 1; i > 0; --i) std::swap(where[static_cast<size_t>(i)],
                                                   where[static_cast<size_t>(h.rng().integer(0, i))]);
  for (int32_t& w : where)
    if (w >= P) w = -1;
  const Tensor rows = rand(h, {P, hidden}), weights = rand(h, {tokens, k});
  Tensor positions = i32_tensor(where).reshape({tokens, k});
  Tensor want = Tensor::empty({tokens, hidden}, DType::kF32);
  reference::moe_combine(rows, positions, weights, want);
  Tensor out = h.out({tokens, hidden});
  h.backend().moe_combine(h.up(rows), h.up(positions), h.up(weights), out);
  h.close("out", out, want, h.bound(1e-6, 1e-6));
}

void linear_fp8_block_case(Harness& h, int64_t tokens, int64_t in, int64_t outs) {
  const Tensor x = rand(h, {tokens, in});
  const LinearWeight w = fp8_weight(h, outs, in);
  Tensor want = Tensor::empty({tokens, outs}, DType::kF32);
  reference::linear_fp8_block(x, w.weight, w.scale_inv, want);
  Tensor out = h.out({tokens, outs});
  h.backend().linear_fp8_block(h.up(x), h.up(w.weight), h.up(w.scale_inv), out);
  // A GPU's tensor-core path quantizes the activations to FP8 per 128 columns.
  h.close("out", out, want, h.bound(1e-5, 0.1));
}

// A backend without integer kernels refuses the op; one with them gives the
// reference's bits (the product is defined to the bit: core/int_weights.h).
void linear_int_case(Harness& h, int64_t tokens, int64_t in, int64_t outs, int bits, int64_t group, bool bias) {
  Tensor x = rand(h, {tokens, in});
  if (tokens > 1 && in >= 64) std::fill_n(x.data<float>() + in + 32, 32, 0.0f);  // a block with scale 0
  const LinearWeight w = int_weight(h, outs, in, bits, group);
  const Tensor b = rand(h, {outs}, DType::kBF16, 0.5f);
  Tensor out = h.out({tokens, outs});
  const Tensor db = h.up(b);
  if (!h.backend().supports(BackendOp::kLinearInt)) {
    EXPECT_THROW(h.backend().linear_int(h.up(x), h.up(w), bias ? &db : nullptr, out), Error);
    return;
  }
  Tensor want = Tensor::empty({tokens, outs}, DType::kF32);
  reference::linear_int(x, w, bias ? &b : nullptr, want);
  h.backend().linear_int(h.up(x), h.up(w), bias ? &db : nullptr, out);
  h.same("out", out, want);
  // As a model load leaves the weight (in the backend's own layout where it
  // keeps one): the same bits, and the reference agrees on that layout.
  LinearWeight prepared = h.up(w);
  const Tensor codes_before = prepared.weight;
  h.backend().prepare_int_weight(prepared);
  if (prepared.int_layout.rows_interleaved) {
    EXPECT_NE(prepared.weight.raw(), codes_before.raw()) << "the codes were rewritten in place";
    Tensor want_interleaved = Tensor::empty({tokens, outs}, DType::kF32);
    reference::linear_int(x, prepared, bias ? &b : nullptr, want_interleaved);
    h.same("reference over interleaved rows", want_interleaved, want);
  }
  Tensor out_prepared = h.out({tokens, outs});
  h.backend().linear_int(h.up(x), prepared, bias ? &db : nullptr, out_prepared);
  h.same("out, weight prepared", out_prepared, want);
  // Against the weights' dequantized values: only the activations' rounding apart.
  Tensor deq = Tensor::empty({outs, in}, DType::kF32);
  for (int64_t n = 0; n < outs; ++n)
    for (int64_t k = 0; k < in; ++k) deq.data<float>()[n * in + k] = reference::load_weight(w, n, k);
  Tensor plain = Tensor::empty({tokens, outs}, DType::kF32);
  reference::linear(x, deq, bias ? &b : nullptr, plain);
  h.close("out vs dequantized weights", out, plain, 2e-2);
}

void moe_route_case(Harness& h, int64_t tokens, int64_t experts, MoeRouteParams p, bool bias) {
  const Tensor logits = rand(h, {tokens, experts}, DType::kF32, 2.0f);
  const Tensor b = rand(h, {experts}, DType::kF32, 0.05f);
  Tensor want_ids = Tensor::empty({tokens, p.top_k}, DType::kI32),
         want_w = Tensor::empty({tokens, p.top_k}, DType::kF32);
  reference::moe_route(logits, bias ? &b : nullptr, p, want_ids, want_w);
  Tensor ids = h.out({tokens, p.top_k}, DType::kI32), w = h.out({tokens, p.top_k});
  const Tensor db = h.up(b);
  h.backend().moe_route(h.up(logits), bias ? &db : nullptr, p, ids, w);
  h.same("ids", ids, want_ids);
  h.close("weights", w, want_w, 1e-5);
}

// w_dtype kF32, kBF16 or kF8E4M3 for every expert, kI8 / kU8 for int8 /
// int4 experts (host backends); kF16 stands for a mix (f32, bf16 and
// block-FP8 experts in turn).
void moe_experts_case(Harness& h, DType w_dtype) {
  const int64_t T = 7, H = 256, I = 128, E = 6, K = 2;
  std::vector<MoeExpert> host(static_cast<size_t>(E)), device;
  for (size_t i = 0; i < host.size(); ++i) {
    MoeExpert& e = host[i];
    const DType mixed[] = {DType::kF32, DType::kBF16, DType::kF8E4M3};
    const DType d = w_dtype == DType::kF16 ? mixed[i % 3] : w_dtype;
    if (d == DType::kI8 || d == DType::kU8) {
      const int bits = d == DType::kI8 ? 8 : 4;
      e = {int_weight(h, I, H, bits, 32), int_weight(h, I, H, bits, 64), int_weight(h, H, I, bits, I)};
    } else if (d == DType::kF8E4M3) {
      e = {fp8_weight(h, I, H), fp8_weight(h, I, H), fp8_weight(h, H, I)};
    } else {
      e = {dense_weight(h, I, H, d), dense_weight(h, I, H, d), dense_weight(h, H, I, d)};
    }
    device.push_back({h.up(e.gate), h.up(e.up), h.up(e.down)});
  }
  const Tensor x = rand(h, {T, H});
  if ((w_dtype == DType::kI8 || w_dtype == DType::kU8) && !h.backend().supports(BackendOp::kLinearInt)) return;
  std::vector<int32_t> id;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<int32_t> pick = distinct_slots(h, K, E - 1);  // expert E - 1 gets no token
    id.insert(id.end(), pick.begin(), pick.end());
  }
  const Tensor ids = Tensor::from_i32({T, K}, id), weights = rand(h, {T, K});
  Tensor want = Tensor::empty({T, H}, DType::kF32);
  reference::moe_experts(x, ids, weights, host, want);
  Tensor out = h.out({T, H});
  h.backend().moe_experts(h.up(x), h.up(ids), h.up(weights), device, out);
  const double gpu = w_dtype == DType::kF32 ? 1e-5 : w_dtype == DType::kBF16 ? 1e-2 : 0.1;
  // Integer experts: the two silu implementations may round an activation
  // differently, and the down projection may then quantize it one code apart.
  const bool int_experts = w_dtype == DType::kI8 || w_dtype == DType::kU8;
  h.close("out", out, want, h.bound(int_experts ? 1e-3 : 1e-5, gpu));
  if (int_experts) {
    // The experts as a model load leaves them (prepare_int_weight): the same bits.
    std::vector<MoeExpert> prepared = device;
    for (MoeExpert& e : prepared)
      for (LinearWeight* w : {&e.gate, &e.up, &e.down}) h.backend().prepare_int_weight(*w);
    Tensor out_prepared = h.out({T, H});
    h.backend().moe_experts(h.up(x), h.up(ids), h.up(weights), prepared, out_prepared);
    h.same("out, experts prepared", out_prepared, out);
  }
}

// Expert parallelism: experts [0, 2) and [2, 6) of six as two slices
// (first_expert 0 and 2), each against the whole table with the other
// slice's pairs weighted zero; ids outside every slice (another rank's, or
// negative) add nothing.
void moe_experts_slice_case(Harness& h, DType w_dtype) {
  const int64_t T = 5, H = 256, I = 128, E = 6, K = 3;
  std::vector<MoeExpert> host(static_cast<size_t>(E)), device;
  for (MoeExpert& e : host) {
    if (w_dtype == DType::kF8E4M3) {
      e = {fp8_weight(h, I, H), fp8_weight(h, I, H), fp8_weight(h, H, I)};
    } else {
      e = {dense_weight(h, I, H, w_dtype), dense_weight(h, I, H, w_dtype), dense_weight(h, H, I, w_dtype)};
    }
    device.push_back({h.up(e.gate), h.up(e.up), h.up(e.down)});
  }
  const Tensor x = rand(h, {T, H}), weights = rand(h, {T, K});
  std::vector<int32_t> id;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<int32_t> pick = distinct_slots(h, K, E);
    id.insert(id.end(), pick.begin(), pick.end());
  }
  id[1] = 40;  // no slice's
  id[5] = -3;
  const Tensor ids = Tensor::from_i32({T, K}, id);
  const double gpu = w_dtype == DType::kF32 ? 1e-5 : w_dtype == DType::kBF16 ? 1e-2 : 0.1;
  for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 2}, {2, 4}}) {
    std::vector<int32_t> clamped = id;  // the whole table's view: every id valid
    std::vector<float> masked(weights.data<const float>(), weights.data<const float>() + T * K);
    for (size_t p = 0; p < id.size(); ++p) {
      if (id[p] < first || id[p] >= first + count) masked[p] = 0.0f;
      clamped[p] = std::clamp<int32_t>(id[p], 0, static_cast<int32_t>(E - 1));
    }
    Tensor want = Tensor::empty({T, H}, DType::kF32);
    reference::moe_experts(x, Tensor::from_i32({T, K}, clamped), Tensor::from_f32({T, K}, masked), host, want);
    Tensor out = h.out({T, H});
    const std::span<const MoeExpert> slice =
        std::span<const MoeExpert>(device).subspan(static_cast<size_t>(first), static_cast<size_t>(count));
    h.backend().moe_experts(h.up(x), h.up(ids), h.up(weights), slice, out, first);
    h.close(first == 0 ? "experts [0, 2)" : "experts [2, 6)", out, want, h.bound(1e-5, gpu));
  }
}

// DeepSeek-like MLA dimensions, scaled down.
constexpr int kHeads = 4, kLatent = 64, kNope = 16, kRopeDims = 16, kV = 32;
MlaParams mla_params() {
  return {kHeads,    kLatent, kNope,
          kRopeDims, kV,      1.0f / std::sqrt(static_cast<float>(kNope + kRopeDims))};
}

void mla_store_kv_case(Harness& h, DType cache_dtype) {
  const int64_t T = 6, S = 10;
  const Tensor freqs = inv_freq(kRopeDims);
  const RopeParams rope{1, kRopeDims, kRopeDims, RopeStyle::kInterleaved, &freqs, 1.0f, 0};
  const Tensor kv_a = rand(h, {T, kLatent + kRopeDims}), norm = rand(h, {kLatent});
  std::vector<int32_t> slot = distinct_slots(h, T, S);
  slot[1] = -1;  // padding
  const Tensor positions = rand_i32(h, T, 0, 500), slots = i32_tensor(slot);
  const Tensor cache = rand(h, {S, kLatent + kRopeDims}, cache_dtype);
  Tensor want = testing::clone(cache);
  reference::mla_store_kv(kv_a, norm, 1e-6f, positions, rope, slots, want);
  const Tensor dfreqs = h.up(freqs);
  RopeParams drope = rope;
  drope.inv_freq = &dfreqs;
  Tensor got = h.up(cache);
  h.backend().mla_store_kv(h.up(kv_a), h.up(norm), 1e-6f, h.up(positions), drope, h.up(slots), got);
  h.close("cache", got, want, cache_dtype == DType::kF32 ? 1e-5 : 4e-3);
}

void mla_attention_case(Harness& h, DType cache_dtype, DType kv_b_dtype) {
  const Layout l = make_layout(h, {{1, 9}, {4, 4}, {3, 11}, {1, 1}});
  const MlaParams p = mla_params();
  const Tensor q = rand(h, {l.tokens, kHeads * (kNope + kRopeDims)});
  const Tensor cache = rand(h, {l.slots, kLatent + kRopeDims}, cache_dtype);
  const LinearWeight kv_b = dense_weight(h, kHeads * (kNope + kV), kLatent, kv_b_dtype);
  Tensor want = Tensor::empty({l.tokens, kHeads * kV}, DType::kF32);
  reference::mla_attention(q, cache, kv_b, l.host, p, want);
  Tensor out = h.out(want.shape());
  h.backend().mla_attention(h.up(q), h.up(cache), h.up(kv_b), up(h, l.host), p, out);
  const bool exact_inputs = cache_dtype == DType::kF32 && kv_b_dtype == DType::kF32;
  h.close("out", out, want, h.bound(1e-5, exact_inputs ? 2e-4 : 2e-2));
}

void mla_expand_kv_case(Harness& h, DType out_dtype) {
  const int64_t S = 12, n = 7;
  const MlaParams p = mla_params();
  const Tensor cache = rand(h, {S, kLatent + kRopeDims});
  const Tensor slots = i32_tensor(distinct_slots(h, n, S));
  const LinearWeight kv_b = dense_weight(h, kHeads * (kNope + kV), kLatent, DType::kF32);
  Tensor want_k = Tensor::empty({n, kHeads * (kNope + kRopeDims)}, out_dtype);
  Tensor want_v = Tensor::empty({n, kHeads * kV}, out_dtype);
  reference::mla_expand_kv(cache, slots, kv_b, p, want_k, want_v);
  Tensor k = h.out(want_k.shape(), out_dtype), v = h.out(want_v.shape(), out_dtype);
  h.backend().mla_expand_kv(h.up(cache), h.up(slots), h.up(kv_b), p, k, v);
  const double bound = out_dtype == DType::kF32 ? 1e-5 : 4e-3;  // bf16: one rounding each side
  h.close("k", k, want_k.to_f32(), bound);
  h.close("v", v, want_v.to_f32(), bound);
}

void concat_columns_case(Harness& h) {
  const Tensor a = rand(h, {5, 13}), b = rand(h, {5, 6});
  Tensor want = Tensor::empty({5, 19}, DType::kF32);
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t c = 0; c < 19; ++c)
      want.data<float>()[t * 19 + c] =
          c < 13 ? a.data<const float>()[t * 13 + c] : b.data<const float>()[t * 6 + c - 13];
  Tensor out = h.out({5, 19});
  h.backend().concat_columns(h.up(a), h.up(b), out);
  h.same("out", out, want);
}

// Runs only on host backends: the CUDA backend's embedding takes f32, bf16
// and f16 tables (no checkpoint stores FP8 embeddings).
std::function<void(Harness&)> host_only(std::function<void(Harness&)> run) {
  return [run = std::move(run)](Harness& h) {
    if (h.gpu()) GTEST_SKIP() << h.backend().name() << " does not take this input";
    run(h);
  };
}

// Runs only where the backend computes in bf16.
std::function<void(Harness&)> bf16_only(std::function<void(Harness&)> run) {
  return [run = std::move(run)](Harness& h) {
    if (!h.bf16_activations()) GTEST_SKIP() << h.backend().name() << " keeps activations in f32";
    run(h);
  };
}

std::vector<OpCase> all_cases() {
  using B = BackendOp;
  constexpr DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16, f8 = DType::kF8E4M3;
  std::vector<OpCase> c;
  for (DType t : {f32, bf16, f16})
    c.push_back({B::kEmbedding, fmt::format("table_{}", dtype_name(t)),
                 [t](Harness& h) { embedding_case(h, t, f32); }});
  c.push_back(
      {B::kEmbedding, "table_f8_e4m3", host_only([](Harness& h) { embedding_case(h, f8, f32); })});
  c.push_back(
      {B::kEmbedding, "bf16_out", bf16_only([](Harness& h) { embedding_case(h, bf16, bf16); })});
  for (DType w : {f32, bf16, f16})
    for (auto [tokens, in, outs] :
         {std::tuple<int64_t, int64_t, int64_t>{1, 256, 72}, {5, 96, 130}, {33, 200, 65}})
      c.push_back({B::kLinear, fmt::format("{}_{}x{}x{}", dtype_name(w), tokens, in, outs),
                   [=](Harness& h) { linear_case(h, tokens, in, outs, w, false); }});
  c.push_back({B::kLinear, "f32_bias", [](Harness& h) { linear_case(h, 9, 64, 40, f32, true); }});
  c.push_back(
      {B::kLinear, "bf16_with_bias", [](Harness& h) { linear_case(h, 3, 64, 40, bf16, true); }});
  for (DType w : {f32, bf16, f16})
    c.push_back({B::kRmsNorm, fmt::format("weight_{}", dtype_name(w)),
                 [w](Harness& h) { rms_norm_case(h, f32, w); }});
  c.push_back({B::kRmsNorm, "bf16_activations",
               bf16_only([](Harness& h) { rms_norm_case(h, bf16, bf16); })});
  c.push_back({B::kAddRmsNorm, "f32", [](Harness& h) { add_rms_norm_case(h, f32); }});
  c.push_back({B::kAddRmsNorm, "bf16_activations",
               bf16_only([](Harness& h) { add_rms_norm_case(h, bf16); })});
  c.push_back({B::kRope, "rotate_half",
               [](Harness& h) { rope_case(h, RopeStyle::kRotateHalf, 64, 64, 0, 1.0f); }});
  c.push_back({B::kRope, "partial_rotary",
               [](Harness& h) { rope_case(h, RopeStyle::kRotateHalf, 64, 32, 0, 1.0f); }});
  c.push_back({B::kRope, "interleaved_offset_scaled",
               [](Harness& h) { rope_case(h, RopeStyle::kInterleaved, 48, 16, 32, 1.2f); }});
  for (DType cache : {f32, bf16})
    c.push_back({B::kStoreKv, fmt::format("{}_cache", dtype_name(cache)),
                 [cache](Harness& h) { store_kv_case(h, cache, f32); }});
  c.push_back({B::kStoreKv, "bf16_activations",
               bf16_only([](Harness& h) { store_kv_case(h, bf16, bf16); })});
  c.push_back({B::kQkvRopeStore, "plain", [](Harness& h) { qkv_rope_store_case(h, false); }});
  c.push_back({B::kQkvRopeStore, "qk_norms", [](Harness& h) { qkv_rope_store_case(h, true); }});
  const std::vector<std::pair<int, int>> decode = {{1, 17}, {1, 1}, {1, 40}, {1, 5}};
  const std::vector<std::pair<int, int>> mixed = {{1, 17}, {6, 6}, {3, 20}, {0, 4}, {2, 0}};
  for (DType cache : {f32, bf16}) {
    c.push_back({B::kAttention, fmt::format("decode_gqa_{}", dtype_name(cache)),
                 [=](Harness& h) { attention_case(h, decode, 8, 2, 64, 64, 0, cache); }});
    c.push_back({B::kAttention, fmt::format("mixed_padding_{}", dtype_name(cache)),
                 [=](Harness& h) { attention_case(h, mixed, 4, 4, 128, 128, 0, cache); }});
  }
  c.push_back({B::kAttention, "sliding_window",
               [=](Harness& h) { attention_case(h, mixed, 4, 1, 64, 64, 5, f32); }});
  c.push_back({B::kAttention, "mla_expanded_dims",
               [=](Harness& h) { attention_case(h, mixed, 2, 2, 192, 128, 0, f32); }});
  c.push_back({B::kSiluAndMul, "f32", [](Harness& h) { silu_and_mul_case(h, f32); }});
  c.push_back({B::kSiluAndMul, "bf16_activations",
               bf16_only([](Harness& h) { silu_and_mul_case(h, bf16); })});
  c.push_back({B::kAdd, "f32", [](Harness& h) { add_case(h, f32); }});
  c.push_back({B::kAdd, "bf16_activations", bf16_only([](Harness& h) { add_case(h, bf16); })});
  c.push_back({B::kSoftmax, "rows", [](Harness& h) { softmax_case(h, false); }});
  c.push_back({B::kLogSoftmax, "rows", [](Harness& h) { softmax_case(h, true); }});
  c.push_back({B::kArgmax, "ties_and_nan", argmax_case});
  c.push_back({B::kSample, "mixed_controls", sample_case});
  c.push_back({B::kAdjustLogits, "random_edits", adjust_logits_case});
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 31}, {4, 64}, {5, 1000}})
    c.push_back({B::kApplyTokenBitmask, fmt::format("{}x{}", rows, cols),
                 [=](Harness& h) { token_bitmask_case(h, rows, cols); }});
  for (auto [cols, k] :
       {std::pair<int64_t, int>{1, 1}, {2, 2}, {70, 5}, {64, 64}, {1000, 20}, {5000, 64}})
    c.push_back({B::kTopKRows, fmt::format("{}_of_{}", k, cols),
                 [=](Harness& h) { top_k_rows_case(h, cols, k); }});
  c.push_back({B::kGatherRows, "awkward_rows", gather_rows_case});
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {9, 130}, {3, 5000}})
    c.push_back({B::kRankRows, fmt::format("{}x{}", rows, cols),
                 [=](Harness& h) { rank_rows_case(h, rows, cols); }});
  c.push_back({B::kCopyIndexed, "some_elements", [](Harness& h) { copy_indexed_case(h, 37, 50, 9); }});
  c.push_back({B::kCopyIndexed, "none", [](Harness& h) { copy_indexed_case(h, 4, 6, 0); }});
  c.push_back({B::kLinearFp8Block, "partial_blocks",
               [](Harness& h) { linear_fp8_block_case(h, 5, 300, 257); }});
  c.push_back(
      {B::kLinearFp8Block, "one_token", [](Harness& h) { linear_fp8_block_case(h, 1, 256, 128); }});
  c.push_back({B::kLinearInt, "int8_partial_groups",
               [](Harness& h) { linear_int_case(h, 5, 300, 37, 8, 64, false); }});
  c.push_back({B::kLinearInt, "int4_partial_block_bias",
               [](Harness& h) { linear_int_case(h, 9, 300, 21, 4, 32, true); }});
  c.push_back({B::kLinearInt, "int8_per_channel_one_token",
               [](Harness& h) { linear_int_case(h, 1, 100, 70, 8, 100, true); }});
  c.push_back({B::kLinearInt, "int4_per_channel", [](Harness& h) { linear_int_case(h, 6, 64, 33, 4, 64, false); }});
  c.push_back({B::kLinearInt, "int8_many_tokens", [](Harness& h) { linear_int_case(h, 67, 256, 40, 8, 128, false); }});
  // An odd number of blocks: the last one has no partner (the 512-bit kernel
  // takes blocks in pairs).
  c.push_back({B::kLinearInt, "int8_odd_blocks", [](Harness& h) { linear_int_case(h, 4, 160, 23, 8, 32, true); }});
  c.push_back({B::kLinearInt, "int4_odd_blocks", [](Harness& h) { linear_int_case(h, 2, 224, 19, 4, 32, false); }});
  c.push_back({B::kMoeRoute, "grouped_sigmoid_bias", [](Harness& h) {
                 moe_route_case(h, 37, 64, {MoeScoring::kSigmoid, 8, 8, 4, true, 2.5f}, true);
               }});
  c.push_back({B::kMoeRoute, "softmax_greedy", [](Harness& h) {
                 moe_route_case(h, 9, 64, {MoeScoring::kSoftmax, 6, 1, 1, false, 1.0f}, false);
               }});
  for (DType w : {f32, bf16, f8})
    c.push_back({B::kMoeExperts, fmt::format("weights_{}", dtype_name(w)),
                 [w](Harness& h) { moe_experts_case(h, w); }});
  c.push_back(
      {B::kMoeExperts, "weights_mixed", [](Harness& h) { moe_experts_case(h, DType::kF16); }});
  c.push_back({B::kMoeExperts, "weights_int8", [](Harness& h) { moe_experts_case(h, DType::kI8); }});
  c.push_back({B::kMoeExperts, "weights_int4", [](Harness& h) { moe_experts_case(h, DType::kU8); }});
  for (DType w : {f32, bf16, f8})
    c.push_back({B::kMoeExperts, fmt::format("slice_weights_{}", dtype_name(w)),
                 [w](Harness& h) { moe_experts_slice_case(h, w); }});
  for (DType cache : {f32, bf16})
    c.push_back({B::kMlaStoreKv, fmt::format("{}_cache", dtype_name(cache)),
                 [cache](Harness& h) { mla_store_kv_case(h, cache); }});
  c.push_back({B::kMlaAttention, "f32", [](Harness& h) { mla_attention_case(h, f32, f32); }});
  c.push_back({B::kMlaAttention, "bf16_cache_and_kv_b",
               [](Harness& h) { mla_attention_case(h, bf16, bf16); }});
  c.push_back({B::kMlaExpandKv, "f32", [](Harness& h) { mla_expand_kv_case(h, f32); }});
  c.push_back({B::kMlaExpandKv, "bf16", [](Harness& h) { mla_expand_kv_case(h, bf16); }});
  c.push_back({B::kConcatColumns, "rows", concat_columns_case});
  c.push_back({B::kMoeCombine, "scalar_rows", [](Harness& h) { moe_combine_case(h, 7, 8, 130); }});
  c.push_back({B::kMoeCombine, "vector_rows", [](Harness& h) { moe_combine_case(h, 5, 3, 2048); }});
  c.push_back({B::kMoeCombine, "one_row_left", [](Harness& h) { moe_combine_case(h, 4, 1, 4); }});
  return c;
}

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> table = all_cases();
  return table;
}

// --- The tests ----------------------------------------------------------------------

TEST(BackendOpsTable, EveryOpHasACase) {
  std::vector<int> per_op(static_cast<size_t>(BackendOp::kCount), 0);
  for (const OpCase& c : cases()) ++per_op[static_cast<size_t>(c.op)];
  for (size_t op = 0; op < per_op.size(); ++op)
    EXPECT_GT(per_op[op], 0) << to_string(static_cast<BackendOp>(op)) << " has no case";
}

// The contract's checks run before any backend's work and say what is wrong.
TEST(BackendContract, ErrorsNameTheOpTheArgumentAndTheTensor) {
  for (const BackendUnderTest& under_test : backends_under_test()) {
    std::unique_ptr<Backend> backend = under_test.make();
    if (!backend) continue;
    const Tensor x = backend->empty({2, 8}, DType::kF32), w = backend->empty({4, 9}, DType::kF32);
    Tensor out = backend->empty({2, 4}, DType::kF32);
    const std::string shape = testing::error_of([&] { backend->linear(x, w, nullptr, out); });
    EXPECT_CONTAINS(shape, "linear: x f32[2, 8] and w f32[4, 9] disagree on in_features");
    Tensor host_out = Tensor::empty({2, 4}, DType::kF32);
    if (backend->device() != Device::kCpu) {
      const std::string placement = testing::error_of([&] { backend->add(x, x, host_out); });
      EXPECT_CONTAINS(placement, "add: out must be on the cuda device");
    }
    const Tensor ids = Tensor::from_i32({1}, std::vector<int32_t>{7});
    if (backend->device() == Device::kCpu) {
      Tensor rows = backend->empty({1, 9}, DType::kF32);
      const std::string index = testing::error_of([&] { backend->embedding(ids, w, rows); });
      EXPECT_CONTAINS(index, "embedding: ids[0] = 7 is outside the 4 rows of the table");
    }
  }
}

// Batch invariance (backend.h): the host backends always are and take the
// request as is; the CUDA backend is not by default and becomes so when
// asked; a backend that cannot be refuses, naming itself.
TEST(BackendContract, BatchInvariance) {
  for (const BackendUnderTest& under_test : backends_under_test()) {
    std::unique_ptr<Backend> backend = under_test.make();
    if (!backend) continue;
    SCOPED_TRACE(std::string(backend->name()));
    EXPECT_EQ(backend->batch_invariant(), backend->device() == Device::kCpu);
    backend->set_batch_invariant(true);
    EXPECT_TRUE(backend->batch_invariant());
  }
  // The base class's answer, for a backend with no such mode.
  struct Shaped final : ForwardingBackend {
    using ForwardingBackend::ForwardingBackend;
    std::string_view name() const override { return "shaped"; }
    bool batch_invariant() const override { return false; }
    void set_batch_invariant(bool on) override { Backend::set_batch_invariant(on); }
  };
  ReferenceBackend reference;
  Shaped shaped(reference);
  shaped.set_batch_invariant(false);
  EXPECT_CONTAINS(testing::error_of([&] { shaped.set_batch_invariant(true); }),
                  "the shaped backend has no batch-invariant mode");
}

// upload() is ordered after the ops already enqueued, and its source can be
// overwritten at once: more uploads than the staging buffers, each behind a
// long op, each source scribbled over right after.
TEST(BackendContract, UploadIsOrderedAndLeavesTheSourceFree) {
  for (const BackendUnderTest& under_test : backends_under_test()) {
    std::unique_ptr<Backend> backend = under_test.make();
    if (!backend) continue;
    const int64_t n = 1 << 16;
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i % 977) - 400.0f;
    Tensor host = Tensor::from_f32({4, n / 4}, values);
    std::vector<Tensor> uploaded;
    for (int round = 0; round < 9; ++round) {
      Tensor big = backend->empty({4, n / 4}, DType::kF32);
      backend->copy(host, big);
      Tensor soft = backend->empty({4, n / 4}, DType::kF32);
      backend->softmax(big, soft);  // enqueued work the upload follows
      Tensor dst = backend->empty({4, n / 4}, DType::kF32);
      Tensor src = Tensor::from_f32({4, n / 4}, std::vector<float>(static_cast<size_t>(n), static_cast<float>(round)));
      backend->upload(src, dst);
      std::fill_n(src.data<float>(), n, -1.0f);
      uploaded.push_back(dst);
    }
    for (size_t round = 0; round < uploaded.size(); ++round) {
      Tensor back = Tensor::empty({4, n / 4}, DType::kF32);
      backend->copy(uploaded[round], back);
      EXPECT_EQ(std::count(back.data<float>(), back.data<float>() + n, static_cast<float>(round)), n)
          << under_test.name << " round " << round;
    }
    const Tensor wrong = Tensor::empty({2}, DType::kF32);
    Tensor device_dst = backend->empty({3}, DType::kF32);
    EXPECT_THROW(backend->upload(wrong, device_dst), Error) << under_test.name;
  }
}

// copy() of host tensors larger than the CUDA backend's staging chunks (the
// weights at load, each written into a row range of a fused device tensor):
// every byte lands, in the right rows, the neighbours untouched, also when
// the copy follows an upload that uses the same staging buffers.
TEST(BackendContract, LargeHostCopiesIntoRowRangesLandExactly) {
  for (const BackendUnderTest& under_test : backends_under_test()) {
    std::unique_ptr<Backend> backend = under_test.make();
    if (!backend) continue;
    const int64_t cols = 4099;  // rows of an odd byte count
    const int64_t rows_a = 1531, rows_b = 2053;  // 25 MB and 34 MB of f32: several chunks, a partial last
    TestRng rng;
    const Tensor a = random_tensor(rng, {rows_a, cols}, DType::kF32);
    const Tensor b = random_tensor(rng, {rows_b, cols}, DType::kF32);
    Tensor fused = backend->empty({rows_a + rows_b + 2, cols}, DType::kF32);
    const Tensor edge = Tensor::from_f32({1, cols}, std::vector<float>(static_cast<size_t>(cols), -3.0f));
    Tensor first = fused.rows(0, 1), last = fused.rows(rows_a + rows_b + 1, 1);
    backend->copy(edge, first);
    backend->copy(edge, last);
    Tensor small_dst = backend->empty({1, cols}, DType::kF32);
    backend->upload(edge, small_dst);  // a staging buffer in use, then reused by the large copy
    Tensor into_a = fused.rows(1, rows_a), into_b = fused.rows(1 + rows_a, rows_b);
    backend->copy(a, into_a);
    backend->copy(b, into_b);
    Tensor back = Tensor::empty({rows_a + rows_b + 2, cols}, DType::kF32);
    backend->copy(fused, back);
    const auto bytes_of = [](const Tensor& t) { return static_cast<size_t>(t.nbytes()); };
    EXPECT_EQ(std::memcmp(back.rows(0, 1).raw(), edge.raw(), bytes_of(edge)), 0) << under_test.name;
    EXPECT_EQ(std::memcmp(back.rows(1, rows_a).raw(), a.raw(), bytes_of(a)), 0) << under_test.name;
    EXPECT_EQ(std::memcmp(back.rows(1 + rows_a, rows_b).raw(), b.raw(), bytes_of(b)), 0) << under_test.name;
    EXPECT_EQ(std::memcmp(back.rows(rows_a + rows_b + 1, 1).raw(), edge.raw(), bytes_of(edge)), 0)
        << under_test.name;
    Tensor small_back = Tensor::empty({1, cols}, DType::kF32);
    backend->copy(small_dst, small_back);
    EXPECT_EQ(std::memcmp(small_back.raw(), edge.raw(), bytes_of(edge)), 0) << under_test.name;
  }
}

// download() is ordered after the ops already enqueued and leaves the host
// free until wait(): several downloads behind long ops, waited out of order
// (the CUDA backend's pinned buffers go back and are reused between them),
// one dropped unwaited, a reused buffer grown for a larger copy, and the
// host-memory rule.
TEST(BackendContract, DownloadIsOrderedAndLandsAtWait) {
  for (const BackendUnderTest& under_test : backends_under_test()) {
    std::unique_ptr<Backend> backend = under_test.make();
    if (!backend) continue;
    const int64_t n = 1 << 16;
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i % 977) - 400.0f;
    const Tensor host = Tensor::from_f32({4, n / 4}, values);
    Tensor big = backend->empty({4, n / 4}, DType::kF32);
    backend->copy(host, big);
    Tensor expected = Tensor::empty({4, n / 4}, DType::kF32);
    reference::softmax(host, expected);
    for (int round = 0; round < 3; ++round) {
      std::vector<Tensor> landed;
      std::vector<std::unique_ptr<Backend::PendingDownload>> pending;
      for (int i = 0; i < 4; ++i) {
        const int64_t rows = 1 + (round + i) % 4;  // sizes vary, so a reused buffer must grow
        Tensor soft = backend->empty({rows, n / 4}, DType::kF32);
        backend->softmax(big.rows(0, rows), soft);  // the work the download follows
        landed.push_back(Tensor::from_f32({rows, n / 4}, std::vector<float>(static_cast<size_t>(rows * n / 4), -7.0f)));
        pending.push_back(backend->download(soft, landed.back()));
      }
      Tensor dropped_into = Tensor::empty({1, n / 4}, DType::kF32);
      backend->download(big.rows(0, 1), dropped_into).reset();  // never waited
      for (int i = 3; i >= 0; --i) {
        pending[static_cast<size_t>(i)]->wait();
        pending[static_cast<size_t>(i)]->wait();  // again: nothing more
        const Tensor& got = landed[static_cast<size_t>(i)];
        const int64_t count = got.numel();
        double worst = 0;
        for (int64_t j = 0; j < count; ++j)
          worst = std::max(worst, static_cast<double>(std::fabs(got.data<float>()[j] - expected.data<float>()[j])));
        EXPECT_LT(worst, 1e-5) << under_test.name << " round " << round << " download " << i;
      }
    }
    Tensor device_src = backend->empty({3}, DType::kF32);
    if (backend->device() != Device::kCpu) {
      Tensor device_dst = backend->empty({3}, DType::kF32);
      EXPECT_THROW(backend->download(device_src, device_dst), Error) << under_test.name;
    }
    Tensor wrong = Tensor::empty({2}, DType::kF32);
    EXPECT_THROW(backend->download(device_src, wrong), Error) << under_test.name;
  }
}

struct Param {
  size_t backend;
  size_t op_case;
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << backends_under_test()[p.backend].name << " / " << to_string(cases()[p.op_case].op) << " "
      << cases()[p.op_case].name;
}

class BackendOps : public ::testing::TestWithParam<Param> {};

TEST_P(BackendOps, MatchesTheReference) {
  const BackendUnderTest under_test = backends_under_test()[GetParam().backend];
  std::unique_ptr<Backend> backend = under_test.make();
  if (!backend) GTEST_SKIP() << under_test.name << " is not available here";
  const OpCase& c = cases()[GetParam().op_case];
  // Integer weights are for host backends; the case checks that others refuse them.
  ASSERT_TRUE(backend->supports(c.op) || c.op == BackendOp::kLinearInt) << to_string(c.op);
  TestRng rng;
  Harness h(*backend, rng);
  c.run(h);
}

std::vector<Param> all_params() {
  std::vector<Param> params;
  for (size_t b = 0; b < backends_under_test().size(); ++b)
    for (size_t i = 0; i < cases().size(); ++i) params.push_back({b, i});
  return params;
}

INSTANTIATE_TEST_SUITE_P(Table, BackendOps, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           const OpCase& c = cases()[info.param.op_case];
                           return fmt::format("{}_{}_{}",
                                              backends_under_test()[info.param.backend].name,
                                              to_string(c.op), c.name);
                         });

}  // namespace
}  // namespace basalt
