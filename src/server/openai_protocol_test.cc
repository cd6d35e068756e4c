// Request parsing: every field reaches SamplingParams, defaults match
// OpenAI's, and wrong types, ranges and malformed bodies are 400s that name
// the field.
#include "server/openai_protocol.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "server/request_fields.h"

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
    "skip_special_tokens": false, "priority": 2, "request_id": "abc-1", "truncate_prompt_tokens": 5,
    "allowed_token_ids": [9, 2, 9], "bad_words": ["no", " way out"]})");
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
  EXPECT_EQ(r.params.allowed_token_ids, (std::vector<int32_t>{9, 2, 9}));
  EXPECT_EQ(r.bad_words, (std::vector<std::string>{"no", " way out"}));
  EXPECT_FALSE(r.params.skip_special_tokens);
  EXPECT_EQ(r.priority, 2);
  EXPECT_EQ(r.request_id, "abc-1");
  EXPECT_EQ(r.truncate_prompt_tokens, 5);
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

TEST(OpenAiProtocol, ToolChoices) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  const std::string head = R"({"messages": [{"role": "user", "content": "x"}], )";
  EXPECT_EQ(parse_chat_request(head + tools + "}").tool_choice, ParsedRequest::ToolChoice::kAuto);
  EXPECT_EQ(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}]})").tool_choice,
            ParsedRequest::ToolChoice::kNone);
  EXPECT_EQ(parse_chat_request(head + tools + R"(, "tool_choice": "none"})").tool_choice,
            ParsedRequest::ToolChoice::kNone);
  const ParsedRequest required = parse_chat_request(head + tools + R"(, "tool_choice": "required",
                                                    "parallel_tool_calls": false})");
  EXPECT_EQ(required.tool_choice, ParsedRequest::ToolChoice::kRequired);
  EXPECT_FALSE(required.parallel_tool_calls);
  EXPECT_EQ(required.tools[0]["function"]["name"], "f");
  const ParsedRequest named =
      parse_chat_request(head + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})");
  EXPECT_EQ(named.tool_choice, ParsedRequest::ToolChoice::kNamed);
  EXPECT_EQ(named.tool_choice_name, "f");
  EXPECT_TRUE(named.parallel_tool_calls);
}

TEST(OpenAiProtocol, ChatMessagesAndOptions) {
  const ParsedRequest r = parse_chat_request(R"({
    "model": "m", "messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": []}],
    "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3,
    "chat_template_kwargs": {"enable_thinking": false},
    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1]["content"].get<std::string>(), "a\nb");
  EXPECT_TRUE(r.messages[2]["content"].is_null());
  EXPECT_FALSE(r.messages[2].contains("tool_calls"));  // an empty list is dropped, as vLLM does
  EXPECT_EQ(r.params.max_tokens, 9);
  EXPECT_TRUE(r.want_logprobs);
  EXPECT_EQ(r.params.logprobs, 3);
  EXPECT_FALSE(r.template_kwargs["enable_thinking"].get<bool>());
  EXPECT_TRUE(r.template_kwargs["tools"].is_array());
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_FALSE(r.add_special_tokens);
  // reasoning_effort reaches the template, unless its kwargs say otherwise.
  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(parse_chat_request("{" + messages + R"(, "reasoning_effort": "low"})").template_kwargs["reasoning_effort"],
            "low");
  EXPECT_EQ(parse_chat_request("{" + messages +
                               R"(, "reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}})")
                .template_kwargs["reasoning_effort"],
            "high");
  EXPECT_FALSE(parse_chat_request("{" + messages + "}").template_kwargs.contains("reasoning_effort"));
}

// What the SDKs send in an agent loop: an assistant turn with content null
// and tool_calls whose arguments are a JSON string, the tool's answer, and a
// message without content.
TEST(OpenAiProtocol, ToolCallMessagesReachTheTemplateAsTransformersExpects) {
  const ParsedRequest r = parse_chat_request(R"({"messages": [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
      {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18C"}]},
    {"role": "assistant"}]})");
  ASSERT_EQ(r.messages.size(), 4u);
  const auto& calls = r.messages[1]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_TRUE(r.messages[1]["content"].is_null());
  EXPECT_EQ(calls[0]["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(calls[0]["function"]["arguments"].dump(), R"({"city":"Paris","days":2})");  // key order kept
  EXPECT_EQ(calls[1]["function"]["arguments"], "not json");  // not JSON: passed as sent
  EXPECT_EQ(r.messages[2]["tool_call_id"], "call_1");
  EXPECT_EQ(r.messages[2]["content"], "18C");
  EXPECT_FALSE(r.messages[3].contains("content"));
}

std::string endpoints_name(unsigned e) {
  return e == kBothEndpoints ? "both" : e == kChatEndpoint ? "chat" : "completions";
}

std::string body_with(unsigned endpoint, const std::string& name, const std::string& value) {
  std::string base = endpoint == kChatEndpoint ? R"({"messages": [{"role": "user", "content": "x"}])"
                                               : R"({"prompt": "x")";
  const size_t dot = name.find('.');
  if (dot != std::string::npos)
    return base + R"(, "stream": true, ")" + name.substr(0, dot) + R"(": {")" + name.substr(dot + 1) + "\": " +
           value + "}}";
  return base + ", \"" + name + "\": " + value + "}";
}

bool parses(unsigned endpoint, const std::string& body) {
  try {
    if (endpoint == kChatEndpoint) parse_chat_request(body);
    else parse_completion_request(body);
    return true;
  } catch (const ApiError& e) {
    ADD_FAILURE() << body << ": " << e.what();
    return false;
  }
}

// Every row of the table, on each endpoint it names: unsupported fields are
// 400s naming the field unless null or an accepted value; ignored fields
// parse; fields of neither endpoint and unknown fields are 400s.
TEST(OpenAiProtocol, TheFieldTableIsEnforced) {
  for (const RequestField& f : request_fields()) {
    for (unsigned endpoint : {unsigned{kCompletionsEndpoint}, unsigned{kChatEndpoint}}) {
      const std::string name(f.name);
      if ((f.endpoints & endpoint) == 0) {
        if (name.find('.') != std::string::npos) continue;
        const ApiError e = error_of(endpoint == kChatEndpoint, body_with(endpoint, name, "1"));
        EXPECT_EQ(e.param(), name) << "field of the other endpoint: " << name;
        continue;
      }
      if (f.support == FieldSupport::kUnsupported) {
        const ApiError e = error_of(endpoint == kChatEndpoint, body_with(endpoint, name, std::string(f.refused_example)));
        EXPECT_EQ(e.status(), 400) << name;
        EXPECT_EQ(e.param(), name) << name << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
        EXPECT_TRUE(parses(endpoint, body_with(endpoint, name, "null")));
        for (const auto& v : nlohmann::json::parse(f.accepted.empty() ? "[]" : std::string(f.accepted)))
          EXPECT_TRUE(parses(endpoint, body_with(endpoint, name, v.dump())));
      } else if (f.support == FieldSupport::kIgnored) {
        EXPECT_TRUE(parses(endpoint, body_with(endpoint, name, R"({"any": "thing"})")));
      }
    }
  }
  for (bool chat : {false, true}) {
    const unsigned endpoint = chat ? kChatEndpoint : kCompletionsEndpoint;
    ApiError e = error_of(chat, body_with(endpoint, "max_token", "5"));  // a typo is not a default
    EXPECT_EQ(e.param(), "max_token");
    EXPECT_NE(std::string(e.what()).find("unrecognized"), std::string::npos);
    e = error_of(chat, body_with(endpoint, "stream_options.include_usag", "true"));
    EXPECT_EQ(e.param(), "stream_options.include_usag");
  }
}

// docs/SERVER.md lists the same table: a row per field with its endpoints,
// status and note.
TEST(OpenAiProtocol, TheDocsListTheFieldTable) {
  std::string expected;
  for (const RequestField& f : request_fields()) {
    std::string status = f.support == FieldSupport::kSupported ? "supported"
                         : f.support == FieldSupport::kIgnored ? "ignored"
                                                               : "refused";
    if (f.support == FieldSupport::kUnsupported) {
      const auto accepted = nlohmann::json::parse(f.accepted.empty() ? "[]" : std::string(f.accepted));
      status += " unless null";
      for (const auto& v : accepted) status += " or `" + v.dump() + "`";
    }
    expected += "| `" + std::string(f.name) + "` | " + endpoints_name(f.endpoints) + " | " + status + " | " +
                std::string(f.note) + " |\n";
  }
  std::ifstream in(std::string(BASALT_TESTDATA) + "/../docs/SERVER.md");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const std::string begin = "<!-- request-fields:begin -->\n", end = "<!-- request-fields:end -->";
  const size_t a = doc.find(begin), b = doc.find(end);
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  const std::string header = "| Field | Endpoints | Status | Notes |\n|---|---|---|---|\n";
  EXPECT_EQ(doc.substr(a + begin.size(), b - a - begin.size()), header + expected)
      << "docs/SERVER.md's request-field table should read:\n" << header << expected;
}

// Structural tags in the three spellings: response_format's object (its
// type dropped), vLLM's JSON text in structured_outputs and at the top.
TEST(OpenAiProtocol, StructuralTagsInEverySpelling) {
  const std::string tag = R"({"structures": [{"begin": "<f=a>", "schema": {"type": "integer"}, "end": "</f>"}], "triggers": ["<f="]})";
  const ParsedRequest a =
      parse_completion_request(R"({"prompt": "x", "response_format": {"type": "structural_tag", )" + tag.substr(1) + "}");
  ASSERT_TRUE(a.structured);
  EXPECT_EQ(a.structured->kind, StructuredOutputSpec::Kind::kStructuralTag);
  EXPECT_EQ(nlohmann::json::parse(a.structured->text), nlohmann::json::parse(tag));
  EXPECT_EQ(a.structured_param, "response_format");
  const nlohmann::json text = tag;
  const ParsedRequest b =
      parse_completion_request(R"({"prompt": "x", "structured_outputs": {"structural_tag": )" + text.dump() + "}}");
  EXPECT_EQ(b.structured->kind, StructuredOutputSpec::Kind::kStructuralTag);
  EXPECT_EQ(nlohmann::json::parse(b.structured->text), nlohmann::json::parse(tag));
  const ParsedRequest c = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "structural_tag": )" +
                                             text.dump() + "}");
  EXPECT_EQ(c.structured_param, "structural_tag");
  EXPECT_NE(to_ebnf(*c.structured).find("st-text"), std::string::npos);
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
      {false, R"({"prompt": "x", "allowed_token_ids": []})", "allowed_token_ids"},
      {false, R"({"prompt": "x", "bad_words": "no"})", "bad_words"},
      {false, R"({"prompt": "x", "structural_tag": {"structures": []}})", "structural_tag"},
      {false, R"({"prompt": "x", "structural_tag": "not json"})", "structural_tag"},
      {false, R"({"prompt": "x", "structured_outputs": {"structural_tag": "[1]"}})", "structured_outputs.structural_tag"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "max"})", "reasoning_effort"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": 1})", "reasoning_effort"},
      {false, R"({"prompt": "x", "bad_words": [1]})", "bad_words"},
      {false, R"({"prompt": "x", "bad_words": ["  "]})", "bad_words"},
      {false, R"({"prompt": "x", "bad_words": [""]})", "bad_words"},
      {false, R"({"prompt": "x", "allowed_token_ids": [1, -2]})", "allowed_token_ids"},
      {false, R"({"prompt": "x", "allowed_token_ids": "1"})", "allowed_token_ids"},
      {false, R"({"prompt": "x", "allowed_token_ids": [1], "response_format": {"type": "json_object"}})",
       "allowed_token_ids"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "allowed_token_ids": [1], "regex": "a+"})",
       "allowed_token_ids"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "allowed_token_ids": [1], "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})",
       "allowed_token_ids"},
      {false, R"({"prompt": "x", "response_format": {"type": "xml"}})", "response_format.type"},
      {false, R"({"prompt": "x", "response_format": "json"})", "response_format"},
      {false, R"({"prompt": "x", "response_format": {"type": "json_schema"}})", "response_format.json_schema"},
      {false, R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a"}}})",
       "response_format.json_schema.schema"},
      {false, R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {}, "x": 1}}})",
       "response_format.json_schema"},
      {false, R"({"prompt": "x", "guided_json": "not json"})", "guided_json"},
      {false, R"({"prompt": "x", "guided_json": 5})", "guided_json"},
      {false, R"({"prompt": "x", "guided_regex": ""})", "guided_regex"},
      {false, R"({"prompt": "x", "guided_choice": ["a", 1]})", "guided_choice"},
      {false, R"({"prompt": "x", "structured_outputs": {"json_object": 1}})", "structured_outputs.json_object"},
      {false, R"({"prompt": "x", "structured_outputs": {"whitespace_pattern": " "}})",
       "structured_outputs.whitespace_pattern"},
      {false, R"({"prompt": "x", "guided_regex": "a", "ebnf": "root ::= \"a\""})", "ebnf"},
      {false, R"({"prompt": "x", "guided_regex": "a", "min_tokens": 2})", "min_tokens"},
      {true, R"({"messages": []})", "messages"},
      {true, R"({"messages": "hi"})", "messages"},
      {true, R"({"messages": [{"content": "x"}]})", "messages"},
      {true, R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages"},
      {true, R"({"messages": [{"role": "user", "content": 5}]})", "messages"},
      {true, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})",
       "continue_final_message"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "f"}}})",
       "tool_choice"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", "tool_choice"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
                 "tool_choice": {"type": "function", "function": {"name": "g"}}})", "tool_choice"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
                 "tool_choice": {"type": "function"}})", "tool_choice"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
                 "tool_choice": "required", "response_format": {"type": "json_object"}})", "tool_choice"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
      {true, R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]})", "messages"},
      {true, R"({"messages": [{"role": "assistant", "tool_calls": "x"}]})", "messages"},
      {true, R"({"messages": [{"role": "tool", "tool_call_id": 5, "content": "x"}]})", "messages"},
      {true, R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", "messages"},
      {false, R"({"prompt": "x", "truncate_prompt_tokens": 0})", "truncate_prompt_tokens"},
      {false, R"({"prompt": "x", "request_id": "has space"})", "request_id"},
      {false, R"({"prompt": "x", "messages": []})", "messages"},
      {true, R"({"messages": [{"role": "user", "content": "x"}], "prompt": "x"})", "prompt"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(c.chat, c.body);
    EXPECT_EQ(e.status(), 400) << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body << ": " << e.what();
    EXPECT_NE(e.body().find("\"invalid_request_error\""), std::string::npos);
  }
}

// Each spelling of structured output becomes one spec; the schema keeps the
// order its properties were sent in (output order).
TEST(OpenAiProtocol, StructuredOutputSpellings) {
  using Kind = StructuredOutputSpec::Kind;
  struct Case {
    std::string extra;
    Kind kind;
    std::string text;
    std::string param;
  };
  const Case cases[] = {
      {R"("response_format": {"type": "json_object"})", Kind::kJsonObject, "", "response_format"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
          "schema": {"type": "object", "properties": {"z": {}, "a": {}}}}})",
       Kind::kJsonSchema, R"({"type":"object","properties":{"z":{},"a":{}}})", "response_format.json_schema.schema"},
      {R"("guided_json": "{\"properties\": {\"b\": {}, \"a\": {}}}")", Kind::kJsonSchema,
       R"({"properties":{"b":{},"a":{}}})", "guided_json"},
      {R"("structured_outputs": {"json": {"type": "string"}})", Kind::kJsonSchema, R"({"type":"string"})",
       "structured_outputs.json"},
      {R"("json_schema": true)", Kind::kJsonSchema, "true", "json_schema"},
      {R"("guided_regex": "[a-z]+")", Kind::kRegex, "[a-z]+", "guided_regex"},
      {R"("structured_outputs": {"regex": "x"})", Kind::kRegex, "x", "structured_outputs.regex"},
      {R"("regex": "x")", Kind::kRegex, "x", "regex"},
      {R"("guided_choice": ["a", "b"])", Kind::kChoice, R"(["a","b"])", "guided_choice"},
      {R"("guided_grammar": "root ::= \"a\"")", Kind::kGrammar, R"(root ::= "a")", "guided_grammar"},
      {R"("ebnf": "root ::= \"a\"")", Kind::kGrammar, R"(root ::= "a")", "ebnf"},
      {R"("structured_outputs": {"json_object": true})", Kind::kJsonObject, "", "structured_outputs.json_object"},
  };
  for (const Case& c : cases) {
    const ParsedRequest r = parse_completion_request(R"({"prompt": "x", )" + c.extra + "}");
    ASSERT_TRUE(r.structured.has_value()) << c.extra;
    EXPECT_EQ(r.structured->kind, c.kind) << c.extra;
    EXPECT_EQ(r.structured->text, c.text) << c.extra;
    EXPECT_EQ(r.structured_param, c.param) << c.extra;
    EXPECT_TRUE(r.structured->compact_json);
  }
  EXPECT_FALSE(parse_completion_request(R"({"prompt": "x", "response_format": {"type": "text"}})").structured);
  const ParsedRequest loose = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "x"}], "structured_outputs": {"json_object": true, "disable_any_whitespace": false}})");
  ASSERT_TRUE(loose.structured.has_value());
  EXPECT_FALSE(loose.structured->compact_json);
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
