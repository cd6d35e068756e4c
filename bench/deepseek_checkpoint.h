// Random-weight DeepSeek V2/V3 checkpoints for the benchmarks.
//
// Contract: write_random_deepseek(dir, shape) writes dir/config.json and
// dir/model.safetensors holding every tensor load_model expects for the
// shape: the decoder's linear layers in block FP8 (e4m3 with f32 128x128
// weight_scale_inv, as the published FP8 checkpoints) when shape.fp8, bf16
// otherwise; embedding, lm_head, norms and the router in bf16; V3-style
// routing (sigmoid, grouped, noaux_tc) adds the f32 e_score_correction_bias.
// Every tensor has its own byte range (the loader refuses overlapping ones),
// but tensors of one role share one random matrix generated once (writing a
// 38 GB V3 slice then costs the disk, not the random generator); that
// changes nothing for speed, and the model stays a valid checkpoint. `dir`
// must exist. Throws basalt::Error on an invalid shape or I/O failure.
//
// deepseek_decode_bytes(shape, batch) is the weight bytes one decode step of
// `batch` tokens reads: every non-expert weight once, and the routed experts
// that uniform routing touches in expectation, E (1 - (1 - k/E)^batch) per
// MoE layer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "core/error.h"
#include "model/safetensors.h"

namespace basalt::bench {

// DeepSeek-V3's shape by default (671B: hidden 7168, 128 heads, q_lora 1536,
// kv_lora 512, 256 experts top-8 in 8 groups, MoE intermediate 2048, first 3
// of 61 layers dense); `layers` of them, the first `dense_layers` dense.
struct DeepseekShape {
  int layers = 4;
  int dense_layers = 1;
  int64_t hidden = 7168;
  int64_t intermediate = 18432;  // the dense layers' MLP
  int64_t moe_intermediate = 2048;
  int64_t heads = 128;
  int64_t q_lora = 1536;  // 0: one q_proj from the hidden state (V2-Lite)
  int64_t kv_lora = 512, nope = 128, rope = 64, v = 128;
  int64_t experts = 256, top_k = 8, groups = 8, topk_groups = 4, shared = 1;
  bool sigmoid = true;  // V3 routing (sigmoid + bias, normalized, x2.5); else V2's softmax, greedy
  double mscale = 1.0;  // YaRN mscale and mscale_all_dim
  int64_t vocab = 129280;
  bool fp8 = true;
};

// DeepSeek-V2-Lite's shape (27 layers in the published model).
inline DeepseekShape deepseek_v2_lite_shape(int layers, bool fp8) {
  DeepseekShape s;
  s.layers = layers;
  s.hidden = 2048;
  s.intermediate = 10944;
  s.moe_intermediate = 1408;
  s.heads = 16;
  s.q_lora = 0;
  s.experts = 64;
  s.top_k = 6;
  s.groups = 1;
  s.topk_groups = 1;
  s.shared = 2;
  s.sigmoid = false;
  s.mscale = 0.707;
  s.vocab = 102400;
  s.fp8 = fp8;
  return s;
}

// e4m3 codes of magnitude below 2 (no NaN), uniform over sign and code.
inline Tensor random_fp8(Shape shape, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), DType::kF8E4M3);
  Rng rng(seed);
  uint8_t* p = t.data<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t r = rng.next();
    p[i] = static_cast<uint8_t>(((r >> 8) & 0x80) | (r % 0x40));  // exponent field <= 7
  }
  return t;
}

// f32 block scales for an [n, k] weight, each in [0.5, 1) x scale.
inline Tensor random_block_scales(int64_t n, int64_t k, float scale, uint64_t seed) {
  const int64_t bn = (n + 127) / 128, bk = (k + 127) / 128;
  Tensor t = Tensor::empty({bn, bk}, DType::kF32);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * (0.75f + 0.25f * rng.uniform());
  return t;
}

// The bytes one weight matrix [n, k] occupies (with its scales under FP8).
inline double deepseek_linear_bytes(const DeepseekShape& s, int64_t n, int64_t k) {
  const double scales = s.fp8 ? 4.0 * static_cast<double>(((n + 127) / 128) * ((k + 127) / 128)) : 0.0;
  return (s.fp8 ? 1.0 : 2.0) * static_cast<double>(n) * static_cast<double>(k) + scales;
}

inline double deepseek_decode_bytes(const DeepseekShape& s, int64_t batch) {
  const int64_t H = s.hidden, qk = s.nope + s.rope;
  double attention = deepseek_linear_bytes(s, s.kv_lora + s.rope, H) +
                     deepseek_linear_bytes(s, s.heads * (s.nope + s.v), s.kv_lora) +
                     deepseek_linear_bytes(s, H, s.heads * s.v);
  attention += s.q_lora > 0 ? deepseek_linear_bytes(s, s.q_lora, H) + deepseek_linear_bytes(s, s.heads * qk, s.q_lora)
                            : deepseek_linear_bytes(s, s.heads * qk, H);
  const double dense_mlp = 2 * deepseek_linear_bytes(s, s.intermediate, H) + deepseek_linear_bytes(s, H, s.intermediate);
  const double expert = 2 * deepseek_linear_bytes(s, s.moe_intermediate, H) +
                        deepseek_linear_bytes(s, H, s.moe_intermediate);
  const double touched =
      static_cast<double>(s.experts) *
      (1.0 - std::pow(1.0 - static_cast<double>(s.top_k) / static_cast<double>(s.experts), static_cast<double>(batch)));
  const double moe = 2.0 * static_cast<double>(s.experts * H) + static_cast<double>(s.shared) * expert + touched * expert;
  const int moe_layers = s.layers - std::min(s.layers, s.dense_layers);
  return s.layers * attention + (s.layers - moe_layers) * dense_mlp + moe_layers * moe +
         2.0 * static_cast<double>(s.vocab * H);  // lm_head (the embedding reads `batch` rows)
}

inline void write_random_deepseek(const std::filesystem::path& dir, const DeepseekShape& s) {
  BASALT_CHECK(s.layers >= 1 && s.dense_layers >= 0 && s.hidden >= 1 && s.intermediate >= 1 &&
                   s.moe_intermediate >= 1 && s.heads >= 1 && s.q_lora >= 0 && s.kv_lora >= 1 && s.nope >= 1 &&
                   s.rope >= 2 && s.rope % 2 == 0 && s.v >= 1 && s.experts >= 1 && s.top_k >= 1 &&
                   s.top_k <= s.experts && s.groups >= 1 && s.experts % s.groups == 0 && s.topk_groups >= 1 &&
                   s.topk_groups <= s.groups && s.shared >= 0 && s.vocab >= 2,
               "random DeepSeek: invalid shape");
  const int64_t H = s.hidden, qk = s.nope + s.rope;
  nlohmann::json config = {
      {"model_type", s.sigmoid ? "deepseek_v3" : "deepseek_v2"},
      {"architectures", {s.sigmoid ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"}},
      {"vocab_size", s.vocab}, {"hidden_size", H}, {"intermediate_size", s.intermediate},
      {"moe_intermediate_size", s.moe_intermediate}, {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads}, {"num_key_value_heads", s.heads},
      {"q_lora_rank", s.q_lora > 0 ? nlohmann::json(s.q_lora) : nlohmann::json(nullptr)},
      {"kv_lora_rank", s.kv_lora}, {"qk_nope_head_dim", s.nope}, {"qk_rope_head_dim", s.rope},
      {"v_head_dim", s.v}, {"n_routed_experts", s.experts}, {"n_shared_experts", s.shared},
      {"num_experts_per_tok", s.top_k}, {"n_group", s.groups}, {"topk_group", s.topk_groups},
      {"topk_method", s.sigmoid ? "noaux_tc" : "greedy"}, {"scoring_func", s.sigmoid ? "sigmoid" : "softmax"},
      {"norm_topk_prob", s.sigmoid}, {"routed_scaling_factor", s.sigmoid ? 2.5 : 1.0},
      {"first_k_dense_replace", s.dense_layers}, {"moe_layer_freq", 1}, {"num_nextn_predict_layers", 0},
      {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 163840}, {"rope_theta", 10000.0},
      {"tie_word_embeddings", false}, {"hidden_act", "silu"}, {"torch_dtype", "bfloat16"},
      {"rope_scaling", {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096},
                        {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", s.mscale},
                        {"mscale_all_dim", s.mscale}}}};
  if (s.fp8) {
    config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                     {"weight_block_size", {128, 128}}};
  }
  {
    std::ofstream out(dir / "config.json");
    out << config.dump(1) << "\n";
    BASALT_CHECK(out.good(), "{}: cannot write config.json", dir.string());
  }

  // One random matrix (and scale grid) per distinct [n, k], shared by every
  // tensor of that shape.
  uint64_t seed = 1;
  std::map<std::pair<int64_t, int64_t>, std::pair<Tensor, Tensor>> linears;  // [n, k] -> weight, scales
  const auto matrix = [&](int64_t n, int64_t k) -> const std::pair<Tensor, Tensor>& {
    auto it = linears.find({n, k});
    if (it != linears.end()) return it->second;
    const float scale = 1.0f / std::sqrt(static_cast<float>(k));
    std::pair<Tensor, Tensor> made = s.fp8 ? std::make_pair(random_fp8({n, k}, seed),
                                                            random_block_scales(n, k, scale / 2, seed + 1))
                                           : std::make_pair(random_bf16({n, k}, scale, seed), Tensor());
    seed += 2;
    return linears.emplace(std::make_pair(n, k), std::move(made)).first->second;
  };
  std::vector<std::pair<std::string, Tensor>> tensors;
  const auto linear = [&](const std::string& name, int64_t n, int64_t k) {
    const auto& [w, scales] = matrix(n, k);
    tensors.emplace_back(name + ".weight", w);
    if (s.fp8) tensors.emplace_back(name + ".weight_scale_inv", scales);
  };
  const auto mlp = [&](const std::string& prefix, int64_t inter) {
    linear(prefix + "gate_proj", inter, H);
    linear(prefix + "up_proj", inter, H);
    linear(prefix + "down_proj", H, inter);
  };
  const Tensor norm_h = random_bf16({H}, 1.0f, 101), norm_kv = random_bf16({s.kv_lora}, 1.0f, 102);
  const Tensor norm_q = s.q_lora > 0 ? random_bf16({s.q_lora}, 1.0f, 103) : Tensor();
  const Tensor router = random_bf16({s.experts, H}, 0.1f, 104);
  const Tensor bias = Tensor::zeros({s.experts}, DType::kF32);
  tensors.emplace_back("model.embed_tokens.weight", random_bf16({s.vocab, H}, 1.0f, 105));
  tensors.emplace_back("lm_head.weight", random_bf16({s.vocab, H}, 0.02f, 106));
  tensors.emplace_back("model.norm.weight", norm_h);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.emplace_back(p + "input_layernorm.weight", norm_h);
    tensors.emplace_back(p + "post_attention_layernorm.weight", norm_h);
    if (s.q_lora > 0) {
      linear(p + "self_attn.q_a_proj", s.q_lora, H);
      tensors.emplace_back(p + "self_attn.q_a_layernorm.weight", norm_q);
      linear(p + "self_attn.q_b_proj", s.heads * qk, s.q_lora);
    } else {
      linear(p + "self_attn.q_proj", s.heads * qk, H);
    }
    linear(p + "self_attn.kv_a_proj_with_mqa", s.kv_lora + s.rope, H);
    tensors.emplace_back(p + "self_attn.kv_a_layernorm.weight", norm_kv);
    linear(p + "self_attn.kv_b_proj", s.heads * (s.nope + s.v), s.kv_lora);
    linear(p + "self_attn.o_proj", H, s.heads * s.v);
    if (l < s.dense_layers) {
      mlp(p + "mlp.", s.intermediate);
      continue;
    }
    tensors.emplace_back(p + "mlp.gate.weight", router);
    if (s.sigmoid) tensors.emplace_back(p + "mlp.gate.e_score_correction_bias", bias);
    for (int64_t e = 0; e < s.experts; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".", s.moe_intermediate);
    if (s.shared > 0) mlp(p + "mlp.shared_experts.", s.shared * s.moe_intermediate);
  }
  write_safetensors((dir / "model.safetensors").string(), tensors);
}

}  // namespace basalt::bench
