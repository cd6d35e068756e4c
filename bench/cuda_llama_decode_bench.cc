// Decode and prefill speed of a random-weight Llama-3.1-8B-shaped model on
// the CUDA backend, next to the weight-bandwidth floor.
//
//   basalt_bench_cuda_llama_decode [--layers N] [--prompt CONTEXT] [--tokens STEPS] [--batch-invariant 1]
//                                  [--gemm-tuning 0]
//
// --batch-invariant 1 times the backend's batch-invariant mode (backend.h).
// --gemm-tuning 0 takes cuBLASLt's heuristic's first algorithm for every
// shape instead of timing its candidates (gemm.h), to compare the two.
//
// The checkpoint (bf16; 16 GB for all 32 layers; layers share their random
// tensors on disk, which changes nothing for speed: each layer gets its own
// copy on the GPU) is written to a temporary directory, loaded through the
// path `basalt serve --device cuda` uses, and deleted afterwards. A decode
// step at batch B runs B sequences of `context` (--prompt) cached tokens
// (bf16 KV cache holding random values) through one forward pass: embedding,
// 32 layers, the lm_head for B rows. Each step is timed twice in one run:
// eager (every kernel launched from the host) and replayed from a CUDA graph
// (GraphedModel, as `basalt serve` runs decode). Step time is the median
// over --tokens steps after two warm-ups, timed on the host around a
// synchronised forward, with the host-to-device batch upload included as the
// engine pays it. The floor is weight bytes / 4.18 TB/s (the H200's measured
// read bandwidth, read-only, 2026-11). Prefill runs one forward over B
// prompts of `context` tokens each (B <= 8).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "model/graphed_model.h"
#include "model/model.h"
#include "bench_util.h"
#include "forward_batches.h"
#include "llama_checkpoint.h"

using namespace basalt;
using namespace basalt::bench;

int main(int argc, char** argv) {
  ModelBenchFlags flags{32, 512, 20};  // layers, context ("prompt"), steps ("tokens")
  int batch_invariant = 0, gemm_tuning = 1;
  if (!parse_int_flags(argc, argv,
                       {{"--layers", &flags.layers, 1},
                        {"--prompt", &flags.prompt, 1},
                        {"--tokens", &flags.tokens, 1},
                        {"--batch-invariant", &batch_invariant, 0},
                        {"--gemm-tuning", &gemm_tuning, 0}}))
    return 2;
  const int layers = flags.layers;
  const int64_t context = flags.prompt;
  const int steps = std::max(3, flags.tokens);
  const int64_t H = 4096, I = 14336, heads = 32, kv_heads = 8, D = 128, V = 128256;

  // The device first: without one, fail before writing 16 GB.
  if (!cuda_available()) {
    std::fprintf(stderr, "basalt_bench_cuda_llama_decode: no CUDA device is available\n");
    return 1;
  }
  CudaBackend backend;
  backend.set_batch_invariant(batch_invariant != 0);
  backend.set_gemm_tuning(gemm_tuning != 0);
  const auto dir = std::filesystem::temp_directory_path() / ("basalt_llama8b_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // Removed however the load ends.
  struct RemoveDir {
    std::filesystem::path path;
    ~RemoveDir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } remove_dir{dir};
  std::printf("writing a random-weight Llama-3.1-8B-shaped checkpoint (%d layers)...\n", layers);
  std::fflush(stdout);
  LlamaShape shape;
  shape.layers = layers;
  write_random_llama(dir, shape);

  auto start = Clock::now();
  auto model = load_model(dir.string(), backend);
  backend.synchronize();
  const double load_s = seconds_since(start);
  std::filesystem::remove_all(dir);

  const double weight_bytes = layers * 2.0 * static_cast<double>(H * heads * D * 2 + H * kv_heads * D * 2 + 3 * H * I) +
                              2.0 * static_cast<double>(V * H);  // lm_head (the embedding reads B rows)
  const double floor_ms = weight_bytes / 4.18e12 * 1e3;
  std::printf("\nLlama-3.1-8B shape, %d layers, bf16 weights, context %lld%s, cuBLASLt plans %s (load %.1f s)\n",
              layers, static_cast<long long>(context), batch_invariant ? ", batch-invariant" : "",
              gemm_tuning ? "timed" : "the heuristic's first", load_s);
  std::printf("weights read per decode step: %.2f GB; bandwidth floor %.2f ms/step\n", weight_bytes / 1e9, floor_ms);
  std::printf("%-6s %12s %12s %12s %12s %14s\n", "batch", "eager ms", "graphed ms", "tokens/s", "graph/floor",
              "prefill tok/s");

  // The same weights behind a GraphedModel: decode steps replay CUDA graphs.
  auto graphed = make_graphed_model(std::move(model), backend, {.max_batch = 256});
  const int64_t stride = context + 8;
  // Random KV contents (a constant fill can draw less power and clock higher).
  const Tensor noise = random_bf16({1 << 23}, 1.0f, 9);
  for (int64_t batch : {1, 8, 64, 256}) {
    KvBuffers kv = graphed->allocate_kv(batch * stride, DType::kBF16);
    for (std::vector<Tensor>* side : {&kv.k, &kv.v})
      for (Tensor& t : *side)
        for (size_t at = 0; at < t.nbytes(); at += noise.nbytes())
          BASALT_CUDA_CHECK(cudaMemcpy(static_cast<char*>(t.raw()) + at, noise.raw(),
                                       std::min(noise.nbytes(), t.nbytes() - at), cudaMemcpyHostToDevice));
    const ForwardBatch step = decode_batch(batch, context, stride, V);
    Tensor logits = backend.empty({batch, V}, DType::kF32);
    double ms[2];
    for (int graphs = 0; graphs < 2; ++graphs) {
      std::vector<double> times;
      for (int i = 0; i < steps + 2; ++i) {
        backend.synchronize();
        const auto t0 = Clock::now();
        // Host tensors take the recorded path; the same batch uploaded
        // first (as the model itself would) runs eagerly.
        if (graphs == 1) {
          graphed->forward(step, kv, logits);
        } else {
          const ForwardBatch uploaded = on_backend(step, backend);
          graphed->forward(uploaded, kv, logits);
        }
        backend.synchronize();
        if (i >= 2) times.push_back(seconds_since(t0) * 1e3);
      }
      ms[graphs] = median(times);
    }
    double prefill_tps = 0;
    if (batch <= 8) {
      const ForwardBatch prefill = prefill_batch(batch, context, stride, V);
      Tensor last = backend.empty({batch, V}, DType::kF32);
      std::vector<double> p_times;
      for (int i = 0; i < 3; ++i) {
        backend.synchronize();
        const auto t0 = Clock::now();
        graphed->forward(prefill, kv, last);
        backend.synchronize();
        if (i >= 1) p_times.push_back(seconds_since(t0));
      }
      prefill_tps = static_cast<double>(batch * context) / *std::min_element(p_times.begin(), p_times.end());
    }
    std::printf("%-6lld %12.2f %12.2f %12.0f %12.2f %14.0f\n", static_cast<long long>(batch), ms[0], ms[1],
                static_cast<double>(batch) / ms[1] * 1e3, ms[1] / floor_ms, prefill_tps);
  }
  // Where a step's time goes: one eager step per batch size with every op
  // bracketed by events (per-op GPU time, achieved GB/s and TFLOP/s).
  for (int64_t batch : {int64_t{1}, int64_t{64}, int64_t{256}, int64_t{-512}}) {
    const bool prefill = batch < 0;
    const int64_t b = prefill ? 1 : batch;
    KvBuffers kv = graphed->allocate_kv(b * stride, DType::kBF16);
    const ForwardBatch step = prefill ? prefill_batch(1, context, stride, V) : decode_batch(b, context, stride, V);
    Tensor logits = backend.empty({b, V}, DType::kF32);
    graphed->forward(on_backend(step, backend), kv, logits);  // warm-up
    const int reps = 3;
    backend.set_profiling(true);
    for (int r = 0; r < reps; ++r) graphed->forward(on_backend(step, backend), kv, logits);
    const std::vector<OpTime> ops = backend.profile();
    backend.set_profiling(false);
    double total_ms = 0;
    for (const OpTime& o : ops) total_ms += o.ms;
    std::printf("\nper-op GPU time, %s (eager, events around each op; sum %.2f ms/step)\n",
                prefill ? "prefill of 512 tokens" : ("decode batch " + std::to_string(b)).c_str(), total_ms / reps);
    std::printf("%-22s %8s %10s %7s %10s %10s\n", "op", "calls", "us/step", "share", "GB/s", "TFLOP/s");
    for (const OpTime& o : ops)
      std::printf("%-22s %8.0f %10.1f %6.1f%% %10.0f %10.1f\n", o.op.c_str(), static_cast<double>(o.calls) / reps,
                  o.ms / reps * 1e3, 100.0 * o.ms / total_ms, o.bytes / (o.ms * 1e-3) * 1e-9,
                  o.flops / (o.ms * 1e-3) * 1e-12);
  }

  const GemmTuningStats tuning = backend.gemm_tuning_stats();
  std::printf("cuBLASLt plans chosen by timing: %d, in %.2f s\n", tuning.tuned, tuning.seconds);
  const GraphStats stats = graph_stats(*graphed);
  std::printf("graphs recorded %lld, replays %lld, direct steps %lld\n", static_cast<long long>(stats.recordings),
              static_cast<long long>(stats.replays), static_cast<long long>(stats.direct));
  return 0;
}
