#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/sampling.h"
#include "backend/cpu/simd.h"
#include "backend/host_qkv.h"
#include "backend/reference_ops.h"
#include "core/error.h"

namespace basalt {
namespace {

using cpu::kLanes;
using cpu::Vec;

// Elements of work below which a parallel region costs more than it saves
// (a wake-up of the pool is a few microseconds).
constexpr int64_t kMinTaskElements = 1 << 14;

int64_t rows_per_task(int64_t row_elements) {
  return std::max<int64_t>(1, kMinTaskElements / std::max<int64_t>(1, row_elements));
}

// --- copy() validation (the ops are checked by Backend, backend.cc) ---------

void check_host(const Tensor& t, const char* op, const char* name) {
  BASALT_CHECK(t.device() == Device::kCpu, "{}: {} must be a host tensor for the cpu backend, got {}",
               op, name, t.describe());
  BASALT_CHECK(t.numel() == 0 || t.raw() != nullptr, "{}: {} {} has no memory", op, name,
               t.describe());
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.raw());
  const char* pb = static_cast<const char*>(b.raw());
  return a.nbytes() && b.nbytes() && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// --- Conversions ------------------------------------------------------------

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// dst[0, n) = f32(src[offset, offset + n)) for any floating dtype.
void to_f32(const void* src, DType dtype, int64_t offset, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kF32:
      if (n) std::memmove(dst, static_cast<const float*>(src) + offset, n * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) cpu::vstore(dst + i, cpu::vload_bf16(s + i));
      for (; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) cpu::vstore(dst + i, cpu::vload_f16(s + i));
      for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* s = static_cast<const uint8_t*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = fp8_table()[s[i]];
      return;
    }
    default: fail("cannot convert {} to f32", dtype_name(dtype));
  }
}

// dst[offset, offset + n) = src[0, n) rounded to nearest even in dtype.
void from_f32(const float* src, int64_t n, void* dst, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kF32:
      if (n) std::memmove(static_cast<float*>(dst) + offset, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      uint8_t* d = static_cast<uint8_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp8e4m3(src[i]);
      return;
    }
    default: fail("cannot convert f32 to {}", dtype_name(dtype));
  }
}

// A small weight vector as f32: the tensor's own memory when it is f32.
const float* weight_as_f32(const Tensor& weight, std::vector<float>& storage) {
  if (weight.dtype() == DType::kF32) return weight.data<const float>();
  storage.resize(static_cast<size_t>(weight.numel()));
  to_f32(weight.raw(), weight.dtype(), 0, weight.numel(), storage.data());
  return storage.data();
}

// --- Row kernels ------------------------------------------------------------

float sum_of_squares(const float* x, int64_t n) {
  Vec acc0 = cpu::vzero(), acc1 = cpu::vzero();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const Vec a = cpu::vload(x + i), b = cpu::vload(x + i + kLanes);
    acc0 = cpu::vfma(a, a, acc0);
    acc1 = cpu::vfma(b, b, acc1);
  }
  for (; i < n; i += kLanes) {
    const Vec a = cpu::vload_partial(x + i, static_cast<int>(std::min<int64_t>(kLanes, n - i)));
    acc0 = cpu::vfma(a, a, acc0);
  }
  return cpu::vsum(cpu::vadd(acc0, acc1));
}

// out = (x * inv_rms) * weight, in the order of HF's LlamaRMSNorm.
void normalize_row(const float* x, const float* weight, int64_t n, float eps, float* out) {
  const float inv_rms = 1.0f / std::sqrt(sum_of_squares(x, n) / static_cast<float>(n) + eps);
  const Vec scale = cpu::vset(inv_rms);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    cpu::vstore(out + i, cpu::vmul(cpu::vmul(cpu::vload(x + i), scale), cpu::vload(weight + i)));
  }
  for (; i < n; ++i) out[i] = x[i] * inv_rms * weight[i];
}

// Writes exp(x - shift) to out (may alias x) and returns its sum.
float exp_shifted(const float* x, int64_t n, float shift, float* out) {
  const Vec s = cpu::vset(shift);
  Vec total = cpu::vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec e = cpu::vexp(cpu::vsub(cpu::vload(x + i), s));
    cpu::vstore(out + i, e);
    total = cpu::vadd(total, e);
  }
  float sum = cpu::vsum(total);
  for (; i < n; ++i) {
    out[i] = std::exp(x[i] - shift);
    sum += out[i];
  }
  return sum;
}

}  // namespace

// --- Ops ----------------------------------------------------------------------

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  check_host(src, "copy", "src");
  check_host(dst, "copy", "dst");
  BASALT_CHECK(src.numel() == dst.numel(), "copy: src {} and dst {} differ in element count",
               src.describe(), dst.describe());
  if (src.dtype() == dst.dtype()) {
    if (src.nbytes()) std::memmove(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  BASALT_CHECK(is_floating(src.dtype()) && is_floating(dst.dtype()) && !overlaps(src, dst),
               "copy: cannot convert {} into {}", src.describe(), dst.describe());
  constexpr int64_t kChunk = 4096;
  pool_->parallel_for(
      (src.numel() + kChunk - 1) / kChunk,
      [&](int64_t c0, int64_t c1) {
        float buffer[kChunk];
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t begin = c * kChunk, n = std::min(kChunk, src.numel() - begin);
          to_f32(src.raw(), src.dtype(), begin, n, buffer);
          from_f32(buffer, n, dst.raw(), dst.dtype(), begin);
        }
      },
      rows_per_task(kChunk));
}

void CpuBackend::embedding_impl(const Tensor& ids, const Tensor& table, Tensor& out) {
  const int64_t tokens = ids.dim(0), hidden = table.dim(1);
  const int32_t* id = ids.data<const int32_t>();
  pool_->parallel_for(
      tokens,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          to_f32(table.raw(), table.dtype(), id[t] * hidden, hidden, out.data<float>() + t * hidden);
        }
      },
      rows_per_task(hidden));
}

void CpuBackend::linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  const int64_t tokens = x.dim(0), in = x.dim(1), outs = w.dim(0);
  cpu::linear_f32(*pool_, x.data<const float>(), tokens, in, w.raw(), w.dtype(), outs,
                  bias ? bias->raw() : nullptr, bias ? bias->dtype() : DType::kF32,
                  out.data<float>(), bf16_activations_);
}

void CpuBackend::rms_norm_impl(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  std::vector<float> storage;
  const float* w = weight_as_f32(weight, storage);
  pool_->parallel_for(
      tokens,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          normalize_row(x.data<const float>() + t * hidden, w, hidden, eps,
                        out.data<float>() + t * hidden);
        }
      },
      rows_per_task(hidden));
}

void CpuBackend::add_rms_norm_impl(Tensor& residual, const Tensor& x, const Tensor& weight,
                                   float eps, Tensor& out) {
  const int64_t tokens = residual.dim(0), hidden = residual.dim(1);
  std::vector<float> storage;
  const float* w = weight_as_f32(weight, storage);
  pool_->parallel_for(
      tokens,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          // Row by row, so out may alias x or residual.
          float* r = residual.data<float>() + t * hidden;
          const float* xr = x.data<const float>() + t * hidden;
          for (int64_t i = 0; i < hidden; ++i) r[i] += xr[i];
          normalize_row(r, w, hidden, eps, out.data<float>() + t * hidden);
        }
      },
      rows_per_task(hidden));
}

void CpuBackend::rope_impl(Tensor& x, const Tensor& positions, const RopeParams& params) {
  const int64_t heads = params.num_heads, head_dim = params.head_dim, rotary = params.rotary_dim;
  const int64_t tokens = x.dim(0);
  const int64_t half = rotary / 2;
  const float* inv_freq = params.inv_freq->data<const float>();
  const int32_t* pos = positions.data<const int32_t>();
  const bool rotate_half = params.style == RopeStyle::kRotateHalf;
  pool_->parallel_for(
      tokens,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> cos_table(static_cast<size_t>(half)), sin_table(static_cast<size_t>(half));
        for (int64_t t = t0; t < t1; ++t) {
          // One table per token, shared by all heads.
          const float position = static_cast<float>(pos[t]);
          for (int64_t i = 0; i < half; ++i) {
            const float angle = position * inv_freq[i];
            cos_table[i] = std::cos(angle) * params.attention_scaling;
            sin_table[i] = std::sin(angle) * params.attention_scaling;
          }
          for (int64_t h = 0; h < heads; ++h) {
            float* head = x.data<float>() + (t * heads + h) * head_dim + params.rotary_offset;
            if (rotate_half) {
              float* a = head;
              float* b = head + half;
              for (int64_t i = 0; i < half; ++i) {
                const float ai = a[i], bi = b[i];
                a[i] = ai * cos_table[i] - bi * sin_table[i];
                b[i] = bi * cos_table[i] + ai * sin_table[i];
              }
            } else {
              for (int64_t i = 0; i < half; ++i) {
                const float ai = head[2 * i], bi = head[2 * i + 1];
                head[2 * i] = ai * cos_table[i] - bi * sin_table[i];
                head[2 * i + 1] = bi * cos_table[i] + ai * sin_table[i];
              }
            }
          }
        }
      },
      rows_per_task(heads * rotary * 2 + half * 40));
}

void CpuBackend::qkv_rope_store_impl(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm,
                                     float eps, const Tensor& positions, const RopeParams& rope,
                                     int num_heads, int num_kv_heads, const Tensor& slots,
                                     Tensor& k_cache, Tensor& v_cache, Tensor& q_out) {
  host_qkv_rope_store(*this, qkv, q_norm, k_norm, eps, positions, rope, num_heads, num_kv_heads, slots,
                      k_cache, v_cache, q_out);
}

void CpuBackend::store_kv_impl(const Tensor& k, const Tensor& v, const Tensor& slots,
                               Tensor& k_cache, Tensor& v_cache) {
  const int64_t tokens = k.dim(0);
  const int32_t* slot = slots.data<const int32_t>();
  const int64_t k_width = k.dim(1), v_width = v.dim(1);
  pool_->parallel_for(
      tokens,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          if (slot[t] < 0) continue;  // a padding token: nothing is stored
          from_f32(k.data<const float>() + t * k_width, k_width, k_cache.raw(), k_cache.dtype(),
                   slot[t] * k_width);
          from_f32(v.data<const float>() + t * v_width, v_width, v_cache.raw(), v_cache.dtype(),
                   slot[t] * v_width);
        }
      },
      rows_per_task(k_width + v_width));
}

void CpuBackend::attention_impl(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                const AttentionLayout& layout, const AttentionParams& params,
                                Tensor& out) {
  const int64_t seqs = layout.q_start.dim(0) - 1;
  const int32_t* q_start = layout.q_start.data<const int32_t>();
  const int32_t* kv_start = layout.kv_start.data<const int32_t>();
  const int32_t* kv_slots = layout.kv_slots.data<const int32_t>();
  cpu::AttentionArgs args;
  args.q = q.data<const float>();
  args.k_cache = k_cache.raw();
  args.k_dtype = k_cache.dtype();
  args.v_cache = v_cache.raw();
  args.v_dtype = v_cache.dtype();
  args.q_start = q_start;
  args.kv_start = kv_start;
  args.kv_slots = kv_slots;
  args.num_seqs = seqs;
  args.params = params;
  args.out = out.data<float>();
  cpu::attention_f32(*pool_, args);
}

void CpuBackend::silu_and_mul_impl(const Tensor& gate_up, Tensor& out) {
  const int64_t tokens = gate_up.dim(0), inter = gate_up.dim(1) / 2;
  pool_->parallel_for(
      tokens,
      [&](int64_t t0, int64_t t1) {
        const Vec one = cpu::vset(1.0f), zero = cpu::vzero();
        for (int64_t t = t0; t < t1; ++t) {
          const float* gate = gate_up.data<const float>() + t * 2 * inter;
          const float* up = gate + inter;
          float* o = out.data<float>() + t * inter;
          int64_t i = 0;
          for (; i + kLanes <= inter; i += kLanes) {
            const Vec g = cpu::vload(gate + i);
            const Vec silu = cpu::vdiv(g, cpu::vadd(one, cpu::vexp(cpu::vsub(zero, g))));
            cpu::vstore(o + i, cpu::vmul(silu, cpu::vload(up + i)));
          }
          for (; i < inter; ++i) o[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
        }
      },
      rows_per_task(inter * 8));
}

void CpuBackend::add_impl(const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr int64_t kChunk = 4096;
  const int64_t n = a.numel();
  pool_->parallel_for(
      (n + kChunk - 1) / kChunk,
      [&](int64_t c0, int64_t c1) {
        const float* pa = a.data<const float>();
        const float* pb = b.data<const float>();
        float* po = out.data<float>();
        const int64_t end = std::min(n, c1 * kChunk);
        for (int64_t i = c0 * kChunk; i < end; ++i) po[i] = pa[i] + pb[i];
      },
      rows_per_task(kChunk));
}

namespace {

void softmax_op(ThreadPool& pool, const Tensor& x, Tensor& out, bool log) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  pool.parallel_for(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* in = x.data<const float>() + r * cols;
          float* o = out.data<float>() + r * cols;
          const float max_value = cpu::row_max(in, cols);
          if (log) {
            // Sum the exponentials without storing them: out may alias x.
            const Vec shift = cpu::vset(max_value);
            Vec total = cpu::vzero();
            int64_t i = 0;
            for (; i + kLanes <= cols; i += kLanes) {
              total = cpu::vadd(total, cpu::vexp(cpu::vsub(cpu::vload(in + i), shift)));
            }
            float sum = cpu::vsum(total);
            for (; i < cols; ++i) sum += std::exp(in[i] - max_value);
            const float offset = max_value + std::log(sum);
            for (i = 0; i < cols; ++i) o[i] = in[i] - offset;
          } else {
            const float inv = 1.0f / exp_shifted(in, cols, max_value, o);
            for (int64_t i = 0; i < cols; ++i) o[i] *= inv;
          }
        }
      },
      rows_per_task(cols * 4));
}

}  // namespace

void CpuBackend::softmax_impl(const Tensor& x, Tensor& out) { softmax_op(*pool_, x, out, false); }

void CpuBackend::log_softmax_impl(const Tensor& x, Tensor& out) {
  softmax_op(*pool_, x, out, true);
}

void CpuBackend::argmax_impl(const Tensor& logits, Tensor& out) {
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  pool_->parallel_for(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          out.data<int32_t>()[r] = cpu::argmax_row(logits.data<const float>() + r * vocab, vocab);
        }
      },
      rows_per_task(vocab));
}

void CpuBackend::sample_impl(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out) {
  const int64_t count = logits.dim(0), vocab = logits.dim(1);
  pool_->parallel_for(
      count,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          out.data<int32_t>()[r] =
              cpu::sample_row(logits.data<const float>() + r * vocab, vocab, rows[r]);
        }
      },
      rows_per_task(vocab * 4));
}

void CpuBackend::adjust_logits_impl(Tensor& logits, std::span<const LogitEdit> edits) {
  float* data = logits.data<float>();
  for (const LogitEdit& e : edits) {
    float& x = data[e.row * logits.dim(1) + e.token];
    x = apply_logit_edit(x, e);
  }
}

void CpuBackend::apply_token_bitmask_impl(Tensor& logits, const Tensor& bitmask) {
  const int64_t vocab = logits.dim(1), words = bitmask.dim(1);
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    float* row = logits.data<float>() + r * vocab;
    const int32_t* mask = bitmask.data<const int32_t>() + r * words;
    for (int64_t w = 0; w < words; ++w) {
      const auto word = static_cast<uint32_t>(mask[w]);
      if (word == ~uint32_t{0}) continue;  // the common case: everything allowed
      const int64_t end = std::min<int64_t>(vocab, (w + 1) * 32);
      for (int64_t t = w * 32; t < end; ++t)
        if (((word >> (t - w * 32)) & 1u) == 0) row[t] = -std::numeric_limits<float>::infinity();
    }
  }
}

void CpuBackend::top_k_rows_impl(const Tensor& x, int k, Tensor& values, Tensor& ids) {
  const int64_t cols = x.dim(1);
  pool_->parallel_for(
      x.dim(0),
      [&](int64_t r0, int64_t r1) {
        std::vector<int32_t> head;
        for (int64_t r = r0; r < r1; ++r) {
          const float* row = x.data<const float>() + r * cols;
          // A heap of the k best so far, its worst on top.
          const auto better = [&](int32_t a, int32_t b) {
            return reference::ranks_before(row[a], a, row[b], b);
          };
          head.clear();
          for (int64_t c = 0; c < cols; ++c) {
            const int32_t i = static_cast<int32_t>(c);
            if (head.size() < static_cast<size_t>(k)) {
              head.push_back(i);
              std::push_heap(head.begin(), head.end(), better);
            } else if (better(i, head.front())) {
              std::pop_heap(head.begin(), head.end(), better);
              head.back() = i;
              std::push_heap(head.begin(), head.end(), better);
            }
          }
          std::sort_heap(head.begin(), head.end(), better);
          for (int j = 0; j < k; ++j) {
            values.data<float>()[r * k + j] = row[head[static_cast<size_t>(j)]];
            ids.data<int32_t>()[r * k + j] = head[static_cast<size_t>(j)];
          }
        }
      },
      rows_per_task(cols * 2));
}

void CpuBackend::gather_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) {
  for (int64_t r = 0; r < x.dim(0); ++r) {
    const int32_t c = cols.data<const int32_t>()[r];
    out.data<float>()[r] = x.data<const float>()[r * x.dim(1) + c];
  }
}

void CpuBackend::rank_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) {
  const int64_t C = x.dim(1);
  pool_->parallel_for(
      x.dim(0),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const float* row = x.data<const float>() + r * C;
          const float at = row[cols.data<const int32_t>()[r]];
          int32_t above = 0;
          for (int64_t j = 0; j < C; ++j) above += row[j] > at ? 1 : 0;
          out.data<int32_t>()[r] = 1 + above;
        }
      },
      rows_per_task(C));
}
void CpuBackend::copy_indexed_impl(const Tensor& src, const Tensor& src_index, Tensor& dst, const Tensor& dst_index) {
  const int32_t* from = src_index.data<const int32_t>();
  const int32_t* to = dst_index.data<const int32_t>();
  for (int64_t k = 0; k < src_index.numel(); ++k) dst.data<int32_t>()[to[k]] = src.data<const int32_t>()[from[k]];
}

namespace {

// The pool is a base constructed before CpuBackend, which keeps a pointer to it.
struct OwnPool {
  explicit OwnPool(int threads) : pool(threads) {}
  ThreadPool pool;
};

class CpuBackendWithPool final : private OwnPool, public CpuBackend {
 public:
  CpuBackendWithPool(int threads, cpu::Bf16Activations mode) : OwnPool(threads), CpuBackend(&pool, mode) {}
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend_with_threads(int threads, cpu::Bf16Activations bf16_activations) {
  return std::make_unique<CpuBackendWithPool>(std::max(1, threads), bf16_activations);
}

}  // namespace basalt
