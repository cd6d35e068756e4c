// MLA decode on the GPU at DeepSeek-V3's attention shape (128 heads, latent
// 512 + rope 64 = 576-wide bf16 cache rows, values the first 512, Dn = Dv =
// 128, kv_b bf16 as the backend keeps a dequantized FP8 one): batch 1, 32
// and 128 with 4096 keys per sequence, and batch 1 with 32768.
//  * "core": the attention core alone (CudaMla::attention_core on a built
//    q_full; split-KV + combine where the shapes ask for it), on the kernel
//    the backend picks (wgmma on sm_90a), and "mma.sync" the same call
//    forced onto the mma.sync kernel, side by side ("x": how much faster);
//  * "op": the whole Backend::mla_attention (q absorption GEMM, core, value
//    GEMM);
//  * the core again with the number of key splits forced (2 .. 64), to
//    check the automatic choice.
// GB/s counts the cache rows read (1152 bytes per key and sequence; the op
// adds kv_b's 32 MiB); TFLOP/s counts 2 * (576 + 512) flops per (head, key)
// for the core, plus 2 * 2 * 128 * 512 per head and token for the GEMMs.
// FlashMLA's published dense decode on an H800 (3.35 TB/s HBM) is up to
// ~3000 GB/s memory-bound, 660 TFLOP/s compute-bound; the H200 reads ~4.18
// TB/s.
//
// Times are medians over replays of a CUDA graph of 20 calls, per call; the
// calls rotate over layouts of random slots from a pool of at least 300 MB,
// so consecutive calls do not find their rows in the 50 MB L2. The cache is
// random bf16 (no zeros).
//
// Usage: basalt_bench_cuda_mla [--repeats N]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/mla.h"
#include "core/dtype.h"

namespace {

using namespace basalt;

constexpr int kHeads = 128, kL = 512, kR = 64, kDn = 128, kDv = 128, kCalls = 20;
constexpr double kFlashMlaGBs = 3000.0;

Tensor random_device(Shape shape, DType dtype, float scale, uint64_t seed) {
  Tensor host = Tensor::empty(std::move(shape), dtype);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < host.numel(); ++i) {
    float v = normal(rng);
    if (v == 0.0f) v = scale;
    if (dtype == DType::kF32) host.data<float>()[i] = v;
    else host.data<uint16_t>()[i] = f32_to_bf16(v);
  }
  return cuda_to_device(host);
}

// Median per-call time (us) of `ops` (kCalls calls) recorded once.
double time_graph(CudaBackend& cuda, const std::function<void()>& ops, int repeats) {
  auto graph = cuda.record(ops);
  graph->replay();  // warm-up
  cuda.synchronize();
  cudaEvent_t start, stop;
  BASALT_CUDA_CHECK(cudaEventCreate(&start));
  BASALT_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    BASALT_CUDA_CHECK(cudaEventRecord(start, cuda.stream()));
    graph->replay();
    BASALT_CUDA_CHECK(cudaEventRecord(stop, cuda.stream()));
    BASALT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(1000.0 * ms / kCalls);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 10;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
  if (!cuda_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  CudaBackend cuda;
  CudaMla mla(cuda.stream());
  const MlaParams p{kHeads, kL, kDn, kR, kDv, 0.1352f};
  const LinearWeight kv_b{random_device({int64_t{kHeads} * (kDn + kDv), kL}, DType::kBF16, 0.02f, 7), Tensor()};
  struct Row {
    int batch, context;
    double core_us, mma_sync_us, op_us, core_gbs, core_tflops, op_gbs, op_tflops;
  };
  std::vector<Row> rows;
  struct SplitTime {
    int batch, splits;
    double us;
  };
  std::vector<SplitTime> sweep;
  const std::pair<int, int> cases[] = {{1, 4096}, {32, 4096}, {128, 4096}, {1, 32768}};
  for (const auto& [batch, context] : cases) {
    const int64_t keys = int64_t{batch} * context;
    const int64_t row_bytes = (kL + kR) * 2;
    const int64_t pool = std::max<int64_t>(keys, (int64_t{300} << 20) / row_bytes);
    const Tensor cache = random_device({pool, kL + kR}, DType::kBF16, 0.5f, 11 + batch);
    // Layouts of random distinct slots, rotated so that calls miss the L2.
    const int n_layouts = static_cast<int>(std::clamp<int64_t>(pool / keys, 1, kCalls));
    std::vector<AttentionLayout> layouts;
    std::mt19937_64 rng(batch);
    std::vector<int32_t> perm(static_cast<size_t>(pool));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> q_start(batch + 1), kv_start(batch + 1);
    for (int s = 0; s <= batch; ++s) {
      q_start[s] = s;
      kv_start[s] = s * context;
    }
    for (int l = 0; l < n_layouts; ++l) {
      std::vector<int32_t> slots(perm.begin() + l * keys, perm.begin() + (l + 1) * keys);
      layouts.push_back({cuda_to_device(Tensor::from_i32({batch + 1}, q_start)),
                         cuda_to_device(Tensor::from_i32({batch + 1}, kv_start)),
                         cuda_to_device(Tensor::from_i32({keys}, slots))});
    }
    const Tensor q_full = random_device({batch, int64_t{kHeads} * (kL + kR)}, DType::kBF16, 0.3f, 3);
    Tensor o_lat = cuda_empty({batch, int64_t{kHeads} * kL}, DType::kBF16);
    const Tensor q = random_device({batch, int64_t{kHeads} * (kDn + kR)}, DType::kF32, 1.0f, 5);
    Tensor out = cuda_empty({batch, int64_t{kHeads} * kDv}, DType::kF32);
    const double core_us = time_graph(
        cuda,
        [&] {
          for (int c = 0; c < kCalls; ++c) mla.attention_core(q_full, cache, layouts[c % n_layouts], p, o_lat);
        },
        repeats);
    const double mma_sync_us = time_graph(
        cuda,
        [&] {
          for (int c = 0; c < kCalls; ++c)
            mla.attention_core(q_full, cache, layouts[c % n_layouts], p, o_lat, CudaMlaPath::kMmaSync);
        },
        repeats);
    const double op_us = time_graph(
        cuda,
        [&] {
          for (int c = 0; c < kCalls; ++c) cuda.mla_attention(q, cache, kv_b, layouts[c % n_layouts], p, out);
        },
        repeats);
    // The core at forced key-split counts, next to the automatic choice.
    for (const int splits : {2, 4, 8, 16, 32, 64}) {
      if (context != 4096) continue;
      const double us = time_graph(
          cuda,
          [&] {
            for (int c = 0; c < kCalls; ++c)
              mla.attention_core(q_full, cache, layouts[c % n_layouts], p, o_lat, CudaMlaPath::kAuto, splits);
          },
          repeats);
      sweep.push_back({batch, splits, us});
    }
    const double cache_bytes = static_cast<double>(keys) * row_bytes;
    const double core_flops = 2.0 * kHeads * static_cast<double>(keys) * (kL + kR + kL);
    const double gemm_flops = 2.0 * 2.0 * batch * kHeads * double{kDn} * kL;
    const double weight_bytes = static_cast<double>(kv_b.weight.nbytes());
    rows.push_back({batch, context, core_us, mma_sync_us, op_us, cache_bytes / core_us / 1e3,
                    core_flops / core_us / 1e6, (cache_bytes + weight_bytes) / op_us / 1e3,
                    (core_flops + gemm_flops) / op_us / 1e6});
  }
  std::printf("\nMLA decode, DeepSeek-V3 shape (128 heads, 576/512, bf16 cache); core: %s\n",
              cuda_kernels::wgmma_available() ? "wgmma" : "mma.sync");
  std::printf("%-6s %8s %10s %10s %10s %12s %8s %10s %10s %10s %14s\n", "batch", "keys", "core us", "core GB/s",
              "core TF/s", "mma.sync us", "x", "op us", "op GB/s", "op TF/s", "FlashMLA GB/s");
  for (const Row& r : rows)
    std::printf("%-6d %8d %10.1f %10.0f %10.1f %12.1f %8.2f %10.1f %10.0f %10.1f %14.0f\n", r.batch, r.context,
                r.core_us, r.core_gbs, r.core_tflops, r.mma_sync_us, r.mma_sync_us / r.core_us, r.op_us, r.op_gbs,
                r.op_tflops, kFlashMlaGBs);
  std::printf("(FlashMLA: published H800 figure, 3.35 TB/s HBM; this GPU reads ~4.18 TB/s)\n");
  std::printf("\ncore us at a forced number of key splits, 4096 keys (the automatic choice is the table above)\n");
  std::printf("%-6s %8s %10s\n", "batch", "splits", "core us");
  for (const SplitTime& t : sweep) std::printf("%-6d %8d %10.1f\n", t.batch, t.splits, t.us);
  return 0;
}
