// Value: the data model of the Jinja interpreter (src/template/jinja.h).
//
// Contract: a Value is one of Python's types as jinja2 sees them: undefined,
// None, bool, int (int64), float (double), str (UTF-8), list or tuple, dict
// (insertion-ordered, keys are str/int/bool/None), a callable (built-in
// function, bound method, macro) or a namespace() object. Values are cheap to
// copy: strings, lists and dicts are shared and never mutated once built (the
// HF environment is an *immutable* sandbox); a namespace is the one mutable,
// shared object. Operations that Python would reject (mixed-type ordering,
// str + int, ...) throw basalt::Error with a Python-like message; recursive
// operations (repr, JSON, equality) refuse values nested deeper than
// kMaxValueDepth instead of overflowing the stack.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace basalt::jinja {

inline constexpr int kMaxValueDepth = 256;

class Value;
struct CallArgs;
class Interpreter;

using ValueList = std::vector<Value>;
using ValuePairs = std::vector<std::pair<Value, Value>>;
// A built-in function or bound method. `interp` gives access to limits, the
// clock and (for macros) rendering.
using NativeFunction = std::function<Value(CallArgs& args, Interpreter& interp)>;

struct ListData {
  ValueList items;
  bool is_tuple = false;
};

struct DictData {
  ValuePairs items;
  // Index of `key` in items, or -1.
  std::ptrdiff_t find(const Value& key) const;
  std::ptrdiff_t find(std::string_view key) const;
  // Replaces an existing key's value or appends (used while building).
  void set(Value key, Value value);
};

struct CallableData {
  std::string name;
  NativeFunction fn;
};

struct NamespaceData {
  ValuePairs attrs;  // string keys
};

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable, Namespace };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  // A Markup string (the `safe`/`escape` filters): `+` HTML-escapes a plain
  // str operand added to it, as markupsafe.Markup does.
  static Value safe_string(std::string s);
  static Value list(ValueList items, bool is_tuple = false);
  static Value dict(ValuePairs items);  // keys must be unique
  static Value dict(std::shared_ptr<DictData> data);
  static Value callable(std::string name, NativeFunction fn);
  static Value make_namespace(ValuePairs attrs);

  // nlohmann::json -> Value (objects keep their order when the json type does).
  static Value from_json(const nlohmann::json& j, int depth = 0);
  static Value from_json(const nlohmann::ordered_json& j, int depth = 0);
  // Value -> nlohmann::json; throws for undefined/callables.
  nlohmann::json to_json(int depth = 0) const;

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  // int, float or bool (Python's bool is an int).
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_safe_string() const { return kind_ == Kind::String && b_; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::List && list_->is_tuple; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_callable() const { return kind_ == Kind::Callable; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? (b_ ? 1 : 0) : i_; }
  double as_double() const;
  const std::string& as_string() const { return *s_; }
  const ValueList& items() const { return list_->items; }
  const DictData& dict_data() const { return *dict_; }
  const CallableData& callable_data() const { return *fn_; }
  NamespaceData& namespace_data() const { return *ns_; }
  // For undefined: what was looked up ("'x' is undefined").
  const std::string& undefined_hint() const;

  // Python truthiness.
  bool truthy() const;
  // Python str(): what {{ value }} prints (undefined prints "").
  std::string str() const;
  // Python repr().
  std::string repr(int depth = 0) const;
  // jinja2's type name in messages: 'dict object', 'str object', ...
  std::string type_name() const;

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;  // string, or undefined hint
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<CallableData> fn_;
  std::shared_ptr<NamespaceData> ns_;
};

// Python ==.
bool equals(const Value& a, const Value& b, int depth = 0);
// Python <, throws TypeError-like Error for unorderable types. Returns -1/0/1.
int compare(const Value& a, const Value& b, int depth = 0);
// Python repr() of a float (shortest round-trip, 1e+16 style exponents).
std::string float_repr(double d);

// json.dumps(value, ensure_ascii=False, indent=indent, separators=...,
// sort_keys=sort_keys) as transformers' tojson filter calls it. indent is
// nullopt for None, otherwise the indent string.
struct JsonDumpOptions {
  std::optional<std::string> indent;
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
  bool ensure_ascii = false;  // escape non-ASCII as \uXXXX (surrogate pairs above U+FFFF)
};
std::string json_dumps(const Value& value, const JsonDumpOptions& options);

// UTF-8 helpers: code points of `s` (invalid bytes map to U+FFFD) and back.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
// Simple case mapping of one code point (ASCII, Latin-1, Latin Extended-A,
// Greek, Cyrillic); other code points map to themselves.
char32_t cp_upper(char32_t c);
char32_t cp_lower(char32_t c);
bool cp_is_cased(char32_t c);
// Python's str.isspace() for one code point.
bool py_isspace(char32_t c);

}  // namespace basalt::jinja
