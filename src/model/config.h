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

// The dense decoder families. They share one forward pass and differ only in
// flags below (biases, q/k norm, tied head, sliding window).
enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };

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

  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;

  static ModelConfig load(const std::string& dir);
  // label names the source in error messages (usually the file path).
  static ModelConfig from_json(const nlohmann::json& json, const std::string& label);
};

}  // namespace basalt
