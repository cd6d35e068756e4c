// Random-weight dense Llama checkpoints (bf16) for the benchmarks and for
// serving an 8B-shaped model without downloading one.
//
// Contract: write_random_llama(dir, shape) writes dir/config.json (model_type
// llama, the shape, llama3 rope scaling, `extra` merged over the defaults)
// and dir/model.safetensors with every tensor load_model expects for that
// config, as separate byte ranges (the loader refuses overlapping ones), and
// returns the bytes of weights written. Values are uniform random; to keep
// writing fast the layers hold the same random matrices (generated once),
// which changes nothing for speed and keeps the model a valid checkpoint.
// `dir` must exist. Throws basalt::Error on an invalid shape or I/O failure.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "core/error.h"
#include "model/safetensors.h"

namespace basalt::bench {

// Llama-3.1-8B's shape by default.
struct LlamaShape {
  int layers = 32;
  int64_t hidden = 4096;
  int64_t intermediate = 14336;
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t vocab = 128256;
};

// Parameters of the checkpoint: what one decode step reads, plus the embedding table.
inline uint64_t llama_weight_bytes(const LlamaShape& s) {
  const int64_t D = s.hidden / s.heads;
  const int64_t per_layer = s.hidden * s.heads * D * 2 + s.hidden * s.kv_heads * D * 2 + 3 * s.hidden * s.intermediate +
                            2 * s.hidden;
  return 2 * static_cast<uint64_t>(s.layers * per_layer + 2 * s.vocab * s.hidden + s.hidden);
}

inline uint64_t write_random_llama(const std::filesystem::path& dir, const LlamaShape& s,
                                   const nlohmann::json& extra = nlohmann::json::object()) {
  BASALT_CHECK(s.layers >= 1 && s.hidden >= 1 && s.intermediate >= 1 && s.heads >= 1 && s.kv_heads >= 1 &&
                   s.vocab >= 2,
               "random Llama: every dimension must be positive");
  BASALT_CHECK(s.hidden % s.heads == 0 && s.heads % s.kv_heads == 0 && (s.hidden / s.heads) % 2 == 0,
               "random Llama: hidden {} must split into {} heads of an even size, and heads into {} KV heads",
               s.hidden, s.heads, s.kv_heads);
  const int64_t H = s.hidden, I = s.intermediate, D = s.hidden / s.heads;
  nlohmann::json config = {
      {"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"torch_dtype", "bfloat16"},
      {"vocab_size", s.vocab}, {"hidden_size", H}, {"intermediate_size", I}, {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads}, {"head_dim", D},
      {"hidden_act", "silu"}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false},
      {"max_position_embeddings", 131072},
      {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}},
      {"rope_theta", 500000.0}};
  config.update(extra);
  {
    std::ofstream out(dir / "config.json");
    out << config.dump(1) << "\n";
    BASALT_CHECK(out.good(), "{}: cannot write config.json", dir.string());
  }
  const Tensor norm = random_bf16({H}, 1.0f, 1), q = random_bf16({s.heads * D, H}, 0.02f, 2),
               kv = random_bf16({s.kv_heads * D, H}, 0.02f, 3), o = random_bf16({H, s.heads * D}, 0.02f, 4),
               up = random_bf16({I, H}, 0.02f, 5), down = random_bf16({H, I}, 0.02f, 6);
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.emplace_back("model.embed_tokens.weight", random_bf16({s.vocab, H}, 0.05f, 7));
  tensors.emplace_back("lm_head.weight", random_bf16({s.vocab, H}, 0.05f, 8));
  tensors.emplace_back("model.norm.weight", norm);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.emplace_back(p + "input_layernorm.weight", norm);
    tensors.emplace_back(p + "post_attention_layernorm.weight", norm);
    tensors.emplace_back(p + "self_attn.q_proj.weight", q);
    tensors.emplace_back(p + "self_attn.k_proj.weight", kv);
    tensors.emplace_back(p + "self_attn.v_proj.weight", kv);
    tensors.emplace_back(p + "self_attn.o_proj.weight", o);
    tensors.emplace_back(p + "mlp.gate_proj.weight", up);
    tensors.emplace_back(p + "mlp.up_proj.weight", up);
    tensors.emplace_back(p + "mlp.down_proj.weight", down);
  }
  write_safetensors((dir / "model.safetensors").string(), tensors);
  return llama_weight_bytes(s);
}

}  // namespace basalt::bench
