// Templates of workflow definitions (docs/WORKFLOWS.md §1): strings with
// `{{ PATH }}` placeholders, and JSON values whose strings are templates.
//
// Contract:
//  * A PATH is a root name (letters, digits, '_', not starting with a
//    digit) followed by any number of `.field` (the same characters) or
//    `[N]` (a decimal index below 2^31) selectors; spaces may surround it
//    inside the braces. Anything else between `{{` and `}}`, or a `{{`
//    without its `}}`, is a TemplateError naming the column. Nothing is
//    evaluated beyond looking the path up: a template cannot run code.
//  * render() looks each path up in `scope` (a JSON object whose members are
//    the roots). A string that is exactly one placeholder renders as the
//    value found (a list stays a list); otherwise the placeholders are
//    replaced by text: a string as it is, any other value as compact JSON.
//    A path that does not resolve (a missing root or field, an index past
//    the end, a selector into the wrong kind of value) is a TemplateError
//    naming the path and where it stopped.
//  * render_value() renders every string of a JSON value (object keys are
//    not templates), recursively; collect_paths() lists every path of a
//    value's strings, in order, for the validator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace basalt::workflow {

class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& message) : std::runtime_error(message) {}
};

struct PathSelector {
  bool is_index = false;
  std::string field;  // when !is_index
  size_t index = 0;   // when is_index
};

struct TemplatePath {
  std::string root;
  std::vector<PathSelector> selectors;
  std::string text;  // as written, without the braces' spaces (for errors)
};

class Template {
 public:
  // Throws TemplateError for a malformed placeholder.
  static Template parse(std::string_view text);

  // Whether the string is exactly one placeholder (it renders as a value).
  bool whole_value() const { return pieces_.size() == 1 && pieces_[0].is_path; }
  bool has_paths() const;
  std::vector<const TemplatePath*> paths() const;
  nlohmann::json render(const nlohmann::json& scope) const;

 private:
  struct Piece {
    bool is_path = false;
    std::string literal;
    TemplatePath path;
  };
  std::vector<Piece> pieces_;
};

// The value at `path` in `scope`; throws TemplateError when it does not resolve.
const nlohmann::json& resolve_path(const TemplatePath& path, const nlohmann::json& scope);

nlohmann::json render_value(const nlohmann::json& value, const nlohmann::json& scope);

// Every path in the strings of `value`, with the JSON pointer-like location
// of its string (`.body.items[2]`) relative to `value`. Throws
// TemplateError (prefixed with that location) for a malformed template.
struct LocatedPath {
  std::string where;
  TemplatePath path;
};
std::vector<LocatedPath> collect_paths(const nlohmann::json& value);

}  // namespace basalt::workflow
