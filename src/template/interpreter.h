// Interpreter: evaluates a parsed template (ast.h) against a context
// (internal to src/template; the public API is jinja.h).
//
// Contract: one Interpreter renders one template once; it is not shared
// between threads. It enforces RenderOptions (output/string/list sizes,
// steps, depth) and reports every runtime error as basalt::Error prefixed
// with "jinja template line N: ".
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "template/ast.h"
#include "template/jinja.h"
#include "template/value.h"

namespace basalt::jinja {

struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Argument `index` by position or `name` by keyword; undefined when absent.
  Value get(size_t index, std::string_view name) const;
  bool has(size_t index, std::string_view name) const;
  // Throws when more positional args than `max_positional` or an unknown keyword is given.
  void check(std::string_view function, size_t max_positional,
             std::initializer_list<std::string_view> keywords) const;
};

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* find(const std::string& name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  Interpreter(std::shared_ptr<const TemplateData> data, const RenderOptions& options);
  // Clears every namespace created during the render, breaking reference
  // cycles a template can build (`{% set ns.me = ns %}`).
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // `context` is a dict (or undefined for no variables).
  std::string render(const Value& context);

  // Used by built-ins.
  const RenderOptions& options() const { return options_; }
  void check_string_size(size_t bytes) const;
  void check_list_size(size_t items) const;
  void step();
  Value call(const Value& callee, CallArgs& args);
  void track_namespace(const Value& ns) { namespaces_.push_back(ns); }
  Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, CallArgs& args);
  // Python iteration: list items, dict keys, string characters, undefined -> empty.
  ValueList iterate(const Value& v) const;
  Value getattr(const Value& obj, const std::string& name) const;
  Value getitem(const Value& obj, const Value& key) const;
  // "a.b.0" attribute paths as the map/sort/selectattr filters take them.
  Value get_attribute_path(const Value& obj, const Value& path) const;

 private:
  enum class Flow { Normal, Break, Continue };
  struct DepthGuard {
    explicit DepthGuard(Interpreter& in);
    ~DepthGuard() { --in.depth_; }
    Interpreter& in;
  };

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out);
  Flow exec_inner(const Stmt& s, const ScopePtr& scope, std::string& out);
  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out);
  void assign(const Target& t, const Value& v, const ScopePtr& scope, int line);
  Value make_macro(const Stmt& s, const ScopePtr& scope);
  void append(std::string& out, std::string_view text) const;

  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_inner(const Expr& e, const ScopePtr& scope);
  CallArgs eval_args(const Arguments& args, const ScopePtr& scope);
  Value binary(const std::string& op, const Value& a, const Value& b) const;
  bool compare_op(const std::string& op, const Value& a, const Value& b) const;

  std::shared_ptr<const TemplateData> data_;
  RenderOptions options_;
  ScopePtr globals_;
  size_t steps_ = 0;
  int depth_ = 0;
  // The rendered body of a filter block / block set, for the chain's innermost filter.
  std::vector<Value> filter_inputs_;
  std::vector<Value> namespaces_;
};

// Python string helpers shared with the filters.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
std::string ascii_lower(std::string s);
std::string ascii_upper(std::string s);
std::string html_escape(const std::string& s);
// printf-style formatting: "%s" % args, `format` filter.
std::string percent_format(const std::string& fmt, const ValueList& args);

// Built-in tables (builtins.cc).
using FilterFn = Value (*)(Interpreter& in, const Value& input, CallArgs& args);
using TestFn = bool (*)(Interpreter& in, const Value& input, CallArgs& args);
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// Bound methods of str/dict/list values; undefined when `name` is not one.
Value find_method(const Value& obj, const std::string& name);
void install_globals(Scope& globals);

}  // namespace basalt::jinja
