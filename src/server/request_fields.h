// The request fields of /v1/completions and /v1/chat/completions that Basalt
// knows, each with what Basalt does with it: the one table that the parser
// enforces, the tests walk and docs/SERVER.md mirrors.
//
// Contract:
//  * kSupported fields are parsed by openai_protocol.cc and act as OpenAI or
//    vLLM define them (the note says where Basalt accepts only part of a
//    field's values).
//  * kIgnored fields are accepted and have no effect, because they have none
//    on a self-hosted server either (OpenAI's platform-side storage tags, a
//    cache-routing hint the radix cache makes moot). The note says why.
//  * kUnsupported fields are refused with a 400 naming the field, unless the
//    value is null or one of `accepted` (the values that ask for what Basalt
//    does anyway, such as use_beam_search: false).
//  * A field in no row is refused with a 400 naming it, as OpenAI does: a
//    misspelt field must not silently become a default.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

namespace basalt {

enum class FieldSupport { kSupported, kIgnored, kUnsupported };

// Which endpoint bodies a field belongs to.
enum EndpointMask : unsigned { kCompletionsEndpoint = 1, kChatEndpoint = 2, kBothEndpoints = 3 };

struct RequestField {
  std::string_view name;  // "stream_options.include_usage" for a nested field
  unsigned endpoints;     // EndpointMask bits
  FieldSupport support;
  // kUnsupported only: a JSON array of the values that are accepted anyway
  // (null always is), and one value that must be refused (the tests send it).
  std::string_view accepted;
  std::string_view refused_example;
  std::string_view note;  // one line for the docs
};

std::span<const RequestField> request_fields();

// The row for `name` on that endpoint, or null.
const RequestField* find_request_field(std::string_view name, unsigned endpoint);

// Whether an kUnsupported field's value is one it accepts anyway.
bool unsupported_value_accepted(const RequestField& field, const nlohmann::json& value);

}  // namespace basalt
