// CudaMla: the checked host side of the MLA ops (see mla.h for the contract).
#include "backend/cuda/mla.h"

#include <cublas_v2.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/mla_kernels.h"
#include "core/error.h"

namespace basalt {
namespace {

using cuda_kernels::Elem;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

Elem elem(DType dtype) { return dtype == DType::kF32 ? Elem::kF32 : Elem::kBF16; }
cudaDataType_t blas_type(DType dtype) { return dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF; }

void check_blas(cublasStatus_t status, const char* what) {
  BASALT_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuda mla: {} failed with cuBLAS status {}", what,
               static_cast<int>(status));
}

void launched(cudaError_t status, const char* op) {
  BASALT_CHECK(status == cudaSuccess, "cuda {}: launch failed: {}", op, cudaGetErrorString(status));
}

void require(const Tensor& t, const char* op, const char* name, std::initializer_list<DType> dtypes, int rank) {
  BASALT_CHECK(t.device() == Device::kCuda && t.raw() != nullptr,
               "cuda {}: {} must be on the device, got {}", op, name, t.describe());
  BASALT_CHECK(std::find(dtypes.begin(), dtypes.end(), t.dtype()) != dtypes.end(), "cuda {}: {} has dtype {}: {}",
               op, name, dtype_name(t.dtype()), t.describe());
  BASALT_CHECK(t.rank() == rank, "cuda {}: {} must have rank {}, got {}", op, name, rank, t.describe());
}

void check_params(const MlaParams& p, const char* op) {
  BASALT_CHECK(p.num_heads > 0 && p.kv_lora_rank > 0 && p.qk_nope_head_dim > 0 && p.qk_rope_head_dim > 0 &&
                   p.qk_rope_head_dim % 2 == 0 && p.v_head_dim > 0,
               "cuda {}: bad MLA params (heads {}, kv_lora_rank {}, nope {}, rope {}, v {})", op, p.num_heads,
               p.kv_lora_rank, p.qk_nope_head_dim, p.qk_rope_head_dim, p.v_head_dim);
  BASALT_CHECK(p.kv_lora_rank <= cuda_kernels::kMlaMaxLatent && p.qk_rope_head_dim <= 256,
               "cuda {}: the CUDA backend supports kv_lora_rank <= {} and qk_rope_head_dim <= 256, got {} and {}", op,
               cuda_kernels::kMlaMaxLatent, p.kv_lora_rank, p.qk_rope_head_dim);
}

void check_cache(const Tensor& cache, int64_t width, const char* op) {
  require(cache, op, "cache", {DType::kF32, DType::kBF16}, 2);
  BASALT_CHECK(cache.dim(1) == width, "cuda {}: cache must be [slots, {}], got {}", op, width, cache.describe());
}

}  // namespace

CudaMla::CudaMla(cudaStream_t stream) : stream_(stream) {
  cublasHandle_t handle = nullptr;
  check_blas(cublasCreate(&handle), "cublasCreate");
  blas_ = handle;
  BASALT_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  // cublasSetStream resets the workspace, so the stream is set once, first.
  check_blas(cublasSetStream(handle, stream_), "cublasSetStream");
  check_blas(cublasSetWorkspace(handle, workspace_, kWorkspaceBytes), "cublasSetWorkspace");
  check_blas(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

CudaMla::~CudaMla() {
  if (blas_ != nullptr) (void)cublasDestroy(static_cast<cublasHandle_t>(blas_));
  if (workspace_ != nullptr) (void)cudaFree(workspace_);
}

CudaMla::Weight CudaMla::compute_weight(const LinearWeight& kv_b, int64_t rows, int64_t cols, const char* op) {
  const Tensor& w = kv_b.weight;
  BASALT_CHECK(w.device() == Device::kCuda && w.rank() == 2 && w.dim(0) == rows && w.dim(1) == cols &&
                   w.raw() != nullptr,
               "cuda {}: kv_b must be a device [{}, {}] weight, got {}", op, rows, cols, w.describe());
  if (!kv_b.block_fp8()) {
    BASALT_CHECK(w.dtype() == DType::kF32 || w.dtype() == DType::kBF16,
                 "cuda {}: kv_b must be f32, bf16 or block FP8, got {}", op, w.describe());
    return Weight{w.raw(), w.dtype()};
  }
  return Weight{dequantized_.bf16(kv_b, op).raw(), DType::kBF16};
}

void CudaMla::store_kv(const Tensor& kv_a, const Tensor& norm_weight, float eps, const Tensor& positions,
                       const RopeParams& rope, const Tensor& slots, Tensor& cache) {
  const char* op = "mla_store_kv";
  require(kv_a, op, "kv_a", {DType::kF32}, 2);
  require(positions, op, "positions", {DType::kI32}, 1);
  require(slots, op, "slots", {DType::kI32}, 1);
  const int64_t T = kv_a.dim(0), R = rope.rotary_dim, L = kv_a.dim(1) - R;
  BASALT_CHECK(R > 0 && R % 2 == 0 && L > 0 && rope.num_heads == 1 && rope.head_dim == R && rope.rotary_offset == 0 &&
                   rope.inv_freq != nullptr,
               "cuda mla_store_kv: rope must be one head of {} rotary dims with inv_freq", R);
  require(*rope.inv_freq, op, "inv_freq", {DType::kF32}, 1);
  BASALT_CHECK(rope.inv_freq->dim(0) == R / 2, "cuda mla_store_kv: inv_freq must be [{}], got {}", R / 2,
               rope.inv_freq->describe());
  require(norm_weight, op, "norm_weight", {DType::kF32, DType::kBF16}, 1);
  BASALT_CHECK(norm_weight.dim(0) == L, "cuda mla_store_kv: norm_weight must be [{}], got {}", L,
               norm_weight.describe());
  check_cache(cache, L + R, op);
  BASALT_CHECK(positions.dim(0) == T && slots.dim(0) == T,
               "cuda mla_store_kv: positions {} and slots {} must have {} entries", positions.describe(),
               slots.describe(), T);
  launched(cuda_kernels::mla_store(elem(norm_weight.dtype()), elem(cache.dtype()), kv_a.data<const float>(),
                                   norm_weight.raw(), eps, positions.data<const int32_t>(),
                                   rope.inv_freq->data<const float>(), rope.attention_scaling,
                                   rope.style == RopeStyle::kInterleaved, slots.data<const int32_t>(), cache.raw(), T,
                                   static_cast<int>(L), static_cast<int>(R), cache.dim(0), stream_),
           op);
}

void CudaMla::expand_kv(const Tensor& cache, const Tensor& slots, const LinearWeight& kv_b, const MlaParams& p,
                        Tensor& k, Tensor& v) {
  const char* op = "mla_expand_kv";
  check_params(p, op);
  const int64_t heads = p.num_heads, L = p.kv_lora_rank, Dn = p.qk_nope_head_dim, R = p.qk_rope_head_dim,
                Dv = p.v_head_dim;
  check_cache(cache, L + R, op);
  require(slots, op, "slots", {DType::kI32}, 1);
  const int64_t S = slots.dim(0);
  require(k, op, "k", {DType::kF32, DType::kBF16}, 2);
  require(v, op, "v", {k.dtype()}, 2);
  BASALT_CHECK(k.dim(0) == S && k.dim(1) == heads * (Dn + R) && v.dim(0) == S && v.dim(1) == heads * Dv,
               "cuda mla_expand_kv: k must be [{}, {}] and v [{}, {}], got {} and {}", S, heads * (Dn + R), S,
               heads * Dv, k.describe(), v.describe());
  const Weight w = compute_weight(kv_b, heads * (Dn + Dv), L, op);
  if (S == 0) return;
  Tensor latent = cuda_empty({S, L}, w.dtype);
  launched(cuda_kernels::mla_gather_latent(elem(cache.dtype()), elem(w.dtype), cache.raw(),
                                           slots.data<const int32_t>(), latent.raw(), S, static_cast<int>(L),
                                           static_cast<int>(R), cache.dim(0), stream_),
           op);
  const int64_t N = heads * (Dn + Dv);
  Tensor kv = cuda_empty({S, N}, DType::kF32);
  // Column-major view: kvᵀ [N, S] = Wᵀ... i.e. C = op(A) B with A = W stored
  // [L, N] column-major (transposed), B = latentᵀ [L, S].
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasGemmEx(static_cast<cublasHandle_t>(blas_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N),
                          static_cast<int>(S), static_cast<int>(L), &one, w.data, blas_type(w.dtype),
                          static_cast<int>(L), latent.raw(), blas_type(w.dtype), static_cast<int>(L), &zero,
                          kv.raw(), CUDA_R_32F, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "mla_expand_kv GEMM");
  launched(cuda_kernels::mla_split_kv(elem(cache.dtype()), elem(k.dtype()), cache.raw(), slots.data<const int32_t>(),
                                      kv.data<const float>(), k.raw(), v.raw(), S,
                                      static_cast<int>(heads), static_cast<int>(L), static_cast<int>(R),
                                      static_cast<int>(Dn), static_cast<int>(Dv), cache.dim(0), stream_),
           op);
}

namespace {

struct LayoutShape {
  int num_seqs;
  int64_t kv_slots_len;
};

LayoutShape check_layout(const AttentionLayout& layout, const char* op) {
  require(layout.q_start, op, "q_start", {DType::kI32}, 1);
  require(layout.kv_start, op, "kv_start", {DType::kI32}, 1);
  BASALT_CHECK(layout.kv_slots.device() == Device::kCuda && layout.kv_slots.dtype() == DType::kI32 &&
                   layout.kv_slots.rank() == 1,
               "cuda {}: kv_slots must be device i32 [n], got {}", op, layout.kv_slots.describe());
  const int64_t seqs = layout.q_start.dim(0) - 1;
  BASALT_CHECK(seqs >= 0 && layout.kv_start.dim(0) == seqs + 1 && seqs < 65536,
               "cuda {}: q_start and kv_start must both have num_seqs + 1 entries (num_seqs < 65536)", op);
  return LayoutShape{static_cast<int>(seqs), layout.kv_slots.dim(0)};
}

}  // namespace

void CudaMla::attention_core(const Tensor& q_full, const Tensor& cache, const AttentionLayout& layout,
                             const MlaParams& p, Tensor& o_lat, CudaMlaPath path, int splits) {
  const char* op = "mla_attention";
  check_params(p, op);
  const int64_t heads = p.num_heads, L = p.kv_lora_rank, R = p.qk_rope_head_dim;
  check_cache(cache, L + R, op);
  require(q_full, op, "q_full", {DType::kF32, DType::kBF16}, 2);
  require(o_lat, op, "o_lat", {DType::kF32, DType::kBF16}, 2);
  const int64_t T = q_full.dim(0);
  BASALT_CHECK(q_full.dim(1) == heads * (L + R) && o_lat.dim(0) == T && o_lat.dim(1) == heads * L,
               "cuda mla_attention: q_full must be [T, {}] and o_lat [T, {}], got {} and {}", heads * (L + R),
               heads * L, q_full.describe(), o_lat.describe());
  const LayoutShape ls = check_layout(layout, op);
  cuda_kernels::MlaAttentionShape shape;
  shape.q_tokens = T;
  shape.num_seqs = ls.num_seqs;
  shape.kv_slots_len = ls.kv_slots_len;
  shape.num_slots = cache.dim(0);
  shape.heads = static_cast<int>(heads);
  shape.latent = static_cast<int>(L);
  shape.rope = static_cast<int>(R);
  shape.scale = p.scale;
  const bool mma = path != CudaMlaPath::kCudaCores &&
                   cuda_kernels::mla_attention_uses_mma(elem(cache.dtype()), elem(q_full.dtype()), shape);
  using cuda_kernels::MlaCoreKernel;
  MlaCoreKernel kernel = MlaCoreKernel::kCudaCores;
  if (mma) kernel = path == CudaMlaPath::kMmaSync || !cuda_kernels::wgmma_available() ? MlaCoreKernel::kMmaSync
                                                                                        : MlaCoreKernel::kWgmma;
  BASALT_CHECK(mma || q_full.dtype() == DType::kF32,
               "cuda mla_attention: the CUDA-core path takes an f32 q_full, got {}", q_full.describe());
  if (T == 0 || ls.num_seqs == 0) return;
  const int row_splits = cuda_kernels::mla_attention_row_splits(shape, mma);
  const int n_splits = row_invariant_ ? 1
                       : splits > 0  ? std::clamp(splits, 1, cuda_kernels::kMlaMaxSplits)
                                     : cuda_kernels::mla_attention_splits(shape, mma);
  Tensor scratch;
  if (n_splits > 1) scratch = cuda_empty({cuda_kernels::mla_attention_scratch_floats(shape, n_splits)}, DType::kF32);
  launched(cuda_kernels::mla_attention(elem(q_full.dtype()), elem(cache.dtype()), elem(o_lat.dtype()), q_full.raw(),
                                       cache.raw(), layout.q_start.data<const int32_t>(),
                                       layout.kv_start.data<const int32_t>(), layout.kv_slots.data<const int32_t>(),
                                       shape, n_splits, /*splits_by_pass=*/splits <= 0, row_splits, kernel,
                                       n_splits > 1 ? scratch.data<float>() : nullptr, o_lat.raw(), stream_),
           op);
}

void CudaMla::attention(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b, const AttentionLayout& layout,
                        const MlaParams& p, Tensor& out, CudaMlaPath path, int splits) {
  const char* op = "mla_attention";
  check_params(p, op);
  const int64_t heads = p.num_heads, L = p.kv_lora_rank, Dn = p.qk_nope_head_dim, R = p.qk_rope_head_dim,
                Dv = p.v_head_dim;
  require(q, op, "q", {DType::kF32, DType::kBF16}, 2);
  require(out, op, "out", {DType::kF32, DType::kBF16}, 2);
  const int64_t T = q.dim(0);
  BASALT_CHECK(q.dim(1) == heads * (Dn + R) && out.dim(0) == T && out.dim(1) == heads * Dv,
               "cuda mla_attention: q must be [T, {}] and out [T, {}], got {} and {}", heads * (Dn + R), heads * Dv,
               q.describe(), out.describe());
  check_cache(cache, L + R, op);
  check_layout(layout, op);
  const Weight w = compute_weight(kv_b, heads * (Dn + Dv), L, op);
  BASALT_CHECK(out.dtype() == DType::kF32 || w.dtype == DType::kBF16,
               "cuda mla_attention: a bf16 out needs a bf16 or FP8 kv_b, got {}", kv_b.weight.describe());
  BASALT_CHECK(T * heads < (int64_t{1} << 31), "cuda mla_attention: too many rows");
  if (T == 0) return;
  cuda_kernels::MlaAttentionShape probe;
  probe.latent = static_cast<int>(L);
  probe.rope = static_cast<int>(R);
  const bool mma = path != CudaMlaPath::kCudaCores && w.dtype == DType::kBF16 &&
                   cuda_kernels::mla_attention_uses_mma(elem(cache.dtype()), Elem::kBF16, probe);
  const DType q_full_dtype = mma ? DType::kBF16 : DType::kF32;
  cublasHandle_t handle = static_cast<cublasHandle_t>(blas_);
  const float one = 1.0f, zero = 0.0f;

  // Decode-sized batches over a bf16 kv_b take one kernel per absorption;
  // larger ones cuBLAS's strided-batched GEMMs.
  // The batch-invariant mode takes the kernels at every T (a token's sums
  // there do not depend on the other tokens).
  const bool small =
      w.dtype == DType::kBF16 &&
      (row_invariant_ ? cuda_kernels::mla_absorb_any_batch_ok(static_cast<int>(Dn), static_cast<int>(L),
                                                              static_cast<int>(Dv), w.data)
                      : cuda_kernels::mla_small_batch_ok(T, static_cast<int>(Dn), static_cast<int>(L),
                                                         static_cast<int>(Dv), w.data));
  BASALT_CHECK(small || !row_invariant_,
               "cuda mla_attention: the batch-invariant mode needs a bf16 or FP8 kv_b with qk_nope_head_dim, "
               "kv_lora_rank and v_head_dim multiples of 8 (got {}, Dn {}, L {}, Dv {})",
               kv_b.weight.describe(), Dn, L, Dv);

  // 1. q_full[t, h] = [q_nope(t, h) · W_uk(h) | q_pe(t, h)].
  Tensor q_full = cuda_empty({T, heads * (L + R)}, q_full_dtype);
  if (small) {
    launched(cuda_kernels::mla_absorb_q_small(elem(q.dtype()), elem(q_full_dtype), q.raw(), w.data, q_full.raw(), T,
                                              static_cast<int>(heads), static_cast<int>(Dn), static_cast<int>(R),
                                              static_cast<int>(L), static_cast<int>(Dv), stream_),
             op);
  } else {
    Tensor q_op = q;
    if (q.dtype() != w.dtype) {
      q_op = cuda_empty(q.shape(), w.dtype);
      cuda_cast(q, q_op, stream_);
    }
    check_blas(cublasGemmStridedBatchedEx(
                   handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(L), static_cast<int>(T), static_cast<int>(Dn),
                   &one, w.data, blas_type(w.dtype), static_cast<int>(L), (Dn + Dv) * L, q_op.raw(),
                   blas_type(w.dtype), static_cast<int>(heads * (Dn + R)), Dn + R, &zero, q_full.raw(),
                   blas_type(q_full_dtype), static_cast<int>(heads * (L + R)), L + R, static_cast<int>(heads),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "mla_attention q absorption GEMM");
    launched(cuda_kernels::mla_copy_q_rope(elem(q.dtype()), elem(q_full_dtype), q.raw(), q_full.raw(), T,
                                           static_cast<int>(heads), static_cast<int>(Dn), static_cast<int>(R),
                                           static_cast<int>(L), stream_),
             op);
  }
  // 2. The attention core over the latent cache.
  Tensor o_lat = cuda_empty({T, heads * L}, w.dtype);
  attention_core(q_full, cache, layout, p, o_lat, path, splits);
  // 3. out(t, h) = o_lat(t, h) · W_uv(h)ᵀ.
  if (small) {
    launched(cuda_kernels::mla_absorb_out_small(elem(o_lat.dtype()), elem(out.dtype()), o_lat.raw(), w.data,
                                                out.raw(), T, static_cast<int>(heads), static_cast<int>(Dn),
                                                static_cast<int>(L), static_cast<int>(Dv), stream_),
             op);
    return;
  }
  const char* w_uv = static_cast<const char*>(w.data) + Dn * L * static_cast<int64_t>(dtype_size(w.dtype));
  check_blas(cublasGemmStridedBatchedEx(
                 handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(Dv), static_cast<int>(T), static_cast<int>(L),
                 &one, w_uv, blas_type(w.dtype), static_cast<int>(L), (Dn + Dv) * L, o_lat.raw(), blas_type(w.dtype),
                 static_cast<int>(heads * L), L, &zero, out.raw(), blas_type(out.dtype()),
                 static_cast<int>(heads * Dv), Dv, static_cast<int>(heads), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "mla_attention value GEMM");
}

}  // namespace basalt
