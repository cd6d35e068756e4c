#include "backend/cuda/fp8_linear.h"

#include <cublasLt.h>

#include <map>
#include <string>
#include <tuple>

#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/fp8_kernels.h"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/moe_gemm_kernels.h"
#include "backend/cuda/tensor_map.h"
#include "core/error.h"

namespace basalt {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

void check_blas(cublasStatus_t status, const char* what) {
  BASALT_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt {} failed: {} ({})", what, cublasLtGetStatusString(status),
               static_cast<int>(status));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t blocks_of(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

}  // namespace

struct CudaFp8Linear::Impl {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  // (out dtype, T, N, K) -> descriptors and the heuristic's first algorithm,
  // or `takes` false where cuBLASLt has none.
  struct Plan {
    bool takes = false;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // why not, where it does not take
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int64_t, int64_t, int64_t>, Plan> plans;

  ~Impl() {
    for (auto& [key, p] : plans) release(p);
    if (handle) cublasLtDestroy(handle);
  }

  static void release(Plan& p) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
    if (p.op) cublasLtMatmulDescDestroy(p.op);
    p = Plan{};
  }

  // Column-major view, as gemm.cc: outᵀ [N, T] = w [K, N]ᵀ · qᵀ [K, T] (the
  // "TN" case). A = w with BLK128x128 scales (one per 128x128 block, the
  // 128-column blocks of a row contiguous, rows of blocks ceil(K/128)
  // rounded up to 4 apart), B = q with VEC128 scales (one per token and
  // 128-column group, laid out group-major: [ceil(K/128), T]).
  Plan& plan(DType out, int64_t T, int64_t N, int64_t K) {
    const auto key = std::make_tuple(static_cast<int>(out), T, N, K);
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    Plan p;
    const cudaDataType_t out_type = out == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
    bool ok = cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    ok = ok && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode) ==
                   CUBLAS_STATUS_SUCCESS;
    // The heuristic checks the scale pointers too (a null one fails every
    // shape): a 256-byte aligned stand-in until each call sets the real ones.
    const void* stand_in = workspace.raw();
    ok = ok && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &stand_in,
                                              sizeof stand_in) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &stand_in,
                                              sizeof stand_in) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, K, N, K) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, K, T, K) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&p.d, out_type, N, T, N) == CUBLAS_STATUS_SUCCESS;
    if (ok) {
      cublasLtMatmulPreference_t pref = nullptr;
      ok = cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
      size_t ws = kWorkspaceBytes;
      ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                      sizeof ws) == CUBLAS_STATUS_SUCCESS;
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      if (ok) {
        p.status = cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
        ok = p.status == CUBLAS_STATUS_SUCCESS && found > 0;
        if (p.status == CUBLAS_STATUS_SUCCESS && found == 0) p.status = CUBLAS_STATUS_NOT_SUPPORTED;
      }
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      if (ok) p.algo = result.algo;
    }
    const cublasStatus_t status = p.status;
    if (!ok) release(p);
    p.takes = ok;
    p.status = ok ? CUBLAS_STATUS_SUCCESS : (status == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : status);
    return plans.emplace(key, p).first->second;
  }
};

CudaFp8Linear::CudaFp8Linear() : impl_(std::make_unique<Impl>()) {
  check_blas(cublasLtCreate(&impl_->handle), "Create");
  impl_->workspace = cuda_empty({static_cast<int64_t>(kWorkspaceBytes)}, DType::kF8E4M3);  // raw bytes
}

CudaFp8Linear::~CudaFp8Linear() = default;

bool CudaFp8Linear::cublas_takes(int64_t T, int64_t N, int64_t K, DType out_dtype, const void* w, const void* out) {
  // cuBLASLt's block-scaled FP8 needs sm_90 (the backend's target), T and N
  // multiples of 4 (the VEC128 scales of a group are 16-byte aligned rows of
  // T floats), K a multiple of 16 (FP8 leading dimensions) and 16-byte
  // aligned operands; the heuristic decides the rest.
  if (T < 4 || T % 4 != 0 || N % 4 != 0 || K % 16 != 0 || !aligned16(w) || !aligned16(out)) return false;
  if (out_dtype != DType::kF32 && out_dtype != DType::kBF16) return false;
  return impl_->plan(out_dtype, T, N, K).takes;
}

bool CudaFp8Linear::wgmma_takes(int64_t T, int64_t N, int64_t K, DType out_dtype, const void* w) {
  // The TMA maps need 16-byte aligned rows of K bytes; the kernel writes f32
  // and indexes with 32-bit sizes.
  const int64_t limit = int64_t{1} << 31;
  return cuda_kernels::wgmma_available() && out_dtype == DType::kF32 && K % 16 == 0 && aligned16(w) && T < limit &&
         N < limit && K < limit;
}

void CudaFp8Linear::linear(const Tensor& x, const Tensor& w, const Tensor& scale_inv, Tensor& out,
                           cudaStream_t stream, Fp8LinearPath path, int variant) {
  for (const Tensor* t : {&x, &w, &scale_inv, static_cast<const Tensor*>(&out)})
    BASALT_CHECK(t->device() == Device::kCuda, "cuda linear_fp8_block: {} must be on the device", t->describe());
  BASALT_CHECK(x.rank() == 2 && (x.dtype() == DType::kF32 || x.dtype() == DType::kBF16),
               "cuda linear_fp8_block: x must be f32 or bf16 [T, K], got {}", x.describe());
  const int64_t T = x.dim(0), K = x.dim(1);
  BASALT_CHECK(w.rank() == 2 && w.dtype() == DType::kF8E4M3 && w.dim(1) == K,
               "cuda linear_fp8_block: w must be f8_e4m3 [N, {}], got {}", K, w.describe());
  const int64_t N = w.dim(0);
  const int64_t kb = blocks_of(K), nb = blocks_of(N);
  BASALT_CHECK(scale_inv.dtype() == DType::kF32 && scale_inv.shape() == Shape({nb, kb}),
               "cuda linear_fp8_block: scale_inv must be f32 [{}, {}], got {}", nb, kb, scale_inv.describe());
  BASALT_CHECK(out.rank() == 2 && (out.dtype() == DType::kF32 || out.dtype() == DType::kBF16) && out.dim(0) == T &&
                   out.dim(1) == N,
               "cuda linear_fp8_block: out must be f32 or bf16 [{}, {}], got {}", T, N, out.describe());
  BASALT_CHECK(variant >= 0 && variant <= cuda_kernels::kFp8StreamVariants,
               "cuda linear_fp8_block: no streaming variant {}", variant);
  if (T == 0 || N == 0) return;
  if (K == 0) {  // an empty sum
    BASALT_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, out.nbytes(), stream));
    return;
  }
  // kFp8StreamingMaxRows = 8 (fp8_linear.h), from both paths side by side on
  // the H200 (bench/README, basalt_bench_cuda_fp8_gemm, DeepGEMM's six
  // shapes): at 4 tokens our kernel is faster on 5 of them, at 16 cuBLASLt
  // is on 5 (e.g. 7168 x 16384: 40.7 vs 74.7 us); cuBLASLt takes no M below
  // 4 or off a multiple of 4, so odd small batches stay with ours anyway.
  const bool cublas = path == Fp8LinearPath::kCublas ||
                      (path == Fp8LinearPath::kAuto && T > kFp8StreamingMaxRows &&
                       cublas_takes(T, N, K, out.dtype(), w.raw(), out.raw()));
  if (path == Fp8LinearPath::kCublas) {
    const bool takes = cublas_takes(T, N, K, out.dtype(), w.raw(), out.raw());
    const auto it = impl_->plans.find(std::make_tuple(static_cast<int>(out.dtype()), T, N, K));
    BASALT_CHECK(takes, "cuda linear_fp8_block: cuBLASLt does not take x {} · w {}ᵀ into {} ({})", x.describe(),
                 w.describe(), out.describe(),
                 it == impl_->plans.end() ? "shape or alignment" : cublasLtGetStatusString(it->second.status));
  }

  if (path == Fp8LinearPath::kWgmma) {
    BASALT_CHECK(wgmma_takes(T, N, K, out.dtype(), w.raw()),
                 "cuda linear_fp8_block: the wgmma kernel does not take x {} · w {}ᵀ into {} (it needs sm_90a, f32 "
                 "out, K a multiple of 16 and a 16-byte aligned w)",
                 x.describe(), w.describe(), out.describe());
    Tensor q = cuda_empty({T, K}, DType::kF8E4M3);
    Tensor act_scales = cuda_empty({T, kb}, DType::kF32);
    cuda_quantize_fp8_groups(x, q, act_scales, stream);
    TmaDescriptor map_q, map_w;
    for (auto [map, base, rows, box_rows] : {std::tuple{&map_q, q.raw(), T, cuda_kernels::kMoeTmaActBoxRows},
                                             std::tuple{&map_w, w.raw(), N, cuda_kernels::kMoeTmaBoxRows}}) {
      const std::string error = encode_rows_u8(*map, base, static_cast<uint64_t>(rows), static_cast<uint64_t>(K),
                                               static_cast<uint32_t>(box_rows), cuda_kernels::kMoeTmaBoxBytes);
      BASALT_CHECK(error.empty(), "cuda linear_fp8_block: {}", error);
    }
    const cuda_kernels::DenseFp8Args args{act_scales.data<const float>(), scale_inv.data<const float>(),
                                          out.data<float>(), static_cast<int32_t>(T), static_cast<int32_t>(N),
                                          static_cast<int32_t>(K)};
    const int cluster = variant == 1 ? 1 : 2;  // pairs: as fast or faster on every shape measured
    const cudaError_t status = cuda_kernels::dense_fp8_gemm_tma(args, map_q, map_w, cluster, stream);
    BASALT_CHECK(status == cudaSuccess, "cuda linear_fp8_block: launch failed: {}", cudaGetErrorString(status));
    return;
  }

  Tensor q = cuda_empty({T, K}, DType::kF8E4M3);
  Tensor act_scales = cuda_empty({kb, T}, DType::kF32);
  cuda_quantize_fp8_groups_outer(x, q, act_scales, stream);

  if (!cublas) {
    const cudaError_t status = cuda_kernels::linear_fp8_stream(
        static_cast<const uint8_t*>(q.raw()), act_scales.data<const float>(), static_cast<const uint8_t*>(w.raw()),
        scale_inv.data<const float>(), out.raw(), out.dtype() == DType::kBF16, T, N, K, stream, variant);
    BASALT_CHECK(status == cudaSuccess, "cuda linear_fp8_block: launch failed: {}", cudaGetErrorString(status));
    return;
  }

  // cuBLASLt reads the weight scales with rows of blocks ceil(K/128)
  // rounded up to 4 floats apart (16-byte aligned): a padded copy where the
  // checkpoint's rows are shorter (or the tensor is not aligned).
  const int64_t kb_padded = (kb + 3) / 4 * 4;
  const float* w_scales = scale_inv.data<const float>();
  Tensor padded;
  if (kb_padded != kb || !aligned16(w_scales)) {
    padded = cuda_empty({nb, kb_padded}, DType::kF32);
    BASALT_CUDA_CHECK(cudaMemsetAsync(padded.raw(), 0, padded.nbytes(), stream));
    BASALT_CUDA_CHECK(cudaMemcpy2DAsync(padded.raw(), static_cast<size_t>(kb_padded) * sizeof(float), w_scales,
                                        static_cast<size_t>(kb) * sizeof(float), static_cast<size_t>(kb) * sizeof(float),
                                        static_cast<size_t>(nb), cudaMemcpyDeviceToDevice, stream));
    w_scales = padded.data<const float>();
  }
  Impl::Plan& p = impl_->plan(out.dtype(), T, N, K);
  const void* a_scale = w_scales;
  const void* b_scale = act_scales.raw();
  check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof a_scale),
             "A_SCALE_POINTER");
  check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof b_scale),
             "B_SCALE_POINTER");
  const float alpha = 1.0f, beta = 0.0f;
  check_blas(cublasLtMatmul(impl_->handle, p.op, &alpha, w.raw(), p.a, q.raw(), p.b, &beta, out.raw(), p.d, out.raw(),
                            p.d, &p.algo, impl_->workspace.raw(), kWorkspaceBytes, stream),
             "Matmul");
}

}  // namespace basalt
