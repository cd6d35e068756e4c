// libFuzzer target: arbitrary bytes as /v1/completions and
// /v1/chat/completions bodies. The parsers must return or throw ApiError
// (a 400-class answer) and nothing else: no crash, no other exception, no
// sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/openai_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    try {
      const basalt::ParsedRequest r =
          chat ? basalt::parse_chat_request(body) : basalt::parse_completion_request(body);
      if (r.params.n < 1) __builtin_trap();
    } catch (const basalt::ApiError& e) {
      if (e.status() < 400 || e.status() >= 500) __builtin_trap();
    }
  }
  return 0;
}
