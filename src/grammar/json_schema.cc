// JSON Schema to EBNF (grammar/json_schema.h).
//
// Each subschema becomes an EBNF expression. Named rules are made for every
// $ref target and every merged (allOf) schema, which is where recursion
// closes, and for pieces that would otherwise be written out more than once.
// A subschema that no value satisfies translates to "no value" with the
// reason, so that an anyOf branch or an optional property can drop out and
// only the root (or something the root requires) turns it into an error.
#include "grammar/json_schema.h"

#include <algorithm>
#include <iterator>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"

namespace basalt {
namespace {

using Json = nlohmann::ordered_json;

// Keywords the translation enforces, by the type they apply to ($defs and
// definitions hold what $ref reaches).
constexpr std::string_view kGeneralKeywords[] = {"type",  "enum", "const", "anyOf",      "oneOf",
                                                 "allOf", "$ref", "$defs", "definitions", "not"};
constexpr std::string_view kObjectKeywords[] = {"properties",    "required",          "additionalProperties",
                                                "minProperties", "maxProperties",     "patternProperties",
                                                "dependencies",  "dependentRequired", "dependentSchemas",
                                                "propertyNames"};
constexpr std::string_view kArrayKeywords[] = {"items",    "prefixItems", "additionalItems",
                                               "minItems", "maxItems",    "uniqueItems"};
constexpr std::string_view kStringKeywords[] = {"minLength", "maxLength", "pattern", "format"};
constexpr std::string_view kNumberKeywords[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                                "multipleOf"};

// Keywords of the JSON Schema vocabularies (drafts 4 to 2020-12: core,
// applicator, unevaluated, validation; and draft 3's assertions, which
// draft-3 schemas still use) that the translation does not enforce: refused
// by name. Every other key is an annotation: the annotation keywords of the
// vocabularies (title, description, default, examples, $comment, $schema,
// $anchor, $dynamicAnchor, $recursiveAnchor, $vocabulary, deprecated,
// readOnly, writeOnly, contentEncoding, contentMediaType, contentSchema),
// and any key that is no JSON Schema keyword at all (vendor extensions,
// OpenAPI's, typos), which a validator ignores as the specification says.
// $id and draft 4's id are annotations too, but below the root only where
// no $ref depends on them (check_keywords). if / then / else are rewritten
// away where a schema is translated or merged (without_conditional); only
// the readers that take a narrower schema (propertyNames, not, summaries)
// meet them here.
constexpr std::string_view kUnenforcedKeywords[] = {"if",
                                                    "then",
                                                    "else",
                                                    "contains",
                                                    "minContains",
                                                    "maxContains",
                                                    "$dynamicRef",
                                                    "$recursiveRef",
                                                    "unevaluatedProperties",
                                                    "unevaluatedItems",
                                                    "divisibleBy",
                                                    "disallow",
                                                    "extends"};

// Formats enforced on strings ("url", which OpenAPI documents and real
// schemas use, as "uri"; OpenAPI's "byte" as RFC 4648 base64; Google's API
// Discovery formats for times, durations and field masks).
constexpr std::string_view kFormats[] = {"date",         "time",         "date-time",    "email",
                                         "uuid",         "ipv4",         "ipv6",         "uri",
                                         "url",          "hostname",     "byte",         "duration",
                                         "json-pointer", "relative-json-pointer", "uri-reference",
                                         "google-datetime", "google-duration", "google-fieldmask", "regex"};
// OpenAPI's formats that only hint at a string's use and constrain no text:
// any string.
constexpr std::string_view kHintFormats[] = {"password", "binary"};
// Formats defined for strings only (the specification's, and OpenAPI's byte,
// binary and password): they say nothing of other values.
constexpr std::string_view kStringOnlyFormats[] = {
    "date",     "time",          "date-time",    "duration", "email",        "idn-email",
    "hostname", "idn-hostname",  "ipv4",         "ipv6",     "uri",          "uri-reference",
    "iri",      "iri-reference", "uri-template", "uuid",     "json-pointer", "relative-json-pointer",
    "regex",    "byte",          "binary",       "password", "url",
    "google-datetime", "google-duration", "google-fieldmask"};

template <size_t N>
bool listed(std::string_view key, const std::string_view (&list)[N]) {
  return std::find(std::begin(list), std::end(list), key) != std::end(list);
}

bool enforced(std::string_view key) {
  return listed(key, kGeneralKeywords) || listed(key, kObjectKeywords) || listed(key, kArrayKeywords) ||
         listed(key, kStringKeywords) || listed(key, kNumberKeywords);
}

// Repetitions past this many are built from rules of this many, so that no
// bound reaches kMaxRepetition and no automaton unrolls a huge count.
constexpr int64_t kChunk = 256;
// A bounded string's characters are written in runs of at most this many
// (see chars_then_quote).
constexpr int64_t kCharChunk = 32;
constexpr int64_t kMaxCharRuns = 32;
// Counts (minLength, maxItems, ...) past this are refused rather than risk
// overflow; no model writes that much.
constexpr int64_t kMaxCount = int64_t{1} << 53;
// Products of anyOf lists that allOf merging may build, and merged schemas
// one translation may make: a schema past these is hostile or a bug.
constexpr size_t kMaxAlternatives = 256;
// An object's optional members nest one group each; past this many a rule
// is made (the EBNF parser bounds group nesting).
constexpr int kMaxInlineChain = 32;
// Subschemas, $ref hops and allOf merges nested in each other, at most.
constexpr int kMaxNesting = 256;
// (listed properties + 1) x (the counts of members told apart + 1) past this
// is refused: an object's members and their count are a grammar that size.
constexpr size_t kMaxMemberStates = 1'000'000;
constexpr size_t kMaxMergedSchemas = 2000;
// Objects told apart by which dependency triggers they have (dependentRequired,
// dependentSchemas): each combination is a schema of its own.
constexpr size_t kMaxDependencyCombinations = 64;
// Sets of member names told apart by which patternProperties patterns match
// them: each is a member form of its own.
constexpr size_t kMaxPatternOverlaps = 64;

// --- JSON types ---------------------------------------------------------------

enum TypeBit : uint8_t {
  kNull = 1,
  kBoolean = 2,
  kObject = 4,
  kArray = 8,
  kString = 16,
  kInteger = 32,
  kFraction = 64,  // numbers that are not integers
};
constexpr uint8_t kAnyType = 127;

constexpr std::pair<std::string_view, uint8_t> kTypeNames[] = {
    {"null", kNull},       {"boolean", kBoolean},           {"object", kObject}, {"array", kArray}, {"string", kString},
    {"integer", kInteger}, {"number", kInteger | kFraction}};

std::string pointer_token(std::string_view key) {
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string child_path(const std::string& path, std::string_view key) { return path + "/" + pointer_token(key); }
std::string child_path(const std::string& path, size_t index) { return path + "/" + std::to_string(index); }

const Json* member(const Json& schema, std::string_view key) {
  const auto it = schema.find(std::string(key));
  return it == schema.end() ? nullptr : &*it;
}

uint8_t type_set(const Json& type, const std::string& path) {
  const auto one = [&](const Json& name) -> uint8_t {
    BASALT_CHECK(name.is_string(), "json schema: keyword \"type\" at {} must be a type name or a list of them", path);
    for (const auto& [type_name, bits] : kTypeNames)
      if (name.get<std::string>() == type_name) return bits;
    fail("json schema: keyword \"type\" at {}: unknown type \"{}\"", path, name.get<std::string>());
  };
  if (!type.is_array()) return one(type);
  uint8_t bits = 0;
  for (const Json& name : type) bits |= one(name);
  return bits;
}

Json type_json(uint8_t bits) {
  Json names = Json::array();
  for (const auto& [type_name, type_bits] : kTypeNames) {
    if (type_bits == kInteger && (bits & kFraction)) continue;  // "number" says it
    if ((bits & type_bits) == type_bits) names.push_back(type_name);
  }
  return names.size() == 1 ? names[0] : names;
}

uint8_t value_type(const Json& value) {
  if (value.is_null()) return kNull;
  if (value.is_boolean()) return kBoolean;
  if (value.is_object()) return kObject;
  if (value.is_array()) return kArray;
  if (value.is_string()) return kString;
  if (value.is_number_float()) {
    const double x = value.get<double>();
    return std::floor(x) == x ? kInteger : kFraction;
  }
  return kInteger;
}

// Equality as JSON Schema defines it: numbers by value, objects regardless
// of member order (nlohmann::json sorts keys; ordered_json would compare
// the order too).
bool json_equal(const Json& a, const Json& b) { return nlohmann::json(a) == nlohmann::json(b); }

bool is_true_schema(const Json& schema) {
  return (schema.is_boolean() && schema.get<bool>()) || (schema.is_object() && schema.empty());
}

// A schema that both `a` and `b` require.
Json conjoin(const Json& a, const Json& b) {
  if (is_true_schema(a)) return b;
  if (is_true_schema(b) || json_equal(a, b)) return a;
  if (a.is_boolean() || b.is_boolean()) return false;
  return Json{{"allOf", Json::array({a, b})}};
}

int64_t read_count(const Json& value, std::string_view key, const std::string& path) {
  const bool integral =
      value.is_number_integer() || (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
  BASALT_CHECK(integral && value.get<double>() >= 0, "json schema: keyword \"{}\" at {} must be a non-negative integer",
               key, path);
  BASALT_CHECK(value.get<double>() <= static_cast<double>(kMaxCount),
               "json schema: keyword \"{}\" at {}: {} is past the largest count supported ({})", key, path,
               value.dump(), kMaxCount);
  return value.is_number_float() ? static_cast<int64_t>(value.get<double>()) : value.get<int64_t>();
}

std::optional<int64_t> optional_count(const Json& schema, std::string_view key, const std::string& path) {
  const Json* value = member(schema, key);
  if (!value) return std::nullopt;
  return read_count(*value, key, path);
}

// --- Integers of any size -------------------------------------------------------

// Decimal, so that bounds of any magnitude (uint64, 1e30) stay exact; the
// magnitude has no leading zeros ("0" for zero, which is never negative).
struct BigInteger {
  bool negative = false;
  std::string digits = "0";
};

int compare_magnitudes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  const int c = a.compare(b);
  return c < 0 ? -1 : c > 0 ? 1 : 0;
}

int compare(const BigInteger& a, const BigInteger& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int c = compare_magnitudes(a.digits, b.digits);
  return a.negative ? -c : c;
}

std::string increment_magnitude(std::string digits) {
  size_t i = digits.size();
  while (i > 0 && digits[i - 1] == '9') digits[--i] = '0';
  if (i == 0) {
    digits.insert(digits.begin(), '1');
  } else {
    ++digits[i - 1];
  }
  return digits;
}

std::string decrement_magnitude(std::string digits) {  // digits > 0
  size_t i = digits.size();
  while (digits[i - 1] == '0') digits[--i] = '9';
  --digits[i - 1];
  if (digits.size() > 1 && digits[0] == '0') digits.erase(0, 1);
  return digits;
}

BigInteger plus_one(BigInteger x) {
  if (!x.negative) {
    x.digits = increment_magnitude(x.digits);
  } else {
    x.digits = decrement_magnitude(x.digits);
    x.negative = x.digits != "0";
  }
  return x;
}

BigInteger minus_one(BigInteger x) {
  if (x.negative || x.digits == "0") {
    x.negative = true;
    x.digits = increment_magnitude(x.digits);
  } else {
    x.digits = decrement_magnitude(x.digits);
  }
  return x;
}

std::string to_string(const BigInteger& x) { return (x.negative ? "-" : "") + x.digits; }

// The JSON number rounded to an integer, down or up.
BigInteger round_number(const Json& value, bool up) {
  BigInteger out;
  if (value.is_number_unsigned()) {
    out.digits = std::to_string(value.get<uint64_t>());
  } else if (value.is_number_integer()) {
    const int64_t x = value.get<int64_t>();
    out.negative = x < 0;
    out.digits = std::to_string(x < 0 ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x));
  } else {
    const double x = value.get<double>();
    std::string text = fmt::format("{:.0f}", up ? std::ceil(x) : std::floor(x));
    if (text[0] == '-') {
      text.erase(0, 1);
      out.negative = text != "0";
    }
    out.digits = text;
  }
  return out;
}

// --- Decimals ---------------------------------------------------------------------

// A JSON number's exact decimal value: the magnitude's integer digits (no
// leading zeros, "0" for none) and fraction digits (no trailing zeros, ""
// for none). Zero is never negative.
struct Decimal {
  bool negative = false;
  std::string integer = "0";
  std::string fraction;
};

// `digits` with the decimal point after `point` of them (point may lie
// outside the digits: zeros fill in), normalized.
Decimal decimal_from_digits(bool negative, const std::string& digits, int64_t point) {
  std::string integer, fraction;
  if (point <= 0) {
    fraction = std::string(static_cast<size_t>(-point), '0') + digits;
  } else if (point >= static_cast<int64_t>(digits.size())) {
    integer = digits + std::string(static_cast<size_t>(point) - digits.size(), '0');
  } else {
    integer = digits.substr(0, static_cast<size_t>(point));
    fraction = digits.substr(static_cast<size_t>(point));
  }
  integer.erase(0, std::min(integer.find_first_not_of('0'), integer.size()));
  while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
  Decimal out;
  out.integer = integer.empty() ? "0" : integer;
  out.fraction = fraction;
  out.negative = negative && (out.integer != "0" || !out.fraction.empty());
  return out;
}

// The exact value of a JSON number. nlohmann keeps a non-integer as a double;
// its shortest round-trip decimal (what fmt writes) is the decimal the schema's
// author wrote, whenever that decimal had at most 17 significant digits.
Decimal decimal_of(const Json& value) {
  if (value.is_number_integer()) {
    const BigInteger x = round_number(value, false);
    return decimal_from_digits(x.negative, x.digits, static_cast<int64_t>(x.digits.size()));
  }
  const std::string text = fmt::format("{}", value.get<double>());
  BASALT_CHECK(std::isfinite(value.get<double>()), "json schema: the number {} is not finite", text);
  const bool negative = text[0] == '-';
  const size_t exponent_at = text.find_first_of("eE");
  const std::string mantissa = text.substr(negative ? 1 : 0, exponent_at - (negative ? 1 : 0));
  const int64_t exponent = exponent_at == std::string::npos ? 0 : std::stoll(text.substr(exponent_at + 1));
  const size_t point_at = mantissa.find('.');
  std::string digits = mantissa;
  int64_t point = static_cast<int64_t>(mantissa.size());
  if (point_at != std::string::npos) {
    digits.erase(point_at, 1);
    point = static_cast<int64_t>(point_at);
  }
  return decimal_from_digits(negative, digits, point + exponent);
}

// Fraction digits compared as 0.a against 0.b (missing digits are zeros).
int compare_fractions(const std::string& a, const std::string& b) {
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const char x = i < a.size() ? a[i] : '0', y = i < b.size() ? b[i] : '0';
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

int compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  int c = compare_magnitudes(a.integer, b.integer);
  if (c == 0) c = compare_fractions(a.fraction, b.fraction);
  return a.negative ? -c : c;
}

std::string to_string(const Decimal& x) {
  return (x.negative ? "-" : "") + x.integer + (x.fraction.empty() ? "" : "." + x.fraction);
}

// a < b for JSON numbers, exact when both are integers.
bool number_less(const Json& a, const Json& b) {
  if (a.is_number_integer() && b.is_number_integer())
    return compare(round_number(a, false), round_number(b, false)) < 0;
  return a.get<double>() < b.get<double>();
}

// --- Grammar text ---------------------------------------------------------------

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

bool is_name(std::string_view text) { return !text.empty() && std::all_of(text.begin(), text.end(), is_name_char); }

std::string lit(std::string_view text) { return ebnf_literal(text); }

// Parts joined by spaces, the empty ones left out.
std::string seq(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (const std::string_view part : parts) {
    if (part.empty()) continue;
    if (!out.empty()) out.push_back(' ');
    out += part;
  }
  return out;
}

std::string alt(const std::vector<std::string>& options) {
  std::vector<std::string> distinct;
  for (const std::string& option : options)
    if (std::find(distinct.begin(), distinct.end(), option) == distinct.end()) distinct.push_back(option);
  if (distinct.size() == 1) return distinct[0];
  std::string out = "(";
  for (size_t i = 0; i < distinct.size(); ++i) out += (i ? " | " : "") + distinct[i];
  return out + ")";
}

std::string group(const std::string& expr) { return is_name(expr) ? expr : "(" + expr + ")"; }

// `atom` repeated lo to hi times (hi absent: unbounded), both at most kChunk.
std::string repeat_suffix(const std::string& atom, int64_t lo, std::optional<int64_t> hi) {
  if (hi && *hi == 0) return "";
  const std::string a = group(atom);
  if (!hi) return lo == 0 ? a + "*" : lo == 1 ? a + "+" : fmt::format("{}{{{},}}", a, lo);
  if (lo == *hi) return lo == 1 ? a : fmt::format("{}{{{}}}", a, lo);
  if (lo == 0 && *hi == 1) return a + "?";
  return fmt::format("{}{{{},{}}}", a, lo, *hi);
}

// Grammar text with literals written in single quotes, each made an
// ebnf_literal(); the fixed rules below read better that way.
std::string with_literals(std::string_view text) {
  std::string out, literal;
  bool in_literal = false;
  for (const char c : text) {
    if (c == '\'') {
      if (in_literal) out += ebnf_literal(literal);
      literal.clear();
      in_literal = !in_literal;
    } else {
      (in_literal ? literal : out).push_back(c);
    }
  }
  BASALT_ASSERT(!in_literal);
  return out;
}

// The rule names a rule body refers to (outside its literals, classes and
// repetition bounds).
std::vector<std::string> names_in(std::string_view body) {
  std::vector<std::string> names;
  for (size_t i = 0; i < body.size();) {
    const char c = body[i];
    if (c == '"' || c == '[' || c == '{') {
      const char close = c == '"' ? '"' : c == '[' ? ']' : '}';
      for (++i; i < body.size() && body[i] != close; ++i)
        if (body[i] == '\\') ++i;
      ++i;
    } else if (is_name_char(c)) {
      const size_t start = i;
      while (i < body.size() && is_name_char(body[i])) ++i;
      names.emplace_back(body.substr(start, i - start));
    } else {
      ++i;
    }
  }
  return names;
}

// `text` (whole rules) with `prefix` put before every rule name, defined or
// referenced. Literals, classes, repetition bounds and comments are left as
// they are, and so is '.' where a name would start (any code point).
std::string with_prefixed_names(std::string_view text, std::string_view prefix) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const size_t start = i;
    if (c == '"' || c == '[' || c == '{') {
      const char close = c == '"' ? '"' : c == '[' ? ']' : '}';
      for (++i; i < text.size() && text[i] != close; ++i)
        if (text[i] == '\\') ++i;
      i = std::min(i + 1, text.size());
    } else if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c != '.' && is_name_char(c)) {
      while (i < text.size() && is_name_char(text[i])) ++i;
      out += prefix;
    } else {
      ++i;
    }
    out += text.substr(start, i - start);
  }
  return out;
}

// A class range of format-regex, in order: a printable ASCII character, "-",
// and one at or past it (none of them "]", "\", "-" or the quote, which a
// class writes otherwise).
std::string_view regex_ranges() {
  static const std::string* text = [] {
    const auto usable = [](int c) { return c != ']' && c != '\\' && c != '-' && c != '"'; };
    std::string out;
    for (int first = 0x20; first <= 0x7e; ++first) {
      if (!usable(first)) continue;
      std::string ends;
      for (int c = first; c <= 0x7e; ++c) {
        if (!usable(c)) continue;
        int last = c;
        while (last + 1 <= 0x7e && usable(last + 1)) ++last;
        ends += c == last ? fmt::format("\\x{:02x}", c) : fmt::format("\\x{:02x}-\\x{:02x}", c, last);
        c = last;
      }
      out += fmt::format("{}[\\x{:02x}] '-' [{}]", out.empty() ? "" : " | ", first, ends);
    }
    return new std::string(out);
  }();
  return *text;
}

// Rules every grammar may share, written once each where used. json-char is
// one character of a JSON string's content as dump() writes it.
const std::map<std::string_view, std::string_view>& fixed_rules() {
  static const auto* rules = new std::map<std::string_view, std::string_view>{
      {"json-value", "json-object | json-array | json-string | json-number | 'true' | 'false' | 'null'"},
      {"json-string", R"g('"' json-char* '"')g"},
      {"json-char", R"g([^"\\\x00-\x1f] | json-escape)g"},
      // What follows a string's first character: shared by the names
      // other than a property list's (each trie node leaves through it).
      {"json-string-rest", R"g(json-char* '"')g"},
      {"json-escape", R"g('\' ["\\bfnrt] | '\u000' [0-7bef] | '\u001' [0-9a-f])g"},
      {"json-number", R"g('-'? ('0' | [1-9] [0-9]*) ('.' [0-9]+)? ([eE] [+\-]? [0-9]+)?)g"},
      {"json-integer", R"g('0' | '-'? [1-9] [0-9]*)g"},
      // RFC 3339 full-date, days checked against the month, 29 February
      // against the leap years of the Gregorian calendar.
      {"format-date", R"g([0-9]{4} '-' (('0' [13578] | '1' [02]) '-' ('0' [1-9] | [12] [0-9] | '3' [01]))g"
                      R"g( | ('0' [469] | '11') '-' ('0' [1-9] | [12] [0-9] | '30'))g"
                      R"g( | '02-' ('0' [1-9] | '1' [0-9] | '2' [0-8])) | format-leap-year '-02-29')g"},
      {"format-leap-year",
       R"g([0-9]{2} ('0' [48] | [2468] [048] | [13579] [26]) | ('0' [048] | [2468] [048] | [13579] [26]) '00')g"},
      // RFC 3339 full-time. A leap second is valid only where the time is
      // 23:59:60 in UTC; only the spellings with a zero offset are offered.
      {"format-time", R"g(format-hour ':' [0-5] [0-9] ':' [0-5] [0-9] format-fraction? format-offset)g"
                      R"g( | '23:59:60' format-fraction? ([Zz] | [+\-] '00:00'))g"},
      {"format-hour", R"g([01] [0-9] | '2' [0-3])g"},
      {"format-fraction", R"g('.' [0-9]+)g"},
      {"format-offset", R"g([Zz] | [+\-] format-hour ':' [0-5] [0-9])g"},
      {"format-date-time", R"g(format-date [Tt] format-time)g"},
      // Google's API Discovery formats: an RFC 3339 time in UTC, and seconds
      // with up to nine fractional digits and an "s".
      {"format-google-datetime",
       R"g(format-date 'T' format-hour ':' [0-5] [0-9] ':' [0-5] [0-9] format-fraction? 'Z')g"},
      {"format-google-duration", R"g('-'? [0-9]+ ('.' [0-9]{1,9})? 's')g"},
      // A FieldMask in JSON: field paths (names joined by dots), joined by commas.
      {"format-google-fieldmask", R"g((format-fieldmask-path (',' format-fieldmask-path)*)?)g"},
      {"format-fieldmask-path", R"g([A-Za-z_] [A-Za-z0-9_]* ('.' [A-Za-z_] [A-Za-z0-9_]*)*)g"},
      // ECMA-262 regular expressions that compile with the u flag (as Ajv's
      // regex format checks them), written in a subset of their syntax:
      // alternatives of quantified atoms (a literal character, ".", a class,
      // a group, a class escape or an escaped syntax character) and anchors.
      // Class ranges only between printable ASCII characters, in order;
      // quantifier counts as {n} or {n,}. A regex backslash is JSON's \\ here.
      {"format-regex", R"g(format-re-terms ('|' format-re-terms)*)g"},
      {"format-re-terms", R"g((format-re-atom format-re-quantifier? | '^' | '$' | '\\' [bB])*)g"},
      {"format-re-atom",
       R"g(format-re-char | '.' | '(' ('?:')? format-regex ')')g"
       R"g( | '[' '^'? (format-re-range | format-re-class-char)* ']')g"
       R"g( | '\\' ([dDwWsSfnrtv] | [\^$.|?*+()[\]{}/] | '\\'))g"},
      {"format-re-char", R"g([^"\\\x00-\x1f^$.|?*+()[\]{}] | format-re-json-escape)g"},
      {"format-re-class-char",
       R"g([^"\\\x00-\x1f\]\-] | format-re-json-escape | '\\' ([dDwWsSbfnrtv] | [\^$.|?*+()[\]{}/\-] | '\\'))g"},
      // A JSON escape other than \\ (the regex's backslash): a quote or a
      // control character, a literal to the regex.
      {"format-re-json-escape", R"g('\' ["bfnrt] | '\u000' [0-7bef] | '\u001' [0-9a-f])g"},
      {"format-re-range", regex_ranges()},
      {"format-re-quantifier", R"g(([*+?] | '{' [0-9]+ ','? '}') '?'?)g"},
      {"format-uuid",
       R"g([0-9A-Fa-f]{8} '-' [0-9A-Fa-f]{4} '-' [0-9A-Fa-f]{4} '-' [0-9A-Fa-f]{4} '-' [0-9A-Fa-f]{12})g"},
      {"format-ipv4", R"g(format-dec-octet '.' format-dec-octet '.' format-dec-octet '.' format-dec-octet)g"},
      {"format-dec-octet", R"g([0-9] | [1-9] [0-9] | '1' [0-9] [0-9] | '2' [0-4] [0-9] | '25' [0-5])g"},
      // RFC 3986's IPv6address: at most eight groups, "::" once.
      {"format-ipv6",
       R"g((format-h16 ':'){6} format-ls32 | '::' (format-h16 ':'){5} format-ls32)g"
       R"g( | format-h16? '::' (format-h16 ':'){4} format-ls32)g"
       R"g( | ((format-h16 ':')? format-h16)? '::' (format-h16 ':'){3} format-ls32)g"
       R"g( | ((format-h16 ':'){0,2} format-h16)? '::' (format-h16 ':'){2} format-ls32)g"
       R"g( | ((format-h16 ':'){0,3} format-h16)? '::' format-h16 ':' format-ls32)g"
       R"g( | ((format-h16 ':'){0,4} format-h16)? '::' format-ls32)g"
       R"g( | ((format-h16 ':'){0,5} format-h16)? '::' format-h16 | ((format-h16 ':'){0,6} format-h16)? '::')g"},
      {"format-h16", R"g([0-9A-Fa-f]{1,4})g"},
      {"format-ls32", R"g(format-h16 ':' format-h16 | format-ipv4)g"},
      // RFC 1123 labels, any number of them: the 253-character total is not
      // enforced (a bound of 127 labels did not enforce it either, and kept
      // every label a call of its own, which made masks at a label's end a
      // walk across a return; unbounded, the labels compile inline).
      {"format-hostname", R"g(format-label ('.' format-label)*)g"},
      {"format-label", R"g([A-Za-z0-9] ([A-Za-z0-9\-]{0,61} [A-Za-z0-9])?)g"},
      // RFC 5321's Mailbox in the form every validator takes: a dot-atom
      // local part and a domain name of two labels or more. The RFC also
      // allows a quoted local part, a one-label domain and address literals
      // ([192.0.2.1]), which Ajv's email format (what most JSON tooling
      // checks with) refuses: documents carrying them would fail there, so
      // they are not written.
      {"format-email", R"g(format-email-local '@' format-label ('.' format-label)+)g"},
      {"format-email-local", R"g(format-atext+ ('.' format-atext+)*)g"},
      {"format-atext", R"g([A-Za-z0-9!#$%&\x27*+/=?\^_`{|}~\-])g"},
      // RFC 3986's URI (absolute: a scheme is required).
      {"format-uri",
       R"g([A-Za-z] [A-Za-z0-9+.\-]* ':' format-uri-hier? ('?' format-uri-query)? ('#' format-uri-query)?)g"},
      {"format-uri-hier", R"g('//' format-uri-authority format-uri-path | '/' (format-uri-pchar+ format-uri-path)?)g"
                          R"g( | format-uri-pchar+ format-uri-path)g"},
      {"format-uri-path", R"g(('/' format-uri-pchar*)*)g"},
      {"format-uri-authority", R"g((format-uri-userinfo '@')? format-uri-host (':' [0-9]*)?)g"},
      {"format-uri-userinfo", R"g(([A-Za-z0-9._~!$&\x27()*+,;=:\-] | format-uri-pct)*)g"},
      {"format-uri-host",
       R"g('[' (format-ipv6 | [vV] [0-9A-Fa-f]+ '.' [A-Za-z0-9._~!$&\x27()*+,;=:\-]+) ']' | format-ipv4)g"
       R"g( | ([A-Za-z0-9._~!$&\x27()*+,;=\-] | format-uri-pct)*)g"},
      {"format-uri-pchar", R"g([A-Za-z0-9._~!$&\x27()*+,;=:@\-] | format-uri-pct)g"},
      {"format-uri-query", R"g((format-uri-pchar | [/?])*)g"},
      {"format-uri-pct", R"g('%' [0-9A-Fa-f]{2})g"},
      // RFC 3986's URI-reference: a URI, or a relative reference (its first
      // segment without a colon, so that it reads as no scheme).
      {"format-uri-reference", R"g(format-uri | format-uri-relative-part? ('?' format-uri-query)? ('#' format-uri-query)?)g"},
      {"format-uri-relative-part",
       R"g('//' format-uri-authority format-uri-path | '/' (format-uri-pchar+ format-uri-path)?)g"
       R"g( | format-uri-nc+ format-uri-path)g"},
      {"format-uri-nc", R"g([A-Za-z0-9._~!$&\x27()*+,;=@\-] | format-uri-pct)g"},
      // RFC 3339's duration (its appendix A, ISO 8601's form).
      {"format-duration", R"g('P' (format-dur-date | format-dur-time | [0-9]+ 'W'))g"},
      {"format-dur-date", R"g((format-dur-day | format-dur-month | format-dur-year) format-dur-time?)g"},
      {"format-dur-time", R"g('T' (format-dur-hour | format-dur-minute | format-dur-second))g"},
      {"format-dur-year", R"g([0-9]+ 'Y' format-dur-month?)g"},
      {"format-dur-month", R"g([0-9]+ 'M' format-dur-day?)g"},
      {"format-dur-day", R"g([0-9]+ 'D')g"},
      {"format-dur-hour", R"g([0-9]+ 'H' format-dur-minute?)g"},
      {"format-dur-minute", R"g([0-9]+ 'M' format-dur-second?)g"},
      {"format-dur-second", R"g([0-9]+ 'S')g"},
      // RFC 6901's JSON pointer; its characters as a JSON string holds them.
      {"format-json-pointer", R"g(('/' format-pointer-char*)*)g"},
      {"format-pointer-char", R"g([^"\\\x00-\x1f/~] | json-escape | '~' [01])g"},
      // A relative JSON pointer: levels up, then '#' or a pointer.
      {"format-relative-json-pointer", R"g(('0' | [1-9] [0-9]*) ('#' | format-json-pointer))g"},
      // RFC 4648 base64, standard alphabet, padded to a multiple of four
      // characters; the bits padding leaves over are zero (section 3.5), as
      // an encoder writes them.
      {"format-byte", R"g(format-base64-quad* (format-base64-char{2} [AEIMQUYcgkosw048] '=')g"
                      R"g( | format-base64-char [AQgw] '==')?)g"},
      {"format-base64-quad", R"g(format-base64-char{4})g"},
      {"format-base64-char", R"g([A-Za-z0-9+/])g"},
  };
  return *rules;
}

// The format's rules (and those they call), as one grammar whose root is
// `prefix` format `suffix` (EBNF text of literals).
Grammar format_rules(const std::string& format, std::string_view prefix, std::string_view suffix) {
  const std::string rule = format == "url" ? "format-uri" : "format-" + format;
  std::string text = fmt::format("root ::= {} {} {}\n", prefix, rule, suffix);
  std::set<std::string> written;
  std::vector<std::string> work{rule};
  while (!work.empty()) {
    const std::string name = work.back();
    work.pop_back();
    if (!written.insert(name).second) continue;
    const std::string body = with_literals(fixed_rules().at(name));
    text += fmt::format("{} ::= {}\n", name, body);
    for (const std::string& callee : names_in(body))
      if (fixed_rules().contains(callee)) work.push_back(callee);
  }
  return parse_ebnf(text);
}

// The strings of `format` (one of kFormats) as a grammar writes them: their
// JSON text, quotes included.
std::shared_ptr<const CompiledGrammar> format_grammar(const std::string& format) {
  return compile_grammar(format_rules(format, ebnf_literal("\""), ebnf_literal("\"")));
}

// A code point the format rules write as itself in JSON text and a regex
// reads as itself when written \uXXXX: not a quote, a backslash or a
// control character (JSON escapes those), no surrogate, at most U+FFFF.
bool plain_code_point(uint32_t c) {
  return c >= 0x20 && c != '"' && c != '\\' && (c < 0xD800 || c > 0xDFFF) && c <= 0xFFFF;
}

// An ECMAScript regex for the strings of the format's rules (over JSON
// text) whose text has no escape: sequences, choices, classes and
// repetitions as written, calls of other rules written out. Narrower where
// the rules say more: a choice's alternatives that need an escaped
// character are left out, as are such characters from classes, and so are
// alternatives that recurse (a regex's groups). None where nothing is left.
// `open`: the rules being written out.
std::optional<std::string> regex_of(const Grammar& g, const GrammarExpr& e, std::vector<int32_t>& open) {
  using K = GrammarExpr::Kind;
  const auto code_point = [](uint32_t c) { return fmt::format("\\u{:04X}", c); };
  switch (e.kind) {
    case K::kBytes: {
      std::string out;
      for (const char c : e.bytes) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x80 || !plain_code_point(u)) return std::nullopt;
        out += code_point(u);
      }
      return "(?:" + out + ")";
    }
    case K::kClass: {
      std::vector<std::pair<uint32_t, uint32_t>> ranges;  // the plain code points of the class
      const auto add_plain = [&](uint32_t lo, uint32_t hi) {
        lo = std::max<uint32_t>(lo, 0x20);
        hi = std::min<uint32_t>(hi, 0xFFFF);
        // Less the quote, the backslash and the surrogates, in order.
        for (const auto& [cut_lo, cut_hi] : {std::pair<uint32_t, uint32_t>{'"', '"'}, {'\\', '\\'},
                                             {0xD800, 0xDFFF}}) {
          if (lo <= cut_hi && cut_lo <= hi) {
            if (cut_lo > lo) ranges.emplace_back(lo, cut_lo - 1);
            lo = cut_hi + 1;
          }
        }
        if (lo <= hi) ranges.emplace_back(lo, hi);
      };
      std::vector<std::pair<uint32_t, uint32_t>> sorted = e.ranges;
      std::sort(sorted.begin(), sorted.end());
      if (e.negated) {
        uint32_t next = 0;  // the first code point no range covers yet
        for (const auto& [lo, hi] : sorted) {
          if (lo > next) add_plain(next, lo - 1);
          next = std::max(next, hi + 1);
        }
        add_plain(next, 0xFFFF);
      } else {
        for (const auto& [lo, hi] : sorted) add_plain(lo, hi);
      }
      if (ranges.empty()) return std::nullopt;
      std::string out = "[";
      for (const auto& [lo, hi] : ranges) out += lo == hi ? code_point(lo) : code_point(lo) + "-" + code_point(hi);
      return out + "]";
    }
    case K::kRuleRef: {
      if (std::find(open.begin(), open.end(), e.rule) != open.end()) return std::nullopt;
      open.push_back(e.rule);
      std::optional<std::string> body = regex_of(g, g.rules[static_cast<size_t>(e.rule)].body, open);
      open.pop_back();
      return body;
    }
    case K::kSequence: {
      std::string out = "(?:";
      for (const GrammarExpr& c : e.children) {
        const std::optional<std::string> part = regex_of(g, c, open);
        if (!part) return std::nullopt;
        out += *part;
      }
      return out + ")";
    }
    case K::kChoice: {
      std::vector<std::string> parts;
      for (const GrammarExpr& c : e.children)
        if (std::optional<std::string> part = regex_of(g, c, open)) parts.push_back(std::move(*part));
      if (parts.empty()) return std::nullopt;
      std::string out = "(?:";
      for (size_t i = 0; i < parts.size(); ++i) out += (i ? "|" : "") + parts[i];
      return out + ")";
    }
    case K::kRepeat: {
      const std::optional<std::string> part = regex_of(g, e.children[0], open);
      if (!part) return e.min == 0 ? std::optional<std::string>("(?:)") : std::nullopt;
      if (e.max < 0) return fmt::format("(?:{}){{{},}}", *part, e.min);
      return fmt::format("(?:{}){{{},{}}}", *part, e.min, e.max);
    }
  }
  return std::nullopt;
}

// The strings of `format` (one of kFormats) as a language, where the format's
// rules are regular and fit its automaton (see regex_of); none otherwise.
std::optional<RegexLanguage> format_language(const std::string& format) {
  const Grammar g = format_rules(format, "", "");
  std::vector<int32_t> open{g.root};
  const std::optional<std::string> regex = regex_of(g, g.rules[static_cast<size_t>(g.root)].body, open);
  if (!regex) return std::nullopt;
  try {
    return RegexLanguage::of_pattern("^" + *regex + "$", RegexMode::kSearch);
  } catch (const Error&) {
    return std::nullopt;
  }
}



// Names of the shared rules built here rather than fixed (they depend on the
// whitespace option).
constexpr std::string_view kBuiltRules[] = {"json-object", "json-array", "json-member", "ws", "root"};

// The name a rule for the schema at `path` gets: the pointer's tokens, made
// name characters. Never contains '.', which the names of regex rules and of
// this file's helper rules do.
std::string rule_hint(const std::string& path) {
  if (path == "#") return "root";
  std::string out;
  for (size_t i = 2; i < path.size(); ++i) {
    const char c = path[i];
    if (c == '/') {
      out.push_back('-');
    } else if (c != '$') {
      out.push_back((std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_');
    }
  }
  return out.empty() ? "schema" : out;
}

// The code points of UTF-8 text (JSON strings are valid UTF-8).
std::vector<uint32_t> code_points(std::string_view text) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<uint8_t>(text[i]);
    const int extra = lead < 0x80 ? 0 : lead < 0xE0 ? 1 : lead < 0xF0 ? 2 : 3;
    BASALT_CHECK(i + static_cast<size_t>(extra) < text.size(), "json schema: invalid UTF-8 in \"{}\"", text);
    uint32_t c = extra == 0 ? lead : lead & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) c = (c << 6) | (static_cast<uint8_t>(text[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(c);
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

// The code point as dump() writes it inside a string.
std::string json_spelling(uint32_t c) {
  std::string utf8;
  if (c < 0x80) {
    utf8.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    utf8 += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
  } else if (c < 0x10000) {
    utf8 += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
             static_cast<char>(0x80 | (c & 0x3F))};
  } else {
    utf8 += {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
             static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
  }
  const std::string quoted = Json(utf8).dump();
  return quoted.substr(1, quoted.size() - 2);
}

// --- The translation --------------------------------------------------------------

// The grammar of one schema: an expression, or none when no JSON value
// satisfies the schema (and why).
struct Translation {
  std::string expr;
  std::string no_value_reason;

  bool satisfiable() const { return !expr.empty(); }
  static Translation of(std::string expr) { return {std::move(expr), ""}; }
  static Translation none(std::string reason) { return {"", std::move(reason)}; }
};

class Translator {
 public:
  Translator(const Json& document, const JsonSchemaOptions& options)
      : document_(document), rule_prefix_(options.rule_prefix) {
    BASALT_CHECK(options.max_whitespace >= 0 && options.max_whitespace <= kMaxRepetition,
                 "json schema: max_whitespace must be between 0 and {}, not {}", kMaxRepetition,
                 options.max_whitespace);
    BASALT_CHECK(rule_prefix_.empty() || (is_name(rule_prefix_) && rule_prefix_[0] != '.'),
                 "json schema: rule_prefix \"{}\" must be name characters [A-Za-z0-9_.-] not "
                 "starting with '.'",
                 rule_prefix_);
    for (const auto& [name, body] : fixed_rules()) names_.emplace(name);
    for (const std::string_view name : kBuiltRules) names_.emplace(name);
    if (!options.compact && options.max_whitespace > 0) {
      ws_ = "ws";
      rules_.emplace_back("ws", fmt::format("[ \\t\\n\\r]{{0,{}}}", options.max_whitespace));
    }
    sep_ = seq({ws_, lit(","), ws_});
    if (document.is_object()) {
      // 2019-09 on: $id; drafts 4 to 7 as well: id, which draft 4 spells.
      const Json* id = member(document, "$id");
      if (!id || !id->is_string()) id = member(document, "id");
      if (id && id->is_string()) document_id_ = id->get<std::string>();
      // "https://example.com/s#" is "https://example.com/s".
      if (document_id_.ends_with("#")) document_id_.pop_back();
      const Json* dialect = member(document, "$schema");
      if (dialect && dialect->is_string()) {
        const std::string name = dialect->get<std::string>();
        BASALT_CHECK(known_dialect(name),
                     "json schema: unsupported keyword \"$schema\" at #: \"{}\" is not a JSON Schema draft's "
                     "metaschema, so the vocabularies it enables are unknown",
                     name);
        for (const char* draft : {"draft-03", "draft-04", "draft-05", "draft-06", "draft-07"})
          siblings_of_ref_ignored_ = siblings_of_ref_ignored_ || name.find(draft) != std::string::npos;
      }
    }
  }

  // The metaschemas of the drafts (and their hyper-schemas, which add only
  // annotations), as http or https, with or without the empty fragment; a
  // custom metaschema may turn vocabularies off, which nothing here can see.
  static bool known_dialect(std::string_view name) {
    if (name.ends_with("#")) name.remove_suffix(1);
    for (const std::string_view scheme : {"http://", "https://"})
      if (name.starts_with(scheme)) name.remove_prefix(scheme.size());
    if (!name.starts_with("json-schema.org/")) return false;
    name.remove_prefix(std::string_view("json-schema.org/").size());
    for (const std::string_view draft : {"", "draft-03/", "draft-04/", "draft-05/", "draft-06/", "draft-07/",
                                         "draft/2019-09/", "draft/2020-12/"}) {
      if (!name.starts_with(draft)) continue;
      const std::string_view rest = name.substr(draft.size());
      if (rest == "schema" || (!draft.empty() && rest == "hyper-schema")) return true;
    }
    return false;
  }

  std::string document_grammar() {
    const Translation root = target("#", "#", "root", [&] { return translate(document_, "#"); });
    BASALT_CHECK(root.satisfiable(), "json schema: no value satisfies the schema: {}", root.no_value_reason);
    refuse_cycles_before_text();
    std::string text = assemble();
    refuse_endless_recursion(text);
    return prefixed(std::move(text));
  }

  std::string any_object_grammar() {
    rules_.emplace_back("root", use("json-object"));
    return prefixed(assemble());
  }

 private:
  // A schema with its own rule: a $ref target or a merged schema.
  struct Target {
    std::string name;
    std::string display;  // the pointer or path, for messages
    bool open = true;     // being translated
    bool referenced_while_open = false;
    bool satisfiable = false;
    std::string no_value_reason;
  };
  struct Owner {
    std::string key;
    int depth;  // container depth where its translation began
  };
  // An allOf merged into one schema; false when the branches contradict.
  struct Merged {
    Json schema = Json::object();
    std::string no_value_reason;
    std::set<std::string> refs;  // $ref targets merged in: a second time adds nothing
  };
  using Part = std::pair<const Json*, std::string>;  // a schema and its path
  // A listed property: its member text (key, colon, value).
  struct ObjectMember {
    std::string text;
    bool required;
  };

  // Translating, merging and summarizing recurse into subschemas and
  // through $ref: a chain of thousands of $ref, allOf or anyOf would
  // exhaust the stack, so past kMaxNesting levels the schema is refused.
  class NestingGuard {
   public:
    NestingGuard(int& nesting, const std::string& path) : nesting_(nesting) {
      BASALT_CHECK(nesting_ < kMaxNesting,
                   "json schema: the schema at {} is nested (through subschemas and $ref) deeper than {} levels", path,
                   kMaxNesting);
      ++nesting_;
    }
    ~NestingGuard() { --nesting_; }
    NestingGuard(const NestingGuard&) = delete;
    NestingGuard& operator=(const NestingGuard&) = delete;

   private:
    int& nesting_;
  };

  class DepthGuard {
   public:
    explicit DepthGuard(int& depth) : depth_(depth) { ++depth_; }
    ~DepthGuard() { --depth_; }

   private:
    int& depth_;
  };

  // --- Rules ---

  std::string unique_name(const std::string& hint) {
    // The next suffix to try is kept per hint: a schema with thousands of
    // rules of one hint would otherwise try every suffix taken before.
    std::string name = hint;
    for (int& i = next_suffix_.try_emplace(hint, 2).first->second; names_.contains(name); ++i) name = fmt::format("{}-{}", hint, i);
    names_.insert(name);
    return name;
  }

  std::string define(const std::string& hint, std::string body) {
    std::string name = unique_name(hint);
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  // `expr`, or a rule for it where it is large enough that writing it out
  // more than once would cost.
  std::string share(std::string expr, const std::string& hint) {
    if (is_name(expr) || expr.size() <= 48) return expr;
    return define(hint, std::move(expr));
  }

  // A shared rule, defined on first use (with the rules it calls).
  std::string use(std::string_view name) {
    const std::string key(name);
    if (defined_.contains(key)) return key;
    defined_.insert(key);
    const auto fixed = fixed_rules().find(name);
    std::string body;
    if (fixed != fixed_rules().end()) {
      body = with_literals(fixed->second);
      for (const std::string& callee : names_in(body))
        if (fixed_rules().contains(callee) || listed(callee, kBuiltRules)) use(callee);
    } else if (name == "json-member") {
      body = seq({use("json-string"), ws_, lit(":"), ws_, use("json-value")});
    } else if (name == "json-object") {
      body = seq({lit("{"), ws_, members(use("json-member"), true, 0, std::nullopt, "}", "json-member")});
    } else {
      BASALT_ASSERT(name == "json-array");
      body = seq({lit("["), ws_, members(use("json-value"), true, 0, std::nullopt, "]", "json-value")});
    }
    rules_.emplace_back(key, std::move(body));
    return key;
  }

  std::string prefixed(std::string text) const {
    return rule_prefix_.empty() ? text : with_prefixed_names(text, rule_prefix_);
  }

  std::string assemble() const {
    std::string out;
    for (const auto& [name, body] : rules_)
      if (name == "root") out += fmt::format("{} ::= {}\n", name, body);
    for (const auto& [name, body] : rules_)
      if (name != "root") out += fmt::format("{} ::= {}\n", name, body);
    return out + pattern_rules_;
  }

  // --- Repetition ---

  // atom{kChunk}, once per atom.
  std::string chunk_of(const std::string& atom) {
    auto [it, inserted] = chunks_.try_emplace(atom);
    if (inserted) it->second = define(atom + ".chunk", repeat_suffix(atom, kChunk, kChunk));
    return it->second;
  }

  std::string exactly(const std::string& atom, int64_t count) {
    if (count <= kChunk) return count == 0 ? "" : repeat_suffix(atom, count, count);
    return seq({exactly(chunk_of(atom), count / kChunk), exactly(atom, count % kChunk)});
  }

  // atom{0,count}, unambiguously: a < q whole chunks then fewer than kChunk,
  // or q chunks then at most r (count = q * kChunk + r).
  std::string at_most(const std::string& atom, int64_t count) {
    if (count <= kChunk) return repeat_suffix(atom, 0, count);
    const std::string chunk = chunk_of(atom);
    const int64_t q = count / kChunk, r = count % kChunk;
    return alt(
        {seq({at_most(chunk, q - 1), repeat_suffix(atom, 0, kChunk - 1)}), seq({exactly(chunk, q), at_most(atom, r)})});
  }

  // `expr` repeated lo to hi times (hi absent: unbounded); "" for none.
  std::string times(std::string expr, int64_t lo, std::optional<int64_t> hi, const std::string& hint) {
    if (hi && *hi == 0) return "";
    const int64_t unrolled = hi ? *hi : lo;
    if (!is_name(expr) && unrolled > 4 && expr.size() > 16) expr = define(hint, expr);
    if (lo <= kChunk && (!hi || *hi <= kChunk)) return repeat_suffix(expr, lo, hi);
    if (!is_name(expr)) expr = define(hint, expr);
    if (!hi) return seq({exactly(expr, lo), expr + "*"});
    return seq({exactly(expr, lo), at_most(expr, *hi - lo)});
  }

  // A string's characters, between lo and hi of them (hi absent: any
  // number), then its closing quote. Counts up to kCharChunk are written
  // out; larger ones in rules of kCharChunk characters that end by calling
  // the next (tail calls: the stack stays one deep), each holding its
  // closing quote so that no state inside the characters can end the rule.
  // The characters then compile inline (grammar/automaton.cc inlines small
  // rules repeated in a rule) to byte edges, which the token-mask walk
  // follows without calls or returns.
  std::string chars_then_quote(int64_t lo, std::optional<int64_t> hi, const std::string& hint) {
    const std::string ch = use("json-char"), quote = lit("\"");
    std::string head = exactly(ch, lo);
    if (!hi) return seq({head, ch + "*", quote});
    // Past kMaxCharRuns runs, the rules would cost more to compile than the
    // walk saves: the characters are counted as other repetitions are.
    if (*hi - lo > kCharChunk * kMaxCharRuns) return seq({times(ch, lo, hi, hint), quote});
    return seq({head, at_most_then(ch, *hi - lo, quote, hint)});
  }
  // atom{0,count} then `end`, deterministic from the left: after fewer
  // than kCharChunk atoms, `end` or more atoms; after kCharChunk of them,
  // the same for count - kCharChunk (a rule of its own, called last).
  std::string at_most_then(const std::string& atom, int64_t count, const std::string& end, const std::string& hint) {
    if (count < kCharChunk) return seq({repeat_suffix(atom, 0, count), end});
    const std::string key = fmt::format("{}#{}#{}", atom, end, count);
    if (const auto it = chunks_.find(key); it != chunks_.end()) return it->second;
    const std::string name = unique_name(hint + ".upto");
    chunks_.emplace(key, name);
    std::string rest = at_most_then(atom, count - kCharChunk, end, hint);
    rules_.emplace_back(name, alt({seq({repeat_suffix(atom, 0, kCharChunk - 1), end}),
                                   seq({repeat_suffix(atom, kCharChunk, kCharChunk), rest})}));
    return name;
  }

  // The closing bracket after `count` members.
  std::string close(int64_t count, std::string_view bracket) const {
    return count == 0 ? lit(bracket) : seq({ws_, lit(bracket)});
  }

  // Between lo and hi more members `item` (hi absent: any number), then the
  // closing bracket; `first`: none has been written yet.
  std::string members(const std::string& item, bool first, int64_t lo, std::optional<int64_t> hi,
                      std::string_view bracket, const std::string& hint) {
    if (hi && *hi == 0) return close(first ? 0 : 1, bracket);
    const std::string more = seq({sep_, item});
    const auto one_less = [](std::optional<int64_t> n) { return n ? std::optional<int64_t>(*n - 1) : n; };
    if (!first) return seq({times(more, lo, hi, hint + ".more"), ws_, lit(bracket)});
    if (lo == 0)
      return seq({"(" + seq({item, times(more, 0, one_less(hi), hint + ".more"), ws_}) + ")?", lit(bracket)});
    return seq({item, times(more, lo - 1, one_less(hi), hint + ".more"), ws_, lit(bracket)});
  }

  // --- Keywords ---

  void check_keywords(const Json& schema, const std::string& path) const {
    for (const auto& [key, value] : schema.items()) {
      if ((key == "$id" || key == "id") && path != "#") check_embedded_id(schema, path);
      BASALT_CHECK(!listed(key, kUnenforcedKeywords), "json schema: unsupported keyword \"{}\" at {}", key, path);
      BASALT_CHECK(key != "uniqueItems" || value.is_boolean(), "json schema: keyword \"uniqueItems\" at {} must be a boolean",
                   path);
    }
  }

  // The identifier ($id, or draft 4's id) a schema below the root declares
  // as its base URI; none when it has none, or only names the schema with a
  // fragment ("#name"), which changes no base URI.
  static std::optional<std::pair<std::string, std::string>> base_changing_id(const Json& schema) {
    if (!schema.is_object()) return std::nullopt;
    for (const char* key : {"$id", "id"}) {
      const Json* id = member(schema, key);
      if (id && id->is_string() && !id->get<std::string>().empty() && id->get<std::string>()[0] != '#')
        return std::pair<std::string, std::string>(key, id->get<std::string>());
    }
    return std::nullopt;
  }

  static bool contains_ref(const Json& value) {
    if (value.is_object()) {
      if (value.contains("$ref")) return true;
      return std::any_of(value.begin(), value.end(), [](const Json& v) { return contains_ref(v); });
    }
    if (value.is_array()) return std::any_of(value.begin(), value.end(), [](const Json& v) { return contains_ref(v); });
    return false;
  }

  // A schema embedded under its own identifier is an annotation as long as
  // nothing resolves against that identifier: a $ref elsewhere that names it
  // is not a pointer into this document and is refused anyway, but a $ref
  // inside it ("#/definitions/x" too) would resolve against it, where the
  // translation resolves every $ref against the document.
  static void check_embedded_id(const Json& schema, const std::string& path) {
    const auto id = base_changing_id(schema);
    if (!id || !contains_ref(schema)) return;
    fail(
        "json schema: unsupported keyword \"{}\" at {}: a $ref inside a schema embedded under its "
        "own identifier "
        "(\"{}\") resolves against that identifier, which is not supported",
        id->first, path, id->second);
  }

  static bool is_assertion(std::string_view key) { return enforced(key) && key != "$defs" && key != "definitions"; }

  // Whether `schema` asserts anything besides the keywords in `besides`.
  static bool has_assertions(const Json& schema, std::initializer_list<std::string_view> besides) {
    for (const auto& [key, value] : schema.items()) {
      if (is_assertion(key) && std::find(besides.begin(), besides.end(), key) == besides.end()) return true;
    }
    return false;
  }

  // --- $ref and targets ---

  // The canonical pointer a $ref names and the schema there.
  std::pair<std::string, const Json*> resolve(const Json& ref, const std::string& path) const {
    BASALT_CHECK(ref.is_string(), "json schema: keyword \"$ref\" at {} must be a string", path);
    std::string text = ref.get<std::string>();
    // The root's own $id, followed by a fragment or by nothing, is this document.
    if (!document_id_.empty() && text.starts_with(document_id_)) {
      const std::string fragment = text.substr(document_id_.size());
      if (fragment.empty() || fragment[0] == '#') text = fragment.empty() ? "#" : fragment;
    }
    BASALT_CHECK(!text.empty() && text[0] == '#',
                 "json schema: unsupported keyword \"$ref\" at {}: \"{}\" is not within this "
                 "document (remote "
                 "references are not fetched)",
                 path, ref.get<std::string>());
    std::string fragment;
    for (size_t i = 1; i < text.size(); ++i) {
      if (text[i] != '%') {
        fragment.push_back(text[i]);
        continue;
      }
      BASALT_CHECK(i + 2 < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
                       std::isxdigit(static_cast<unsigned char>(text[i + 2])),
                   "json schema: keyword \"$ref\" at {}: bad percent-encoding in \"{}\"", path, text);
      fragment.push_back(static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    }
    BASALT_CHECK(fragment.empty() || fragment[0] == '/',
                 "json schema: unsupported keyword \"$ref\" at {}: \"{}\" names an anchor, not a "
                 "JSON pointer",
                 path, text);
    const Json* at = &document_;
    std::string pointer = "#";
    size_t start = 1;
    while (start <= fragment.size() && !fragment.empty()) {
      const size_t end = std::min(fragment.find('/', start), fragment.size());
      std::string token;
      for (size_t i = start; i < end; ++i) {
        if (fragment[i] != '~') {
          token.push_back(fragment[i]);
          continue;
        }
        BASALT_CHECK(i + 1 < end && (fragment[i + 1] == '0' || fragment[i + 1] == '1'),
                     "json schema: keyword \"$ref\" at {}: bad ~ escape in \"{}\"", path, text);
        token.push_back(fragment[++i] == '0' ? '~' : '/');
      }
      // The target itself is checked where it is translated (check_keywords).
      if (const auto id = base_changing_id(*at); id && at != &document_ && contains_ref(*at)) {
        fail(
            "json schema: unsupported keyword \"$ref\" at {}: \"{}\" reaches into a schema "
            "embedded under its own "
            "identifier (\"{}\"), whose $refs resolve against that identifier, which is not "
            "supported",
            path, ref.get<std::string>(), id->second);
      }
      if (at->is_object() && at->contains(token)) {
        at = &at->at(token);
      } else if (at->is_array() && !token.empty() &&
                 std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                 std::stoull(token) < at->size()) {
        at = &at->at(std::stoull(token));
      } else {
        fail("json schema: keyword \"$ref\" at {}: \"{}\" points at nothing", path, ref.get<std::string>());
      }
      pointer = child_path(pointer, token);
      start = end + 1;
    }
    return {pointer, at};
  }

  Translation translate_ref(const Json& ref, const std::string& path) {
    const auto [pointer, schema] = resolve(ref, path);
    return target(pointer, pointer, rule_hint(pointer),
                  [&, at = schema, where = pointer] { return translate(*at, where); });
  }

  // The rule of a schema that has one (`key` names it), translated on first
  // use; references while it is being translated are recursion.
  Translation target(const std::string& key, const std::string& display, const std::string& hint,
                     const std::function<Translation()>& build) {
    if (!owners_.empty() && owners_.back().depth == depth_) before_text_[owners_.back().key].insert(key);
    if (const auto it = targets_.find(key); it != targets_.end()) {
      Target& t = it->second;
      if (t.open) {
        t.referenced_while_open = true;
        return Translation::of(t.name);
      }
      return t.satisfiable ? Translation::of(t.name) : Translation::none(t.no_value_reason);
    }
    Target& fresh = targets_[key];
    fresh.name = key == "#" ? "root" : unique_name(hint);
    fresh.display = display;
    owners_.push_back({key, depth_});
    Translation result = build();
    owners_.pop_back();
    Target& done = targets_.at(key);
    done.open = false;
    if (!result.satisfiable()) {
      BASALT_CHECK(!done.referenced_while_open,
                   "json schema: the schema at {} refers to itself but no value satisfies it: {}", display,
                   result.no_value_reason);
      done.no_value_reason = result.no_value_reason;
      return result;
    }
    done.satisfiable = true;
    rules_.emplace_back(done.name, result.expr);
    return Translation::of(done.name);
  }

  // A $ref cycle with no object or array on the way would recurse before
  // writing anything: left recursion, and an infinitely deep schema.
  void refuse_cycles_before_text() const {
    std::map<std::string, int> state;  // 1: on the path, 2: done
    std::vector<std::string> path;
    std::function<void(const std::string&)> visit = [&](const std::string& key) {
      state[key] = 1;
      path.push_back(key);
      if (const auto it = before_text_.find(key); it != before_text_.end()) {
        for (const std::string& next : it->second) {
          if (state[next] == 1) {
            std::string cycle;
            for (auto p = std::find(path.begin(), path.end(), next); p != path.end(); ++p)
              cycle += targets_.at(*p).display + " -> ";
            fail(
                "json schema: unsupported keyword \"$ref\" at {}: {}{} refers to itself before any "
                "JSON text",
                targets_.at(next).display, cycle, targets_.at(next).display);
          }
          if (state[next] == 0) visit(next);
        }
      }
      path.pop_back();
      state[key] = 2;
    };
    for (const auto& [key, callees] : before_text_)
      if (state[key] == 0) visit(key);
  }

  // A recursion every value must take again (a required property, minItems)
  // has no finite value: the root rule would produce no text.
  static void refuse_endless_recursion(const std::string& text) {
    const Grammar grammar = parse_ebnf(text);
    std::vector<bool> productive(grammar.rules.size(), false);
    std::function<bool(const GrammarExpr&)> yields = [&](const GrammarExpr& e) -> bool {
      switch (e.kind) {
        case GrammarExpr::Kind::kBytes:
        case GrammarExpr::Kind::kClass:
          return true;
        case GrammarExpr::Kind::kRuleRef:
          return productive[static_cast<size_t>(e.rule)];
        case GrammarExpr::Kind::kSequence:
          return std::all_of(e.children.begin(), e.children.end(), yields);
        case GrammarExpr::Kind::kChoice:
          return std::any_of(e.children.begin(), e.children.end(), yields);
        case GrammarExpr::Kind::kRepeat:
          return e.min == 0 || yields(e.children[0]);
      }
      return false;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < grammar.rules.size(); ++r) {
        if (!productive[r] && yields(grammar.rules[r].body)) productive[r] = changed = true;
      }
    }
    BASALT_CHECK(productive[static_cast<size_t>(grammar.root)],
                 "json schema: no finite value satisfies the schema: every value would have to "
                 "contain itself "
                 "through $ref");
  }

  // --- Schemas ---

  Translation translate(const Json& schema, const std::string& path) {
    const NestingGuard guard(nesting_, path);
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return Translation::of(use("json-value"));
      return Translation::none(fmt::format("the schema at {} is false", path));
    }
    BASALT_CHECK(schema.is_object(), "json schema: the schema at {} must be an object or a boolean", path);
    if (schema.contains("if") || schema.contains("then") || schema.contains("else")) {
      const Json rewritten = without_conditional(schema, path);
      return translate_merged(merge({{&rewritten, path}}), path);
    }
    check_keywords(schema, path);
    if (const Json* negated = member(schema, "not")) {
      // not of required names: the objects that lack one of them, as anyOf.
      if (std::optional<Json> absent = absent_names(*negated, path)) {
        Json rewritten = schema;
        rewritten.erase("not");
        Json& all = rewritten["allOf"];
        if (!all.is_array()) all = Json::array();
        all.push_back(std::move(*absent));
        return translate_merged(merge({{&rewritten, path}}), path);
      }
      if (negation(*negated, path).types == kAnyType)
        return Translation::none(fmt::format("the schema at {} is negated by a not that every value matches", path));
    }
    if (schema.contains("$ref") && !has_assertions(schema, {"$ref"})) return translate_ref(schema.at("$ref"), path);
    // Draft 7's dependencies become dependentRequired / dependentSchemas there.
    if (schema.contains("$ref") || schema.contains("allOf") || (schema.contains("anyOf") && schema.contains("oneOf")) ||
        schema.contains("dependencies"))
      return translate_merged(merge({{&schema, path}}), path);
    if (schema.contains("dependentRequired") || schema.contains("dependentSchemas"))
      return translate_dependencies(schema, path);
    if (schema.contains("anyOf")) return translate_alternatives(schema, "anyOf", path);
    if (schema.contains("oneOf")) return translate_alternatives(schema, "oneOf", path);
    if (schema.contains("enum") || schema.contains("const")) return translate_enum(schema, path);
    return translate_types(schema, path);
  }

  // Merged schemas get rules keyed by their text, so that a recursion
  // through allOf meets the same merged schema again and closes.
  Translation translate_merged(const Merged& merged, const std::string& path) {
    if (merged.schema.is_boolean()) return Translation::none(merged.no_value_reason);
    const std::string key = "merged:" + merged.schema.dump();
    if (!targets_.contains(key)) {
      BASALT_CHECK(++merged_schemas_ <= kMaxMergedSchemas,
                   "json schema: unsupported keyword \"allOf\" at {}: merging makes more than {} schemas", path,
                   kMaxMergedSchemas);
    }
    return target(key, path, rule_hint(path) + ".merged", [&] { return translate(merged.schema, path); });
  }

  // dependentRequired and dependentSchemas: the anyOf of the objects
  // without each trigger property (the property false) and the objects with
  // it (required, with the names it requires or the schema it brings merged
  // in, and "type": "object", as only an object with the property must
  // satisfy them), trigger by trigger; a trigger that a combination
  // already requires does not fork it. Exact: every value is in exactly one
  // combination, whose schema is what the value must satisfy.
  Translation translate_dependencies(const Json& schema, const std::string& path) {
    Json base = Json::object();
    for (const auto& [key, value] : schema.items())
      if (key != "dependentRequired" && key != "dependentSchemas") base[key] = value;
    std::vector<std::string> triggers;
    for (const char* keyword : {"dependentRequired", "dependentSchemas"}) {
      const Json* map = member(schema, keyword);
      if (!map) continue;
      BASALT_CHECK(map->is_object(), "json schema: keyword \"{}\" at {} must be an object", keyword, path);
      for (const auto& [name, value] : map->items()) {
        if (std::find(triggers.begin(), triggers.end(), name) == triggers.end()) triggers.push_back(name);
        if (std::string_view(keyword) != "dependentRequired") continue;  // schemas are read when merged
        BASALT_CHECK(
            value.is_array() && std::all_of(value.begin(), value.end(), [](const Json& n) { return n.is_string(); }),
            "json schema: keyword \"dependentRequired\" at {} must map names to arrays of names", path);
      }
    }
    struct Combination {
      std::set<std::string> required;  // known to be required
      Json parts = Json::array();      // schemas merged with the base
    };
    std::vector<Combination> combinations(1);
    if (const Json* required = member(schema, "required"); required && required->is_array())
      for (const Json& name : *required)
        if (name.is_string()) combinations[0].required.insert(name.get<std::string>());
    const Json* dependent_required = member(schema, "dependentRequired");
    const Json* dependent_schemas = member(schema, "dependentSchemas");
    for (const std::string& trigger : triggers) {
      std::vector<Combination> next;
      for (Combination& c : combinations) {
        Combination with = c;
        Json present = {{"type", "object"}, {"required", Json::array({trigger})}};
        with.required.insert(trigger);
        if (dependent_required && dependent_required->contains(trigger)) {
          for (const Json& name : dependent_required->at(trigger)) {
            present["required"].push_back(name);
            with.required.insert(name.get<std::string>());
          }
        }
        with.parts.push_back(present);
        if (dependent_schemas && dependent_schemas->contains(trigger))
          with.parts.push_back(dependent_schemas->at(trigger));
        if (!c.required.contains(trigger)) {
          c.parts.push_back({{"properties", {{trigger, false}}}});
          next.push_back(std::move(c));
        }
        next.push_back(std::move(with));
      }
      combinations = std::move(next);
      BASALT_CHECK(combinations.size() <= kMaxDependencyCombinations,
                   "json schema: unsupported keyword \"{}\" at {}: its triggers make more than {} combinations of "
                   "present and absent properties",
                   dependent_required ? "dependentRequired" : "dependentSchemas", path, kMaxDependencyCombinations);
    }
    std::vector<std::string> options;
    std::string reason;
    for (const Combination& c : combinations) {
      std::vector<Part> parts{{&base, path}};
      for (const Json& part : c.parts) parts.emplace_back(&part, path);
      const Translation t = translate_merged(merge(parts), path);
      if (t.satisfiable()) {
        options.push_back(t.expr);
      } else if (reason.empty()) {
        reason = t.no_value_reason;
      }
    }
    if (options.empty()) return Translation::none(reason);
    return Translation::of(alt(options));
  }

  // anyOf / oneOf: the branches, each with the keywords beside it merged in.
  // A oneOf is its anyOf where no value can match two of its branches: the
  // types that two branches admit whole are left out (every value of them
  // matches both, so none is valid), and the branches left that admit a
  // value must be told apart pairwise on the rest (one_of_plan), or be
  // rewritten so that they exclude each other (exclusive_branches), or the
  // oneOf is refused.
  Translation translate_alternatives(const Json& schema, const std::string& keyword, const std::string& path) {
    const Json& branches = schema.at(keyword);
    BASALT_CHECK(branches.is_array() && !branches.empty(),
                 "json schema: keyword \"{}\" at {} must be a non-empty array", keyword, path);
    Json base = Json::object();
    for (const auto& [key, value] : schema.items())
      if (key != keyword && is_assertion(key)) base[key] = value;
    const std::string branches_path = child_path(path, keyword);
    std::optional<OneOfPlan> plan;
    if (keyword == "oneOf") {
      plan = one_of_plan(base, branches, path);
      if (plan->kept != kAnyType) {
        const uint8_t allowed = base.contains("type") ? type_set(base.at("type"), child_path(path, "type")) : kAnyType;
        if (!restrict_types(base, allowed & plan->kept)) {
          return Translation::none(
              fmt::format("every value the schema at {} allows matches two branches of its oneOf", path));
        }
      }
    }
    std::vector<std::string> options;
    std::vector<size_t> live;  // the branches that admit a value
    std::string reason;
    const auto translate_branches = [&](const Json& list) {
      options.clear();
      live.clear();
      reason.clear();
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string branch_path = child_path(branches_path, i);
        const Translation t = base.empty()
                                  ? translate(list[i], branch_path)
                                  : translate_merged(merge({{&base, path}, {&list[i], branch_path}}), branch_path);
        if (t.satisfiable()) {
          options.push_back(t.expr);
          live.push_back(i);
        } else if (reason.empty()) {
          reason = t.no_value_reason;
        }
      }
    };
    translate_branches(branches);
    if (options.empty())
      return Translation::none(fmt::format("no branch of {} admits a value ({})", branches_path, reason));
    if (plan && overlapping(*plan, live)) {
      // The rules the first translation made stay unused.
      translate_branches(exclusive_branches(base, branches, *plan, live, path));
      if (options.empty())
        return Translation::none(fmt::format("no branch of {} admits a value alone ({})", branches_path, reason));
    }
    return Translation::of(alt(options));
  }

  // Sets the schema's type to the types `bits` names, as far as type names
  // say them (numbers that are not integers have no name of their own: left
  // out, which only loses values); false when that names no type.
  static bool restrict_types(Json& schema, uint8_t bits) {
    const Json names = type_json(bits);
    if (names.is_array() && names.empty()) return false;
    schema["type"] = names;
    return true;
  }

  // --- oneOf ---

  // What the proofs that oneOf's branches exclude each other know of a
  // schema: every value it admits has one of `types`, is one of `values`
  // (when known) and, when an object, has each of `members`, its value
  // within that member's summary; and it admits every value of each type in
  // `full`. types, values and members may say more values than the schema
  // admits, never fewer; full fewer types, never more. The default is a
  // schema nothing is known of.
  struct Member;
  struct Summary {
    uint8_t types = kAnyType;
    uint8_t full = 0;
    std::optional<std::vector<Json>> values;
    std::vector<Member> members;  // a vector of a type still incomplete here is allowed (C++17)
    // Objects: the only member names allowed (additionalProperties false,
    // no patternProperties), sorted; none when any name may appear.
    std::optional<std::vector<std::string>> names;
    // Strings: patterns every string matches (JSON Schema's search).
    std::vector<std::string> patterns;
    // Values a `not` of enum or const takes away.
    std::vector<Json> not_values;
    // Arrays: the summary of every item (`items` a schema, no prefixItems),
    // one element or none.
    std::vector<Summary> items;
    // Objects: bounds on the number of members (minProperties and the
    // required names; maxProperties and the names allowed).
    int64_t min_members = 0;
    std::optional<int64_t> max_members;
    // Objects: what a member's value is when the member is present: by its
    // name (`properties`), and by a pattern its name matches
    // (`patternProperties`; the pattern in `name`).
    std::vector<Member> present;
    std::vector<Member> patterned;
  };
  struct Member {
    std::string name;
    Summary summary;
  };

  // Members of members summarized this deep; summaries made per oneOf.
  static constexpr int kSummaryDepth = 4;
  static constexpr size_t kSummarySteps = 20000;

  struct OneOfPlan {
    uint8_t kept = kAnyType;        // the types no two branches admit whole
    std::vector<Summary> branches;  // each with the keywords beside oneOf, on the kept types
  };

  OneOfPlan one_of_plan(const Json& base, const Json& branches, const std::string& path) {
    summary_steps_ = 0;
    const std::string branches_path = child_path(path, "oneOf");
    std::vector<std::string> open;
    const Summary beside = summarize(base, path, 0, open);
    std::vector<Summary> own;
    for (size_t i = 0; i < branches.size(); ++i)
      own.push_back(summarize(branches[i], child_path(branches_path, i), 0, open));
    // A branch that admits every value of a type admits, with the keywords
    // beside oneOf, every value of it those allow: two such branches leave
    // no value of that type valid.
    OneOfPlan plan;
    for (unsigned bit = 1; bit < kAnyType; bit <<= 1) {
      const auto whole = std::count_if(own.begin(), own.end(), [&](const Summary& s) { return (s.full & bit) != 0; });
      if (whole >= 2) plan.kept &= static_cast<uint8_t>(~bit);
    }
    Summary kept;
    kept.types = kept.full = plan.kept;
    for (const Summary& s : own) plan.branches.push_back(meet(meet(s, beside), kept));
    return plan;
  }

  // The first two of the `live` branches (those that admit a value) not
  // proven to exclude each other; none when every two are.
  static std::optional<std::pair<size_t, size_t>> overlapping(const OneOfPlan& plan, const std::vector<size_t>& live) {
    for (size_t a = 0; a < live.size(); ++a) {
      for (size_t b = a + 1; b < live.size(); ++b)
        if (!disjoint(plan.branches[live[a]], plan.branches[live[b]])) return std::pair(live[a], live[b]);
    }
    return std::nullopt;
  }

  // The oneOf's branches as the grammar takes them, such that no value of one
  // matches another of the original branches (with the keywords beside the
  // oneOf): rewritten by the names they require (required_apart), or by a
  // property they all list (discriminated). Refuses the oneOf, naming the
  // first pair `plan` does not tell apart, where neither applies. Called
  // only where that proof fails.
  Json exclusive_branches(const Json& base, const Json& branches, const OneOfPlan& plan,
                          const std::vector<size_t>& live, const std::string& path) {
    if (std::optional<Json> rewritten = nonempty_apart(branches, plan, live)) return *rewritten;
    if (std::optional<Json> rewritten = required_apart(branches, plan, live, path)) return *rewritten;
    if (std::optional<Json> rewritten = discriminated(base, branches, live, path)) return *rewritten;
    if (std::optional<Json> rewritten = closed_apart(base, branches, plan, live, path)) return *rewritten;
    if (std::optional<Json> rewritten = patterns_apart(branches, plan, live)) return *rewritten;
    const auto [a, b] = *overlapping(plan, live);
    fail(
        "json schema: unsupported keyword \"oneOf\" at {}: its branches {} and {} may overlap (a value that matches "
        "both is invalid; branches are told apart only by their types, their const or enum values, the const or "
        "enum values of a property both require, the names they require, or the const or enum values of a property "
        "every branch lists)",
        path, a, b);
  }

  // Branches that overlap only in the empty object or array (Github_trivial's
  // ForgetRequest: [{"properties": {"key": ...}, "additionalProperties":
  // false}, {"properties": {"keys": ...}, "additionalProperties": false}];
  // Github_ultra's scale domain: arrays of numbers or of strings): where
  // every pair not proven disjoint is two objects-only branches whose
  // allowed names do not meet, or two arrays-only branches whose items are
  // proven disjoint, a value of both is {} or [], which matches both and so
  // is invalid; each such branch gets minProperties or minItems 1. Exact.
  // None where some pair overlaps otherwise.
  static std::optional<Json> nonempty_apart(const Json& branches, const OneOfPlan& plan,
                                            const std::vector<size_t>& live) {
    std::set<std::pair<size_t, uint8_t>> touched;  // (branch, the type of the overlap)
    for (size_t a = 0; a < live.size(); ++a) {
      for (size_t b = a + 1; b < live.size(); ++b) {
        const Summary& x = plan.branches[live[a]];
        const Summary& y = plan.branches[live[b]];
        if (disjoint(x, y)) continue;
        const uint8_t common_types = x.types & y.types;
        if (common_types == kObject) {
          if (!x.names || !y.names) return std::nullopt;
          std::vector<std::string> common;
          std::set_intersection(x.names->begin(), x.names->end(), y.names->begin(), y.names->end(),
                                std::back_inserter(common));
          if (!common.empty()) return std::nullopt;
        } else if (common_types == kArray) {
          if (x.items.empty() || y.items.empty() || !disjoint(x.items[0], y.items[0])) return std::nullopt;
        } else {
          return std::nullopt;
        }
        touched.emplace(live[a], common_types);
        touched.emplace(live[b], common_types);
      }
    }
    if (touched.empty()) return std::nullopt;
    Json rewritten = branches;
    for (const auto& [i, type] : touched) {
      const Json nonempty = type == kObject ? Json{{"minProperties", 1}} : Json{{"minItems", 1}};
      rewritten[i] = Json{{"allOf", Json::array({rewritten[i], nonempty})}};
    }
    return rewritten;
  }

  // The names a branch requires, in order, each once; none when the branch
  // is no object with a non-empty `required` of names. A branch without one
  // whose anyOf alternatives all have one requires the names they share
  // (Github_hard/o12453.json: [{"required": ["labware", "slot"]},
  // {"required": ["labware", "position"]}] requires "labware").
  static std::optional<std::vector<std::string>> required_names(const Json& branch) {
    const Json* list = branch.is_object() ? member(branch, "required") : nullptr;
    const Json* alternatives = branch.is_object() ? member(branch, "anyOf") : nullptr;
    if (!list && alternatives && alternatives->is_array() && !alternatives->empty()) {
      std::optional<std::vector<std::string>> shared;
      for (const Json& alternative : *alternatives) {
        if (alternative.is_object() && alternative.contains("anyOf")) return std::nullopt;  // one level only
        std::optional<std::vector<std::string>> names = required_names(alternative);
        if (!names) return std::nullopt;
        if (shared) {
          std::erase_if(*shared, [&](const std::string& n) {
            return std::find(names->begin(), names->end(), n) == names->end();
          });
        } else {
          shared = std::move(names);
        }
      }
      if (shared->empty()) return std::nullopt;
      return shared;
    }
    if (!list || !list->is_array() || list->empty()) return std::nullopt;
    std::vector<std::string> names;
    for (const Json& name : *list) {
      if (!name.is_string()) return std::nullopt;
      if (std::find(names.begin(), names.end(), name.get<std::string>()) == names.end())
        names.push_back(name.get<std::string>());
    }
    return names;
  }

  // Branches told apart by the names they require (Glaiveai2K's
  // calculate_area: [{"required": ["radius"]}, {"required": ["length",
  // "width"]}, ...]; an object may have all of them). Branch i becomes:
  // branch i, an object, and, for each other live branch j not proven
  // disjoint from it, without at least one name that j requires and i does
  // not (the anyOf over those names n of {"properties": {n: false}}). Such a
  // value fails j's required, so j; the pairs proven disjoint stay so; the
  // other branches admit no value: it matches branch i alone, by
  // construction (no proof is run again). Where j requires no name that i
  // does not, every object of branch i satisfies j's required: when j's
  // other assertions admit every object (type, if any, includes "object"),
  // branch i never matches alone and is dropped (false); otherwise the
  // rewrite does not apply.
  // Exact where each branch is `required` alone (annotations aside), or
  // each is "type": "object" and `required`: a non-object then matches
  // every branch or none (invalid either way), and a valid object matches
  // one branch only, so it lacks a name of each other's that its own does
  // not require. Where a branch j has other keywords, missing a name is only
  // one way to fail j: the objects that fail j otherwise, and non-objects,
  // are left out (narrower, never wider).
  // None (not applicable) where two live branches not proven disjoint do not
  // both require names.
  std::optional<Json> required_apart(const Json& branches, const OneOfPlan& plan, const std::vector<size_t>& live,
                                     const std::string& path) {
    const auto admits_every_object = [&](const Json& branch, const std::string& at) {
      return !has_assertions(branch, {"required", "type"}) &&
             (!branch.contains("type") || (type_set(branch.at("type"), child_path(at, "type")) & kObject));
    };
    Json rewritten = branches;
    for (const size_t i : live) {
      const std::optional<std::vector<std::string>> own = required_names(branches[i]);
      // Per other branch j, the names j requires that i does not.
      std::vector<std::vector<std::string>> missing;
      bool dropped = false;
      for (const size_t j : live) {
        if (j == i || disjoint(plan.branches[i], plan.branches[j])) continue;
        const std::optional<std::vector<std::string>> other = required_names(branches[j]);
        if (!own || !other) return std::nullopt;
        std::vector<std::string> names;
        for (const std::string& name : *other)
          if (std::find(own->begin(), own->end(), name) == own->end()) names.push_back(name);
        if (names.empty()) {
          if (!admits_every_object(branches[j], child_path(child_path(path, "oneOf"), j))) return std::nullopt;
          dropped = true;
          break;
        }
        missing.push_back(std::move(names));
      }
      if (dropped) {
        rewritten[i] = false;
        continue;
      }
      if (missing.empty()) continue;
      // The sets of absent names: one name from each list (a set that
      // contains another adds nothing to the anyOf and is left out).
      std::set<std::set<std::string>> absent{{}};
      for (const std::vector<std::string>& names : missing) {
        std::set<std::set<std::string>> next;
        for (const std::set<std::string>& set : absent) {
          for (const std::string& name : names) {
            std::set<std::string> more = set;
            more.insert(name);
            next.insert(std::move(more));
          }
        }
        BASALT_CHECK(next.size() <= kMaxAlternatives,
                     "json schema: unsupported keyword \"oneOf\" at {}: telling its branches apart by the names "
                     "they require makes more than {} alternatives",
                     path, kMaxAlternatives);
        absent = std::move(next);
      }
      Json options = Json::array();
      for (const std::set<std::string>& set : absent) {
        const bool minimal = std::none_of(absent.begin(), absent.end(), [&](const std::set<std::string>& other) {
          return other.size() < set.size() && std::includes(set.begin(), set.end(), other.begin(), other.end());
        });
        if (!minimal) continue;
        Json properties = Json::object();
        for (const std::string& name : set) properties[name] = false;
        options.push_back({{"properties", properties}});
      }
      Json apart = options.size() == 1 ? options[0] : Json{{"anyOf", options}};
      apart["type"] = "object";
      rewritten[i] = Json{{"allOf", Json::array({branches[i], apart})}};
    }
    return rewritten;
  }

  // Object branches closed to the members they list (Github_hard's xAPI
  // agent: [{"$ref": "#/definitions/mbox"}, {"$ref":
  // "#/definitions/account"}, ...], each an open object that requires its
  // own member): each branch whose schema (a $ref alone followed) lists
  // `properties` and says nothing else of other members (no
  // additionalProperties, patternProperties, unevaluatedProperties, nor
  // anything that merges in more: allOf, anyOf, oneOf, $ref, if,
  // dependencies) gets additionalProperties false, as OpenAI's strict mode
  // writes every object. Narrower, never wider. Exact for oneOf where every
  // closed branch is proven apart from every other ORIGINAL branch (so a
  // value of closed branch i matches original branch i alone): a closed
  // branch lacks a member another requires, or has fewer members than
  // another's minimum. None where some ordered pair is not proven apart.
  std::optional<Json> closed_apart(const Json& base, const Json& branches, const OneOfPlan& plan,
                                   const std::vector<size_t>& live, const std::string& path) {
    const std::string branches_path = child_path(path, "oneOf");
    Json rewritten = branches;
    bool closed = false;
    for (const size_t i : live) {
      const Json& schema = referenced_schema(branches[i], child_path(branches_path, i));
      const Json* listed = schema.is_object() ? member(schema, "properties") : nullptr;
      if (!listed || !listed->is_object()) continue;
      constexpr std::string_view kOpeners[] = {"additionalProperties", "patternProperties", "unevaluatedProperties",
                                               "allOf", "anyOf", "oneOf", "$ref", "if", "dependencies",
                                               "dependentSchemas", "$dynamicRef", "$recursiveRef"};
      if (std::any_of(std::begin(kOpeners), std::end(kOpeners), [&](std::string_view k) {
            return schema.contains(std::string(k));
          }))
        continue;
      Json copy = schema;
      copy["additionalProperties"] = false;
      rewritten[i] = std::move(copy);
      closed = true;
    }
    if (!closed) return std::nullopt;
    const OneOfPlan narrowed = one_of_plan(base, rewritten, path);
    for (const size_t i : live)
      for (const size_t j : live)
        if (i != j && !disjoint(narrowed.branches[i], plan.branches[j])) return std::nullopt;
    return rewritten;
  }

  // String branches told apart by their patterns (Github_medium's approver
  // role: [{"pattern": "APPROVER"}, {"pattern": "SIGNER"}], which
  // "APPROVER SIGNER" matches both of): where every pair not proven apart
  // overlaps in strings only and both have patterns, each such branch also
  // gets, for each pattern of the other, {"not": {"pattern": ...}}. A string
  // of branch i then matches no pattern of branch j, so not branch j;
  // strings branch j rejects otherwise are left out (narrower, never
  // wider). None where some pair overlaps otherwise.
  static std::optional<Json> patterns_apart(const Json& branches, const OneOfPlan& plan,
                                            const std::vector<size_t>& live) {
    std::map<size_t, std::vector<std::string>> excluded;  // per branch, the patterns it must not match
    for (size_t a = 0; a < live.size(); ++a) {
      for (size_t b = a + 1; b < live.size(); ++b) {
        const Summary& x = plan.branches[live[a]];
        const Summary& y = plan.branches[live[b]];
        if (disjoint(x, y)) continue;
        if ((x.types & y.types) != kString) return std::nullopt;
        // The patterns of one that the other does not have (those beside
        // the oneOf both have).
        const auto only = [](const Summary& of, const Summary& other) {
          std::vector<std::string> out;
          for (const std::string& pattern : of.patterns)
            if (std::find(other.patterns.begin(), other.patterns.end(), pattern) == other.patterns.end())
              out.push_back(pattern);
          return out;
        };
        const std::vector<std::string> x_only = only(x, y), y_only = only(y, x);
        if (x_only.empty() || y_only.empty()) return std::nullopt;
        excluded[live[a]].insert(excluded[live[a]].end(), y_only.begin(), y_only.end());
        excluded[live[b]].insert(excluded[live[b]].end(), x_only.begin(), x_only.end());
      }
    }
    if (excluded.empty()) return std::nullopt;
    Json rewritten = branches;
    for (const auto& [i, patterns] : excluded) {
      Json all = Json::array({rewritten[i]});
      for (const std::string& pattern : patterns) all.push_back({{"not", {{"pattern", pattern}}}});
      rewritten[i] = Json{{"allOf", std::move(all)}};
    }
    return rewritten;
  }

  // The schema a branch stands for: itself, or what its $ref names where it
  // is a $ref alone (annotations aside), followed.
  const Json& referenced_schema(const Json& branch, const std::string& path) const {
    const Json* at = &branch;
    for (int hops = 0; hops < 16 && at->is_object() && at->contains("$ref") && !has_assertions(*at, {"$ref"}); ++hops)
      at = resolve(at->at("$ref"), path).second;
    return *at;
  }

  // Branches told apart by a property that every live branch lists in
  // `properties` with values the proof tells apart from each other branch's
  // (const or enum values; strings of patterns that do not meet, as
  // Github_ultra/o17072.json's "type": {"pattern": "^Displace$"}), but that
  // not all require (Github_easy/o13129.json:
  // {"properties": {"type": {"enum": ["callback"]}, ...}} and {"properties":
  // {"type": {"enum": ["field", "value"]}, ...}}; {} matches both): the
  // first such property is added to each branch's `required` (a branch that
  // is a $ref alone becomes a copy of the schema it names), and the proof is
  // run again on the rewritten branches, which gives them up unless it
  // succeeds. This narrows: objects without the property, valid where they
  // match one branch, are not written. Sound: a value of rewritten branch i
  // has the property; were it to match an original branch j, it would match
  // the rewritten j (j with the property required), which the proof shows
  // it does not. (The types the rewritten branches admit whole are those the
  // originals do, less objects: the types the proof leaves out are left out
  // already.) None where no property is such.
  std::optional<Json> discriminated(const Json& base, const Json& branches, const std::vector<size_t>& live,
                                    const std::string& path) {
    const std::string branches_path = child_path(path, "oneOf");
    std::vector<const Json*> properties;  // each live branch's
    for (const size_t i : live) {
      const Json& schema = referenced_schema(branches[i], child_path(branches_path, i));
      const Json* listed = schema.is_object() ? member(schema, "properties") : nullptr;
      if (!listed || !listed->is_object()) return std::nullopt;
      properties.push_back(listed);
    }
    if (properties.empty()) return std::nullopt;
    for (const auto& [name, first] : properties[0]->items()) {
      summary_steps_ = 0;
      std::vector<Summary> values;
      std::vector<std::string> open;
      for (size_t k = 0; k < live.size() && values.size() == k; ++k) {
        if (!properties[k]->contains(name)) break;
        const std::string at = child_path(child_path(child_path(branches_path, live[k]), "properties"), name);
        values.push_back(summarize(properties[k]->at(name), at, 1, open));
      }
      if (values.size() != live.size()) continue;
      bool apart = true;
      for (size_t a = 0; a < values.size() && apart; ++a)
        for (size_t b = a + 1; b < values.size() && apart; ++b) apart = disjoint(values[a], values[b]);
      if (!apart) continue;
      Json rewritten = branches;
      for (const size_t i : live) {
        Json schema = referenced_schema(branches[i], child_path(branches_path, i));
        Json& required = schema["required"];
        if (required.is_null()) required = Json::array();
        if (!required.is_array()) return std::nullopt;
        if (std::find(required.begin(), required.end(), Json(name)) == required.end()) required.push_back(name);
        rewritten[i] = std::move(schema);
      }
      if (!overlapping(one_of_plan(base, rewritten, path), live)) return rewritten;
    }
    return std::nullopt;
  }

  Summary summarize(const Json& schema, const std::string& path, int depth, std::vector<std::string>& open) {
    Summary s;
    if (++summary_steps_ > kSummarySteps || nesting_ >= kMaxNesting) return s;  // nothing known
    const NestingGuard guard(nesting_, path);
    if (schema.is_boolean()) {
      if (schema.get<bool>()) {
        s.full = kAnyType;
      } else {
        s.types = 0;
      }
      return s;
    }
    if (!schema.is_object()) return s;
    s.full = kAnyType;
    std::optional<Summary> referenced;
    for (const auto& [key, value] : schema.items()) {
      const std::string at = child_path(path, key);
      if (key == "type") {
        const uint8_t types = type_set(value, at);
        s.types &= types;
        s.full &= types;
      } else if ((key == "enum" && value.is_array()) || key == "const") {
        Summary listed_values;
        listed_values.values.emplace();
        if (key == "const") {
          listed_values.values->push_back(value);
        } else {
          listed_values.values->assign(value.begin(), value.end());
        }
        s = meet(std::move(s), listed_values);
      } else if (key == "$ref") {
        const auto [pointer, target] = resolve(value, path);
        Summary r;  // a recursion: nothing known
        if (std::find(open.begin(), open.end(), pointer) == open.end()) {
          open.push_back(pointer);
          r = summarize(*target, pointer, depth, open);
          open.pop_back();
        }
        referenced = r;
        s = meet(std::move(s), r);
      } else if (key == "allOf" && value.is_array()) {
        for (size_t i = 0; i < value.size(); ++i)
          s = meet(std::move(s), summarize(value[i], child_path(at, i), depth, open));
      } else if ((key == "anyOf" || key == "oneOf") && value.is_array()) {
        Summary any;
        any.types = 0;
        for (size_t i = 0; i < value.size(); ++i) any = join(any, summarize(value[i], child_path(at, i), depth, open));
        if (key == "oneOf") any.full = 0;  // a type two branches admit whole is not admitted
        s = meet(std::move(s), any);
      } else if (key == "not") {
        // not of an enum or const (a $ref alone followed; avro-avsc's custom
        // type names are not the primitive ones): those values are out.
        s.full = 0;
        const Json& negated = referenced_schema(value, at);
        if (negated.is_object() && !has_assertions(negated, {"enum", "const", "type"})) {
          std::vector<Json> listed;
          if (const Json* list = member(negated, "enum"); list && list->is_array()) listed.assign(list->begin(), list->end());
          if (const Json* one = member(negated, "const")) listed.push_back(*one);
          const uint8_t types = negated.contains("type") ? type_set(negated.at("type"), child_path(at, "type")) : kAnyType;
          // With both enum and const, a value must be in both to be taken
          // away; taking the enum's and the const's is then too much, so
          // only one of them is read.
          if (!(negated.contains("enum") && negated.contains("const")))
            for (const Json& v : listed)
              if (value_type(v) & types) s.not_values.push_back(v);
        }
      } else if (key == "format") {
        s.full &= static_cast<uint8_t>(~(kString | kInteger | kFraction));  // int32 on numbers
      } else if (key == "pattern" && value.is_string()) {
        s.full &= static_cast<uint8_t>(~kString);
        s.patterns.push_back(value.get<std::string>());
      } else if (key == "items" && (value.is_object() || value.is_boolean()) && !schema.contains("prefixItems") &&
                 depth < kSummaryDepth) {
        s.full &= static_cast<uint8_t>(~kArray);
        Summary items = summarize(value, at, depth + 1, open);
        if (s.items.empty()) {
          s.items.push_back(std::move(items));
        } else {
          s.items[0] = meet(std::move(s.items[0]), items);
        }
      } else if (listed(key, kStringKeywords)) {
        s.full &= static_cast<uint8_t>(~kString);
      } else if (listed(key, kNumberKeywords)) {
        s.full &= static_cast<uint8_t>(~(kInteger | kFraction));
      } else if (listed(key, kArrayKeywords)) {
        s.full &= static_cast<uint8_t>(~kArray);
      } else if (listed(key, kObjectKeywords)) {
        s.full &= static_cast<uint8_t>(~kObject);
        if (key == "minProperties" && value.is_number_unsigned())
          s.min_members = std::max(s.min_members, static_cast<int64_t>(std::min<uint64_t>(value.get<uint64_t>(), kMaxCount)));
        if (key == "maxProperties" && value.is_number_unsigned())
          bound_members(s, static_cast<int64_t>(std::min<uint64_t>(value.get<uint64_t>(), kMaxCount)));
        if (key == "required" && value.is_array()) {
          std::set<std::string> names;
          for (const Json& name : value)
            if (name.is_string()) names.insert(name.get<std::string>());
          s.min_members = std::max(s.min_members, static_cast<int64_t>(names.size()));
        }
      } else if (is_assertion(key) || listed(key, kUnenforcedKeywords)) {
        s.full = 0;  // malformed, or refused when translated
      }
    }
    // Each required member's value, within its property's schema (or
    // additionalProperties', which patternProperties would take from).
    const Json* required = member(schema, "required");
    if (required && required->is_array() && depth < kSummaryDepth) {
      const Json* properties = member(schema, "properties");
      if (properties && !properties->is_object()) properties = nullptr;
      const Json* additional = schema.contains("patternProperties") ? nullptr : member(schema, "additionalProperties");
      for (const Json& name : *required) {
        if (!name.is_string()) continue;
        const std::string key = name.get<std::string>();
        Summary value;
        value.full = kAnyType;
        if (properties && properties->contains(key)) {
          value = summarize(properties->at(key), child_path(child_path(path, "properties"), key), depth + 1, open);
        } else if (additional) {
          value = summarize(*additional, child_path(path, "additionalProperties"), depth + 1, open);
        }
        add_member(s, key, value);
      }
    }
    if (depth < kSummaryDepth) {
      for (const std::string_view key : {"properties", "patternProperties"}) {
        const Json* list = member(schema, std::string(key));
        if (!list || !list->is_object()) continue;
        for (const auto& [name, value] : list->items()) {
          Summary v = summarize(value, child_path(child_path(path, std::string(key)), name), depth + 1, open);
          (key == "properties" ? s.present : s.patterned).push_back(Member{name, std::move(v)});
        }
      }
    }
    if (const Json* additional = member(schema, "additionalProperties");
        additional && additional->is_boolean() && !additional->get<bool>() && !schema.contains("patternProperties")) {
      std::vector<std::string> listed;
      if (const Json* properties = member(schema, "properties"); properties && properties->is_object())
        for (const auto& [name, value] : properties->items()) listed.push_back(name);
      std::sort(listed.begin(), listed.end());
      restrict_names(s, listed);
    }
    s = normalized(std::move(s));
    // Drafts 4 to 7 ignore the keywords beside $ref; the translation
    // enforces them (2019-09 on), but whether two branches overlap is
    // decided for both readings: what the referenced schema alone may admit.
    if (referenced && siblings_of_ref_ignored_) {
      const uint8_t full = s.full;
      s = *referenced;
      s.full &= full;
    }
    return s;
  }

  static void add_member(Summary& s, const std::string& name, const Summary& value) {
    for (auto& [key, known] : s.members) {
      if (key == name) {
        known = meet(std::move(known), value);
        return;
      }
    }
    s.members.push_back(Member{name, value});
  }

  static void restrict_names(Summary& s, const std::vector<std::string>& names) {
    if (!s.names) {
      s.names = names;
    } else {
      std::vector<std::string> common;
      std::set_intersection(s.names->begin(), s.names->end(), names.begin(), names.end(),
                            std::back_inserter(common));
      s.names = std::move(common);
    }
    bound_members(s, static_cast<int64_t>(s.names->size()));
  }
  static void bound_members(Summary& s, int64_t most) {
    s.max_members = s.max_members ? std::min(*s.max_members, most) : most;
  }
  static bool allows_name(const Summary& s, const std::string& name) {
    return !s.names || std::binary_search(s.names->begin(), s.names->end(), name);
  }

  // The values both admit (a summary of the allOf of the two).
  static Summary meet(Summary a, const Summary& b) {
    a.types &= b.types;
    a.full &= b.full;
    a.min_members = std::max(a.min_members, b.min_members);
    if (b.max_members) bound_members(a, *b.max_members);
    if (b.names) restrict_names(a, *b.names);
    a.patterns.insert(a.patterns.end(), b.patterns.begin(), b.patterns.end());
    a.not_values.insert(a.not_values.end(), b.not_values.begin(), b.not_values.end());
    if (!b.items.empty()) {
      if (a.items.empty()) {
        a.items = b.items;
      } else {
        a.items[0] = meet(std::move(a.items[0]), b.items[0]);
      }
    }
    if (b.values) {
      if (!a.values) {
        a.values = b.values;
      } else {
        std::vector<Json> common;
        for (const Json& v : *a.values)
          if (std::any_of(b.values->begin(), b.values->end(), [&](const Json& w) { return json_equal(v, w); }))
            common.push_back(v);
        a.values = std::move(common);
      }
    }
    for (const auto& [name, value] : b.members) add_member(a, name, value);
    a.present.insert(a.present.end(), b.present.begin(), b.present.end());
    a.patterned.insert(a.patterned.end(), b.patterned.begin(), b.patterned.end());
    return normalized(std::move(a));
  }

  // The values either admits (a summary of the anyOf of the two).
  static Summary join(const Summary& a, const Summary& b) {
    if (!a.types) return b;
    if (!b.types) return a;
    Summary u;
    u.types = a.types | b.types;
    u.full = a.full | b.full;
    u.min_members = std::min(a.min_members, b.min_members);
    if (a.max_members && b.max_members) u.max_members = std::max(*a.max_members, *b.max_members);
    if (a.values && b.values) {
      u.values = *a.values;
      u.values->insert(u.values->end(), b.values->begin(), b.values->end());
    }
    for (const auto& [name, value] : a.members)
      for (const auto& [other, other_value] : b.members)
        if (name == other) u.members.push_back(Member{name, join(value, other_value)});
    if (!a.items.empty() && !b.items.empty()) u.items.push_back(join(a.items[0], b.items[0]));
    if (a.names && b.names) {
      u.names.emplace();
      std::set_union(a.names->begin(), a.names->end(), b.names->begin(), b.names->end(),
                     std::back_inserter(*u.names));
    }
    return u;
  }

  // Types and values narrowed to each other.
  static Summary normalized(Summary s) {
    for (const auto& [name, value] : s.members)  // a required member admits nothing, or its name is not allowed
      if (!value.types || !allows_name(s, name)) s.types &= static_cast<uint8_t>(~kObject);
    if (s.max_members && s.min_members > *s.max_members) s.types &= static_cast<uint8_t>(~kObject);
    if (s.values) {
      std::vector<Json> kept;
      uint8_t types = 0;
      for (const Json& v : *s.values) {
        if (!(value_type(v) & s.types) || (v.is_object() && lacks_members(s, v))) continue;
        types |= value_type(v);
        kept.push_back(v);
      }
      s.values = std::move(kept);
      s.types &= types;
      s.full = 0;
    }
    s.full &= s.types;
    return s;
  }

  // Whether `v` is proven not to be among the values `s` admits.
  static bool excluded(const Summary& s, const Json& v) {
    if (!(value_type(v) & s.types)) return true;
    if (std::any_of(s.not_values.begin(), s.not_values.end(), [&](const Json& w) { return json_equal(v, w); }))
      return true;
    if (s.values && std::none_of(s.values->begin(), s.values->end(), [&](const Json& w) { return json_equal(v, w); }))
      return true;
    if (v.is_string() && !s.patterns.empty()) {
      const std::string text = v.get<std::string>();
      for (const std::string& pattern : s.patterns)
        if (const std::optional<RegexLanguage> language = pattern_language(pattern);
            language && !language->contains(text))
          return true;
    }
    if (v.is_array() && !s.items.empty())
      for (const Json& item : v)
        if (excluded(s.items[0], item)) return true;
    return v.is_object() && lacks_members(s, v);
  }

  // The strings a pattern matches; none where the regex is refused.
  static std::optional<RegexLanguage> pattern_language(const std::string& pattern) {
    try {
      return RegexLanguage::of_pattern(pattern, RegexMode::kSearch);
    } catch (const Error&) {
      return std::nullopt;
    }
  }

  // Whether no string matches every pattern of both (an automaton's
  // intersection; not proven where a pattern is refused or the product
  // grows past RegexLanguage's limits).
  static bool patterns_exclusive(const Summary& a, const Summary& b) {
    if (a.patterns.empty() || b.patterns.empty()) return false;
    try {
      std::optional<RegexLanguage> common;
      for (const std::vector<std::string>* list : {&a.patterns, &b.patterns}) {
        for (const std::string& pattern : *list) {
          RegexLanguage language = RegexLanguage::of_pattern(pattern, RegexMode::kSearch);
          common = common ? common->intersect(language) : std::move(language);
        }
      }
      return common->empty();
    } catch (const Error&) {
      return false;
    }
  }

  static bool lacks_members(const Summary& s, const Json& object) {
    const auto count = static_cast<int64_t>(object.size());
    if (count < s.min_members || (s.max_members && count > *s.max_members)) return true;
    for (const auto& [name, value] : s.members) {
      const auto it = object.find(name);
      if (it == object.end() || excluded(value, *it)) return true;
    }
    for (const auto& [name, value] : object.items())
      if (!allows_name(s, name)) return true;  // (a member it does not allow)
    return false;
  }

  // Whether no value is admitted by both: their types differ, or their
  // values do, or (objects) a member both require has values that differ.
  static bool disjoint(const Summary& a, const Summary& b) {
    const uint8_t common = a.types & b.types;
    if (!common) return true;
    if (a.values) return std::all_of(a.values->begin(), a.values->end(), [&](const Json& v) { return excluded(b, v); });
    if (b.values) return std::all_of(b.values->begin(), b.values->end(), [&](const Json& v) { return excluded(a, v); });
    if (common == kString) return patterns_exclusive(a, b);
    if (common != kObject) return false;
    if ((b.max_members && a.min_members > *b.max_members) || (a.max_members && b.min_members > *a.max_members))
      return true;
    for (const auto& [name, value] : a.members)
      for (const auto& [other, other_value] : b.members)
        if (name == other && disjoint(value, other_value)) return true;
    // A name one requires that the other does not allow.
    for (const auto& [name, value] : a.members)
      if (!allows_name(b, name)) return true;
    for (const auto& [name, value] : b.members)
      if (!allows_name(a, name)) return true;
    return present_apart(a, b) || present_apart(b, a);
  }

  // Whether a member `required` requires has values that `constrains` does
  // not admit for it when present (Github_hard's xAPI agent: mbox requires
  // "mbox" a string; mbox_sha1sum's patternProperties make "mbox" null).
  static bool present_apart(const Summary& constrains, const Summary& required) {
    for (const auto& [name, value] : required.members) {
      for (const auto& [listed, present] : constrains.present)
        if (listed == name && disjoint(present, value)) return true;
      for (const auto& [pattern, present] : constrains.patterned) {
        const std::optional<RegexLanguage> language = pattern_language(pattern);
        if (language && language->contains(name) && disjoint(present, value)) return true;
      }
    }
    return false;
  }

  // enum and const: the values, each written as dump() writes it, that
  // satisfy the keywords beside them that can be checked on a value here:
  // type, minLength / maxLength (code points) and pattern on strings, and
  // the number bounds on numbers (exact decimals); each says nothing of the
  // values of other types. Any other assertion is refused.
  Translation translate_enum(const Json& schema, const std::string& path) {
    Json values = Json::array();
    if (const Json* list = member(schema, "enum")) {
      BASALT_CHECK(list->is_array(), "json schema: keyword \"enum\" at {} must be an array", path);
      values = *list;
      if (values.empty()) return Translation::none(fmt::format("the enum at {} is empty", path));
    }
    if (const Json* value = member(schema, "const")) {
      const bool in_enum = !schema.contains("enum") || std::any_of(values.begin(), values.end(), [&](const Json& v) {
        return json_equal(v, *value);
      });
      if (!in_enum) return Translation::none(fmt::format("the const at {} is not among its enum's values", path));
      values = Json::array({*value});
    }
    const uint8_t types = schema.contains("type") ? type_set(schema.at("type"), child_path(path, "type")) : kAnyType;
    // Keywords of objects and arrays say nothing of the values when none is
    // an object or an array; a known format is checked on each string.
    uint8_t value_types = 0;
    for (const Json& value : values) value_types |= value_type(value);
    for (const auto& [key, value] : schema.items()) {
      const bool checked = !is_assertion(key) || key == "type" || key == "enum" || key == "const" ||
                           key == "minLength" || key == "maxLength" || key == "pattern" || key == "not" ||
                           listed(key, kNumberKeywords) || (key == "format" && value.is_string()) ||
                           (listed(key, kObjectKeywords) && !(value_types & types & kObject)) ||
                           (listed(key, kArrayKeywords) && !(value_types & types & kArray));
      BASALT_CHECK(checked,
                   "json schema: unsupported keyword \"{}\" at {}: only type, minLength, maxLength, pattern, format, "
                   "not and number bounds can accompany enum or const values that are objects or arrays",
                   key, path);
    }
    const Json* format = member(schema, "format");
    const std::string format_name = format ? format->get<std::string>() : "";
    const bool format_checked = format && !listed(format_name, kHintFormats) && (value_types & types & kString);
    std::shared_ptr<const CompiledGrammar> strings_of_format;  // compiled at the first string checked
    BASALT_CHECK(!format_checked || listed(format_name, kFormats),
                 "json schema: unsupported keyword \"format\" at {}: format \"{}\" is not supported", path,
                 format_name);
    BASALT_CHECK(!format || !(value_types & types & (kInteger | kFraction)) || format_name == "float" ||
                     format_name == "double" || listed(format_name, kStringOnlyFormats),
                 "json schema: unsupported keyword \"format\" at {}: format \"{}\" beside enum or const values "
                 "that are numbers",
                 path, format_name);
    const int64_t min_length = optional_count(schema, "minLength", path).value_or(0);
    const std::optional<int64_t> max_length = optional_count(schema, "maxLength", path);
    const Json* pattern = member(schema, "pattern");
    BASALT_CHECK(!pattern || pattern->is_string(), "json schema: keyword \"pattern\" at {} must be a string", path);
    // Not a structured binding: clang before 16 cannot capture one in a lambda.
    const auto bounds = number_bounds(schema, path);
    const std::optional<NumberBound>& lower = bounds.first;
    const std::optional<NumberBound>& upper = bounds.second;
    const Json* negated = member(schema, "not");
    const std::optional<Negation> taken = negated ? std::optional<Negation>(negation(*negated, path)) : std::nullopt;
    const auto satisfies = [&](const Json& value) {
      if (taken && taken->excludes(value)) return false;
      if (value.is_string()) {
        const auto length = static_cast<int64_t>(code_points(value.get<std::string>()).size());
        if (length < min_length || (max_length && length > *max_length)) return false;
        if (format_checked) {
          if (!strings_of_format) strings_of_format = format_grammar(format_name);
          GrammarMatcher matcher(strings_of_format);
          if (!matcher.accept_bytes(value.dump()) || !matcher.can_end()) return false;
        }
        return !pattern || text_matches(pattern->get<std::string>(), value.get<std::string>(), path, "pattern");
      }
      if (!value.is_number()) return true;
      if (whole_numbers_only(schema, path) && value_type(value) != kInteger) return false;
      const Decimal x = decimal_of(value);
      const auto within = [&](const std::optional<NumberBound>& bound, int side) {
        if (!bound) return true;
        const int c = compare(x, bound->value) * side;
        return c > 0 || (c == 0 && !bound->strict);
      };
      return within(lower, 1) && within(upper, -1);
    };
    std::vector<std::string> literals;
    bool typed = false;
    for (const Json& value : values) {
      if (!(value_type(value) & types)) continue;
      typed = true;
      if (satisfies(value)) literals.push_back(lit(value.dump()));
    }
    if (!typed) return Translation::none(fmt::format("no value of the enum at {} has an allowed type", path));
    if (literals.empty()) {
      return Translation::none(
          fmt::format("no value of the enum at {} satisfies the length bounds, pattern or number bounds beside it",
                      path));
    }
    return Translation::of(alt(literals));
  }

  Translation translate_types(const Json& schema, const std::string& path) {
    uint8_t types = schema.contains("type") ? type_set(schema.at("type"), child_path(path, "type")) : kAnyType;
    if (types == kAnyType && !has_assertions(schema, {})) return Translation::of(use("json-value"));
    // format on numbers: OpenAPI's int32 and int64 are integers in their
    // range (integer_bounds), float and double any number; a format for
    // strings says nothing of them.
    const Json* format = member(schema, "format");
    if ((types & (kInteger | kFraction)) && format && format->is_string()) {
      const std::string name = format->get<std::string>();
      if (name == "int32" || name == "int64") {
        types &= static_cast<uint8_t>(~kFraction);
      } else {
        BASALT_CHECK(name == "float" || name == "double" || listed(name, kStringOnlyFormats),
                     "json schema: unsupported keyword \"format\" at {}: format \"{}\" is not supported", path, name);
      }
    }
    if (whole_numbers_only(schema, path)) types &= static_cast<uint8_t>(~kFraction);
    std::optional<Negation> taken;
    if (const Json* negated = member(schema, "not")) {
      taken = negation(*negated, path);
      BASALT_CHECK((taken->types & (kInteger | kFraction)) != kInteger || !(types & kFraction),
                   "json schema: unsupported keyword \"not\" at {}: numbers that are not integers are not built",
                   path);
      types &= static_cast<uint8_t>(~taken->types);
    }
    const auto literal_taken = [&](const Json& value) {
      return taken && std::any_of(taken->literals.begin(), taken->literals.end(),
                                  [&](const Json& v) { return v == value; });
    };
    std::vector<std::string> options;
    std::string reason = fmt::format("the not at {} takes away every value its types allow", path);
    bool reason_set = false;
    const auto add = [&](const Translation& t) {
      if (t.satisfiable()) {
        options.push_back(t.expr);
      } else if (!reason_set) {
        reason = t.no_value_reason;
        reason_set = true;
      }
    };
    if ((types & kNull) && !literal_taken(Json(nullptr))) add(Translation::of(lit("null")));
    if (types & kBoolean) {
      std::vector<std::string> truths;
      for (const bool b : {true, false})
        if (!literal_taken(Json(b))) truths.push_back(lit(b ? "true" : "false"));
      if (!truths.empty()) add(Translation::of(alt(truths)));
    }
    if (types & kFraction) {
      add(number(schema, path));
    } else if (types & kInteger) {
      add(integer(schema, path));
    }
    if (types & kString) add(string(schema, path, taken && taken->strings ? &*taken->strings : nullptr));
    if (types & kArray) add(array(schema, path));
    if (types & kObject) add(object(schema, path));
    if (options.empty()) return Translation::none(reason);
    return Translation::of(alt(options));
  }

  // --- Numbers ---

  // A bound on numbers: its value, and whether the value itself is outside.
  struct NumberBound {
    Decimal value;
    bool strict = false;
  };

  // minimum and exclusiveMinimum (numeric, or draft 4's boolean beside
  // minimum) as one lower bound, the tighter; the same for the upper bound.
  static std::pair<std::optional<NumberBound>, std::optional<NumberBound>> number_bounds(const Json& schema,
                                                                                         const std::string& path) {
    std::optional<NumberBound> lower, upper;
    for (const bool is_lower : {true, false}) {
      const char* inclusive_key = is_lower ? "minimum" : "maximum";
      const char* exclusive_key = is_lower ? "exclusiveMinimum" : "exclusiveMaximum";
      const Json* inclusive = member(schema, inclusive_key);
      const Json* exclusive = member(schema, exclusive_key);
      BASALT_CHECK(!inclusive || inclusive->is_number(), "json schema: keyword \"{}\" at {} must be a number",
                   inclusive_key, path);
      BASALT_CHECK(!exclusive || exclusive->is_number() || exclusive->is_boolean(),
                   "json schema: keyword \"{}\" at {} must be a number", exclusive_key, path);
      std::optional<NumberBound>& bound = is_lower ? lower : upper;
      const auto tighten = [&](const Json& value, bool strict) {
        const NumberBound candidate{decimal_of(value), strict};
        const int c = bound ? compare(candidate.value, bound->value) : 0;
        if (!bound || (is_lower ? c > 0 : c < 0) || (c == 0 && strict)) bound = candidate;
      };
      if (inclusive) tighten(*inclusive, exclusive && exclusive->is_boolean() && *exclusive == true);
      if (exclusive && exclusive->is_number()) tighten(*exclusive, true);
    }
    return {lower, upper};
  }

  // Numbers within bounds: the exact language of the range, over the numbers
  // written without an exponent (those with one are left out, which only
  // loses spellings: every value in range has one without) and without "-0"
  // (zero is written "0", "0.0", ...). Without bounds, any JSON number.
  Translation number(const Json& schema, const std::string& path) {
    const auto [lower, upper] = number_bounds(schema, path);
    if (!lower && !upper) return Translation::of(use("json-number"));
    if (lower && upper) {
      const int c = compare(lower->value, upper->value);
      if (c > 0 || (c == 0 && (lower->strict || upper->strict))) {
        return Translation::none(fmt::format("the number range at {} is empty ({} to {})", path,
                                             to_string(lower->value), to_string(upper->value)));
      }
    }
    const auto magnitude_of = [](const NumberBound& b) {
      return MagnitudeBound{b.value.integer, b.value.fraction, b.strict};
    };
    std::vector<std::string> options;
    // Non-negative numbers: from the lower bound (or 0) to the upper bound.
    const bool upper_below_zero =
        upper &&
        (upper->value.negative || (upper->value.integer == "0" && upper->value.fraction.empty() && upper->strict));
    if (!upper_below_zero) {
      const MagnitudeBound from =
          lower && !lower->value.negative ? magnitude_of(*lower) : MagnitudeBound{"0", "", false};
      if (auto text = magnitudes(from, upper ? std::optional(magnitude_of(*upper)) : std::nullopt))
        options.push_back(*text);
    }
    // Negative numbers: "-" and a magnitude above 0 (or -upper) up to -lower.
    if (!lower || lower->value.negative) {
      const MagnitudeBound from = upper && upper->value.negative ? magnitude_of(*upper) : MagnitudeBound{"0", "", true};
      if (auto text = magnitudes(from, lower ? std::optional(magnitude_of(*lower)) : std::nullopt))
        options.push_back(seq({lit("-"), group(*text)}));
    }
    if (options.empty()) return Translation::none(fmt::format("the number range at {} is empty", path));
    return Translation::of(alt(options));
  }

  // A bound on magnitudes (non-negative decimals), split as Decimal does.
  struct MagnitudeBound {
    std::string integer;
    std::string fraction;
    bool strict = false;
  };

  // A language of fraction digit strings: whether the empty string is in
  // it, and its non-empty strings ("" for none).
  struct Digits {
    bool empty_ok = false;
    std::string nonempty;
  };

  // `digit` followed by a string of `rest`; none when rest is empty.
  static std::optional<std::string> led_by(char digit, const Digits& rest) {
    const std::string first = lit(std::string(1, digit));
    if (rest.nonempty.empty()) return rest.empty_ok ? std::optional(first) : std::nullopt;
    return seq({first, rest.empty_ok ? "(" + rest.nonempty + ")?" : group(rest.nonempty)});
  }

  static Digits digits_of(bool empty_ok, std::vector<std::string> options) {
    return {empty_ok, options.empty() ? "" : alt(options)};
  }

  // Digit strings d with 0.d >= 0.low (> when strict); low has no trailing zeros.
  static Digits fraction_at_least(const std::string& low, bool strict) {
    if (low.empty()) return strict ? Digits{false, "[0-9]* [1-9] [0-9]*"} : Digits{true, "[0-9]+"};
    std::vector<std::string> options;
    if (low[0] < '9') options.push_back(seq({digit_class(static_cast<char>(low[0] + 1), '9'), "[0-9]*"}));
    if (auto led = led_by(low[0], fraction_at_least(low.substr(1), strict))) options.push_back(*led);
    return digits_of(false, options);
  }

  // Digit strings d with 0.d <= 0.high (< when strict).
  static Digits fraction_at_most(const std::string& high, bool strict) {
    if (high.empty()) return strict ? Digits{false, ""} : Digits{true, lit("0") + "+"};
    std::vector<std::string> options;
    if (high[0] > '0') options.push_back(seq({digit_class('0', static_cast<char>(high[0] - 1)), "[0-9]*"}));
    if (auto led = led_by(high[0], fraction_at_most(high.substr(1), strict))) options.push_back(*led);
    return digits_of(true, options);
  }

  // Digit strings d with 0.low <= 0.d <= 0.high (either end strict), where
  // 0.low <= 0.high.
  static Digits fraction_between(const std::string& low, const std::string& high, bool low_strict, bool high_strict) {
    if (low.empty() && high.empty())
      return low_strict || high_strict ? Digits{false, ""} : Digits{true, lit("0") + "+"};
    const char l = low.empty() ? '0' : low[0], h = high.empty() ? '0' : high[0];
    const std::string low_rest = low.empty() ? "" : low.substr(1), high_rest = high.empty() ? "" : high.substr(1);
    const bool empty_ok = low.empty() && !low_strict;  // 0 is in range; then 0 <= high holds
    std::vector<std::string> options;
    if (l == h) {
      if (auto led = led_by(l, fraction_between(low_rest, high_rest, low_strict, high_strict))) options.push_back(*led);
      return digits_of(empty_ok, options);
    }
    if (auto led = led_by(l, fraction_at_least(low_rest, low_strict))) options.push_back(*led);
    if (l + 1 <= h - 1)
      options.push_back(seq({digit_class(static_cast<char>(l + 1), static_cast<char>(h - 1)), "[0-9]*"}));
    if (auto led = led_by(h, fraction_at_most(high_rest, high_strict))) options.push_back(*led);
    return digits_of(empty_ok, options);
  }

  // The fraction part ('.' and digits, or nothing) whose digits are in `d`;
  // none when d is empty.
  static std::optional<std::string> fraction_part(const Digits& d) {
    if (d.nonempty.empty()) return d.empty_ok ? std::optional<std::string>("") : std::nullopt;
    const std::string part = seq({lit("."), group(d.nonempty)});
    return d.empty_ok ? "(" + part + ")?" : part;
  }

  // Magnitudes (an integer part without leading zeros, then an optional
  // fraction) from `low` up to `high` (absent: unbounded); none when no
  // magnitude is in range.
  static std::optional<std::string> magnitudes(const MagnitudeBound& low, const std::optional<MagnitudeBound>& high) {
    const std::string any_fraction = "(" + seq({lit("."), "[0-9]+"}) + ")?";
    std::vector<std::string> options;
    const auto add = [&](const std::string& integer, const std::optional<std::string>& fraction) {
      if (fraction) options.push_back(seq({lit(integer), *fraction}));
    };
    const std::string above_low = increment_magnitude(low.integer);
    if (!high) {
      add(low.integer, fraction_part(fraction_at_least(low.fraction, low.strict)));
      options.push_back(seq({group(naturals(above_low, std::nullopt)), any_fraction}));
    } else {
      const int c = compare_magnitudes(low.integer, high->integer);
      if (c > 0) return std::nullopt;
      if (c == 0) {
        const int f = compare_fractions(low.fraction, high->fraction);
        if (f > 0 || (f == 0 && (low.strict || high->strict))) return std::nullopt;
        add(low.integer, fraction_part(fraction_between(low.fraction, high->fraction, low.strict, high->strict)));
      } else {
        add(low.integer, fraction_part(fraction_at_least(low.fraction, low.strict)));
        if (high->integer != "0" && compare_magnitudes(above_low, decrement_magnitude(high->integer)) <= 0)
          options.push_back(seq({group(naturals(above_low, decrement_magnitude(high->integer))), any_fraction}));
        add(high->integer, fraction_part(fraction_at_most(high->fraction, high->strict)));
      }
    }
    if (options.empty()) return std::nullopt;
    return alt(options);
  }

  // The integer bounds: inclusive, after rounding (minimum 1.5 is 2).
  static std::pair<std::optional<BigInteger>, std::optional<BigInteger>> integer_bounds(const Json& schema,
                                                                                        const std::string& path) {
    const auto read = [&](const char* key, bool boolean_allowed) -> const Json* {
      const Json* value = member(schema, key);
      BASALT_CHECK(!value || value->is_number() || (boolean_allowed && value->is_boolean()),
                   "json schema: keyword \"{}\" at {} must be a number", key, path);
      return value;
    };
    const Json* minimum = read("minimum", false);
    const Json* maximum = read("maximum", false);
    const Json* exclusive_minimum = read("exclusiveMinimum", true);
    const Json* exclusive_maximum = read("exclusiveMaximum", true);
    std::optional<BigInteger> lower, upper;
    const auto raise = [&](const BigInteger& b) {
      if (!lower || compare(b, *lower) > 0) lower = b;
    };
    const auto cut = [&](const BigInteger& b) {
      if (!upper || compare(b, *upper) < 0) upper = b;
    };
    // Draft 4: a boolean exclusiveMinimum makes minimum exclusive.
    const bool draft4_exclusive_min =
        exclusive_minimum && exclusive_minimum->is_boolean() && *exclusive_minimum == true;
    const bool draft4_exclusive_max =
        exclusive_maximum && exclusive_maximum->is_boolean() && *exclusive_maximum == true;
    if (minimum) raise(draft4_exclusive_min ? plus_one(round_number(*minimum, false)) : round_number(*minimum, true));
    if (maximum) cut(draft4_exclusive_max ? minus_one(round_number(*maximum, true)) : round_number(*maximum, false));
    if (exclusive_minimum && exclusive_minimum->is_number()) raise(plus_one(round_number(*exclusive_minimum, false)));
    if (exclusive_maximum && exclusive_maximum->is_number()) cut(minus_one(round_number(*exclusive_maximum, true)));
    if (const Json* format = member(schema, "format"); format && format->is_string()) {
      if (*format == "int32") {
        raise(BigInteger{true, "2147483648"});
        cut(BigInteger{false, "2147483647"});
      } else if (*format == "int64") {
        raise(BigInteger{true, "9223372036854775808"});
        cut(BigInteger{false, "9223372036854775807"});
      }
    }
    return {lower, upper};
  }

  Translation integer(const Json& schema, const std::string& path) {
    const auto [lower, upper] = integer_bounds(schema, path);
    if (!lower && !upper) return Translation::of(use("json-integer"));
    if (lower && upper && compare(*lower, *upper) > 0) {
      return Translation::none(
          fmt::format("the integer range at {} is empty ({} to {})", path, to_string(*lower), to_string(*upper)));
    }
    std::vector<std::string> options;
    if (!lower || lower->negative) {
      // Negative values: "-" and a magnitude from 1 (or -upper) to -lower.
      const std::string from = upper && upper->negative ? upper->digits : "1";
      options.push_back(seq({lit("-"), naturals(from, lower ? std::optional(lower->digits) : std::nullopt)}));
    }
    if (!upper || !upper->negative) {
      const std::string from = lower && !lower->negative ? lower->digits : "0";
      options.push_back(naturals(from, upper ? std::optional(upper->digits) : std::nullopt));
    }
    return Translation::of(alt(options));
  }

  static std::string digit_class(char lo, char hi) {
    if (lo == hi) return lit(std::string(1, lo));
    return fmt::format("[{}-{}]", lo, hi);
  }

  static std::string any_digits(size_t count) {
    return count == 0 ? "" : count == 1 ? "[0-9]" : fmt::format("[0-9]{{{}}}", count);
  }

  static bool all_of_digit(std::string_view s, char d) {
    return std::all_of(s.begin(), s.end(), [d](char c) { return c == d; });
  }

  // Digit strings of s's length that are >= s (leading zeros allowed: these
  // are the tails of longer numbers).
  static std::string tails_at_least(std::string_view s) {
    if (s.empty()) return "";
    const std::string_view rest = s.substr(1);
    if (all_of_digit(rest, '0')) return seq({digit_class(s[0], '9'), any_digits(rest.size())});
    std::vector<std::string> options{seq({lit(s.substr(0, 1)), tails_at_least(rest)})};
    if (s[0] < '9') options.push_back(seq({digit_class(static_cast<char>(s[0] + 1), '9'), any_digits(rest.size())}));
    return alt(options);
  }

  static std::string tails_at_most(std::string_view s) {
    if (s.empty()) return "";
    const std::string_view rest = s.substr(1);
    if (all_of_digit(rest, '9')) return seq({digit_class('0', s[0]), any_digits(rest.size())});
    std::vector<std::string> options;
    if (s[0] > '0') options.push_back(seq({digit_class('0', static_cast<char>(s[0] - 1)), any_digits(rest.size())}));
    options.push_back(seq({lit(s.substr(0, 1)), tails_at_most(rest)}));
    return alt(options);
  }

  // Digit strings from lo to hi, both of one length.
  static std::string digits_between(std::string_view lo, std::string_view hi) {
    if (lo == hi) return lit(lo);
    size_t common = 0;
    while (lo[common] == hi[common]) ++common;
    if (common > 0) return seq({lit(lo.substr(0, common)), digits_between(lo.substr(common), hi.substr(common))});
    const std::string_view lo_rest = lo.substr(1), hi_rest = hi.substr(1);
    const bool lo_full = all_of_digit(lo_rest, '0'), hi_full = all_of_digit(hi_rest, '9');
    const char first = lo_full ? lo[0] : static_cast<char>(lo[0] + 1);
    const char last = hi_full ? hi[0] : static_cast<char>(hi[0] - 1);
    std::vector<std::string> options;
    if (!lo_full) options.push_back(seq({lit(lo.substr(0, 1)), tails_at_least(lo_rest)}));
    if (first <= last) options.push_back(seq({digit_class(first, last), any_digits(lo_rest.size())}));
    if (!hi_full) options.push_back(seq({lit(hi.substr(0, 1)), tails_at_most(hi_rest)}));
    return alt(options);
  }

  // Canonical decimals (no leading zeros) of the integers from `from` to `to`
  // (absent: unbounded), both non-negative.
  static std::string naturals(const std::string& from, const std::optional<std::string>& to) {
    std::vector<std::string> options;
    if (!to) {
      options.push_back(digits_between(from, std::string(from.size(), '9')));
      options.push_back(seq({"[1-9]", any_digits(from.size()), "[0-9]*"}));
      return alt(options);
    }
    for (size_t length = from.size(); length <= to->size(); ++length) {
      std::string lo = from;
      if (length > from.size()) {
        lo.assign(length, '0');
        lo[0] = '1';
      }
      const std::string hi = length == to->size() ? *to : std::string(length, '9');
      options.push_back(digits_between(lo, hi));
    }
    return alt(options);
  }

  // --- Strings ---

  // `excluded`: strings a `not` takes away (Negation::strings), or null.
  Translation string(const Json& schema, const std::string& path, const RegexLanguage* excluded = nullptr) {
    const int64_t min_length = optional_count(schema, "minLength", path).value_or(0);
    const std::optional<int64_t> max_length = optional_count(schema, "maxLength", path);
    if (max_length && min_length > *max_length) {
      return Translation::none(fmt::format("minLength {} is above maxLength {} at {}", min_length, *max_length, path));
    }
    const char* length_keyword = min_length > 0 ? "minLength" : max_length ? "maxLength" : nullptr;
    const std::string quote = lit("\"");
    const Json* pattern = member(schema, "pattern");
    BASALT_CHECK(!pattern || pattern->is_string(), "json schema: keyword \"pattern\" at {} must be a string", path);
    // A pattern every string matches (Github_ultra/o12409.json's
    // "([0-9a-zA-Z]+)?", searched) says nothing; length bounds are written
    // without it, as long as they come.
    if (pattern && length_keyword) {
      const std::optional<RegexLanguage> language = pattern_language(pattern->get<std::string>());
      if (language && language->is_all()) pattern = nullptr;
    }
    // A format beside a pattern, not or length bounds: the format's strings
    // as an automaton (where its rules are regular and fit one), met with
    // the others (Github_medium/o1053.json: a date and a pattern).
    if (const Json* format = member(schema, "format");
        format && (pattern || excluded || length_keyword) && !listed(format_name(*format, path), kHintFormats)) {
      const std::string name = format_name(*format, path);
      std::optional<RegexLanguage> formatted;
      if (listed(name, kFormats)) formatted = format_language(name);
      if (formatted) {
        return string_language(pattern ? pattern->get<std::string>() : std::optional<std::string>(), min_length,
                               max_length, excluded, path, &*formatted);
      }
      if (pattern || excluded) {
        fail("json schema: unsupported keyword \"format\" at {}: format and {} together are not supported", path,
             pattern ? "pattern" : "not");
      }
    }
    if (excluded || (pattern && length_keyword)) {
      return string_language(pattern ? pattern->get<std::string>() : std::optional<std::string>(), min_length,
                             max_length, excluded, path);
    }
    if (pattern) return Translation::of(seq({quote, pattern_rule(pattern->get<std::string>(), path), quote}));
    if (const Json* format = member(schema, "format"); format && !listed(format_name(*format, path), kHintFormats)) {
      const std::string name = format_name(*format, path);
      // Google's API Discovery writes 64-bit integers (and some 32-bit ones)
      // as strings of their decimal digits: "type": "string", "format":
      // "int64".
      if (const auto range = integer_text_range(name)) {
        BASALT_CHECK(!length_keyword,
                     "json schema: unsupported keyword \"{}\" at {}: length bounds and format together are not "
                     "supported",
                     length_keyword ? length_keyword : "", path);
        const Json bounds = {{"minimum", range->first}, {"maximum", range->second}};
        const Translation digits = integer(bounds, path);
        return digits.satisfiable() ? Translation::of(seq({quote, digits.expr, quote})) : digits;
      }
      BASALT_CHECK(listed(name, kFormats),
                   "json schema: unsupported keyword \"format\" at {}: format \"{}\" is not supported", path, name);
      BASALT_CHECK(!length_keyword,
                   "json schema: unsupported keyword \"{}\" at {}: length bounds and format "
                   "together are not "
                   "supported",
                   length_keyword ? length_keyword : "", path);
      return Translation::of(seq({quote, use(name == "url" ? "format-uri" : "format-" + name), quote}));
    }
    if (!length_keyword) return Translation::of(use("json-string"));
    return Translation::of(
        seq({quote, chars_then_quote(min_length, max_length, rule_hint(path) + ".chars")}));
  }

  // The range of the integer formats a string may carry (Google's API
  // Discovery: int64 and uint64 are strings of decimal digits, int32 and
  // uint32 too where a string type says so); none for other formats.
  static std::optional<std::pair<Json, Json>> integer_text_range(const std::string& format) {
    if (format == "int32") return std::pair<Json, Json>(INT32_MIN, INT32_MAX);
    if (format == "uint32") return std::pair<Json, Json>(0, UINT32_MAX);
    if (format == "int64") return std::pair<Json, Json>(INT64_MIN, INT64_MAX);
    if (format == "uint64") return std::pair<Json, Json>(0, UINT64_MAX);
    return std::nullopt;
  }

  // multipleOf: 1 (or 1.0) asks for integers, which the number grammar
  // then leaves to the integer one; any other divisor is refused by name.
  static bool whole_numbers_only(const Json& schema, const std::string& path) {
    const Json* divisor = member(schema, "multipleOf");
    if (!divisor) return false;
    BASALT_CHECK(divisor->is_number() && divisor->get<double>() > 0,
                 "json schema: keyword \"multipleOf\" at {} must be a number above 0", path);
    BASALT_CHECK(divisor->get<double>() == 1.0,
                 "json schema: unsupported keyword \"multipleOf\" at {}: only 1 (integers) is supported, not {}",
                 path, divisor->dump());
    return true;
  }

  // Strings as one automaton: those of `formatted` (every string without
  // it) that the pattern matches, of the length bounds, less `excluded` (a
  // not's).
  Translation string_language(const std::optional<std::string>& pattern, int64_t min_length,
                              std::optional<int64_t> max_length, const RegexLanguage* excluded,
                              const std::string& path, const RegexLanguage* formatted = nullptr) {
    RegexLanguage language = formatted ? *formatted : RegexLanguage::all();
    if (pattern) {
      try {
        language = language.intersect(RegexLanguage::of_pattern(*pattern, RegexMode::kSearch));
      } catch (const Error& e) {
        fail("json schema: keyword \"pattern\" at {}: {}", path, e.what());
      }
    }
    const char* keyword = excluded ? "not" : min_length > 0 ? "minLength" : "maxLength";
    // maxLength kept at run time (grammar/bounded_string.h) where counting
    // up to it multiplies a pattern's or format's automaton past what fits:
    // a uri of at most 255 code points (Github_hard/o1051.json), at most 50
    // words in 500 (Github_ultra/o21135.json).
    // The product has at most (states) x (maxLength + 1) states; past the
    // limit it is not tried (a uri's product takes 20 ms to fail).
    std::optional<int64_t> run_time_bound;
    try {
      if (min_length > 0 || max_length) {
        const bool may_bound = max_length && (pattern || formatted);
        const bool product_fits = !max_length || static_cast<double>(language.state_count()) *
                                                         static_cast<double>(*max_length + 1) <=
                                                     static_cast<double>(RegexLanguage::kMaxStates);
        std::optional<RegexLanguage> product;
        if (!may_bound || product_fits) {
          try {
            product = language.intersect(RegexLanguage::of_length(min_length, max_length.value_or(-1)));
          } catch (const Error&) {
            if (!may_bound) throw;
          }
        }
        if (product) {
          language = std::move(*product);
        } else {
          if (min_length > 0) language = language.intersect(RegexLanguage::of_length(min_length, -1));
          run_time_bound = max_length;
        }
      }
      if (excluded) language = language.minus(*excluded);
    } catch (const Error& e) {
      fail("json schema: unsupported keyword \"{}\" at {}: {}", keyword, path, e.what());
    }
    if (language.empty() || (run_time_bound && language.shortest() > *run_time_bound)) {
      return Translation::none(fmt::format("no string at {} meets its pattern, length bounds and not together",
                                           path));
    }
    const RegexRules rules = language.to_ebnf(/*json_escaped=*/true, fmt::format("lang{}.", ++name_sets_));
    pattern_rules_ += rules.rules;
    if (run_time_bound) {
      const std::string bounded = fmt::format("{}{}..lang{}.string", kBoundedRulePrefix, *run_time_bound, name_sets_);
      pattern_rules_ += fmt::format("{} ::= {}\n", bounded, seq({lit("\""), rules.root, lit("\"")}));
      return Translation::of(bounded);
    }
    return Translation::of(seq({lit("\""), rules.root, lit("\"")}));
  }

  // What a `not` takes away, by type: every value of `types`, and besides
  // them the `strings` and `literals` (true, false, null) it names. A value
  // matches the negated schema when each of its keywords that applies to
  // the value's type holds; supported are schemas whose assertions are
  // type, enum, const and pattern (and boolean schemas), so that what they
  // take away is whole types, strings (a list or a pattern) and literals.
  // Others, and lists of numbers, objects or arrays, are refused by name.
  struct Negation {
    uint8_t types = 0;
    std::optional<RegexLanguage> strings;
    std::vector<Json> literals;
    bool excludes(const Json& value) const {
      const uint8_t t = value_type(value);
      if ((types & t) == t) return true;
      if (value.is_string()) return strings && strings->contains(value.get<std::string>());
      return std::any_of(literals.begin(), literals.end(), [&](const Json& v) { return v == value; });
    }
  };

  // A not's schema that only requires names, as what the not leaves: the
  // objects that lack at least one of them (every other value has them all,
  // as required applies to objects only). {"required": R} leaves objects
  // with some r of R absent; anyOf of such schemas leaves what each leaves
  // (allOf), allOf of them what their union leaves. Absent for any other
  // schema.
  std::optional<Json> absent_names(const Json& negated, const std::string& path) {
    if (!negated.is_object() || negated.empty()) return std::nullopt;
    const auto only = [&](const Json& s, std::string_view key) {
      return s.is_object() && s.contains(key) && !has_assertions(s, {key});
    };
    std::vector<std::string> names;
    const auto collect = [&](const Json& s) {
      const Json& list = s.at("required");
      BASALT_CHECK(list.is_array(), "json schema: keyword \"required\" at {} must be an array of strings", path);
      for (const Json& name : list) {
        BASALT_CHECK(name.is_string(), "json schema: keyword \"required\" at {} must be an array of strings", path);
        names.push_back(name.get<std::string>());
      }
    };
    if (only(negated, "required")) {
      collect(negated);
    } else if (only(negated, "allOf") && negated.at("allOf").is_array() && !negated.at("allOf").empty() &&
               std::all_of(negated.at("allOf").begin(), negated.at("allOf").end(),
                           [&](const Json& s) { return only(s, "required"); })) {
      for (const Json& s : negated.at("allOf")) collect(s);
    } else if (negated.contains("required") && negated.at("required").is_array() &&
               !negated.at("required").empty() && !negated.contains("anyOf") && !negated.contains("oneOf")) {
      // required beside other keywords (Github_medium/o21864.json: not
      // {"properties": {...}, "required": ["FirstName", "LastName"]}): the
      // objects that lack a required name fail the negated schema whatever
      // else it says, so they satisfy the not; the values that fail it
      // otherwise are left out (narrower, never wider).
      collect(negated);
    } else if (only(negated, "anyOf") && negated.at("anyOf").is_array() && !negated.at("anyOf").empty()) {
      Json each = Json::array();
      for (const Json& s : negated.at("anyOf")) {
        std::optional<Json> one = absent_names(s, path);
        if (!one) return std::nullopt;
        each.push_back(std::move(*one));
      }
      return Json{{"allOf", std::move(each)}};
    } else {
      return std::nullopt;
    }
    if (names.empty()) return Json(false);  // every object has all of no names
    Json lacking = Json::array();
    for (const std::string& name : names) lacking.push_back(Json{{"properties", Json{{name, false}}}});
    return Json{{"type", "object"}, {"anyOf", std::move(lacking)}};
  }

  // if / then / else: the schema without them, in an allOf with the anyOf
  // of two schemas no value matches both of, allOf [if, then] and
  // allOf [not if, else] (then and else default to true). `not if` is
  // written where the if is a schema `not` takes (type, enum, const,
  // pattern), or an object test made of properties whose schemas `not`
  // takes, required names and type object (the discriminator of real
  // schemas: if {"properties": {"kind": {"const": "a"}}}); the values that
  // fail such a test are the non-objects (when it says type object), the
  // objects that lack a required name, and the objects with a listed member
  // that fails its schema. Other ifs are refused.
  // Then or else without if, and if without either, assert nothing.
  Json without_conditional(const Json& schema, const std::string& path) {
    Json rest = schema;
    for (const char* key : {"if", "then", "else"}) rest.erase(key);
    if (!schema.contains("if") || (!schema.contains("then") && !schema.contains("else"))) return rest;
    const Json& condition = schema.at("if");
    const std::string at = child_path(path, "if");
    const auto negatable = [&](const Json& s, const std::string& p) {
      try {
        negation(s, p);
        return true;
      } catch (const Error&) {
        return false;
      }
    };
    Json failing = Json::array();  // schemas whose union is `not if`
    if (condition.is_boolean()) {
      if (!condition.get<bool>()) failing.push_back(true);
    } else if (negatable(condition, path)) {
      failing.push_back(Json{{"not", condition}});
    } else {
      BASALT_CHECK(condition.is_object(), "json schema: keyword \"if\" at {} must be a schema", path);
      for (const auto& [key, value] : condition.items()) {
        BASALT_CHECK(!is_assertion(key) || key == "properties" || key == "required" ||
                         (key == "type" && value == "object"),
                     "json schema: unsupported keyword \"if\" at {}: its else needs the values that fail it, "
                     "and only those of type, enum, const, pattern, or of properties, required and type object, "
                     "are known, not of \"{}\"",
                     path, key);
      }
      if (condition.contains("type")) failing.push_back(Json{{"not", Json{{"type", "object"}}}});
      if (const Json* names = member(condition, "required"); names && names->is_array() && !names->empty())
        failing.push_back(Json{{"type", "object"}, {"not", Json{{"required", *names}}}});
      if (const Json* properties = member(condition, "properties")) {
        BASALT_CHECK(properties->is_object(), "json schema: keyword \"properties\" at {} must be an object", at);
        for (const auto& [name, member_schema] : properties->items()) {
          BASALT_CHECK(negatable(member_schema, child_path(child_path(at, "properties"), name)),
                       "json schema: unsupported keyword \"if\" at {}: its else needs the values that fail the "
                       "schema of property \"{}\", and only those of type, enum, const and pattern are known",
                       path, name);
          failing.push_back(Json{{"type", "object"},
                                 {"required", Json::array({name})},
                                 {"properties", Json{{name, Json{{"not", member_schema}}}}}});
        }
      }
    }
    const Json then_schema = schema.contains("then") ? schema.at("then") : Json(true);
    const Json else_schema = schema.contains("else") ? schema.at("else") : Json(true);
    Json branches = Json::array({Json{{"allOf", Json::array({condition, then_schema})}}});
    for (const Json& f : failing) branches.push_back(Json{{"allOf", Json::array({f, else_schema})}});
    return Json{{"allOf", Json::array({rest, Json{{"anyOf", branches}}})}};
  }

  Negation negation(const Json& negated, const std::string& path) {
    const std::string at = child_path(path, "not");
    Negation out;
    if (negated.is_boolean()) {
      if (negated.get<bool>()) out.types = kAnyType;
      return out;
    }
    BASALT_CHECK(negated.is_object(), "json schema: keyword \"not\" at {} must be a schema", path);
    // A $ref alone: what it names (JsonSchemaStore's avro-avsc: a custom type
    // name, not one of the primitive types' enum).
    if (negated.contains("$ref") && !has_assertions(negated, {"$ref"})) {
      const Json& target = referenced_schema(negated, at);
      const bool still_ref = target.is_object() && target.contains("$ref") && !has_assertions(target, {"$ref"});
      if (!still_ref) return negation(target, path);  // (a cycle of $refs stays one, and is refused below)
    }
    // not (A or B) takes away what not A and not B take (how merging writes
    // two nots).
    if (const Json* branches = member(negated, "anyOf"); branches && !has_assertions(negated, {"anyOf"})) {
      BASALT_CHECK(branches->is_array() && !branches->empty(),
                   "json schema: keyword \"anyOf\" at {} must be a non-empty array", at);
      for (const Json& branch : *branches) {
        Negation one = negation(branch, path);
        out.types |= one.types;
        out.literals.insert(out.literals.end(), one.literals.begin(), one.literals.end());
        if (one.strings) {
          out.strings = out.strings ? out.strings->complement().intersect(one.strings->complement()).complement()
                                    : std::move(one.strings);
        }
      }
      return out;
    }
    for (const auto& [key, value] : negated.items()) {
      BASALT_CHECK(!is_assertion(key) || key == "type" || key == "enum" || key == "const" || key == "pattern",
                   "json schema: unsupported keyword \"not\" at {}: only type, enum, const and pattern (or "
                   "required alone) are supported inside it, not \"{}\"",
                   path, key);
    }
    const uint8_t types = negated.contains("type") ? type_set(negated.at("type"), child_path(at, "type")) : kAnyType;
    std::optional<std::vector<Json>> values;
    if (const Json* list = member(negated, "enum")) {
      BASALT_CHECK(list->is_array(), "json schema: keyword \"enum\" at {} must be an array", at);
      values = std::vector<Json>(list->begin(), list->end());
    }
    if (const Json* value = member(negated, "const")) {
      std::vector<Json> kept;
      if (!values || std::any_of(values->begin(), values->end(), [&](const Json& v) { return json_equal(v, *value); }))
        kept.push_back(*value);
      values = kept;
    }
    const Json* pattern = member(negated, "pattern");
    BASALT_CHECK(!pattern || pattern->is_string(), "json schema: keyword \"pattern\" at {} must be a string", at);
    // Types no keyword of the negated schema applies to are taken whole.
    for (const uint8_t type : {kNull, kBoolean, kObject, kArray, kInteger, kFraction}) {
      if (!(types & type)) continue;
      if (!values) {
        out.types |= type;
        continue;
      }
      for (const Json& v : *values) {
        const uint8_t vt = value_type(v);
        if (vt != type) continue;
        BASALT_CHECK(type == kNull || type == kBoolean,
                     "json schema: unsupported keyword \"not\" at {}: only strings, booleans and null can be "
                     "listed inside it",
                     path);
        out.literals.push_back(v);
      }
    }
    if (types & kString) {
      if (!values && !pattern) {
        out.types |= kString;
      } else {
        try {
          RegexLanguage strings =
              pattern ? RegexLanguage::of_pattern(pattern->get<std::string>(), RegexMode::kSearch) : RegexLanguage::all();
          if (values) {
            std::vector<std::string> listed;
            for (const Json& v : *values)
              if (v.is_string()) listed.push_back(v.get<std::string>());
            strings = strings.intersect(RegexLanguage::of_strings(listed));
          }
          if (!strings.empty()) out.strings = std::move(strings);
        } catch (const Error& e) {
          fail("json schema: unsupported keyword \"not\" at {}: {}", path, e.what());
        }
      }
    }
    return out;
  }

  static std::string format_name(const Json& format, const std::string& path) {
    BASALT_CHECK(format.is_string(), "json schema: keyword \"format\" at {} must be a string", path);
    return format.get<std::string>();
  }

  // The rule of a pattern's language (JSON-escaped text, search semantics);
  // `keyword` names where the pattern came from, for errors.
  std::string pattern_rule(const std::string& pattern, const std::string& path, std::string_view keyword = "pattern") {
    auto [it, inserted] = patterns_.try_emplace(pattern);
    if (!inserted) return it->second;
    RegexRules rules;
    try {
      rules = regex_to_ebnf(pattern, RegexMode::kSearch, /*json_escaped=*/true,
                            fmt::format("pattern{}.", patterns_.size()));
    } catch (const Error& e) {
      fail("json schema: {}keyword \"{}\" at {}: {}", keyword == "pattern" ? "" : "unsupported ", keyword, path,
           e.what());
    }
    pattern_rules_ += rules.rules;
    if (!pattern_rules_.empty() && pattern_rules_.back() != '\n') pattern_rules_.push_back('\n');
    it->second = rules.root;
    return rules.root;
  }

  // --- patternProperties ---

  // Whether the pattern matches the string `text` (search semantics, as
  // JSON Schema reads patterns; matched against its JSON-escaped spelling,
  // as pattern_rule's language is); `keyword` names where the pattern came
  // from, for errors.
  bool text_matches(const std::string& pattern, const std::string& text, const std::string& path,
                    std::string_view keyword) {
    auto it = pattern_grammars_.find(pattern);
    if (it == pattern_grammars_.end()) {
      RegexRules rules;
      try {
        rules = regex_to_ebnf(pattern, RegexMode::kSearch, /*json_escaped=*/true, "p.");
      } catch (const Error& e) {
        fail("json schema: {}keyword \"{}\" at {}: {}", keyword == "pattern" ? "" : "unsupported ", keyword, path,
             e.what());
      }
      it = pattern_grammars_.emplace(pattern, parse_ebnf(rules.rules, rules.root)).first;
    }
    const std::string quoted = Json(text).dump();
    return grammar_matches(it->second, std::string_view(quoted).substr(1, quoted.size() - 2));
  }

  // A patternProperties pattern's names (search semantics), made once.
  const RegexLanguage& name_language(const std::string& pattern, const std::string& path) {
    auto it = name_languages_.find(pattern);
    if (it == name_languages_.end()) {
      try {
        it = name_languages_.emplace(pattern, RegexLanguage::of_pattern(pattern, RegexMode::kSearch)).first;
      } catch (const Error& e) {
        fail("json schema: unsupported keyword \"patternProperties\" at {}: {}", path, e.what());
      }
    }
    return it->second;
  }

  // --- Arrays ---

  // Arrays whose items must differ (uniqueItems) are written by a distinct
  // rule (grammar/ebnf.h): the grammar allows repeats, and the matcher's
  // users take them out at run time (grammar/distinct_json.h).
  Translation array(const Json& schema, const std::string& path) {
    const bool distinct = schema.value("uniqueItems", false) == true;
    if (!distinct && !schema.contains("items") && !schema.contains("prefixItems") && !schema.contains("minItems") &&
        !schema.contains("maxItems")) {
      return Translation::of(use("json-array"));
    }
    static const Json kTrue = true;
    std::vector<Part> prefix;
    Part rest{&kTrue, path};
    const Json* items = member(schema, "items");
    if (items && items->is_array()) {
      // Draft 4 to 2019-09: a list of items, then additionalItems.
      BASALT_CHECK(!schema.contains("prefixItems"),
                   "json schema: keyword \"prefixItems\" at {} cannot be used with an items array", path);
      for (size_t i = 0; i < items->size(); ++i)
        prefix.emplace_back(&(*items)[i], child_path(child_path(path, "items"), i));
      if (const Json* additional = member(schema, "additionalItems"))
        rest = {additional, child_path(path, "additionalItems")};
    } else {
      if (const Json* list = member(schema, "prefixItems")) {
        BASALT_CHECK(list->is_array(), "json schema: keyword \"prefixItems\" at {} must be an array", path);
        for (size_t i = 0; i < list->size(); ++i)
          prefix.emplace_back(&(*list)[i], child_path(child_path(path, "prefixItems"), i));
      }
      if (items) rest = {items, child_path(path, "items")};
    }
    const int64_t min_items = optional_count(schema, "minItems", path).value_or(0);
    const std::optional<int64_t> max_items = optional_count(schema, "maxItems", path);
    if (max_items && min_items > *max_items)
      return Translation::none(fmt::format("minItems {} is above maxItems {} at {}", min_items, *max_items, path));

    const DepthGuard guard(depth_);
    const std::string hint = rule_hint(path);
    std::vector<std::string> item_exprs;
    std::string reason;
    for (const auto& [item, item_path] : prefix) {
      if (max_items && static_cast<int64_t>(item_exprs.size()) >= *max_items) break;
      const Translation t = translate(*item, item_path);
      if (!t.satisfiable()) {
        reason = t.no_value_reason;
        break;
      }
      item_exprs.push_back(t.expr);
    }
    const auto usable = static_cast<int64_t>(item_exprs.size());
    std::optional<std::string> rest_expr;
    if (usable == static_cast<int64_t>(prefix.size()) && (!max_items || *max_items > usable)) {
      const Translation t = translate(*rest.first, rest.second);
      if (t.satisfiable()) {
        rest_expr = share(t.expr, hint + ".item");
      } else {
        reason = t.no_value_reason;
      }
    }
    if (!rest_expr && min_items > usable) {
      return Translation::none(fmt::format("no array at {} has the {} items minItems asks for{}", path, min_items,
                                           reason.empty() ? "" : ": " + reason));
    }
    std::string text = rest_expr ? members(*rest_expr, usable == 0, std::max<int64_t>(0, min_items - usable),
                                           max_items ? std::optional(*max_items - usable) : std::nullopt, "]", hint)
                                 : close(usable, "]");
    for (int64_t i = usable - 1; i >= 0; --i) {
      const std::string present = seq({i == 0 ? "" : sep_, item_exprs[static_cast<size_t>(i)], text});
      text = i >= min_items ? alt({present, close(i, "]")}) : present;
    }
    if (distinct && prefix.empty()) {
      // Fewer distinct values than minItems asks for: no array at all
      // (rather than a grammar the run-time check can only let repeat).
      if (const std::optional<int64_t> count = value_count(*rest.first, rest.second); count && *count < min_items) {
        return Translation::none(fmt::format("the items at {} take {} distinct values, fewer than minItems {}", path,
                                             *count, min_items));
      }
    }
    if (distinct) {
      bool open = values_outnumber(*rest.first, rest.second, max_items);
      for (const auto& [item, item_path] : prefix) open = open && values_outnumber(*item, item_path, max_items);
      const std::string_view marker = open ? kOpenDistinctRulePrefix : kDistinctRulePrefix;
      return Translation::of(define(std::string(marker) + hint, seq({lit("["), ws_, text})));
    }
    return Translation::of(seq({lit("["), ws_, text}));
  }

  // How many values `item` admits, where that is plain from it: an enum or
  // a const alone, a boolean or null type, or an integer range; none
  // otherwise.
  std::optional<int64_t> value_count(const Json& item, const std::string& path) const {
    const Json& s = referenced_schema(item, path);
    if (s.is_boolean()) return s.get<bool>() ? std::nullopt : std::optional<int64_t>(0);
    if (!s.is_object()) return std::nullopt;
    if (const Json* list = member(s, "enum"); list && list->is_array() && !has_assertions(s, {"enum", "type"}) &&
                                              !s.contains("type")) {
      std::vector<Json> distinct;
      for (const Json& v : *list)
        if (std::none_of(distinct.begin(), distinct.end(), [&](const Json& d) { return json_equal(d, v); }))
          distinct.push_back(v);
      return static_cast<int64_t>(distinct.size());
    }
    if (s.contains("const") && !has_assertions(s, {"const"})) return 1;
    const Json* type = member(s, "type");
    if (!type || !type->is_string()) return std::nullopt;
    if (*type == "boolean" && !has_assertions(s, {"type"})) return 2;
    if (*type == "null" && !has_assertions(s, {"type"})) return 1;
    if (*type == "integer" && !has_assertions(s, {"type", "minimum", "maximum"})) {
      const Json* lo = member(s, "minimum");
      const Json* hi = member(s, "maximum");
      if (!lo || !hi || !lo->is_number_integer() || !hi->is_number_integer()) return std::nullopt;
      const double span = hi->get<double>() - lo->get<double>() + 1;
      return span < 0 ? 0 : span > 1e15 ? std::nullopt : std::optional<int64_t>(static_cast<int64_t>(span));
    }
    return std::nullopt;
  }

  // Whether distinct items of `item` can always take one more in an array
  // of at most `max_items` (kOpenDistinctRulePrefix): the item's values are
  // infinite, or more than max_items. Decided for one type and its bounds;
  // false where unsure, and the run-time check then searches.
  bool values_outnumber(const Json& item, const std::string& path, std::optional<int64_t> max_items) const {
    const Json& s = referenced_schema(item, path);
    if (s.is_boolean()) return s.get<bool>();
    if (!s.is_object()) return false;
    const Json* type = member(s, "type");
    if (!type) return !has_assertions(s, {});
    if (!type->is_string()) return false;
    const std::string t = type->get<std::string>();
    if (t == "string") {
      if (has_assertions(s, {"type", "minLength", "maxLength"})) return false;
      const Json* most = member(s, "maxLength");
      // Past 2 characters, strings outnumber any array a model writes.
      return !most || (most->is_number_unsigned() && most->get<uint64_t>() >= 3 && max_items && *max_items <= 100000);
    }
    if (t == "number") {
      if (has_assertions(s, {"type", "minimum", "maximum"})) return false;
      const Json* lo = member(s, "minimum");
      const Json* hi = member(s, "maximum");
      return !lo || !hi || !json_equal(*lo, *hi);
    }
    if (t == "integer") {
      if (has_assertions(s, {"type", "minimum", "maximum"})) return false;
      const Json* lo = member(s, "minimum");
      const Json* hi = member(s, "maximum");
      if (!lo || !hi) return true;
      return lo->is_number() && hi->is_number() && max_items &&
             hi->get<double>() - lo->get<double>() >= static_cast<double>(*max_items);
    }
    return (t == "object" || t == "array") && !has_assertions(s, {"type"});
  }

  // --- Objects ---

  Translation object(const Json& schema, const std::string& path) {
    if (!schema.contains("properties") && !schema.contains("required") && !schema.contains("additionalProperties") &&
        !schema.contains("minProperties") && !schema.contains("maxProperties") &&
        !schema.contains("patternProperties") && !schema.contains("propertyNames")) {
      return Translation::of(use("json-object"));
    }
    std::optional<RegexLanguage> allowed_names;
    if (const Json* limit = member(schema, "propertyNames")) {
      const std::string limit_path = child_path(path, "propertyNames");
      try {
        allowed_names = names_of(*limit, limit_path, 0);
      } catch (const Error& e) {
        fail("json schema: unsupported keyword \"propertyNames\" at {}: {}", path, e.what());
      }
    }
    const auto name_allowed = [&](const std::string& name) { return !allowed_names || allowed_names->contains(name); };
    const Json* properties = member(schema, "properties");
    BASALT_CHECK(!properties || properties->is_object(), "json schema: keyword \"properties\" at {} must be an object",
                 path);
    std::vector<std::string> required;
    if (const Json* list = member(schema, "required")) {
      BASALT_CHECK(list->is_array(), "json schema: keyword \"required\" at {} must be an array of strings", path);
      for (const Json& name : *list) {
        BASALT_CHECK(name.is_string(), "json schema: keyword \"required\" at {} must be an array of strings", path);
        if (std::find(required.begin(), required.end(), name.get<std::string>()) == required.end())
          required.push_back(name.get<std::string>());
      }
    }
    const Json* additional = member(schema, "additionalProperties");
    BASALT_CHECK(!additional || additional->is_boolean() || additional->is_object(),
                 "json schema: keyword \"additionalProperties\" at {} must be a schema", path);
    const Json* patterns = member(schema, "patternProperties");
    BASALT_CHECK(!patterns || patterns->is_object(),
                 "json schema: keyword \"patternProperties\" at {} must be an object", path);
    const std::string patterns_path = child_path(path, "patternProperties");
    // The schema a listed name must satisfy: its own (or none), and that of
    // each pattern it matches; absent when no pattern matches it.
    const auto with_patterns = [&](const std::string& name, const Json* own,
                                   const std::string& own_path) -> std::optional<Translation> {
      if (!patterns) return std::nullopt;
      std::vector<Part> parts;
      if (own) parts.emplace_back(own, own_path);
      for (const auto& [pattern, pattern_schema] : patterns->items())
        if (name_language(pattern, path).contains(name))
          parts.emplace_back(&pattern_schema, child_path(patterns_path, pattern));
      if (parts.size() == (own ? 1u : 0u)) return std::nullopt;
      return translate_merged(merge(parts), own ? own_path : path);
    };
    const int64_t min_properties = optional_count(schema, "minProperties", path).value_or(0);
    const std::optional<int64_t> max_properties = optional_count(schema, "maxProperties", path);
    if (max_properties && min_properties > *max_properties) {
      return Translation::none(
          fmt::format("minProperties {} is above maxProperties {} at {}", min_properties, *max_properties, path));
    }

    const DepthGuard guard(depth_);
    const std::string hint = rule_hint(path);
    const auto is_required = [&](const std::string& name) {
      return std::find(required.begin(), required.end(), name) != required.end();
    };
    std::vector<ObjectMember> listed_members;
    const auto member_text = [&](const std::string& name, const std::string& value) {
      const std::string key = Json(name).dump();
      if (ws_.empty()) return seq({lit(key + ":"), value});
      return seq({lit(key), ws_, lit(":"), ws_, value});
    };
    for (const std::string& name : required) {
      if (!name_allowed(name)) {
        return Translation::none(fmt::format("required property \"{}\" at {} is not a name propertyNames allows",
                                             name, path));
      }
    }
    if (properties) {
      for (const auto& [name, property] : properties->items()) {
        if (!name_allowed(name)) continue;
        const std::string property_path = child_path(child_path(path, "properties"), name);
        const std::optional<Translation> matched = with_patterns(name, &property, property_path);
        const Translation t = matched ? *matched : translate(property, property_path);
        if (!t.satisfiable()) {
          if (is_required(name)) {
            return Translation::none(
                fmt::format("required property \"{}\" at {} admits no value: {}", name, path, t.no_value_reason));
          }
          continue;
        }
        listed_members.push_back({member_text(name, share(t.expr, rule_hint(property_path))), is_required(name)});
      }
    }
    std::optional<std::string> extra_value;
    std::string extra_reason = fmt::format("additionalProperties is false at {}", path);
    if (!additional || *additional != false) {
      const Translation t = additional ? translate(*additional, child_path(path, "additionalProperties"))
                                       : Translation::of(use("json-value"));
      if (t.satisfiable()) {
        extra_value = share(t.expr, hint + ".additional");
      } else {
        extra_reason = t.no_value_reason;
      }
    }
    for (const std::string& name : required) {
      if (properties && properties->contains(name)) continue;
      if (const std::optional<Translation> matched = with_patterns(name, nullptr, path)) {
        if (!matched->satisfiable()) {
          return Translation::none(
              fmt::format("required property \"{}\" at {} admits no value: {}", name, path, matched->no_value_reason));
        }
        listed_members.push_back({member_text(name, share(matched->expr, hint + ".pattern")), true});
        continue;
      }
      if (!extra_value) {
        return Translation::none(
            fmt::format("required property \"{}\" at {} is not in properties and {}", name, path, extra_reason));
      }
      listed_members.push_back({member_text(name, *extra_value), true});
    }
    // The listed names are not additional properties: their own schemas (or
    // their absence, for a false one) decide them.
    std::vector<std::string> names = required;
    if (properties)
      for (const auto& [name, property] : properties->items()) names.push_back(name);
    if (patterns || allowed_names) {
      return object_members(listed_members,
                            pattern_members(patterns ? *patterns : Json::object(), names,
                                            allowed_names ? &*allowed_names : nullptr, extra_value, path),
                            min_properties, max_properties, path);
    }
    std::optional<std::string> extra_member;
    if (extra_value) {
      if (names.empty() && *extra_value == "json-value") {
        extra_member = use("json-member");
      } else {
        extra_member = share(seq({key_other_than(names, hint), ws_, lit(":"), ws_, *extra_value}), hint + ".member");
      }
    }
    return object_members(listed_members, extra_member, min_properties, max_properties, path);
  }

  // The member names a propertyNames schema allows, as a language: type,
  // pattern, minLength, maxLength, enum, const, allOf and $ref of such
  // schemas (every name is a string); other assertions are refused.
  RegexLanguage names_of(const Json& schema, const std::string& path, int depth) {
    BASALT_CHECK(depth < 64, "its $ref and allOf nest past 64 levels at {}", path);
    if (schema.is_boolean()) return schema.get<bool>() ? RegexLanguage::all() : RegexLanguage::all().complement();
    BASALT_CHECK(schema.is_object(), "the schema at {} must be an object or a boolean", path);
    check_keywords(schema, path);
    RegexLanguage names = RegexLanguage::all();
    const int64_t min_length = optional_count(schema, "minLength", path).value_or(0);
    const std::optional<int64_t> max_length = optional_count(schema, "maxLength", path);
    if (max_length && min_length > *max_length) return RegexLanguage::all().complement();
    if (min_length > 0 || max_length) names = names.intersect(RegexLanguage::of_length(min_length, max_length.value_or(-1)));
    for (const auto& [key, value] : schema.items()) {
      if (!is_assertion(key) || key == "minLength" || key == "maxLength") continue;
      const std::string at = child_path(path, key);
      if (key == "type") {
        if (!(type_set(value, at) & kString)) return RegexLanguage::all().complement();
      } else if (key == "pattern") {
        BASALT_CHECK(value.is_string(), "keyword \"pattern\" at {} must be a string", path);
        names = names.intersect(RegexLanguage::of_pattern(value.get<std::string>(), RegexMode::kSearch));
      } else if (key == "enum" || key == "const") {
        BASALT_CHECK(key == "const" || value.is_array(), "keyword \"enum\" at {} must be an array", path);
        std::vector<std::string> listed_names;
        for (const Json& v : key == "const" ? Json::array({value}) : value)
          if (v.is_string()) listed_names.push_back(v.get<std::string>());
        names = names.intersect(RegexLanguage::of_strings(listed_names));
      } else if (key == "allOf") {
        BASALT_CHECK(value.is_array() && !value.empty(), "keyword \"allOf\" at {} must be a non-empty array", path);
        for (size_t i = 0; i < value.size(); ++i) names = names.intersect(names_of(value[i], child_path(at, i), depth + 1));
      } else if (key == "$ref") {
        const auto [pointer, target] = resolve(value, path);
        names = names.intersect(names_of(*target, pointer, depth + 1));
      } else if (key == "anyOf" || key == "oneOf") {
        // anyOf: the union of the branches' names; oneOf: less the names of
        // two branches (JsonSchemaStore's ansible-lint: rule names, an enum
        // or a pattern).
        BASALT_CHECK(value.is_array() && !value.empty(), "keyword \"{}\" at {} must be a non-empty array", key, path);
        std::vector<RegexLanguage> branches;
        for (size_t i = 0; i < value.size(); ++i) branches.push_back(names_of(value[i], child_path(at, i), depth + 1));
        RegexLanguage none_of = RegexLanguage::all();  // the names no branch takes
        for (const RegexLanguage& branch : branches) none_of = none_of.minus(branch);
        RegexLanguage any = none_of.complement();
        if (key == "oneOf") {
          for (size_t i = 0; i < branches.size(); ++i)
            for (size_t j = i + 1; j < branches.size(); ++j) any = any.minus(branches[i].intersect(branches[j]));
        }
        names = names.intersect(any);
      } else if (!listed(key, kObjectKeywords) && !listed(key, kArrayKeywords) && !listed(key, kNumberKeywords)) {
        // Keywords of other types assert nothing about a string.
        fail("keyword \"{}\" at {} is not supported for names", key, path);
      }
    }
    return names;
  }

  // The further members of an object with patternProperties or
  // propertyNames, exactly: the names not listed (and allowed, when
  // `allowed_names` is given) are split by the patterns that match them (each split
  // an intersection of patterns and complements, built as automata), and
  // each part is one member form, whose value satisfies the schema of every
  // pattern matching its names, or `extra_value` (additionalProperties)
  // where none does; absent when no further member is possible.
  std::optional<std::string> pattern_members(const Json& patterns, const std::vector<std::string>& names,
                                             const RegexLanguage* allowed_names,
                                             const std::optional<std::string>& extra_value, const std::string& path) {
    const std::string patterns_path = child_path(path, "patternProperties");
    const std::string hint = rule_hint(path);
    struct NameSet {
      RegexLanguage names;
      std::vector<const Json*> matched;  // the patterns' items
    };
    std::vector<Json::const_iterator> items;
    for (auto it = patterns.begin(); it != patterns.end(); ++it) items.push_back(it);
    std::vector<const RegexLanguage*> languages;
    for (const auto& item : items) languages.push_back(&name_language(item.key(), path));
    std::vector<NameSet> parts;
    try {
      const RegexLanguage unlisted = RegexLanguage::all().minus(RegexLanguage::of_strings(names));
      parts.push_back({allowed_names ? allowed_names->intersect(unlisted) : unlisted, {}});
      if (parts.back().names.empty()) parts.clear();
      for (size_t i = 0; i < items.size(); ++i) {
        const RegexLanguage& language = *languages[i];
        std::vector<NameSet> split;
        for (NameSet& part : parts) {
          RegexLanguage in = part.names.intersect(language);
          RegexLanguage out = part.names.minus(language);
          if (!in.empty()) {
            std::vector<const Json*> matched = part.matched;
            matched.push_back(&*items[i]);
            split.push_back({std::move(in), std::move(matched)});
          }
          if (!out.empty()) split.push_back({std::move(out), std::move(part.matched)});
        }
        BASALT_CHECK(split.size() <= kMaxPatternOverlaps,
                     "the patterns overlap in more than {} combinations", kMaxPatternOverlaps);
        parts = std::move(split);
      }
    } catch (const Error& e) {
      fail("json schema: unsupported keyword \"patternProperties\" at {}: {}", path, e.what());
    }
    std::vector<std::string> options;
    for (const NameSet& part : parts) {
      std::optional<std::string> value;
      if (part.matched.empty()) {
        value = extra_value;
      } else {
        std::vector<Part> schemas;
        for (size_t i = 0; i < items.size(); ++i) {
          if (std::find(part.matched.begin(), part.matched.end(), &*items[i]) != part.matched.end())
            schemas.emplace_back(&*items[i], child_path(patterns_path, items[i].key()));
        }
        const Translation t = schemas.size() == 1 ? translate(*schemas[0].first, schemas[0].second)
                                                  : translate_merged(merge(schemas), schemas[0].second);
        if (t.satisfiable()) value = t.expr;
      }
      if (!value) continue;
      std::string key;
      if (part.names.is_all()) {
        key = use("json-string");
      } else {
        const RegexRules rules =
            part.names.to_ebnf(/*json_escaped=*/true, fmt::format("lang{}.", ++name_sets_));
        pattern_rules_ += rules.rules;
        key = seq({lit("\""), rules.root, lit("\"")});
      }
      options.push_back(seq({key, ws_, lit(":"), ws_, *value}));
    }
    if (options.empty()) return std::nullopt;
    return share(alt(options), hint + ".member");
  }

  // A JSON string, quotes included, other than each of `names`: a trie of
  // the names' code points, where each node may leave the trie by a
  // character that none of its names continues with, or end where no name
  // does.
  std::string key_other_than(const std::vector<std::string>& names, const std::string& hint) {
    if (names.empty()) return use("json-string");
    struct Node {
      std::map<uint32_t, size_t> children;
      bool name_ends = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
      size_t at = 0;
      for (const uint32_t code_point : code_points(name)) {
        if (!trie[at].children.contains(code_point)) {
          trie[at].children.emplace(code_point, trie.size());
          trie.emplace_back();
        }
        at = trie[at].children.at(code_point);
      }
      trie[at].name_ends = true;
    }
    std::function<std::string(size_t)> node = [&](size_t at) {
      std::vector<std::string> options;
      if (!trie[at].name_ends) options.push_back(lit("\""));
      std::set<uint32_t> continuing;
      for (const auto& [code_point, child] : trie[at].children) continuing.insert(code_point);
      options.push_back(seq({json_char_except(continuing), use("json-string-rest")}));
      for (const auto& [code_point, child] : trie[at].children)
        options.push_back(seq({lit(json_spelling(code_point)), node(child)}));
      return alt(options);
    };
    return define(hint + ".key", seq({lit("\""), node(0)}));
  }

  // One character of a JSON string's content, as dump() spells it, other
  // than the code points in `excluded`.
  std::string json_char_except(const std::set<uint32_t>& excluded) {
    if (excluded.empty()) return use("json-char");
    const auto escaped = [](uint32_t c) { return c < 0x20 || c == '"' || c == '\\'; };
    std::string raw = R"([^"\\\x00-\x1f)";
    for (const uint32_t c : excluded)
      if (!escaped(c)) raw += c <= 0xFFFF ? fmt::format("\\u{:04X}", c) : fmt::format("\\U{:08X}", c);
    std::vector<std::string> options{raw + "]"};
    if (std::none_of(excluded.begin(), excluded.end(), escaped)) {
      options.push_back(use("json-escape"));
    } else {
      for (uint32_t c = 0; c < 0x80; ++c)
        if (escaped(c) && !excluded.contains(c)) options.push_back(lit(json_spelling(c)));
    }
    return alt(options);
  }

  // The members after "{" as states (k, c): listed member k is next, c
  // members are written (c says whether a comma comes first, and carries
  // minProperties / maxProperties; without maxProperties it saturates).
  // Each optional member doubles the ways in, not the text: a state reached
  // from two states is a rule.
  Translation object_members(const std::vector<ObjectMember>& listed_members,
                             const std::optional<std::string>& extra_member, int64_t min_properties,
                             std::optional<int64_t> max_properties, const std::string& path) {
    using State = std::pair<size_t, int64_t>;
    const size_t n = listed_members.size();
    const int64_t cap = max_properties ? *max_properties : std::max<int64_t>(1, min_properties);
    const auto next_count = [&](int64_t c) -> std::optional<int64_t> {
      if (max_properties) return c < *max_properties ? std::optional<int64_t>(c + 1) : std::nullopt;
      return std::min(c + 1, cap);
    };
    // live(k, c): from member k with c members written, some choice of the
    // rest ends within the bounds; from the last member back (no recursion
    // along thousands of properties). c is at most k and at most cap.
    const auto counted = static_cast<size_t>(std::min(static_cast<int64_t>(n), cap)) + 1;
    BASALT_CHECK((n + 1) * counted <= kMaxMemberStates,
                 "json schema: unsupported keyword \"{}\" at {}: counting {} listed properties up to {} makes too "
                 "large a grammar",
                 max_properties ? "maxProperties" : "minProperties", path, n, cap);
    std::vector<std::vector<bool>> live_at(n + 1);
    for (size_t k = n + 1; k-- > 0;) {
      const int64_t top = std::min(static_cast<int64_t>(k), cap);
      live_at[k].resize(static_cast<size_t>(top) + 1);
      for (int64_t c = 0; c <= top; ++c) {
        if (k == n) {
          live_at[k][static_cast<size_t>(c)] = extra_member.has_value() || c >= min_properties;
          continue;
        }
        const std::optional<int64_t> next = next_count(c);
        live_at[k][static_cast<size_t>(c)] = (next && live_at[k + 1][static_cast<size_t>(*next)]) ||
                                             (!listed_members[k].required && live_at[k + 1][static_cast<size_t>(c)]);
      }
    }
    const auto live = [&](size_t k, int64_t c) { return live_at[k][static_cast<size_t>(c)]; };
    if (!live(0, 0)) {
      return Translation::none(
          fmt::format("no object at {} has between minProperties and maxProperties of the properties it allows", path));
    }
    const auto successors = [&](size_t k, int64_t c) {
      std::vector<std::pair<State, bool>> out;  // state, whether member k is present
      const std::optional<int64_t> next = next_count(c);
      if (next && live(k + 1, *next)) out.push_back({{k + 1, *next}, true});
      if (!listed_members[k].required && live(k + 1, c)) out.push_back({{k + 1, c}, false});
      return out;
    };
    std::map<State, int> ways_in;
    std::vector<State> work{{0, 0}};
    std::set<State> seen{{0, 0}};
    while (!work.empty()) {
      const State s = work.back();
      work.pop_back();
      if (s.first == n) continue;
      for (const auto& [next, present] : successors(s.first, s.second)) {
        ++ways_in[next];
        if (seen.insert(next).second) work.push_back(next);
      }
    }
    // Each state's text, from the last member back, so that its successors'
    // are made first (no recursion along thousands of properties). A state
    // entered two ways gets a rule, as does a state that would nest inline
    // texts kMaxInlineChain deep: no expression nests deeper than that, and
    // no text is copied into more than that many others.
    const std::string hint = rule_hint(path);
    std::vector<State> order(seen.begin(), seen.end());
    std::sort(order.begin(), order.end(), [](const State& x, const State& y) { return x.first > y.first; });
    std::map<State, std::pair<std::string, int>> texts;  // its expression, the inline texts nested in it
    for (const State& s : order) {
      const auto [k, c] = s;
      std::string expr;
      int nested = 0;
      if (k == n) {
        expr = extra_member ? members(*extra_member, c == 0, std::max<int64_t>(0, min_properties - c),
                                      max_properties ? std::optional(*max_properties - c) : std::nullopt, "}", hint)
                            : close(c, "}");
      } else {
        std::vector<std::string> options;
        for (const auto& [next, present] : successors(k, c)) {
          const auto& [rest, rest_nested] = texts.at(next);
          nested = std::max(nested, rest_nested + 1);
          options.push_back(present ? seq({c == 0 ? "" : sep_, listed_members[k].text, rest}) : rest);
        }
        expr = alt(options);
      }
      if (nested >= kMaxInlineChain) {
        expr = define(fmt::format("{}.k{}c{}", hint, k, c), std::move(expr));
      } else if (ways_in[s] >= 2) {
        expr = share(std::move(expr), fmt::format("{}.k{}c{}", hint, k, c));
      }
      texts[s] = {expr, is_name(expr) ? 0 : nested};
    }
    return Translation::of(seq({lit("{"), ws_, texts.at({0, 0}).first}));
  }

  // --- allOf ---

  Merged merge(const std::vector<Part>& parts) {
    Merged merged;
    std::vector<std::string> inlining;
    for (const auto& [schema, path] : parts) merge_into(merged, *schema, path, inlining);
    return merged;
  }

  void set_false(Merged& merged, std::string reason) {
    merged.schema = false;
    merged.no_value_reason = std::move(reason);
  }

  // Adds `schema`'s assertions to `merged`; `inlining` holds the $ref
  // targets being merged in, which must not include themselves.
  void merge_into(Merged& merged, const Json& schema, const std::string& path, std::vector<std::string>& inlining) {
    const NestingGuard guard(nesting_, path);
    if (merged.schema.is_boolean()) return;
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) set_false(merged, fmt::format("the schema at {} is false", path));
      return;
    }
    BASALT_CHECK(schema.is_object(), "json schema: the schema at {} must be an object or a boolean", path);
    if (schema.contains("if") || schema.contains("then") || schema.contains("else")) {
      merge_into(merged, without_conditional(schema, path), path, inlining);
      return;
    }
    check_keywords(schema, path);
    for (const auto& [key, value] : schema.items()) {
      if (merged.schema.is_boolean()) return;
      Json& acc = merged.schema;
      const std::string at = child_path(path, key);
      if (key == "$ref") {
        const auto [pointer, target] = resolve(value, path);
        BASALT_CHECK(std::find(inlining.begin(), inlining.end(), pointer) == inlining.end(),
                     "json schema: unsupported keyword \"$ref\" at {}: \"{}\" is merged into "
                     "itself (through allOf or "
                     "keywords beside $ref)",
                     path, pointer);
        if (!merged.refs.insert(pointer).second) continue;
        inlining.push_back(pointer);
        merge_into(merged, *target, pointer, inlining);
        inlining.pop_back();
      } else if (key == "allOf") {
        BASALT_CHECK(value.is_array() && !value.empty(),
                     "json schema: keyword \"allOf\" at {} must be a non-empty array", path);
        for (size_t i = 0; i < value.size(); ++i) merge_into(merged, value[i], child_path(at, i), inlining);
      } else if (key == "anyOf" || key == "oneOf") {
        BASALT_CHECK(value.is_array() && !value.empty(), "json schema: keyword \"{}\" at {} must be a non-empty array",
                     key, path);
        Json branches = value;
        if (key == "oneOf") {
          // Proven exclusive here, on the keywords beside it (the branches
          // the translation would find empty are not known yet), or
          // rewritten to be, it is an anyOf from now on.
          Json base = Json::object();
          for (const auto& [other, other_value] : schema.items())
            if (other != key && is_assertion(other)) base[other] = other_value;
          const OneOfPlan plan = one_of_plan(base, value, path);
          std::vector<size_t> live;
          for (size_t i = 0; i < plan.branches.size(); ++i)
            if (plan.branches[i].types) live.push_back(i);
          if (overlapping(plan, live)) branches = exclusive_branches(base, value, plan, live, path);
          if (plan.kept != kAnyType &&
              !restrict_types(acc, plan.kept & (acc.contains("type") ? type_set(acc["type"], at) : kAnyType))) {
            set_false(merged,
                      fmt::format("every value the schema at {} allows matches two branches of its oneOf", path));
            return;
          }
        }
        add_alternatives(acc, branches, key, path);
      } else if (key == "type") {
        const uint8_t common = type_set(value, at) & (acc.contains("type") ? type_set(acc["type"], at) : kAnyType);
        if (!common) {
          set_false(merged, fmt::format("the types that allOf combines at {} have none in common", path));
          return;
        }
        acc["type"] = type_json(common);
      } else if (key == "enum" || key == "const") {
        BASALT_CHECK(key == "const" || value.is_array(), "json schema: keyword \"enum\" at {} must be an array", path);
        const Json values = key == "const" ? Json::array({value}) : value;
        if (!acc.contains("enum")) {
          acc["enum"] = values;
        } else {
          Json kept = Json::array();
          for (const Json& v : acc["enum"])
            if (std::any_of(values.begin(), values.end(), [&](const Json& w) { return json_equal(v, w); }))
              kept.push_back(v);
          acc["enum"] = kept;
        }
      } else if (key == "minLength" || key == "minItems" || key == "minProperties") {
        const int64_t n = read_count(value, key, path);
        if (!acc.contains(key) || acc[key].get<int64_t>() < n) acc[key] = n;
      } else if (key == "maxLength" || key == "maxItems" || key == "maxProperties") {
        const int64_t n = read_count(value, key, path);
        if (!acc.contains(key) || acc[key].get<int64_t>() > n) acc[key] = n;
      } else if (key == "dependencies" || key == "dependentRequired" || key == "dependentSchemas") {
        merge_dependencies(acc, key, value, at);
      } else if (key == "not") {
        // not A and not B is not (A or B): values are taken away by both.
        acc[key] = acc.contains(key) ? Json::object({{"anyOf", Json::array({acc[key], value})}}) : value;
      } else if (key == "propertyNames") {
        // Both limits hold: names_of reads an allOf of them.
        acc[key] = acc.contains(key) ? Json::object({{"allOf", Json::array({acc[key], value})}}) : value;
      } else if (key == "uniqueItems") {
        if (value == true) acc[key] = true;
      } else if (key == "pattern" || key == "format" || key == "multipleOf") {
        BASALT_CHECK(!acc.contains(key) || acc[key] == value,
                     "json schema: unsupported keyword \"{}\" at {}: allOf cannot combine two "
                     "different values of {}",
                     key, path, key);
        acc[key] = value;
      }
      // The rest: annotations, $defs, and the keyword
      // groups merged below, whose members depend on each other.
    }
    if (merged.schema.is_boolean()) return;
    merge_bounds(merged.schema, schema, path);
    merge_object_keywords(merged.schema, schema, path);
    merge_array_keywords(merged.schema, schema, path);
  }

  // Both schemas' dependencies hold: for each trigger, the names both
  // require, and the schemas both bring. Draft 7's dependencies are a
  // name's dependentRequired (an array) or dependentSchemas (a schema).
  static void merge_dependencies(Json& acc, const std::string& key, const Json& value, const std::string& path) {
    BASALT_CHECK(value.is_object(), "json schema: keyword \"{}\" at {} must be an object", key, path);
    for (const auto& [trigger, dependent] : value.items()) {
      const bool names = key == "dependentRequired" || (key == "dependencies" && dependent.is_array());
      if (names) {
        BASALT_CHECK(dependent.is_array() &&
                         std::all_of(dependent.begin(), dependent.end(), [](const Json& n) { return n.is_string(); }),
                     "json schema: keyword \"{}\" at {} must map names to arrays of names", key, path);
        Json& united = acc["dependentRequired"][trigger];
        if (united.is_null()) united = Json::array();
        for (const Json& name : dependent)
          if (std::find(united.begin(), united.end(), name) == united.end()) united.push_back(name);
      } else {
        BASALT_CHECK(dependent.is_object() || dependent.is_boolean(),
                     "json schema: keyword \"{}\" at {} must map names to schemas", key, path);
        Json& both = acc["dependentSchemas"][trigger];
        both = both.is_null() ? dependent : conjoin(both, dependent);
      }
    }
  }

  void add_alternatives(Json& acc, const Json& branches, const std::string& keyword, const std::string& path) {
    BASALT_CHECK(branches.is_array() && !branches.empty(),
                 "json schema: keyword \"{}\" at {} must be a non-empty array", keyword, path);
    if (!acc.contains("anyOf")) {
      acc["anyOf"] = branches;
      return;
    }
    Json product = Json::array();
    for (const Json& x : acc["anyOf"])
      for (const Json& y : branches) product.push_back(conjoin(x, y));
    BASALT_CHECK(product.size() <= kMaxAlternatives,
                 "json schema: unsupported keyword \"{}\" at {}: combined with the other "
                 "anyOf/oneOf lists of its "
                 "allOf it makes {} alternatives (at most {})",
                 keyword, path, product.size(), kMaxAlternatives);
    acc["anyOf"] = product;
  }

  // Bounds in their numeric form (draft 4's boolean exclusives rewritten),
  // the tighter of each kept.
  static void merge_bounds(Json& acc, const Json& schema, const std::string& path) {
    const auto put = [&](const char* key, const Json& value, bool keep_larger) {
      BASALT_CHECK(value.is_number(), "json schema: keyword \"{}\" at {} must be a number", key, path);
      if (!acc.contains(key) || (keep_larger ? number_less(acc[key], value) : number_less(value, acc[key])))
        acc[key] = value;
    };
    for (const bool lower : {true, false}) {
      const char* inclusive = lower ? "minimum" : "maximum";
      const char* exclusive = lower ? "exclusiveMinimum" : "exclusiveMaximum";
      const Json* bound = member(schema, inclusive);
      const Json* strict = member(schema, exclusive);
      if (strict && strict->is_boolean()) {
        if (bound) put(*strict == true ? exclusive : inclusive, *bound, lower);
      } else {
        if (bound) put(inclusive, *bound, lower);
        if (strict) put(exclusive, *strict, lower);
      }
    }
  }

  // Each property's schema in each branch is its own entry in properties,
  // or else the branch's additionalProperties: the merged property takes
  // both, and so does the merged additionalProperties.
  static void merge_object_keywords(Json& acc, const Json& schema, const std::string& path) {
    if (const Json* list = member(schema, "required")) {
      BASALT_CHECK(list->is_array(), "json schema: keyword \"required\" at {} must be an array of strings", path);
      Json& united = acc["required"];
      if (united.is_null()) united = Json::array();
      for (const Json& name : *list)
        if (std::find(united.begin(), united.end(), name) == united.end()) united.push_back(name);
    }
    const Json* properties = member(schema, "properties");
    const Json* additional = member(schema, "additionalProperties");
    merge_pattern_properties(acc, schema, path);
    if (!properties && !additional) return;
    BASALT_CHECK(!properties || properties->is_object(), "json schema: keyword \"properties\" at {} must be an object",
                 path);
    const Json mine = acc.value("properties", Json::object());
    const Json my_additional = acc.value("additionalProperties", Json(true));
    const Json theirs = properties ? *properties : Json::object();
    const Json their_additional = additional ? *additional : Json(true);
    Json combined = Json::object();
    for (const auto& [name, property] : mine.items())
      combined[name] = conjoin(property, theirs.contains(name) ? theirs.at(name) : their_additional);
    for (const auto& [name, property] : theirs.items())
      if (!mine.contains(name)) combined[name] = conjoin(my_additional, property);
    acc["properties"] = combined;
    const Json rest = conjoin(my_additional, their_additional);
    if (is_true_schema(rest)) {
      acc.erase("additionalProperties");
    } else {
      acc["additionalProperties"] = rest;
    }
  }

  // patternProperties are merged only where the properties beside them stay
  // exact: one side has them, and the other has no properties,
  // additionalProperties or patternProperties, or only properties that are
  // false (no such member, whatever a pattern says: the absent dependency
  // triggers). Otherwise a property of one side would have to be matched
  // against the other's patterns, which is refused.
  static void merge_pattern_properties(Json& acc, const Json& schema, const std::string& path) {
    // An empty patternProperties says nothing (Github_ultra/o12653.json).
    const auto has_patterns = [](const Json& s) {
      const Json* p = member(s, "patternProperties");
      return p && !(p->is_object() && p->empty());
    };
    if (!has_patterns(acc)) acc.erase("patternProperties");
    const Json* patterns = has_patterns(schema) ? member(schema, "patternProperties") : nullptr;
    if (!patterns && !acc.contains("patternProperties")) return;
    // A side closed to the names it lists (additionalProperties false, no
    // patterns of its own) meets the other's patterns on those names alone:
    // each listed name takes the schema of every pattern that matches it,
    // and the patterns have no other name to apply to (Github_hard/o13457:
    // an xAPI agent's listed names, met with mbox's patternProperties).
    // Exact where the patterned side says nothing of further names.
    const auto closed = [&](const Json& s) {
      const Json* additional = member(s, "additionalProperties");
      const Json* listed = member(s, "properties");
      return additional && *additional == false && !has_patterns(s) && (!listed || listed->is_object());
    };
    const auto says_nothing_further = [](const Json& s) {
      const Json* additional = member(s, "additionalProperties");
      return !additional || *additional == true;
    };
    // Each name of `names` takes, in `into`'s properties, the schema of
    // every pattern of `patterns` it matches.
    const auto meet_on_names = [&](Json& into, const Json& names, const Json& patterns) {
      BASALT_CHECK(patterns.is_object(), "json schema: keyword \"patternProperties\" at {} must be an object", path);
      for (const auto& [name, unused] : names.items()) {
        for (const auto& [pattern, pattern_schema] : patterns.items()) {
          bool matches = false;
          try {
            matches = RegexLanguage::of_pattern(pattern, RegexMode::kSearch).contains(name);
          } catch (const Error& e) {
            fail("json schema: keyword \"patternProperties\" at {}: {}", path, e.what());
          }
          if (!matches) continue;
          Json& property = into["properties"][name];
          property = property.is_null() ? pattern_schema : Json{{"allOf", Json::array({property, pattern_schema})}};
        }
      }
    };
    if (patterns && closed(acc) && says_nothing_further(schema)) {
      if (acc.contains("properties")) meet_on_names(acc, acc.at("properties"), *patterns);
      return;
    }
    if (!patterns && closed(schema) && says_nothing_further(acc)) {
      // The other way round: the patterns met so far, on this side's names.
      const Json mine = acc.at("patternProperties");
      acc.erase("patternProperties");
      if (const Json* listed = member(schema, "properties")) meet_on_names(acc, *listed, mine);
      return;
    }
    const auto only_false_properties = [&](const Json& s) {
      if (s.contains("additionalProperties") || has_patterns(s)) return false;
      if (!s.contains("properties")) return true;
      const Json& properties = s.at("properties");
      return properties.is_object() && std::all_of(properties.begin(), properties.end(),
                                                   [](const Json& p) { return p.is_boolean() && !p.get<bool>(); });
    };
    BASALT_CHECK(patterns ? only_false_properties(acc) : only_false_properties(schema),
                 "json schema: unsupported keyword \"patternProperties\" at {}: allOf cannot combine patternProperties "
                 "with the properties, additionalProperties or patternProperties of another schema",
                 path);
    if (patterns) {
      BASALT_CHECK(patterns->is_object(), "json schema: keyword \"patternProperties\" at {} must be an object", path);
      acc["patternProperties"] = *patterns;
    }
  }

  // Item by item the same way: position i is prefix[i], or else the rest.
  static void merge_array_keywords(Json& acc, const Json& schema, const std::string& path) {
    const Json* items = member(schema, "items");
    const Json* prefix_items = member(schema, "prefixItems");
    if (!items && !prefix_items) return;
    Json their_prefix = Json::array();
    Json their_rest = true;
    if (items && items->is_array()) {
      their_prefix = *items;
      if (const Json* additional = member(schema, "additionalItems")) their_rest = *additional;
    } else {
      if (prefix_items) {
        BASALT_CHECK(prefix_items->is_array(), "json schema: keyword \"prefixItems\" at {} must be an array", path);
        their_prefix = *prefix_items;
      }
      if (items) their_rest = *items;
    }
    const Json my_prefix = acc.value("prefixItems", Json::array());
    const Json my_rest = acc.value("items", Json(true));
    Json combined = Json::array();
    for (size_t i = 0; i < std::max(my_prefix.size(), their_prefix.size()); ++i) {
      combined.push_back(conjoin(i < my_prefix.size() ? my_prefix[i] : my_rest,
                                 i < their_prefix.size() ? their_prefix[i] : their_rest));
    }
    if (!combined.empty()) acc["prefixItems"] = combined;
    const Json rest = conjoin(my_rest, their_rest);
    if (is_true_schema(rest)) {
      acc.erase("items");
    } else {
      acc["items"] = rest;
    }
  }

  const Json& document_;
  const std::string rule_prefix_;
  std::string document_id_;
  std::string ws_;   // the whitespace rule between tokens, "" in compact mode
  std::string sep_;  // between two members
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> names_;
  std::unordered_map<std::string, int> next_suffix_;
  int nesting_ = 0;  // see NestingGuard  // per rule-name hint, from 2
  std::set<std::string> defined_;
  std::map<std::string, std::string> chunks_;
  std::map<std::string, std::string> patterns_;      // pattern -> its root rule
  std::map<std::string, Grammar> pattern_grammars_;  // pattern -> its language, to match values against
  std::map<std::string, RegexLanguage> name_languages_;  // a patternProperties pattern -> the names it matches
  size_t name_sets_ = 0;  // rule prefixes for the languages RegexLanguage writes
  std::string pattern_rules_;
  std::map<std::string, Target> targets_;
  std::vector<Owner> owners_;
  // Targets each target refers to before writing any text (at its depth).
  std::map<std::string, std::set<std::string>> before_text_;
  int depth_ = 0;
  size_t merged_schemas_ = 0;
  size_t summary_steps_ = 0;
  // The document is a draft 4 to 7 schema, whose $ref ignores what is beside it.
  bool siblings_of_ref_ignored_ = false;
};

template <typename Action>
std::string translating(Action&& action) {
  try {
    return action();
  } catch (const nlohmann::json::exception& e) {
    fail("json schema: {}", e.what());
  }
}

}  // namespace

std::string json_schema_to_ebnf(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  return translating([&] { return Translator(schema, options).document_grammar(); });
}

std::string json_object_ebnf(const JsonSchemaOptions& options) {
  static const Json kNoDocument;
  return translating([&] { return Translator(kNoDocument, options).any_object_grammar(); });
}

}  // namespace basalt
