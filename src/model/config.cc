#include "model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/int_weights.h"

namespace basalt {
namespace {

using nlohmann::json;

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  BASALT_CHECK(in.good(), "{}: cannot open", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return json::parse(buffer.str());
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

// Typed field readers that name the file and field on error.
class Fields {
 public:
  Fields(const json& object, const std::string& label) : object_(object), label_(label) {}

  bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }

  int64_t integer(const char* key) const {
    BASALT_CHECK(has(key), "{}: missing field '{}'", label_, key);
    return integer_value(object_.at(key), key);
  }
  int64_t integer_or(const char* key, int64_t fallback) const {
    return has(key) ? integer_value(object_.at(key), key) : fallback;
  }
  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    BASALT_CHECK(v.is_number(), "{}: field '{}' must be a number", label_, key);
    return v.get<double>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    BASALT_CHECK(v.is_boolean(), "{}: field '{}' must be true or false", label_, key);
    return v.get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = object_.at(key);
    BASALT_CHECK(v.is_string(), "{}: field '{}' must be a string", label_, key);
    return v.get<std::string>();
  }
  // An id or a list of ids (eos_token_id is either).
  std::vector<int32_t> ids(const char* key) const {
    std::vector<int32_t> out;
    if (!has(key)) return out;
    const json& v = object_.at(key);
    if (v.is_array()) {
      for (const json& e : v) out.push_back(static_cast<int32_t>(integer_value(e, key)));
    } else {
      out.push_back(static_cast<int32_t>(integer_value(v, key)));
    }
    return out;
  }
  const json& object() const { return object_; }

 private:
  int64_t integer_value(const json& v, const char* key) const {
    BASALT_CHECK(v.is_number_integer() || (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>()))),
                 "{}: field '{}' must be an integer", label_, key);
    return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
  }

  const json& object_;
  const std::string& label_;
};

Architecture parse_architecture(const std::string& model_type, const std::string& label) {
  if (model_type == "llama") return Architecture::kLlama;
  if (model_type == "mistral") return Architecture::kMistral;
  if (model_type == "qwen2") return Architecture::kQwen2;
  if (model_type == "qwen3") return Architecture::kQwen3;
  if (model_type == "deepseek_v2") return Architecture::kDeepseekV2;
  if (model_type == "deepseek_v3") return Architecture::kDeepseekV3;
  fail("{}: model_type '{}' is not supported (supported: llama, mistral, qwen2, qwen3, "
       "deepseek_v2, deepseek_v3)", label, model_type);
}

// rope_scaling (4.x) or rope_parameters (5.x, which also carries rope_theta).
void parse_rope(const Fields& f, const std::string& label, ModelConfig& c) {
  c.rope_theta = f.number_or("rope_theta", c.rope_theta);
  const json* scaling = nullptr;
  if (f.has("rope_parameters")) {
    scaling = &f.object().at("rope_parameters");
  } else if (f.has("rope_scaling")) {
    scaling = &f.object().at("rope_scaling");
  }
  if (scaling == nullptr) return;
  BASALT_CHECK(scaling->is_object(), "{}: rope scaling must be an object", label);
  const std::string sub_label = label + " (rope scaling)";
  Fields s(*scaling, sub_label);
  c.rope_theta = s.number_or("rope_theta", c.rope_theta);
  std::string type = s.string_or("rope_type", s.string_or("type", "default"));
  RopeScaling& r = c.rope_scaling;
  r.type = type;
  if (type == "default") return;
  r.factor = s.number_or("factor", 1.0);
  BASALT_CHECK(r.factor > 0, "{}: factor must be positive", sub_label);
  if (type == "linear") return;
  if (type == "llama3") {
    r.low_freq_factor = s.number_or("low_freq_factor", 1.0);
    r.high_freq_factor = s.number_or("high_freq_factor", 4.0);
    r.original_max_position_embeddings = s.integer("original_max_position_embeddings");
    BASALT_CHECK(r.high_freq_factor > r.low_freq_factor && r.original_max_position_embeddings > 0,
                 "{}: llama3 scaling needs high_freq_factor > low_freq_factor and a positive "
                 "original_max_position_embeddings", sub_label);
    return;
  }
  if (type == "yarn") {
    r.original_max_position_embeddings =
        s.integer_or("original_max_position_embeddings", c.max_position_embeddings);
    r.beta_fast = s.number_or("beta_fast", 32.0);
    r.beta_slow = s.number_or("beta_slow", 1.0);
    r.mscale = s.number_or("mscale", 0.0);
    r.mscale_all_dim = s.number_or("mscale_all_dim", 0.0);
    if (s.has("attention_factor")) r.attention_factor = s.number_or("attention_factor", 1.0);
    r.truncate = s.boolean_or("truncate", true);
    BASALT_CHECK(r.original_max_position_embeddings > 0, "{}: yarn needs original_max_position_embeddings", sub_label);
    return;
  }
  fail("{}: rope scaling type '{}' is not supported (supported: default, linear, llama3, yarn)",
       sub_label, type);
}

// DeepSeek V2/V3: MLA dimensions, MoE routing and block-FP8 quantization.
// The transformer sizes every family has, with plausibility limits (a
// hostile config must not make the loader allocate terabytes).
void parse_sizes(const Fields& f, const std::string& label, ModelConfig& c) {
  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_layers = f.integer("num_hidden_layers");
  c.num_heads = f.integer("num_attention_heads");
  c.num_kv_heads = f.integer_or("num_key_value_heads", c.num_heads);
  BASALT_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
                   c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0,
               "{}: vocab_size, hidden_size, intermediate_size, num_hidden_layers and head counts "
               "must be positive", label);
  BASALT_CHECK(c.vocab_size <= (int64_t{1} << 30) && c.hidden_size <= (1 << 20) &&
                   c.intermediate_size <= (1 << 22) && c.num_layers <= 4096 && c.num_heads <= 4096,
               "{}: sizes are implausibly large", label);
}

// bos and eos ids must be tokens of the vocabulary.
void check_token_ids(const ModelConfig& c, const std::string& label) {
  if (c.bos_token_id)
    BASALT_CHECK(*c.bos_token_id >= 0 && *c.bos_token_id < c.vocab_size,
                 "{}: bos_token_id {} is outside the vocabulary (vocab_size {})", label, *c.bos_token_id,
                 c.vocab_size);
  for (int32_t id : c.eos_token_ids)
    BASALT_CHECK(id >= 0 && id < c.vocab_size, "{}: eos_token_id {} is outside the vocabulary (vocab_size {})",
                 label, id, c.vocab_size);
}

// Context length, norm epsilon, rope, activation and head tying: read the
// same way for every family.
void parse_common_tail(const Fields& f, const std::string& label, ModelConfig& c) {
  c.max_position_embeddings = f.integer_or("max_position_embeddings", 4096);
  BASALT_CHECK(c.max_position_embeddings >= 2 && c.max_position_embeddings <= (int64_t{1} << 24),
               "{}: max_position_embeddings must be in [2, 16777216], got {}", label, c.max_position_embeddings);
  c.rms_norm_eps = f.number_or("rms_norm_eps", 1e-6);
  BASALT_CHECK(c.rms_norm_eps > 0 && c.rms_norm_eps < 1, "{}: rms_norm_eps must be in (0, 1), got {}", label,
               c.rms_norm_eps);
  parse_rope(f, label, c);
  BASALT_CHECK(c.rope_theta > 0 && std::isfinite(c.rope_theta), "{}: rope_theta must be positive", label);
  const std::string act = f.string_or("hidden_act", "silu");
  BASALT_CHECK(act == "silu" || act == "swish", "{}: hidden_act '{}' is not supported (silu only)",
               label, act);
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", false);
  auto bos = f.ids("bos_token_id");
  if (!bos.empty()) c.bos_token_id = bos.front();
  c.eos_token_ids = f.ids("eos_token_id");
  check_token_ids(c, label);
}

// quantization_config of `basalt quantize --format int8|int4`.
void parse_int_weights(const Fields& q, const std::string& label, ModelConfig& c) {
  const int64_t bits = q.integer("bits");
  BASALT_CHECK(bits == 8 || bits == 4, "{}: bits must be 8 or 4, got {}", label, bits);
  const int64_t group = q.integer("group_size");
  BASALT_CHECK(group == -1 || (group >= kIntBlock && group % kIntBlock == 0 && group <= (int64_t{1} << 20)),
               "{}: group_size must be a multiple of {} or -1 (one scale per row), got {}", label, kIntBlock, group);
  c.int_weights.bits = static_cast<int>(bits);
  c.int_weights.group_size = group;
}

void parse_deepseek(const Fields& f, const std::string& label, ModelConfig& c) {
  DeepseekConfig& d = c.deepseek;
  const bool v3 = c.architecture == Architecture::kDeepseekV3;
  parse_sizes(f, label, c);
  c.num_kv_heads = c.num_heads;  // MLA: every head has its own key and value
  d.q_lora_rank = f.integer_or("q_lora_rank", 0);
  d.kv_lora_rank = f.integer("kv_lora_rank");
  d.qk_nope_head_dim = f.integer("qk_nope_head_dim");
  d.qk_rope_head_dim = f.integer("qk_rope_head_dim");
  d.v_head_dim = f.integer("v_head_dim");
  d.n_routed_experts = f.integer_or("n_routed_experts", 0);
  d.n_shared_experts = f.integer_or("n_shared_experts", 0);
  d.num_experts_per_tok = f.integer_or("num_experts_per_tok", 0);
  d.moe_intermediate_size = f.integer_or("moe_intermediate_size", 0);
  d.first_k_dense_replace = f.integer_or("first_k_dense_replace", 0);
  d.moe_layer_freq = f.integer_or("moe_layer_freq", 1);
  d.n_group = f.integer_or("n_group", 1);
  d.topk_group = f.integer_or("topk_group", 1);
  d.routed_scaling_factor = f.number_or("routed_scaling_factor", 1.0);
  d.norm_topk_prob = f.boolean_or("norm_topk_prob", v3);
  d.scoring_func = f.string_or("scoring_func", v3 ? "sigmoid" : "softmax");
  d.topk_method = f.string_or("topk_method", v3 ? "noaux_tc" : "greedy");
  d.num_nextn_predict_layers = f.integer_or("num_nextn_predict_layers", 0);

  BASALT_CHECK(d.q_lora_rank >= 0 && d.kv_lora_rank > 0 && d.qk_nope_head_dim > 0 &&
                   d.qk_rope_head_dim > 0 && d.qk_rope_head_dim % 2 == 0 && d.v_head_dim > 0 &&
                   d.q_lora_rank <= (1 << 16) && d.kv_lora_rank <= (1 << 16) &&
                   d.qk_nope_head_dim <= 1024 && d.qk_rope_head_dim <= 1024 && d.v_head_dim <= 1024,
               "{}: MLA needs positive kv_lora_rank, qk_nope_head_dim, v_head_dim and an even "
               "positive qk_rope_head_dim (q_lora_rank null or positive)", label);
  BASALT_CHECK(d.n_routed_experts >= 0 && d.n_routed_experts <= 4096 && d.n_shared_experts >= 0 &&
                   d.n_shared_experts <= 64 && d.first_k_dense_replace >= 0 &&
                   d.first_k_dense_replace <= c.num_layers && d.moe_layer_freq > 0 &&
                   d.num_nextn_predict_layers >= 0 && d.num_nextn_predict_layers <= 16,
               "{}: expert counts, first_k_dense_replace, moe_layer_freq or "
               "num_nextn_predict_layers out of range", label);
  if (d.n_routed_experts > 0) {
    BASALT_CHECK(d.moe_intermediate_size > 0 && d.moe_intermediate_size <= (1 << 22),
                 "{}: moe_intermediate_size must be positive", label);
    BASALT_CHECK(d.scoring_func == "softmax" || d.scoring_func == "sigmoid",
                 "{}: scoring_func '{}' is not supported (softmax or sigmoid)", label, d.scoring_func);
    BASALT_CHECK(d.topk_method == "greedy" || d.topk_method == "group_limited_greedy" ||
                     d.topk_method == "noaux_tc",
                 "{}: topk_method '{}' is not supported (greedy, group_limited_greedy or noaux_tc)",
                 label, d.topk_method);
    BASALT_CHECK(d.n_group > 0 && d.n_routed_experts % d.n_group == 0,
                 "{}: n_routed_experts ({}) cannot be divided into n_group ({}) equal groups", label,
                 d.n_routed_experts, d.n_group);
    BASALT_CHECK(d.topk_group > 0 && d.topk_group <= d.n_group,
                 "{}: topk_group ({}) must be in 1..n_group ({})", label, d.topk_group, d.n_group);
    const int64_t reachable = d.topk_method == "greedy"
                                  ? d.n_routed_experts
                                  : d.topk_group * (d.n_routed_experts / d.n_group);
    BASALT_CHECK(d.num_experts_per_tok > 0 && d.num_experts_per_tok <= reachable,
                 "{}: num_experts_per_tok ({}) must be in 1..{} (the experts of topk_group groups)",
                 label, d.num_experts_per_tok, reachable);
    BASALT_CHECK(d.topk_method != "noaux_tc" || d.scoring_func == "sigmoid",
                 "{}: topk_method noaux_tc needs scoring_func sigmoid", label);
    BASALT_CHECK(d.routed_scaling_factor > 0, "{}: routed_scaling_factor must be positive", label);
  }
  c.head_dim = d.qk_nope_head_dim + d.qk_rope_head_dim;
  c.rotary_dim = d.qk_rope_head_dim;
  parse_common_tail(f, label, c);
  BASALT_CHECK(!f.boolean_or("attention_bias", false), "{}: attention_bias is not supported for {}",
               label, c.model_type);
  c.sliding_window_per_layer.assign(static_cast<size_t>(c.num_layers), 0);

  if (f.has("quantization_config")) {
    const json& q = f.object().at("quantization_config");
    BASALT_CHECK(q.is_object(), "{}: quantization_config must be an object", label);
    const std::string sub = label + " (quantization_config)";
    Fields qf(q, sub);
    const std::string method = qf.string_or("quant_method", "");
    if (method == kIntQuantMethod) {
      parse_int_weights(qf, sub, c);
      return;
    }
    BASALT_CHECK(method == "fp8", "{}: quant_method '{}' is not supported (fp8 or {} only)", sub, method,
                 kIntQuantMethod);
    const std::string format = qf.string_or("fmt", "e4m3");
    BASALT_CHECK(format == "e4m3", "{}: fmt '{}' is not supported (e4m3 only)", sub, format);
    BASALT_CHECK(qf.has("weight_block_size"), "{}: missing field 'weight_block_size'", sub);
    const json& block = q.at("weight_block_size");
    BASALT_CHECK(block.is_array() && block.size() == 2 && block[0].is_number_integer() &&
                     block[1].is_number_integer(),
                 "{}: weight_block_size must be a list of two integers", sub);
    BASALT_CHECK(block[0].get<int64_t>() == 128 && block[1].get<int64_t>() == 128,
                 "{}: weight_block_size [{}, {}] is not supported (only [128, 128])", sub,
                 block[0].get<int64_t>(), block[1].get<int64_t>());
    d.fp8_block_weights = true;
  }
}

}  // namespace

std::string_view architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama: return "llama";
    case Architecture::kMistral: return "mistral";
    case Architecture::kQwen2: return "qwen2";
    case Architecture::kQwen3: return "qwen3";
    case Architecture::kDeepseekV2: return "deepseek_v2";
    case Architecture::kDeepseekV3: return "deepseek_v3";
  }
  return "?";
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& label) {
  BASALT_CHECK(j.is_object(), "{}: config must be a JSON object", label);
  Fields f(j, label);
  ModelConfig c;
  c.model_type = f.string_or("model_type", "");
  BASALT_CHECK(!c.model_type.empty(), "{}: missing field 'model_type'", label);
  c.architecture = parse_architecture(c.model_type, label);

  if (c.architecture == Architecture::kDeepseekV2 || c.architecture == Architecture::kDeepseekV3) {
    parse_deepseek(f, label, c);
    return c;
  }

  parse_sizes(f, label, c);
  c.eagle_head = f.boolean_or("basalt_eagle_head", false);
  BASALT_CHECK(c.num_heads % c.num_kv_heads == 0,
               "{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", label,
               c.num_heads, c.num_kv_heads);
  // head_dim may be explicit (Qwen3, Mistral Nemo); otherwise hidden / heads.
  c.head_dim = f.integer_or("head_dim", 0);
  if (c.head_dim == 0) {
    BASALT_CHECK(c.hidden_size % c.num_heads == 0,
                 "{}: hidden_size ({}) is not a multiple of num_attention_heads ({})", label,
                 c.hidden_size, c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
  }
  BASALT_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0 && c.head_dim <= 1024,
               "{}: head_dim ({}) must be even and at most 1024", label, c.head_dim);
  const double partial = f.number_or("partial_rotary_factor", 1.0);
  BASALT_CHECK(partial > 0 && partial <= 1, "{}: partial_rotary_factor must be in (0, 1]", label);
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  c.rotary_dim -= c.rotary_dim % 2;
  parse_common_tail(f, label, c);
  if (f.has("quantization_config")) {
    const json& q = j.at("quantization_config");
    BASALT_CHECK(q.is_object(), "{}: quantization_config must be an object", label);
    const std::string sub = label + " (quantization_config)";
    const Fields qf(q, sub);
    const std::string method = qf.string_or("quant_method", "");
    BASALT_CHECK(method == kIntQuantMethod, "{}: quant_method '{}' is not supported for {} (only {})", sub, method,
                 c.model_type, kIntQuantMethod);
    parse_int_weights(qf, sub, c);
  }
  switch (c.architecture) {
    case Architecture::kLlama:
    case Architecture::kMistral:
      c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
      c.mlp_bias = f.boolean_or("mlp_bias", false);
      break;
    case Architecture::kQwen2:
      c.qkv_bias = true;
      break;
    case Architecture::kQwen3:
      c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
      c.qk_norm = true;
      break;
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3:
      break;  // parsed by parse_deepseek above
  }

  // Sliding windows: Mistral applies sliding_window to every layer; Qwen2/3
  // only with use_sliding_window, from max_window_layers on; an explicit
  // layer_types list (transformers 5) wins.
  c.sliding_window_per_layer.assign(static_cast<size_t>(c.num_layers), 0);
  const int64_t window = f.integer_or("sliding_window", 0);
  BASALT_CHECK(window >= 0, "{}: sliding_window must be non-negative", label);
  if (window > 0) {
    if (f.has("layer_types")) {
      const json& types = j.at("layer_types");
      BASALT_CHECK(types.is_array() && static_cast<int64_t>(types.size()) == c.num_layers,
                   "{}: layer_types must list one entry per layer", label);
      for (size_t i = 0; i < types.size(); ++i) {
        BASALT_CHECK(types[i].is_string(), "{}: layer_types entries must be strings", label);
        if (types[i].get<std::string>() == "sliding_attention")
          c.sliding_window_per_layer[i] = static_cast<int32_t>(window);
      }
    } else if (c.architecture == Architecture::kMistral) {
      for (auto& w : c.sliding_window_per_layer) w = static_cast<int32_t>(window);
    } else if (f.boolean_or("use_sliding_window", false)) {
      const int64_t first = f.integer_or("max_window_layers", c.num_layers);
      BASALT_CHECK(first >= 0 && first <= c.num_layers, "{}: max_window_layers must be in [0, num_hidden_layers]",
                   label);
      for (int64_t i = first; i < c.num_layers; ++i)
        c.sliding_window_per_layer[static_cast<size_t>(i)] = static_cast<int32_t>(window);
    }
  }
  return c;
}

ModelConfig ModelConfig::load(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  BASALT_CHECK(std::filesystem::exists(path), "{}: no config.json in model directory", dir);
  ModelConfig c = from_json(read_json_file(path), path);
  // generation_config.json's eos ids are what generation stops on.
  const std::string gen_path = (std::filesystem::path(dir) / "generation_config.json").string();
  if (std::filesystem::exists(gen_path)) {
    json g = read_json_file(gen_path);
    if (g.is_object()) {
      Fields gf(g, gen_path);
      auto eos = gf.ids("eos_token_id");
      if (!eos.empty()) c.eos_token_ids = eos;
      check_token_ids(c, gen_path);
    }
  }
  return c;
}

}  // namespace basalt
