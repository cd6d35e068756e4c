// CudaBackend::moe_experts at DeepSeek-V3's routed-expert shapes: H = 7168,
// I = 2048, 256 block-FP8 experts (e4m3, 128x128 scales), top 8, routing
// drawn uniformly at random (k distinct experts per token).
//
//  * Decode, T = 1, 32, 128: time per call and the effective bandwidth of
//    the expert weights the call touches (each used expert's gate, up and
//    down with their scales, counted once), against the H200's ~4.2 TB/s
//    read ceiling (measured read-only, 2026-11). The routing changes every call
//    (16 sets in turn) and the 256 experts take 11.3 GB, so weights come
//    from HBM. T = 1 and 32 are timed again as CUDA graph replays
//    (CudaBackend::record), as a serving engine runs decode.
//  * Prefill, T = 1024 and 4096: TFLOP/s of the whole op and of its two grouped GEMMs
//    alone (6 T k H I flops), next to DeepGEMM's published grouped-contiguous
//    1214-1346 TFLOP/s (H800). At T = 4096 every expert is used and the
//    weights alone are 11.3 GB: ~2.7 ms of HBM reads at 4.2 TB/s, so the
//    whole op cannot pass ~1,070 TFLOP/s at this shape on an H200.
//  * Then a shape like those of DeepGEMM's grouped-contiguous figures (8
//    experts of 4096 rows each), each GEMM's TFLOP/s, with the two wgmma
//    kernels.
// Every configuration runs with each FP8 multiply (moe_gemm_kernels.h: the
// PTX e4m3 mma, e4m3 reread as f16, and wgmma where it runs, promoted per
// 128-K block or per k32 MMA, 64-row tiles, or fed by TMA in 192-row tiles)
// and the tile sizes that fit; stage times come from events
// between the op's kernels (median over repeats). Each row's output is
// compared with the first row's of its T (the e4m3 mma): "vs first" is the
// relative error (the sums differ only in order, so ~1e-6).
//
// Usage: basalt_bench_cuda_moe [--repeats N]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/moe_gemm_kernels.h"

namespace {

using namespace basalt;

constexpr int64_t kHidden = 7168, kInter = 2048, kExperts = 256, kTopK = 8;
constexpr int kDistinct = 4;     // distinct random expert weight sets on the host
constexpr int kRoutingSets = 16;  // routings used in turn

// Random e4m3 bytes of magnitude 2^-3 .. 2^3 with random signs (no NaN).
Tensor random_e4m3(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor host = Tensor::empty({rows, cols}, DType::kF8E4M3);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  uint8_t* p = host.data<uint8_t>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const uint8_t sign = static_cast<uint8_t>((state >> 63) << 7);
    const uint8_t exponent = static_cast<uint8_t>(4 + (state >> 40) % 7);
    p[i] = static_cast<uint8_t>(sign | exponent << 3 | (state & 7));
  }
  return cuda_to_device(host);
}

Tensor random_scales(int64_t rows, int64_t cols, float base, std::mt19937_64& rng) {
  Tensor host = Tensor::empty({rows, cols}, DType::kF32);
  std::uniform_real_distribution<float> d(0.5f, 2.0f);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = base * d(rng);
  return cuda_to_device(host);
}

Tensor device_copy(const Tensor& src) {
  Tensor dst = cuda_empty(src.shape(), src.dtype());
  BASALT_CUDA_CHECK(cudaMemcpy(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice));
  return dst;
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Routing {
  Tensor ids, weights;  // device
  int64_t distinct = 0;  // experts used
};

Routing random_routing(int64_t T, std::mt19937_64& rng) {
  Tensor ids = Tensor::empty({T, kTopK}, DType::kI32), w = Tensor::empty({T, kTopK}, DType::kF32);
  std::vector<int32_t> pool(kExperts);
  std::set<int32_t> used;
  std::uniform_real_distribution<float> weight(0.05f, 0.3f);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(pool.begin(), pool.end(), 0);
    for (int64_t j = 0; j < kTopK; ++j) {
      std::uniform_int_distribution<int64_t> pick(j, kExperts - 1);
      std::swap(pool[j], pool[pick(rng)]);
      ids.data<int32_t>()[t * kTopK + j] = pool[j];
      w.data<float>()[t * kTopK + j] = weight(rng);
      used.insert(pool[j]);
    }
  }
  return {cuda_to_device(ids), cuda_to_device(w), static_cast<int64_t>(used.size())};
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 30;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) repeats = std::max(3, std::atoi(argv[++i]));
  if (!cuda_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  std::mt19937_64 rng(7);
  // kDistinct random experts, copied to 256 separate allocations.
  const int64_t bi = (kInter + 127) / 128, bh = (kHidden + 127) / 128;
  std::vector<MoeExpert> base;
  for (int d = 0; d < kDistinct; ++d)
    base.push_back(MoeExpert{{random_e4m3(kInter, kHidden, 10 * d + 1), random_scales(bi, bh, 3e-3f, rng)},
                             {random_e4m3(kInter, kHidden, 10 * d + 2), random_scales(bi, bh, 3e-3f, rng)},
                             {random_e4m3(kHidden, kInter, 10 * d + 3), random_scales(bh, bi, 3e-3f, rng)}});
  std::vector<MoeExpert> experts;
  for (int64_t e = 0; e < kExperts; ++e) {
    const MoeExpert& b = base[static_cast<size_t>(e % kDistinct)];
    experts.push_back(MoeExpert{{device_copy(b.gate.weight), device_copy(b.gate.scale_inv)},
                                {device_copy(b.up.weight), device_copy(b.up.scale_inv)},
                                {device_copy(b.down.weight), device_copy(b.down.scale_inv)}});
  }
  base.clear();
  const double expert_bytes = 3.0 * kHidden * kInter + 4.0 * (2.0 * bi * bh + bh * bi);

  CudaBackend cuda;
  MoeExpertTables tables;
  const MoeExpertTable& table = tables.get(experts, cuda.stream());
  MoeStageEvents ev{};
  for (cudaEvent_t& e : ev.at) BASALT_CUDA_CHECK(cudaEventCreate(&e));

  std::printf("DeepSeek-V3 routed experts: H %lld, I %lld, %lld FP8 experts (%.1f MB each), top %lld, uniform routing\n",
              static_cast<long long>(kHidden), static_cast<long long>(kInter), static_cast<long long>(kExperts),
              expert_bytes * 1e-6, static_cast<long long>(kTopK));
  std::printf("stage columns: median us of prep (permute + quantize x), GEMM 1, act quantize, GEMM 2, un-permute\n\n");
  std::printf("%6s %-9s %4s %9s | %7s %8s %7s %8s %7s | %8s %8s %9s %9s %9s\n", "T", "mma", "tile", "us/call", "prep",
              "gemm1", "actq", "gemm2", "unperm", "experts", "GB/s", "TFLOP/s", "GEMM TF/s", "vs first");

  struct Result {
    int64_t T;
    double us, gbs, tflops, gemm_tflops;
  };
  std::vector<Result> results;
  for (int64_t T : {int64_t{1}, int64_t{32}, int64_t{128}, int64_t{1024}, int64_t{4096}}) {
    std::vector<Routing> routes;
    for (int i = 0; i < (T >= 4096 ? 2 : kRoutingSets); ++i) routes.push_back(random_routing(T, rng));
    double distinct = 0;
    for (const Routing& r : routes) distinct += static_cast<double>(r.distinct);
    distinct /= static_cast<double>(routes.size());
    Tensor xh = Tensor::empty({T, kHidden}, DType::kF32);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < xh.numel(); ++i) xh.data<float>()[i] = normal(rng);
    const Tensor x = cuda_to_device(xh);
    Tensor out = cuda_empty({T, kHidden}, DType::kF32);
    constexpr int kTma = cuda_kernels::kWgmmaTmaTileM;
    const std::vector<int> tiles = T >= 4096   ? std::vector<int>{64, 128, kTma}
                                   : T >= 1024 ? std::vector<int>{16, 64, 128, kTma}
                                   : T >= 128  ? std::vector<int>{16, 64, kTma}
                                               : std::vector<int>{16};
    const int reps = T >= 4096 ? std::max(3, repeats / 3) : repeats;
    Tensor first;  // the first configuration's output
    for (int mode : {cuda_kernels::kMoeMmaE4m3, cuda_kernels::kMoeMmaE4m3AsF16, cuda_kernels::kMoeMmaWgmma,
                     cuda_kernels::kMoeMmaWgmmaPrecise, cuda_kernels::kMoeMmaWgmmaTma,
                     cuda_kernels::kMoeMmaWgmmaTmaPair})
      for (int tile : tiles) {
        const bool wgmma = mode == cuda_kernels::kMoeMmaWgmma || mode == cuda_kernels::kMoeMmaWgmmaPrecise;
        const bool tma = mode == cuda_kernels::kMoeMmaWgmmaTma || mode == cuda_kernels::kMoeMmaWgmmaTmaPair;
        if (wgmma && (tile != cuda_kernels::kWgmmaTileM || !cuda_kernels::wgmma_available())) continue;
        if ((tma != (tile == kTma)) || (tma && !cuda_kernels::wgmma_available())) continue;
        MoeOptions o;
        o.fp8_mma = mode;
        o.tile_m = tile;
        for (int w = 0; w < 2; ++w)
          cuda_moe_experts(x, routes[w % routes.size()].ids, routes[w % routes.size()].weights, table, out,
                           cuda.stream(), o);
        std::vector<float> total, stage[5];
        for (int r = 0; r < reps; ++r) {
          const Routing& rt = routes[static_cast<size_t>(r) % routes.size()];
          cuda_moe_experts(x, rt.ids, rt.weights, table, out, cuda.stream(), o, &ev);
          BASALT_CUDA_CHECK(cudaEventSynchronize(ev.at[5]));
          float ms = 0;
          BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.at[0], ev.at[5]));
          total.push_back(ms);
          for (int s = 0; s < 5; ++s) {
            BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.at[s], ev.at[s + 1]));
            stage[s].push_back(ms);
          }
        }
        // Against the first configuration, on the last routing set's output.
        cuda_moe_experts(x, routes[0].ids, routes[0].weights, table, out, cuda.stream(), o);
        const Tensor check = cuda_to_host(out);
        int64_t bad = 0;
        for (int64_t i = 0; i < check.numel(); ++i) bad += std::isfinite(check.data<float>()[i]) ? 0 : 1;
        if (!first.defined()) first = check;
        double diff = 0, norm = 0;
        for (int64_t i = 0; i < check.numel(); ++i) {
          const double d = static_cast<double>(check.data<float>()[i]) - first.data<float>()[i];
          diff += d * d;
          norm += static_cast<double>(first.data<float>()[i]) * first.data<float>()[i];
        }
        const double rel = norm > 0 ? std::sqrt(diff / norm) : 0.0;
        const double sec = median(total) * 1e-3;
        const double gemm_sec = (median(stage[1]) + median(stage[3])) * 1e-3;
        const double flops = 6.0 * static_cast<double>(T) * kTopK * kHidden * kInter;
        const double gbs = distinct * expert_bytes / sec * 1e-9;
        const char* mode_name = mode == cuda_kernels::kMoeMmaE4m3          ? "e4m3"
                                : mode == cuda_kernels::kMoeMmaE4m3AsF16   ? "e4m3>f16"
                                : mode == cuda_kernels::kMoeMmaWgmma       ? "wgmma"
                                : mode == cuda_kernels::kMoeMmaWgmmaTma    ? "wgmma-tma"
                                : mode == cuda_kernels::kMoeMmaWgmmaTmaPair ? "tma-pair"
                                                                           : "wgmma-k32";
        std::printf("%6lld %-9s %4d %9.1f | %7.1f %8.1f %7.1f %8.1f %7.1f | %8.1f %8.0f %9.1f %9.1f %9.1e%s\n",
                    static_cast<long long>(T), mode_name, tile,
                    sec * 1e6, median(stage[0]) * 1e3, median(stage[1]) * 1e3, median(stage[2]) * 1e3,
                    median(stage[3]) * 1e3, median(stage[4]) * 1e3, distinct, gbs, flops / sec * 1e-12,
                    flops / gemm_sec * 1e-12, rel, bad ? "  NON-FINITE OUTPUT" : "");
        results.push_back({T, sec * 1e6, gbs, flops / sec * 1e-12, flops / gemm_sec * 1e-12});
      }
    // Decode as an engine runs it: the backend op (default multiply and
    // tile) recorded once and replayed, one routing (its experts' 44 MB
    // each exceed the 60 MB L2 from 2 experts on).
    if (T <= 32) {
      const Routing& rt = routes[0];
      cuda.moe_experts(x, rt.ids, rt.weights, experts, out);
      std::unique_ptr<RecordedOps> graph = cuda.record([&] { cuda.moe_experts(x, rt.ids, rt.weights, experts, out); });
      cudaEvent_t start, stop;
      BASALT_CUDA_CHECK(cudaEventCreate(&start));
      BASALT_CUDA_CHECK(cudaEventCreate(&stop));
      for (int w = 0; w < 3; ++w) graph->replay();
      std::vector<float> times;
      for (int r = 0; r < repeats; ++r) {
        BASALT_CUDA_CHECK(cudaEventRecord(start, cuda.stream()));
        graph->replay();
        BASALT_CUDA_CHECK(cudaEventRecord(stop, cuda.stream()));
        BASALT_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
      }
      const double sec = median(times) * 1e-3;
      std::printf("%6lld %-9s %4s %9.1f | %7s %8s %7s %8s %7s | %8lld %8.0f %9.1f %9s  (graph replay, backend op)\n",
                  static_cast<long long>(T), "default", "auto", sec * 1e6, "-", "-", "-", "-", "-",
                  static_cast<long long>(rt.distinct), static_cast<double>(rt.distinct) * expert_bytes / sec * 1e-9,
                  6.0 * static_cast<double>(T) * kTopK * kHidden * kInter / sec * 1e-12, "-");
      BASALT_CUDA_CHECK(cudaEventDestroy(start));
      BASALT_CUDA_CHECK(cudaEventDestroy(stop));
    }
  }
  // A shape like those of DeepGEMM's grouped-contiguous figures: 8 experts
  // of 4096 rows each (T = 4096, every token routed to all of the first 8
  // experts). GEMM 1 is 8 groups of M 4096, N 4096, K 7168; GEMM 2 of M
  // 4096, N 7168, K 2048.
  {
    constexpr int64_t T = 4096, E = 8;
    const std::span<const MoeExpert> few(experts.data(), E);
    const MoeExpertTable& few_table = tables.get(few, cuda.stream());
    Tensor ids = Tensor::empty({T, E}, DType::kI32), w = Tensor::empty({T, E}, DType::kF32);
    for (int64_t i = 0; i < T * E; ++i) {
      ids.data<int32_t>()[i] = static_cast<int32_t>(i % E);
      w.data<float>()[i] = 1.0f / E;
    }
    const Tensor d_ids = cuda_to_device(ids), d_w = cuda_to_device(w);
    Tensor xh = Tensor::empty({T, kHidden}, DType::kF32);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < xh.numel(); ++i) xh.data<float>()[i] = normal(rng);
    const Tensor x = cuda_to_device(xh);
    Tensor out = cuda_empty({T, kHidden}, DType::kF32);
    const double flops1 = 2.0 * T * E * 2 * kInter * kHidden, flops2 = 2.0 * T * E * kHidden * kInter;
    std::printf("\nshaped like DeepGEMM's grouped-contiguous figures (8 groups x 4096 rows; GEMM 1 N 4096 K 7168, "
                "GEMM 2 N 7168 K 2048), TFLOP/s:\n");
    for (auto [mode, tile] : {std::pair<int, int>{cuda_kernels::kMoeMmaWgmma, cuda_kernels::kWgmmaTileM},
                              std::pair<int, int>{cuda_kernels::kMoeMmaWgmmaTma, cuda_kernels::kWgmmaTmaTileM},
                              std::pair<int, int>{cuda_kernels::kMoeMmaWgmmaTmaPair, cuda_kernels::kWgmmaTmaTileM}}) {
      if (!cuda_kernels::wgmma_available()) break;
      const MoeOptions o{mode, tile, false};
      for (int r = 0; r < 2; ++r) cuda_moe_experts(x, d_ids, d_w, few_table, out, cuda.stream(), o);
      std::vector<float> g1, g2;
      for (int r = 0; r < std::max(3, repeats / 3); ++r) {
        cuda_moe_experts(x, d_ids, d_w, few_table, out, cuda.stream(), o, &ev);
        BASALT_CUDA_CHECK(cudaEventSynchronize(ev.at[5]));
        float ms = 0;
        BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.at[1], ev.at[2]));
        g1.push_back(ms);
        BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.at[3], ev.at[4]));
        g2.push_back(ms);
      }
      std::printf("  %-9s %4d  GEMM 1 %8.1f us %7.1f TFLOP/s   GEMM 2 %8.1f us %7.1f TFLOP/s\n",
                  mode == cuda_kernels::kMoeMmaWgmma      ? "wgmma"
                  : mode == cuda_kernels::kMoeMmaWgmmaTma ? "wgmma-tma"
                                                          : "tma-pair",
                  tile, median(g1) * 1e3,
                  flops1 / (median(g1) * 1e-3) * 1e-12, median(g2) * 1e3, flops2 / (median(g2) * 1e-3) * 1e-12);
    }
  }
  std::printf("\nceilings: H200 HBM read ~4180 GB/s (measured here); DeepGEMM grouped contiguous FP8 (H800) "
              "1214-1346 TFLOP/s; cuBLASLt dense block-FP8 M=4096 ~960-1135 TFLOP/s\n");
  std::printf("\nsummary (best per T):\n");
  for (int64_t T : {int64_t{1}, int64_t{32}, int64_t{128}, int64_t{1024}, int64_t{4096}}) {
    const Result* best = nullptr;
    for (const Result& r : results)
      if (r.T == T && (!best || r.us < best->us)) best = &r;
    if (!best) continue;
    if (T < 1024)
      std::printf("  T %5lld decode : %8.1f us, %6.0f GB/s of touched expert weights (%.0f%% of 4180)\n",
                  static_cast<long long>(T), best->us, best->gbs, 100.0 * best->gbs / 4180.0);
    else
      std::printf("  T %5lld prefill: %8.1f us, %6.1f TFLOP/s whole op, %6.1f TFLOP/s GEMMs (DeepGEMM 1214-1346)\n",
                  static_cast<long long>(T), best->us, best->tflops, best->gemm_tflops);
  }
  for (cudaEvent_t& e : ev.at) BASALT_CUDA_CHECK(cudaEventDestroy(e));
  return 0;
}
