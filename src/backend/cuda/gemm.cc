#include "backend/cuda/gemm.h"

#include <cublasLt.h>

#include <map>
#include <tuple>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "core/error.h"

namespace basalt {
namespace {

void check_blas(cublasStatus_t status, const char* what) {
  BASALT_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt {} failed: {} ({})", what, cublasLtGetStatusString(status),
               static_cast<int>(status));
}

constexpr size_t kWorkspaceBytes = 32u << 20;

}  // namespace

struct CublasLt::Impl {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  // (dtype, M, N, K, bias) -> the heuristic's first algorithm and its descriptors.
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int64_t, int64_t, int64_t, bool>, Plan> plans;

  ~Impl() {
    for (auto& [key, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.op);
    }
    if (handle) cublasLtDestroy(handle);
  }

  Plan& plan(DType dtype, int64_t M, int64_t N, int64_t K, bool bias) {
    const auto key = std::make_tuple(static_cast<int>(dtype), M, N, K, bias);
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    const cudaDataType_t type = dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
    Plan p;
    check_blas(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    // Column-major view: out^T [N, M] = w [K, N]^T · x^T [K, M] (the "TN" case).
    const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa), "TRANSA");
    check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb), "TRANSB");
    if (bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
                 "EPILOGUE");
      check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type),
                 "BIAS_DATA_TYPE");
    }
    check_blas(cublasLtMatrixLayoutCreate(&p.a, type, K, N, K), "layout w");
    check_blas(cublasLtMatrixLayoutCreate(&p.b, type, K, M, K), "layout x");
    check_blas(cublasLtMatrixLayoutCreate(&p.c, type, N, M, N), "layout out");
    cublasLtMatmulPreference_t pref = nullptr;
    check_blas(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    size_t ws = kWorkspaceBytes;
    check_blas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
               "MAX_WORKSPACE_BYTES");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_blas(status, "AlgoGetHeuristic");
    BASALT_CHECK(found > 0, "cuBLASLt has no algorithm for a {}x{}x{} linear", M, N, K);
    p.algo = result.algo;
    return plans.emplace(key, p).first->second;
  }
};

CublasLt::CublasLt() : impl_(std::make_unique<Impl>()) {
  check_blas(cublasLtCreate(&impl_->handle), "Create");
  impl_->workspace = cuda_empty({static_cast<int64_t>(kWorkspaceBytes)}, DType::kF8E4M3);  // raw bytes
}

CublasLt::~CublasLt() = default;

void CublasLt::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out, cudaStream_t stream) {
  for (const Tensor* t : {&x, &w, static_cast<const Tensor*>(&out)})
    BASALT_CHECK(t->device() == Device::kCuda, "cuda linear: {} must be on the device", t->describe());
  BASALT_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16, "cuda linear: x must be f32 or bf16, got {}",
               x.describe());
  BASALT_CHECK(w.dtype() == x.dtype() && out.dtype() == x.dtype(),
               "cuda linear: x {}, w {} and out {} must share a dtype", x.describe(), w.describe(), out.describe());
  BASALT_CHECK(x.rank() == 2 && w.rank() == 2 && out.rank() == 2 && w.dim(1) == x.dim(1) &&
                   out.dim(0) == x.dim(0) && out.dim(1) == w.dim(0),
               "cuda linear: x {} · w {}ᵀ does not fit out {}", x.describe(), w.describe(), out.describe());
  const int64_t M = x.dim(0), N = w.dim(0), K = x.dim(1);
  BASALT_CHECK(K > 0, "cuda linear: in_features must be > 0, got {}", w.describe());
  if (bias) {
    BASALT_CHECK(bias->device() == Device::kCuda && bias->dtype() == x.dtype() && bias->numel() == N,
                 "cuda linear: bias must be [{}] of x's dtype on the device, got {}", N, bias->describe());
  }
  if (M == 0 || N == 0) return;
  Impl::Plan& p = impl_->plan(x.dtype(), M, N, K, bias != nullptr);
  if (bias) {
    const void* data = bias->raw();
    check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &data, sizeof data),
               "BIAS_POINTER");
  }
  const float alpha = 1.0f, beta = 0.0f;
  check_blas(cublasLtMatmul(impl_->handle, p.op, &alpha, w.raw(), p.a, x.raw(), p.b, &beta, out.raw(), p.c, out.raw(),
                            p.c, &p.algo, impl_->workspace.raw(), kWorkspaceBytes, stream),
             "Matmul");
}

}  // namespace basalt
