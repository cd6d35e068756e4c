// cuda_attention over the token-slot KV pool on the GPU, at Llama-3.1-8B's
// attention shape (32 query heads, 8 kv heads, head dim 128, bf16 cache, bf16
// q and out):
//  * decode: batch 1, 32 and 256 with 512 and 4096 keys per sequence, and
//    batch 8 and 64 (the 8B decode bench's batches) with 512; time
//    per call and the effective bandwidth of the K and V rows read, next to
//    the H200's 4.18 TB/s read ceiling (measured read-only, 2026-11);
//  * prefill: one 4096-token prompt and 8 prompts of 512; TFLOP/s of the
//    causal work (4 * head_dim flops per visible (query, key) pair and head),
//    next to ~700 TFLOP/s dense bf16.
// Each case also runs the other paths, forced, for comparison ("dec-cuda": the
// decode path on its CUDA-core kernels instead of the tensor-core one;
// "prefill-mma": the prefill on its mma.sync kernel where the wgmma one
// applies), and two decode cases rerun with each sequence's keys in
// consecutive slots. --heads and --dims change the shape (DeepSeek-V3's
// expanded MLA prefill: --heads 128,128 --dims 192,128), --only decode or
// prefill runs those cases alone.
//
// Times: "event us" is the median of CUDA events around each host call (it
// includes the host's launch work between the events, which dominates tiny
// calls); "GPU us", which the rates use, is the median over replays of a CUDA
// graph of at least 20 calls (rotating layouts) on a stream, per call. The
// cache is filled with random bf16 (never zeros: power, and so clocks, depend
// on the data), and every call reads a different random set of slots from a pool of at least 512 MB,
// rotating over enough layouts that consecutive calls never find their keys
// in the 50 MB L2.
//
// Usage: basalt_bench_cuda_attention [--repeats N] [--heads Q,KV] [--dims K,V] [--only decode|prefill]
//                                    [--case NAME] (the cases named NAME exactly: one case for a profiler)
//                                    [--splits N] (the decode kernel's key splits, forced)
//                                    [--q f32|bf16] (q's dtype, bf16 by default; the dense models pass f32)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"

namespace {

using namespace basalt;

constexpr double kReadCeiling = 4.18e12;  // bytes/s
constexpr double kBf16Peak = 700e12;      // flop/s, dense bf16
constexpr int64_t kL2Bytes = 50ll << 20;

// Random bf16 values of magnitude ~0.1-1 with random signs, no zeros.
std::vector<uint16_t> random_bf16_host(int64_t n, uint64_t seed) {
  std::vector<uint16_t> out(static_cast<size_t>(n));
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : out) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const uint16_t sign = static_cast<uint16_t>((state >> 63) << 15);
    const uint16_t exponent = static_cast<uint16_t>(0x7B + (state >> 40) % 4) << 7;
    v = static_cast<uint16_t>(sign | exponent | (state & 0x7F));
  }
  return out;
}

// A device bf16 tensor of `shape` filled by repeating a random 64 MB block.
Tensor random_device(Shape shape) {
  Tensor t = cuda_empty(std::move(shape), DType::kBF16);
  const int64_t n = t.numel();
  const int64_t block = std::min<int64_t>(n, 32ll << 20);
  const std::vector<uint16_t> host = random_bf16_host(block, static_cast<uint64_t>(n));
  auto* dst = static_cast<uint16_t*>(t.raw());
  for (int64_t at = 0; at < n; at += block) {
    const int64_t count = std::min(block, n - at);
    BASALT_CUDA_CHECK(cudaMemcpy(dst + at, host.data(), static_cast<size_t>(count) * 2, cudaMemcpyHostToDevice));
  }
  return t;
}

Tensor device_i32(const std::vector<int32_t>& v) {
  Tensor host = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), host.data<int32_t>());
  return cuda_to_device(host);
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  std::string name;
  int seqs, q_len, kv_len;
  bool decode;
  bool contiguous = false;  // each sequence's keys in consecutive slots (else scattered at random)
};

struct Result {
  std::string name, path;
  double us, rate, fraction;  // rate: GB/s (decode) or TFLOP/s (prefill), from the graph time
  double event_us;            // per call with events around each host call
  bool decode;
};

// "A,B" as two positive ints, or false.
bool parse_pair(const char* text, int& a, int& b) {
  return std::sscanf(text, "%d,%d", &a, &b) == 2 && a > 0 && b > 0;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 100;
  int heads = 32, kv_heads = 8, head_dim = 128, v_head_dim = 128;  // Llama-3.1-8B
  std::string only, only_case;
  int forced_splits = 0;  // --splits N: the decode kernel's key splits, forced (0: its own choice)
  bool q_f32 = false;     // --q f32: q in f32, as the dense models pass it (the decode kernel then splits it)
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--repeats") == 0 && has_value) {
      repeats = std::max(5, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--heads") == 0 && has_value && parse_pair(argv[i + 1], heads, kv_heads) &&
               heads % kv_heads == 0) {
      ++i;
    } else if (std::strcmp(argv[i], "--dims") == 0 && has_value && parse_pair(argv[i + 1], head_dim, v_head_dim) &&
               head_dim <= 256 && v_head_dim <= 256) {
      ++i;
    } else if (std::strcmp(argv[i], "--only") == 0 && has_value &&
               (std::strcmp(argv[i + 1], "decode") == 0 || std::strcmp(argv[i + 1], "prefill") == 0)) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--q") == 0 && has_value &&
               (std::strcmp(argv[i + 1], "f32") == 0 || std::strcmp(argv[i + 1], "bf16") == 0)) {
      q_f32 = std::strcmp(argv[++i], "f32") == 0;
    } else if (std::strcmp(argv[i], "--case") == 0 && has_value) {
      only_case = argv[++i];
    } else if (std::strcmp(argv[i], "--splits") == 0 && has_value && std::atoi(argv[i + 1]) > 0 &&
               std::atoi(argv[i + 1]) <= cuda_kernels::kAttentionMaxSplits) {
      forced_splits = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: basalt_bench_cuda_attention [--repeats N] [--heads Q,KV] [--dims K,V] "
                   "[--only decode|prefill] [--case NAME] [--splits N] [--q f32|bf16]\n");
      return 2;
    }
  }
  if (!cuda_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const Case cases[] = {
      {"decode b1 ctx512", 1, 1, 512, true},       {"decode b1 ctx4096", 1, 1, 4096, true},
      {"decode b8 ctx512", 8, 1, 512, true},       {"decode b64 ctx512", 64, 1, 512, true},
      {"decode b32 ctx512", 32, 1, 512, true},     {"decode b32 ctx4096", 32, 1, 4096, true},
      {"decode b256 ctx512", 256, 1, 512, true},   {"decode b256 ctx4096", 256, 1, 4096, true},
      {"prefill 1x4096", 1, 4096, 4096, false},    {"prefill 8x512", 8, 512, 512, false},
      {"decode b32 ctx4096 contig", 32, 1, 4096, true, true},
      {"decode b256 ctx4096 contig", 256, 1, 4096, true, true},
  };
  std::vector<Case> chosen;
  for (const Case& c : cases)
    if ((only.empty() || (only == "decode") == c.decode) && (only_case.empty() || only_case == c.name))
      chosen.push_back(c);
  const int64_t token_bytes = int64_t{kv_heads} * (head_dim + v_head_dim) * 2;  // K + V, bf16
  int64_t pool = (512ll << 20) / token_bytes;
  for (const Case& c : chosen) pool = std::max<int64_t>(pool, int64_t{c.seqs} * c.kv_len);
  std::printf("KV pool: %lld slots (%.0f MB of K + V)\n", static_cast<long long>(pool),
              static_cast<double>(pool * token_bytes) / 1e6);
  std::printf("shape: %d query heads, %d kv heads, head dims %d / %d, q %s\n", heads, kv_heads, head_dim, v_head_dim,
              q_f32 ? "f32" : "bf16");
  const Tensor k_cache = random_device({pool, int64_t{kv_heads} * head_dim});
  const Tensor v_cache = random_device({pool, int64_t{kv_heads} * v_head_dim});
  std::mt19937_64 rng(7);
  std::vector<int32_t> perm(static_cast<size_t>(pool));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);

  AttentionParams params;
  params.num_heads = heads;
  params.num_kv_heads = kv_heads;
  params.head_dim = head_dim;
  params.v_head_dim = v_head_dim;
  params.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  cudaEvent_t start, stop;
  BASALT_CUDA_CHECK(cudaEventCreate(&start));
  BASALT_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<Result> results;
  cudaStream_t stream = nullptr;
  BASALT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("%-27s %-8s %6s %10s %10s %12s %8s\n", "case", "path", "splits", "event us", "GPU us", "GB/s|TFLOP/s",
              "of peak");
  for (const Case& c : chosen) {
    const int64_t tokens = int64_t{c.seqs} * c.q_len, keys = int64_t{c.seqs} * c.kv_len;
    // Enough layouts that consecutive calls touch more than 2x the L2.
    const int layouts = static_cast<int>(std::clamp<int64_t>((2 * kL2Bytes) / (keys * token_bytes) + 2, 2, 64));
    std::vector<AttentionLayout> layout_list;
    for (int l = 0; l < layouts; ++l) {
      std::vector<int32_t> q_start = {0}, kv_start = {0}, slots(static_cast<size_t>(keys));
      for (int s = 0; s < c.seqs; ++s) {
        q_start.push_back(q_start.back() + c.q_len);
        kv_start.push_back(kv_start.back() + c.kv_len);
      }
      for (int64_t i = 0; i < keys; ++i) {
        const auto at = static_cast<size_t>((l * keys + i) % pool);
        slots[static_cast<size_t>(i)] = c.contiguous ? static_cast<int32_t>(at) : perm[at];
      }
      layout_list.push_back({device_i32(q_start), device_i32(kv_start), device_i32(slots)});
    }
    // An f32 q (the dense models') holds the same values, widened.
    const Tensor q_bf16 = random_device({tokens, int64_t{heads} * head_dim});
    const Tensor q = q_f32 ? cuda_to_device(cuda_to_host(q_bf16).to_f32()) : q_bf16;
    Tensor out = cuda_empty({tokens, int64_t{heads} * v_head_dim}, DType::kBF16);
    // Causal work: query i of a prompt sees kv_len - q_len + i + 1 keys.
    double pairs = 0;
    for (int i = 0; i < c.q_len; ++i) pairs += c.kv_len - c.q_len + i + 1;
    const double flops = 2.0 * (head_dim + v_head_dim) * heads * pairs * c.seqs;
    const double bytes = static_cast<double>(keys) * token_bytes;
    cuda_kernels::AttentionShape shape;
    shape.q_tokens = tokens;
    shape.num_seqs = c.seqs;
    shape.kv_slots_len = keys;
    shape.num_heads = heads;
    shape.num_kv_heads = kv_heads;
    shape.head_dim = head_dim;
    shape.v_head_dim = v_head_dim;
    const int splits = forced_splits > 0 ? forced_splits
                                         : cuda_kernels::attention_decode_splits(
                                               cuda_kernels::Elem::kBF16,
                                               q_f32 ? cuda_kernels::Elem::kF32 : cuda_kernels::Elem::kBF16, shape);
    const bool on_wgmma = cuda_kernels::attention_prefill_on_wgmma(cuda_kernels::Elem::kBF16, q.raw(), k_cache.raw(),
                                                                   v_cache.raw(), out.raw(), shape);
    for (CudaAttentionPath path : {CudaAttentionPath::kAuto, CudaAttentionPath::kDecode,
                                   CudaAttentionPath::kDecodeCudaCores, CudaAttentionPath::kPrefill,
                                   CudaAttentionPath::kPrefillMmaSync}) {
      const bool forced_decode = path == CudaAttentionPath::kDecode || path == CudaAttentionPath::kDecodeCudaCores;
      const bool decode_path = forced_decode || (path == CudaAttentionPath::kAuto && c.decode);  // what auto takes
      if (forced_decode && c.q_len > 512) continue;  // the decode kernels on a long prompt: slow
      if (path == CudaAttentionPath::kDecodeCudaCores && !c.decode) continue;
      if (path == CudaAttentionPath::kPrefillMmaSync && (!on_wgmma || c.decode)) continue;  // kPrefill's kernel
      for (int w = 0; w < 3; ++w)
        cuda_attention(q, k_cache, v_cache, layout_list[w % layouts], params, out, nullptr, path, forced_splits);
      std::vector<float> times;
      for (int r = 0; r < repeats; ++r) {
        BASALT_CUDA_CHECK(cudaEventRecord(start));
        cuda_attention(q, k_cache, v_cache, layout_list[r % layouts], params, out, nullptr, path, forced_splits);
        BASALT_CUDA_CHECK(cudaEventRecord(stop));
        BASALT_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
      }
      // GPU time: kGraphCalls calls (rotating over all the layouts, so the
      // replays touch more than 2x the L2 too) captured in one CUDA graph on a
      // stream and replayed; the host's launch work is not in it.
      const int kGraphCalls = std::max(20, layouts);
      cudaGraphExec_t exec = nullptr;
      {
        CudaGraphPoolScope pool;
        BASALT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
        for (int r = 0; r < kGraphCalls; ++r)
          cuda_attention(q, k_cache, v_cache, layout_list[r % layouts], params, out, stream, path, forced_splits);
        cudaGraph_t graph = nullptr;
        BASALT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        BASALT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        BASALT_CUDA_CHECK(cudaGraphDestroy(graph));
      }
      BASALT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      std::vector<float> graph_times;
      for (int r = 0; r < std::max(5, repeats / 10); ++r) {
        BASALT_CUDA_CHECK(cudaEventRecord(start, stream));
        BASALT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        BASALT_CUDA_CHECK(cudaEventRecord(stop, stream));
        BASALT_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        graph_times.push_back(ms / kGraphCalls);
      }
      BASALT_CUDA_CHECK(cudaGraphExecDestroy(exec));
      const double event_sec = median(times) * 1e-3;
      const double sec = median(graph_times) * 1e-3;
      Result res;
      res.event_us = event_sec * 1e6;
      res.name = c.name;
      res.path = path == CudaAttentionPath::kAuto               ? "auto"
                 : path == CudaAttentionPath::kDecodeCudaCores ? "dec-cuda"
                 : path == CudaAttentionPath::kPrefillMmaSync  ? "prefill-mma"
                 : decode_path                                 ? "decode"
                                                               : "prefill";
      res.us = sec * 1e6;
      res.decode = c.decode;
      res.rate = c.decode ? bytes / sec * 1e-9 : flops / sec * 1e-12;
      res.fraction = c.decode ? bytes / sec / kReadCeiling : flops / sec / kBf16Peak;
      results.push_back(res);
      std::printf("%-27s %-8s %6d %10.1f %10.1f %12.1f %7.1f%%\n", c.name.c_str(), res.path.c_str(),
                  decode_path ? splits : 1, res.event_us, res.us, res.rate, 100.0 * res.fraction);
    }
  }
  BASALT_CUDA_CHECK(cudaDeviceSynchronize());

  // The summary: the automatic choice for each case.
  std::printf("\n| case | event us | GPU us | rate | of ceiling |\n| --- | ---: | ---: | ---: | ---: |\n");
  for (const Result& r : results) {
    if (r.path != "auto") continue;
    std::printf("| %s | %.1f | %.1f | %.0f %s | %.0f%% of %s |\n", r.name.c_str(), r.event_us, r.us, r.rate,
                r.decode ? "GB/s" : "TFLOP/s", 100.0 * r.fraction, r.decode ? "4.18 TB/s" : "700 TFLOP/s");
  }
  return 0;
}
