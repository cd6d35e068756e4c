// A DeepSeek-V3 slice on one GPU at the real dimensions: decode step time at
// batch 1, 32 and 128 and prefill speed, next to the bandwidth floor, and
// what they imply for the full 61-layer model on 8 GPUs.
//
//   basalt_bench_cuda_deepseek_slice [--layers N] [--context N] [--prompt N] [--steps N] [--tiny]
//                                    [--device cuda|cpu]
//
// The checkpoint (bench/deepseek_checkpoint.h): DeepSeek-V3's shapes (hidden
// 7168, 128 heads, q_lora 1536, kv_lora 512, 256 experts top-8 in 8 groups,
// MoE intermediate 2048, one shared expert, vocabulary 129280), decoder
// linears in block FP8, --layers layers (default 4: one dense, three MoE;
// about 38 GB), written to a temporary directory, loaded through load_model
// (the path `basalt serve` takes) and deleted afterwards.
//
// Decode: B sequences of --context cached tokens (default 4096; a bf16
// latent cache of random values), one new token each, through one forward:
// eager, and replayed from CUDA graphs (GraphedModel, as `basalt serve`
// runs decode); median of --steps steps after two warm-ups, the host batch
// upload included. The floor is the bytes a step must read -- the weights
// (deepseek_decode_bytes: every non-expert weight, and the routed experts
// that uniform routing touches in expectation) plus the latent cache -- over
// the H200's measured 4.18 TB/s (read-only, 2026-11). Prefill: one
// prompt of --prompt tokens (default 4096) in one forward, best of two after
// a warm-up. One eager step per batch size, and one prefill, then run with
// the op profiler. Verification: one sequence over the same context with 1,
// 2 and 4 query rows (the last token and 1 or 3 drafts, as speculative
// decoding verifies them), replayed from graphs, sizes alternated round by
// round, median of --steps; reported against the 1-row step. Each row is
// routed on its own, so a step of R rows reads up to R times the experts
// one row reads.
//
// The full model: a checkpoint of the dense layer alone is written and
// loaded too, so a MoE layer costs (t_slice - t_dense_only) / moe_layers and
// a dense layer t_dense_only - t_head, with t_head the
// lm_head's bytes at 4.18 TB/s. 61 layers (3 dense, 58 MoE) on one GPU
// would take t_head + 3 t_dense + 58 t_moe per step (it does not fit: ~700
// GB). On 8 GPUs the bench assumes the work splits evenly (attention and
// dense layers tensor-parallel, experts 32 per GPU) and prints that time
// alone and with the communication it states: per layer one all-reduce of
// the B x 7168 bf16 hidden states, per MoE layer a dispatch (B x 8 x 7168
// FP8) and a combine (B x 8 x 7168 bf16) all-to-all, each 7/8 of its bytes
// over NVLink at 450 GB/s per direction plus 10 us of latency, not
// overlapped with compute.
//
// --tiny shrinks every dimension (hidden 256, 16 experts, ...; context 64,
// prompt 128) so the whole path runs in seconds, also on --device cpu
// (without graphs): a check that the benchmark itself works.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "model/graphed_model.h"
#include "model/model.h"
#include "bench_util.h"
#include "deepseek_checkpoint.h"
#include "forward_batches.h"

using namespace basalt;
using namespace basalt::bench;

namespace {

constexpr double kReadBandwidth = 4.18e12;  // bytes/s

struct Options {
  int layers = 4;
  int64_t context = 4096;
  int64_t prompt = 4096;
  int steps = 10;
  bool tiny = false;
  bool cpu = false;
};

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--tiny") {
      o->tiny = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return false;
    }
    const std::string value = argv[++i];
    if (flag == "--layers") o->layers = std::atoi(value.c_str());
    else if (flag == "--context") o->context = std::atoll(value.c_str());
    else if (flag == "--prompt") o->prompt = std::atoll(value.c_str());
    else if (flag == "--steps") o->steps = std::atoi(value.c_str());
    else if (flag == "--device" && (value == "cuda" || value == "cpu")) o->cpu = value == "cpu";
    else {
      std::fprintf(stderr, "unknown flag or value: %s %s\n", flag.c_str(), value.c_str());
      return false;
    }
  }
  return o->layers >= 1 && o->context >= 1 && o->prompt >= 1 && o->steps >= 1;
}

DeepseekShape tiny_shape() {
  DeepseekShape s;
  s.hidden = 256;
  s.intermediate = 512;
  s.moe_intermediate = 128;
  s.heads = 8;
  s.q_lora = 128;
  s.kv_lora = 128;
  s.nope = 32;
  s.rope = 16;
  s.v = 32;
  s.experts = 16;
  s.top_k = 4;
  s.groups = 4;
  s.topk_groups = 2;
  s.vocab = 1024;
  return s;
}

// Decode step times (ms) per batch size, and the prefill's tokens/s.
struct Timings {
  std::vector<double> eager_ms, graphed_ms;
  double prefill_tps = 0;
  // Batch 1, graphed: a step of kVerifyRows[i] query rows (a speculative
  // verification of the last token and kVerifyRows[i] - 1 drafts).
  std::vector<double> verify_ms;
};

constexpr int64_t kVerifyRows[] = {1, 2, 4};

// Fills a latent cache with random bf16 rows (a constant fill can draw less
// power and clock higher).
void fill_random(Backend& backend, Tensor& cache) {
  const int64_t width = cache.dim(1), rows = std::min<int64_t>(cache.dim(0), 4096);
  const Tensor noise = random_bf16({rows, width}, 1.0f, 9);
  for (int64_t at = 0; at < cache.dim(0); at += rows) {
    const int64_t n = std::min(rows, cache.dim(0) - at);
    Tensor dst = cache.rows(at, n);
    backend.copy(noise.rows(0, n), dst);
  }
}

// Runs `step` once with the CUDA backend's op profiler on and prints the
// GPU time per kind of op (nothing on other backends).
void print_profile(Backend& backend, const std::string& what, const std::function<void()>& step) {
  if (backend.device() != Device::kCuda) return;
  auto& cuda = static_cast<CudaBackend&>(backend);
  cuda.set_profiling(true);
  step();
  const std::vector<OpTime> ops = cuda.profile();
  cuda.set_profiling(false);
  double total_ms = 0;
  for (const OpTime& op : ops) total_ms += op.ms;
  std::printf("\nper-op GPU time, %s (eager, events around each op; sum %.2f ms)\n", what.c_str(), total_ms);
  std::printf("%-34s %6s %10s %7s %10s %10s\n", "op", "calls", "us", "share", "GB/s", "TFLOP/s");
  for (const OpTime& op : ops)
    std::printf("%-34s %6lld %10.1f %6.1f%% %10.0f %10.1f\n", op.op.c_str(), static_cast<long long>(op.calls),
                op.ms * 1e3, 100.0 * op.ms / total_ms, op.bytes / (op.ms * 1e-3) * 1e-9,
                op.flops / (op.ms * 1e-3) * 1e-12);
}

Timings measure(const std::filesystem::path& dir, Backend& backend, const Options& o, const DeepseekShape& shape,
                const std::vector<int64_t>& batches, bool prefill, bool verify, bool profile) {
  auto start = Clock::now();
  std::unique_ptr<Model> model = load_model(dir.string(), backend);
  std::printf("loaded %lld layer(s) in %.1f s: %s\n", static_cast<long long>(model->config().num_layers),
              seconds_since(start),
              model->summary().c_str());
  std::fflush(stdout);
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  auto graphed = make_graphed_model(std::move(model), backend, {.max_batch = static_cast<int>(max_batch)});
  const int64_t stride = o.context + 8, V = shape.vocab;
  Timings t;
  for (const int64_t batch : batches) {
    KvBuffers kv = graphed->allocate_kv(batch * stride, DType::kBF16);
    for (Tensor& cache : kv.k) fill_random(backend, cache);
    const ForwardBatch step = decode_batch(batch, o.context, stride, V);
    Tensor logits = backend.empty({batch, V}, DType::kF32);
    for (int graphs = 0; graphs < 2; ++graphs) {
      std::vector<double> times;
      for (int i = 0; i < o.steps + 2; ++i) {
        Tensor sync = Tensor::empty({1, V}, DType::kF32);
        const auto t0 = Clock::now();
        // Host tensors take the recorded path; the same batch uploaded first
        // (as the model itself would) runs eagerly.
        if (graphs == 1) {
          graphed->forward(step, kv, logits);
        } else {
          graphed->forward(on_backend(step, backend), kv, logits);
        }
        backend.copy(logits.rows(0, 1), sync);  // waits for the step
        if (i >= 2) times.push_back(seconds_since(t0) * 1e3);
      }
      (graphs == 1 ? t.graphed_ms : t.eager_ms).push_back(median(times));
    }
    if (profile) {
      print_profile(backend, "decode batch " + std::to_string(batch),
                    [&] { graphed->forward(on_backend(step, backend), kv, logits); });
    }
  }
  if (verify) {
    // Alternated round by round, so that clock drift falls on every size alike.
    KvBuffers kv = graphed->allocate_kv(stride, DType::kBF16);
    for (Tensor& cache : kv.k) fill_random(backend, cache);
    std::vector<std::vector<double>> times(std::size(kVerifyRows));
    for (int i = 0; i < o.steps + 2; ++i) {
      for (size_t j = 0; j < std::size(kVerifyRows); ++j) {
        const int64_t rows = kVerifyRows[j];
        const ForwardBatch step = decode_batch(1, o.context, stride, V, rows);
        Tensor logits = backend.empty({rows, V}, DType::kF32);
        Tensor sync = Tensor::empty({1, V}, DType::kF32);
        const auto t0 = Clock::now();
        graphed->forward(step, kv, logits);
        backend.copy(logits.rows(0, 1), sync);
        if (i >= 2) times[j].push_back(seconds_since(t0) * 1e3);
      }
    }
    for (const std::vector<double>& v : times) t.verify_ms.push_back(median(v));
  }
  if (prefill) {
    KvBuffers kv = graphed->allocate_kv(o.prompt + 8, DType::kBF16);
    const ForwardBatch batch = prefill_batch(1, o.prompt, o.prompt + 8, V);
    Tensor last = backend.empty({1, V}, DType::kF32), sync = Tensor::empty({1, V}, DType::kF32);
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = Clock::now();
      graphed->forward(batch, kv, last);
      backend.copy(last, sync);
      if (i >= 1) best = std::min(best, seconds_since(t0));
    }
    t.prefill_tps = static_cast<double>(o.prompt) / best;
    if (profile) {
      print_profile(backend, "prefill of " + std::to_string(o.prompt) + " tokens",
                    [&] { graphed->forward(batch, kv, last); });
    }
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: basalt_bench_cuda_deepseek_slice [--layers N] [--context N] [--prompt N] [--steps N] "
                 "[--tiny] [--device cuda|cpu]\n");
    return 2;
  }
  if (o.cpu && !o.tiny) {
    std::fprintf(stderr, "--device cpu runs only with --tiny (the real slice needs ~38 GB of GPU memory)\n");
    return 2;
  }
  DeepseekShape shape = o.tiny ? tiny_shape() : DeepseekShape{};
  shape.layers = o.layers;
  shape.dense_layers = std::min(o.layers, 1);
  if (o.tiny) {
    o.context = std::min<int64_t>(o.context, 64);
    o.prompt = std::min<int64_t>(o.prompt, 128);
  }
  if (!o.cpu && !cuda_available()) {  // before writing 38 GB
    std::fprintf(stderr, "basalt_bench_cuda_deepseek_slice: no CUDA device is available\n");
    return 1;
  }
  std::unique_ptr<Backend> backend;
  if (o.cpu) backend = std::make_unique<CpuBackend>();
  else backend = std::make_unique<CudaBackend>();

  const auto dir =
      std::filesystem::temp_directory_path() / ("basalt_deepseek_slice_bench_" + std::to_string(::getpid()));
  struct RemoveDir {  // however the run ends
    std::filesystem::path path;
    ~RemoveDir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } remove_dir{dir};
  std::filesystem::create_directories(dir);
  std::printf("writing a random-weight DeepSeek-V3-shaped checkpoint (%d layers, block FP8)...\n", o.layers);
  std::fflush(stdout);
  auto start = Clock::now();
  write_random_deepseek(dir, shape);
  std::printf("written in %.1f s\n", seconds_since(start));

  const std::vector<int64_t> batches = {1, 32, 128};
  const Timings slice = measure(dir, *backend, o, shape, batches, /*prefill=*/true, /*verify=*/true,
                                 /*profile=*/true);
  Timings dense_only;
  const int moe_layers = shape.layers - shape.dense_layers;
  if (moe_layers > 0 && shape.dense_layers == 1) {
    // A checkpoint of its own (the loader refuses tensors its config leaves unused).
    DeepseekShape dense = shape;
    dense.layers = 1;
    const std::filesystem::path dense_dir = dir / "dense";
    std::filesystem::create_directories(dense_dir);
    write_random_deepseek(dense_dir, dense);
    dense_only = measure(dense_dir, *backend, o, dense, batches, /*prefill=*/false, /*verify=*/false,
                         /*profile=*/false);
  }

  const int64_t cache_row = 2 * (shape.kv_lora + shape.rope);  // bf16 latent row
  std::printf("\nDeepSeek-V3 slice: %d layers (%d dense, %d MoE), block FP8, context %lld, one GPU\n", shape.layers,
              shape.dense_layers, moe_layers, static_cast<long long>(o.context));
  std::printf("%-6s %10s %11s %9s %11s %11s %9s\n", "batch", "eager ms", "graphed ms", "tok/s", "GB/step", "floor ms",
              "/floor");
  for (size_t i = 0; i < batches.size(); ++i) {
    const int64_t b = batches[i];
    const double bytes = deepseek_decode_bytes(shape, b) +
                         static_cast<double>(b * (o.context + 1) * shape.layers * cache_row);
    const double floor_ms = bytes / kReadBandwidth * 1e3;
    std::printf("%-6lld %10.2f %11.2f %9.0f %11.2f %11.2f %9.2f\n", static_cast<long long>(b), slice.eager_ms[i],
                slice.graphed_ms[i], static_cast<double>(b) / slice.graphed_ms[i] * 1e3, bytes / 1e9, floor_ms,
                slice.graphed_ms[i] / floor_ms);
  }
  std::printf("prefill, one prompt of %lld tokens: %.0f tokens/s\n", static_cast<long long>(o.prompt),
              slice.prefill_tps);

  std::printf("\nspeculative verification, batch 1, graphed: a step of the last token and its drafts\n");
  std::printf("%-6s %11s %12s\n", "rows", "ms", "vs 1 row");
  for (size_t j = 0; j < slice.verify_ms.size(); ++j)
    std::printf("%-6lld %11.3f %11.2fx\n", static_cast<long long>(kVerifyRows[j]), slice.verify_ms[j],
                slice.verify_ms[j] / slice.verify_ms[0]);

  if (dense_only.graphed_ms.empty()) return 0;
  const double head_ms = 2.0 * static_cast<double>(shape.vocab * shape.hidden) / kReadBandwidth * 1e3;
  const double hidden = static_cast<double>(shape.hidden);
  std::printf("\nthe full model (61 layers: 3 dense, 58 MoE), from the slice and its dense layer alone\n");
  std::printf("%-6s %9s %9s %12s %12s %12s %14s\n", "batch", "MoE ms", "dense ms", "1 GPU ms", "8 GPUs ms",
              "comm ms", "8 GPUs+comm");
  for (size_t i = 0; i < batches.size(); ++i) {
    const double b = static_cast<double>(batches[i]);
    const double t_moe = (slice.graphed_ms[i] - dense_only.graphed_ms[i]) / moe_layers;
    const double t_dense = std::max(0.0, dense_only.graphed_ms[i] - head_ms);
    const double one_gpu = head_ms + 3 * t_dense + 58 * t_moe;
    const double eight = one_gpu / 8;
    const auto transfer_ms = [](double bytes) { return (10e-6 + bytes * 7.0 / 8.0 / 450e9) * 1e3; };
    const double comm = 61 * transfer_ms(b * hidden * 2) + 58 * (transfer_ms(b * 8 * hidden) + transfer_ms(b * 8 * hidden * 2));
    std::printf("%-6lld %9.3f %9.3f %12.2f %12.2f %12.2f %14.2f\n", static_cast<long long>(batches[i]), t_moe, t_dense,
                one_gpu, eight, comm, eight + comm);
  }
  return 0;
}
