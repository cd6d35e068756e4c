// CPU decode speed of a random-weight DeepSeek-V2-Lite-shaped model, in bf16
// and in block FP8, in one run.
//
//   basalt_bench_deepseek_decode [--layers N] [--prompt N] [--tokens N]
//
// The shape is DeepSeek-V2-Lite's: hidden 2048, 16 heads, no q_lora_rank,
// kv_lora_rank 512, nope/rope/v head dims 128/64/128, 64 routed experts
// (top-6, softmax, greedy) of intermediate 1408 plus 2 shared experts, a
// dense first layer of intermediate 10944, vocabulary 102400, YaRN rope.
// The full model has 27 layers (about 31 GB in bf16); --layers N keeps the
// first N (default 3: the dense layer and two MoE layers) so that both
// copies fit in memory and on disk of a small machine. Both checkpoints are
// written (bench/deepseek_checkpoint.h) to a temporary directory, loaded through the
// same path `basalt generate` uses, and deleted afterwards. The FP8 copy
// stores every linear weight of the decoder layers as float8_e4m3fn with
// float32 weight_scale_inv per 128x128 block; embedding, lm_head, norms and
// the router stay bf16, as in the published FP8 checkpoints.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "bench_util.h"
#include "deepseek_checkpoint.h"

namespace {

using namespace basalt;
using namespace basalt::bench;

constexpr int64_t kVocab = 102400;

struct Result {
  double load_s, prefill_tps, decode_tps, decode_gb;
  std::string summary;
};

Result measure(const std::filesystem::path& dir, double decode_bytes, int prompt_len,
               int decode_tokens) {
  CpuBackend backend;
  auto start = Clock::now();
  auto model = load_model(dir.string(), backend);
  Result r{seconds_since(start), 0, 0, decode_bytes / 1e9, model->summary()};
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = (i * 7919 + 13) % static_cast<int>(kVocab);
  const GenerationTiming timing = time_generation(*model, backend, prompt, decode_tokens);
  r.prefill_tps = prompt_len / timing.prefill_s;
  r.decode_tps = decode_tokens / timing.decode_s;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  ModelBenchFlags flags{3, 32, 16};
  if (!parse_model_bench_flags(argc, argv, &flags)) return 2;
  const int layers = flags.layers, prompt_len = flags.prompt, decode_tokens = flags.tokens;
  if (layers < 1 || layers > 27 || prompt_len < 1 || decode_tokens < 1) {
    std::fprintf(stderr, "--layers must be in 1..27, --prompt and --tokens positive\n");
    return 2;
  }
  const auto root = std::filesystem::temp_directory_path() /
                    ("basalt_deepseek_bench_" + std::to_string(::getpid()));
  std::vector<std::pair<const char*, Result>> results;
  for (bool fp8 : {false, true}) {
    const auto dir = root / (fp8 ? "fp8" : "bf16");
    std::printf("writing a random-weight DeepSeek-V2-Lite-shaped checkpoint (%d of 27 layers, %s)...\n",
                layers, fp8 ? "block fp8" : "bf16");
    std::fflush(stdout);
    std::filesystem::create_directories(dir);
    const DeepseekShape shape = deepseek_v2_lite_shape(layers, fp8);
    write_random_deepseek(dir, shape);
    const double bytes = deepseek_decode_bytes(shape, 1);
    results.emplace_back(fp8 ? "block fp8 (e4m3, 128x128)" : "bf16",
                         measure(dir, bytes, prompt_len, decode_tokens));
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove_all(root);
  std::printf("\n%s\n", results[0].second.summary.c_str());
  std::printf("\nDeepSeek-V2-Lite shape, %d of 27 layers, %d threads, prompt %d, %d decode tokens\n",
              layers, ThreadPool::global().size(), prompt_len, decode_tokens);
  std::printf("%-28s %10s %14s %16s %14s\n", "weights", "load s", "prefill tok/s", "decode tok/s",
              "GB read/token");
  for (const auto& [name, r] : results)
    std::printf("%-28s %10.2f %14.1f %16.2f %14.3f\n", name, r.load_s, r.prefill_tps, r.decode_tps,
                r.decode_gb);
  std::printf("fp8 / bf16 decode speed: %.2fx\n", results[1].second.decode_tps / results[0].second.decode_tps);
  return 0;
}
