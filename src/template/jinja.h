// Jinja2 chat templates: a parser and interpreter for the subset of Jinja2
// that Hugging Face chat templates use, rendering byte-for-byte what Python's
// jinja2 renders in transformers' environment.
//
// Contract: JinjaTemplate::parse() lexes and parses the source once (throwing
// basalt::Error "jinja template line N: ..." for syntax errors); render() may
// then be called any number of times, from any number of threads, with a
// context (a JSON object whose keys become template variables). The
// environment is transformers' `_compile_jinja_template`: an immutable
// sandbox (lists/dicts cannot be mutated, `_`-prefixed attributes are
// hidden), trim_blocks and lstrip_blocks on, the loopcontrols extension
// (break/continue), the `{% generation %}` tag, globals raise_exception() and
// strftime_now(), and transformers' tojson (json.dumps with ensure_ascii=False,
// indent/separators/sort_keys). Undefined behaves like jinja2's default
// Undefined: it prints as "", is false, iterates as empty, and raises on
// attribute access, calls and arithmetic.
//
// Every runtime error (type errors, undefined access, raise_exception(), an
// unknown filter or test) throws basalt::Error naming the template line.
// Hostile templates cannot crash or hang the process: output size, string
// and list sizes, evaluation steps, and nesting/recursion depth are capped by
// RenderOptions and exceeding a cap throws basalt::Error.
//
// Known differences from Python: str.upper/lower/title/capitalize map ASCII,
// Latin-1, Latin Extended-A, Greek and Cyrillic letters only; integers are
// 64-bit (overflow is an error, not a bigint); recursive for loops,
// loop.changed, include/import/extends and *args/**kwargs are not supported
// (each is a clear error).
#pragma once

#include <cstddef>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace basalt::jinja {
struct TemplateData;
}

namespace basalt {

struct RenderOptions {
  // Caps against hostile templates; the defaults leave room for very large
  // real prompts.
  size_t max_output_bytes = 64u << 20;   // also the cap on any one string
  size_t max_list_items = 1u << 20;      // any one list, dict or range()
  size_t max_steps = 50'000'000;         // expressions evaluated + loop iterations
  int max_depth = 400;                   // nesting of evaluation (macro recursion included)
  // The time strftime_now() formats (local time); nullopt means now.
  std::optional<std::tm> now;
};

class JinjaTemplate {
 public:
  static JinjaTemplate parse(std::string_view source);

  // `context` must be a JSON object (or null for no variables).
  // Use ordered_json to keep the key order of dicts (tojson prints keys in
  // the order the context gives them, as Python does); nlohmann::json sorts keys.
  std::string render(const nlohmann::json& context, const RenderOptions& options = {}) const;
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const jinja::TemplateData> data_;
};

// Renders a chat template the way transformers' apply_chat_template does:
// the context is {messages, tools: None, documents: None,
// add_generation_prompt} with every key of `extra` (a JSON object, e.g.
// bos_token, eos_token, tools, documents, enable_thinking) merged over it.
std::string render_chat_template(const std::string& source, const nlohmann::ordered_json& messages,
                                 bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                                 const RenderOptions& options = {});

}  // namespace basalt
