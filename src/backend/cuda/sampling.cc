#include "backend/cuda/sampling.h"

#include <cmath>
#include <cstddef>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/sampling_kernels.h"
#include "backend/reference_ops.h"
#include "core/error.h"

namespace basalt {
namespace {

using cuda_kernels::EditRecord;
using cuda_kernels::SampleControls;

static_assert(sizeof(SampleControls) == sizeof(SamplingRow) &&
              offsetof(SampleControls, temperature) == offsetof(SamplingRow, temperature) &&
              offsetof(SampleControls, top_k) == offsetof(SamplingRow, top_k) &&
              offsetof(SampleControls, top_p) == offsetof(SamplingRow, top_p) &&
              offsetof(SampleControls, min_p) == offsetof(SamplingRow, min_p) &&
              offsetof(SampleControls, seed) == offsetof(SamplingRow, seed) &&
              offsetof(SampleControls, step) == offsetof(SamplingRow, step));
static_assert(sizeof(EditRecord) == sizeof(LogitEdit) && offsetof(EditRecord, row) == offsetof(LogitEdit, row) &&
              offsetof(EditRecord, token) == offsetof(LogitEdit, token) &&
              offsetof(EditRecord, bias) == offsetof(LogitEdit, bias) &&
              offsetof(EditRecord, repetition) == offsetof(LogitEdit, repetition) &&
              offsetof(EditRecord, subtract) == offsetof(LogitEdit, subtract) &&
              offsetof(EditRecord, suppress) == offsetof(LogitEdit, suppress));

void require_device(const Tensor& t, const char* op, const char* name) {
  BASALT_CHECK(t.device() == Device::kCuda, "cuda {}: {} must be on the device, got {}", op, name, t.describe());
}

void launched(cudaError_t status, const char* op) {
  BASALT_CHECK(status == cudaSuccess, "cuda {}: launch failed: {}", op, cudaGetErrorString(status));
}

// Uploads `bytes` of host memory into a fresh device block (no wait: a
// pageable source has been staged when cudaMemcpyAsync returns).
Tensor upload(const void* data, int64_t bytes, cudaStream_t stream) {
  Tensor t = cuda_empty({(bytes + 3) / 4}, DType::kI32);
  BASALT_CUDA_CHECK(cudaMemcpyAsync(t.raw(), data, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream));
  return t;
}

// Bits of fixed point for the masses: cols * 2^shift stays within 2^62.
int mass_shift(int64_t cols) {
  int bits = 0;
  while ((int64_t{1} << bits) < cols) ++bits;
  return bits > 18 ? 62 - bits : 44;
}

}  // namespace

void cuda_sample(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out, cudaStream_t stream) {
  require_device(logits, "sample", "logits");
  require_device(out, "sample", "out");
  BASALT_CHECK(logits.dtype() == DType::kF32 && logits.rank() == 2 && logits.dim(1) > 0,
               "cuda sample: logits must be f32 [R, V] with V > 0, got {}", logits.describe());
  const int64_t count = logits.dim(0), vocab = logits.dim(1);
  BASALT_CHECK(vocab < (int64_t{1} << 31), "cuda sample: vocabulary {} is too large", vocab);
  BASALT_CHECK(static_cast<int64_t>(rows.size()) == count, "cuda sample: {} rows of controls for logits {}",
               rows.size(), logits.describe());
  BASALT_CHECK(out.dtype() == DType::kI32 && out.shape() == Shape({count}), "cuda sample: out must be i32 [{}], got {}",
               count, out.describe());
  for (size_t r = 0; r < rows.size(); ++r) {
    const SamplingRow& c = rows[r];
    BASALT_CHECK(std::isfinite(c.temperature) && c.temperature >= 0.0f && c.top_k >= 0 && c.top_p > 0.0f &&
                     c.top_p <= 1.0f && c.min_p >= 0.0f && c.min_p <= 1.0f,
                 "cuda sample: row {} has invalid controls (temperature {}, top_k {}, top_p {}, min_p {})", r,
                 c.temperature, c.top_k, c.top_p, c.min_p);
  }
  if (count == 0) return;
  const Tensor controls = upload(rows.data(), static_cast<int64_t>(rows.size_bytes()), stream);
  Tensor keys = cuda_empty({count, vocab}, DType::kI32);
  Tensor weights = cuda_empty({count, vocab}, DType::kF32);
  launched(cuda_kernels::sample(logits.data<const float>(), static_cast<const SampleControls*>(controls.raw()),
                                static_cast<uint32_t*>(keys.raw()), weights.data<float>(), out.data<int32_t>(),
                                count, vocab, mass_shift(vocab), stream),
           "sample");
}

void cuda_adjust_logits(Tensor& logits, std::span<const LogitEdit> edits, cudaStream_t stream) {
  require_device(logits, "adjust_logits", "logits");
  BASALT_CHECK(logits.dtype() == DType::kF32 && logits.rank() == 2, "cuda adjust_logits: logits must be f32 [R, V], got {}",
               logits.describe());
  reference::check_logit_edits(edits, logits.dim(0), logits.dim(1), "cuda adjust_logits");
  if (edits.empty()) return;
  const Tensor records = upload(edits.data(), static_cast<int64_t>(edits.size_bytes()), stream);
  launched(cuda_kernels::adjust_logits(logits.data<float>(), static_cast<const EditRecord*>(records.raw()),
                                       static_cast<int64_t>(edits.size()), logits.dim(1), stream),
           "adjust_logits");
}

void cuda_apply_token_bitmask(Tensor& logits, const Tensor& bitmask, cudaStream_t stream) {
  require_device(logits, "apply_token_bitmask", "logits");
  require_device(bitmask, "apply_token_bitmask", "bitmask");
  reference::check_token_bitmask(logits, bitmask, "cuda apply_token_bitmask");
  if (logits.numel() == 0) return;
  launched(cuda_kernels::apply_token_bitmask(logits.data<float>(), bitmask.data<const int32_t>(), logits.dim(0),
                                             logits.dim(1), stream),
           "apply_token_bitmask");
}

void cuda_top_k_rows(const Tensor& x, int k, Tensor& values, Tensor& ids, cudaStream_t stream) {
  require_device(x, "top_k_rows", "x");
  require_device(values, "top_k_rows", "values");
  require_device(ids, "top_k_rows", "ids");
  reference::check_top_k_rows(x, k, values, ids, "cuda top_k_rows");
  BASALT_CHECK(x.dim(1) < (int64_t{1} << 31), "cuda top_k_rows: {} columns are too many", x.dim(1));
  if (x.dim(0) == 0) return;
  launched(cuda_kernels::top_k_rows(x.data<const float>(), x.dim(0), x.dim(1), k, values.data<float>(),
                                    ids.data<int32_t>(), stream),
           "top_k_rows");
}

void cuda_gather_rows(const Tensor& x, const Tensor& cols, Tensor& out, cudaStream_t stream) {
  require_device(x, "gather_rows", "x");
  require_device(cols, "gather_rows", "cols");
  require_device(out, "gather_rows", "out");
  reference::check_gather_rows(x, cols, out, "cuda gather_rows");
  if (x.dim(0) == 0) return;
  launched(cuda_kernels::gather_rows(x.data<const float>(), cols.data<const int32_t>(), out.data<float>(), x.dim(0),
                                     x.dim(1), stream),
           "gather_rows");
}

void cuda_rank_rows(const Tensor& x, const Tensor& cols, Tensor& out, cudaStream_t stream) {
  require_device(x, "rank_rows", "x");
  require_device(cols, "rank_rows", "cols");
  require_device(out, "rank_rows", "out");
  reference::check_rank_rows(x, cols, out, "cuda rank_rows");
  BASALT_CHECK(x.dim(0) < (int64_t{1} << 31), "cuda rank_rows: {} rows are too many", x.dim(0));
  if (x.dim(0) == 0) return;
  launched(cuda_kernels::rank_rows(x.data<const float>(), cols.data<const int32_t>(),
                                   out.data<int32_t>(), x.dim(0), x.dim(1), stream),
           "rank_rows");
}
void cuda_copy_indexed(const Tensor& src, const Tensor& src_index, Tensor& dst, const Tensor& dst_index,
                       cudaStream_t stream) {
  const Tensor* const tensors[] = {&src, &src_index, &dst, &dst_index};
  for (const Tensor* t : tensors) require_device(*t, "copy_indexed", "a tensor");
  reference::check_copy_indexed(src, src_index, dst, dst_index, "cuda copy_indexed");
  if (src_index.numel() == 0) return;
  launched(cuda_kernels::copy_indexed(src.data<const int32_t>(), src_index.data<const int32_t>(), src.numel(),
                                      dst.data<int32_t>(), dst_index.data<const int32_t>(), dst.numel(),
                                      src_index.numel(), stream),
           "copy_indexed");
}

}  // namespace basalt
