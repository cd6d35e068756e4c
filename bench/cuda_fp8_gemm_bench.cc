// The block-FP8 linear on the GPU (fp8_linear.h) at DeepSeek-V3's shapes
// (DeepGEMM's table: N x K = 2112x7168, 24576x1536, 32768x512, 7168x16384,
// 4096x7168, 7168x2048) for M = 1, 2, 4, 8, 16, 64, 128, 4096 tokens: time per call
// of our weight-streaming kernel (both pipeline depths), cuBLASLt's
// block-scaled FP8 (f32 out as the model uses it, and bf16 out as DeepGEMM
// reports it), our TMA-fed wgmma kernel (from 64 tokens, where the device
// has it) and the automatic choice, each including the activation
// quantizer; TFLOP/s, effective GB/s (weights, scales and x read once, out
// written once) and DeepGEMM's published H800 TFLOP/s where there is one
// (its README's dense table). Then the quantizer alone.
//
// Every timed call is one of `kCallsPerGraph` calls captured into a CUDA
// graph (as decode steps run), so launch overhead on the host does not count
// and GPU-side gaps do; the weights rotate over enough copies (> 256 MB,
// over 4x the 60 MB L2) that every call reads them from HBM. Median of
// --repeats graph launches.
//
// Usage: basalt_bench_cuda_fp8_gemm [--repeats N] [--shape NxK]... [--tokens M,M,...]
//
// --shape (repeatable) keeps the listed shapes of the table and --tokens
// runs the listed token counts instead of the table's (a profiler then sees
// only those calls).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/fp8_linear.h"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/moe_gemm_kernels.h"

namespace {

using namespace basalt;

constexpr int kCallsPerGraph = 20;

struct Shape2 {
  int64_t n, k;
  double deepgemm_m64, deepgemm_m128, deepgemm_m4096;  // H800 TFLOP/s, 0 where not published
};

uint64_t next(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}

// Random e4m3 bytes, never NaN (0x7f / 0xff).
Tensor random_fp8(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor host = Tensor::empty({rows, cols}, DType::kF8E4M3);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  uint8_t* p = host.data<uint8_t>();
  const int64_t n = host.numel();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = next(state);
    for (int b = 0; b < 8; ++b, v >>= 8) {
      uint8_t byte = static_cast<uint8_t>(v);
      if ((byte & 0x7f) == 0x7f) byte ^= 1;
      p[i + b] = byte;
    }
  }
  for (; i < n; ++i) p[i] = 0x38;
  return cuda_to_device(host);
}

// Values in [lo, hi) (f32), spread over the range.
Tensor random_f32(Shape shape, float lo, float hi, uint64_t seed) {
  Tensor host = Tensor::empty(std::move(shape), DType::kF32);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < host.numel(); ++i)
    host.data<float>()[i] = lo + (hi - lo) * static_cast<float>(next(state) >> 40) / static_cast<float>(1 << 24);
  return cuda_to_device(host);
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Microseconds per call: kCallsPerGraph calls (call(i), i = 0, 1, ...)
// captured into one graph, the median of `repeats` timed launches.
double time_per_call(const std::function<void(int, cudaStream_t)>& call, int repeats, cudaStream_t stream,
                     cudaEvent_t start, cudaEvent_t stop) {
  cudaGraphExec_t exec = nullptr;
  {
    CudaGraphPoolScope pool;
    BASALT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < kCallsPerGraph; ++i) call(i, stream);
    cudaGraph_t graph = nullptr;
    BASALT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    BASALT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    BASALT_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  for (int w = 0; w < 2; ++w) BASALT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<float> times;
  for (int r = 0; r < repeats; ++r) {
    BASALT_CUDA_CHECK(cudaEventRecord(start, stream));
    BASALT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    BASALT_CUDA_CHECK(cudaEventRecord(stop, stream));
    BASALT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  BASALT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  return median(times) * 1e3 / kCallsPerGraph;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 10;
  std::vector<std::string> only_shapes;
  std::vector<int64_t> only_tokens;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      repeats = std::max(3, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
      only_shapes.emplace_back(argv[++i]);
    } else if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
      const std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        only_tokens.push_back(std::atoll(list.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: basalt_bench_cuda_fp8_gemm [--repeats N] [--shape NxK]... [--tokens M,M,...]\n");
      return 2;
    }
  }
  const auto kept_shape = [&](int64_t n, int64_t k) {
    const std::string name = std::to_string(n) + "x" + std::to_string(k);
    return only_shapes.empty() || std::find(only_shapes.begin(), only_shapes.end(), name) != only_shapes.end();
  };
  if (!cuda_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const Shape2 shapes[] = {{2112, 7168, 0, 0, 0},        {24576, 1536, 0, 0, 0}, {32768, 512, 0, 0, 0},
                           {7168, 16384, 336, 645, 1520}, {4096, 7168, 287, 533, 1410}, {7168, 2048, 0, 0, 0}};
  // --tokens lists the token counts to run (any, not only the table's).
  const std::vector<int64_t> token_counts =
      only_tokens.empty() ? std::vector<int64_t>{1, 2, 4, 8, 16, 64, 128, 4096} : only_tokens;
  CudaFp8Linear fp8;
  cudaStream_t stream;
  BASALT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  BASALT_CUDA_CHECK(cudaEventCreate(&start));
  BASALT_CUDA_CHECK(cudaEventCreate(&stop));
  std::printf("x f32 [M, K], w e4m3 [N, K] with 128x128 f32 scales; times include the activation quantizer\n");
  if (cuda_kernels::wgmma_available())
    std::printf("wgmma kernel: %d clusters of one CTA resident at once, %d of two (\"pairs\")\n",
                cuda_kernels::tma_resident_clusters(1), cuda_kernels::tma_resident_clusters(2));
  std::printf("%6s %6s %5s  %-20s %9s %8s %8s %9s\n", "N", "K", "M", "path", "us/call", "TFLOP/s", "GB/s",
              "DeepGEMM");
  for (const Shape2& s : shapes) {
    if (!kept_shape(s.n, s.k)) continue;
    const int64_t weight_bytes = s.n * s.k;
    const int copies = static_cast<int>(std::max<int64_t>(2, (256ll << 20) / weight_bytes + 1));
    const int64_t nb = (s.n + kFp8BlockSize - 1) / kFp8BlockSize, kb = (s.k + kFp8BlockSize - 1) / kFp8BlockSize;
    std::vector<Tensor> weights, scales;
    weights.push_back(random_fp8(s.n, s.k, 1));
    scales.push_back(random_f32({nb, kb}, 1e-3f, 1e-2f, 2));
    for (int c = 1; c < copies; ++c) {
      weights.push_back(cuda_empty({s.n, s.k}, DType::kF8E4M3));
      BASALT_CUDA_CHECK(
          cudaMemcpy(weights.back().raw(), weights[0].raw(), weights[0].nbytes(), cudaMemcpyDeviceToDevice));
      scales.push_back(random_f32({nb, kb}, 1e-3f, 1e-2f, 2 + c));
    }
    for (int64_t m : token_counts) {
      const Tensor x = random_f32({m, s.k}, -2.0f, 2.0f, 3);
      Tensor out32 = cuda_empty({m, s.n}, DType::kF32), out16 = cuda_empty({m, s.n}, DType::kBF16);
      const double flops = 2.0 * static_cast<double>(m) * s.n * s.k;
      const double deepgemm = m == 64 ? s.deepgemm_m64 : m == 128 ? s.deepgemm_m128 : m == 4096 ? s.deepgemm_m4096 : 0;
      const auto report = [&](const char* path, double us, const Tensor& out) {
        const double bytes = static_cast<double>(weight_bytes) + 4.0 * nb * kb + static_cast<double>(x.nbytes()) +
                             static_cast<double>(out.nbytes());
        char anchor[16] = "";
        if (deepgemm > 0) std::snprintf(anchor, sizeof anchor, "%9.0f", deepgemm);
        std::printf("%6lld %6lld %5lld  %-20s %9.1f %8.1f %8.0f %9s\n", static_cast<long long>(s.n),
                    static_cast<long long>(s.k), static_cast<long long>(m), path, us, flops / us * 1e-6,
                    bytes / us * 1e-3, anchor);
      };
      const auto run = [&](Fp8LinearPath path, int variant, Tensor& out) {
        return [&, path, variant](int i, cudaStream_t st) {
          fp8.linear(x, weights[i % copies], scales[i % copies], out, st, path, variant);
        };
      };
      const int reps = m >= 4096 ? 3 : repeats;
      if (m <= 128) {
        report("ours depth 2", time_per_call(run(Fp8LinearPath::kStreaming, 1, out32), reps, stream, start, stop),
               out32);
        report("ours depth 4", time_per_call(run(Fp8LinearPath::kStreaming, 2, out32), reps, stream, start, stop),
               out32);
      }
      if (fp8.cublas_takes(m, s.n, s.k, DType::kF32, weights[0].raw(), out32.raw()))
        report("cuBLASLt f32 out", time_per_call(run(Fp8LinearPath::kCublas, 0, out32), reps, stream, start, stop),
               out32);
      else
        std::printf("%6lld %6lld %5lld  %-20s declined\n", static_cast<long long>(s.n), static_cast<long long>(s.k),
                    static_cast<long long>(m), "cuBLASLt f32 out");
      if (fp8.cublas_takes(m, s.n, s.k, DType::kBF16, weights[0].raw(), out16.raw()))
        report("cuBLASLt bf16 out", time_per_call(run(Fp8LinearPath::kCublas, 0, out16), reps, stream, start, stop),
               out16);
      if (m >= 64 && CudaFp8Linear::wgmma_takes(m, s.n, s.k, DType::kF32, weights[0].raw())) {
        report("ours wgmma (TMA)", time_per_call(run(Fp8LinearPath::kWgmma, 1, out32), reps, stream, start, stop),
               out32);
        report("ours wgmma pairs", time_per_call(run(Fp8LinearPath::kWgmma, 2, out32), reps, stream, start, stop),
               out32);
      }
      report("auto", time_per_call(run(Fp8LinearPath::kAuto, 0, out32), reps, stream, start, stop), out32);
    }
  }

  if (!only_shapes.empty() || !only_tokens.empty()) return 0;  // a profiler's run: the table's calls only
  std::printf("\nThe activation quantizer alone (x f32 [M, K] -> e4m3 + group-major scales)\n");
  std::printf("%6s %5s %9s %8s\n", "K", "M", "us/call", "GB/s");
  for (int64_t k : {512, 1536, 2048, 7168, 16384})
    for (int64_t m : {1, 16, 128, 4096}) {
      const Tensor x = random_f32({m, k}, -2.0f, 2.0f, 5);
      Tensor q = cuda_empty({m, k}, DType::kF8E4M3);
      Tensor sc = cuda_empty({(k + kFp8BlockSize - 1) / kFp8BlockSize, m}, DType::kF32);
      const double us = time_per_call([&](int, cudaStream_t st) { cuda_quantize_fp8_groups_outer(x, q, sc, st); },
                                      repeats, stream, start, stop);
      const double bytes = static_cast<double>(x.nbytes() + q.nbytes() + sc.nbytes());
      std::printf("%6lld %5lld %9.2f %8.0f\n", static_cast<long long>(k), static_cast<long long>(m), us,
                  bytes / us * 1e-3);
    }
  BASALT_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
