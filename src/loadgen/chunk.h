// The reading of one OpenAI streaming chunk (an event's data, as
// server/sse.h reports it) by the load generator.
//
// Contract: read_chunk(data) reads one event's data from /v1/completions or
// /v1/chat/completions and never throws: "[DONE]" is kDone; a JSON object
// with "error" is kError; one whose choices carry text (completions `text`,
// chat `delta.content` or `delta.reasoning_content`) non-empty is kToken;
// anything else that is a JSON object (a role delta, an empty final chunk,
// a usage-only chunk) is kOther. Any chunk may also carry usage (an object
// with integer completion_tokens), reported in usage_completion_tokens (-1
// when absent). Text that is not JSON, JSON that is not an object, or
// fields of the wrong type are kMalformed with a message.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace basalt::loadgen {

struct ChunkInfo {
  enum class Kind { kToken, kOther, kDone, kError, kMalformed };
  Kind kind = Kind::kOther;
  std::string text;     // kToken: the text; kError/kMalformed: the message
  int64_t usage_completion_tokens = -1;
  int64_t usage_prompt_tokens = -1;
};

ChunkInfo read_chunk(std::string_view data);

}  // namespace basalt::loadgen
