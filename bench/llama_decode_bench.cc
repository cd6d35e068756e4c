// Decode and prefill speed of a random-weight model with Llama-3.2-1B's shape
// on the CPU backend, in bf16 and in the int8 and int4 formats of `basalt
// quantize` (f16 scales per 32 columns), next to the weight-bandwidth floor.
//
//   basalt_bench_llama_decode [--layers N] [--prompt N] [--tokens N]
//
// The checkpoint (bf16, ~2.5 GB for the full 16 layers) is written to a
// temporary directory, loaded through the same path `basalt generate` uses,
// and deleted afterwards, with its int8 and int4 copies (quantize_checkpoint,
// as `basalt quantize` writes them; the tied lm_head becomes an integer head
// of its own). Decode reads every weight once per token, so
// tokens/s can be at most (memory read bandwidth) / (weight bytes); the
// bandwidth is measured in the same run with a multi-threaded streaming read.
// Figures are the best of two timed runs after a warm-up run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <atomic>
#include <unistd.h>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/quantize.h"
#include "model/safetensors.h"
#include "runtime/generator.h"
#include "bench_util.h"

namespace {

using namespace basalt;
using namespace basalt::bench;

}  // namespace

int main(int argc, char** argv) {
  ModelBenchFlags flags{16, 128, 16};
  if (!parse_model_bench_flags(argc, argv, &flags)) return 2;
  const int layers = flags.layers, prompt_len = flags.prompt, decode_tokens = flags.tokens;
  const int64_t H = 2048, I = 8192, heads = 32, kv_heads = 8, D = 64, V = 128256;

  const auto dir = std::filesystem::temp_directory_path() /
                   ("basalt_llama1b_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  nlohmann::json config = {
      {"model_type", "llama"}, {"vocab_size", V}, {"hidden_size", H}, {"intermediate_size", I},
      {"num_hidden_layers", layers}, {"num_attention_heads", heads},
      {"num_key_value_heads", kv_heads}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", true},
      {"max_position_embeddings", 131072},
      {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}},
      {"rope_theta", 500000.0}};
  std::ofstream(dir / "config.json") << config.dump(1);

  std::printf("writing a random-weight Llama-3.2-1B-shaped checkpoint (%d layers)...\n", layers);
  std::fflush(stdout);
  {
    uint64_t seed = 1;
    std::vector<std::pair<std::string, Tensor>> tensors;
    tensors.emplace_back("model.embed_tokens.weight", random_bf16({V, H}, 0.05f, seed++));
    tensors.emplace_back("model.norm.weight", random_bf16({H}, 1.0f, seed++));
    for (int l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      tensors.emplace_back(p + "input_layernorm.weight", random_bf16({H}, 1.0f, seed++));
      tensors.emplace_back(p + "post_attention_layernorm.weight", random_bf16({H}, 1.0f, seed++));
      tensors.emplace_back(p + "self_attn.q_proj.weight", random_bf16({heads * D, H}, 0.02f, seed++));
      tensors.emplace_back(p + "self_attn.k_proj.weight", random_bf16({kv_heads * D, H}, 0.02f, seed++));
      tensors.emplace_back(p + "self_attn.v_proj.weight", random_bf16({kv_heads * D, H}, 0.02f, seed++));
      tensors.emplace_back(p + "self_attn.o_proj.weight", random_bf16({H, heads * D}, 0.02f, seed++));
      tensors.emplace_back(p + "mlp.gate_proj.weight", random_bf16({I, H}, 0.02f, seed++));
      tensors.emplace_back(p + "mlp.up_proj.weight", random_bf16({I, H}, 0.02f, seed++));
      tensors.emplace_back(p + "mlp.down_proj.weight", random_bf16({H, I}, 0.02f, seed++));
    }
    write_safetensors((dir / "model.safetensors").string(), tensors);
  }

  struct Format {
    const char* name;
    std::filesystem::path dir;
    double bytes_per_param;  // codes and scales
  };
  std::vector<Format> formats = {{"bf16", dir, 2.0}};
  for (const auto& [name, format, bits] : {std::tuple{"int8", QuantFormat::kInt8, 8}, {"int4", QuantFormat::kInt4, 4}}) {
    QuantizeOptions options;
    options.format = format;
    const auto out = dir.string() + "_" + name;
    std::printf("quantizing to %s...\n", name);
    std::fflush(stdout);
    quantize_checkpoint(dir.string(), out, options);
    formats.push_back({name, out, bits / 8.0 + 2.0 / 32.0});
  }

  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = (i * 7919 + 13) % static_cast<int>(V);
  // Parameters one decode step reads: every linear plus the head.
  const double params = layers * static_cast<double>(H * heads * D * 2 + H * kv_heads * D * 2 + 3 * H * I) +
                        static_cast<double>(V * H);

  CpuBackend backend;
  struct Result {
    double load_s, prefill_tps, decode_tps, weight_bytes;
  };
  std::vector<Result> results;
  for (const Format& f : formats) {
    auto start = Clock::now();
    auto model = load_model(f.dir.string(), backend);
    const double load_s = seconds_since(start);
    const GenerationTiming timing = time_generation(*model, backend, prompt, decode_tokens);
    results.push_back({load_s, prompt_len / timing.prefill_s, decode_tokens / timing.decode_s, params * f.bytes_per_param});
  }
  const double bandwidth = measure_read_bandwidth();

  std::printf("\nLlama-3.2-1B shape, %d layers, %d threads, %d-token prompt, batch-1 decode\n", layers,
              ThreadPool::global().size(), prompt_len);
  std::printf("measured read bandwidth: %.1f GB/s\n", bandwidth);
  std::printf("%-6s %8s %12s %12s %10s %10s %12s %12s\n", "format", "load s", "prefill t/s", "decode t/s",
              "GB/token", "floor t/s", "decode/floor", "decode/bf16");
  for (size_t i = 0; i < formats.size(); ++i) {
    const Result& r = results[i];
    const double floor_tps = bandwidth * 1e9 / r.weight_bytes;
    std::printf("%-6s %8.1f %12.1f %12.2f %10.2f %10.2f %12.2f %12.2f\n", formats[i].name, r.load_s, r.prefill_tps,
                r.decode_tps, r.weight_bytes / 1e9, floor_tps, r.decode_tps / floor_tps,
                r.decode_tps / results[0].decode_tps);
  }
  for (const Format& f : formats) std::filesystem::remove_all(f.dir);
  return 0;
}
