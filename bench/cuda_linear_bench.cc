// cuBLASLt bf16 linear on the GPU, at the shapes of a Llama-3.1-8B layer and
// its lm_head, for decode (M = 1, 8, 64, 256) and prefill (M = 4096) token
// counts: time per call (median of timed repeats with CUDA events), TFLOP/s,
// and effective GB/s (weights + activations read, output written) next to
// the H200's measured ceilings (2026-11: 4.18 TB/s read-only, ~636-790
// TFLOP/s dense bf16 from cuBLAS at M = 4096).
//
// Weights rotate over enough copies (> 4x the 60 MB L2) that every call reads
// them from HBM, as decode does.
//
// cuBLASLt rows take the heuristic's first algorithm; at M = 8-256 a
// "(timed plan)" row follows with the algorithm CublasLt picks by timing
// the heuristic's candidates (gemm.h), what the CUDA backend runs; the two
// are timed in turns, call by call.
//
// Usage: basalt_bench_cuda_linear [--repeats N]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemv_kernels.h"

namespace {

using namespace basalt;

struct LayerShape {
  const char* name;
  int64_t n, k;
};

// Random bf16 values of magnitude ~0.004-0.03 with random signs (the power a
// GEMM draws, and so its clock, depends on the data: constant fills flatter).
Tensor random_bf16(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor host = Tensor::empty({rows, cols}, DType::kBF16);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  uint16_t* p = host.data<uint16_t>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const uint16_t sign = static_cast<uint16_t>((state >> 63) << 15);
    const uint16_t exponent = static_cast<uint16_t>(0x77 + (state >> 40) % 3) << 7;
    p[i] = static_cast<uint16_t>(sign | exponent | (state & 0x7F));
  }
  return cuda_to_device(host);
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Milliseconds of one call, alone between two events.
template <typename Call>
float event_ms(cudaEvent_t start, cudaEvent_t stop, Call&& call) {
  BASALT_CUDA_CHECK(cudaEventRecord(start));
  call();
  BASALT_CUDA_CHECK(cudaEventRecord(stop));
  BASALT_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms;
}

// Seconds per call: the median of `repeats` calls, each alone between two
// events; call(r) makes call r.
template <typename Call>
double median_seconds(int repeats, cudaEvent_t start, cudaEvent_t stop, Call&& call) {
  std::vector<float> times;
  for (int r = 0; r < repeats; ++r) times.push_back(event_ms(start, stop, [&] { call(r); }));
  return median(times) * 1e-3;
}

// The same for two calls timed in turns (a, b, a, b, ...), so that a drift
// of the GPU's clock falls on both alike: {a's median, b's median}.
template <typename A, typename B>
std::pair<double, double> median_seconds_in_turns(int repeats, cudaEvent_t start, cudaEvent_t stop, A&& a, B&& b) {
  std::vector<float> ta, tb;
  for (int r = 0; r < repeats; ++r) {
    ta.push_back(event_ms(start, stop, [&] { a(r); }));
    tb.push_back(event_ms(start, stop, [&] { b(r); }));
  }
  return {median(ta) * 1e-3, median(tb) * 1e-3};
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 50;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) repeats = std::max(3, std::atoi(argv[++i]));
  }
  if (!cuda_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const LayerShape shapes[] = {{"qkv_proj", 6144, 4096},
                               {"o_proj", 4096, 4096},
                               {"gate_up_proj", 28672, 4096},
                               {"down_proj", 4096, 14336},
                               {"lm_head", 128256, 4096}};
  const int64_t token_counts[] = {1, 2, 3, 4, 5, 6, 8, 16, 32, 64, 128, 256, 4096};
  // The heuristic's first algorithm (the rows without a label) and, for
  // decode-sized M, the candidates timed (gemm.h), labelled "(timed plan)".
  CublasLt blas, tuned;
  blas.set_tuning(false);
  cudaEvent_t start, stop;
  BASALT_CUDA_CHECK(cudaEventCreate(&start));
  BASALT_CUDA_CHECK(cudaEventCreate(&stop));
  std::printf("%-13s %6s %6s %6s %10s %9s %9s\n", "layer", "M", "N", "K", "us/call", "TFLOP/s", "GB/s");
  for (const LayerShape& s : shapes) {
    const int64_t weight_bytes = s.n * s.k * 2;
    const int copies = static_cast<int>(std::max<int64_t>(2, (256ll << 20) / weight_bytes + 1));
    std::vector<Tensor> weights;
    weights.push_back(random_bf16(s.n, s.k, 1));
    for (int c = 1; c < copies; ++c) {
      weights.push_back(cuda_empty({s.n, s.k}, DType::kBF16));
      BASALT_CUDA_CHECK(cudaMemcpy(weights.back().raw(), weights[0].raw(), weights[0].nbytes(),
                                   cudaMemcpyDeviceToDevice));
    }
    for (int64_t m : token_counts) {
      Tensor x = random_bf16(m, s.k, 2), out = cuda_empty({m, s.n}, DType::kBF16);
      for (int w = 0; w < 3; ++w) blas.linear(x, weights[w % copies], nullptr, out);  // warm-up, plans
      const bool compare = m >= 8 && m <= 256;
      if (compare)
        for (int w = 0; w < 3; ++w) tuned.linear(x, weights[w % copies], nullptr, out);  // the first one times
      const auto heuristic = [&](int r) { blas.linear(x, weights[r % copies], nullptr, out); };
      const auto timed = [&](int r) { tuned.linear(x, weights[r % copies], nullptr, out); };
      double sec = 0, tsec = 0;
      if (compare) {
        std::tie(sec, tsec) = median_seconds_in_turns(repeats, start, stop, heuristic, timed);
      } else {
        sec = median_seconds(repeats, start, stop, heuristic);
      }
      const double flops = 2.0 * static_cast<double>(m) * s.n * s.k;
      const double bytes = static_cast<double>(weight_bytes) + 2.0 * m * s.k + 2.0 * m * s.n;
      const auto print_row = [&](double seconds, const char* label) {
        std::printf("%-13s %6lld %6lld %6lld %10.1f %9.1f %9.0f%s\n", s.name, static_cast<long long>(m),
                    static_cast<long long>(s.n), static_cast<long long>(s.k), seconds * 1e6,
                    flops / seconds * 1e-12, bytes / seconds * 1e-9, label);
      };
      print_row(sec, "");
      if (compare) print_row(tsec, "  (timed plan)");
      if (m <= 16) {
        // The decode path: the GEMV kernels, f32 out as the model uses them,
        // on the same bf16 activations and on f32 ones (the model's decode
        // input); every configuration (gemv_kernels.h): tensor cores 1-3, and
        // one warp per weight row with 1, 2 or 4 rows a warp.
        Tensor out32 = cuda_empty({m, s.n}, DType::kF32);
        const Tensor x32 = cuda_to_device(cuda_to_host(x).to_f32());
        for (const bool f32_x : {false, true})
          for (const int variant : {1, 2, 3, cuda_kernels::kGemvRowKernel1, cuda_kernels::kGemvRowKernel2,
                                    cuda_kernels::kGemvRowKernel4}) {
            const bool row_kernel = variant > 3;
            if (row_kernel && m > cuda_kernels::kRowKernelMaxRows) continue;
            if (f32_x && (variant == 2 || variant == 3)) continue;
            const Tensor& input = f32_x ? x32 : x;
            for (int w = 0; w < 3; ++w) skinny_linear(input, weights[w % copies], nullptr, out32, nullptr, variant);
            const double ssec = median_seconds(repeats, start, stop, [&](int r) {
              skinny_linear(input, weights[r % copies], nullptr, out32, nullptr, variant);
            });
            const double sbytes =
                static_cast<double>(weight_bytes) + (f32_x ? 4.0 : 2.0) * m * s.k + 4.0 * m * s.n;
            char label[48];
            if (row_kernel)
              std::snprintf(label, sizeof label, "(row x%d%s)",
                            variant == cuda_kernels::kGemvRowKernel1   ? 1
                            : variant == cuda_kernels::kGemvRowKernel2 ? 2
                                                                       : 4,
                            f32_x ? ", x f32" : "");
            else
              std::snprintf(label, sizeof label, "(gemv %d%s)", variant, f32_x ? ", x f32" : "");
            std::printf("%-13s %6lld %6lld %6lld %10.1f %9.1f %9.0f  %s\n", s.name, static_cast<long long>(m),
                        static_cast<long long>(s.n), static_cast<long long>(s.k), ssec * 1e6,
                        flops / ssec * 1e-12, sbytes / ssec * 1e-9, label);
          }
      }
    }
  }
  return 0;
}
