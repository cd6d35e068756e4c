// ModelConfig: the architecture facts of a Hugging Face checkpoint, read from config.json.
//
// Contract: ModelConfig::load(dir) reads <dir>/config.json (and
// generation_config.json when present, for end-of-sequence ids), validates
// every field a forward pass depends on (positive sizes, heads dividing
// evenly, known rope scaling type) and throws basalt::Error naming the file
// and field otherwise. Both the transformers 4.x spelling (rope_theta,
// rope_scaling, torch_dtype) and the 5.x spelling (rope_parameters, dtype)
// are accepted. Pure data: safe to copy and share between threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace basalt {

// The dense decoder families share one forward pass and differ only in flags
// below (biases, q/k norm, tied head, sliding window). The DeepSeek family
// (V2, V2-Lite, V3, R1: MLA attention and MoE) has its own forward pass,
// configured by ModelConfig::deepseek.
enum class Architecture { kLlama, kMistral, kQwen2, kQwen3, kDeepseekV2, kDeepseekV3 };

std::string_view architecture_name(Architecture arch);

struct RopeScaling {
  // "default", "linear", "llama3" or "yarn".
  std::string type = "default";
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and yarn: the context length the model was pretrained with.
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;          // 0: absent
  double mscale_all_dim = 0.0;  // 0: absent
  std::optional<double> attention_factor;
  bool truncate = true;
};

// DeepSeek V2/V3 fields, as config.json names them. Validated on load:
// experts divide into n_group groups, topk_group <= n_group, enough experts in
// the chosen groups for num_experts_per_tok, a known scoring_func/topk_method,
// and a quantization_config (when present) of fp8 e4m3 with 128x128 blocks.
struct DeepseekConfig {
  int64_t q_lora_rank = 0;  // 0 (null in config.json): queries use one q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;  // 0: every layer is dense
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = false;
  std::string scoring_func = "softmax";  // "softmax" (V2) or "sigmoid" (V3)
  std::string topk_method = "greedy";    // "greedy", "group_limited_greedy" or "noaux_tc"
  int64_t num_nextn_predict_layers = 0;  // MTP layers stored after the decoder layers
  bool fp8_block_weights = false;        // quantization_config: fp8, e4m3, [128, 128]

  // Layer l uses the routed experts (otherwise a dense MLP of intermediate_size).
  bool is_moe_layer(int64_t l) const {
    return n_routed_experts > 0 && l >= first_k_dense_replace && l % moe_layer_freq == 0;
  }
};

// quantization_config {"quant_method": "basalt-int", "bits": 8 | 4,
// "group_size": a multiple of 32, or -1 for one scale per row}: the linear
// weights are in an integer format of core/int_weights.h (written by
// `basalt quantize --format int8|int4`; CPU backend only).
inline constexpr const char* kIntQuantMethod = "basalt-int";
struct IntWeightsConfig {
  int bits = 0;  // 0: the weights are not in an integer format
  int64_t group_size = 0;
  // The group of a weight with in_features k (-1: the whole row).
  int64_t group_for(int64_t k) const { return group_size < 0 ? k : group_size; }
};

struct ModelConfig {
  std::string model_type;  // as written in config.json
  Architecture architecture = Architecture::kLlama;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // head_dim * partial_rotary_factor
  int64_t max_position_embeddings = 0;

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;

  bool tie_word_embeddings = false;
  bool qkv_bias = false;   // q/k/v projections carry a bias (Qwen2; Llama attention_bias)
  bool o_bias = false;     // o_proj carries a bias (Llama attention_bias)
  bool mlp_bias = false;   // gate/up/down carry biases (Llama mlp_bias)
  bool qk_norm = false;    // per-head RMSNorm of q and k before rope (Qwen3)
  // Per layer: 0 for full attention, else the window (keys a query may see, itself included).
  std::vector<int32_t> sliding_window_per_layer;

  // Meaningful for Architecture::kDeepseekV2 and kDeepseekV3 only; there
  // head_dim is qk_nope_head_dim + qk_rope_head_dim and rotary_dim is
  // qk_rope_head_dim.
  DeepseekConfig deepseek;

  IntWeightsConfig int_weights;

  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;

  // config.json's "basalt_eagle_head": the directory is an EAGLE-style draft
  // head (model/eagle_head.h) in the Llama layout, not a model to serve.
  bool eagle_head = false;

  static ModelConfig load(const std::string& dir);
  // label names the source in error messages (usually the file path).
  static ModelConfig from_json(const nlohmann::json& json, const std::string& label);
};

}  // namespace basalt
