// libFuzzer target for the Jinja chat-template interpreter (src/template).
//
// Contract under test: for any bytes as template source, JinjaTemplate::parse
// either returns a template or throws basalt::Error, and render() with a
// typical chat context either returns text within the output cap or throws
// basalt::Error; it never crashes, never trips a sanitizer, never throws
// anything else, and finishes quickly because RenderOptions caps steps,
// sizes and depth. A crash, a sanitizer report, any other exception or an
// output over the cap is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "template/jinja.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi <b>\"there\"</b> é"},
      {"role": "assistant", "content": "<think>x</think>ok",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [true, null]}}}]},
      {"role": "tool", "content": "{\"r\": 2.5}"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "documents": null,
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>"
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  basalt::RenderOptions options;
  options.max_output_bytes = 1 << 16;
  options.max_list_items = 1 << 12;
  options.max_steps = 200'000;
  options.max_depth = 200;
  std::tm fixed{};
  fixed.tm_year = 125;
  fixed.tm_mday = 1;
  options.now = fixed;
  try {
    basalt::JinjaTemplate tpl = basalt::JinjaTemplate::parse(source);
    std::string out = tpl.render(context(), options);
    if (out.size() > options.max_output_bytes) std::abort();
  } catch (const basalt::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
