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
// written (one shard per layer) to a temporary directory, loaded through the
// same path `basalt generate` uses, and deleted afterwards. The FP8 copy
// stores every linear weight of the decoder layers as float8_e4m3fn with
// float32 weight_scale_inv per 128x128 block; embedding, lm_head, norms and
// the router stay bf16, as in the published FP8 checkpoints.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "runtime/generator.h"
#include "bench_util.h"

namespace {

using namespace basalt;
using namespace basalt::bench;

// e4m3 codes of magnitude up to 2 (no NaN), and block scales of about scale / 2.
Tensor random_fp8(Shape shape, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), DType::kF8E4M3);
  Rng rng(seed);
  uint8_t* p = t.data<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t r = rng.next();
    p[i] = static_cast<uint8_t>(((r >> 8) & 0x80) | (r % 0x40));  // exponent field <= 7: |v| < 2
  }
  return t;
}

Tensor block_scales(int64_t n, int64_t k, float scale, uint64_t seed) {
  const int64_t bn = (n + 127) / 128, bk = (k + 127) / 128;
  Tensor t = Tensor::empty({bn, bk}, DType::kF32);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * (0.75f + 0.25f * rng.uniform());
  return t;
}

constexpr int64_t H = 2048, heads = 16, L = 512, Dn = 128, R = 64, Dv = 128;
constexpr int64_t E = 64, I_moe = 1408, shared = 2, I_dense = 10944, V = 102400;

// Writes one checkpoint; returns the bytes of weights one decode token reads.
double write_checkpoint(const std::filesystem::path& dir, int layers, bool fp8) {
  std::filesystem::create_directories(dir);
  nlohmann::json config = {
      {"model_type", "deepseek_v2"}, {"architectures", {"DeepseekV2ForCausalLM"}},
      {"vocab_size", V}, {"hidden_size", H}, {"intermediate_size", I_dense},
      {"moe_intermediate_size", I_moe}, {"num_hidden_layers", layers},
      {"num_attention_heads", heads}, {"num_key_value_heads", heads}, {"q_lora_rank", nullptr},
      {"kv_lora_rank", L}, {"qk_nope_head_dim", Dn}, {"qk_rope_head_dim", R}, {"v_head_dim", Dv},
      {"n_routed_experts", E}, {"n_shared_experts", shared}, {"num_experts_per_tok", 6},
      {"n_group", 1}, {"topk_group", 1}, {"topk_method", "greedy"}, {"scoring_func", "softmax"},
      {"norm_topk_prob", false}, {"routed_scaling_factor", 1.0}, {"first_k_dense_replace", 1},
      {"moe_layer_freq", 1}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 163840},
      {"rope_theta", 10000.0}, {"tie_word_embeddings", false},
      {"rope_scaling", {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096},
                        {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 0.707},
                        {"mscale_all_dim", 0.707}}}};
  if (fp8) {
    config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"},
                                     {"activation_scheme", "dynamic"},
                                     {"weight_block_size", {128, 128}}};
  }
  std::ofstream(dir / "config.json") << config.dump(1);
  const double wbytes = fp8 ? 1.0 : 2.0;
  double decode_bytes = 2.0 * static_cast<double>(V * H);  // lm_head
  uint64_t seed = 1;
  nlohmann::json weight_map = nlohmann::json::object();
  auto write_shard = [&](const std::string& file, std::vector<std::pair<std::string, Tensor>> t) {
    for (const auto& [name, tensor] : t) weight_map[name] = file;
    write_safetensors((dir / file).string(), t);
  };
  write_shard("embed.safetensors", {{"model.embed_tokens.weight", random_bf16({V, H}, 1.0f, seed++)},
                                    {"model.norm.weight", random_bf16({H}, 1.0f, seed++)},
                                    {"lm_head.weight", random_bf16({V, H}, 0.02f, seed++)}});
  for (int l = 0; l < layers; ++l) {
    std::vector<std::pair<std::string, Tensor>> t;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto linear = [&](const std::string& name, int64_t n, int64_t k, bool read_per_token) {
      const float scale = 1.0f / std::sqrt(static_cast<float>(k));
      if (fp8) {
        t.emplace_back(name + ".weight", random_fp8({n, k}, seed++));
        t.emplace_back(name + ".weight_scale_inv", block_scales(n, k, scale / 2, seed++));
      } else {
        t.emplace_back(name + ".weight", random_bf16({n, k}, scale, seed++));
      }
      if (read_per_token) decode_bytes += wbytes * static_cast<double>(n * k);
    };
    t.emplace_back(p + "input_layernorm.weight", random_bf16({H}, 1.0f, seed++));
    t.emplace_back(p + "post_attention_layernorm.weight", random_bf16({H}, 1.0f, seed++));
    linear(p + "self_attn.q_proj", heads * (Dn + R), H, true);
    linear(p + "self_attn.kv_a_proj_with_mqa", L + R, H, true);
    t.emplace_back(p + "self_attn.kv_a_layernorm.weight", random_bf16({L}, 1.0f, seed++));
    linear(p + "self_attn.kv_b_proj", heads * (Dn + Dv), L, true);
    linear(p + "self_attn.o_proj", H, heads * Dv, true);
    if (l == 0) {
      for (const char* m : {"gate_proj", "up_proj"}) linear(p + "mlp." + m, I_dense, H, true);
      linear(p + "mlp.down_proj", H, I_dense, true);
    } else {
      t.emplace_back(p + "mlp.gate.weight", random_bf16({E, H}, 0.1f, seed++));
      decode_bytes += 2.0 * E * H;
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        linear(x + "gate_proj", I_moe, H, false);
        linear(x + "up_proj", I_moe, H, false);
        linear(x + "down_proj", H, I_moe, false);
      }
      decode_bytes += 6.0 * 3.0 * wbytes * static_cast<double>(I_moe * H);  // top-6
      const int64_t Is = I_moe * shared;
      linear(p + "mlp.shared_experts.gate_proj", Is, H, true);
      linear(p + "mlp.shared_experts.up_proj", Is, H, true);
      linear(p + "mlp.shared_experts.down_proj", H, Is, true);
    }
    write_shard("layer-" + std::to_string(l) + ".safetensors", std::move(t));
  }
  std::ofstream(dir / "model.safetensors.index.json")
      << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", weight_map}}.dump();
  return decode_bytes;
}

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
  for (int i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = (i * 7919 + 13) % static_cast<int>(V);
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
    const double bytes = write_checkpoint(dir, layers, fp8);
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
