#include "model/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace basalt {
namespace {

using nlohmann::json;

json llama_config() {
  return json{{"model_type", "llama"},      {"vocab_size", 128256}, {"hidden_size", 2048},
              {"intermediate_size", 8192},  {"num_hidden_layers", 16},
              {"num_attention_heads", 32},  {"num_key_value_heads", 8},
              {"rms_norm_eps", 1e-5},       {"rope_theta", 500000.0},
              {"max_position_embeddings", 131072}, {"tie_word_embeddings", true},
              {"bos_token_id", 128000},     {"eos_token_id", json::array({128001, 128008, 128009})},
              {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                                {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}}};
}

TEST(ModelConfig, ReadsLlama32Shape) {
  const ModelConfig c = ModelConfig::from_json(llama_config(), "config.json");
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.bos_token_id, 128000);
}

TEST(ModelConfig, ReadsTransformers5RopeParameters) {
  json j = llama_config();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0},
                          {"original_max_position_embeddings", 32768}};
  const ModelConfig c = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.factor, 4.0);
}

TEST(ModelConfig, Qwen3HasExplicitHeadDimAndQkNorm) {
  json j = llama_config();
  j["model_type"] = "qwen3";
  j["head_dim"] = 128;
  const ModelConfig c = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
}

TEST(ModelConfig, Qwen2HasQkvBias) {
  json j = llama_config();
  j["model_type"] = "qwen2";
  j.erase("rope_scaling");
  EXPECT_TRUE(ModelConfig::from_json(j, "config.json").qkv_bias);
}

TEST(ModelConfig, SlidingWindowPerLayer) {
  json j = llama_config();
  j["model_type"] = "mistral";
  j["sliding_window"] = 4096;
  ModelConfig c = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c.sliding_window_per_layer.front(), 4096);
  j["model_type"] = "qwen2";
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 10;
  c = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c.sliding_window_per_layer[9], 0);
  EXPECT_EQ(c.sliding_window_per_layer[10], 4096);
}

void expect_error(const json& j, const std::string& needle) {
  try {
    ModelConfig::from_json(j, "dir/config.json");
    FAIL() << "expected an error mentioning " << needle;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_NE(m.find("dir/config.json"), std::string::npos) << m;
  }
}

TEST(ModelConfig, ReadsTheIntegerWeightFormat) {
  json j = llama_config();
  EXPECT_EQ(ModelConfig::from_json(j, "config.json").int_weights.bits, 0);
  j["quantization_config"] = {{"quant_method", "basalt-int"}, {"bits", 4}, {"group_size", 64}};
  ModelConfig c = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c.int_weights.bits, 4);
  EXPECT_EQ(c.int_weights.group_for(2048), 64);
  j["quantization_config"] = {{"quant_method", "basalt-int"}, {"bits", 8}, {"group_size", -1}};
  c = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c.int_weights.bits, 8);
  EXPECT_EQ(c.int_weights.group_for(2048), 2048);  // one scale per row

  for (const json& bad : {json{{"quant_method", "basalt-int"}, {"bits", 6}, {"group_size", 32}},
                          json{{"quant_method", "basalt-int"}, {"bits", 8}, {"group_size", 48}},
                          json{{"quant_method", "basalt-int"}, {"bits", 8}, {"group_size", 0}},
                          json{{"quant_method", "basalt-int"}, {"bits", 8}}}) {
    j["quantization_config"] = bad;
    expect_error(j, "quantization_config");
  }
  j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}};
  expect_error(j, "quant_method 'awq' is not supported");
  j["quantization_config"] = "int8";
  expect_error(j, "quantization_config must be an object");
}

TEST(ModelConfig, RejectsBadInput) {
  json j = llama_config();
  j["num_key_value_heads"] = 5;
  expect_error(j, "num_key_value_heads");
  j = llama_config();
  j["hidden_size"] = "big";
  expect_error(j, "hidden_size");
  j = llama_config();
  j.erase("vocab_size");
  expect_error(j, "vocab_size");
  j = llama_config();
  j["model_type"] = "gpt_bigcode";
  expect_error(j, "gpt_bigcode");
  j = llama_config();
  j["rope_scaling"]["rope_type"] = "longrope";
  expect_error(j, "longrope");
  j = llama_config();
  j["hidden_act"] = "gelu";
  expect_error(j, "gelu");
  j = llama_config();
  j["num_hidden_layers"] = -1;
  expect_error(j, "positive");
  expect_error(json::array(), "object");
  // Every value a forward pass or the server depends on is range-checked
  // at load, not at the first request.
  j = llama_config();
  j["max_position_embeddings"] = -5;
  expect_error(j, "max_position_embeddings");
  j = llama_config();
  j["rms_norm_eps"] = 0;
  expect_error(j, "rms_norm_eps");
  j = llama_config();
  j["eos_token_id"] = 128256;
  expect_error(j, "eos_token_id");
  j = llama_config();
  j["bos_token_id"] = -1;
  expect_error(j, "bos_token_id");
  j = llama_config();
  j["sliding_window"] = 4096;
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 99;
  expect_error(j, "max_window_layers");
}

}  // namespace
}  // namespace basalt
