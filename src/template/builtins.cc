// Built-in filters, tests, methods of str/dict/list values, and globals, with
// jinja2 3.1's semantics (and transformers' tojson, raise_exception and
// strftime_now).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "template/interpreter.h"

namespace basalt::jinja {

namespace {

// ---------------------------------------------------------------- helpers

bool is_ascii(const std::string& s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

size_t cp_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

int64_t to_int_arg(const Value& v, std::string_view what) {
  BASALT_CHECK(v.is_int() || v.is_bool(), "{} must be an integer, got {}", what, v.type_name());
  return v.as_int();
}

Value none_if_undefined(const Value& v) { return v.is_undefined() ? Value::none() : v; }

std::string title_case(const std::string& s) {
  // jinja2's title filter: words start after '-', whitespace, '(', '{', '[', '<'.
  std::string out;
  bool start = true;
  for (char32_t c : utf8_decode(s)) {
    if (c == '-' || py_isspace(c) || c == '(' || c == '{' || c == '[' || c == '<') {
      start = true;
      utf8_append(out, c);
      continue;
    }
    if (start && c == 0xDF) {
      out += "Ss";
    } else {
      utf8_append(out, start ? cp_upper(c) : cp_lower(c));
    }
    start = false;
  }
  return out;
}

std::string py_title(const std::string& s) {
  // str.title(): a cased letter after an uncased character is upper-cased, others lowered.
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    bool cased = cp_is_cased(c);
    if (cased && !prev_cased && c == 0xDF) {
      out += "Ss";
    } else {
      utf8_append(out, cased ? (prev_cased ? cp_lower(c) : cp_upper(c)) : c);
    }
    prev_cased = cased;
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out;
  bool first = true;
  for (char32_t c : utf8_decode(s)) {
    if (first && c == 0xDF) {
      out += "Ss";
    } else {
      utf8_append(out, first ? cp_upper(c) : cp_lower(c));
    }
    first = false;
  }
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count,
                        Interpreter& in) {
  std::string out;
  if (from.empty()) {
    auto cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size()) utf8_append(out, cps[i]);
      in.check_string_size(out.size());
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += to;
    in.check_string_size(out.size());
    pos = at + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  in.check_string_size(out.size());
  return out;
}

ValueList split_whitespace(const std::string& s, int64_t maxsplit) {
  ValueList out;
  auto cps = utf8_decode(s);
  size_t i = 0, n = cps.size();
  while (i < n) {
    while (i < n && py_isspace(cps[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t end = n;
      while (end > i && py_isspace(cps[end - 1])) --end;
      out.push_back(Value::string(utf8_encode(std::u32string_view(cps).substr(i, end - i))));
      return out;
    }
    size_t start = i;
    while (i < n && !py_isspace(cps[i])) ++i;
    out.push_back(Value::string(utf8_encode(std::u32string_view(cps).substr(start, i - start))));
  }
  return out;
}

ValueList split_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  BASALT_CHECK(!sep.empty(), "empty separator");
  ValueList out;
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    size_t at = s.find(sep, pos);
    if (at == std::string::npos) break;
    out.push_back(Value::string(s.substr(pos, at - pos)));
    pos = at + sep.size();
  }
  out.push_back(Value::string(s.substr(pos)));
  return out;
}

ValueList rsplit_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  BASALT_CHECK(!sep.empty(), "empty separator");
  ValueList out;
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep.size()) break;
    size_t at = s.rfind(sep, end - sep.size());
    if (at == std::string::npos) break;
    out.push_back(Value::string(s.substr(at + sep.size(), end - at - sep.size())));
    end = at;
  }
  out.push_back(Value::string(s.substr(0, end)));
  std::reverse(out.begin(), out.end());
  return out;
}

ValueList splitlines(const std::string& s, bool keepends) {
  ValueList out;
  auto cps = utf8_decode(s);
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    char32_t c = cps[i];
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++i;
      continue;
    }
    size_t eol = i;
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    ++i;
    out.push_back(Value::string(utf8_encode(std::u32string_view(cps).substr(start, (keepends ? i : eol) - start))));
    start = i;
  }
  if (start < cps.size()) out.push_back(Value::string(utf8_encode(std::u32string_view(cps).substr(start))));
  return out;
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

// Sort key: attribute lookup and case folding as jinja2's sort/unique/min/max do.
Value sort_key(Interpreter& in, const Value& item, const Value& attribute, bool case_sensitive) {
  Value v = attribute.is_undefined() || attribute.is_none() ? item : in.get_attribute_path(item, attribute);
  if (!case_sensitive && v.is_string()) return Value::string(ascii_lower(v.as_string()));
  return v;
}

void sort_values(ValueList& items, std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int c = compare(keys[a], keys[b]);
    return reverse ? c > 0 : c < 0;
  });
  ValueList sorted;
  sorted.reserve(items.size());
  for (size_t i : order) sorted.push_back(items[i]);
  items = std::move(sorted);
}

// ---------------------------------------------------------------- filters

Value f_length(Interpreter&, const Value& v, CallArgs&) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return Value::integer(0);
    case Value::Kind::String: return Value::integer(static_cast<int64_t>(cp_length(v.as_string())));
    case Value::Kind::List: return Value::integer(static_cast<int64_t>(v.items().size()));
    case Value::Kind::Dict: return Value::integer(static_cast<int64_t>(v.dict_data().items.size()));
    default: fail("object of type '{}' has no len()", v.type_name());
  }
}

Value f_string(Interpreter&, const Value& v, CallArgs&) { return Value::string(v.str()); }
Value f_safe(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_safe_string()) return v;
  return Value::safe_string(v.str());
}
Value f_upper(Interpreter&, const Value& v, CallArgs&) { return Value::string(ascii_upper(v.str())); }
Value f_lower(Interpreter&, const Value& v, CallArgs&) { return Value::string(ascii_lower(v.str())); }
Value f_title(Interpreter&, const Value& v, CallArgs&) { return Value::string(title_case(v.str())); }
Value f_capitalize(Interpreter&, const Value& v, CallArgs&) { return Value::string(capitalize(v.str())); }
Value f_escape(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_safe_string()) return v;
  return Value::safe_string(html_escape(v.str()));
}
Value f_forceescape(Interpreter&, const Value& v, CallArgs&) { return Value::safe_string(html_escape(v.str())); }

Value f_trim(Interpreter&, const Value& v, CallArgs& args) {
  args.check("trim", 1, {"chars"});
  return Value::string(py_strip(v.str(), none_if_undefined(args.get(0, "chars")), true, true));
}

Value f_default(Interpreter&, const Value& v, CallArgs& args) {
  args.check("default", 2, {"default_value", "boolean"});
  Value def = args.has(0, "default_value") ? args.get(0, "default_value") : Value::string("");
  bool boolean = args.get(1, "boolean").truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return def;
  return v;
}

Value f_join(Interpreter& in, const Value& v, CallArgs& args) {
  args.check("join", 2, {"d", "attribute"});
  std::string sep = args.has(0, "d") ? args.get(0, "d").str() : "";
  Value attribute = args.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& item : in.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += (attribute.is_undefined() || attribute.is_none() ? item : in.get_attribute_path(item, attribute)).str();
    in.check_string_size(out.size());
  }
  return Value::string(std::move(out));
}

Value f_first(Interpreter& in, const Value& v, CallArgs&) {
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter& in, const Value& v, CallArgs&) {
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_list(Interpreter& in, const Value& v, CallArgs&) { return Value::list(in.iterate(v)); }

Value f_tojson(Interpreter& in, const Value& v, CallArgs& args) {
  args.check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = args.get(0, "ensure_ascii").truthy();
  Value indent = args.get(1, "indent");
  if (indent.is_int() || indent.is_bool()) {
    int64_t n = indent.as_int();
    BASALT_CHECK(n <= 1000, "tojson: indent {} is too large", n);
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
  } else if (indent.is_string()) {
    o.indent = indent.as_string();
  } else {
    BASALT_CHECK(indent.is_undefined() || indent.is_none(), "tojson: indent must be an integer or a string");
  }
  Value seps = args.get(2, "separators");
  if (seps.is_list()) {
    BASALT_CHECK(seps.items().size() == 2 && seps.items()[0].is_string() && seps.items()[1].is_string(),
                 "tojson: separators must be a pair of strings");
    o.item_separator = seps.items()[0].as_string();
    o.key_separator = seps.items()[1].as_string();
  } else {
    BASALT_CHECK(seps.is_undefined() || seps.is_none(), "tojson: separators must be a pair of strings");
    o.item_separator = o.indent ? "," : ", ";
    o.key_separator = ": ";
  }
  o.sort_keys = args.get(3, "sort_keys").truthy();
  std::string out = json_dumps(v, o);
  in.check_string_size(out.size());
  return Value::string(std::move(out));
}

Value f_int(Interpreter&, const Value& v, CallArgs& args) {
  args.check("int", 2, {"default", "base"});
  Value def = args.has(0, "default") ? args.get(0, "default") : Value::integer(0);
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) {
    double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
    return Value::integer(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), Value::none(), true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (s.empty()) return def;
    errno = 0;
    char* end = nullptr;
    long long i = std::strtoll(s.c_str(), &end, 10);
    if (errno == 0 && end && *end == '\0') return Value::integer(i);
    double d = std::strtod(s.c_str(), &end);
    if (end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(static_cast<int64_t>(d));
  }
  return def;
}

Value f_float(Interpreter&, const Value& v, CallArgs& args) {
  args.check("float", 1, {"default"});
  Value def = args.has(0, "default") ? args.get(0, "default") : Value::number(0.0);
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), Value::none(), true, true);
    if (s.empty()) return def;
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (end && *end == '\0') return Value::number(d);
  }
  return def;
}

Value f_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  BASALT_CHECK(v.is_int() || v.is_bool(), "bad operand type for abs(): '{}'", v.type_name());
  BASALT_CHECK(v.as_int() != INT64_MIN, "integer overflow");
  return Value::integer(std::llabs(v.as_int()));
}

Value f_round(Interpreter&, const Value& v, CallArgs& args) {
  args.check("round", 2, {"precision", "method"});
  int64_t precision = args.has(0, "precision") ? to_int_arg(args.get(0, "precision"), "precision") : 0;
  std::string method = args.has(1, "method") ? args.get(1, "method").str() : "common";
  BASALT_CHECK(method == "common" || method == "ceil" || method == "floor",
               "method must be common, ceil or floor");
  BASALT_CHECK(v.is_number(), "round: expected a number, got {}", v.type_name());
  BASALT_CHECK(precision >= -300 && precision <= 300, "round: precision out of range");
  if (method == "common") {
    if (!v.is_float()) return Value::integer(v.as_int());
    double d = v.as_double();
    if (!std::isfinite(d)) return v;
    if (precision == 0) return Value::number(std::nearbyint(d));
    if (precision > 0) {
      std::string s = fmt::format("{:.{}f}", d, precision);
      return Value::number(std::strtod(s.c_str(), nullptr));
    }
    double p = std::pow(10.0, static_cast<double>(-precision));
    return Value::number(std::nearbyint(d / p) * p);
  }
  double p = std::pow(10.0, static_cast<double>(precision));
  double d = v.as_double() * p;
  d = method == "ceil" ? std::ceil(d) : std::floor(d);
  return Value::number(d / p);
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& args) {
  args.check("replace", 3, {"old", "new", "count"});
  Value count = args.get(2, "count");
  int64_t n = count.is_undefined() || count.is_none() ? -1 : to_int_arg(count, "count");
  return Value::string(replace_all(v.str(), args.get(0, "old").str(), args.get(1, "new").str(), n, in));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& args) {
  args.check("indent", 3, {"width", "first", "blank"});
  Value width = args.has(0, "width") ? args.get(0, "width") : Value::integer(4);
  std::string pad;
  if (width.is_string()) {
    pad = width.as_string();
  } else {
    int64_t w = to_int_arg(width, "width");
    BASALT_CHECK(w <= 1000, "indent: width {} is too large", w);
    pad = std::string(static_cast<size_t>(std::max<int64_t>(0, w)), ' ');
  }
  bool first = args.get(1, "first").truthy();
  bool blank = args.get(2, "blank").truthy();
  ValueList lines = splitlines(v.str() + "\n", false);
  std::string out;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) out += "\n" + pad;
      out += lines[i].as_string();
    }
  } else {
    out = lines.empty() ? "" : lines[0].as_string();
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].as_string().empty()) out += pad;
      out += lines[i].as_string();
      in.check_string_size(out.size());
    }
  }
  if (first) out = pad + out;
  in.check_string_size(out.size());
  return Value::string(std::move(out));
}

Value f_items(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::list({});
  BASALT_CHECK(v.is_dict(), "Can only get item pairs from a mapping, not {}", v.type_name());
  ValueList out;
  for (const auto& [k, val] : v.dict_data().items) out.push_back(Value::list({k, val}, true));
  return Value::list(std::move(out));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& args) {
  ValueList out;
  if (!v.truthy()) return Value::list({});  // jinja2 guards with `if value:`
  Value attribute;
  for (const auto& [k, val] : args.keyword) {
    if (k == "attribute") attribute = val;
  }
  if (!attribute.is_undefined()) {
    Value def;
    for (const auto& [k, val] : args.keyword) {
      if (k == "default") def = val;
      BASALT_CHECK(k == "default" || k == "attribute", "map: unexpected keyword argument '{}'", k);
    }
    BASALT_CHECK(args.positional.empty(), "map: attribute= takes no positional arguments");
    for (const auto& item : in.iterate(v)) {
      Value r = in.get_attribute_path(item, attribute);
      out.push_back(r.is_undefined() && !def.is_undefined() ? def : r);
    }
    return Value::list(std::move(out));
  }
  BASALT_CHECK(!args.positional.empty(), "map requires a filter argument");
  std::string filter = args.positional[0].str();
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const auto& item : in.iterate(v)) {
    in.step();
    CallArgs copy = rest;
    out.push_back(in.apply_filter(filter, item, copy));
  }
  return Value::list(std::move(out));
}

Value select_impl(Interpreter& in, const Value& v, CallArgs& args, bool by_attr, bool keep) {
  ValueList out;
  if (!v.truthy()) return Value::list({});  // jinja2 guards with `if value:`
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    BASALT_CHECK(!args.positional.empty(), "selectattr/rejectattr need an attribute");
    attribute = args.positional[next++];
  }
  std::string test;
  if (next < args.positional.size()) test = args.positional[next++].str();
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next), args.positional.end());
  rest.keyword = args.keyword;
  for (const auto& item : in.iterate(v)) {
    in.step();
    Value subject = by_attr ? in.get_attribute_path(item, attribute) : item;
    bool r;
    if (test.empty()) {
      r = subject.truthy();
    } else {
      CallArgs copy = rest;
      r = in.apply_test(test, subject, copy);
    }
    if (r == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }

Value f_unique(Interpreter& in, const Value& v, CallArgs& args) {
  args.check("unique", 2, {"case_sensitive", "attribute"});
  bool cs = args.get(0, "case_sensitive").truthy();
  Value attribute = args.get(1, "attribute");
  ValueList out, seen;
  for (const auto& item : in.iterate(v)) {
    in.step();
    Value key = sort_key(in, item, attribute, cs);
    bool dup = false;
    for (const auto& s : seen) {
      if (equals(s, key)) {
        dup = true;
        break;
      }
    }
    if (!dup) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& args) {
  args.check("sort", 3, {"reverse", "case_sensitive", "attribute"});
  bool reverse = args.get(0, "reverse").truthy();
  bool cs = args.get(1, "case_sensitive").truthy();
  Value attribute = args.get(2, "attribute");
  ValueList items = in.iterate(v);
  std::vector<Value> keys;
  for (const auto& item : items) keys.push_back(sort_key(in, item, attribute, cs));
  sort_values(items, keys, reverse);
  return Value::list(std::move(items));
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& args) {
  args.check("dictsort", 3, {"case_sensitive", "by", "reverse"});
  BASALT_CHECK(v.is_dict(), "dictsort: expected a mapping, got {}", v.type_name());
  bool cs = args.get(0, "case_sensitive").truthy();
  std::string by = args.has(1, "by") ? args.get(1, "by").str() : "key";
  BASALT_CHECK(by == "key" || by == "value", "You can only sort by either \"key\" or \"value\"");
  bool reverse = args.get(2, "reverse").truthy();
  ValueList items;
  std::vector<Value> keys;
  for (const auto& [k, val] : v.dict_data().items) {
    items.push_back(Value::list({k, val}, true));
    keys.push_back(sort_key(in, by == "key" ? k : val, Value(), cs));
  }
  sort_values(items, keys, reverse);
  return Value::list(std::move(items));
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_string()) {
    auto cps = utf8_decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value::string(utf8_encode(cps));
  }
  ValueList items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& args) {
  args.check("sum", 2, {"attribute", "start"});
  Value attribute = args.get(0, "attribute");
  Value total = args.has(1, "start") ? args.get(1, "start") : Value::integer(0);
  for (const auto& item : in.iterate(v)) {
    Value x = attribute.is_undefined() || attribute.is_none() ? item : in.get_attribute_path(item, attribute);
    BASALT_CHECK(x.is_number() && total.is_number(), "unsupported operand type(s) for +: '{}' and '{}'",
                 total.type_name(), x.type_name());
    if (x.is_float() || total.is_float()) {
      total = Value::number(total.as_double() + x.as_double());
    } else {
      int64_t r;
      BASALT_CHECK(!__builtin_add_overflow(total.as_int(), x.as_int(), &r), "integer overflow");
      total = Value::integer(r);
    }
  }
  return total;
}

Value min_max(Interpreter& in, const Value& v, CallArgs& args, bool want_max) {
  args.check(want_max ? "max" : "min", 2, {"case_sensitive", "attribute"});
  bool cs = args.get(0, "case_sensitive").truthy();
  Value attribute = args.get(1, "attribute");
  ValueList items = in.iterate(v);
  if (items.empty()) return Value::undefined(fmt::format("No aggregated item, sequence was empty."));
  size_t best = 0;
  Value best_key = sort_key(in, items[0], attribute, cs);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(in, items[i], attribute, cs);
    int c = compare(k, best_key);
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }

Value f_batch(Interpreter& in, const Value& v, CallArgs& args) {
  args.check("batch", 2, {"linecount", "fill_with"});
  int64_t n = to_int_arg(args.get(0, "linecount"), "linecount");
  BASALT_CHECK(n > 0, "batch: linecount must be positive");
  bool fill = args.has(1, "fill_with");
  Value filler = args.get(1, "fill_with");
  ValueList out, cur;
  for (const auto& item : in.iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (fill) {
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(filler);
    }
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs&) {
  // jinja2 counts \w+ runs; ASCII word characters plus any non-ASCII byte run.
  int64_t n = 0;
  bool in_word = false;
  for (unsigned char c : v.str()) {
    bool w = std::isalnum(c) || c == '_' || c >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_center(Interpreter& in, const Value& v, CallArgs& args) {
  args.check("center", 1, {"width"});
  int64_t width = args.has(0, "width") ? to_int_arg(args.get(0, "width"), "width") : 80;
  std::string s = v.str();
  auto len = static_cast<int64_t>(cp_length(s));
  if (width <= len) return Value::string(s);
  in.check_string_size(static_cast<size_t>(width));
  int64_t total = width - len;
  int64_t left = total / 2 + (total & width & 1);
  return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                       std::string(static_cast<size_t>(total - left), ' '));
}

Value f_format(Interpreter& in, const Value& v, CallArgs& args) {
  BASALT_CHECK(args.keyword.empty() || args.positional.empty(),
               "can't handle positional and keyword arguments at the same time");
  BASALT_CHECK(args.keyword.empty(), "format: keyword arguments are not supported");
  std::string s = percent_format(v.str(), args.positional);
  in.check_string_size(s.size());
  return Value::string(std::move(s));
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& args) {
  return in.getattr(v, args.get(0, "name").str());
}

// ---------------------------------------------------------------- tests

int64_t int_operand(const Value& v, const char* test) {
  BASALT_CHECK(v.is_number(), "test '{}' needs a number, got {}", test, v.type_name());
  BASALT_CHECK(!v.is_float(), "test '{}' on a float is not supported", test);
  return v.as_int();
}

bool t_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_integer(Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) { return v.is_callable() || v.is_undefined(); }
bool t_odd(Interpreter&, const Value& v, CallArgs&) { return (int_operand(v, "odd") & 1) != 0; }
bool t_even(Interpreter&, const Value& v, CallArgs&) { return (int_operand(v, "even") & 1) == 0; }
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& args) {
  int64_t n = int_operand(args.get(0, "num"), "divisibleby");
  BASALT_CHECK(n != 0, "integer division or modulo by zero");
  if (n == -1) return true;
  return int_operand(v, "divisibleby") % n == 0;
}
bool t_eq(Interpreter&, const Value& v, CallArgs& args) { return equals(v, args.get(0, "other")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& args) { return !equals(v, args.get(0, "other")); }
int ordered(const Value& a, const Value& b) {
  BASALT_CHECK(!a.is_undefined() && !b.is_undefined(), "cannot compare an undefined value");
  return compare(a, b);
}
bool t_lt(Interpreter&, const Value& v, CallArgs& args) { return ordered(v, args.get(0, "other")) < 0; }
bool t_le(Interpreter&, const Value& v, CallArgs& args) { return ordered(v, args.get(0, "other")) <= 0; }
bool t_gt(Interpreter&, const Value& v, CallArgs& args) { return ordered(v, args.get(0, "other")) > 0; }
bool t_ge(Interpreter&, const Value& v, CallArgs& args) { return ordered(v, args.get(0, "other")) >= 0; }
bool t_in(Interpreter& in, const Value& v, CallArgs& args) {
  Value seq = args.get(0, "seq");
  if (seq.is_string()) {
    BASALT_CHECK(v.is_string(), "'in <string>' requires string as left operand, not {}", v.type_name());
    return seq.as_string().find(v.as_string()) != std::string::npos;
  }
  if (seq.is_dict()) return seq.dict_data().find(v) >= 0;
  for (const auto& item : in.iterate(seq)) {
    if (equals(v, item)) return true;
  }
  return false;
}
bool t_sameas(Interpreter&, const Value& v, CallArgs& args) {
  Value o = args.get(0, "other");
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::None:
    case Value::Kind::Undefined: return true;
    case Value::Kind::Bool: return v.as_bool() == o.as_bool();
    case Value::Kind::Int: return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    case Value::Kind::List: return &v.items() == &o.items();
    case Value::Kind::Dict: return &v.dict_data() == &o.dict_data();
    case Value::Kind::String: return &v.as_string() == &o.as_string();
    default: return equals(v, o);
  }
}
bool t_lower(Interpreter&, const Value& v, CallArgs&) {
  std::string s = v.str();
  return ascii_lower(s) == s && s != ascii_upper(s);
}
bool t_upper(Interpreter&, const Value& v, CallArgs&) {
  std::string s = v.str();
  return ascii_upper(s) == s && s != ascii_lower(s);
}
bool t_escaped(Interpreter&, const Value&, CallArgs&) { return false; }
bool t_filter(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_filter(v.as_string()); }
bool t_test(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_test(v.as_string()); }

// ---------------------------------------------------------------- methods

Value unsafe_method(const Value& obj, const std::string& name) {
  std::string type = obj.type_name();
  return Value::callable(name, [type, name](CallArgs&, Interpreter&) -> Value {
    fail("access to attribute '{}' of '{}' object is unsafe", name, type);
  });
}

Value string_method(const Value& obj, const std::string& name) {
  std::string s = obj.as_string();
  auto bind = [&](NativeFunction fn) { return Value::callable(name, std::move(fn)); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    return bind([s, left, right](CallArgs& a, Interpreter&) {
      return Value::string(py_strip(s, none_if_undefined(a.get(0, "chars")), left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    bool r = name == "rsplit";
    return bind([s, r](CallArgs& a, Interpreter& in) {
      Value sep = a.get(0, "sep");
      Value max = a.get(1, "maxsplit");
      int64_t maxsplit = max.is_undefined() ? -1 : to_int_arg(max, "maxsplit");
      ValueList parts;
      if (sep.is_undefined() || sep.is_none()) {
        BASALT_CHECK(!r || maxsplit < 0, "rsplit() with maxsplit and no separator is not supported");
        parts = split_whitespace(s, maxsplit);
      } else {
        BASALT_CHECK(sep.is_string(), "must be str or None, not {}", sep.type_name());
        parts = r ? rsplit_sep(s, sep.as_string(), maxsplit) : split_sep(s, sep.as_string(), maxsplit);
      }
      in.check_list_size(parts.size());
      return Value::list(std::move(parts));
    });
  }
  if (name == "splitlines") {
    return bind([s](CallArgs& a, Interpreter&) { return Value::list(splitlines(s, a.get(0, "keepends").truthy())); });
  }
  if (name == "startswith" || name == "endswith") {
    bool start = name == "startswith";
    return bind([s, start](CallArgs& a, Interpreter&) {
      Value p = a.get(0, "prefix");
      ValueList options = p.is_tuple() ? p.items() : ValueList{p};
      for (const auto& o : options) {
        BASALT_CHECK(o.is_string(), "startswith/endswith argument must be str or a tuple of str, not {}",
                     o.type_name());
        const std::string& x = o.as_string();
        if (x.size() > s.size()) continue;
        if (start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0) {
          return Value::boolean(true);
        }
      }
      return Value::boolean(false);
    });
  }
  if (name == "upper") return bind([s](CallArgs&, Interpreter&) { return Value::string(ascii_upper(s)); });
  if (name == "lower") return bind([s](CallArgs&, Interpreter&) { return Value::string(ascii_lower(s)); });
  if (name == "title") return bind([s](CallArgs&, Interpreter&) { return Value::string(py_title(s)); });
  if (name == "capitalize") return bind([s](CallArgs&, Interpreter&) { return Value::string(capitalize(s)); });
  if (name == "replace") {
    return bind([s](CallArgs& a, Interpreter& in) {
      Value old = a.get(0, "old"), neu = a.get(1, "new"), count = a.get(2, "count");
      BASALT_CHECK(old.is_string() && neu.is_string(), "replace() arguments must be str");
      int64_t n = count.is_undefined() ? -1 : to_int_arg(count, "count");
      return Value::string(replace_all(s, old.as_string(), neu.as_string(), n, in));
    });
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return bind([s, name](CallArgs& a, Interpreter&) {
      Value sub = a.get(0, "sub");
      BASALT_CHECK(sub.is_string(), "must be str, not {}", sub.type_name());
      BASALT_CHECK(a.positional.size() <= 1, "{}(): start/end arguments are not supported", name);
      const std::string& x = sub.as_string();
      if (name == "count") {
        if (x.empty()) return Value::integer(static_cast<int64_t>(cp_length(s)) + 1);
        int64_t n = 0;
        for (size_t at = s.find(x); at != std::string::npos; at = s.find(x, at + x.size())) ++n;
        return Value::integer(n);
      }
      size_t at = name == "find" ? s.find(x) : s.rfind(x);
      if (at == std::string::npos) return Value::integer(-1);
      return Value::integer(static_cast<int64_t>(cp_length(s.substr(0, at))));
    });
  }
  if (name == "join") {
    return bind([s](CallArgs& a, Interpreter& in) {
      std::string out;
      bool first = true;
      for (const auto& item : in.iterate(a.get(0, "iterable"))) {
        BASALT_CHECK(item.is_string(), "sequence item: expected str instance, {} found", item.type_name());
        if (!first) out += s;
        first = false;
        out += item.as_string();
        in.check_string_size(out.size());
      }
      return Value::string(std::move(out));
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    return bind([s, name](CallArgs&, Interpreter&) {
      if (name == "isupper") return Value::boolean(ascii_upper(s) == s && ascii_lower(s) != s);
      if (name == "islower") return Value::boolean(ascii_lower(s) == s && ascii_upper(s) != s);
      if (s.empty()) return Value::boolean(false);
      for (char32_t c : utf8_decode(s)) {
        bool ok = name == "isdigit"   ? (c >= '0' && c <= '9')
                  : name == "isalpha" ? (c < 0x80 ? std::isalpha(static_cast<int>(c)) != 0 : true)
                  : name == "isalnum" ? (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : true)
                                      : py_isspace(c);
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    });
  }
  return Value();
}

Value dict_method(const Value& obj, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    int which = name == "items" ? 0 : name == "keys" ? 1 : 2;
    return Value::callable(name, [obj, which](CallArgs&, Interpreter&) {
      ValueList out;
      for (const auto& [k, v] : obj.dict_data().items) {
        out.push_back(which == 0 ? Value::list({k, v}, true) : which == 1 ? k : v);
      }
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return Value::callable(name, [obj](CallArgs& a, Interpreter&) {
      BASALT_CHECK(!a.positional.empty() && a.positional.size() <= 2 && a.keyword.empty(),
                   "get() takes a key and an optional default");
      auto at = obj.dict_data().find(a.positional[0]);
      if (at >= 0) return obj.dict_data().items[static_cast<size_t>(at)].second;
      return a.positional.size() > 1 ? a.positional[1] : Value::none();
    });
  }
  if (name == "copy") {
    return Value::callable(name, [obj](CallArgs&, Interpreter&) { return Value::dict(obj.dict_data().items); });
  }
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear") {
    return unsafe_method(obj, name);
  }
  return Value();
}

Value list_method(const Value& obj, const std::string& name) {
  if (name == "index" || name == "count") {
    bool index = name == "index";
    return Value::callable(name, [obj, index](CallArgs& a, Interpreter&) {
      Value x = a.get(0, "value");
      int64_t n = 0;
      for (size_t i = 0; i < obj.items().size(); ++i) {
        if (equals(obj.items()[i], x)) {
          if (index) return Value::integer(static_cast<int64_t>(i));
          ++n;
        }
      }
      BASALT_CHECK(!index, "{} is not in list", x.repr());
      return Value::integer(n);
    });
  }
  if (!obj.is_tuple() && (name == "append" || name == "pop" || name == "insert" || name == "extend" ||
                          name == "remove" || name == "clear" || name == "sort" || name == "reverse")) {
    return unsafe_method(obj, name);
  }
  return Value();
}

// ---------------------------------------------------------------- globals

Value g_range(CallArgs& a, Interpreter& in) {
  BASALT_CHECK(a.keyword.empty() && !a.positional.empty() && a.positional.size() <= 3,
               "range expected 1 to 3 integer arguments");
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) {
    stop = to_int_arg(a.positional[0], "range() argument");
  } else {
    start = to_int_arg(a.positional[0], "range() argument");
    stop = to_int_arg(a.positional[1], "range() argument");
    if (a.positional.size() == 3) step = to_int_arg(a.positional[2], "range() argument");
  }
  BASALT_CHECK(step != 0, "range() arg 3 must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    in.check_list_size(out.size() + 1);
    out.push_back(Value::integer(i));
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return Value::list(std::move(out));
}

Value g_namespace(CallArgs& a, Interpreter& in) {
  ValuePairs attrs;
  auto add = [&](const std::string& k, const Value& v) {
    for (auto& [key, val] : attrs) {
      if (key.as_string() == k) {
        val = v;
        return;
      }
    }
    attrs.emplace_back(Value::string(k), v);
  };
  for (const auto& p : a.positional) {
    BASALT_CHECK(p.is_dict(), "namespace() positional arguments must be mappings");
    for (const auto& [k, v] : p.dict_data().items) add(k.str(), v);
  }
  for (const auto& [k, v] : a.keyword) add(k, v);
  Value ns = Value::make_namespace(std::move(attrs));
  in.track_namespace(ns);
  return ns;
}

Value g_dict(CallArgs& a, Interpreter&) {
  auto d = std::make_shared<DictData>();
  for (const auto& p : a.positional) {
    BASALT_CHECK(p.is_dict(), "dict() positional arguments must be mappings");
    for (const auto& [k, v] : p.dict_data().items) d->set(k, v);
  }
  for (const auto& [k, v] : a.keyword) d->set(Value::string(k), v);
  return Value::dict(std::move(d));
}

Value g_raise_exception(CallArgs& a, Interpreter&) {
  fail("raise_exception: {}", a.get(0, "message").str());
}

Value g_strftime_now(CallArgs& a, Interpreter& in) {
  Value f = a.get(0, "format");
  BASALT_CHECK(f.is_string(), "strftime_now() needs a format string");
  std::tm tm{};
  if (in.options().now) {
    tm = *in.options().now;
  } else {
    std::time_t t = std::time(nullptr);
    localtime_r(&t, &tm);
  }
  const std::string& fmt_s = f.as_string();
  BASALT_CHECK(fmt_s.size() <= 256, "strftime_now() format is too long");
  if (fmt_s.empty()) return Value::string("");
  char buf[4096];
  size_t n = std::strftime(buf, sizeof(buf), fmt_s.c_str(), &tm);
  return Value::string(std::string(buf, n));
}

}  // namespace

// ---------------------------------------------------------------- shared

std::string ascii_lower(std::string s) {
  if (!is_ascii(s)) {
    std::string out;
    for (char32_t c : utf8_decode(s)) utf8_append(out, cp_lower(c));
    return out;
  }
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string ascii_upper(std::string s) {
  if (!is_ascii(s)) {
    std::string out;
    for (char32_t c : utf8_decode(s)) {
      if (c == 0xDF) {
        out += "SS";
      } else {
        utf8_append(out, cp_upper(c));
      }
    }
    return out;
  }
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string set;
  bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) {
    BASALT_CHECK(chars.is_string(), "strip arg must be None or str");
    set = utf8_decode(chars.as_string());
  }
  auto strip_this = [&](char32_t c) { return whitespace ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  if (is_ascii(s) && (whitespace || is_ascii(chars.as_string()))) {
    size_t b = 0, e = s.size();
    if (left) {
      while (b < e && strip_this(static_cast<unsigned char>(s[b]))) ++b;
    }
    if (right) {
      while (e > b && strip_this(static_cast<unsigned char>(s[e - 1]))) --e;
    }
    return s.substr(b, e - b);
  }
  auto cps = utf8_decode(s);
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_this(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_this(cps[e - 1])) --e;
  }
  return utf8_encode(std::u32string_view(cps).substr(b, e - b));
}

std::string percent_format(const std::string& f, const ValueList& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    BASALT_CHECK(i + 1 < f.size(), "incomplete format");
    // %[flags][width][.precision]type
    size_t j = i + 1;
    std::string spec;
    while (j < f.size() && std::strchr("-+ 0#", f[j])) spec += f[j++];
    while (j < f.size() && std::isdigit(static_cast<unsigned char>(f[j]))) spec += f[j++];
    if (j < f.size() && f[j] == '.') {
      spec += f[j++];
      while (j < f.size() && std::isdigit(static_cast<unsigned char>(f[j]))) spec += f[j++];
    }
    BASALT_CHECK(j < f.size(), "incomplete format");
    BASALT_CHECK(spec.size() <= 8, "format specification too long");
    char type = f[j];
    i = j;
    if (type == '%') {
      out += '%';
      continue;
    }
    BASALT_CHECK(next < args.size(), "not enough arguments for format string");
    const Value& a = args[next++];
    std::string cspec = "%" + spec;
    char buf[512];
    switch (type) {
      case 's':
      case 'r': {
        std::string s = type == 's' ? a.str() : a.repr();
        if (spec.empty()) {
          out += s;
        } else {
          std::snprintf(buf, sizeof(buf), (cspec + "s").c_str(), s.c_str());
          out += buf;
        }
        break;
      }
      case 'd':
      case 'i': {
        BASALT_CHECK(a.is_number(), "%{} format: a number is required, not {}", type, a.type_name());
        long long v = a.is_float() ? static_cast<long long>(a.as_double()) : a.as_int();
        std::snprintf(buf, sizeof(buf), (cspec + "lld").c_str(), v);
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        BASALT_CHECK(a.is_number(), "must be real number, not {}", a.type_name());
        std::snprintf(buf, sizeof(buf), (cspec + type).c_str(), a.as_double());
        out += buf;
        break;
      }
      default: fail("unsupported format character '{}'", type);
    }
  }
  BASALT_CHECK(next == args.size(), "not all arguments converted during string formatting");
  return out;
}

FilterFn find_filter(const std::string& name) {
  static const std::unordered_map<std::string, FilterFn> table = {
      {"length", f_length},   {"count", f_length},         {"string", f_string},     {"safe", f_safe},
      {"upper", f_upper},     {"lower", f_lower},          {"title", f_title},       {"capitalize", f_capitalize},
      {"escape", f_escape},   {"e", f_escape},             {"forceescape", f_forceescape}, {"trim", f_trim},
      {"default", f_default}, {"d", f_default},            {"join", f_join},         {"first", f_first},
      {"last", f_last},       {"list", f_list},            {"tojson", f_tojson},     {"int", f_int},
      {"float", f_float},     {"abs", f_abs},              {"round", f_round},       {"replace", f_replace},
      {"indent", f_indent},   {"items", f_items},          {"map", f_map},           {"select", f_select},
      {"reject", f_reject},   {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr},
      {"unique", f_unique},   {"sort", f_sort},            {"dictsort", f_dictsort}, {"reverse", f_reverse},
      {"sum", f_sum},         {"min", f_min},              {"max", f_max},           {"batch", f_batch},
      {"wordcount", f_wordcount}, {"center", f_center},    {"format", f_format},     {"attr", f_attr},
  };
  auto it = table.find(name);
  return it == table.end() ? nullptr : it->second;
}

TestFn find_test(const std::string& name) {
  static const std::unordered_map<std::string, TestFn> table = {
      {"defined", t_defined},   {"undefined", t_undefined}, {"none", t_none},           {"string", t_string},
      {"number", t_number},     {"integer", t_integer},     {"float", t_float},         {"boolean", t_boolean},
      {"true", t_true},         {"false", t_false},         {"mapping", t_mapping},     {"iterable", t_iterable},
      {"sequence", t_sequence}, {"callable", t_callable},   {"odd", t_odd},             {"even", t_even},
      {"divisibleby", t_divisibleby}, {"eq", t_eq},         {"equalto", t_eq},          {"==", t_eq},
      {"ne", t_ne},             {"!=", t_ne},               {"lt", t_lt},               {"lessthan", t_lt},
      {"<", t_lt},              {"le", t_le},               {"<=", t_le},               {"gt", t_gt},
      {"greaterthan", t_gt},    {">", t_gt},                {"ge", t_ge},               {">=", t_ge},
      {"in", t_in},             {"sameas", t_sameas},       {"lower", t_lower},         {"upper", t_upper},
      {"escaped", t_escaped},   {"filter", t_filter},       {"test", t_test},
  };
  auto it = table.find(name);
  return it == table.end() ? nullptr : it->second;
}

Value find_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(obj, name);
  if (obj.is_dict()) return dict_method(obj, name);
  if (obj.is_list()) return list_method(obj, name);
  return Value();
}

void install_globals(Scope& globals) {
  globals.vars["range"] = Value::callable("range", g_range);
  globals.vars["namespace"] = Value::callable("namespace", g_namespace);
  globals.vars["dict"] = Value::callable("dict", g_dict);
  globals.vars["raise_exception"] = Value::callable("raise_exception", g_raise_exception);
  globals.vars["strftime_now"] = Value::callable("strftime_now", g_strftime_now);
}

}  // namespace basalt::jinja
