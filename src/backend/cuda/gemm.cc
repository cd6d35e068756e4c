#include "backend/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/gemv_kernels.h"
#include "core/error.h"

namespace basalt {
namespace {

void check_blas(cublasStatus_t status, const char* what) {
  BASALT_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt {} failed: {} ({})", what, cublasLtGetStatusString(status),
               static_cast<int>(status));
}

constexpr size_t kWorkspaceBytes = 32u << 20;
// Tuning (CublasLt::Impl::fastest): how many of the heuristic's candidates
// are timed, on calls of at most how many rows, in how many rounds, and by
// how much a later candidate must be faster to be taken.
constexpr int kCandidates = 8;
constexpr int64_t kTuneMaxRows = 256;
constexpr int kTimedRounds = 5;
constexpr float kTuneMargin = 0.03f;

}  // namespace

struct CublasLt::Impl {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  bool tune = true;
  GemmTuningStats stats;
  // (input dtype, output dtype, M, N, K, bias) -> the chosen algorithm and
  // its descriptors.
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int, int64_t, int64_t, int64_t, bool>, Plan> plans;

  ~Impl() {
    for (auto& [key, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.op);
    }
    if (handle) cublasLtDestroy(handle);
  }

  static cudaDataType_t cuda_type(DType dtype) {
    switch (dtype) {
      case DType::kBF16: return CUDA_R_16BF;
      case DType::kF16: return CUDA_R_16F;
      default: return CUDA_R_32F;
    }
  }

  // The plan of one call's shape, made at its first call: the heuristic's
  // candidates, timed on this call's own tensors where the call is
  // decode-sized (kTuneMaxRows rows or fewer), the fastest kept.
  Plan& plan(DType in, DType out, int64_t M, int64_t N, int64_t K, const void* bias_data, const void* w,
             const void* x, void* y, cudaStream_t stream) {
    const bool bias = bias_data != nullptr;
    const auto key = std::make_tuple(static_cast<int>(in), static_cast<int>(out), M, N, K, bias);
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    const cudaDataType_t type = cuda_type(in), out_type = cuda_type(out);
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
      check_blas(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &out_type, sizeof out_type),
          "BIAS_DATA_TYPE");
      check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_data, sizeof bias_data),
                 "BIAS_POINTER");  // for the tuning runs; every call sets its own
    }
    check_blas(cublasLtMatrixLayoutCreate(&p.a, type, K, N, K), "layout w");
    check_blas(cublasLtMatrixLayoutCreate(&p.b, type, K, M, K), "layout x");
    check_blas(cublasLtMatrixLayoutCreate(&p.c, out_type, N, M, N), "layout out");
    cublasLtMatmulPreference_t pref = nullptr;
    check_blas(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    size_t ws = kWorkspaceBytes;
    check_blas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
               "MAX_WORKSPACE_BYTES");
    cublasLtMatmulHeuristicResult_t results[kCandidates]{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, kCandidates, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_blas(status, "AlgoGetHeuristic");
    BASALT_CHECK(found > 0, "cuBLASLt has no algorithm for a {}x{}x{} linear", M, N, K);
    p.algo = results[0].algo;
    if (tune && M <= kTuneMaxRows && !capturing(stream)) {
      const auto begin = std::chrono::steady_clock::now();
      std::vector<cublasLtMatmulAlgo_t> candidates;
      for (int i = 0; i < found; ++i)
        if (results[i].state == CUBLAS_STATUS_SUCCESS) candidates.push_back(results[i].algo);
      if (candidates.size() > 1) {
        p.algo = candidates[fastest(p, candidates, w, x, y, stream)];
        ++stats.tuned;
        stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      }
    }
    return plans.emplace(key, p).first->second;
  }

  static bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    BASALT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    return capture != cudaStreamCaptureStatusNone;
  }

  // Which of the heuristic's candidates runs this call fastest: each runs
  // once, then kTimedRounds rounds time every candidate in turn between
  // events (so a drift of the GPU's clock falls on all of them alike), each
  // run after a read of twice the L2's size (a decode step reads its
  // weights from HBM; timed with the weights in L2, the candidates that
  // compute fastest would win instead of those that stream fastest; a read,
  // not a write, so no dirty lines are written back during the run). The
  // median decides; a later candidate must beat the best so far by
  // kTuneMargin, so near-ties keep the heuristic's order (two processes can
  // still choose differently where candidates time about kTuneMargin
  // apart). The call's output is overwritten by every run; its caller's own
  // run comes after. Without memory for the flush buffer, the heuristic's
  // first.
  int fastest(const Plan& p, const std::vector<cublasLtMatmulAlgo_t>& candidates, const void* w, const void* x,
              void* y, cudaStream_t stream) {
    int l2 = 0, device = 0;
    BASALT_CUDA_CHECK(cudaGetDevice(&device));
    BASALT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    // The flush buffer (and a word for the read's sink) and the events,
    // released however the timing ends.
    struct Scratch {
      int64_t flush_bytes = 0;
      void* flush = nullptr;
      cudaEvent_t start = nullptr, stop = nullptr;
      ~Scratch() {
        if (start) (void)cudaEventDestroy(start);
        if (stop) (void)cudaEventDestroy(stop);
        if (flush) (void)cudaFree(flush);
      }
    } scratch;
    scratch.flush_bytes = 2 * static_cast<int64_t>(std::max(l2, 1 << 20));
    if (cudaMalloc(&scratch.flush, static_cast<size_t>(scratch.flush_bytes) + 16) != cudaSuccess) {
      (void)cudaGetLastError();
      scratch.flush = nullptr;
      return 0;
    }
    auto* sink = reinterpret_cast<uint32_t*>(static_cast<char*>(scratch.flush) + scratch.flush_bytes);
    BASALT_CUDA_CHECK(cudaMemsetAsync(scratch.flush, 0, static_cast<size_t>(scratch.flush_bytes), stream));
    BASALT_CUDA_CHECK(cudaEventCreate(&scratch.start));
    BASALT_CUDA_CHECK(cudaEventCreate(&scratch.stop));
    const float alpha = 1.0f, beta = 0.0f;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
      return cublasLtMatmul(handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &algo, workspace.raw(),
                            kWorkspaceBytes, stream);
    };
    const int n = static_cast<int>(candidates.size());
    std::vector<bool> runs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) runs[i] = run(candidates[i]) == CUBLAS_STATUS_SUCCESS;  // some may not suit
    std::vector<std::array<float, kTimedRounds>> ms(static_cast<size_t>(n));
    for (int round = 0; round < kTimedRounds; ++round)
      for (int i = 0; i < n; ++i) {
        if (!runs[i]) continue;
        BASALT_CUDA_CHECK(cuda_kernels::read_through(scratch.flush, scratch.flush_bytes, sink, stream));
        BASALT_CUDA_CHECK(cudaEventRecord(scratch.start, stream));
        check_blas(run(candidates[i]), "Matmul (tuning)");
        BASALT_CUDA_CHECK(cudaEventRecord(scratch.stop, stream));
        BASALT_CUDA_CHECK(cudaEventSynchronize(scratch.stop));
        BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms[i][round], scratch.start, scratch.stop));
      }
    int best = -1;
    float best_ms = 0;
    for (int i = 0; i < n; ++i) {
      if (!runs[i]) continue;
      std::sort(ms[i].begin(), ms[i].end());
      const float median = ms[i][kTimedRounds / 2];
      if (best < 0 || median < best_ms * (1.0f - kTuneMargin)) {
        best = i;
        best_ms = median;
      }
    }
    return std::max(best, 0);
  }
};

CublasLt::CublasLt() : impl_(std::make_unique<Impl>()) {
  check_blas(cublasLtCreate(&impl_->handle), "Create");
  impl_->workspace = cuda_empty({static_cast<int64_t>(kWorkspaceBytes)}, DType::kF8E4M3);  // raw bytes
}

CublasLt::~CublasLt() = default;

void CublasLt::set_tuning(bool on) { impl_->tune = on; }

GemmTuningStats CublasLt::tuning_stats() const { return impl_->stats; }

void CublasLt::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out, cudaStream_t stream) {
  for (const Tensor* t : {&x, &w, static_cast<const Tensor*>(&out)})
    BASALT_CHECK(t->device() == Device::kCuda, "cuda linear: {} must be on the device", t->describe());
  BASALT_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16 || x.dtype() == DType::kF16,
               "cuda linear: x must be f32, bf16 or f16, got {}", x.describe());
  BASALT_CHECK(w.dtype() == x.dtype() && (out.dtype() == x.dtype() || out.dtype() == DType::kF32),
               "cuda linear: w {} must have x's dtype and out {} x's dtype or f32 (x {})", w.describe(),
               out.describe(), x.describe());
  BASALT_CHECK(x.rank() == 2 && w.rank() == 2 && out.rank() == 2 && w.dim(1) == x.dim(1) &&
                   out.dim(0) == x.dim(0) && out.dim(1) == w.dim(0),
               "cuda linear: x {} · w {}ᵀ does not fit out {}", x.describe(), w.describe(), out.describe());
  const int64_t M = x.dim(0), N = w.dim(0), K = x.dim(1);
  BASALT_CHECK(K > 0, "cuda linear: in_features must be > 0, got {}", w.describe());
  if (bias) {
    BASALT_CHECK(bias->device() == Device::kCuda && bias->dtype() == out.dtype() && bias->numel() == N,
                 "cuda linear: bias must be [{}] of out's dtype on the device, got {}", N, bias->describe());
  }
  if (M == 0 || N == 0) return;
  Impl::Plan& p = impl_->plan(x.dtype(), out.dtype(), M, N, K, bias ? bias->raw() : nullptr, w.raw(), x.raw(),
                                    out.raw(), stream);
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

namespace {

cuda_kernels::Elem elem_of(DType t) {
  return t == DType::kBF16 ? cuda_kernels::Elem::kBF16
         : t == DType::kF16 ? cuda_kernels::Elem::kF16
                            : cuda_kernels::Elem::kF32;
}

void skinny_linear_unchecked(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out, cudaStream_t stream,
                             int variant) {
  const int64_t M = x.dim(0), N = w.dim(0), K = x.dim(1);
  BASALT_CHECK(out.device() == Device::kCuda && (out.dtype() == DType::kF32 || out.dtype() == w.dtype()) &&
                   out.rank() == 2 && out.dim(0) == M && out.dim(1) == N,
               "cuda skinny_linear: out must be f32 or {} [{}, {}] on the device, got {}", dtype_name(w.dtype()), M, N,
               out.describe());
  if (bias) {
    BASALT_CHECK(bias->device() == Device::kCuda && bias->dtype() == DType::kF32 && bias->numel() == N,
                 "cuda skinny_linear: bias must be f32 [{}] on the device, got {}", N, bias->describe());
  }
  if (N == 0) return;
  const cudaError_t status =
      cuda_kernels::gemv(elem_of(x.dtype()), elem_of(w.dtype()), elem_of(out.dtype()), x.raw(), w.raw(),
                         bias ? bias->data<const float>() : nullptr, out.raw(), M, N, K, stream, variant);
  BASALT_CHECK(status == cudaSuccess, "cuda skinny_linear: launch failed: {}", cudaGetErrorString(status));
}

}  // namespace

bool row_invariant_linear_fits(const Tensor& x, const Tensor& w) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return x.device() == Device::kCuda && w.device() == Device::kCuda && x.rank() == 2 && w.rank() == 2 &&
         (w.dtype() == DType::kBF16 || w.dtype() == DType::kF16) &&
         (x.dtype() == DType::kF32 || x.dtype() == w.dtype()) && x.dim(0) >= 1 && x.dim(1) == w.dim(1) &&
         x.dim(1) % 32 == 0 && aligned(x.raw()) && aligned(w.raw());
}

bool skinny_linear_fits(const Tensor& x, const Tensor& w) {
  return row_invariant_linear_fits(x, w) && x.dim(0) <= cuda_kernels::kGemvMaxRows;
}

void row_invariant_linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out, cudaStream_t stream) {
  BASALT_CHECK(row_invariant_linear_fits(x, w),
               "cuda row_invariant_linear: x {} and w {} do not qualify (see gemm.h)", x.describe(), w.describe());
  skinny_linear_unchecked(x, w, bias, out, stream, cuda_kernels::kGemvRowInvariant);
}

void skinny_linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out, cudaStream_t stream,
                   int variant) {
  BASALT_CHECK(skinny_linear_fits(x, w), "cuda skinny_linear: x {} and w {} do not qualify (see gemm.h)",
               x.describe(), w.describe());
  skinny_linear_unchecked(x, w, bias, out, stream, variant);
}

}  // namespace basalt
