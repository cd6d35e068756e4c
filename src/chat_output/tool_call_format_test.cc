// Tool call formats: their names, and which one each real chat template
// (testdata/chat_templates, as published with the models) renders.
#include "chat_output/tool_call_format.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "testing/error_test_util.h"

namespace basalt {
namespace {

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(BASALT_TESTDATA) + "/chat_templates/" + name);
  EXPECT_TRUE(in) << "missing template " << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ToolCallFormat, NamesRoundTrip) {
  for (const ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral,
                                      ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31})
    EXPECT_EQ(parse_tool_call_format(to_string(format)), format);
  EXPECT_EQ(parse_tool_call_format("qwen"), ToolCallFormat::kHermes);
  EXPECT_EQ(parse_tool_call_format("qwen25"), ToolCallFormat::kHermes);
  EXPECT_EQ(to_string(ToolCallFormat::kDeepSeekV31), "deepseek_v31");
  const std::string error = testing::error_of([] { parse_tool_call_format("pythonic"); });
  EXPECT_CONTAINS(error, "\"pythonic\"");
  EXPECT_CONTAINS(error, "hermes, qwen, qwen25, llama3_json, mistral, deepseek_v3, deepseek_v31");
}

TEST(ToolCallFormat, DetectsTheFormatOfRealTemplates) {
  const struct {
    const char* file;
    ToolCallFormat format;
  } kKnown[] = {
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", ToolCallFormat::kHermes},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::kHermes},
      {"Qwen-Qwen3-0.6B.jinja", ToolCallFormat::kHermes},
      {"Qwen-Qwen3-4B-Instruct-2507.jinja", ToolCallFormat::kHermes},
      {"Qwen-QwQ-32B.jinja", ToolCallFormat::kHermes},
      {"vllm-tool_chat_template_hermes.jinja", ToolCallFormat::kHermes},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat::kLlama3Json},
      {"meta-llama-Llama-3.2-11B-Vision-Instruct.jinja", ToolCallFormat::kLlama3Json},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolCallFormat::kLlama3Json},
      {"vllm-tool_chat_template_llama3.1_json.jinja", ToolCallFormat::kLlama3Json},
      {"vllm-tool_chat_template_llama3.2_json.jinja", ToolCallFormat::kLlama3Json},
      {"vllm-tool_chat_template_llama4_json.jinja", ToolCallFormat::kLlama3Json},
      {"mistralai-Mistral-7B-Instruct-v0.3.jinja", ToolCallFormat::kMistral},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolCallFormat::kMistral},
      {"mistralai-Ministral-3-14B-Reasoning-2512.jinja", ToolCallFormat::kMistral},
      {"unsloth-mistral-Devstral-Small-2507.jinja", ToolCallFormat::kMistral},
      {"vllm-tool_chat_template_mistral_parallel.jinja", ToolCallFormat::kMistral},
      {"deepseek-ai-DeepSeek-V3-Base.jinja", ToolCallFormat::kDeepSeekV3},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ToolCallFormat::kDeepSeekV3},
      {"deepseek-ai-DeepSeek-R1-initial.jinja", ToolCallFormat::kDeepSeekV3},
      {"vllm-tool_chat_template_deepseekv3.jinja", ToolCallFormat::kDeepSeekV3},
      {"vllm-tool_chat_template_deepseekr1.jinja", ToolCallFormat::kDeepSeekV3},
      {"deepseek-ai-DeepSeek-V3.1.jinja", ToolCallFormat::kDeepSeekV31},
      {"vllm-tool_chat_template_deepseekv31.jinja", ToolCallFormat::kDeepSeekV31},
  };
  for (const auto& [file, format] : kKnown) {
    const std::optional<ToolCallFormat> detected = detect_tool_call_format(read_template(file));
    ASSERT_TRUE(detected.has_value()) << file;
    EXPECT_EQ(to_string(*detected), to_string(format)) << file;
  }
}

TEST(ToolCallFormat, TheBundledModelWritesHermesCalls) {
  std::ifstream in(std::string(BASALT_TESTDATA) + "/../models/basalt-mini/tokenizer_config.json");
  ASSERT_TRUE(in.good());
  const std::string chat_template = nlohmann::json::parse(in)["chat_template"].get<std::string>();
  EXPECT_EQ(detect_tool_call_format(chat_template), ToolCallFormat::kHermes);
}

TEST(ToolCallFormat, OtherStylesAreNotDetected) {
  // No tool calls at all, or calls in a format none of these parses.
  for (const char* file : {
           "Qwen-Qwen3-Coder.jinja",            // <tool_call><function=...>
           "Qwen-Qwen3.5-4B.jinja",             // the same XML style
           "zai-org-GLM-4.5.jinja",             // <tool_call>name<arg_key>
           "tiiuae-Falcon3-3B-Instruct.jinja",  // a JSON array inside <tool_call>
           "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
           "vllm-tool_chat_template_granite_20b_fc.jinja",
           "vllm-tool_chat_template_llama3.2_pythonic.jinja",
           "meetkai-functionary-medium-v3.1.jinja",
           "fireworks-ai-llama-3-firefunction-v2.jinja",
           "llama-cpp-DeepSeek-V3.2.jinja",
           "meta-llama-Meta-Llama-3-8B-Instruct.jinja",
           "google-gemma-3-1b-it.jinja",
           "microsoft-phi-4.jinja",
           "moonshotai-Kimi-K2-Instruct.jinja",
           "basalt-mini.jinja",  // the bundled model's template before it took Hermes' format
       }) {
    const std::optional<ToolCallFormat> detected = detect_tool_call_format(read_template(file));
    EXPECT_FALSE(detected.has_value()) << file << " detected as " << to_string(*detected);
  }
  EXPECT_FALSE(detect_tool_call_format("").has_value());
}

}  // namespace
}  // namespace basalt
