#include "server/request_fields.h"

#include <vector>

namespace basalt {
namespace {

constexpr FieldSupport S = FieldSupport::kSupported;
constexpr FieldSupport I = FieldSupport::kIgnored;
constexpr FieldSupport U = FieldSupport::kUnsupported;
constexpr unsigned C = kCompletionsEndpoint;
constexpr unsigned H = kChatEndpoint;
constexpr unsigned B = kBothEndpoints;

// Ordered as docs/SERVER.md lists them: the OpenAI fields, the vLLM and
// SGLang extensions, then what is ignored and what is refused.
const RequestField kFields[] = {
    // --- OpenAI ----------------------------------------------------------
    {"model", B, S, {}, {}, "must name the served model (--served-model-name) when given"},
    {"prompt", C, S, {}, {}, "text, token ids, or a list of those (one choice per prompt and sample)"},
    {"messages", H, S, {}, {}, "rendered with the chat template; text content parts only"},
    {"max_tokens", B, S, {}, {}, "default 16 (completions) or the rest of the context (chat)"},
    {"max_completion_tokens", H, S, {}, {}, "the chat name of max_tokens"},
    {"temperature", B, S, {}, {}, "0 is greedy"},
    {"top_p", B, S, {}, {}, ""},
    {"n", B, S, {}, {}, "at most the server's per-request sample limit (--max-n)"},
    {"best_of", B, S, {}, {}, "only equal to n (no extra candidates are sampled)"},
    {"stop", B, S, {}, {}, "a string or up to 16 strings, matched on the text"},
    {"seed", B, S, {}, {}, "sample i of n draws with a seed derived from it"},
    {"presence_penalty", B, S, {}, {}, ""},
    {"frequency_penalty", B, S, {}, {}, ""},
    {"logit_bias", B, S, {}, {}, ""},
    {"logprobs", B, S, {}, {}, "completions: alternatives per token; chat: a boolean"},
    {"top_logprobs", H, S, {}, {}, "alternatives per token, with logprobs: true"},
    {"echo", B, S, {}, {}, "completions: the prompt (with logprobs: each prompt token's logprob and alternatives, the first's null); chat: the final assistant message"},
    {"suffix", C, S, {}, {}, "only empty (no fill-in-the-middle)"},
    {"stream", B, S, {}, {}, "server-sent events"},
    {"stream_options", B, S, {}, {}, "an object of the fields below"},
    {"stream_options.include_usage", B, S, {}, {}, "a final chunk with usage"},
    {"stream_options.continuous_usage_stats", B, S, {}, {}, "usage in every chunk (vLLM)"},
    {"stream_options.include_obfuscation", B, I, {}, {}, "OpenAI pads chunks against side channels; nothing to pad here"},
    {"user", B, S, {}, {}, "logged"},
    {"response_format", B, S, {}, {}, "text, json_object, json_schema (its schema's keywords are enforced or refused by name), or structural_tag (structures and triggers)"},
    {"tools", H, S, {}, {}, "rendered by the chat template; the model's calls come back as tool_calls (--tool-call-parser)"},
    {"tool_choice", H, S, {}, {}, "none, auto, required or a named function; the last two force calls by grammar"},
    {"parallel_tool_calls", H, S, {}, {}, "false: a forced choice makes exactly one call"},
    {"reasoning_effort", H, S, {}, {}, "passed to the chat template as reasoning_effort (chat_template_kwargs' own wins)"},
    {"prediction", B, S, {}, {}, "predicted outputs: its tokens are drafts the model verifies, so the output is unchanged; usage.completion_tokens_details counts them"},
    // --- vLLM and SGLang extensions ---------------------------------------
    {"top_k", B, S, {}, {}, ""},
    {"min_p", B, S, {}, {}, ""},
    {"repetition_penalty", B, S, {}, {}, ""},
    {"min_tokens", B, S, {}, {}, ""},
    {"ignore_eos", B, S, {}, {}, ""},
    {"stop_token_ids", B, S, {}, {}, ""},
    {"include_stop_str_in_output", B, S, {}, {}, ""},
    {"skip_special_tokens", B, S, {}, {}, ""},
    {"truncate_prompt_tokens", B, S, {}, {}, "keep the prompt's last k tokens (-1: the context length)"},
    {"priority", B, S, {}, {}, "higher is admitted first"},
    {"cache_salt", B, S, {}, {}, "requests with different salts never share prefix-cache entries"},
    {"request_id", B, S, {}, {}, "the response id and log id (an X-Request-Id header wins)"},
    {"add_special_tokens", B, S, {}, {}, ""},
    {"allowed_token_ids", B, S, {}, {}, "only these ids are sampled; not with structured output or a forced tool call"},
    {"bad_words", B, S, {}, {}, "each word's tokens, alone or after a space (vLLM's rule), are never completed"},
    {"prompt_logprobs", B, S, {}, {}, "per prompt token after the first, its logprob, rank and decoded text and this many alternatives (prompt_logprobs: [null, {id: ...}, ...]; completions per choice, chat beside the choices); not on streams, where only 0 is taken (and dropped); the prompt is computed whole, not taken from the prefix cache"},
    {"include_reasoning", H, S, {}, {}, "with --reasoning-parser, false leaves the reasoning out of the response (it is parsed, so not in the content either)"},
    {"separate_reasoning", H, S, {}, {}, "with --reasoning-parser, false skips the parser for this request: the reasoning stays in the content"},
    {"stream_reasoning", H, S, {}, {}, "with --reasoning-parser, false sends a stream's reasoning_content as one delta once the reasoning is over"},
    {"return_token_ids", B, S, {}, {}, "prompt_token_ids and each choice's token_ids beside the text (streams: the prompt's in the first chunk, then each chunk's own)"},
    {"return_tokens_as_token_ids", B, S, {}, {}, "logprobs name each token \"token_id:N\""},
    {"basalt_resume", B, S, {}, {}, "a gateway resuming a stream elsewhere: the output so far per choice (docs/ROUTER.md)"},
    {"add_generation_prompt", H, S, {}, {}, ""},
    {"continue_final_message", H, S, {}, {}, ""},
    {"chat_template", H, S, {}, {}, "a Jinja template used instead of the model's"},
    {"chat_template_kwargs", H, S, {}, {}, "extra template variables"},
    {"documents", H, S, {}, {}, "passed to the chat template"},
    {"structured_outputs", B, S, {}, {}, "one of json, regex, choice, grammar (EBNF / GBNF), json_object, structural_tag; disable_any_whitespace"},
    {"guided_json", B, S, {}, {}, "vLLM's older name of structured_outputs.json"},
    {"guided_regex", B, S, {}, {}, "vLLM's older name of structured_outputs.regex"},
    {"guided_choice", B, S, {}, {}, "vLLM's older name of structured_outputs.choice"},
    {"guided_grammar", B, S, {}, {}, "vLLM's older name of structured_outputs.grammar"},
    {"json_schema", B, S, {}, {}, "SGLang's: a JSON schema (object or text)"},
    {"regex", B, S, {}, {}, "SGLang's: the output matches the regex"},
    {"ebnf", B, S, {}, {}, "SGLang's: the output is a sentence of the grammar"},
    {"structural_tag", B, S, {}, {}, "vLLM's: a structural tag as JSON text (as response_format's type structural_tag takes it as an object)"},
    // --- ignored: no effect on a self-hosted server ------------------------
    {"metadata", B, I, {}, {}, "OpenAI's tags for stored completions; nothing is stored"},
    {"prompt_cache_key", B, I, {}, {}, "OpenAI's cache-routing hint; the radix cache finds shared prefixes by itself"},
    {"safety_identifier", B, I, {}, {}, "OpenAI's abuse-tracking id"},
    {"guided_decoding_backend", B, I, {}, {}, "one grammar engine, Basalt's own, serves every request"},
    // --- refused unless null or the listed values ---------------------------
    {"store", B, U, "[false]", "true", "nothing is stored"},
    {"service_tier", B, U, R"(["auto", "default"])", R"("flex")", "one tier only"},
    {"verbosity", H, U, "[]", R"("low")", ""},
    {"modalities", H, U, R"([["text"]])", R"(["text", "audio"])", "text only"},
    {"audio", H, U, "[]", R"({"voice": "alloy"})", "text only"},
    {"web_search_options", H, U, "[]", "{}", ""},
    {"functions", H, U, "[[]]", R"([{"name": "f"}])", "use tools"},
    {"function_call", H, U, R"(["none"])", R"("auto")", "use tool_choice"},
    {"guided_whitespace_pattern", B, U, "[]", R"(" ")", "JSON whitespace is compact, or any with structured_outputs.disable_any_whitespace: false"},
    {"use_beam_search", B, U, "[false]", "true", "beam search is not implemented"},
    {"length_penalty", B, U, "[1, 1.0]", "0.5", "beam search only"},
    {"early_stopping", B, U, "[false]", "true", "beam search only"},
    {"spaces_between_special_tokens", B, U, "[true]", "false", ""},
    {"return_hidden_states", B, U, "[false]", "true", ""},
    {"logits_processors", B, U, "[[]]", R"(["x"])", ""},
    {"vllm_xargs", B, U, "[{}]", R"({"a": 1})", ""},
    {"kv_transfer_params", B, U, "[]", "{}", "no disaggregated prefill"},
    {"mm_processor_kwargs", B, U, "[{}]", R"({"a": 1})", "text only"},
    {"media_io_kwargs", B, U, "[{}]", R"({"a": 1})", "text only"},
    {"prompt_embeds", C, U, "[]", R"("AAAA")", "token ids or text only"},
    {"lora_path", B, U, "[]", R"("adapter")", "no LoRA adapters"},
    {"lora_request", B, U, "[]", "{}", "no LoRA adapters"},
    {"session_params", B, U, "[]", "{}", ""},
    {"no_stop_trim", B, U, "[false]", "true", "use include_stop_str_in_output"},
};

}  // namespace

std::span<const RequestField> request_fields() { return kFields; }

const RequestField* find_request_field(std::string_view name, unsigned endpoint) {
  for (const RequestField& f : kFields)
    if (f.name == name && (f.endpoints & endpoint) != 0) return &f;
  return nullptr;
}

bool unsupported_value_accepted(const RequestField& field, const nlohmann::json& value) {
  if (value.is_null()) return true;
  // Each row's accepted values, parsed once (thread-safe static init).
  static const std::vector<nlohmann::json> accepted = [] {
    std::vector<nlohmann::json> rows;
    for (const RequestField& f : kFields)
      rows.push_back(f.accepted.empty() ? nlohmann::json::array() : nlohmann::json::parse(f.accepted));
    return rows;
  }();
  const size_t row = static_cast<size_t>(&field - kFields);
  if (row >= accepted.size()) return false;
  for (const nlohmann::json& v : accepted[row])
    if (v == value) return true;
  return false;
}

}  // namespace basalt
