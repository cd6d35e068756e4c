#include "server/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <optional>

#include "server/request_fields.h"

namespace basalt {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

std::string error_body(int status, const std::string& message, const std::string& type,
                       const std::string& param) {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}};
  if (!param.empty()) e["param"] = param;
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string ApiError::body() const { return error_body(status_, what(), type_, param_); }

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

// Deepest nesting of arrays and objects, outside strings; stops counting
// past `limit`.
int json_depth(std::string_view s, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

// A field, absent when missing or null (OpenAI clients send null for unset).
const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const json& obj, const char* name, bool fallback) {
  const json* v = field(obj, name);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(name, fmt::format("'{}' must be a boolean, not {}", name, type_name(*v)));
  return v->get<bool>();
}

double get_number(const json& obj, const char* name, double fallback, double lo, double hi) {
  const json* v = field(obj, name);
  if (!v) return fallback;
  if (!v->is_number()) bad(name, fmt::format("'{}' must be a number, not {}", name, type_name(*v)));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, x));
  return x;
}

int64_t get_int(const json& obj, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const json* v = field(obj, name);
  if (!v) return fallback;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad(name, fmt::format("'{}' must be between {} and {}", name, lo, hi));
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
             v->get<double>() == std::floor(v->get<double>()) && std::fabs(v->get<double>()) < 9e15) {
    x = static_cast<int64_t>(v->get<double>());
  } else {
    bad(name, fmt::format("'{}' must be an integer, not {}", name, type_name(*v)));
  }
  if (x < lo || x > hi) bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, x));
  return x;
}

std::string get_string(const json& obj, const char* name) {
  const json* v = field(obj, name);
  if (!v) return {};
  if (!v->is_string()) bad(name, fmt::format("'{}' must be a string, not {}", name, type_name(*v)));
  return v->get<std::string>();
}

int32_t token_id(const json& v, const char* param) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX) ||
      v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
    bad(param, fmt::format("'{}' must hold token ids (integers >= 0)", param));
  return static_cast<int32_t>(v.get<int64_t>());
}

std::vector<int32_t> id_list(const json& v, const char* param) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const json& x : v) ids.push_back(token_id(x, param));
  return ids;
}

// Every field must be in the table: unknown ones and unsupported values are
// refused by name.
void check_fields(const json& b, unsigned endpoint) {
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& name = it.key();
    const RequestField* row = find_request_field(name, endpoint);
    if (row == nullptr) {
      const char* other = endpoint == kChatEndpoint ? "/v1/chat/completions" : "/v1/completions";
      bad(name, fmt::format("unrecognized request field '{}' for {}", name, other));
    }
    if (row->support == FieldSupport::kUnsupported && !unsupported_value_accepted(*row, it.value()))
      bad(name, row->note.empty() ? fmt::format("'{}' is not supported", name)
                                  : fmt::format("'{}' is not supported: {}", name, row->note));
  }
  if (const json* options = field(b, "stream_options"); options && options->is_object()) {
    for (auto it = options->begin(); it != options->end(); ++it) {
      const std::string name = "stream_options." + it.key();
      if (find_request_field(name, endpoint) == nullptr)
        bad(name, fmt::format("unrecognized request field '{}'", name));
    }
  }
}

// tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}]
void check_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array");
  if (tools.size() > 1024) bad("tools", "'tools' has more than 1024 entries");
  for (const json& t : tools) {
    if (!t.is_object() || get_string(t, "type") != "function")
      bad("tools", "each tool must be an object with \"type\": \"function\"");
    const json* f = field(t, "function");
    if (f == nullptr || !f->is_object() || get_string(*f, "name").empty())
      bad("tools", "each tool needs a 'function' object with a non-empty 'name'");
    if (const json* params = field(*f, "parameters"); params && !params->is_object())
      bad("tools", "a tool's 'parameters' must be a JSON Schema object");
  }
}

// tool_choice: "none", "auto", "required", or {"type": "function",
// "function": {"name"}} naming one of the tools. Forcing a call needs tools
// to call, and the function named must be one of them.
void parse_tool_choice(const json& b, ParsedRequest& r) {
  const bool has_tools = r.tools.is_array() && !r.tools.empty();
  r.tool_choice = has_tools ? ParsedRequest::ToolChoice::kAuto : ParsedRequest::ToolChoice::kNone;
  const json* choice = field(b, "tool_choice");
  if (choice == nullptr) return;
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c == "none") r.tool_choice = ParsedRequest::ToolChoice::kNone;
    else if (c == "auto") r.tool_choice = has_tools ? ParsedRequest::ToolChoice::kAuto : ParsedRequest::ToolChoice::kNone;
    else if (c == "required") r.tool_choice = ParsedRequest::ToolChoice::kRequired;
    else
      bad("tool_choice",
          fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or a named function, not \"{}\"", c));
  } else if (choice->is_object()) {
    const json* f = field(*choice, "function");
    if (get_string(*choice, "type") != "function" || f == nullptr || !f->is_object() || get_string(*f, "name").empty())
      bad("tool_choice", "a named 'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    r.tool_choice = ParsedRequest::ToolChoice::kNamed;
    r.tool_choice_name = get_string(*f, "name");
  } else {
    bad("tool_choice", "'tool_choice' must be a string or an object");
  }
  const bool forced = r.tool_choice == ParsedRequest::ToolChoice::kRequired ||
                      r.tool_choice == ParsedRequest::ToolChoice::kNamed;
  if (forced && !has_tools) bad("tool_choice", "'tool_choice' forces a tool call, but the request has no 'tools'");
  if (r.tool_choice == ParsedRequest::ToolChoice::kNamed) {
    bool found = false;
    for (const auto& t : r.tools) found = found || t["function"]["name"] == r.tool_choice_name;
    if (!found) bad("tool_choice", fmt::format("'tool_choice' names the function '{}', which is not in 'tools'", r.tool_choice_name));
  }
  if (forced && r.structured)
    bad("tool_choice", fmt::format("'tool_choice' that forces a call cannot be combined with '{}': the call's "
                                   "arguments are already constrained by the function's parameters",
                                   r.structured_param));
  if (forced && !r.params.allowed_token_ids.empty())
    bad("allowed_token_ids", "'allowed_token_ids' cannot be combined with a 'tool_choice' that forces a call");
}

// An assistant message's tool_calls as templates expect them: arguments
// that are a JSON string become the object it encodes.
void normalize_tool_calls(ordered_json& message) {
  auto it = message.find("tool_calls");
  if (it == message.end() || it->is_null()) return;
  if (!it->is_array()) bad("messages", "'tool_calls' must be an array");
  if (it->empty()) {
    message.erase(it);
    return;
  }
  for (ordered_json& call : *it) {
    if (!call.is_object()) bad("messages", "each tool call must be an object");
    auto f = call.find("function");
    if (f == call.end() || !f->is_object()) bad("messages", "each tool call needs a 'function' object");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string()) bad("messages", "each tool call's function needs a 'name' string");
    auto args = f->find("arguments");
    if (args != f->end() && args->is_string()) {
      ordered_json parsed = ordered_json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded() && parsed.is_object()) *args = std::move(parsed);
    }
  }
}

// The sampling fields the two endpoints share.
// prediction: {"type": "content", "content": text, or an array of
// {"type": "text", "text"} parts, joined}. Returns the text.
std::string parse_prediction(const json& v) {
  constexpr const char* kParam = "prediction";
  if (!v.is_object()) bad(kParam, R"('prediction' must be an object {"type": "content", "content": ...})");
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it.key() != "type" && it.key() != "content") bad(kParam, fmt::format("'prediction' has no field '{}'", it.key()));
  const json* type = field(v, "type");
  if (type == nullptr || !type->is_string() || type->get<std::string>() != "content")
    bad(kParam, R"('prediction.type' must be "content")");
  const json* content = field(v, "content");
  if (content == nullptr) bad(kParam, "'prediction.content' is missing");
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array())
    bad(kParam, fmt::format("'prediction.content' must be a string or an array of text parts, not {}",
                            type_name(*content)));
  std::string text;
  for (const json& part : *content) {
    const json* part_type = part.is_object() ? field(part, "type") : nullptr;
    const json* part_text = part.is_object() ? field(part, "text") : nullptr;
    if (part_type == nullptr || !part_type->is_string() || part_type->get<std::string>() != "text" ||
        part_text == nullptr || !part_text->is_string() || part.size() != 2)
      bad(kParam, R"('prediction.content' parts must be {"type": "text", "text": "..."})");
    text += part_text->get<std::string>();
  }
  return text;
}

// basalt_resume: {"choices": [{"index", "output_token_ids", "text_offset",
// "finished", "announced"}], "created", "prior_usage": {"cached_tokens"}};
// every key checked, unknown ones refused.
void parse_resume(const json& v, ParsedRequest& r) {
  constexpr const char* kParam = "basalt_resume";
  const auto only_keys = [&](const json& obj, std::initializer_list<const char*> keys, const char* where) {
    for (auto it = obj.begin(); it != obj.end(); ++it)
      if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return it.key() == k; }))
        bad(kParam, fmt::format("'basalt_resume{}' has no field '{}'", where, it.key()));
  };
  if (!v.is_object()) bad(kParam, "'basalt_resume' must be an object");
  only_keys(v, {"choices", "created", "prior_usage"}, "");
  if (!r.stream) bad(kParam, "'basalt_resume' resumes a stream: 'stream' must be true");
  if (!r.params.seed) bad(kParam, "'basalt_resume' needs the 'seed' the first attempt ran with");
  ParsedRequest::Resume resume;
  const json* choices = field(v, "choices");
  if (choices == nullptr || !choices->is_array() || choices->size() > 4096)
    bad(kParam, "'basalt_resume.choices' must be an array (at most 4096 entries)");
  for (const json& c : *choices) {
    if (!c.is_object()) bad(kParam, "'basalt_resume.choices' entries must be objects");
    only_keys(c, {"index", "output_token_ids", "text_offset", "finished", "announced"}, ".choices[]");
    ParsedRequest::ResumedChoice rc;
    if (field(c, "index") == nullptr) bad(kParam, "'basalt_resume.choices[]' needs an 'index'");
    rc.index = static_cast<int>(get_int(c, "index", 0, 0, 65535));
    if (const json* ids = field(c, "output_token_ids")) {
      if (!ids->is_array() || ids->size() > (size_t{1} << 20))
        bad(kParam, "'basalt_resume.choices[].output_token_ids' must be an array of token ids");
      rc.output_ids = id_list(*ids, kParam);
    }
    rc.text_offset = get_int(c, "text_offset", 0, 0, std::numeric_limits<int32_t>::max());
    rc.finished = get_bool(c, "finished", false);
    rc.announced = get_bool(c, "announced", true);
    if (rc.finished && !rc.announced)
      bad(kParam, fmt::format("'basalt_resume.choices' index {} cannot have finished without an event", rc.index));
    for (const ParsedRequest::ResumedChoice& other : resume.choices)
      if (other.index == rc.index) bad(kParam, fmt::format("'basalt_resume.choices' names index {} twice", rc.index));
    resume.choices.push_back(std::move(rc));
  }
  if (field(v, "created") != nullptr) resume.created = get_int(v, "created", 0, 0, INT64_MAX);
  if (const json* prior = field(v, "prior_usage")) {
    if (!prior->is_object()) bad(kParam, "'basalt_resume.prior_usage' must be an object");
    only_keys(*prior, {"cached_tokens"}, ".prior_usage");
    if (field(*prior, "cached_tokens") != nullptr)
      resume.prior_cached_tokens = get_int(*prior, "cached_tokens", 0, 0, INT64_MAX);
  }
  r.resume = std::move(resume);
}

void parse_common(const json& b, ParsedRequest& r, const ProtocolLimits& limits) {
  r.model = get_string(b, "model");
  SamplingParams& p = r.params;
  p.n = static_cast<int>(get_int(b, "n", 1, 1, limits.max_n));
  if (const json* best_of = field(b, "best_of")) {
    if (!best_of->is_number_integer() || best_of->get<int64_t>() != p.n)
      bad("best_of", "'best_of' is not supported unless it equals n");
  }
  p.temperature = static_cast<float>(get_number(b, "temperature", 1.0, 0.0, 100.0));
  p.top_p = static_cast<float>(get_number(b, "top_p", 1.0, 0.0, 1.0));
  if (p.top_p <= 0.0f) bad("top_p", "'top_p' must be in (0, 1]");
  p.top_k = static_cast<int>(get_int(b, "top_k", 0, -1, std::numeric_limits<int32_t>::max()));
  p.min_p = static_cast<float>(get_number(b, "min_p", 0.0, 0.0, 1.0));
  p.presence_penalty = static_cast<float>(get_number(b, "presence_penalty", 0.0, -2.0, 2.0));
  p.frequency_penalty = static_cast<float>(get_number(b, "frequency_penalty", 0.0, -2.0, 2.0));
  p.repetition_penalty = static_cast<float>(get_number(b, "repetition_penalty", 1.0, 0.0, 100.0));
  if (p.repetition_penalty <= 0.0f) bad("repetition_penalty", "'repetition_penalty' must be > 0");
  if (const json* seed = field(b, "seed")) {
    if (!seed->is_number_integer()) bad("seed", "'seed' must be an integer");
    p.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
  }
  if (const json* bias = field(b, "logit_bias")) {
    if (!bias->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    if (bias->size() > 1024) bad("logit_bias", "'logit_bias' has more than 1024 entries");
    for (auto it = bias->begin(); it != bias->end(); ++it) {
      const std::string& key = it.key();
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || key.empty() || id < 0 || id > INT32_MAX)
        bad("logit_bias", fmt::format("'logit_bias' key '{}' is not a token id", key));
      if (!it.value().is_number() || !std::isfinite(it.value().get<double>()) ||
          std::fabs(it.value().get<double>()) > 100.0)
        bad("logit_bias", fmt::format("'logit_bias' value for {} must be a number in [-100, 100]", key));
      p.logit_bias[static_cast<int32_t>(id)] = it.value().get<float>();
    }
  }
  if (const json* stop = field(b, "stop")) {
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > limits.max_stop) bad("stop", fmt::format("'stop' has more than {} strings", limits.max_stop));
      for (const json& s : *stop) {
        if (!s.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of strings");
    }
    for (const std::string& s : p.stop)
      if (s.empty()) bad("stop", "'stop' strings must not be empty");
  }
  if (const json* words = field(b, "bad_words")) {
    if (!words->is_array() || words->size() > 1024)
      bad("bad_words", "'bad_words' must be an array of at most 1024 strings");
    for (const json& w : *words) {
      if (!w.is_string()) bad("bad_words", "'bad_words' must be an array of strings");
      const std::string& text = w.get_ref<const std::string&>();
      if (text.find_first_not_of(" \t\n\r\f\v") == std::string::npos || text.size() > 1024)
        bad("bad_words", "'bad_words' strings must hold more than spaces, and at most 1024 bytes");
      r.bad_words.push_back(text);
    }
  }
  if (const json* ids = field(b, "allowed_token_ids")) {
    if (!ids->is_array() || ids->empty() || ids->size() > (size_t{1} << 20))
      bad("allowed_token_ids", "'allowed_token_ids' must be a non-empty array of token ids");
    p.allowed_token_ids = id_list(*ids, "allowed_token_ids");
  }
  if (const json* ids = field(b, "stop_token_ids")) {
    if (!ids->is_array() || ids->size() > 1024) bad("stop_token_ids", "'stop_token_ids' must be an array of ids");
    p.stop_token_ids = id_list(*ids, "stop_token_ids");
  }
  p.min_tokens = static_cast<int>(get_int(b, "min_tokens", 0, 0, std::numeric_limits<int32_t>::max()));
  p.ignore_eos = get_bool(b, "ignore_eos", false);
  p.skip_special_tokens = get_bool(b, "skip_special_tokens", true);
  p.include_stop_str_in_output = get_bool(b, "include_stop_str_in_output", false);
  r.stream = get_bool(b, "stream", false);
  if (const json* options = field(b, "stream_options")) {
    if (!options->is_object()) bad("stream_options", "'stream_options' must be an object");
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    r.include_usage = get_bool(*options, "include_usage", false);
    r.continuous_usage = get_bool(*options, "continuous_usage_stats", false);
  }
  r.echo = get_bool(b, "echo", false);
  if (field(b, "prompt_logprobs") != nullptr) {
    // vLLM's: as vLLM, refused on a stream (but a streamed 0, which asks
    // for nothing beside the prompt tokens' own logprobs, is dropped).
    const int n = static_cast<int>(get_int(b, "prompt_logprobs", 0, 0, limits.max_logprobs));
    if (r.stream && n > 0)
      bad("prompt_logprobs", "'prompt_logprobs' is not available when 'stream' is true");
    if (!r.stream) r.prompt_logprobs = n;
  }
  r.return_token_ids = get_bool(b, "return_token_ids", false);
  r.return_tokens_as_token_ids = get_bool(b, "return_tokens_as_token_ids", false);
  r.priority = static_cast<int>(get_int(b, "priority", 0, -1000000, 1000000));
  r.cache_salt = get_string(b, "cache_salt");
  r.user = get_string(b, "user");
  r.request_id = get_string(b, "request_id");
  if (r.request_id.size() > 256) bad("request_id", "'request_id' is longer than 256 characters");
  for (unsigned char ch : r.request_id)
    if (ch < 0x21 || ch > 0x7e) bad("request_id", "'request_id' must be printable ASCII without spaces");
  r.truncate_prompt_tokens = get_int(b, "truncate_prompt_tokens", 0, -1, std::numeric_limits<int32_t>::max());
  if (r.truncate_prompt_tokens == 0 && field(b, "truncate_prompt_tokens") != nullptr)
    bad("truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 or positive");
  if (const json* resume = field(b, "basalt_resume")) parse_resume(*resume, r);
  if (const json* prediction = field(b, "prediction")) r.prediction = parse_prediction(*prediction);
}

// Structured output: the one field of a request that constrains the output
// (OpenAI's response_format, vLLM's structured_outputs and guided_*,
// SGLang's regex / ebnf / json_schema). The schema is taken from an
// order-keeping parse of the body, since property order is output order.
void parse_structured_output(std::string_view body, const json& b, ParsedRequest& r) {
  using Kind = StructuredOutputSpec::Kind;
  std::vector<std::string> given;
  std::optional<ordered_json> ordered;
  auto ordered_body = [&]() -> const ordered_json& {
    if (!ordered) ordered = ordered_json::parse(body);
    return *ordered;
  };
  auto set = [&](std::string param, Kind kind, std::string text) {
    given.push_back(param);
    StructuredOutputSpec spec;
    spec.kind = kind;
    spec.text = std::move(text);
    r.structured = std::move(spec);
    r.structured_param = std::move(param);
  };
  // A schema given as an object (or boolean), or as JSON text.
  auto schema_text = [&](const std::string& param, const ordered_json& v) -> std::string {
    if (v.is_object() || v.is_boolean()) return v.dump();
    if (v.is_string()) {
      const ordered_json parsed = ordered_json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean()))
        bad(param, fmt::format("'{}' must be a JSON schema (an object), or its JSON text", param));
      return parsed.dump();
    }
    bad(param, fmt::format("'{}' must be a JSON schema (an object)", param));
  };
  auto string_of = [&](const json& v, const std::string& param) {
    if (!v.is_string() || v.get<std::string>().empty())
      bad(param, fmt::format("'{}' must be a non-empty string", param));
    return v.get<std::string>();
  };
  // A structural tag given as JSON text (vLLM's structural_tag fields).
  auto tag_text = [&](const json& v, const std::string& param) {
    const ordered_json parsed =
        v.is_string() ? ordered_json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false)
                      : ordered_json(nullptr);
    if (!parsed.is_object())
      bad(param, fmt::format("'{}' must be the JSON text of an object with 'structures' and 'triggers'", param));
    return parsed.dump();
  };
  auto choices_of = [&](const json& v, const std::string& param) {
    if (!v.is_array() || v.empty()) bad(param, fmt::format("'{}' must be a non-empty array of strings", param));
    for (const json& c : v)
      if (!c.is_string()) bad(param, fmt::format("'{}' must be a non-empty array of strings", param));
    return v.dump();
  };

  if (const json* format = field(b, "response_format")) {
    if (!format->is_object()) bad("response_format", "'response_format' must be an object");
    const std::string type = get_string(*format, "type");
    if (type == "json_object") {
      set("response_format", Kind::kJsonObject, "");
    } else if (type == "json_schema") {
      const json* js = field(*format, "json_schema");
      if (js == nullptr || !js->is_object())
        bad("response_format.json_schema", "'response_format' of type json_schema needs a 'json_schema' object");
      for (const auto& [key, value] : js->items()) {
        static const char* kKnown[] = {"name", "schema", "strict", "description"};
        if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown))
          bad("response_format.json_schema", fmt::format("unknown field 'response_format.json_schema.{}'", key));
      }
      if (const json* strict = field(*js, "strict"); strict && !strict->is_boolean())
        bad("response_format.json_schema.strict", "'strict' must be a boolean");
      const ordered_json& schema = ordered_body()["response_format"]["json_schema"];
      if (!schema.contains("schema") || schema["schema"].is_null())
        bad("response_format.json_schema.schema", "'response_format.json_schema' needs a 'schema'");
      set("response_format.json_schema.schema", Kind::kJsonSchema,
          schema_text("response_format.json_schema.schema", schema["schema"]));
    } else if (type == "structural_tag") {
      // SGLang's and vLLM's: {"type", "structures", "triggers"} (checked
      // field by field when the grammar is made).
      ordered_json tag = ordered_body()["response_format"];
      tag.erase("type");
      set("response_format", Kind::kStructuralTag, tag.dump());
    } else if (type != "text") {
      bad("response_format.type",
          fmt::format("'response_format.type' must be \"text\", \"json_object\", \"json_schema\" or "
                      "\"structural_tag\", not \"{}\"",
                      type));
    }
  }
  if (const json* so = field(b, "structured_outputs")) {
    if (!so->is_object()) bad("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [key, value] : so->items()) {
      if (value.is_null()) continue;
      const std::string param = "structured_outputs." + key;
      if (key == "json") {
        set(param, Kind::kJsonSchema, schema_text(param, ordered_body()["structured_outputs"]["json"]));
      } else if (key == "regex") {
        set(param, Kind::kRegex, string_of(value, param));
      } else if (key == "choice") {
        set(param, Kind::kChoice, choices_of(value, param));
      } else if (key == "grammar") {
        set(param, Kind::kGrammar, string_of(value, param));
      } else if (key == "json_object") {
        if (!value.is_boolean()) bad(param, "'structured_outputs.json_object' must be a boolean");
        if (value.get<bool>()) set(param, Kind::kJsonObject, "");
      } else if (key == "structural_tag") {
        set(param, Kind::kStructuralTag, tag_text(value, param));
      } else if (key == "disable_any_whitespace") {
        if (!value.is_boolean()) bad(param, "'structured_outputs.disable_any_whitespace' must be a boolean");
      } else {
        bad(param, fmt::format("'{}' is not supported (json, regex, choice, grammar, json_object, "
                               "structural_tag and disable_any_whitespace are)", param));
      }
    }
  }
  if (field(b, "guided_json")) set("guided_json", Kind::kJsonSchema, schema_text("guided_json", ordered_body()["guided_json"]));
  if (field(b, "json_schema")) set("json_schema", Kind::kJsonSchema, schema_text("json_schema", ordered_body()["json_schema"]));
  if (const json* v = field(b, "guided_regex")) set("guided_regex", Kind::kRegex, string_of(*v, "guided_regex"));
  if (const json* v = field(b, "regex")) set("regex", Kind::kRegex, string_of(*v, "regex"));
  if (const json* v = field(b, "guided_choice")) set("guided_choice", Kind::kChoice, choices_of(*v, "guided_choice"));
  if (const json* v = field(b, "guided_grammar"))
    set("guided_grammar", Kind::kGrammar, string_of(*v, "guided_grammar"));
  if (const json* v = field(b, "ebnf")) set("ebnf", Kind::kGrammar, string_of(*v, "ebnf"));
  if (const json* v = field(b, "structural_tag")) set("structural_tag", Kind::kStructuralTag, tag_text(*v, "structural_tag"));
  if (given.size() > 1)
    bad(given[1], fmt::format("only one structured output may be given; this request has '{}' and '{}'", given[0],
                              given[1]));
  if (r.structured) {
    // vLLM's default writes JSON with any whitespace; Basalt's is compact
    // (as OpenAI's strict mode) unless the request turns it off.
    if (const json* so = field(b, "structured_outputs"))
      if (const json* ws = field(*so, "disable_any_whitespace")) r.structured->compact_json = ws->get<bool>();
    if (r.params.min_tokens > 0)
      bad("min_tokens", "'min_tokens' cannot be combined with structured output: the grammar decides where the "
                        "output may end");
  }
}

// allowed_token_ids is a token mask, as structured output is; a request
// takes one of them.
void check_one_mask(const ParsedRequest& r) {
  if (r.structured && !r.params.allowed_token_ids.empty())
    bad("allowed_token_ids", fmt::format("'allowed_token_ids' cannot be combined with '{}'", r.structured_param));
}

void set_max_tokens(const json& b, ParsedRequest& r, const char* name) {
  if (const json* v = field(b, name); v != nullptr) {
    r.params.max_tokens = static_cast<int>(get_int(b, name, 16, 0, std::numeric_limits<int32_t>::max()));
    r.max_tokens_given = true;
  }
}

}  // namespace

json parse_json_object(std::string_view body, int max_depth) {
  if (json_depth(body, max_depth) > max_depth)
    throw ApiError(400, fmt::format("the JSON body is nested deeper than {} levels", max_depth));
  json b = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (b.is_discarded()) throw ApiError(400, "the body is not valid JSON");
  if (!b.is_object()) throw ApiError(400, "the body must be a JSON object");
  return b;
}

ParsedRequest parse_completion_request(std::string_view body, const ProtocolLimits& limits) {
  const json b = parse_json_object(body, limits.max_json_depth);
  check_fields(b, kCompletionsEndpoint);
  ParsedRequest r;
  r.chat = false;
  parse_common(b, r, limits);
  parse_structured_output(body, b, r);
  check_one_mask(r);
  r.params.max_tokens = 16;  // OpenAI's default for completions
  set_max_tokens(b, r, "max_tokens");
  const json* prompt = field(b, "prompt");
  if (!prompt) bad("prompt", "'prompt' is required");
  if (prompt->is_string()) {
    r.prompts.emplace_back(prompt->get<std::string>());
  } else if (prompt->is_array()) {
    if (prompt->empty()) bad("prompt", "'prompt' must not be empty");
    if ((*prompt)[0].is_number()) {
      r.prompts.emplace_back(id_list(*prompt, "prompt"));
    } else {
      if (prompt->size() > limits.max_prompts)
        bad("prompt", fmt::format("'prompt' lists more than {} prompts", limits.max_prompts));
      for (const json& p : *prompt) {
        if (p.is_string()) r.prompts.emplace_back(p.get<std::string>());
        else if (p.is_array()) r.prompts.emplace_back(id_list(p, "prompt"));
        else bad("prompt", "'prompt' must be a string, an array of token ids, or an array of those");
      }
    }
  } else {
    bad("prompt", "'prompt' must be a string, an array of token ids, or an array of those");
  }
  for (const PromptInput& p : r.prompts) {
    if (const auto* text = std::get_if<std::string>(&p); text && text->empty())
      bad("prompt", "'prompt' must not be empty");
    if (const auto* ids = std::get_if<std::vector<int32_t>>(&p); ids && ids->empty())
      bad("prompt", "'prompt' must not be empty");
  }
  if (const json* suffix = field(b, "suffix"))
    if (!suffix->is_string() || !suffix->get<std::string>().empty())
      bad("suffix", "'suffix' is not supported");
  if (field(b, "logprobs") != nullptr) {
    r.params.logprobs = static_cast<int>(get_int(b, "logprobs", 0, 0, limits.max_logprobs));
    r.want_logprobs = true;
    r.params.sampled_logprob = true;
  }
  // Echo with logprobs covers the prompt's tokens too (OpenAI's legacy
  // completions; what lm-evaluation-harness reads for loglikelihoods).
  r.params.prompt_logprobs =
      std::max(r.prompt_logprobs, r.echo && r.want_logprobs ? r.params.logprobs : -1);
  r.add_special_tokens = get_bool(b, "add_special_tokens", true);
  if (r.prompts.size() * static_cast<size_t>(r.params.n) > static_cast<size_t>(limits.max_n) * 4)
    bad("n", "too many prompts times 'n' in one request");
  return r;
}

ParsedRequest parse_chat_request(std::string_view body, const ProtocolLimits& limits) {
  const json b = parse_json_object(body, limits.max_json_depth);
  check_fields(b, kChatEndpoint);
  ParsedRequest r;
  r.chat = true;
  parse_common(b, r, limits);
  parse_structured_output(body, b, r);
  check_one_mask(r);
  r.params.max_tokens = std::numeric_limits<int32_t>::max();  // the context's rest (server caps it)
  set_max_tokens(b, r, "max_tokens");
  set_max_tokens(b, r, "max_completion_tokens");
  const json* messages = field(b, "messages");
  if (!messages || !messages->is_array() || messages->empty())
    bad("messages", "'messages' must be a non-empty array");
  if (messages->size() > 4096) bad("messages", "'messages' has more than 4096 entries");
  // The template sees objects in the order the client wrote them (tojson of
  // tools and arguments must print keys as sent), so take them from an
  // order-keeping parse of the same, already validated, body.
  const ordered_json ob = ordered_json::parse(body);
  const ordered_json& ordered_messages = ob["messages"];
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    if (!m.is_object()) bad("messages", "each message must be an object");
    const std::string role = get_string(m, "role");
    if (role.empty()) bad("messages", "each message needs a 'role'");
    static const char* kRoles[] = {"system", "user", "assistant", "tool", "developer", "function"};
    if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles))
      bad("messages", fmt::format("unknown message role '{}'", role));
    ordered_json out = ordered_messages[i];  // keeps name, tool_calls, tool_call_id, ...
    const json* content = field(m, "content");
    if (content == nullptr) {
      // null stays null and absent stays absent, as the template would see them
    } else if (content->is_string()) {
      // kept as is
    } else if (content->is_array()) {
      std::string text;
      for (const json& part : *content) {
        if (!part.is_object() || get_string(part, "type") != "text")
          bad("messages", "only text content parts are supported");
        if (!text.empty()) text += "\n";
        text += get_string(part, "text");
      }
      out["content"] = text;
    } else {
      bad("messages", "message 'content' must be a string, an array of text parts, or null");
    }
    if (const json* id = field(m, "tool_call_id"); id && !id->is_string())
      bad("messages", "'tool_call_id' must be a string");
    if (const json* name = field(m, "name"); name && !name->is_string()) bad("messages", "'name' must be a string");
    if (role == "assistant") normalize_tool_calls(out);
    else if (field(m, "tool_calls") != nullptr) bad("messages", "only assistant messages carry 'tool_calls'");
    r.messages.push_back(std::move(out));
  }
  r.add_generation_prompt = get_bool(b, "add_generation_prompt", true);
  r.continue_final_message = get_bool(b, "continue_final_message", false);
  if (r.continue_final_message && r.add_generation_prompt)
    bad("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
  if (r.continue_final_message && (r.messages.back().value("role", "") != "assistant" ||
                                   !r.messages.back().contains("content") || !r.messages.back()["content"].is_string()))
    bad("continue_final_message", "'continue_final_message' needs a final assistant message with text content");
  if (const json* kwargs = field(b, "chat_template_kwargs")) {
    if (!kwargs->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r.template_kwargs = ob["chat_template_kwargs"];
  }
  if (const json* tools = field(b, "tools")) {
    check_tools(*tools);
    r.template_kwargs["tools"] = ob["tools"];
    r.tools = ob["tools"];
  }
  parse_tool_choice(b, r);
  r.parallel_tool_calls = get_bool(b, "parallel_tool_calls", true);
  if (field(b, "documents") != nullptr) r.template_kwargs["documents"] = ob["documents"];
  if (const json* effort = field(b, "reasoning_effort")) {
    static const char* kEfforts[] = {"none", "minimal", "low", "medium", "high"};
    if (!effort->is_string() ||
        std::find(std::begin(kEfforts), std::end(kEfforts), effort->get<std::string>()) == std::end(kEfforts))
      bad("reasoning_effort", "'reasoning_effort' must be one of none, minimal, low, medium, high");
    // For the templates that read it (gpt-oss's, as vLLM passes it); an
    // explicit chat_template_kwargs entry wins.
    if (!r.template_kwargs.contains("reasoning_effort")) r.template_kwargs["reasoning_effort"] = *effort;
  }
  r.chat_template = get_string(b, "chat_template");
  r.include_reasoning = get_bool(b, "include_reasoning", true);
  r.separate_reasoning = get_bool(b, "separate_reasoning", true);
  r.stream_reasoning = get_bool(b, "stream_reasoning", true);
  const bool logprobs = get_bool(b, "logprobs", false);
  const int top = static_cast<int>(get_int(b, "top_logprobs", 0, 0, limits.max_logprobs));
  if (top > 0 && !logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  r.want_logprobs = logprobs;
  r.params.sampled_logprob = logprobs;
  r.params.logprobs = top;
  r.params.prompt_logprobs = r.prompt_logprobs;
  r.add_special_tokens = get_bool(b, "add_special_tokens", false);
  return r;
}

}  // namespace basalt
