#include "template/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace basalt::jinja {

namespace {

void check_depth(int depth) {
  BASALT_CHECK(depth <= kMaxValueDepth, "value nested more than {} levels deep", kMaxValueDepth);
}

const std::string& empty_string() {
  static const std::string empty;
  return empty;
}

}  // namespace

// ---------------------------------------------------------------- UTF-8

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    auto b = static_cast<unsigned char>(s[i]);
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    char32_t c = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    bool ok = true;
    for (int k = 1; k < len; ++k) {
      auto cb = static_cast<unsigned char>(s[i + k]);
      if ((cb & 0xC0) != 0x80) {
        ok = false;
        break;
      }
      c = (c << 6) | (cb & 0x3F);
    }
    if (!ok || c > 0x10FFFF) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    out += c;
    i += len;
  }
  return out;
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

char32_t cp_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c >= 0x100 && c <= 0x137 && c != 0x130) return c | 1;
  if (c >= 0x139 && c <= 0x148) return (c & 1) ? c + 1 : c;
  if (c >= 0x14A && c <= 0x177) return c | 1;
  if (c == 0x178) return 0xFF;
  if (c >= 0x179 && c <= 0x17E) return (c & 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

char32_t cp_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x137 && c != 0x131) return c & ~static_cast<char32_t>(1);
  if (c >= 0x139 && c <= 0x148) return (c & 1) ? c : c - 1;
  if (c >= 0x14A && c <= 0x177) return c & ~static_cast<char32_t>(1);
  if (c >= 0x179 && c <= 0x17E) return (c & 1) ? c : c - 1;
  if (c >= 0x3B1 && c <= 0x3CB && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

bool cp_is_cased(char32_t c) { return cp_upper(c) != c || cp_lower(c) != c || c == 0xDF; }

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// ---------------------------------------------------------------- DictData

std::ptrdiff_t DictData::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (size_t i = 0; i < items.size(); ++i) {
    if (equals(items[i].first, key)) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;
}

std::ptrdiff_t DictData::find(std::string_view key) const {
  for (size_t i = 0; i < items.size(); ++i) {
    const Value& k = items[i].first;
    if (k.is_string() && k.as_string() == key) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;
}

void DictData::set(Value key, Value value) {
  auto at = find(key);
  if (at >= 0) {
    items[static_cast<size_t>(at)].second = std::move(value);
  } else {
    items.emplace_back(std::move(key), std::move(value));
  }
}

// ---------------------------------------------------------------- Value

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::Int;
  v.i_ = i;
  return v;
}

Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::Float;
  v.d_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::String;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::safe_string(std::string s) {
  Value v = string(std::move(s));
  v.b_ = true;
  return v;
}

Value Value::list(ValueList items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::List;
  v.list_ = std::make_shared<ListData>();
  v.list_->items = std::move(items);
  v.list_->is_tuple = is_tuple;
  return v;
}

Value Value::dict(ValuePairs items) {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::make_shared<DictData>();
  v.dict_->items = std::move(items);
  return v;
}

Value Value::dict(std::shared_ptr<DictData> data) {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::move(data);
  return v;
}

Value Value::callable(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::Callable;
  v.fn_ = std::make_shared<CallableData>(CallableData{std::move(name), std::move(fn)});
  return v;
}

Value Value::make_namespace(ValuePairs attrs) {
  Value v;
  v.kind_ = Kind::Namespace;
  v.ns_ = std::make_shared<NamespaceData>();
  v.ns_->attrs = std::move(attrs);
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::Float: return d_;
    case Kind::Int: return static_cast<double>(i_);
    case Kind::Bool: return b_ ? 1.0 : 0.0;
    default: return 0.0;
  }
}

const std::string& Value::undefined_hint() const {
  return (kind_ == Kind::Undefined && s_) ? *s_ : empty_string();
}

namespace {

template <typename Json>
Value value_from_json(const Json& j, int depth) {
  check_depth(depth);
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      auto u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::number(static_cast<double>(u));
    }
    case Json::value_t::number_float: return Value::number(j.template get<double>());
    case Json::value_t::string: return Value::string(j.template get<std::string>());
    case Json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(value_from_json(e, depth + 1));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      ValuePairs items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        items.emplace_back(Value::string(it.key()), value_from_json(it.value(), depth + 1));
      }
      return Value::dict(std::move(items));
    }
    default: fail("unsupported JSON value of type {} in template context", j.type_name());
  }
}

}  // namespace

Value Value::from_json(const nlohmann::json& j, int depth) { return value_from_json(j, depth); }
Value Value::from_json(const nlohmann::ordered_json& j, int depth) { return value_from_json(j, depth); }

nlohmann::json Value::to_json(int depth) const {
  check_depth(depth);
  switch (kind_) {
    case Kind::None: return nullptr;
    case Kind::Bool: return b_;
    case Kind::Int: return i_;
    case Kind::Float: return d_;
    case Kind::String: return *s_;
    case Kind::List: {
      auto arr = nlohmann::json::array();
      for (const auto& e : list_->items) arr.push_back(e.to_json(depth + 1));
      return arr;
    }
    case Kind::Dict: {
      auto obj = nlohmann::json::object();
      for (const auto& [k, v] : dict_->items) obj[k.is_string() ? k.as_string() : k.str()] = v.to_json(depth + 1);
      return obj;
    }
    default: fail("Object of type {} is not JSON serializable", type_name());
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b_;
    case Kind::Int: return i_ != 0;
    case Kind::Float: return d_ != 0.0;
    case Kind::String: return !s_->empty();
    case Kind::List: return !list_->items.empty();
    case Kind::Dict: return !dict_->items.empty();
    case Kind::Callable:
    case Kind::Namespace: return true;
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form: "d.ddde[+-]x".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  auto e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -5 + 1 && exponent < 16) {
    // Fixed notation, like Python's repr for 1e-4 <= |d| < 1e16.
    if (exponent >= 0) {
      auto int_len = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_len) {
        out += digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

namespace {

std::string string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    } else if (c == 0x2028 || c == 0x2029 || (c >= 0xD800 && c <= 0xDFFF)) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      utf8_append(out, c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::String: return *s_;
    default: return repr();
  }
}

std::string Value::repr(int depth) const {
  check_depth(depth);
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "None";
    case Kind::Bool: return b_ ? "True" : "False";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: return float_repr(d_);
    case Kind::String: return string_repr(*s_);
    case Kind::List: {
      std::string out = list_->is_tuple ? "(" : "[";
      for (size_t i = 0; i < list_->items.size(); ++i) {
        if (i) out += ", ";
        out += list_->items[i].repr(depth + 1);
      }
      if (list_->is_tuple && list_->items.size() == 1) out += ",";
      out += list_->is_tuple ? ")" : "]";
      return out;
    }
    case Kind::Dict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        if (i) out += ", ";
        out += dict_->items[i].first.repr(depth + 1) + ": " + dict_->items[i].second.repr(depth + 1);
      }
      return out + "}";
    }
    case Kind::Callable: return fmt::format("<function {}>", fn_->name);
    case Kind::Namespace: {
      std::string out = "<Namespace {";
      for (size_t i = 0; i < ns_->attrs.size(); ++i) {
        if (i) out += ", ";
        out += ns_->attrs[i].first.repr(depth + 1) + ": " + ns_->attrs[i].second.repr(depth + 1);
      }
      return out + "}>";
    }
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return list_->is_tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Callable: return "function";
    case Kind::Namespace: return "Namespace";
  }
  return "object";
}

bool equals(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.as_string() == b.as_string();
    case Value::Kind::List: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!equals(a.items()[i], b.items()[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::Dict: {
      const auto& da = a.dict_data();
      const auto& db = b.dict_data();
      if (da.items.size() != db.items.size()) return false;
      for (const auto& [k, v] : da.items) {
        auto at = db.find(k);
        if (at < 0 || !equals(v, db.items[static_cast<size_t>(at)].second, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::Callable: return &a.callable_data() == &b.callable_data();
    case Value::Kind::Namespace: return &a.namespace_data() == &b.namespace_data();
    default: return false;
  }
}

int compare(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order.
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i], depth + 1)) return compare(x[i], y[i], depth + 1);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

// ---------------------------------------------------------------- json.dumps

namespace {

void json_char(std::string& out, unsigned char c) {
  switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
      if (c < 0x20) {
        out += fmt::format("\\u{:04x}", c);
      } else {
        out += static_cast<char>(c);
      }
  }
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  if (!ensure_ascii) {
    for (unsigned char c : s) json_char(out, c);
  } else {
    for (char32_t c : utf8_decode(s)) {
      if (c < 0x80) {
        json_char(out, static_cast<unsigned char>(c));
      } else if (c < 0x10000) {
        out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
      } else {
        uint32_t v = static_cast<uint32_t>(c) - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::String: return k.as_string();
    case Value::Kind::Bool: return k.as_bool() ? "true" : "false";
    case Value::Kind::None: return "null";
    case Value::Kind::Int: return std::to_string(k.as_int());
    case Value::Kind::Float: return json_float(k.as_double());
    default: fail("keys must be str, int, float, bool or None, not {}", k.type_name());
  }
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& o, int depth) {
  check_depth(depth);
  auto newline = [&](int level) {
    if (!o.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: out += json_float(v.as_double()); return;
    case Value::Kind::String: json_string(out, v.as_string(), o.ensure_ascii); return;
    case Value::Kind::List: {
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        newline(depth + 1);
        dump(out, items[i], o, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::Dict: {
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, val] : v.dict_data().items) entries.emplace_back(json_key(k), &val);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& x, const auto& y) { return x.first < y.first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += o.item_separator;
        newline(depth + 1);
        json_string(out, entries[i].first, o.ensure_ascii);
        out += o.key_separator;
        dump(out, *entries[i].second, o, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: fail("Object of type {} is not JSON serializable", v.type_name());
  }
}

}  // namespace

std::string json_dumps(const Value& value, const JsonDumpOptions& options) {
  std::string out;
  dump(out, value, options, 0);
  return out;
}

}  // namespace basalt::jinja
