// JSON Schema to EBNF: for each feature a schema, the instances its grammar
// must accept (written in the one spelling the grammar fixes: dump(), with
// object members in the schema's property order) and the texts it must
// reject (invalid instances, and valid JSON spelled otherwise); then the
// keywords and schemas the translation refuses, each named with its path.
#include "grammar/json_schema.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "grammar/matcher.h"
#include "testing/error_test_util.h"

namespace basalt {
namespace {

using basalt::testing::error_of;
using nlohmann::ordered_json;
using Texts = std::vector<std::string>;

// The schema a local $ref names (the tests' refs are plain JSON pointers).
const ordered_json& resolved(const ordered_json& schema, const ordered_json& root) {
  const ordered_json* s = &schema;
  while (s->is_object() && s->contains("$ref"))
    s = &root.at(ordered_json::json_pointer(s->at("$ref").get<std::string>().substr(1)));
  return *s;
}

// `value` as the grammar spells it: dump(), each object's members in the
// order its schema lists properties, then the others in the value's order.
std::string canonical(const ordered_json& value, const ordered_json& schema, const ordered_json& root) {
  static const ordered_json kAny = true;
  const ordered_json& s = resolved(schema, root);
  const auto keyword = [&](const char* key) -> const ordered_json& {
    return s.is_object() && s.contains(key) ? s.at(key) : kAny;
  };
  if (value.is_object()) {
    const ordered_json& properties = keyword("properties");
    std::vector<std::string> written;
    std::string out = "{";
    const auto add = [&](const std::string& key) {
      const bool listed = properties.is_object() && properties.contains(key);
      if (!written.empty()) out += ",";
      out += ordered_json(key).dump();
      out += ":";
      out += canonical(value.at(key), listed ? properties.at(key) : keyword("additionalProperties"), root);
      written.push_back(key);
    };
    if (properties.is_object()) {
      for (const auto& [key, property] : properties.items())
        if (value.contains(key)) add(key);
    }
    for (const auto& [key, member] : value.items())
      if (std::find(written.begin(), written.end(), key) == written.end()) add(key);
    return out + "}";
  }
  if (value.is_array()) {
    const ordered_json& items = keyword("items");
    const ordered_json& prefix = items.is_array() ? items : keyword("prefixItems");
    const ordered_json& rest = items.is_array() ? keyword("additionalItems") : items;
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) {
      const bool in_prefix = prefix.is_array() && i < prefix.size();
      if (i > 0) out += ",";
      out += canonical(value[i], in_prefix ? prefix[i] : rest, root);
    }
    return out + "]";
  }
  return value.dump();
}

// A schema's grammar, and what it accepts.
class SchemaGrammar {
 public:
  explicit SchemaGrammar(const std::string& schema, JsonSchemaOptions options = {})
      : schema_(ordered_json::parse(schema)),
        ebnf_(json_schema_to_ebnf(schema_, options)),
        grammar_(parse_ebnf(ebnf_)) {}

  bool matches(const std::string& text) const { return grammar_matches(grammar_, text); }
  const std::string& ebnf() const { return ebnf_; }

  // Each JSON value, spelled canonically, must be accepted.
  void expect_values(const Texts& values) const {
    for (const std::string& value : values) {
      const std::string text = canonical(ordered_json::parse(value), schema_, schema_);
      EXPECT_TRUE(matches(text)) << "should accept " << text << "\nfor " << schema_.dump() << "\n" << ebnf_;
    }
  }
  void expect_accepts(const Texts& texts) const {
    for (const std::string& text : texts)
      EXPECT_TRUE(matches(text)) << "should accept " << text << "\nfor " << schema_.dump() << "\n" << ebnf_;
  }
  void expect_rejects(const Texts& texts) const {
    for (const std::string& text : texts)
      EXPECT_FALSE(matches(text)) << "should reject " << text << "\nfor " << schema_.dump() << "\n" << ebnf_;
  }

 private:
  ordered_json schema_;
  std::string ebnf_;
  Grammar grammar_;
};

// For sweeps over many texts: compiled once.
class CompiledSchema {
 public:
  explicit CompiledSchema(const std::string& schema)
      : ebnf_(json_schema_to_ebnf(ordered_json::parse(schema))), grammar_(compile_grammar(parse_ebnf(ebnf_))) {}
  bool matches(const std::string& text) const {
    GrammarMatcher matcher(grammar_);
    return matcher.accept_bytes(text) && matcher.can_end();
  }
  const std::string& ebnf() const { return ebnf_; }

 private:
  std::string ebnf_;
  std::shared_ptr<const CompiledGrammar> grammar_;
};

std::string schema_error(const std::string& schema, JsonSchemaOptions options = {}) {
  return error_of([&] { json_schema_to_ebnf(ordered_json::parse(schema), options); });
}

std::string quoted(const std::string& s) { return ordered_json(s).dump(); }

// --- Types ----------------------------------------------------------------------

TEST(JsonSchemaTypes, Scalars) {
  const SchemaGrammar null_schema(R"({"type": "null"})");
  null_schema.expect_accepts({"null"});
  null_schema.expect_rejects({"nul", "\"null\"", "0", "", "null "});

  const SchemaGrammar boolean(R"({"type": "boolean"})");
  boolean.expect_accepts({"true", "false"});
  boolean.expect_rejects({"True", "1", "null"});

  const SchemaGrammar integer(R"({"type": "integer"})");
  integer.expect_accepts({"0", "-1", "7", "1234567890123456789012345678901234567890"});
  integer.expect_rejects({"-0", "01", "1.0", "1e3", "+1", "", "-", "1 "});

  const SchemaGrammar number(R"({"type": "number"})");
  number.expect_accepts({"0", "-0.5", "1.5e10", "1E+2", "-1e-7", "12.340", "-0", "3"});
  number.expect_rejects({"01", ".5", "1.", "+1", "1e", "0x10", "NaN", "-", "1.5e"});

  const SchemaGrammar string(R"({"type": "string"})");
  string.expect_accepts({"\"\"", "\"abc\""});
  string.expect_rejects({"abc", "'abc'", "\"abc", "\"a\"b\""});
}

TEST(JsonSchemaTypes, TypeListsAndNoType) {
  const SchemaGrammar nullable(R"({"type": ["string", "null"]})");
  nullable.expect_accepts({"\"a\"", "null"});
  nullable.expect_rejects({"1", "true", "[]"});

  const SchemaGrammar numbers(R"({"type": ["integer", "number"]})");
  numbers.expect_accepts({"1", "1.5"});

  // No type: every type, each under the keywords that apply to it.
  const SchemaGrammar any(R"({"description": "anything"})");
  any.expect_values({"null", "true", "-1.5e3", "\"x\"", R"([1, {"a": []}])", R"({"a": {"b": null}})"});
  any.expect_rejects({"", "nul", "[1,]", "{\"a\"}"});
  const SchemaGrammar long_strings(R"({"minLength": 2})");
  long_strings.expect_accepts({"\"ab\"", "1", "{}", "[]", "null"});
  long_strings.expect_rejects({"\"a\""});
}

TEST(JsonSchemaTypes, BooleanSchemas) {
  const SchemaGrammar any("true");
  any.expect_values({"null", "false", "0", "\"s\"", "[[]]", R"({"k": [1, 2, {"x": "y"}]})"});
  EXPECT_CONTAINS(schema_error("false"), "#");
  EXPECT_CONTAINS(schema_error("false"), "no value satisfies");

  // A property whose schema is false may only be absent.
  const SchemaGrammar forbidden(
      R"({"type": "object", "properties": {"a": false, "b": true}, "additionalProperties": false})");
  forbidden.expect_accepts({"{}", R"({"b":1})"});
  forbidden.expect_rejects({R"({"a":1})", R"({"a":1,"b":1})"});
  EXPECT_CONTAINS(schema_error(R"({"type": "object", "properties": {"a": false}, "required": ["a"]})"),
                  "required property \"a\"");

  const SchemaGrammar no_items(R"({"type": "array", "items": false})");
  no_items.expect_accepts({"[]"});
  no_items.expect_rejects({"[1]", "[null]"});
}

// --- Strings --------------------------------------------------------------------

TEST(JsonSchemaStrings, EscapesAsDumpWritesThem) {
  const SchemaGrammar s(R"({"type": "string"})");
  Texts values;
  for (int c = 0; c < 0x20; ++c) values.push_back(quoted(std::string("a") + static_cast<char>(c) + "b"));
  values.push_back(quoted("quote \" backslash \\ slash / del \x7f"));
  values.push_back(quoted("\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
  s.expect_accepts(values);
  EXPECT_TRUE(s.matches(R"("\u0001\u001f\b\f\n\r\t\"\\")"));
  s.expect_rejects({
      R"("\/")",            // dump() leaves / raw
      R"("\u0041")",        // and A
      R"("\u000a")",        // writes \n
      R"("\u001F")",        // lowercase hex
      R"("\u00e9")",        // raw UTF-8
      R"("\ud83d\ude00")",  // raw UTF-8
      "\"\x01\"",           // control characters are escaped
      "\"\n\"",
      R"("\x41")",
      R"("\a")",
      "\"\xC3\"",  // a cut UTF-8 sequence
      R"("abc)",
  });
}

TEST(JsonSchemaStrings, LengthCountsCodePointsAndEscapes) {
  const SchemaGrammar s(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  s.expect_accepts({quoted("ab"), quoted("abc"), quoted("\xC3\xA9\xE2\x82\xAC"), quoted("a\n"), quoted("\x01\x02"),
                    quoted("\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80"), quoted("\"\\")});
  s.expect_rejects(
      {quoted("a"), quoted("abcd"), quoted(""), quoted("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z"), quoted("\n")});

  const SchemaGrammar empty(R"({"type": "string", "maxLength": 0})");
  empty.expect_accepts({"\"\""});
  empty.expect_rejects({"\"a\""});
}

TEST(JsonSchemaStrings, LongLengthBoundsAreExact) {
  // Bounds past the repetition chunk (256) are built from chunk rules.
  const SchemaGrammar s(R"({"type": "string", "minLength": 300, "maxLength": 600})");
  for (const size_t n : {300, 301, 511, 512, 513, 555, 599, 600})
    EXPECT_TRUE(s.matches(quoted(std::string(n, 'x')))) << n;
  for (const size_t n : {0, 255, 256, 299, 601, 700}) EXPECT_FALSE(s.matches(quoted(std::string(n, 'x')))) << n;

  // Up to 32 runs of 32 characters, each run its own rule with the closing
  // quote (chars_then_quote): every count at and around a run's edge.
  const SchemaGrammar runs(R"({"type": "string", "minLength": 3, "maxLength": 200})");
  for (const size_t n : {3, 4, 31, 32, 33, 63, 64, 65, 96, 199, 200})
    EXPECT_TRUE(runs.matches(quoted(std::string(n, 'x')))) << n;
  for (const size_t n : {0, 2, 201, 224}) EXPECT_FALSE(runs.matches(quoted(std::string(n, 'x')))) << n;
  std::string escapes;
  for (int i = 0; i < 100; ++i) escapes += i % 2 ? "\n" : "\xC3\xA9";  // an escaped newline, then é
  EXPECT_TRUE(runs.matches(quoted(escapes + std::string(100, 'z'))));
  EXPECT_FALSE(runs.matches(quoted(escapes + std::string(101, 'z'))));

  const SchemaGrammar huge(R"({"type": "string", "maxLength": 2147483647})");
  EXPECT_TRUE(huge.matches(quoted(std::string(70000, 'y'))));
  const SchemaGrammar at_least(R"({"type": "string", "minLength": 70000})");
  EXPECT_TRUE(at_least.matches(quoted(std::string(70000, 'y'))));
  EXPECT_TRUE(at_least.matches(quoted(std::string(70001, 'y'))));
  EXPECT_FALSE(at_least.matches(quoted(std::string(69999, 'y'))));
  EXPECT_CONTAINS(schema_error(R"({"type": "string", "minLength": 3, "maxLength": 2})"), "minLength 3");
  EXPECT_CONTAINS(schema_error(R"({"type": "string", "maxLength": -1})"), "\"maxLength\" at #");
}

TEST(JsonSchemaStrings, Pattern) {
  const SchemaGrammar anchored(R"({"type": "string", "pattern": "^[a-z]+\\d$"})");
  anchored.expect_accepts({"\"abc1\"", "\"z9\""});
  anchored.expect_rejects({"\"abc\"", "\"1\"", "\"Abc1\"", "\"abc12\""});

  // Unanchored: the match may be anywhere.
  const SchemaGrammar search(R"({"type": "string", "pattern": "b+"})");
  search.expect_accepts({"\"abc\"", "\"bbb\"", quoted("x\"b\n")});
  search.expect_rejects({"\"xyz\"", "\"\""});

  // The pattern is over the string's value, the grammar over its escaped text.
  const SchemaGrammar quote(R"({"type": "string", "pattern": "^a\"b$"})");
  quote.expect_accepts({quoted("a\"b")});
  quote.expect_rejects({"\"ab\"", "\"a\\u0022b\""});

  // Two patterns in one schema get rules of their own.
  const SchemaGrammar two(
      R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x+$"},
                              "b": {"type": "string", "pattern": "^y+$"}}, "required": ["a", "b"]})");
  two.expect_accepts({R"({"a":"xx","b":"y"})"});
  two.expect_rejects({R"({"a":"y","b":"y"})"});

  EXPECT_CONTAINS(schema_error(R"j({"properties": {"p": {"pattern": "(?<=a)"}}})j"), "#/properties/p");
  // A lookahead constrains the rest of the string.
  const SchemaGrammar look(R"({"type": "string", "pattern": "^(?!.*--)[a-z-]+$"})");
  look.expect_accepts({R"("a-b")"});
  look.expect_rejects({R"("a--b")", R"("")"});
}

TEST(JsonSchemaStrings, PatternWithLengthBounds) {
  // The pattern's strings of the bounded lengths (code points, not bytes).
  const SchemaGrammar bounded(R"({"type": "string", "pattern": "^[a-z\u00e9]+$", "minLength": 2, "maxLength": 3})");
  bounded.expect_accepts({"\"ab\"", "\"abc\"", quoted("\xC3\xA9\xC3\xA9\xC3\xA9")});
  bounded.expect_rejects({"\"a\"", "\"abcd\"", "\"a1\"", quoted("\xC3\xA9")});
  // Unanchored: the bounds count the whole string, not the match.
  const SchemaGrammar search(R"({"type": "string", "pattern": "x", "maxLength": 3})");
  search.expect_accepts({"\"x\"", "\"axb\"", quoted("\"x\n")});
  search.expect_rejects({"\"abcx\"", "\"ab\""});
  const SchemaGrammar at_least(R"({"type": "string", "pattern": "^a", "minLength": 3})");
  at_least.expect_accepts({"\"abc\"", "\"abcdefgh\""});
  at_least.expect_rejects({"\"ab\"", "\"bbc\""});
  // No string has both: a required member can then have no value.
  EXPECT_CONTAINS(schema_error(R"({"type": "object", "properties": {"p": {"type": "string", "pattern": "^a{5}$",
                                   "maxLength": 3}}, "required": ["p"]})"),
                  "no string at #/properties/p meets its pattern, length bounds and not together");
  // Bounds past what one automaton may hold are kept at run time by a
  // bounded rule (grammar/bounded_string.h), whose grammar alone is the
  // pattern; a minLength that large is refused by name.
  const SchemaGrammar long_bound(R"({"type": "string", "pattern": "^a", "maxLength": 100000})");
  EXPECT_NE(long_bound.ebnf().find(std::string(kBoundedRulePrefix) + "100000.."), std::string::npos) << long_bound.ebnf();
  long_bound.expect_accepts({"\"a\"", "\"abc\""});
  long_bound.expect_rejects({"\"b\"", "\"\""});
  EXPECT_CONTAINS(schema_error(R"({"type": "string", "pattern": "^a", "minLength": 100000})"),
                  R"(unsupported keyword "minLength" at #: regex: length bound 100000)");
  // A pattern every string matches says nothing: long bounds stay usable
  // (Github_ultra/o12409.json).
  const SchemaGrammar any_text(R"({"type": "string", "maxLength": 4096, "pattern": "([0-9a-zA-Z]+)?"})");
  any_text.expect_accepts({"\"\"", "\"a b\"", "\"" + std::string(4096, 'x') + "\""});
  any_text.expect_rejects({"\"" + std::string(4097, 'x') + "\""});
}

// --- Formats --------------------------------------------------------------------

void expect_format(const std::string& format, const Texts& valid, const Texts& invalid) {
  SCOPED_TRACE(format);
  const SchemaGrammar s(R"({"type": "string", "format": ")" + format + "\"}");
  Texts valid_texts, invalid_texts;
  for (const std::string& v : valid) valid_texts.push_back(quoted(v));
  for (const std::string& v : invalid) invalid_texts.push_back(quoted(v));
  s.expect_accepts(valid_texts);
  s.expect_rejects(invalid_texts);
}

TEST(JsonSchemaFormats, DateAndTime) {
  expect_format("date",
                {"2024-02-29", "2000-02-29", "2023-02-28", "2024-12-31", "2024-04-30", "0000-02-29", "1999-01-01"},
                {"2023-02-29", "1900-02-29", "2024-04-31", "2024-1-01", "2024-13-01", "2024-00-10", "2024-01-00",
                 "2024-01-32", "24-01-01", "2024-01-01T", "2024/01/01"});
  expect_format(
      "time", {"23:59:59Z", "00:00:00+05:30", "12:34:56.789-08:00", "23:59:60Z", "23:59:60.5+00:00", "10:00:00z"},
      {"24:00:00Z", "12:60:00Z", "12:00:00", "12:00:60Z", "1:00:00Z", "12:00:00+24:00", "12:00:00+05", "12:00:00.Z"});
  expect_format("date-time", {"2024-01-02T03:04:05Z", "2024-01-02t03:04:05.5+01:00", "2024-02-29T23:59:60-00:00"},
                {"2024-01-02 03:04:05Z", "2024-01-02T03:04Z", "2024-01-02", "2023-02-29T00:00:00Z"});
  // Google's API Discovery formats: UTC only; seconds with an "s".
  expect_format("google-datetime", {"2024-01-02T03:04:05Z", "2024-01-02T03:04:05.123Z"},
                {"2024-01-02T03:04:05+01:00", "2024-01-02t03:04:05Z", "2023-02-29T00:00:00Z", "2024-01-02"});
  expect_format("google-duration", {"3.5s", "-1s", "0.000000001s"}, {"3.5", "1.0000000001s", "s", "1m"});
  expect_format("google-fieldmask", {"", "name", "user.displayName,photo", "a_b.c2"},
                {",", "a,", "a..b", "1a", "a b", ".a"});
}

TEST(JsonSchemaFormats, Addresses) {
  // The form every validator takes (Ajv's refuses the RFC's one-label
  // domains, quoted local parts and address literals): those are not written.
  expect_format("email", {"a@b.c", "first.last+tag@example.com", "o'brien@example.org", "x@a-b.co.uk"},
                {"a@", "@b", "a..b@c.d", ".a@b.c", "a.@b.c", "a@-b.com", "a b@c.d", "a@b@c.d", "\"a\"b\"@c.d",
                 "a@b_c.d", "x@localhost", "\"john doe\"@example.com", "u@[127.0.0.1]", "u@[IPv6:::1]"});
  expect_format("uuid", {"123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000"},
                {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400",
                 "g23e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456-4266141740000"});
  expect_format("ipv4", {"0.0.0.0", "255.255.255.255", "192.168.1.1", "10.0.99.249"},
                {"256.1.1.1", "01.1.1.1", "1.1.1", "1.1.1.1.1", "1.1.1.", "a.b.c.d"});
  expect_format(
      "ipv6",
      {"::", "::1", "1::", "2001:db8::ff00:42:8329", "1:2:3:4:5:6:7:8", "::ffff:192.168.0.1", "fe80::1:2",
       "1:2:3:4:5:6:7::", "ABCD:ef01::"},
      {"1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", ":1", "1:", "::ffff:256.1.1.1", "1:2:3:4:5:6:7", "g::", "::1%eth0"});
  expect_format("hostname",
                {"example.com", "a", "xn--bcher-kva.example", "a-b.c", "123.example", std::string(63, 'a') + ".com"},
                {"-a.com", "a-.com", "a..b", "a_b.com", std::string(64, 'a') + ".com", "", "example.com.", ".com"});
}

TEST(JsonSchemaFormats, Uri) {
  expect_format("uri",
                {"https://example.com/path?q=1#frag", "mailto:a@b.c", "urn:isbn:0451450523", "file:///etc/hosts",
                 "http://[::1]:8080/", "http://user:pw@host:80/a%20b", "tag:example.com,2024:x", "a:"},
                {"//example.com", "http://exa mple.com", "1http://x", "http://x/%zz", "no-colon", "/relative",
                 "http://x/\"", "http://x/<y>"});
}

TEST(JsonSchemaFormats, UriReferenceDurationAndPointers) {
  expect_format("uri-reference", {"https://example.com/a?b#c", "//example.com/x", "/abs/path", "rel/path?q", "#frag",
                                  "", "a%20b", "../x"},
                {"a:b:c d", "\\x", "rel path", "#a#b", "%zz"});
  expect_format("duration", {"P4DT12H30M5S", "P1Y", "P2W", "PT1M", "P1M2D", "PT36H", "P0D"},
                {"P", "PT", "P1D2H", "P1W2D", "1D", "P1.5D", "PT1H1D", "p1d"});
  expect_format("json-pointer", {"", "/", "/foo/0", "/a~1b", "/m~0n", "/ \"q\"", "//"},
                {"foo", "/~2", "/a~", "#/a"});
  expect_format("relative-json-pointer", {"0", "1/a", "2#", "10/x/y", "0/"}, {"", "/a", "01", "-1/a", "1##", "#"});
}

TEST(JsonSchemaFormats, OpenApiFormats) {
  // url is uri by another name.
  expect_format("url", {"https://example.com/a?b#c", "urn:x:y"}, {"example.com", "/path", "http://x/ y"});
  // byte: RFC 4648 base64 with padding, the padding's bits zero.
  expect_format("byte", {"", "QQ==", "QUI=", "QUJD", "QUJDRA==", "+/+/", "AAAAAA==", "aGVsbG8gd29ybGQ="},
                {"Q", "QQ", "QQ=", "QUJ", "QUJDR", "QR==", "QUJ=", "QQ==QQ==", "Q===", "QUJD=", "QU-D", "QU_D",
                 "QUJD\n", "QUJ D"});
  // password and binary constrain no text; their length bounds apply.
  expect_format("password", {"", "x", "\"\u00e9\n"}, {});
  const SchemaGrammar secret(R"({"type": "string", "format": "binary", "minLength": 2})");
  secret.expect_accepts({"\"ab\""});
  secret.expect_rejects({"\"a\"", "1"});
  const SchemaGrammar patterned(R"({"type": "string", "format": "password", "pattern": "^a"})");
  patterned.expect_accepts({"\"ab\""});
  patterned.expect_rejects({"\"b\""});
  // regex: a subset of ECMA-262's syntax that compiles with the u flag.
  expect_format("regex", {"", "a|b", "^[a-z_]+$", "(?:ab)*?c{2,}", "\\d+\\.\\d{3}", "[^\\]\\-]", "\\bx\\B", "(a|)",
                          "\"q\"", "\\\\"},
                {"(", ")", "a**", "[z-a]", "a{3,2}", "*a", "\\", "\\-", "a{", "]", "\\q", "^*"});
  // Google's API Discovery: 64-bit integers as strings of their digits.
  expect_format("int64", {"0", "-9223372036854775808", "9223372036854775807", "42"},
                {"9223372036854775808", "-9223372036854775809", "01", "1.5", "", "+1"});
  expect_format("uint64", {"0", "18446744073709551615"}, {"-1", "18446744073709551616"});
  expect_format("uint32", {"4294967295"}, {"4294967296", "-1"});
  EXPECT_CONTAINS(schema_error(R"({"type": "string", "format": "int64", "maxLength": 3})"),
                  "length bounds and format together");
  // Formats nobody defines stay refused.
  for (const std::string name : {"country-code", "", "datetime", "path", "color"}) {
    EXPECT_CONTAINS(schema_error(R"({"type": "string", "format": ")" + name + "\"}"),
                    "format \"" + name + "\" is not supported");
  }
}

TEST(JsonSchemaFormats, RegularFormatsMeetPatternsAndLengthBounds) {
  // Github_medium/o1053.json: a date and a pattern that admits partial dates.
  const SchemaGrammar from(R"({"type": "string", "format": "date", "pattern": "^([0-9]{4})(-([0-9]{2}))?(-([0-9]{2}))?$"})");
  from.expect_accepts({R"("2024-02-29")", R"("1999-12-31")"});
  from.expect_rejects({R"("2023-02-29")", R"("2024-02")", R"("2024-13-01")"});
  // Length bounds in code points, leap years and all.
  const SchemaGrammar short_time(R"({"type": "string", "format": "date-time", "maxLength": 20})");
  short_time.expect_accepts({R"("2024-02-29T23:59:59Z")"});
  short_time.expect_rejects({R"("2024-02-29T23:59:59.5Z")", R"("2023-02-29T23:59:59Z")"});
  // A format whose rules recurse (a regex's groups): met without the
  // recursive alternatives.
  const SchemaGrammar anchored(R"({"type": "string", "format": "regex", "pattern": "^\\^"})");
  anchored.expect_accepts({R"("^[a-z]+$")"});
  anchored.expect_rejects({"\"^(a)\"", "\"a\"", "\"^(\""});
  const SchemaGrammar uuid(R"({"type": "string", "format": "uuid", "pattern": "^0"})");
  uuid.expect_accepts({R"("0a4b1c2d-0000-4000-8000-000000000000")"});
  uuid.expect_rejects({R"("1a4b1c2d-0000-4000-8000-000000000000")", R"("0")"});
}

TEST(JsonSchemaFormats, UnknownFormatsAndCombinationsAreRefused) {
  const std::string e = schema_error(R"({"properties": {"c": {"type": "string", "format": "color"}}})");
  EXPECT_CONTAINS(e, "\"format\"");
  EXPECT_CONTAINS(e, "#/properties/c");
  EXPECT_CONTAINS(e, "color");
  // A format whose strings meet a maxLength in too large an automaton (a
  // URI's rules by 255 lengths) is written with a bounded rule; formats that
  // are no automaton here (integers as strings) stay refused beside length
  // bounds and not.
  const SchemaGrammar uri(R"({"type": "string", "format": "uri", "maxLength": 255})");
  EXPECT_NE(uri.ebnf().find(std::string(kBoundedRulePrefix) + "255.."), std::string::npos) << uri.ebnf();
  uri.expect_accepts({"\"https://example.com/a?b=c\""});
  uri.expect_rejects({"\"not a uri\""});
  EXPECT_CONTAINS(schema_error(R"({"type": "string", "format": "int64", "not": {"const": "1"}})"),
                  R"(unsupported keyword "format" at #: format and not together)");
  // An email beside a pattern: both met.
  const SchemaGrammar email(R"({"type": "string", "format": "email", "pattern": "@example\\.org$"})");
  email.expect_accepts({R"("ada@example.org")"});
  email.expect_rejects({R"("ada@example.com")", R"("example.org")"});
  // format applies to strings only; it does not make other types fail.
  const SchemaGrammar either(R"({"type": ["string", "integer"], "format": "date"})");
  either.expect_accepts({"\"2024-01-01\"", "5"});
  either.expect_rejects({"\"x\""});
}

// --- Integers -------------------------------------------------------------------

struct IntegerCase {
  std::string schema;
  int64_t lo, hi;  // the range the schema allows within the sweep
};

TEST(JsonSchemaIntegers, RangesAreExactDecimalLanguages) {
  constexpr int64_t kFrom = -1600, kTo = 1600;
  const std::vector<IntegerCase> cases = {
      {R"({"type": "integer", "minimum": 0, "maximum": 0})", 0, 0},
      {R"({"type": "integer", "minimum": -5, "maximum": 5})", -5, 5},
      {R"({"type": "integer", "minimum": 7, "maximum": 123})", 7, 123},
      {R"({"type": "integer", "minimum": -123, "maximum": -7})", -123, -7},
      {R"({"type": "integer", "minimum": 1, "maximum": 1000})", 1, 1000},
      {R"({"type": "integer", "minimum": -1000, "maximum": -1})", -1000, -1},
      {R"({"type": "integer", "minimum": 10, "maximum": 99})", 10, 99},
      {R"({"type": "integer", "minimum": 99, "maximum": 1234})", 99, 1234},
      {R"({"type": "integer", "minimum": -999, "maximum": 1000})", -999, 1000},
      {R"({"type": "integer", "minimum": 190, "maximum": 1209})", 190, 1209},
      {R"({"type": "integer", "minimum": 0})", 0, kTo},
      {R"({"type": "integer", "minimum": 5})", 5, kTo},
      {R"({"type": "integer", "minimum": 123})", 123, kTo},
      {R"({"type": "integer", "minimum": -17})", -17, kTo},
      {R"({"type": "integer", "maximum": -3})", kFrom, -3},
      {R"({"type": "integer", "maximum": 0})", kFrom, 0},
      {R"({"type": "integer", "maximum": 250})", kFrom, 250},
      {R"({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 10})", 4, 9},
      {R"({"type": "integer", "minimum": 3, "exclusiveMinimum": true, "maximum": 10, "exclusiveMaximum": true})", 4, 9},
      {R"({"type": "integer", "minimum": 3, "exclusiveMinimum": false, "maximum": 10})", 3, 10},
      {R"({"type": "integer", "minimum": 1.5, "maximum": 7.5})", 2, 7},
      {R"({"type": "integer", "exclusiveMinimum": -1.5, "exclusiveMaximum": 2.0})", -1, 1},
      {R"({"type": "integer", "minimum": -40, "exclusiveMinimum": -50, "maximum": 40, "exclusiveMaximum": 30})", -40,
       29},
  };
  for (const IntegerCase& c : cases) {
    SCOPED_TRACE(c.schema);
    const CompiledSchema s(c.schema);
    for (int64_t x = kFrom; x <= kTo; ++x) {
      const bool inside = x >= c.lo && x <= c.hi;
      ASSERT_EQ(s.matches(std::to_string(x)), inside) << x << "\n" << s.ebnf();
    }
    EXPECT_FALSE(s.matches("-0"));
    EXPECT_FALSE(s.matches("00"));
    EXPECT_FALSE(s.matches("+1"));
  }
}

TEST(JsonSchemaIntegers, RandomRangesAgreeWithComparison) {
  std::mt19937_64 random(20240601);
  const auto draw = [&] {
    const int digits = static_cast<int>(random() % 12);
    int64_t x = static_cast<int64_t>(random() % 1000000000000ULL);
    for (int i = digits; i < 12; ++i) x /= 10;
    return random() % 2 ? -x : x;
  };
  for (int round = 0; round < 30; ++round) {
    int64_t lo = draw(), hi = draw();
    if (lo > hi) std::swap(lo, hi);
    const std::string schema = fmt::format(R"({{"type": "integer", "minimum": {}, "maximum": {}}})", lo, hi);
    SCOPED_TRACE(schema);
    const CompiledSchema s(schema);
    std::vector<int64_t> probes = {lo, hi, lo - 1, hi + 1, 0, -1, 1};
    for (int i = 0; i < 60; ++i) probes.push_back(draw());
    for (int i = 0; i < 20; ++i) probes.push_back(lo + static_cast<int64_t>(random() % 50) - 25);
    for (int i = 0; i < 20; ++i) probes.push_back(hi + static_cast<int64_t>(random() % 50) - 25);
    for (const int64_t x : probes) ASSERT_EQ(s.matches(std::to_string(x)), x >= lo && x <= hi) << x << "\n" << s.ebnf();
  }
}

TEST(JsonSchemaIntegers, BoundsOfAnySize) {
  const SchemaGrammar above_u64(R"({"type": "integer", "minimum": 18446744073709551615})");
  above_u64.expect_accepts({"18446744073709551615", "18446744073709551616", "100000000000000000000"});
  above_u64.expect_rejects({"18446744073709551614", "0", "-18446744073709551616"});

  const SchemaGrammar below_i64(R"({"type": "integer", "maximum": -9223372036854775808})");
  below_i64.expect_accepts({"-9223372036854775808", "-9223372036854775809", "-100000000000000000000"});
  below_i64.expect_rejects({"-9223372036854775807", "0"});

  const SchemaGrammar float_bounds(R"({"type": "integer", "exclusiveMinimum": 1e20, "maximum": 1e21})");
  float_bounds.expect_accepts({"100000000000000000001", "1000000000000000000000"});
  float_bounds.expect_rejects({"100000000000000000000", "1000000000000000000001"});
}

TEST(JsonSchemaIntegers, NumberFormats) {
  // OpenAPI's int32 and int64 (Kubernetes' schemas use them) are integers in
  // their range, also where "number" is the type; float and double are any
  // number; a format for strings says nothing of numbers.
  const SchemaGrammar int32(R"({"type": "integer", "format": "int32", "minimum": -5})");
  int32.expect_accepts({"-5", "0", "2147483647"});
  int32.expect_rejects({"-6", "2147483648", "7194924196343124193131962741311331133164681417236"});
  const SchemaGrammar int64(R"({"type": "number", "format": "int64"})");
  int64.expect_accepts({"-9223372036854775808", "9223372036854775807", "0"});
  int64.expect_rejects({"9223372036854775808", "-9223372036854775809", "1.5", "1e3"});
  const SchemaGrammar floating(R"({"type": "number", "format": "double"})");
  floating.expect_accepts({"1.5", "-2e10", "3"});
  const SchemaGrammar date(R"({"type": ["integer", "null"], "format": "date"})");
  date.expect_accepts({"12", "null"});
  EXPECT_CONTAINS(schema_error(R"({"properties": {"p": {"type": "number", "format": "percent"}}})"),
                  R"(unsupported keyword "format" at #/properties/p: format "percent" is not supported)");
}

TEST(JsonSchemaIntegers, EmptyRanges) {
  EXPECT_CONTAINS(schema_error(R"({"type": "integer", "minimum": 5, "maximum": 4})"), "empty");
  EXPECT_CONTAINS(schema_error(R"({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4})"), "empty");
  EXPECT_CONTAINS(schema_error(R"({"type": "integer", "minimum": 0.5, "maximum": 0.7})"), "empty");
  // An empty integer range leaves the other types of the schema.
  const SchemaGrammar rest(R"({"type": ["integer", "null"], "minimum": 5, "maximum": 4})");
  rest.expect_accepts({"null"});
  rest.expect_rejects({"4", "5"});
  EXPECT_CONTAINS(schema_error(R"({"type": "integer", "minimum": "1"})"), "\"minimum\" at #");
}

// --- Numbers --------------------------------------------------------------------

// A number in thousandths written with `decimals` fraction digits (0: as an
// integer, which it must be).
std::string thousandths_text(int64_t x, int decimals) {
  const int64_t magnitude = x < 0 ? -x : x;
  std::string out = (x < 0 ? "-" : "") + std::to_string(magnitude / 1000);
  if (decimals == 0) return out;
  std::string fraction = fmt::format("{:03d}", magnitude % 1000);
  fraction.resize(static_cast<size_t>(decimals), '0');
  return out + "." + fraction;
}

struct NumberCase {
  std::string schema;
  std::optional<int64_t> lo, hi;  // in thousandths
  bool lo_strict = false, hi_strict = false;
};

TEST(JsonSchemaNumbers, BoundsAreExactOverDecimalText) {
  const std::vector<NumberCase> cases = {
      {R"({"type": "number", "minimum": 1.1})", 1100, std::nullopt},
      {R"({"type": "number", "exclusiveMinimum": 1.1})", 1100, std::nullopt, true},
      {R"({"type": "number", "maximum": 3.0})", std::nullopt, 3000},
      {R"({"type": "number", "exclusiveMaximum": 3})", std::nullopt, 3000, false, true},
      {R"({"type": "number", "minimum": -2, "maximum": 2.5})", -2000, 2500},
      {R"({"type": "number", "minimum": -2.05, "exclusiveMaximum": -0.5})", -2050, -500, false, true},
      {R"({"type": "number", "exclusiveMinimum": -0.125, "exclusiveMaximum": 0.125})", -125, 125, true, true},
      {R"({"type": "number", "exclusiveMinimum": 0})", 0, std::nullopt, true},
      {R"({"type": "number", "minimum": 0, "maximum": 0})", 0, 0},
      {R"({"type": "number", "exclusiveMaximum": 0})", std::nullopt, 0, false, true},
      {R"({"type": "number", "minimum": 0.25, "maximum": 0.75})", 250, 750},
      {R"({"type": "number", "minimum": 1.005, "maximum": 1.007})", 1005, 1007},
      {R"({"type": "number", "minimum": 9.99, "maximum": 10.01})", 9990, 10010},
      {R"({"type": "number", "minimum": -90, "maximum": 90})", -90000, 90000},
      {R"({"minimum": -1.5, "exclusiveMinimum": true, "maximum": 1.5, "exclusiveMaximum": true})", -1500, 1500, true,
       true},
      {R"({"minimum": 2, "exclusiveMinimum": 2, "maximum": 2.5, "exclusiveMaximum": 2.75})", 2000, 2500, true},
      {R"({"type": ["number", "null"], "minimum": 1e-3, "maximum": 1.2e1})", 1, 12000},
  };
  for (const NumberCase& c : cases) {
    SCOPED_TRACE(c.schema);
    const CompiledSchema s(c.schema);
    for (int64_t x = -100000; x <= 100000; x += x > -3000 && x < 12000 ? 1 : 997) {
      const bool inside =
          (!c.lo || (c.lo_strict ? x > *c.lo : x >= *c.lo)) && (!c.hi || (c.hi_strict ? x < *c.hi : x <= *c.hi));
      for (const int decimals : {0, 1, 2, 3, 4, 9}) {
        if (decimals == 0 && x % 1000 != 0) continue;
        if (decimals > 0 && decimals < 3 && x % 1000 % (decimals == 1 ? 100 : 10) != 0) continue;
        const std::string text = thousandths_text(x, decimals);
        ASSERT_EQ(s.matches(text), inside) << text << "\n" << s.ebnf();
      }
    }
    // Never "-0" (zero is written without the sign), never an exponent,
    // never a leading zero.
    for (const std::string text :
         {"-0", "-0.0", "-0.000", "1e0", "1E+1", "0.5e1", "-1e-1", "01", "00.5", ".5", "5.", "+1"})
      EXPECT_FALSE(s.matches(text)) << text;
  }
}

TEST(JsonSchemaNumbers, BoundsOfAnySizeAndLongFractions) {
  const SchemaGrammar tiny(R"({"type": "number", "exclusiveMinimum": 0.000123})");
  tiny.expect_accepts({"0.0001230000001", "0.000124", "1", "123456789012345678901234567890"});
  tiny.expect_rejects({"0.000123", "0.0001230000", "0.0001229999999999", "0", "-1"});
  const SchemaGrammar large(R"({"type": "number", "minimum": -1e30, "maximum": 1.5e20})");
  large.expect_accepts(
      {"-1000000000000000000000000000000", "150000000000000000000", "149999999999999999999.99999", "0"});
  large.expect_rejects(
      {"-1000000000000000000000000000000.0001", "150000000000000000000.00001", "150000000000000000001"});
  // Latitude, as real schemas bound it.
  const SchemaGrammar latitude(R"({"type": "number", "minimum": -90, "maximum": 90})");
  latitude.expect_accepts({"-90", "-90.000", "-89.999999", "0", "0.0", "45.5", "90"});
  latitude.expect_rejects({"-90.0000001", "90.1", "91", "-91", "-0"});
  // Unspecified type: the bounds apply to numbers only.
  const SchemaGrammar any(R"({"minimum": 0.5})");
  any.expect_accepts({"0.5", "\"x\"", "null", "[]"});
  any.expect_rejects({"0.4999", "-1", "0"});
  // Empty ranges.
  EXPECT_CONTAINS(schema_error(R"({"type": "number", "minimum": 1.5, "exclusiveMaximum": 1.5})"), "empty");
  EXPECT_CONTAINS(schema_error(R"({"type": "number", "minimum": 2.5, "maximum": 2.25})"), "empty");
  const SchemaGrammar rest(R"({"type": ["number", "string"], "exclusiveMinimum": 1, "maximum": 1})");
  rest.expect_accepts({"\"a\""});
  rest.expect_rejects({"1", "1.0"});
  EXPECT_CONTAINS(schema_error(R"({"type": "number", "exclusiveMaximum": "1"})"), "\"exclusiveMaximum\" at #");
}

// --- Objects --------------------------------------------------------------------

TEST(JsonSchemaObjects, OptionalPropertiesInEveryCombination) {
  const SchemaGrammar s(
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
      "c": {"type": "boolean"}, "d": {"type": "null"}}, "required": ["b"], "additionalProperties": false})");
  const std::vector<std::pair<std::string, std::string>> optional = {{"a", "1"}, {"c", "true"}, {"d", "null"}};
  for (int mask = 0; mask < 8; ++mask) {
    ordered_json value = ordered_json::object();
    for (int i = 0; i < 3; ++i)
      if (mask & (1 << i))
        value[optional[static_cast<size_t>(i)].first] = ordered_json::parse(optional[static_cast<size_t>(i)].second);
    value["b"] = "x";
    s.expect_values({value.dump()});
  }
  s.expect_rejects({
      "{}",
      R"({"a":1})",          // b is required
      R"({"b":"x","a":1})",  // a comes first
      R"({"b":"x","b":"x"})",
      R"({"b":"x",})",  // commas
      R"({,"b":"x"})",
      R"({"a":1,,"b":"x"})",
      R"({"a":1"b":"x"})",
      R"({"b":"x","e":1})",  // additionalProperties is false
      R"({"b":1})",
      R"({ "b":"x"})",
  });

  const SchemaGrammar all_optional(
      R"({"type": "object", "properties": {"p": {}, "q": {}, "r": {}, "s": {}},
                                          "additionalProperties": false})");
  for (int mask = 0; mask < 16; ++mask) {
    ordered_json value = ordered_json::object();
    for (int i = 0; i < 4; ++i)
      if (mask & (1 << i)) value[std::string(1, static_cast<char>('p' + i))] = i;
    all_optional.expect_values({value.dump()});
  }
  all_optional.expect_rejects({R"({"q":1,"p":0})", R"({"s":1,"r":0})", "[]"});
}

TEST(JsonSchemaObjects, ManyOptionalPropertiesStaySmall) {
  ordered_json schema = {{"type", "object"}, {"additionalProperties", false}};
  for (int i = 0; i < 60; ++i) schema["properties"][fmt::format("p{}", i)] = {{"type", "integer"}};
  const std::string ebnf = json_schema_to_ebnf(schema);
  EXPECT_LT(ebnf.size(), 40000u) << ebnf;
  const Grammar grammar = parse_ebnf(ebnf);
  EXPECT_TRUE(grammar_matches(grammar, R"({"p0":1,"p17":2,"p59":3})"));
  EXPECT_TRUE(grammar_matches(grammar, R"({"p59":3})"));
  EXPECT_TRUE(grammar_matches(grammar, "{}"));
  EXPECT_FALSE(grammar_matches(grammar, R"({"p17":2,"p0":1})"));
  EXPECT_FALSE(grammar_matches(grammar, R"({"p0":1,"p0":1})"));
}

TEST(JsonSchemaObjects, AdditionalProperties) {
  // Absent: any further members after the listed ones.
  const SchemaGrammar open(R"({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})");
  open.expect_values({R"({"a": "x"})", R"({"a": "x", "zz": [1, {"q": null}], "a2": -1})"});
  open.expect_rejects({R"({"zz":1,"a":"x"})", R"({"a":"x","zz":})", R"({"a":"x","zz":1,})"});

  const SchemaGrammar typed(
      R"({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}})");
  typed.expect_values({R"({"a": "x", "k": 1, "m": 2})", R"({"k": 1})", "{}"});
  typed.expect_rejects({R"({"a":"x","k":"s"})", R"({"k":null})"});

  const SchemaGrammar closed(
      R"({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false})");
  closed.expect_values({R"({"a": "x"})", "{}"});
  closed.expect_rejects({R"({"a":"x","k":1})", R"({"k":1})"});

  // Keys are written as dump() writes them.
  const SchemaGrammar keys(
      R"({"properties": {"a\"b": {"type": "integer"}, "\u00e9\n": {"type": "integer"}},
          "required": ["a\"b", "\u00e9\n"]})");
  keys.expect_accepts({"{\"a\\\"b\":1,\"\xC3\xA9\\n\":2}"});
  keys.expect_rejects({"{\"a\\u0022b\":1,\"\xC3\xA9\\n\":2}"});
}

TEST(JsonSchemaObjects, AdditionalKeysAreNotTheListedNames) {
  // Otherwise {"a":"x"} would pass as an additional property.
  const SchemaGrammar s(
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "string"},
                                                              "\n\u00e9": false}})");
  s.expect_accepts({R"({"a":1})", R"({"ab":"x","abc":1})", R"({"b":1})", R"({"":1})", R"({"a\n":1,"A":2})",
                    R"({"aa":1})", R"({"\n":1})", "{\"\\n\xC3\xA8\":1}", "{\"\\n\xC3\xA9\xC3\xA9\":1}",
                    R"({"a":1,"b":2,"c":3})"});
  s.expect_rejects({R"({"a":"x"})", R"({"ab":1})", R"({"a":1,"a":2})", R"({"x":1,"a":1})",
                    R"({"a":1,"ab":"x","ab":"y"})", "{\"\\n\xC3\xA9\":1}"});
}

TEST(JsonSchemaObjects, RequiredNamesOutsideProperties) {
  const SchemaGrammar s(R"({"properties": {"a": {"type": "integer"}}, "required": ["b"],
                            "additionalProperties": {"type": "string"}})");
  s.expect_accepts({R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"a":1,"b":"x","c":"y"})"});
  s.expect_rejects({R"({"a":1})", R"({"b":1})", "{}"});
  EXPECT_CONTAINS(
      schema_error(R"({"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": false})"),
      "required property \"b\"");
}

TEST(JsonSchemaObjects, MinAndMaxProperties) {
  const SchemaGrammar closed(
      R"({"properties": {"a": {}, "b": {}, "c": {}}, "additionalProperties": false,
                                 "minProperties": 1, "maxProperties": 2})");
  closed.expect_accepts({R"({"a":1})", R"({"c":1})", R"({"a":1,"b":2})", R"({"a":1,"c":2})", R"({"b":1,"c":2})"});
  closed.expect_rejects({"{}", R"({"a":1,"b":2,"c":3})"});

  const SchemaGrammar open(
      R"({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1,
                               "maxProperties": 2})");
  open.expect_accepts({R"({"x":1})", R"({"a":1,"x":2})", R"({"x":1,"y":2})", R"({"a":1,"b":2})"});
  open.expect_rejects({"{}", R"({"a":1,"b":2,"x":3})", R"({"x":1,"y":2,"z":3})"});

  const SchemaGrammar many(R"({"type": "object", "minProperties": 3})");
  many.expect_accepts({R"({"a":1,"b":2,"c":3})", R"({"a":1,"b":2,"c":3,"d":4})"});
  many.expect_rejects({R"({"a":1,"b":2})", "{}"});

  EXPECT_CONTAINS(schema_error(R"({"type": "object", "properties": {"a": {}}, "additionalProperties": false,
                                   "minProperties": 2})"),
                  "minProperties");
  EXPECT_CONTAINS(schema_error(R"({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"],
                                   "maxProperties": 1})"),
                  "maxProperties");
}

TEST(JsonSchemaObjects, PatternProperties) {
  // One pattern, additionalProperties false: further names are exactly the
  // pattern's (unanchored: a match anywhere), and their values its schema.
  const SchemaGrammar closed(R"({"type": "object", "properties": {"id": {"type": "string"}},
                                 "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": false})");
  closed.expect_accepts({"{}", R"({"id":"a"})", R"({"id":"a","x-b":1,"x-":2})", R"({"x-c":3})"});
  closed.expect_rejects({R"({"y":1})", R"({"x-b":"s"})", R"({"id":"a","ax-":1})", R"({"id":1})", R"({"X-b":1})"});
  const SchemaGrammar search(R"({"patternProperties": {"[0-9]": {"type": "null"}}, "additionalProperties": false})");
  search.expect_accepts({R"({"a1b":null,"2":null})"});
  search.expect_rejects({R"({"ab":null})", R"({"a1":1})", "{\"\":null}"});
  // A listed property the pattern matches satisfies both schemas.
  const SchemaGrammar both(R"({"properties": {"n1": {"type": "integer"}}, "patternProperties": {"n*": {"minimum": 5}},
                               "additionalProperties": false})");
  both.expect_accepts({R"({"n1":5})", R"({"n1":7,"n2":5.5})", R"({"x":"s"})"});
  both.expect_rejects({R"({"n1":4})", R"({"n1":5.5})", R"({"n2":4})", R"({"n1":5,"n1":6})"});
  // A pattern that matches every name leaves the listed names out of the
  // further members.
  const SchemaGrammar every(R"({"properties": {"a": {"type": "string"}}, "required": ["a"],
                                "patternProperties": {".*": {"type": ["string", "integer"]}}})");
  every.expect_accepts({R"({"a":"x"})", R"({"a":"x","b":1,"c":"y"})", R"({"a":"x","":2})"});
  every.expect_rejects({R"({"a":1})", R"({"a":"x","b":null})", R"({"a":"x","a":"y"})", R"({"b":1})"});
  // Overlapping patterns: a name both match satisfies both schemas.
  const SchemaGrammar overlap(R"({"patternProperties": {"a": {"type": "integer"}, "b": {"minimum": 3}},
                                  "additionalProperties": false})");
  overlap.expect_accepts({R"({"a":3})", R"({"b":4})", R"({"ab":3})"});
  overlap.expect_rejects({R"({"ab":2})", R"({"ab":3.5})", R"({"a":"s"})", R"({"b":2})", R"({"c":5})"});
  // Patterns with different literal prefixes are disjoint: each name takes
  // its own pattern's schema only.
  const SchemaGrammar disjoint(R"({"required": ["RSRC"], "patternProperties": {
      "^BIOS$": {"type": "string", "pattern": "-sys$"}, "^RSRC$": {"type": "string", "pattern": "-resource$"},
      "^\\.": {"type": "string"}}})");
  disjoint.expect_accepts({R"({"RSRC":"a-resource"})", R"({"RSRC":"a-resource","BIOS":"b-sys",".x":"c"})"});
  disjoint.expect_rejects(
      {R"({"RSRC":"a-sys"})", R"({"RSRC":"r-resource","BIOS":"b-resource"})", "{}", R"({"RSRC":"a-resource",".x":1})"});
  // A name no pattern matches takes additionalProperties, required or not.
  const SchemaGrammar rest(R"({"required": ["z"], "patternProperties": {"^[0-9]+$": {"type": "integer"}},
                               "additionalProperties": {"type": "string"}})");
  rest.expect_accepts({R"({"z":"s"})", R"({"z":"s","12":3})", R"({"z":"s","1a":"t"})"});
  rest.expect_rejects({R"({"z":1})", R"({"z":"s","12":"x"})", R"({"z":"s","1a":3})", R"({"12":3})"});
  // Without additionalProperties, names no pattern matches take any value.
  const SchemaGrammar open(R"({"patternProperties": {"^a": {"type": "integer"}, "b$": {"type": "string"}}})");
  open.expect_accepts({R"({"a":1})", R"({"c":null})", R"({"xb":"s","c":[1]})", R"({"ac":1,"c":{}})"});
  // A name both match must satisfy both: an integer and a string, so none.
  open.expect_rejects({R"({"a":"s"})", R"({"b":2})", R"({"ab":1})", R"({"ab":"s"})"});
  // Overlapping patterns beside additionalProperties: each name gets the
  // schemas of exactly the patterns it matches.
  const SchemaGrammar mixed(R"({"patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 10}},
                                "additionalProperties": {"type": "boolean"}})");
  mixed.expect_accepts({R"({"a":1,"b":11.5,"ab":12,"c":true})"});
  mixed.expect_rejects({R"({"ab":1})", R"({"ab":12.5})", R"({"c":1})", R"({"b":5})", R"({"a":true})"});
  // Only objects are constrained.
  const SchemaGrammar any(R"({"patternProperties": {"^a": {"type": "integer"}}})");
  any.expect_accepts({"\"s\"", "1", R"({"ab":1})"});
  any.expect_rejects({R"({"ab":"s"})"});
  // A pattern that matches a listed name: the name takes its property's
  // schema and the pattern's, the pattern's other names the pattern's alone.
  const SchemaGrammar listed(R"({"properties": {"x1": {"type": "integer"}}, "patternProperties": {"^x": {"minimum": 3}},
                                 "additionalProperties": false})");
  listed.expect_accepts({R"({"x1":3})", R"({"x1":4,"x2":3.5,"x":"s"})", R"({"xx":null})"});
  listed.expect_rejects({R"({"x1":2})", R"({"x1":3.5})", R"({"x2":1})", R"({"y":1})"});
  // Patterns the regex translation refuses, and combinations past what the
  // automata may hold, are refused by name; allOf merges patternProperties
  // only beside no other properties.
  EXPECT_CONTAINS(schema_error(R"({"properties": {"p": {"patternProperties": {"(^a)b": {}}}}})"),
                  R"(unsupported keyword "patternProperties" at #/properties/p)");
  EXPECT_CONTAINS(schema_error(R"({"patternProperties": {"^(a|b)*a(a|b){14}$": {}}})"),
                  R"(unsupported keyword "patternProperties" at #: regex: the patterns combine)");
  EXPECT_CONTAINS(schema_error(R"({"allOf": [{"patternProperties": {"^a": {}}}, {"properties": {"b": {}}}]})"),
                  R"(unsupported keyword "patternProperties" at #/allOf/1)");
  // With dependencies: the absent trigger is false beside the patterns.
  const SchemaGrammar dependent(R"({"patternProperties": {"^[a-p]$": {"type": "integer"}},
                                    "dependentRequired": {"q": ["r"]}})");
  dependent.expect_accepts({R"({"a":1})", R"({"q":1,"r":2})"});
  dependent.expect_rejects({R"({"q":1})", R"({"a":"s"})"});
}

TEST(JsonSchemaObjects, PropertyNames) {
  // Every member name, listed or further, is one propertyNames allows.
  const SchemaGrammar short_names(R"({"propertyNames": {"maxLength": 3}, "properties": {"long": {}, "ok": {}}})");
  short_names.expect_accepts({"{}", R"({"ok":1})", R"({"abc":1,"x":[]})", "1"});
  short_names.expect_rejects({R"({"long":1})", R"({"abcd":1})"});
  const SchemaGrammar pattern(R"({"propertyNames": {"pattern": "^a+$", "type": "string"},
                                  "patternProperties": {"^aa": {"type": "integer"}},
                                  "additionalProperties": {"type": "string"}})");
  pattern.expect_accepts({R"({"a":"s","aaa":1})"});
  pattern.expect_rejects({R"({"b":"s"})", R"({"aa":"s"})", R"({"a":1})"});
  const SchemaGrammar listed(R"({"propertyNames": {"enum": ["foo", "bar", 3]}, "additionalProperties": false,
                                 "properties": {"foo": {"type": "integer"}, "baz": {}}})");
  listed.expect_accepts({R"({"foo":1})", "{}"});
  listed.expect_rejects({R"({"baz":1})", R"({"bar":1})", R"({"foo":"s"})"});
  const SchemaGrammar through_ref(R"({"$defs": {"name": {"const": "id"}}, "propertyNames": {"$ref": "#/$defs/name"}})");
  through_ref.expect_accepts({R"({"id":[1]})", "{}"});
  through_ref.expect_rejects({R"({"x":1})"});
  // allOf: both limits.
  const SchemaGrammar merged(R"({"allOf": [{"propertyNames": {"pattern": "^a"}}, {"propertyNames": {"maxLength": 2}}]})");
  merged.expect_accepts({R"({"ab":1})"});
  merged.expect_rejects({R"({"abc":1})", R"({"b":1})"});
  // anyOf: either branch's names; oneOf: less those of two branches
  // (JsonSchemaStore's ansible-lint).
  const SchemaGrammar either(R"({"propertyNames": {"anyOf": [{"enum": ["x"]}, {"pattern": "^y"}]}})");
  either.expect_accepts({R"({"x":1,"yes":2})"});
  either.expect_rejects({R"({"z":1})"});
  const SchemaGrammar one(R"({"propertyNames": {"oneOf": [{"enum": ["fqcn", "yaml[x]"]}, {"pattern": "^yaml"}]}})");
  one.expect_accepts({R"({"fqcn":1,"yaml":2,"yaml[y]":3})"});
  one.expect_rejects({R"({"yaml[x]":1})", R"({"other":1})"});
  const SchemaGrammar none(R"({"propertyNames": false})");
  none.expect_accepts({"{}"});
  none.expect_rejects({R"({"a":1})"});
  EXPECT_CONTAINS(schema_error(R"({"type": "object", "propertyNames": {"maxLength": 1}, "required": ["ab"]})"),
                  "required property \"ab\" at # is not a name propertyNames allows");
  EXPECT_CONTAINS(schema_error(R"({"propertyNames": {"format": "email"}})"),
                  R"(unsupported keyword "propertyNames" at #: keyword "format" at #/propertyNames is not supported)");
}

TEST(JsonSchemaObjects, DependentRequired) {
  // A trigger among the properties, one beside them (an additional property).
  const SchemaGrammar s(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                              "c": {"type": "integer"}},
                            "dependentRequired": {"a": ["b", "c"], "z": ["a"]}})");
  s.expect_accepts({"{}", R"({"b":1})", R"({"a":1,"b":2,"c":3})", R"({"b":1,"c":2})", R"({"a":1,"b":2,"c":3,"z":4})",
                    R"({"c":1,"y":2})"});
  s.expect_rejects({R"({"a":1})", R"({"a":1,"b":2})", R"({"a":1,"c":3})", R"({"z":1})", R"({"b":1,"c":2,"z":3})",
                    R"({"a":1,"b":2,"c":3,"z":"x","z":1})"});
  // Only objects: other values pass.
  const SchemaGrammar any(R"({"dependentRequired": {"a": ["b"]}})");
  any.expect_accepts({"1", "\"a\"", "[]", "{}", R"({"b":1})", R"({"a":1,"b":2})"});
  any.expect_rejects({R"({"a":1})", R"({"x":0,"a":1})"});
  // Draft 7's dependencies, arrays both ways (each requires the other).
  const SchemaGrammar both(R"({"properties": {"cylindrical": {"type": "number"}, "axis": {"type": "number"}},
                               "additionalProperties": false,
                               "dependencies": {"cylindrical": ["axis"], "axis": ["cylindrical"]}})");
  both.expect_accepts({"{}", R"({"cylindrical":1,"axis":2})"});
  both.expect_rejects({R"({"cylindrical":1})", R"({"axis":2})"});
  // A dependency no object can meet leaves the objects without the trigger.
  const SchemaGrammar closed(R"({"properties": {"a": {}}, "additionalProperties": false,
                                 "dependentRequired": {"a": ["b"]}})");
  closed.expect_accepts({"{}"});
  closed.expect_rejects({R"({"a":1})", R"({"a":1,"b":1})"});
  // A trigger already required forks nothing; allOf unites the names.
  const SchemaGrammar merged(R"({"required": ["a"], "allOf": [{"dependentRequired": {"a": ["b"]}},
                                                               {"dependencies": {"a": ["c"]}}]})");
  merged.expect_accepts({R"({"a":1,"b":2,"c":3})"});
  merged.expect_rejects({R"({"a":1,"b":2})", R"({"a":1,"c":3})", "{}", "1"});
}

// if / then / else: the discriminator form real schemas use, a test `not`
// can negate, and booleans; then and else default to true.
TEST(JsonSchemaCombinations, IfThenElse) {
  const SchemaGrammar kind(R"({"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "x": {}, "y": {}},
                               "if": {"properties": {"kind": {"const": "a"}}},
                               "then": {"required": ["x"]}, "else": {"required": ["y"]}})");
  kind.expect_accepts({R"({"kind":"a","x":1})", R"({"kind":"b","y":1})", R"({"x":1})", R"({"kind":"a","x":1,"y":2})"});
  kind.expect_rejects({R"({"kind":"a","y":1})", R"({"kind":"b","x":1})", R"({"y":1})", "{}"});
  // Required in the if: an object without the name fails it, so takes else.
  const SchemaGrammar required(R"({"if": {"required": ["a"], "properties": {"a": {"type": "string"}}},
                                   "then": {"properties": {"b": {"type": "integer"}}},
                                   "else": {"properties": {"b": {"type": "string"}}}})");
  required.expect_accepts({R"({"a":"s","b":1})", R"({"b":"t"})", R"({"a":1,"b":"t"})", "1", "\"s\""});
  required.expect_rejects({R"({"a":"s","b":"t"})", R"({"b":1})", R"({"a":1,"b":1})"});
  // type object in the if: other values fail it.
  const SchemaGrammar typed(R"({"if": {"type": "object"}, "then": {"required": ["a"]}, "else": {"type": "integer"}})");
  typed.expect_accepts({R"({"a":1})", "3"});
  typed.expect_rejects({"{}", "\"s\"", "1.5"});
  // Without else (true) or then (true); a false if takes else alone.
  const SchemaGrammar no_else(R"({"if": {"type": "string"}, "then": {"maxLength": 2}})");
  no_else.expect_accepts({"\"ab\"", "1", "null"});
  no_else.expect_rejects({"\"abc\""});
  const SchemaGrammar never(R"({"if": false, "then": {"type": "null"}, "else": {"type": "boolean"}})");
  never.expect_accepts({"true"});
  never.expect_rejects({"null", "1"});
  // Inside allOf, merged with what is beside it.
  const SchemaGrammar merged(R"({"type": "object", "properties": {"t": {"type": "string"}, "n": {"type": "integer"}},
                                 "allOf": [{"if": {"properties": {"t": {"const": "int"}}}, "then": {"required": ["n"]},
                                            "else": {"properties": {"n": false}}}]})");
  merged.expect_accepts({R"({"t":"int","n":1})", R"({"t":"x"})", R"({"n":2})"});
  merged.expect_rejects({R"({"t":"int"})", R"({"t":"x","n":1})"});
  // Then or else without if, or an if without either, assert nothing.
  for (const char* alone : {R"({"then": false})", R"({"else": false})", R"({"if": {"minimum": 1}})"}) {
    const SchemaGrammar s(alone);
    s.expect_accepts({"1", "\"a\"", "{}"});
  }
}

TEST(JsonSchemaObjects, DependentSchemas) {
  const SchemaGrammar s(R"({"type": "object", "properties": {"kind": {"type": "string"}, "size": {}},
                            "dependentSchemas": {"kind": {"properties": {"size": {"type": "integer"}},
                                                          "required": ["size"]}}})");
  s.expect_accepts({"{}", R"({"size":"big"})", R"({"kind":"a","size":3})", R"({"size":[]})"});
  s.expect_rejects({R"({"kind":"a"})", R"({"kind":"a","size":"big"})"});
  // Draft 7's schema form, with a oneOf in the dependent schema (as real
  // schemas write a type and its formats).
  const SchemaGrammar formats(R"({"properties": {"type": {"enum": ["integer", "number"]}, "format": {}},
      "dependencies": {"format": {"oneOf": [
          {"properties": {"type": {"enum": ["integer"]}, "format": {"enum": ["int32", "int64"]}}, "required": ["format"]},
          {"properties": {"type": {"enum": ["number"]}, "format": {"enum": ["float", "double"]}}, "required": ["format"]}
      ]}}})");
  formats.expect_accepts({R"({"type":"integer"})", R"({"type":"integer","format":"int32"})",
                          R"({"type":"number","format":"double"})", R"({"format":"double"})", "{}", "3"});
  formats.expect_rejects(
      {R"({"type":"integer","format":"double"})", R"({"type":"number","format":"int64"})", R"({"format":"x"})"});
  // false: the trigger may not be present at all.
  const SchemaGrammar never(R"({"dependentSchemas": {"a": false}})");
  never.expect_accepts({"{}", R"({"b":1})"});
  never.expect_rejects({R"({"a":1})", R"({"b":1,"a":1})"});
  // Past 64 combinations of triggers, refused.
  std::string many = R"({"dependentRequired": {)";
  for (int i = 0; i < 7; ++i) many += fmt::format(R"({}"t{}": ["u{}"])", i ? ", " : "", i, i);
  EXPECT_CONTAINS(schema_error(many + "}}"), R"(unsupported keyword "dependentRequired" at #)");
  EXPECT_CONTAINS(schema_error(R"({"dependentRequired": {"a": "b"}})"), R"("dependentRequired" at #)");
  EXPECT_CONTAINS(schema_error(R"({"dependentSchemas": {"a": {"not": {"minLength": 2}}}})"), R"(unsupported keyword "not")");
}

// --- Arrays ---------------------------------------------------------------------

TEST(JsonSchemaArrays, ItemsAndBounds) {
  const SchemaGrammar s(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4})");
  s.expect_accepts({"[1,2]", "[1,2,3]", "[1,2,3,4]"});
  s.expect_rejects({"[]", "[1]", "[1,2,3,4,5]", "[\"a\",1]", "[1,,2]", "[1,2,]", "[,1,2]", "[1 2]"});

  const SchemaGrammar any(R"({"type": "array"})");
  any.expect_values({"[]", R"([1, "a", null, [[]], {"k": false}])"});

  const SchemaGrammar big(R"({"type": "array", "items": {"type": "integer"}, "minItems": 300, "maxItems": 600})");
  const auto zeros = [](size_t n) {
    std::string out = "[";
    for (size_t i = 0; i < n; ++i) out += i ? ",0" : "0";
    return out + "]";
  };
  for (const size_t n : {300, 511, 512, 513, 600}) EXPECT_TRUE(big.matches(zeros(n))) << n;
  for (const size_t n : {0, 1, 299, 601}) EXPECT_FALSE(big.matches(zeros(n))) << n;

  EXPECT_CONTAINS(schema_error(R"({"type": "array", "minItems": 3, "maxItems": 1})"), "minItems 3");
}

TEST(JsonSchemaArrays, PrefixItems) {
  const SchemaGrammar closed(R"({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})");
  closed.expect_accepts({"[]", "[\"a\"]", "[\"a\",1]"});
  closed.expect_rejects({"[\"a\",1,2]", "[1]", "[\"a\",\"b\"]"});

  const SchemaGrammar rest(
      R"({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "boolean"},
                               "minItems": 1, "maxItems": 3})");
  rest.expect_accepts({"[\"a\"]", "[\"a\",true]", "[\"a\",true,false]"});
  rest.expect_rejects({"[]", "[true]", "[\"a\",1]", "[\"a\",true,false,true]"});

  // Draft 4: items as a list, then additionalItems (any value when absent).
  const SchemaGrammar draft4(R"({"items": [{"type": "string"}], "additionalItems": {"type": "null"}})");
  draft4.expect_accepts({"[]", "[\"a\"]", "[\"a\",null,null]"});
  draft4.expect_rejects({"[\"a\",1]", "[null]"});
  const SchemaGrammar draft4_open(R"({"type": "array", "items": [{"type": "string"}]})");
  draft4_open.expect_accepts({"[\"a\",1,{}]"});

  EXPECT_CONTAINS(schema_error(R"({"type": "array", "prefixItems": [{}, {}], "items": false, "minItems": 3})"),
                  "minItems");
  EXPECT_CONTAINS(schema_error(R"({"type": "array", "prefixItems": [{}, false], "minItems": 2})"), "false");
}

// --- enum and const -------------------------------------------------------------

TEST(JsonSchemaEnum, ValuesAsDumpWritesThem) {
  const SchemaGrammar s(R"({"enum": ["red", 1, null, 2.5, {"b": 1, "a": [1, 2]}, [true], "\u00e9\"x"]})");
  s.expect_accepts({"\"red\"", "1", "null", "2.5", R"({"b":1,"a":[1,2]})", "[true]", "\"\xC3\xA9\\\"x\""});
  s.expect_rejects({"\"blue\"", "2", R"({"a":[1,2],"b":1})", R"({"b": 1,"a":[1,2]})", "[ true]", "1.0"});

  const SchemaGrammar constant(R"({"const": "x"})");
  constant.expect_accepts({"\"x\""});
  constant.expect_rejects({"\"y\"", "x"});
  const SchemaGrammar structured(R"({"const": [1, {"z": null, "a": "\n"}]})");
  structured.expect_accepts({R"([1,{"z":null,"a":"\n"}])"});
  structured.expect_rejects({"1", R"([1,{"a":"\n","z":null}])"});

  // type filters the values; const must be among enum's.
  const SchemaGrammar typed(R"({"type": "string", "enum": ["a", 1, "b"]})");
  typed.expect_accepts({"\"a\"", "\"b\""});
  typed.expect_rejects({"1"});
  const SchemaGrammar integral(R"({"type": "integer", "enum": [1.0, 1.5]})");
  integral.expect_accepts({"1.0"});
  integral.expect_rejects({"1.5", "1"});
  const SchemaGrammar both(R"({"enum": ["a", "b"], "const": "b"})");
  both.expect_accepts({"\"b\""});
  both.expect_rejects({"\"a\""});

  EXPECT_CONTAINS(schema_error(R"({"enum": []})"), "enum at # is empty");
  EXPECT_CONTAINS(schema_error(R"({"type": "integer", "enum": ["a"]})"), "allowed type");
  EXPECT_CONTAINS(schema_error(R"({"enum": ["a"], "const": "b"})"), "const");
}

// The keywords beside enum or const that a value can be checked against
// keep the values that satisfy them; each applies to its own type only.
TEST(JsonSchemaEnum, ValuesFilteredByTheKeywordsBesideThem) {
  // Github_medium/o14076.json.
  const SchemaGrammar mode(R"({"type": "string", "enum": ["HOME", "HOTSPOT", ""], "minLength": 1})");
  mode.expect_accepts({"\"HOME\"", "\"HOTSPOT\""});
  mode.expect_rejects({"\"\""});
  // Lengths in code points; other types untouched.
  const SchemaGrammar lengths(R"({"enum": ["\u00e9\u00e9", "ab", "abc", "a", 5, null], "minLength": 2,
                                  "maxLength": 2})");
  lengths.expect_accepts({"\"\xC3\xA9\xC3\xA9\"", "\"ab\"", "5", "null"});
  lengths.expect_rejects({"\"abc\"", "\"a\""});
  // pattern, searched in the value (escapes as the pattern's language reads them).
  const SchemaGrammar pattern(R"({"enum": ["a1", "ba", "x\"y", "xy", 1], "pattern": "^a|x\""})");
  pattern.expect_accepts({"\"a1\"", R"("x\"y")", "1"});
  pattern.expect_rejects({"\"ba\"", "\"xy\""});
  // Number bounds as exact decimals, draft 4's boolean exclusives too.
  const SchemaGrammar bounded(R"({"enum": [1, 2, 2.5, 3, 0.30000000000000004, "s"], "minimum": 2,
                                  "exclusiveMaximum": 3})");
  bounded.expect_accepts({"2", "2.5", "\"s\""});
  bounded.expect_rejects({"1", "3", "0.30000000000000004"});
  const SchemaGrammar draft4(R"({"enum": [0.1, 0.2], "maximum": 0.2, "exclusiveMaximum": true})");
  draft4.expect_accepts({"0.1"});
  draft4.expect_rejects({"0.2"});
  const SchemaGrammar constant(R"({"const": 5, "minimum": 5})");
  constant.expect_accepts({"5"});

  EXPECT_CONTAINS(schema_error(R"({"enum": ["a", "bb"], "minLength": 3})"), "no value satisfies");
  EXPECT_CONTAINS(schema_error(R"({"const": 5, "exclusiveMinimum": 5})"), "no value satisfies");
  // A known format, checked on each string (Github_medium/o12337.json: url).
  const SchemaGrammar format(R"({"type": "string", "format": "url",
                                 "enum": ["http://www.w3.org/2000/09/xmldsig#rsa-sha1", "not a uri"]})");
  format.expect_accepts({R"("http://www.w3.org/2000/09/xmldsig#rsa-sha1")"});
  format.expect_rejects({R"("not a uri")"});
  EXPECT_CONTAINS(schema_error(R"({"enum": ["a"], "format": "email"})"), "no value satisfies");
  EXPECT_CONTAINS(schema_error(R"({"enum": ["a"], "format": "color"})"), "format \"color\" is not supported");
  EXPECT_CONTAINS(schema_error(R"({"enum": [1], "format": "int32"})"), "beside enum or const values that are numbers");
  // Keywords of objects and arrays beside values that are neither
  // (JsonSchemaStore's accelerator: minItems beside an enum of strings).
  const SchemaGrammar others(R"({"enum": ["text", "html"], "minItems": 1, "properties": {"a": {}}, "required": ["a"]})");
  others.expect_accepts({R"("text")", R"("html")"});
  EXPECT_CONTAINS(schema_error(R"({"enum": [[1]], "minItems": 1})"), "unsupported keyword \"minItems\" at #");
  EXPECT_CONTAINS(schema_error(R"({"enum": [{}], "required": ["a"]})"), "unsupported keyword \"required\" at #");
  EXPECT_CONTAINS(schema_error(R"({"properties": {"p": {"enum": [1], "multipleOf": 2}}})"),
                  "unsupported keyword \"multipleOf\" at #/properties/p");
}

// --- anyOf, oneOf, allOf --------------------------------------------------------

TEST(JsonSchemaCombinations, AnyOfAndOneOf) {
  const SchemaGrammar any_of(R"({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]})");
  any_of.expect_accepts({"\"a\"", "0", "17"});
  any_of.expect_rejects({"-1", "null", "1.5"});

  // Keywords beside anyOf apply to every branch.
  const SchemaGrammar beside(R"({"type": "object", "properties": {"kind": {"type": "string"}},
      "anyOf": [{"required": ["kind"]}, {"properties": {"n": {"type": "integer"}}, "required": ["n"]}]})");
  beside.expect_values({R"({"kind": "x"})", R"({"n": 1})", R"({"kind": "x", "n": 1})"});
  beside.expect_rejects({"{}", R"({"n":"x"})", "\"s\""});

  // A branch that admits no value drops out.
  const SchemaGrammar dropped(R"({"anyOf": [{"type": "integer", "minimum": 5, "maximum": 1}, {"type": "null"}]})");
  dropped.expect_accepts({"null"});
  dropped.expect_rejects({"3"});
  EXPECT_CONTAINS(schema_error(R"({"anyOf": [false, {"enum": []}]})"), "#/anyOf");

  // Pydantic's Optional and discriminated union shapes.
  const SchemaGrammar optional(R"({"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "X"})");
  optional.expect_accepts({"null", "\"s\""});
  const SchemaGrammar tagged(
      R"({"$defs": {"Cat": {"properties": {"pet": {"const": "cat"}}, "required": ["pet"]},
                                           "Dog": {"properties": {"pet": {"const": "dog"}}, "required": ["pet"]}},
      "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
      "discriminator": {"propertyName": "pet"}})");
  tagged.expect_accepts({R"({"pet":"cat"})", R"({"pet":"dog","x":1})"});
  // Untyped branches: every non-object matches both, so none is valid.
  tagged.expect_rejects({R"({"pet":"cow"})", "{}", "\"cat\"", "1", "null", "[]"});
}

// --- oneOf ------------------------------------------------------------------------

// oneOf is enforced where its branches provably exclude each other: a value
// that matches two branches is invalid, and the matcher takes none.
TEST(JsonSchemaOneOf, BranchesOfDisjointTypes) {
  const CompiledSchema types(
      R"({"oneOf": [{"type": "string"}, {"type": "integer", "minimum": 0}, {"type": "null"},
                                           {"type": "array", "items": {"type": "boolean"}}]})");
  for (const std::string text : {"\"a\"", "0", "17", "null", "[]", "[true,false]"})
    EXPECT_TRUE(types.matches(text)) << text << "\n" << types.ebnf();
  for (const std::string text : {"-1", "1.5", "true", "{}", "[1]"})
    EXPECT_FALSE(types.matches(text)) << text << "\n" << types.ebnf();

  // Branches told apart by their const and enum values (and those values'
  // types); false branches, and branches the translation finds empty,
  // overlap nothing.
  const CompiledSchema values(
      R"({"oneOf": [{"enum": ["a", "b", null]}, {"const": "c"}, {"enum": [1, 2.5, [1]]},
                                            {"type": "boolean"}, false,
                                            {"type": "integer", "minimum": 5, "maximum": 1}]})");
  for (const std::string text : {"\"a\"", "\"b\"", "null", "\"c\"", "1", "2.5", "[1]", "true"})
    EXPECT_TRUE(values.matches(text)) << text << "\n" << values.ebnf();
  for (const std::string text : {"\"d\"", "2", "[]", "{}"})
    EXPECT_FALSE(values.matches(text)) << text << "\n" << values.ebnf();

  // A type that two branches admit whole is matched twice by every value of
  // it: none is valid, and the type is left out.
  const CompiledSchema whole(R"({"oneOf": [{"type": "number"}, {}]})");
  for (const std::string text : {"\"x\"", "null", "true", "{}", "[1]"})
    EXPECT_TRUE(whole.matches(text)) << text << "\n" << whole.ebnf();
  for (const std::string text : {"1", "-2.5", "0"}) EXPECT_FALSE(whole.matches(text)) << text << "\n" << whole.ebnf();
  EXPECT_CONTAINS(schema_error(R"({"oneOf": [true, true, false]})"), "no value satisfies");
  const SchemaGrammar one_true(R"({"oneOf": [true, false, false]})");
  one_true.expect_accepts({"1", "\"x\"", "{}"});
}

TEST(JsonSchemaOneOf, BranchesToldApartByARequiredProperty) {
  // The discriminator pattern: each branch requires "kind", its values
  // disjoint from the others' (typed objects, as Pydantic writes them).
  const CompiledSchema typed(R"({"$defs": {
      "A": {"type": "object", "properties": {"kind": {"const": "a"}, "n": {"type": "integer"}}, "required": ["kind"]},
      "B": {"type": "object", "properties": {"kind": {"enum": ["b", "c"]}, "s": {"type": "string"}},
            "required": ["kind", "s"]}},
      "oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]})");
  for (const std::string text :
       {R"({"kind":"a"})", R"({"kind":"a","n":1,"s":"x"})", R"({"kind":"b","s":"x"})", R"({"kind":"c","s":""})"})
    EXPECT_TRUE(typed.matches(text)) << text << "\n" << typed.ebnf();
  for (const std::string text : {"{}", R"({"kind":"d"})", R"({"kind":"b"})", R"({"n":1})", "\"a\""})
    EXPECT_FALSE(typed.matches(text)) << text << "\n" << typed.ebnf();

  // Branches without "type" (JSONSchemaBench Github_hard/o17700.json): every
  // value that is not an object matches all of them, so only objects are
  // valid, each with one branch's name.
  const CompiledSchema untyped(R"({"definitions": {
      "http": {"required": ["name", "code"], "properties": {"name": {"enum": ["httperror"]}, "code": {"type": "integer"}}},
      "other": {"required": ["name"], "properties": {"name": {"enum": ["othererror"]}, "error": {"type": "string"}}},
      "shutdown": {"required": ["name"], "properties": {"name": {"enum": ["shutdownerror"]}}}},
      "oneOf": [{"$ref": "#/definitions/http"}, {"$ref": "#/definitions/other"}, {"$ref": "#/definitions/shutdown"}]})");
  for (const std::string text : {R"({"name":"httperror","code":404})", R"({"name":"othererror","error":"x"})",
                                 R"({"name":"shutdownerror","code":"any"})"})
    EXPECT_TRUE(untyped.matches(text)) << text << "\n" << untyped.ebnf();
  for (const std::string text :
       {"1", "\"httperror\"", "null", "[]", "{}", R"({"name":"httperror"})", R"({"name":"nserror","code":1})"})
    EXPECT_FALSE(untyped.matches(text)) << text << "\n" << untyped.ebnf();

  // Keywords beside oneOf narrow every branch; a tag nested one level down.
  const SchemaGrammar beside(
      R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
      "oneOf": [{"properties": {"meta": {"type": "object", "properties": {"v": {"const": 1}}, "required": ["v"]}},
                 "required": ["meta"]},
                {"properties": {"meta": {"type": "object", "properties": {"v": {"const": 2}}, "required": ["v"]},
                                "extra": {"type": "string"}}, "required": ["meta", "extra"]}]})");
  beside.expect_values({R"({"id": 1, "meta": {"v": 1}})", R"({"id": 1, "meta": {"v": 2}, "extra": "x"})"});
  beside.expect_rejects({R"({"meta":{"v":1}})", R"({"id":1,"meta":{"v":3}})", R"({"id":1,"meta":{"v":2}})", "1"});

  // Through allOf and beside $ref (merged, then proven on the keywords
  // beside it).
  const SchemaGrammar merged(
      R"({"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}}},
      "$ref": "#/$defs/base",
      "oneOf": [{"properties": {"t": {"const": "x"}}, "required": ["t"]}, {"properties": {"t": {"const": "y"}},
                "required": ["t"]}]})");
  merged.expect_accepts({R"({"id":1,"t":"x"})", R"({"t":"y"})"});
  merged.expect_rejects({"{}", R"({"t":"z"})", "\"x\""});
}

// Branches that differ by the names they require: each is rewritten to lack
// a name of each other's, which is exact for `required` alone.
// A branch that is an anyOf of required lists requires the names they
// share (Github_hard/o12453.json); a value of two branches is left out.
TEST(JsonSchemaOneOf, BranchesToldApartByTheNamesTheirAlternativesShare) {
  const SchemaGrammar s(R"({"type": "object", "properties": {"labware": {}, "box": {}, "slot": {}, "position": {}},
      "oneOf": [{"anyOf": [{"required": ["labware", "slot"]}, {"required": ["labware", "position"]}]},
                {"anyOf": [{"required": ["box", "slot"]}, {"required": ["box", "position"]}]}]})");
  s.expect_accepts({R"({"labware":1,"slot":2})", R"({"box":1,"position":2})", R"({"labware":1,"position":2})"});
  s.expect_rejects({R"({"labware":1,"box":2,"slot":3})", R"({"labware":1})", "{}", R"({"slot":1})"});
}

TEST(JsonSchemaOneOf, BranchesToldApartByTheNamesTheyRequire) {
  // Glaiveai2K/calculate_area_0bc8b268.json: every object of the five names
  // is accepted exactly when it has the names of one branch only.
  const std::string area = R"({"type": "object", "properties": {"radius": {"type": "number"},
      "length": {"type": "number"}, "width": {"type": "number"}, "base": {"type": "number"},
      "height": {"type": "number"}},
      "oneOf": [{"required": ["radius"]}, {"required": ["length", "width"]}, {"required": ["base", "height"]}]})";
  const SchemaGrammar s(area);
  s.expect_values({R"({"radius": 1})", R"({"length": 1, "width": 2})", R"({"base": 1, "height": 2})",
                   R"({"radius": 1, "length": 2})", R"({"radius": 1, "x": 2})"});
  s.expect_rejects({"{}", R"({"length":1})", R"({"radius":1,"length":2,"width":3})",
                    R"({"radius":1,"base":1,"height":2})", R"({"radius":"x"})", "1"});
  const std::vector<std::string> names = {"radius", "length", "width", "base", "height"};
  const std::vector<std::vector<std::string>> branches = {{"radius"}, {"length", "width"}, {"base", "height"}};
  for (unsigned subset = 0; subset < 32; ++subset) {
    std::string text = "{";
    for (size_t k = 0; k < names.size(); ++k) {
      if (!(subset & (1u << k))) continue;
      text += (text.size() > 1 ? ",\"" : "\"") + names[k] + "\":1";
    }
    text += "}";
    const auto has = [&](const std::string& name) {
      return (subset & (1u << (std::find(names.begin(), names.end(), name) - names.begin()))) != 0;
    };
    const auto matched = std::count_if(branches.begin(), branches.end(), [&](const std::vector<std::string>& b) {
      return std::all_of(b.begin(), b.end(), has);
    });
    EXPECT_EQ(s.matches(text), matched == 1) << text;
  }

  // Github_medium/o11667.json's shape; untyped, no non-object is valid (each
  // matches both branches).
  const SchemaGrammar type_or_ref(R"({"oneOf": [{"required": ["type"]}, {"required": ["$ref"]}]})");
  type_or_ref.expect_accepts({R"({"type":"x"})", R"({"$ref":"#/a","format":1})"});
  type_or_ref.expect_rejects({R"({"type":"x","$ref":"#/a"})", "{}", "\"type\"", "null", "[]"});

  // A branch that requires every name another one does never matches alone.
  const SchemaGrammar superset(R"({"oneOf": [{"required": ["a"]}, {"type": "object", "required": ["a", "b"]}]})");
  superset.expect_accepts({R"({"a":1})", R"({"a":1,"c":2})"});
  superset.expect_rejects({R"({"a":1,"b":2})", R"({"b":2})", "{}"});

  // Other keywords in the branches: missing a name is the one way to fail a
  // branch that is written, so {"a": "x", "b": "y"}, valid (b is no
  // integer), is left out.
  const SchemaGrammar narrowed(R"({"type": "object", "oneOf": [
      {"required": ["a"], "properties": {"a": {"type": "string"}}},
      {"required": ["b"], "properties": {"b": {"type": "integer"}}}]})");
  narrowed.expect_accepts({R"({"a":"x"})", R"({"b":1})", R"({"a":"x","c":null})"});
  narrowed.expect_rejects({R"({"a":"x","b":1})", R"({"a":"x","b":"y"})", R"({"a":1})", "{}"});

  // Merged (beside allOf), and with keywords beside the oneOf that make one
  // absent name impossible.
  const SchemaGrammar merged(
      R"({"allOf": [{"type": "object"}, {"oneOf": [{"required": ["a"]}, {"required": ["b", "c"]}]}]})");
  merged.expect_accepts({R"({"a":1})", R"({"b":1,"c":2})", R"({"a":1,"b":2})"});
  merged.expect_rejects({R"({"a":1,"b":2,"c":3})", R"({"b":1})", "{}"});
  const SchemaGrammar beside(R"({"type": "object", "required": ["b"],
      "oneOf": [{"required": ["a"]}, {"required": ["b", "c"]}]})");
  beside.expect_accepts({R"({"b":1,"a":2})", R"({"b":1,"c":2})"});
  beside.expect_rejects({R"({"b":1,"a":2,"c":3})", R"({"b":1})", R"({"a":1})"});
}

// Branches told apart by the values of a property each lists but none
// requires: the property is required, which narrows (objects without it are
// not written).
TEST(JsonSchemaOneOf, BranchesToldApartByTheNamesTheyAllow) {
  // WashingtonPost's promo items: an open branch requires "version", which
  // the closed ones do not allow (so no value matches two): exact, as is.
  const SchemaGrammar promo(R"({"oneOf": [
      {"type": "object", "required": ["type", "version"], "properties": {"type": {"type": "string"}}},
      {"type": "object", "required": ["type", "referent"], "additionalProperties": false,
       "properties": {"type": {"enum": ["reference"]}, "referent": {"type": "integer"}}},
      {"$ref": "#/$defs/html"}],
      "$defs": {"html": {"type": "object", "required": ["type", "content"], "additionalProperties": false,
                         "properties": {"type": {"const": "raw_html"}, "content": {"type": "string"}}}}})");
  promo.expect_values({R"({"type": "x", "version": 1})", R"({"type": "reference", "referent": 1})",
                       R"({"type": "raw_html", "content": "<p>"})"});
  promo.expect_accepts({R"({"type":"reference","version":2,"referent":1})"});  // the first branch's
  promo.expect_rejects({R"({"type": "reference"})", R"({"type": "raw_html", "content": "a", "referent": 1})",
                        R"({"type": "reference", "referent": "a"})", "{}", "1"});

  // Github_trivial/o10020.json (ForgetRequest): two closed branches with no
  // name in common overlap only in {}, which is invalid and left out.
  const SchemaGrammar forget(R"({"type": "object", "oneOf": [
      {"additionalProperties": false, "properties": {"key": {"type": "string", "maxLength": 12}}},
      {"additionalProperties": false, "properties": {"keys": {"type": "array", "items": {"type": "string"}}}}]})");
  forget.expect_values({R"({"key": "a"})", R"({"keys": ["a", "b"]})", R"({"keys": []})"});
  forget.expect_rejects({"{}", R"({"key": "a", "keys": []})", R"({"other": 1})", R"({"key": 1})", "[]"});

  // Arrays whose items are proven apart overlap only in [] (Github_ultra's
  // scale domain).
  const SchemaGrammar domain(R"({"oneOf": [{"type": "array", "items": {"type": "number"}},
                                           {"type": "array", "items": {"type": "string"}}]})");
  domain.expect_values({"[1, 2.5]", R"(["a"])"});
  domain.expect_rejects({"[]", R"([1, "a"])", "{}", "1"});

  // A name both allow leaves the overlap unproven: still refused.
  EXPECT_CONTAINS(schema_error(R"({"type": "object", "oneOf": [
      {"additionalProperties": false, "properties": {"a": {}, "b": {}}},
      {"additionalProperties": false, "properties": {"b": {}, "c": {}}}]})"),
                  "may overlap");
}

TEST(JsonSchemaOneOf, StringBranchesToldApartByTheirPatterns) {
  // JsonSchemaStore's ansible templated-integer-or-percent: no string
  // matches both patterns (their automata's intersection is empty).
  const SchemaGrammar percent(R"({"oneOf": [{"type": "integer"},
      {"type": "string", "pattern": "^\\d+\\.?\\d*%?$"},
      {"type": "string", "pattern": "^\\{\\{.*\\}\\}$"}]})");
  percent.expect_values({"5", R"("12%")", R"("1.5")", R"("{{ x }}")"});
  percent.expect_rejects({R"("x")", "1.5", R"("{{1}")"});
  // An enum's values outside the other branch's pattern.
  const SchemaGrammar listed(R"({"oneOf": [{"enum": ["ab", "cd"]}, {"type": "string", "pattern": "^x"}]})");
  listed.expect_values({R"("ab")", R"("xyz")"});
  listed.expect_rejects({R"("abc")", R"("yx")"});
  // Patterns that meet ("APPROVER" and "SIGNER" searched: "APPROVERSIGNER"):
  // each branch leaves out the strings of the other's pattern.
  const SchemaGrammar role(R"({"type": "string", "oneOf": [{"pattern": "APPROVER"}, {"pattern": "SIGNER"}]})");
  role.expect_values({R"("APPROVER")", R"("SIGNER")", R"("the APPROVER")"});
  role.expect_rejects({R"("APPROVERSIGNER")", R"("SIGNER, APPROVER")", R"("other")", "1"});
  // Branches that share a pattern beside the oneOf and have no other: no
  // pattern of their own to leave out, still refused.
  EXPECT_CONTAINS(schema_error(R"({"type": "string", "pattern": "^a", "oneOf": [{"minLength": 1}, {"maxLength": 3}]})"),
                  "may overlap");
}

TEST(JsonSchemaOneOf, BranchesToldApartByWhatAMemberIsWhenPresent) {
  // Github_hard's xAPI agent: each branch requires its own member and makes
  // the others' null where present; a string "mbox" is not null.
  const SchemaGrammar agent(R"({"oneOf": [
      {"type": "object", "required": ["mbox"], "properties": {"mbox": {"type": "string"}},
       "patternProperties": {"^(openid|account)$": {"type": "null"}}},
      {"type": "object", "required": ["openid"], "properties": {"openid": {"type": "string"}},
       "patternProperties": {"^(mbox|account)$": {"type": "null"}}}]})");
  agent.expect_values({R"({"mbox": "m"})", R"({"openid": "o", "mbox": null})", R"({"mbox": "m", "x": 1})"});
  agent.expect_rejects({R"({"mbox": "m", "openid": "o"})", R"({"openid": "o", "account": 1})", "{}"});
  // By a listed property: "kind" a string in one, a number where present in
  // the other.
  const SchemaGrammar kinds(R"({"oneOf": [
      {"type": "object", "required": ["kind"], "properties": {"kind": {"type": "string"}}},
      {"type": "object", "required": ["size"], "properties": {"kind": {"type": "number"}, "size": {}}}]})");
  kinds.expect_values({R"({"kind": "a"})", R"({"kind": 2, "size": 1})"});
  kinds.expect_rejects({R"({"kind": "a", "size": 1})", R"({"kind": 1})"});
}

TEST(JsonSchemaOneOf, OpenObjectBranchesClosedToWhatTheyList) {
  // Github_hard's xAPI agent: open objects, each requiring its own member;
  // closed, a value of one lacks what each other requires.
  const SchemaGrammar agent(R"({"oneOf": [
      {"type": "object", "required": ["mbox"], "properties": {"mbox": {"type": "string"}, "name": {"type": "string"}}},
      {"type": "object", "required": ["account"], "properties": {"account": {"type": "object"},
                                                                  "name": {"type": "string"}}}]})");
  agent.expect_values({R"({"mbox": "a@b"})", R"({"mbox": "a@b", "name": "n"})", R"({"account": {}, "name": "n"})"});
  agent.expect_rejects({R"({"mbox": "a@b", "account": {}})", R"({"mbox": "a@b", "other": 1})", R"({"name": "n"})",
                        "{}"});
  // Told apart by their member counts: at least two required members
  // against at most one member.
  const SchemaGrammar counted(R"({"oneOf": [
      {"type": "object", "required": ["url", "type"], "properties": {"url": {"type": "string"},
                                                                    "type": {"type": "string"}}},
      {"type": "object", "additionalProperties": {"enum": [false]}, "minProperties": 1, "maxProperties": 1}]})");
  counted.expect_values({R"({"url": "u", "type": "git"})", R"({"x": false})"});
  counted.expect_rejects({R"({"url": "u"})", R"({"x": true})", "{}", R"({"url": "u", "type": "git", "x": false})"});
  // A branch with no required member matches any object of the other's
  // closed names: still refused.
  EXPECT_CONTAINS(schema_error(R"({"type": "object", "oneOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]})"),
                  "may overlap");
}

TEST(JsonSchemaOneOf, BranchesNarrowedToTheirDiscriminator) {
  // Github_easy/o13129.json.
  const SchemaGrammar field(R"({"type": "object", "oneOf": [
      {"properties": {"type": {"type": "string", "enum": ["callback"]}, "value": {"type": "string"},
                      "options": {"type": "object"}}},
      {"properties": {"type": {"type": "string", "enum": ["field", "value"]},
                      "value": {"type": ["string", "null", "boolean", "number"]}, "options": {"type": "object"}}}]})");
  field.expect_values({R"({"type": "callback", "value": "x"})", R"({"type": "field", "value": null})",
                       R"({"type": "value", "value": 1.5, "options": {}})", R"({"type": "callback", "other": 1})"});
  field.expect_rejects({"{}", R"({"value":"x"})", R"({"type":"callback","value":1})", R"({"type":"other"})",
                        R"({"type":"field","value":[]})", "\"callback\""});

  // Branches that are $refs (Github_medium/o13137.json, draft 4), the
  // discriminator a boolean.
  const SchemaGrammar referenced(R"({"$schema": "http://json-schema.org/draft-04/schema#",
      "definitions": {"off": {"properties": {"required": {"type": "boolean", "enum": [false]},
                                             "unique": {"type": "boolean", "enum": [false]}}},
                      "on": {"properties": {"required": {"type": "boolean", "enum": [true]},
                                            "unique": {"type": "boolean"}}}},
      "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
      "oneOf": [{"$ref": "#/definitions/off"}, {"$ref": "#/definitions/on"}]})");
  referenced.expect_accepts({R"({"name":"n","required":false})", R"({"name":"n","required":false,"unique":false})",
                             R"({"name":"n","required":true,"unique":true})"});
  referenced.expect_rejects({R"({"name":"n"})", R"({"name":"n","required":false,"unique":true})",
                             R"({"required":true})"});

  // The discriminator a string of patterns that do not meet
  // (Github_ultra/o17072.json).
  const SchemaGrammar patterned(R"({"oneOf": [
      {"type": "object", "properties": {"type": {"type": "string", "pattern": "^Displace$"}, "x": {}},
       "additionalProperties": false},
      {"type": "object", "properties": {"type": {"type": "string", "pattern": "^Quad"}, "y": {}},
       "additionalProperties": false}]})");
  patterned.expect_accepts({R"({"type":"Displace","x":1})", R"({"type":"Quadrant","y":1})"});
  patterned.expect_rejects({"{}", R"({"x":1})", R"({"type":"Displace","y":1})", R"({"type":"Other"})"});

  // Merged beside $ref, through the same rewrite.
  const SchemaGrammar merged(R"({"$defs": {"base": {"type": "object"}}, "$ref": "#/$defs/base",
      "oneOf": [{"properties": {"k": {"const": 1}}}, {"properties": {"k": {"const": 2}, "v": {"type": "string"}}}]})");
  merged.expect_accepts({R"({"k":1})", R"({"k":2,"v":"x"})", R"({"k":1,"v":3})"});
  merged.expect_rejects({"{}", R"({"k":3})", R"({"k":2,"v":3})"});
}

// A branch whose not takes away the other branch's values
// (JsonSchemaStore/avro-avsc.json: a custom type name is any name but a
// primitive one).
TEST(JsonSchemaOneOf, BranchesToldApartByTheValuesANotTakesAway) {
  const SchemaGrammar avro(R"({"$defs": {"primitive": {"type": "string", "enum": ["null", "int"]}},
      "oneOf": [{"$ref": "#/$defs/primitive"},
                {"type": "string", "pattern": "^[a-z]+$", "not": {"$ref": "#/$defs/primitive"}}]})");
  avro.expect_accepts({"\"null\"", "\"int\"", "\"record\""});
  avro.expect_rejects({"\"Int1\"", "1", "null"});
}

TEST(JsonSchemaOneOf, BranchesThatMayOverlapAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      // Bounds that overlap at 5.
      {R"({"oneOf": [{"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 5}]})",
       R"(unsupported keyword "oneOf" at #: its branches 0 and 1 may overlap)"},
      // Object branches with only optional properties whose values overlap:
      // {} and {"type": "b"} match both.
      {R"({"type": "object", "oneOf": [{"properties": {"type": {"enum": ["a", "b"]}}},
                                       {"properties": {"type": {"enum": ["b", "c"]}}}]})",
       R"(unsupported keyword "oneOf" at #: its branches 0 and 1 may overlap)"},
      // Branch 1 requires every name branch 0 does, and branch 0's other
      // keywords do not admit every object: {"a": 1, "b": 2} matches branch 1
      // alone, which missing names cannot say.
      {R"({"oneOf": [{"required": ["a"], "properties": {"a": {"type": "string"}}}, {"required": ["a", "b"]}]})",
       R"(unsupported keyword "oneOf" at #: its branches 0 and 1 may overlap)"},
      // A branch that requires nothing, not proven apart from one that does.
      {R"({"type": "object", "oneOf": [{"required": ["a"]}, {"properties": {"a": {"type": "integer"}}}]})",
       R"(unsupported keyword "oneOf" at #: its branches 0 and 1 may overlap)"},
      // Untyped branches that both constrain strings.
      {R"({"oneOf": [{"minLength": 2}, {"maxLength": 4}]})",
       R"(unsupported keyword "oneOf" at #: its branches 0 and 1 may overlap)"},
      // A branch that admits every integer and one that admits some.
      {R"({"properties": {"x": {"oneOf": [{"type": "integer"}, {"type": "integer", "minimum": 2}]}}})",
       R"(unsupported keyword "oneOf" at #/properties/x: its branches 0 and 1 may overlap)"},
      // The tags' schemas admit any non-object alike: {"meta": "s"} matches both.
      {R"({"type": "object", "oneOf": [
           {"properties": {"meta": {"properties": {"v": {"const": 1}}, "required": ["v"]}}, "required": ["meta"]},
           {"properties": {"meta": {"properties": {"v": {"const": 2}}, "required": ["v"]}}, "required": ["meta"]}]})",
       R"(unsupported keyword "oneOf" at #: its branches 0 and 1 may overlap)"},
      {R"({"oneOf": [{"type": "string"}, {"type": "null"}, {"enum": ["a", 1]}]})",
       R"(unsupported keyword "oneOf" at #: its branches 0 and 2 may overlap)"},
      {R"({"allOf": [{"type": "object"}, {"oneOf": [{"type": "object"}, {"properties": {"a": {}}}]}]})",
       R"(unsupported keyword "oneOf" at #/allOf/1: its branches 0 and 1 may overlap)"},
      // Drafts 4 to 7 ignore what is beside $ref: the first branch is {}.
      {R"({"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"any": {}},
           "oneOf": [{"$ref": "#/definitions/any", "type": "string"}, {"type": "integer"}]})",
       R"(unsupported keyword "oneOf" at #: its branches 0 and 1 may overlap)"},
  };
  for (const auto& [schema, message] : cases) EXPECT_CONTAINS(schema_error(schema), message);
  // From 2019-09 on they apply, and the branches are disjoint.
  const SchemaGrammar siblings(R"({"definitions": {"any": {}},
      "oneOf": [{"$ref": "#/definitions/any", "type": "string"}, {"type": "integer"}]})");
  siblings.expect_accepts({"\"s\"", "1"});
  siblings.expect_rejects({"null"});
}

TEST(JsonSchemaCombinations, Not) {
  // Whole types, and types no keyword inside applies to.
  const SchemaGrammar not_object(R"({"not": {"type": "object"}})");
  not_object.expect_accepts({"1", "\"s\"", "[]", "null"});
  not_object.expect_rejects({"{}"});
  const SchemaGrammar not_number(R"({"type": ["number", "string"], "not": {"type": "number"}})");
  not_number.expect_accepts({"\"s\""});
  not_number.expect_rejects({"1", "1.5"});
  // A pattern applies to strings only: every other value matches it, so
  // the not leaves the strings it does not match.
  const SchemaGrammar no_digits(R"({"not": {"pattern": "[0-9]"}})");
  no_digits.expect_accepts({"\"abc\"", "\"\""});
  no_digits.expect_rejects({"\"a1\"", "1", "null", "{}"});
  // Listed values: strings, booleans, null; other types pass.
  const SchemaGrammar not_listed(R"({"type": ["string", "boolean", "null", "integer"],
                                     "not": {"enum": ["logs", true, null]}})");
  not_listed.expect_accepts({"\"log\"", "\"logs2\"", "false", "3"});
  not_listed.expect_rejects({"\"logs\"", "true", "null"});
  // Beside a pattern and length bounds, and beside enum values.
  const SchemaGrammar beside(R"({"type": "string", "pattern": "^[a-z]+$", "maxLength": 4, "not": {"const": "none"}})");
  beside.expect_accepts({"\"nope\"", "\"non\""});
  beside.expect_rejects({"\"none\"", "\"nones\"", "\"N\""});
  const SchemaGrammar filtered(R"({"enum": ["a", "b", 1], "not": {"enum": ["a"]}})");
  filtered.expect_accepts({"\"b\"", "1"});
  filtered.expect_rejects({"\"a\""});
  // Through $ref and allOf (merged): both nots hold.
  const SchemaGrammar merged(R"({"$defs": {"s": {"type": "string", "not": {"const": "x"}}},
                                 "allOf": [{"$ref": "#/$defs/s"}], "not": {"const": "y"}})");
  merged.expect_accepts({"\"z\""});
  merged.expect_rejects({"\"x\"", "\"y\""});
  // Inside a property.
  const SchemaGrammar property(R"({"properties": {"kind": {"type": "string", "not": {"enum": ["old"]}}},
                                   "required": ["kind"], "additionalProperties": false})");
  property.expect_accepts({R"({"kind":"new"})"});
  property.expect_rejects({R"({"kind":"old"})"});
  // not {} and not true admit nothing; not false takes nothing away.
  EXPECT_CONTAINS(schema_error(R"({"not": {}})"), "no value satisfies the schema");
  EXPECT_CONTAINS(schema_error(R"({"type": "string", "not": true})"), "no value satisfies the schema");
  const SchemaGrammar nothing_taken(R"({"type": "integer", "not": false})");
  nothing_taken.expect_accepts({"1"});
  // What cannot be built is refused by name.
  EXPECT_CONTAINS(schema_error(R"({"not": {"minLength": 2}})"),
                  R"(unsupported keyword "not" at #: only type, enum, const and pattern (or required alone))");
  // not of required names: objects lacking one of them; other values fail.
  const SchemaGrammar lacking(R"({"type": ["object", "null"], "not": {"required": ["a", "b"]}})");
  lacking.expect_accepts({"{}", R"({"a":1})", R"({"b":1,"c":2})"});
  lacking.expect_rejects({R"({"a":1,"b":2})", R"({"b":1,"a":2})", "null"});
  const SchemaGrammar neither(R"({"properties": {"x": {}, "y": {}}, "not": {"anyOf": [{"required": ["x"]}, {"required": ["y"]}]}})");
  neither.expect_accepts({"{}", R"({"z":1})"});
  neither.expect_rejects({R"({"x":1})", R"({"y":1})", "1"});
  const SchemaGrammar not_both(R"({"not": {"allOf": [{"required": ["site"]}, {"required": ["app"]}]}})");
  not_both.expect_accepts({R"({"site":1})", R"({"app":1})", "{}"});
  not_both.expect_rejects({R"({"site":1,"app":2})", "\"s\""});
  EXPECT_CONTAINS(schema_error(R"({"type": "object", "not": {"required": []}})"), "no value satisfies the schema");
  // required beside other keywords (Github_medium/o21864.json): the objects
  // that lack a required name; those that fail the negated schema otherwise
  // are left out.
  const SchemaGrammar no_name(R"({"not": {"properties": {"First": {"type": "string"}}, "required": ["First"]}})");
  no_name.expect_accepts({"{}", R"({"Last":"x"})"});
  no_name.expect_rejects({R"({"First":"x"})", R"({"First":1})", "1"});
  // A $ref alone, followed (JsonSchemaStore's avro-avsc).
  const SchemaGrammar custom(R"({"type": "string", "not": {"$ref": "#/$defs/primitive"},
                                 "$defs": {"primitive": {"enum": ["int", "string"]}}})");
  custom.expect_accepts({R"("Point")", R"("integer")"});
  custom.expect_rejects({R"("int")", R"("string")"});
  EXPECT_CONTAINS(schema_error(R"({"not": {"$ref": "#/$defs/a"}, "$defs": {"a": {"$ref": "#/$defs/a"}}})"),
                  R"(unsupported keyword "not")");
  EXPECT_CONTAINS(schema_error(R"({"not": {"enum": [1]}})"), R"(unsupported keyword "not" at #: only strings)");
  EXPECT_CONTAINS(schema_error(R"({"type": "number", "not": {"type": "integer"}})"),
                  R"(unsupported keyword "not" at #: numbers that are not integers)");
  // A regular format beside not: its automaton less what not takes.
  const SchemaGrammar not_today(R"({"type": "string", "format": "date", "not": {"const": "2024-01-01"}})");
  not_today.expect_accepts({R"("2024-01-02")"});
  not_today.expect_rejects({R"("2024-01-01")", R"("x")"});
}

TEST(JsonSchemaNumbers, MultipleOfOneIsIntegers) {
  const SchemaGrammar whole(R"({"type": "number", "multipleOf": 1, "minimum": -2, "maximum": 20})");
  whole.expect_accepts({"0", "-2", "20"});
  whole.expect_rejects({"1.5", "21", "1e1"});
  const SchemaGrammar listed(R"({"enum": [1, 2.5, "a"], "multipleOf": 1.0})");
  listed.expect_accepts({"1", "\"a\""});
  listed.expect_rejects({"2.5"});
  EXPECT_CONTAINS(schema_error(R"({"type": "number", "multipleOf": 0.01})"),
                  R"(unsupported keyword "multipleOf" at #: only 1 (integers) is supported, not 0.01)");
  EXPECT_CONTAINS(schema_error(R"({"type": "number", "multipleOf": 0})"), "must be a number above 0");
}

TEST(JsonSchemaCombinations, AllOfMerges) {
  const SchemaGrammar objects(R"({"allOf": [
      {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
      {"properties": {"b": {"type": "integer"}, "a": {"maxLength": 2}}, "required": ["b"]}]})");
  objects.expect_accepts({R"({"a":"xy","b":1})"});
  objects.expect_rejects({R"({"a":"x"})", R"({"a":"xyz","b":1})", R"({"b":1,"a":"x"})"});

  // A schema met twice adds nothing the second time: here one with
  // patternProperties beside properties, which allOf cannot merge with
  // another's, reached through both a property and the pattern matching it.
  const SchemaGrammar twice(R"({"$defs": {"p": {"type": "object", "properties": {"n": {"type": "integer"}},
                                                "patternProperties": {"^x": {"type": "string"}}}},
                                "properties": {"a": {"type": "array", "items": {"$ref": "#/$defs/p"}}},
                                "patternProperties": {"^a": {"items": {"$ref": "#/$defs/p"}}}})");
  twice.expect_accepts({R"({"a":[{"n":1,"xy":"s"}]})"});
  twice.expect_rejects({R"({"a":[{"n":"s"}]})", R"({"a":[{"xy":1}]})"});

  // A property one branch lists is an additional property of the other.
  const SchemaGrammar closed(R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": false},
                                           {"properties": {"b": {}}}]})");
  closed.expect_accepts({"{}", R"({"a":1})"});
  closed.expect_rejects({R"({"a":1,"b":2})", R"({"b":2})"});

  const SchemaGrammar types(R"({"allOf": [{"type": ["string", "integer"]}, {"type": ["number", "null"]}]})");
  types.expect_accepts({"3"});
  types.expect_rejects({"\"a\"", "null", "1.5"});

  const SchemaGrammar bounds(
      R"({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 10}, {"exclusiveMaximum": 8}]})");
  bounds.expect_accepts({"0", "7"});
  bounds.expect_rejects({"-1", "8", "10"});

  const SchemaGrammar arrays(
      R"({"allOf": [{"prefixItems": [{"type": "integer"}]}, {"items": {"type": "integer", "minimum": 0},
                                            "type": "array", "maxItems": 2}]})");
  arrays.expect_accepts({"[]", "[1]", "[1,2]"});
  arrays.expect_rejects({"[-1]", "[1,-2]", "[1,2,3]", "[\"a\"]"});

  // anyOf lists in several branches: every pair of their branches.
  const SchemaGrammar product(R"({"allOf": [{"anyOf": [{"type": "string"}, {"type": "integer"}]},
                                            {"oneOf": [{"type": "integer", "maximum": 3}, {"type": "null"}]}]})");
  product.expect_accepts({"3", "-7"});
  product.expect_rejects({"4", "\"a\"", "null"});

  EXPECT_CONTAINS(schema_error(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})"), "no value satisfies");
  const std::string e = schema_error(R"({"allOf": [{"pattern": "a"}, {"pattern": "b"}]})");
  EXPECT_CONTAINS(e, "unsupported keyword \"pattern\" at #/allOf/1");
  EXPECT_CONTAINS(schema_error(R"({"allOf": [{"not": {"minLength": 2}}]})"), "unsupported keyword \"not\" at #");
}

// --- $ref -----------------------------------------------------------------------

// allOf of an object closed to the names it lists and one with
// patternProperties: the patterns meet the listed names (Github_hard/o13457).
TEST(JsonSchemaCombinations, AllOfMeetsPatternsOnAClosedSidesNames) {
  const SchemaGrammar s(R"({"allOf": [
      {"properties": {"mbox": {}, "sha": {}, "name": {}}, "additionalProperties": false},
      {"required": ["mbox"], "properties": {"mbox": {"type": "string"}},
       "patternProperties": {"^(sha|acct)$": {"type": "null"}}}]})");
  s.expect_accepts({R"({"mbox":"m"})", R"({"mbox":"m","sha":null,"name":1})", "1"});
  s.expect_rejects({R"({"mbox":"m","sha":1})", R"({"mbox":1})", R"({"mbox":"m","acct":null})", "{}"});
  // The patterned side first.
  const SchemaGrammar reversed(R"({"allOf": [
      {"properties": {"mbox": {"type": "string"}}, "patternProperties": {"^(sha|acct)$": {"type": "null"}}},
      {"properties": {"mbox": {}, "sha": {}, "name": {}}, "additionalProperties": false}]})");
  reversed.expect_accepts({"{}", R"({"mbox":"m","sha":null,"name":1})"});
  reversed.expect_rejects({R"({"sha":1})", R"({"mbox":1})", R"({"acct":null})"});
  // A patterned side that also closes its further names is still refused.
  EXPECT_CONTAINS(schema_error(R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": false},
                                             {"patternProperties": {"^a$": {}}, "additionalProperties": false}]})"),
                  R"(unsupported keyword "patternProperties")");
}

TEST(JsonSchemaRefs, DefinitionsAndPointers) {
  const SchemaGrammar defs(R"({"$defs": {"id": {"type": "integer", "minimum": 1}},
      "definitions": {"name": {"type": "string"}},
      "type": "object", "properties": {"id": {"$ref": "#/$defs/id"}, "name": {"$ref": "#/definitions/name"},
                                       "again": {"$ref": "#/properties/id"}},
      "required": ["id"]})");
  defs.expect_values({R"({"id": 3})", R"({"id": 1, "name": "n", "again": 2})"});
  defs.expect_rejects({R"({"id":0})", R"({"id":1,"name":2})", R"({"id":1,"again":0})"});

  // Pointer escapes (~0, ~1, percent-encoding) and array indices.
  const SchemaGrammar escapes(
      R"({"$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "string"}, "e%f": {"type": "null"},
                                            "list": [{"type": "boolean"}]},
      "anyOf": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}, {"$ref": "#/$defs/e%25f"},
                {"$ref": "#/$defs/list/0"}]})");
  escapes.expect_accepts({"1", "\"s\"", "null", "true"});
  escapes.expect_rejects({"1.5", "[]"});

  // The root's $id names this document.
  const SchemaGrammar by_id(R"({"$id": "https://example.com/s", "$defs": {"x": {"type": "null"}},
                                "$ref": "https://example.com/s#/$defs/x"})");
  by_id.expect_accepts({"null"});

  // Keywords beside $ref apply as well.
  const SchemaGrammar beside(
      R"({"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}}},
                                 "$ref": "#/$defs/base", "required": ["id"]})");
  beside.expect_accepts({R"({"id":1})"});
  beside.expect_rejects({"{}", R"({"id":"x"})"});
}

TEST(JsonSchemaRefs, Recursion) {
  const SchemaGrammar tree(R"({"type": "object", "properties": {"value": {"type": "integer"},
      "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["value"], "additionalProperties": false})");
  tree.expect_values(
      {R"({"value": 1})", R"({"value": 1, "children": []})",
       R"({"value": 1, "children": [{"value": 2}, {"value": 3, "children": [{"value": 4, "children": []}]}]})"});
  tree.expect_rejects({R"({"value":1,"children":[{}]})", R"({"value":1,"children":[{"value":2,"x":1}]})"});

  const SchemaGrammar list(R"({"definitions": {"node": {"type": "object", "properties": {
      "head": {"type": "string"}, "tail": {"anyOf": [{"$ref": "#/definitions/node"}, {"type": "null"}]}},
      "required": ["head", "tail"]}}, "$ref": "#/definitions/node"})");
  list.expect_values({R"({"head": "a", "tail": null})", R"({"head": "a", "tail": {"head": "b", "tail": null}})"});
  list.expect_rejects({R"({"head":"a"})", R"({"head":"a","tail":{"head":"b"}})"});

  // Recursion through allOf closes on the merged schema.
  const SchemaGrammar merged(R"({"$defs": {"base": {"properties": {"kind": {"type": "string"}}},
      "node": {"allOf": [{"$ref": "#/$defs/base"}], "properties": {"next": {"$ref": "#/$defs/node"}}}},
      "$ref": "#/$defs/node"})");
  merged.expect_accepts({R"({"kind":"a","next":{"kind":"b","next":{}}})"});
  merged.expect_rejects({R"({"kind":1})", R"({"next":{"kind":2}})"});
}

TEST(JsonSchemaRefs, Refused) {
  EXPECT_CONTAINS(schema_error(R"({"properties": {"a": {"$ref": "other.json#/x"}}})"),
                  "unsupported keyword \"$ref\" at #/properties/a");
  EXPECT_CONTAINS(schema_error(R"({"$ref": "#anchor"})"), "anchor");
  EXPECT_CONTAINS(schema_error(R"({"$ref": "#/$defs/missing"})"), "points at nothing");
  EXPECT_CONTAINS(schema_error(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"),
                  "#/$defs/a -> #/$defs/a");
  EXPECT_CONTAINS(schema_error(
                      R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}, {}]}},
                                   "$ref": "#/$defs/a"})"),
                  "refers to itself before any JSON text");
  EXPECT_CONTAINS(schema_error(R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})"),
                  "unsupported keyword \"$ref\" at #: # -> # refers to itself before any JSON text");
  EXPECT_CONTAINS(schema_error(R"({"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
                                                   "minProperties": 2, "additionalProperties": false}},
                                   "$ref": "#/$defs/a"})"),
                  "the schema at #/$defs/a refers to itself but no value satisfies it");
  EXPECT_CONTAINS(schema_error(R"({"allOf": [{"$ref": "#"}]})"), "merged into itself");
  EXPECT_CONTAINS(schema_error(R"({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]})"),
                  "no finite value");
  // A schema embedded under its own $id (or draft 4's id) resolves the $refs
  // inside it against that identifier.
  EXPECT_CONTAINS(schema_error(
                      R"({"$defs": {"a": {"$id": "https://example.com/a", "$defs": {"b": {"type": "integer"}},
                                                   "properties": {"p": {"$ref": "#/$defs/b"}}}},
                                   "$ref": "#/$defs/a"})"),
                  "unsupported keyword \"$id\" at #/$defs/a");
  EXPECT_CONTAINS(schema_error(R"({"definitions": {"a": {"id": "a.json", "items": {"$ref": "#/definitions/b"}},
                                                   "b": {}},
                                   "properties": {"x": {"$ref": "#/definitions/a"}}})"),
                  "unsupported keyword \"id\" at #/definitions/a");
  EXPECT_CONTAINS(schema_error(
                      R"({"$defs": {"a": {"$id": "https://example.com/a", "$defs": {"b": {"type": "integer"}},
                                                   "properties": {"p": {"$ref": "#/$defs/b"}}}},
                                   "$ref": "#/$defs/a/properties/p"})"),
                  "unsupported keyword \"$ref\" at #: \"#/$defs/a/properties/p\" reaches into a schema "
                  "embedded");
}

TEST(JsonSchemaRefs, IdentifiersNoRefDependsOnAreAnnotations) {
  // No $ref inside: the identifier changes nothing the translation resolves.
  const SchemaGrammar embedded(R"({"$defs": {"a": {"$id": "x", "type": "null"}}, "$ref": "#/$defs/a"})");
  embedded.expect_accepts({"null"});
  // Draft 4: id at the root names the document; below it, a fragment ("#b")
  // only names its schema, and a schema with no $ref inside may have any.
  const SchemaGrammar draft4(R"({"$schema": "http://json-schema.org/draft-04/schema#",
      "id": "http://example.com/root.json#",
      "definitions": {"a": {"id": "a.json", "type": "integer"},
                      "b": {"id": "#b", "type": "object", "properties": {"c": {"$ref": "#/definitions/a"}}}},
      "type": "object",
      "properties": {"x": {"$ref": "#/definitions/b"}, "y": {"$ref": "http://example.com/root.json#/definitions/a"},
                     "id": {"type": "string"}},
      "required": ["id"]})");
  draft4.expect_accepts({R"({"x":{"c":1},"y":2,"id":"i"})", R"({"id":"i"})"});
  draft4.expect_rejects({R"({"x":{"c":"s"},"id":"i"})", R"({"y":"s","id":"i"})", R"({"y":2})"});
  // An id that is not a string is no identifier.
  const SchemaGrammar misplaced(
      R"({"type": "object", "properties": {"a": {"id": {"type": "string"}, "type": "null"}}})");
  misplaced.expect_values({R"({"a": null})"});
}

TEST(JsonSchemaObjects, SortedJsonGivesSortedOrder) {
  // A nlohmann::json converts, but it has sorted its keys already.
  const nlohmann::json sorted = nlohmann::json::parse(R"({"type": "object", "properties": {"b": {}, "a": {}},
                                                            "required": ["b", "a"]})");
  const Grammar grammar = parse_ebnf(json_schema_to_ebnf(sorted));
  EXPECT_TRUE(grammar_matches(grammar, R"({"a":1,"b":2})"));
  EXPECT_FALSE(grammar_matches(grammar, R"({"b":2,"a":1})"));
}

// --- Whitespace -----------------------------------------------------------------

TEST(JsonSchemaFlexible, WhitespaceBetweenTokensOnly) {
  JsonSchemaOptions options;
  options.compact = false;
  options.max_whitespace = 2;
  const SchemaGrammar s(
      R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}},
      "b": {"type": "string"}, "c": {}}, "required": ["a"], "additionalProperties": false})",
      options);
  s.expect_accepts({R"({"a":[1,2]})", R"({ "a" : [ 1 , 2 ] })", "{\n\t\"a\":[]}", "{\"a\":[ ],\r\n\"b\" :\"x\"}",
                    R"({"a":[], "c": {  }})", R"({"a":[], "c": { "k" : [ null ] }})"});
  s.expect_rejects({R"({   "a":[]})", R"({"a":[1   ,2]})", R"( {"a":[]})", R"({"a":[]} )", R"({"a":[1 2]})",
                    R"({"b":"x", "a":[]})", "{\"a\":[]\f}"});

  const SchemaGrammar empty_object(R"({"type": "object", "properties": {"p": {}}})", options);
  empty_object.expect_accepts({"{}", "{  }", "{ \"p\" : 1 , \"q\" : 2 }"});
  empty_object.expect_rejects({"{   }"});

  // enum values keep dump()'s compact spelling.
  const SchemaGrammar values(R"({"enum": [{"a": [1]}]})", options);
  values.expect_accepts({R"({"a":[1]})"});
  values.expect_rejects({R"({ "a":[1]})"});

  options.max_whitespace = 0;
  const SchemaGrammar none(R"({"type": "array"})", options);
  none.expect_accepts({"[1,2]"});
  none.expect_rejects({"[1, 2]"});

  options.max_whitespace = -1;
  EXPECT_CONTAINS(schema_error("{}", options), "max_whitespace");
}

// --- Refused keywords ------------------------------------------------------------

TEST(JsonSchemaRefused, UnsupportedKeywordsNameThemselvesAndTheirPath) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"properties": {"a": {"not": {"minLength": 2}}}})", R"(unsupported keyword "not" at #/properties/a)"},
      {R"({"if": {"minLength": 2}, "then": {}})", R"(unsupported keyword "if" at #)"},
      {R"({"properties": {"a": {"if": {"properties": {"b": {"minimum": 1}}}, "else": {}}}})",
       R"(unsupported keyword "if" at #/properties/a: its else needs the values that fail the schema of property "b")"},
      {R"({"type": "array", "items": {"contains": {}}})", R"(unsupported keyword "contains" at #/items)"},
      {R"({"propertyNames": {"anyOf": [{"format": "date"}]}})", R"(unsupported keyword "propertyNames" at #)"},
      {R"({"unevaluatedProperties": false})", R"(unsupported keyword "unevaluatedProperties" at #)"},
      {R"({"unevaluatedItems": false})", R"(unsupported keyword "unevaluatedItems" at #)"},
      {R"({"minContains": 1})", R"(unsupported keyword "minContains" at #)"},
      {R"({"type": "integer", "multipleOf": 2})", R"(unsupported keyword "multipleOf" at #)"},
      {R"({"type": "array", "uniqueItems": 1})", R"(keyword "uniqueItems" at # must be a boolean)"},
      {R"({"$dynamicRef": "#meta"})", R"(unsupported keyword "$dynamicRef" at #)"},
      {R"({"$recursiveRef": "#"})", R"(unsupported keyword "$recursiveRef" at #)"},
      {R"({"type": "number", "divisibleBy": 2})", R"(unsupported keyword "divisibleBy" at #)"},
      {R"({"$defs": {"n": {"type": "integer", "multipleOf": 5, "x-unit": "s"}}, "$ref": "#/$defs/n"})",
       R"(unsupported keyword "multipleOf" at #/$defs/n)"},
      {R"({"properties": {"a/b~": {"not": {"minLength": 2}}}})", R"(unsupported keyword "not" at #/properties/a~1b~0)"},
      {R"({"$defs": {"x": {"not": {"minLength": 2}}}, "$ref": "#/$defs/x"})", R"(unsupported keyword "not" at #/$defs/x)"},
      {R"({"anyOf": [{}, {"additionalProperties": {"not": {"minLength": 2}}}]})",
       R"(unsupported keyword "not" at #/anyOf/1/additionalProperties)"},
  };
  for (const auto& [schema, message] : cases) EXPECT_CONTAINS(schema_error(schema), message);
  // Unused definitions are not translated, so not checked either.
  const SchemaGrammar unused(R"({"$defs": {"x": {"not": {}}}, "type": "null"})");
  unused.expect_accepts({"null"});
  // Annotations are ignored, and uniqueItems: false asserts nothing.
  const SchemaGrammar annotated(
      R"({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "urn:x",
      "title": "t", "description": "d", "default": 1, "examples": [1], "example": 1, "$comment": "c",
      "deprecated": false, "readOnly": true, "writeOnly": false, "$anchor": "a", "type": "array", "uniqueItems": false,
      "contentMediaType": "text/plain", "contentEncoding": "base64"})");
  annotated.expect_accepts({"[1,1]"});
}

TEST(JsonSchemaKeywords, KeysThatAreNoJsonSchemaKeywordAreAnnotations) {
  // Vendor extensions (Kubernetes' x-*), Snowplow's self, OpenAPI's
  // nullable, misspelt keywords: a validator ignores them, and so does the
  // translation (so "requried" requires nothing, and "maxmimum" bounds
  // nothing).
  const SchemaGrammar s(R"({"type": "object",
      "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}],
      "self": {"vendor": "com.example", "name": "e", "format": "jsonschema", "version": "1-0-0"},
      "links": [{"rel": "self", "href": "{id}"}], "readonly": true, "name": "n", "host": "h", "version": 2,
      "properties": {"a": {"type": "string", "minlength": 3, "_format": "date", "nullable": true},
                     "b": {"type": "integer", "maxmimum": 3, "type\"": "string", "_uniqueItems": true},
                     "c": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "integer"}}},
      "requried": ["a"]})");
  s.expect_values({"{}", R"({"a": "x"})", R"({"b": 99})", R"({"c": [1, 1]})"});
  s.expect_rejects({R"({"a":null})", R"({"b":"x"})", R"({"c":["x"]})"});
  // Their values are never read as schemas, whatever they hold.
  const SchemaGrammar values(R"({"x-schema": {"not": {}}, "type": "null"})");
  values.expect_accepts({"null"});
  // The JSON Schema keywords that cannot be enforced are still refused, with
  // their path, beside unknown keys or not.
  EXPECT_CONTAINS(schema_error(R"({"x-a": 1, "not": {"minLength": 2}})"), R"(unsupported keyword "not" at #)");
  EXPECT_CONTAINS(schema_error(R"({"properties": {"a": {"x-b": 1, "contains": {}}}})"),
                  R"(unsupported keyword "contains" at #/properties/a)");
  EXPECT_CONTAINS(schema_error(R"({"anyOf": [{"if": {"maxItems": 1}, "then": {}}]})"),
                  R"(unsupported keyword "if" at #/anyOf/0)");
  EXPECT_CONTAINS(schema_error(R"({"items": {"multipleOf": 3}})"), R"(unsupported keyword "multipleOf" at #/items)");
}

TEST(JsonSchemaRefused, MetaschemasOtherThanTheDrafts) {
  // A custom metaschema may switch the validation vocabulary off.
  EXPECT_CONTAINS(schema_error(R"({"$schema": "http://localhost:1234/draft2020-12/metaschema-no-validation.json",
                                   "minimum": 10})"),
                  R"(unsupported keyword "$schema" at #: "http://localhost:1234/draft2020-12/)");
  EXPECT_CONTAINS(schema_error(R"({"$schema": "https://json-schema.org/draft/2020-12/other"})"), "$schema");
  for (const char* draft : {"http://json-schema.org/draft-04/schema#", "https://json-schema.org/draft-07/schema",
                            "http://json-schema.org/schema#", "https://json-schema.org/draft/2019-09/schema",
                            "http://json-schema.org/draft-04/hyper-schema#"}) {
    const SchemaGrammar s(fmt::format(R"({{"$schema": "{}", "type": "integer"}})", draft));
    s.expect_accepts({"1"});
  }
}

TEST(JsonSchemaRefused, MalformedKeywordValues) {
  EXPECT_CONTAINS(schema_error(R"({"type": "strin"})"), "unknown type \"strin\"");
  EXPECT_CONTAINS(schema_error(R"({"type": 3})"), "\"type\" at #");
  EXPECT_CONTAINS(schema_error(R"({"properties": []})"), "\"properties\" at #");
  EXPECT_CONTAINS(schema_error(R"({"required": "a"})"), "\"required\" at #");
  EXPECT_CONTAINS(schema_error(R"({"minItems": 1.5})"), "\"minItems\" at #");
  EXPECT_CONTAINS(schema_error(R"({"anyOf": []})"), "\"anyOf\" at #");
  EXPECT_CONTAINS(schema_error(R"({"$ref": 1})"), "\"$ref\" at #");
  EXPECT_CONTAINS(schema_error(R"({"properties": {"a": 1}})"), "#/properties/a");
  EXPECT_CONTAINS(schema_error("[]"), "at #");
}

TEST(JsonSchemaRefused, SchemasWithoutValues) {
  EXPECT_CONTAINS(schema_error("false"), "no value satisfies");
  EXPECT_CONTAINS(schema_error(R"({"type": "array", "minItems": 2, "maxItems": 1})"), "no value satisfies");
  EXPECT_CONTAINS(schema_error(R"({"type": "object", "required": ["p"],
                                   "properties": {"p": {"type": "object", "properties": {"a": false},
                                                        "required": ["a"]}}})"),
                  "required property \"a\" at #/properties/p");
  EXPECT_CONTAINS(schema_error(R"({"enum": []})"), "no value satisfies");
  EXPECT_CONTAINS(schema_error(R"({"type": "integer", "minimum": 1, "maximum": 0})"), "no value satisfies");
  EXPECT_CONTAINS(schema_error(R"({"type": "string", "minLength": 2, "maxLength": 1})"), "no value satisfies");
}

// --- json_object_ebnf ------------------------------------------------------------

TEST(JsonSchemaJsonObject, AnyObject) {
  const Grammar compact = parse_ebnf(json_object_ebnf());
  for (const std::string text : {"{}", R"({"a":1})", R"({"a":{"b":[1,"x",null,true,false,-1.5e3]},"a":2})"})
    EXPECT_TRUE(grammar_matches(compact, text)) << text;
  for (const std::string text : {"[]", "\"x\"", "1", R"({"a":1,})", R"({"a"})", "{ }", R"({"a":01})", R"({a:1})"})
    EXPECT_FALSE(grammar_matches(compact, text)) << text;

  JsonSchemaOptions options;
  options.compact = false;
  const Grammar flexible = parse_ebnf(json_object_ebnf(options));
  EXPECT_TRUE(grammar_matches(flexible, "{ \"a\" : [ ] ,\n  \"b\" : { } }"));
  EXPECT_TRUE(grammar_matches(flexible, "{\n       }"));  // 8 whitespace characters, the default limit
  EXPECT_FALSE(grammar_matches(flexible, "{\n        }"));
  EXPECT_FALSE(grammar_matches(flexible, " {}"));
}

// --- rule_prefix ------------------------------------------------------------------

TEST(JsonSchemaRulePrefix, PrefixesEveryRuleSoTranslationsCombine) {
  // A schema that uses every kind of rule: $ref targets, recursion, a
  // pattern's regex rules, a format's fixed rules, chunks of long repetitions.
  const ordered_json schema = ordered_json::parse(R"({
      "type": "object", "$defs": {"node": {"type": "object", "properties": {
          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
      "properties": {"tree": {"$ref": "#/$defs/node"}, "code": {"type": "string", "pattern": "^[a-z]{2}[.][0-9]+$"},
                     "when": {"type": "string", "format": "date-time"},
                     "word": {"type": "string", "maxLength": 40}},
      "required": ["code"]})");
  const std::string plain = json_schema_to_ebnf(schema);
  JsonSchemaOptions options;
  options.rule_prefix = "fn3.";
  const std::string text = json_schema_to_ebnf(schema, options);
  const Grammar unprefixed = parse_ebnf(plain);
  const Grammar prefixed = parse_ebnf(text, "fn3.root");
  ASSERT_EQ(prefixed.rules.size(), unprefixed.rules.size());
  for (size_t i = 0; i < prefixed.rules.size(); ++i)
    EXPECT_EQ(prefixed.rules[i].name, "fn3." + unprefixed.rules[i].name);
  EXPECT_EQ(prefixed.rules[static_cast<size_t>(prefixed.root)].name, "fn3.root");
  // Removing the prefix gives back the plain text byte for byte.
  std::string stripped = text;
  for (size_t at; (at = stripped.find("fn3.")) != std::string::npos;) stripped.erase(at, 4);
  EXPECT_EQ(stripped, plain);

  // Two translations side by side in one grammar.
  JsonSchemaOptions other;
  other.rule_prefix = "fn4.";
  const std::string combined = "root ::= \"A\" fn3.root | \"B\" fn4.root\n" + text +
                               json_schema_to_ebnf(ordered_json::parse(R"({"type": "integer"})"), other);
  const Grammar both = parse_ebnf(combined);
  const std::string instance = R"({"tree":{"kids":[{},{"kids":[]}]},"code":"ab.12","when":"2024-02-29T12:00:00Z"})";
  EXPECT_TRUE(grammar_matches(both, "A" + instance)) << combined;
  EXPECT_TRUE(grammar_matches(both, "B-42"));
  EXPECT_FALSE(grammar_matches(both, "A{\"code\":\"abc\"}"));
  EXPECT_FALSE(grammar_matches(both, "B{}"));
  EXPECT_FALSE(grammar_matches(both, "-42"));

  // json_object_ebnf takes it too.
  options.rule_prefix = "any_";
  EXPECT_TRUE(grammar_matches(parse_ebnf(json_object_ebnf(options), "any_root"), R"({"a":[1,{}]})"));

  EXPECT_CONTAINS(error_of([&] {
                    JsonSchemaOptions bad;
                    bad.rule_prefix = ".x";
                    json_schema_to_ebnf(schema, bad);
                  }),
                  "rule_prefix");
  EXPECT_CONTAINS(error_of([&] {
                    JsonSchemaOptions bad;
                    bad.rule_prefix = "a b";
                    json_schema_to_ebnf(schema, bad);
                  }),
                  "rule_prefix");
}

}  // namespace
}  // namespace basalt
