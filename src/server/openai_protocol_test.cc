// Request parsing: every field reaches SamplingParams, defaults match
// OpenAI's, and wrong types, ranges and malformed bodies are 400s that name
// the field.
#include "server/openai_protocol.h"

#include <gtest/gtest.h>

#include <string>

namespace basalt {
namespace {

ApiError error_of(bool chat, const std::string& body) {
  try {
    if (chat) parse_chat_request(body);
    else parse_completion_request(body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body;
  return ApiError(0, "");
}

TEST(OpenAiProtocol, CompletionFieldsReachTheSamplingParams) {
  const ParsedRequest r = parse_completion_request(R"({
    "model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "n": 3,
    "stop": ["a", "bc"], "seed": 42, "presence_penalty": 0.5, "frequency_penalty": -0.5,
    "logit_bias": {"12": -100, "7": 3.5}, "logprobs": 2, "echo": true, "user": "u",
    "stream": true, "stream_options": {"include_usage": true}, "top_k": 5, "min_p": 0.1,
    "repetition_penalty": 1.1, "min_tokens": 2, "ignore_eos": true, "stop_token_ids": [3, 4],
    "skip_special_tokens": false, "priority": 2, "unknown_field": {"x": 1}})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(r.prompts[0]), "hi");
  EXPECT_EQ(r.params.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.n, 3);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.params.seed, 42u);
  EXPECT_FLOAT_EQ(r.params.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.params.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.params.logit_bias.at(12), -100.0f);
  EXPECT_FLOAT_EQ(r.params.logit_bias.at(7), 3.5f);
  EXPECT_EQ(r.params.logprobs, 2);
  EXPECT_TRUE(r.want_logprobs);
  EXPECT_TRUE(r.echo);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.params.top_k, 5);
  EXPECT_FLOAT_EQ(r.params.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.params.repetition_penalty, 1.1f);
  EXPECT_EQ(r.params.min_tokens, 2);
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_EQ(r.params.stop_token_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_FALSE(r.params.skip_special_tokens);
  EXPECT_EQ(r.priority, 2);
}

TEST(OpenAiProtocol, PromptShapesAndDefaults) {
  ParsedRequest r = parse_completion_request(R"({"prompt": [1, 2, 3]})");
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[0]), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.params.max_tokens, 16);
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_FALSE(r.want_logprobs);
  r = parse_completion_request(R"({"prompt": ["a", [5], "b"], "max_tokens": null, "stop": "x"})");
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[1]), (std::vector<int32_t>{5}));
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"x"}));
  r = parse_completion_request(R"({"prompt": "p", "logprobs": 0})");
  EXPECT_TRUE(r.want_logprobs);
  EXPECT_EQ(r.params.logprobs, 0);
}

TEST(OpenAiProtocol, ChatMessagesAndOptions) {
  const ParsedRequest r = parse_chat_request(R"({
    "model": "m", "messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": []}],
    "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3,
    "chat_template_kwargs": {"enable_thinking": false}, "tools": [{"type": "function"}]})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1]["content"].get<std::string>(), "a\nb");
  EXPECT_TRUE(r.messages[2]["content"].is_null());
  EXPECT_TRUE(r.messages[2].contains("tool_calls"));
  EXPECT_EQ(r.params.max_tokens, 9);
  EXPECT_TRUE(r.want_logprobs);
  EXPECT_EQ(r.params.logprobs, 3);
  EXPECT_FALSE(r.template_kwargs["enable_thinking"].get<bool>());
  EXPECT_TRUE(r.template_kwargs["tools"].is_array());
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_FALSE(r.add_special_tokens);
}

TEST(OpenAiProtocol, BadInputsAreFourHundredsNamingTheField) {
  struct Case {
    bool chat;
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {false, "not json", ""},
      {false, "[1,2]", ""},
      {false, R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {false, R"({"prompt": "x", "temperature": -1})", "temperature"},
      {false, R"({"prompt": "x", "top_p": 0})", "top_p"},
      {false, R"({"prompt": "x", "n": 0})", "n"},
      {false, R"({"prompt": "x", "n": 100000})", "n"},
      {false, R"({"prompt": "x", "max_tokens": -1})", "max_tokens"},
      {false, R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens"},
      {false, R"({"prompt": "x", "max_tokens": 1e300})", "max_tokens"},
      {false, R"({"prompt": "x", "logprobs": 50})", "logprobs"},
      {false, R"({"prompt": "x", "stop": [1]})", "stop"},
      {false, R"({"prompt": "x", "stop": [""]})", "stop"},
      {false, R"({"prompt": "x", "logit_bias": {"abc": 1}})", "logit_bias"},
      {false, R"({"prompt": "x", "logit_bias": {"1": 500}})", "logit_bias"},
      {false, R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty"},
      {false, R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
      {false, R"({"prompt": [-1]})", "prompt"},
      {false, R"({"prompt": [1, "a"]})", "prompt"},
      {false, R"({"prompt": ""})", "prompt"},
      {false, R"({"prompt": []})", "prompt"},
      {false, R"({"prompt": 5})", "prompt"},
      {false, R"({})", "prompt"},
      {false, R"({"prompt": "x", "best_of": 3})", "best_of"},
      {false, R"({"prompt": "x", "response_format": {"type": "json_object"}})", "response_format"},
      {true, R"({"messages": []})", "messages"},
      {true, R"({"messages": "hi"})", "messages"},
      {true, R"({"messages": [{"content": "x"}]})", "messages"},
      {true, R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages"},
      {true, R"({"messages": [{"role": "user", "content": 5}]})", "messages"},
      {true, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})",
       "continue_final_message"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(c.chat, c.body);
    EXPECT_EQ(e.status(), 400) << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body << ": " << e.what();
    EXPECT_NE(e.body().find("\"invalid_request_error\""), std::string::npos);
  }
}

TEST(OpenAiProtocol, DeepNestingIsRejectedWithoutRecursion) {
  const std::string deep = "{\"prompt\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_EQ(error_of(false, deep).status(), 400);
  // Brackets inside strings do not count.
  const ParsedRequest r = parse_completion_request("{\"prompt\": \"" + std::string(1000, '[') + "\"}");
  EXPECT_EQ(std::get<std::string>(r.prompts[0]).size(), 1000u);
}

}  // namespace
}  // namespace basalt
