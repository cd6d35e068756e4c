// The OpenAI API's request bodies, parsed and validated, and the response
// objects it expects back (the shapes vLLM and SGLang serve).
//
// Contract: parse_completion_request / parse_chat_request take an untrusted
// body and either return a ParsedRequest whose every field is within range
// (sampling parameters in SamplingParams' ranges, except the vocabulary
// checks that need the tokenizer) or throw ApiError with the HTTP status,
// the OpenAI error type and the name of the offending field. They never
// crash, whatever the bytes (a fuzz target checks this). Every top-level
// field (and every stream_options field) must be in the table of
// server/request_fields.h: a field Basalt does not implement, or does not
// know, is a 400 naming it, never silently dropped.
//
// Chat messages reach the chat template as transformers' apply_chat_template
// receives them from vLLM: content null stays null and absent content stays
// absent; content parts are joined into one string; an assistant message's
// tool_calls keep their order, with each function's JSON-string arguments
// parsed into an object (what tool-use templates iterate over) and an empty
// tool_calls list dropped; tool_call_id and name are kept.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "grammar/structured_output.h"
#include "runtime/sampling_params.h"

namespace basalt {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {},
           std::string type = "invalid_request_error")
      : std::runtime_error(message), status_(status), param_(std::move(param)), type_(std::move(type)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }
  // {"error": {"message", "type", "param", "code"}}
  std::string body() const;

 private:
  int status_;
  std::string param_;
  std::string type_;
};

std::string error_body(int status, const std::string& message, const std::string& type,
                       const std::string& param = {});

struct ProtocolLimits {
  int max_n = 128;
  int max_logprobs = kDefaultMaxLogprobs;
  size_t max_prompts = 256;    // entries of a prompt list
  size_t max_stop = 16;        // stop strings
  int max_json_depth = 32;
};

using PromptInput = std::variant<std::string, std::vector<int32_t>>;

struct ParsedRequest {
  bool chat = false;
  std::string model;  // empty when not given
  // Completions: one entry per prompt.
  std::vector<PromptInput> prompts;
  // Chat: messages normalized for templates (content a string, or null),
  // objects in the order the client sent their keys.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs, tools, documents
  std::string chat_template;  // a request's own template (vLLM's chat_template field)

  SamplingParams params;  // params.n samples per prompt
  // vLLM's bad_words as sent; the server tokenizes them into
  // params.bad_words_ids (it has the tokenizer).
  std::vector<std::string> bad_words;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats: usage in every chunk
  bool echo = false;
  // vLLM's: the prompt's and the output's token ids beside the text
  // (prompt_token_ids, token_ids), and logprobs naming tokens "token_id:N".
  bool return_token_ids = false;
  bool return_tokens_as_token_ids = false;
  bool want_logprobs = false;  // chat: logprobs; completions: logprobs given
  // vLLM's prompt_logprobs field: the response's prompt_logprobs with this
  // many alternatives per prompt token (-1: not asked). The engine's
  // params.prompt_logprobs is at least this (more with echo and logprobs).
  int prompt_logprobs = -1;
  bool add_special_tokens = true;
  int priority = 0;
  std::string cache_salt;  // separates radix-cache namespaces
  std::string user;
  std::string request_id;  // the client's id for the request (empty: none given)
  // Keep only the prompt's last k tokens: 0 off, -1 the context length.
  int64_t truncate_prompt_tokens = 0;
  // Tools (chat): the request's `tools` as sent (null: none), how the model
  // may use them, and whether one turn may hold several calls. tool_choice
  // defaults to auto with tools and none without, as OpenAI's does.
  enum class ToolChoice : uint8_t { kNone, kAuto, kRequired, kNamed };
  nlohmann::ordered_json tools;
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_choice_name;  // kNamed: the function
  bool parallel_tool_calls = true;
  // Reasoning (with the server's --reasoning-parser; server/chat_output_stream.h):
  // vLLM's include_reasoning, SGLang's separate_reasoning and stream_reasoning.
  bool include_reasoning = true;
  bool separate_reasoning = true;
  bool stream_reasoning = true;
  // What the output must match (response_format, structured_outputs,
  // guided_*), and the field it came from (errors name it).
  std::optional<StructuredOutputSpec> structured;
  std::string structured_param;
  // prediction (OpenAI's predicted outputs): text the output is expected to
  // repeat; its tokens are drafts verified as speculative decoding's, so the
  // output is the same with or without it.
  std::optional<std::string> prediction;
  // basalt_resume: a gateway resumes a stream whose replica failed
  // (docs/ROUTER.md). Per choice (its index among the prompts' samples),
  // the output the first attempt made and the bytes of its text already
  // forwarded; a finished choice is not run again; an unannounced one had
  // no event at the client, so its role delta or echo is still due. Needs
  // seed and stream.
  struct ResumedChoice {
    int index = 0;
    std::vector<int32_t> output_ids;
    int64_t text_offset = 0;
    bool finished = false;
    bool announced = true;
  };
  struct Resume {
    std::vector<ResumedChoice> choices;
    std::optional<int64_t> created;              // the first attempt's
    std::optional<int64_t> prior_cached_tokens;  // prior_usage.cached_tokens
  };
  std::optional<Resume> resume;
};

// Throws ApiError (400) for malformed JSON, wrong types and out-of-range values.
ParsedRequest parse_completion_request(std::string_view body, const ProtocolLimits& limits = {});
ParsedRequest parse_chat_request(std::string_view body, const ProtocolLimits& limits = {});

// Parses a JSON object body with the depth limit; ApiError on failure.
nlohmann::json parse_json_object(std::string_view body, int max_depth = 32);

}  // namespace basalt
