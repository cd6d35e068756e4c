#include "grammar/regex.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "grammar/matcher.h"
#include "tokenizer/unicode.h"

namespace basalt {
namespace {

using Strings = std::vector<std::string>;

std::string utf8(uint32_t c) {
  std::string out;
  unicode::append_utf8(static_cast<char32_t>(c), out);
  return out;
}

// The string content as nlohmann::json writes it, the oracle for the
// json_escaped translation.
std::string json_content(const std::string& value) {
  const std::string quoted = nlohmann::json(value).dump();
  return quoted.substr(1, quoted.size() - 2);
}

// The translation compiled once, for checking many strings.
class Language {
 public:
  Language(std::string_view pattern, RegexMode mode, bool json_escaped)
      : rules_(regex_to_ebnf(pattern, mode, json_escaped, "re-")),
        grammar_(compile_grammar(parse_ebnf(rules_.rules, rules_.root))) {}

  bool accepts(std::string_view text) const {
    GrammarMatcher matcher(grammar_);
    return matcher.accept_bytes(text) && matcher.can_end();
  }
  const std::string& rules() const { return rules_.rules; }

 private:
  RegexRules rules_;
  std::shared_ptr<const CompiledGrammar> grammar_;
};

void expect_language(std::string_view pattern, RegexMode mode, bool json_escaped, const Strings& accepted,
                     const Strings& rejected) {
  const RegexRules r = regex_to_ebnf(pattern, mode, json_escaped, "re-");
  const Grammar grammar = parse_ebnf(r.rules, r.root);
  for (const std::string& s : accepted) {
    EXPECT_TRUE(grammar_matches(grammar, s)) << "/" << pattern << "/ should accept \"" << s << "\"; rules:\n"
                                             << r.rules;
  }
  for (const std::string& s : rejected) {
    EXPECT_FALSE(grammar_matches(grammar, s)) << "/" << pattern << "/ should reject \"" << s << "\"; rules:\n"
                                              << r.rules;
  }
}

void expect_full(std::string_view pattern, const Strings& accepted, const Strings& rejected) {
  expect_language(pattern, RegexMode::kFullMatch, /*json_escaped=*/false, accepted, rejected);
}

void expect_search(std::string_view pattern, const Strings& accepted, const Strings& rejected) {
  expect_language(pattern, RegexMode::kSearch, /*json_escaped=*/false, accepted, rejected);
}

void expect_json(std::string_view pattern, RegexMode mode, const Strings& accepted, const Strings& rejected) {
  expect_language(pattern, mode, /*json_escaped=*/true, accepted, rejected);
}

// Each code point of [0, 0x3100) and some above, where classes change.
std::vector<uint32_t> sample_code_points() {
  std::vector<uint32_t> out;
  for (uint32_t c = 0; c < 0x3100; ++c) out.push_back(c);
  for (uint32_t c : {0xD7FFu, 0xE000u, 0xFEFEu, 0xFEFFu, 0xFF00u, 0xFFFFu, 0x10000u, 0x1F600u, 0x10FFFFu}) {
    out.push_back(c);
  }
  return out;
}

// The single-code-point strings `pattern` (full match) accepts are exactly
// those where `expected` holds.
void expect_code_points(std::string_view pattern, const std::function<bool(uint32_t)>& expected) {
  const Language language(pattern, RegexMode::kFullMatch, /*json_escaped=*/false);
  int mismatches = 0;
  for (uint32_t c : sample_code_points()) {
    if (language.accepts(utf8(c)) == expected(c)) continue;
    ADD_FAILURE() << "/" << pattern << "/ on U+" << std::hex << c << ": expected " << expected(c) << "; rules:\n"
                  << language.rules();
    if (++mismatches == 5) return;
  }
}

bool is_ecma_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

bool is_word(uint32_t c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

bool is_line_terminator(uint32_t c) { return c == 0x0A || c == 0x0D || c == 0x2028 || c == 0x2029; }

// The message of the error the translation throws, "" when it succeeds.
std::string error_of(std::string_view pattern, RegexMode mode = RegexMode::kFullMatch) {
  try {
    regex_to_ebnf(pattern, mode, /*json_escaped=*/false, "p0-");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// --- The translation's text -------------------------------------------------

TEST(RegexToEbnf, RulesCarryThePrefix) {
  for (const char* pattern : {"abc", "^[^a]+$", "(x|y)*z{2,3}", ".", ""}) {
    for (const bool json_escaped : {false, true}) {
      const RegexRules r = regex_to_ebnf(pattern, RegexMode::kSearch, json_escaped, "p0-");
      EXPECT_EQ(r.root, "p0-root");
      EXPECT_EQ(r.rules.rfind("p0-root ::= ", 0), 0u) << r.rules;
      std::istringstream lines(r.rules);
      std::string line;
      while (std::getline(lines, line)) {
        EXPECT_EQ(line.rfind("p0-", 0), 0u) << pattern << ": " << line;
        EXPECT_NE(line.find(" ::= "), std::string::npos) << pattern << ": " << line;
      }
      EXPECT_NO_THROW(parse_ebnf(r.rules, r.root)) << r.rules;
    }
  }
}

TEST(RegexToEbnf, PlainTranslations) {
  EXPECT_EQ(regex_to_ebnf("a[b-d]*|e", RegexMode::kFullMatch, false, "x-").rules, "x-root ::= \"a\" [b-d]* | \"e\"\n");
  EXPECT_EQ(regex_to_ebnf("^(ab){2,}?$", RegexMode::kSearch, false, "x-").rules, "x-root ::= \"ab\"{2,}\n");
  EXPECT_EQ(regex_to_ebnf("a", RegexMode::kSearch, false, "x-").rules, "x-root ::= .* \"a\" .*\n");
  // A negated class stays negated where that is the shorter form.
  EXPECT_EQ(regex_to_ebnf("[^\\]\\\\^-]", RegexMode::kFullMatch, false, "").rules, "root ::= [^\\-\\\\-\\^]\n");
}

TEST(RegexToEbnf, JsonEscapedSetsShareOneRule) {
  const RegexRules r = regex_to_ebnf("^[^a][^a]$", RegexMode::kFullMatch, /*json_escaped=*/true, "p0-");
  EXPECT_EQ(r.rules,
            "p0-root ::= p0-1 p0-1\n"
            "p0-1 ::= [^\\u0000-\\u001F\"\\\\a] | \"\\\\\" [\"\\\\bfnrt] | \"\\\\u000\" [0-7be-f] | "
            "\"\\\\u001\" [0-9a-f]\n");
}

TEST(RegexToEbnf, TwoTranslationsShareAGrammar) {
  const RegexRules digits = regex_to_ebnf("^\\d+$", RegexMode::kSearch, false, "p0-");
  const RegexRules letters = regex_to_ebnf("^[a-z]+$", RegexMode::kSearch, false, "p1-");
  const Grammar grammar = parse_ebnf("root ::= p0-root \",\" p1-root\n" + digits.rules + letters.rules);
  EXPECT_TRUE(grammar_matches(grammar, "12,ab"));
  EXPECT_FALSE(grammar_matches(grammar, "ab,12"));
}

TEST(RegexToEbnf, LargestBoundIsAccepted) {
  EXPECT_NE(regex_to_ebnf("a{10000}", RegexMode::kFullMatch, false, "p-").rules.find("{10000}"), std::string::npos);
  EXPECT_NE(regex_to_ebnf("a{0,10000}", RegexMode::kFullMatch, false, "p-").rules.find("{0,10000}"), std::string::npos);
}

// --- What is refused --------------------------------------------------------

TEST(RegexErrors, NameTheConstructAndOffset) {
  struct Case {
    const char* pattern;
    const char* construct;
    int offset;
  };
  const Case cases[] = {
      {"(a)\\1", "backreference", 3},
      {"(?<n>a)\\k<n>", "named backreference", 7},
      {"a(?=(?!b))", "lookahead inside a lookahead", 4},
      {"a(?=b)*", "quantifier on a lookahead", 6},
      {"a(?=b$c)", "anchor '$'", 5},
      {"x(?<=a)b", "lookbehind", 1},
      {"(?<!a)b", "negative lookbehind", 0},
      {"\\bfoo", "word boundary \\b", 0},
      {"a\\B", "word boundary \\B", 1},
      {"a^b", "anchor '^'", 1},
      {"a$b", "anchor '$'", 1},
      {"(^a)b", "anchor '^'", 1},
      {"(a$)b", "anchor '$'", 2},
      {"a$$", "anchor '$'", 1},
      {"(ab", "unbalanced '('", 0},
      {"a(b(c)", "unbalanced '('", 1},
      {"ab)", "unbalanced ')'", 2},
      {"[ab", "unbalanced '['", 0},
      {"a]", "unbalanced ']'", 1},
      {"a}", "unbalanced '}'", 1},
      {"\\q", "unknown escape", 0},
      {"a\\x4", "\\x", 1},
      {"\\u12", "\\u", 0},
      {"\\u{110000}", "\\u{", 0},
      {"\\uD800", "lone surrogate", 0},
      {"\\uDE00\\uD83D", "lone surrogate", 0},
      {"\\c1", "\\c", 0},
      {"ab\\", "'\\' at the end", 2},
      {"\\01", "octal escape", 0},
      {"[\\1]", "octal escape", 1},
      {"[z-a]", "out of order", 1},
      {"[\\d-z]", "range bound", 1},
      {"[a-\\w]", "range bound", 1},
      {"a{3,2}", "m > n", 1},
      {"a{10001}", "limit of 10000", 1},
      {"a{1,10001}", "limit of 10000", 1},
      {"a{99999999999999999999,}", "limit of 10000", 1},
      {"\\p{Script=Greek}", "Unicode property other than a general category", 0},
      {"[\\P{Alphabetic}]", "Unicode property other than a general category", 1},
      {"\\p{Cs}", "matches no code point", 0},
      {"\\pL", "it takes {name}", 0},
      {"\\p{L", "unterminated", 0},
      {"a{", "'{'", 1},
      {"a{,3}", "'{'", 1},
      {"{2}", "nothing to repeat", 0},
      {"*a", "nothing to repeat", 0},
      {"a|+", "nothing to repeat", 2},
      {"a**", "nothing to repeat", 2},
      {"a{2}{3}", "nothing to repeat", 4},
      {"^*", "nothing to repeat", 1},
      {"(?i)a", "flags", 0},
      {"(?<1>a)", "group name", 0},
      {"[]", "matches nothing", 0},
      {"x[^\\s\\S]", "matches nothing", 1},
      {"\xC3\xA9(?<=a)", "lookbehind", 2},  // offsets count bytes: é is two
      {"a\xFF", "invalid UTF-8", 1},
  };
  for (const Case& c : cases) {
    for (const RegexMode mode : {RegexMode::kFullMatch, RegexMode::kSearch}) {
      const std::string message = error_of(c.pattern, mode);
      EXPECT_NE(message.find(c.construct), std::string::npos) << c.pattern << ": " << message;
      EXPECT_NE(message.find("at offset " + std::to_string(c.offset) + " "), std::string::npos)
          << c.pattern << ": " << message;
    }
  }
}

TEST(RegexErrors, DeepNestingAndBadPrefix) {
  EXPECT_NE(error_of(std::string(201, '(') + std::string(201, ')')).find("nested deeper"), std::string::npos);
  EXPECT_EQ(error_of(std::string(200, '(') + "a" + std::string(200, ')')), "");
  EXPECT_THROW(regex_to_ebnf("a", RegexMode::kFullMatch, false, "p 0"), Error);
}

// --- Languages --------------------------------------------------------------

TEST(RegexLanguage, Literals) {
  expect_full("abc", {"abc"}, {"", "ab", "abcd", "abd", "ABC"});
  expect_search("abc", {"abc", "xxabcxx", "ababc", "abc\n"}, {"", "ab", "acb", "a bc"});
  expect_full("a\\.b\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\\\/\\^\\$\\-\\ \\\"", {"a.b*+?()[]{}|\\/^$- \""},
              {"a.b", "axb*+?()[]{}|\\/^$- \""});
  expect_full("\\n\\r\\t\\f\\v\\0", {std::string("\n\r\t\f\v\0", 6)}, {"\n\r\t\f\v0", "nrtfv0"});
  expect_full("\\x41\\u0042\\u{43}\\u{000044}\\cJ\\ca", {"ABCD\n\x01"}, {"ABCDcJca"});
  // Characters the EBNF literal must escape.
  expect_full("\"\\\\#'", {"\"\\#'"}, {"\"#'"});
  expect_full("", {""}, {"a"});
}

TEST(RegexLanguage, UnicodeCodePoints) {
  expect_full("^é+ü$", {"éü", "ééü"}, {"ü", "e\xCC\x81\xC3\xBC", "\xC3"});
  expect_full("[α-ω]+", {"λ", "αω"}, {"Α", "a", ""});
  expect_full("[😀-😂]", {"😀", "😁", "😂"}, {"😃", "\xF0\x9F\x98", "😀😀"});
  expect_full("\\u{1F600}|\\uD83D\\uDE01", {"😀", "😁"}, {"😂", "\\u{1F600}"});
  expect_full("[\\u00e9\\u{10FFFF}]", {"é", "\xF4\x8F\xBF\xBF"}, {"e", "\\u00e9"});
  // A quantifier takes the whole code point, not its last byte.
  expect_full("é{2}", {"éé"}, {"é\xA9"});
  expect_full("\\0\\x7f\\x80", {std::string("\0\x7F\xC2\x80", 4)}, {std::string("\0\x7F\x80", 3)});
}

TEST(RegexLanguage, Classes) {
  expect_full("[a-cx]", {"a", "b", "c", "x"}, {"d", "", "ab", "A"});
  expect_full("[-a]", {"-", "a"}, {"b"});
  expect_full("[a-]", {"-", "a"}, {"b"});
  expect_full("[a\\-z]", {"-", "a", "z"}, {"b"});
  expect_full("[--0]", {"-", ".", "/", "0"}, {",", "1"});
  expect_full("[a-c-e]", {"a", "b", "-", "e"}, {"d"});
  expect_full("[\\]\\\\^[]", {"]", "\\", "^", "["}, {"a"});
  expect_full("[.*+?(){}|$]+", {".*+?(){}|$"}, {"a"});
  expect_full("[\\b]", {"\b"}, {"b", "\\b"});
  expect_full("[\\d\\s_]+", {"1 _\t9"}, {"a"});
  expect_full("[\\x00-\\x1F]", {std::string(1, '\0'), "\x1F", "\n"}, {" "});
  expect_full("[\\w-]{3}", {"a-_", "Z9-"}, {"a.b"});
}

TEST(RegexLanguage, NegatedClasses) {
  expect_full("[^a-c]", {"d", "é", "😀", "\n", "\r", "\xE2\x80\xA8", std::string(1, '\0')}, {"a", "b", "c", "", "dd"});
  expect_full("[^\\d]+", {"ab", " "}, {"a1", "5"});
  expect_full("[^\\D]", {"5"}, {"a"});
  expect_full("[^]", {"\n", "a", "😀"}, {"", "ab"});
  expect_full("[^\\n]*", {"", "abc\r"}, {"a\nb"});
  expect_full("[^\\u0000-\\u{10FFFE}]", {"\xF4\x8F\xBF\xBF"}, {"a", "😀"});
  // A negated class still takes whole, valid code points only.
  expect_full("[^a]", {"\xED\x9F\xBF"}, {"\xED\xA0\x80", "\xC0\xAF", "\xF4\x90\x80\x80", "\xC3"});
}

TEST(RegexLanguage, ShorthandEscapes) {
  expect_code_points("\\d", [](uint32_t c) { return c >= '0' && c <= '9'; });
  expect_code_points("\\D", [](uint32_t c) { return !(c >= '0' && c <= '9'); });
  expect_code_points("\\w", is_word);
  expect_code_points("\\W", [](uint32_t c) { return !is_word(c); });
  expect_code_points("\\s", is_ecma_space);
  expect_code_points("\\S", [](uint32_t c) { return !is_ecma_space(c); });
  expect_code_points("[\\s\\d]", [](uint32_t c) { return is_ecma_space(c) || (c >= '0' && c <= '9'); });
  expect_code_points("[^\\s\\d]", [](uint32_t c) { return !is_ecma_space(c) && !(c >= '0' && c <= '9'); });
}

TEST(RegexLanguage, UnicodeGeneralCategories) {
  expect_language("^\\p{L}+$", RegexMode::kSearch, false, {"abc", "\xC3\xA9t\xC3\xA9", "\xE4\xB8\xAD"},
                  {"", "a1", "a b", "_"});
  expect_language("^[\\p{Lu}\\p{Nd}]$", RegexMode::kSearch, false, {"A", "7", "\xD9\xA3"}, {"a", "-"});
  expect_language("^\\P{Letter}$", RegexMode::kSearch, true, {"1", " ", "\\n"}, {"a", "\xC3\xA9"});
  expect_language("^\\p{gc=Decimal_Number}\\p{General_Category=Zs}$", RegexMode::kSearch, false, {"1 "},
                  {"1\t", "a "});
}

TEST(RegexLanguage, DotAndLineTerminators) {
  expect_code_points(".", [](uint32_t c) { return !is_line_terminator(c); });
  const std::string line_separator = "\xE2\x80\xA8", paragraph_separator = "\xE2\x80\xA9";
  expect_full("a.c", {"abc", "a\tc", "a\vc", "aéc", "a😀c"}, {"a\nc", "a\rc", "a" + line_separator + "c", "ac"});
  // The unanchored sides of a search take line terminators; `.` does not.
  expect_search("a.*b", {"xa-b\n", "\nab", "a" + paragraph_separator + "ab"}, {"a\nb", "a\rb", "ba"});
  expect_search("^a", {"a\n"}, {"\na"});
}

TEST(RegexLanguage, QuantifierBounds) {
  expect_full("a{3}", {"aaa"}, {"aa", "aaaa", ""});
  expect_full("a{2,}", {"aa", "aaaaaaa"}, {"a", ""});
  expect_full("a{2,4}", {"aa", "aaa", "aaaa"}, {"a", "aaaaa"});
  expect_full("a{0}b", {"b"}, {"ab"});
  expect_full("a{0,0}b{1,1}", {"b"}, {"ab", "bb"});
  expect_full("a?b", {"b", "ab"}, {"aab"});
  expect_full("a*b+", {"b", "aabbb"}, {"a", "ba"});
  expect_full("(ab){2}", {"abab"}, {"ab", "aba", "ababab"});
  expect_full("(ab|c){1,2}d", {"abd", "cd", "abcd", "ccd"}, {"d", "abcabd"});
  expect_full("[0-9]{2,3}-\\d{4}", {"12-3456", "123-3456"}, {"1-3456", "1234-3456", "12-345"});
  expect_full("()*a(){3}", {"a"}, {""});
  expect_full("(a*)*b", {"b", "aab"}, {"aa"});
  expect_full("(a?){2,3}", {"", "a", "aa", "aaa"}, {"aaaa"});
}

TEST(RegexLanguage, LazyQuantifiersKeepTheLanguage) {
  expect_full("a+?b", {"ab", "aaab"}, {"b"});
  expect_full("a*?b??c{2,3}?", {"cc", "abccc"}, {"abcccc", "c"});
  expect_search("^a{2}?$", {"aa"}, {"a", "aaa"});
}

TEST(RegexLanguage, AlternationAndNestedGroups) {
  expect_full("cat|dog|", {"cat", "dog", ""}, {"ca", "catdog", "cats"});
  expect_full("a(b|c(d|e)+)*f", {"af", "abf", "acdf", "acdedebcef"}, {"acf", "abcf", "abd"});
  expect_full("(?:x(?<name>y|z)){2}", {"xyxz", "xzxz"}, {"xy", "xyxyxy", "yz"});
  expect_full("((((a))))|b", {"a", "b"}, {"ab"});
  expect_full("a(|b)c", {"ac", "abc"}, {"abbc"});
  expect_search("(ab|cd)e", {"xxcde", "abe"}, {"ace", "abce"});
}

TEST(RegexLanguage, AnchorsInSearchMode) {
  expect_search("^ab", {"ab", "abx"}, {"xab", ""});
  expect_search("ab$", {"ab", "xab"}, {"abx"});
  expect_search("^ab$", {"ab"}, {"abx", "xab", "a"});
  expect_search("^a|b$", {"a", "ax", "xb", "b"}, {"xa", "bx", ""});
  expect_search("a|b", {"xxaxx", "b"}, {"", "c"});
  expect_search("^$", {""}, {"a", "\n"});
  expect_search("", {"", "anything\n"}, {});
  expect_search("^|x", {"", "yyy"}, {});
  expect_search("^(a|b)c$", {"ac", "bc"}, {"c", "abc", "acc"});
}

TEST(RegexLanguage, AnchorsInAGroupThatIsAWholeAlternative) {
  expect_language("^$|(^(?:\\S+\\s+){0,2}\\S+$)", RegexMode::kSearch, false, {"", "a", "a b", "a b c"},
                  {" ", "a b c d", "a "});
  expect_language("(^a|b$)", RegexMode::kSearch, false, {"a", "ax", "xb", "b"}, {"xa", "bx", ""});
  expect_language("x|(?:^a$)", RegexMode::kSearch, false, {"a", "yxy"}, {"aa", ""});
  expect_language("((^a$))", RegexMode::kSearch, false, {"a"}, {"ba"});
  // A group with more after it is parsed as ever: its anchors are refused.
  EXPECT_THROW(regex_to_ebnf("(^a)b", RegexMode::kSearch, false, "r"), Error);
  EXPECT_THROW(regex_to_ebnf("(^a)*", RegexMode::kSearch, false, "r"), Error);
  // A ')' in a class or escaped does not close the group.
  expect_language("(^[)]\\)a)", RegexMode::kSearch, false, {"))a", "))ab"}, {")a", "x))a"});
}

TEST(RegexLanguage, AnchorsInFullMatchMode) {
  expect_full("^ab$", {"ab"}, {"abx", "xab"});
  expect_full("^a|b$", {"a", "b"}, {"ax", "xb", "ab"});
  expect_full("^$", {""}, {"a"});
  expect_full("^", {""}, {"a"});
}

TEST(RegexLanguage, JsonEscapedNegatedClass) {
  expect_json("^[^a]$", RegexMode::kFullMatch, {"\\\"", "b", "\\\\", "\\n", "\\u0001", "\\u001f", "é", "\x7F", "/"},
              {"\"", "a", "\\", "\n", "\\u000a", "\\u001F", "\\/", "\\a", "\\u0061", "bb", ""});
  // Against nlohmann::json's own escaping, one code point at a time.
  for (const RegexMode mode : {RegexMode::kFullMatch, RegexMode::kSearch}) {
    const Language language("^[^a]$", mode, /*json_escaped=*/true);
    for (uint32_t c = 0; c < 0x100; ++c) {
      const std::string raw = utf8(c);
      EXPECT_EQ(language.accepts(json_content(raw)), c != 'a') << std::hex << c;
      if (json_content(raw) != raw) {
        EXPECT_FALSE(language.accepts(raw)) << std::hex << c;
      }
    }
  }
}

TEST(RegexLanguage, JsonEscapedClassesAndLiterals) {
  expect_json("^a\"b\\\\c\\n$", RegexMode::kFullMatch, {"a\\\"b\\\\c\\n"}, {"a\"b\\c\n", "a\"b\\\\c\\n"});
  expect_json("^[\"]+$", RegexMode::kFullMatch, {"\\\"", "\\\"\\\""}, {"\"", "\"\""});
  expect_json("^.$", RegexMode::kFullMatch, {"\\\"", "\\\\", "\\t", "\\b", "\\f", "\\u0000", "\x7F"},
              {"\\u007f", "\\n", "\\r", "\t", "\n", "\"", "\\u007F"});
  expect_json("^\\s+$", RegexMode::kFullMatch, {" ", "\\t\\n\\u000b\\f\\r", "\xC2\xA0", "\xEF\xBB\xBF"},
              {"\t", "\v", "\\v", "\\u0009"});
  expect_json("^[\\x00-\\x1f]{2}$", RegexMode::kFullMatch, {"\\u0000\\n", "\\t\\u001f", "\\b\\u000e"},
              {"\\u0000", "\\u000A\\n", "\\u0008\\n"});
  expect_json("^[\\u0000-\\u0010]$", RegexMode::kFullMatch, {"\\u0010", "\\u000f"}, {"\\u0011", "\\u001f"});
  // The unanchored sides take escaped text too, but never a bare quote.
  expect_json("ab", RegexMode::kSearch, {"ab", "\\\"ab\\n", "x\\\\ab\\u0000"}, {"\"ab", "ab\\", "ab\n", ""});
  expect_json("", RegexMode::kSearch, {"", "\\\"x"}, {"\"", "\\"});
  expect_json("^a|b$", RegexMode::kSearch, {"a\\\"", "\\tb", "a"}, {"\\\"a", "b\\n", "a\""});
}

}  // namespace
}  // namespace basalt

namespace basalt {
namespace {

// Every string over a small alphabet (one with a quote, a newline and a
// two-byte code point) up to `length`.
Strings strings_up_to(size_t length) {
  const Strings alphabet = {"a", "b", "c", "\n", "\"", "\xC3\xA9"};
  Strings out{""};
  for (size_t begin = 0, end = 1, l = 0; l < length; ++l) {
    for (size_t i = begin; i < end; ++i)
      for (const std::string& c : alphabet) out.push_back(out[i] + c);
    begin = end;
    end = out.size();
  }
  return out;
}

// The automaton, its EBNF (raw and JSON-escaped) and the pattern's own
// translation agree on every short string.
void expect_automaton_agrees(std::string_view pattern, RegexMode mode) {
  SCOPED_TRACE(std::string(pattern));
  const RegexLanguage language = RegexLanguage::of_pattern(pattern, mode);
  const Language direct(pattern, mode, /*json_escaped=*/false);
  const RegexRules raw = language.to_ebnf(/*json_escaped=*/false, "l.");
  const RegexRules escaped = language.to_ebnf(/*json_escaped=*/true, "l.");
  const Grammar raw_grammar = parse_ebnf(raw.rules, raw.root);
  const Grammar escaped_grammar = parse_ebnf(escaped.rules, escaped.root);
  for (const std::string& s : strings_up_to(4)) {
    const bool expected = direct.accepts(s);
    EXPECT_EQ(language.contains(s), expected) << "\"" << s << "\"";
    EXPECT_EQ(grammar_matches(raw_grammar, s), expected) << "\"" << s << "\"; rules:\n" << raw.rules;
    EXPECT_EQ(grammar_matches(escaped_grammar, json_content(s)), expected) << "\"" << s << "\"; rules:\n"
                                                                           << escaped.rules;
  }
}

TEST(RegexAutomaton, AgreesWithThePatternsTranslation) {
  for (const char* pattern : {"a", "^a", "a$", "^ab$", "^(a|b)*c$", "^[^a]{1,3}$", ".", "^.*$", "a|^b$|c$", "^$",
                              "", "^(?:ab|a)(bc|c)?$", "[\\s\"]", "^\\w+$", "^[a\\u00e9]{2}", "^(a+|b){2,}$"}) {
    expect_automaton_agrees(pattern, RegexMode::kSearch);
    expect_automaton_agrees(pattern, RegexMode::kFullMatch);
  }
}

TEST(RegexAutomaton, IntersectionComplementAndDifference) {
  const RegexLanguage starts_a = RegexLanguage::of_pattern("^a", RegexMode::kSearch);
  const RegexLanguage ends_b = RegexLanguage::of_pattern("b$", RegexMode::kSearch);
  const RegexLanguage both = starts_a.intersect(ends_b);
  EXPECT_TRUE(both.contains("ab"));
  EXPECT_TRUE(both.contains("acccb"));
  EXPECT_FALSE(both.contains("a"));
  EXPECT_FALSE(both.contains("bab"));
  const RegexLanguage a_not_b = starts_a.minus(ends_b);
  EXPECT_TRUE(a_not_b.contains("a"));
  EXPECT_FALSE(a_not_b.contains("ab"));
  EXPECT_FALSE(a_not_b.contains("c"));
  EXPECT_TRUE(starts_a.complement().contains(""));
  EXPECT_FALSE(starts_a.complement().contains("abc"));
  EXPECT_TRUE(RegexLanguage::of_pattern("^a$", RegexMode::kSearch)
                  .intersect(RegexLanguage::of_pattern("^b$", RegexMode::kSearch))
                  .empty());
  EXPECT_TRUE(starts_a.intersect(starts_a.complement()).empty());
  EXPECT_TRUE(starts_a.minus(starts_a).empty());
  EXPECT_FALSE(starts_a.empty());
  // A pattern that can match the empty text somewhere matches every name.
  EXPECT_TRUE(RegexLanguage::of_pattern("x*", RegexMode::kSearch).is_all());
  EXPECT_TRUE(starts_a.intersect(RegexLanguage::all()).intersect(starts_a).contains("a"));
  EXPECT_TRUE(starts_a.complement().complement().contains("ax"));
}

TEST(RegexAutomaton, NamesLessListedOnes) {
  const RegexLanguage listed = RegexLanguage::of_strings({"id", "name", "\xC3\xA9t\xC3\xA9", "bad\xFF"});
  EXPECT_TRUE(listed.contains("id"));
  EXPECT_TRUE(listed.contains("\xC3\xA9t\xC3\xA9"));
  EXPECT_FALSE(listed.contains("i"));
  EXPECT_FALSE(listed.contains("bad\xFF"));  // not UTF-8: left out
  const RegexLanguage others = RegexLanguage::all().minus(listed);
  for (const char* name : {"", "i", "ids", "nam", "names", "x"}) EXPECT_TRUE(others.contains(name)) << name;
  for (const char* name : {"id", "name"}) EXPECT_FALSE(others.contains(name)) << name;
  const RegexRules rules = others.to_ebnf(/*json_escaped=*/true, "o.");
  const Grammar grammar = parse_ebnf(rules.rules, rules.root);
  EXPECT_TRUE(grammar_matches(grammar, "i\\\"d"));
  EXPECT_TRUE(grammar_matches(grammar, "idx"));
  EXPECT_FALSE(grammar_matches(grammar, "id"));
  EXPECT_FALSE(grammar_matches(grammar, "a\"b"));  // a raw quote is never string content
}

TEST(RegexAutomaton, AutomataAreMinimal) {
  // One accepting state that loops, and the sink every other code point leads to.
  EXPECT_EQ(RegexLanguage::of_pattern("(a|a|aa)*", RegexMode::kFullMatch).state_count(), 2u);
  EXPECT_EQ(RegexLanguage::of_pattern("^[ab]*$", RegexMode::kSearch).state_count(), 2u);
  EXPECT_TRUE(RegexLanguage::all().complement().empty());
  // Every scalar value: surrogates are no part of any text, so this is all text.
  EXPECT_TRUE(RegexLanguage::of_pattern("[\\u0000-\\uD7FF\\uE000-\\u{10FFFF}]*", RegexMode::kFullMatch).is_all());
  const RegexLanguage no_a = RegexLanguage::of_pattern("[^a]*", RegexMode::kFullMatch);
  EXPECT_EQ(no_a.intersect(no_a).state_count(), no_a.state_count());
}

TEST(RegexAutomaton, BlowUpIsRefused) {
  EXPECT_THROW(RegexLanguage::of_pattern("^(a|b)*a(a|b){14}$", RegexMode::kSearch), Error);
  EXPECT_THROW(RegexLanguage::of_pattern("(((a{100}){100}){100})", RegexMode::kFullMatch), Error);
  EXPECT_THROW(RegexLanguage::of_pattern("(?<=a)", RegexMode::kSearch), Error);
  // Large classes under a long repetition: refused for the work, quickly.
  EXPECT_THROW(RegexLanguage::of_pattern("^[\\p{L}\\p{N}]{1,3000}$", RegexMode::kSearch), Error);
  EXPECT_THROW(RegexLanguage::all().complement().to_ebnf(false, "e."), Error);
}

TEST(RegexAutomaton, RulesOfAGrammarAsALanguage) {
  // Rules that call each other last are loops; a helper called in the
  // middle is built where it stands; the shortest string is counted.
  const Grammar g = parse_ebnf(
      "root ::= \"<\" body\nbody ::= digit body | \">\"\ndigit ::= [0-9] | \"x\" hex\nhex ::= [a-f]\n");
  const RegexLanguage language = RegexLanguage::of_rule(g, g.root);
  EXPECT_TRUE(language.contains("<>"));
  EXPECT_TRUE(language.contains("<12xa9>"));
  EXPECT_FALSE(language.contains("<x>"));
  EXPECT_FALSE(language.contains("<1"));
  EXPECT_EQ(language.shortest(), 2);
  EXPECT_FALSE(RegexLanguage::all().complement().shortest());
  // A rule that reaches itself with text after the call is no automaton.
  const Grammar nested = parse_ebnf("root ::= \"(\" root \")\" | \"\"\n");
  EXPECT_THROW(RegexLanguage::of_rule(nested, nested.root), Error);
  const Grammar bytes = parse_ebnf("root ::= \"\\xff\"\n");
  EXPECT_THROW(RegexLanguage::of_rule(bytes, bytes.root), Error);
}

TEST(RegexAutomaton, LookaheadsConstrainTheTextAfterThem) {
  struct Case {
    const char* pattern;
    std::vector<const char*> matches, others;
  };
  const Case cases[] = {
      {"^(?!.*--)[a-z-]+$", {"a-b", "-a-"}, {"a--b", "--"}},
      // Password rules, as schemas write them.
      {"^(?=.*\\d)(?=.*[A-Z]).{8,}$", {"Abcdefg1", "12345678X"}, {"abcdefg1", "Abcdefgh", "Abc1"}},
      // Inside an optional group: the rest of the whole text must hold no --
      // (JsonSchemaStore/appsemblerc.schema.json).
      {"^@([\\da-z](?:(?!.*--)[\\da-z-]*[\\da-z])?)/([\\da-z](?:(?!.*--)[\\da-z-]*[\\da-z])?)$",
       {"@a-b/c-d", "@ab/c", "@a/b"},
       {"@a--b/c", "@a/b--c", "@a-/b"}},
      // `$` ends a lookahead's alternative: the rest is exactly its match.
      {"^(?![0-9]*$)[a-z0-9]+$", {"12a", "a"}, {"123", ""}},
      {"^(?=.{1,5}$)[a-z]+$", {"abcde", "a"}, {"abcdef", ""}},
      {"^(?=ab|cd$)[a-z]+$", {"abx", "cd"}, {"cdx", "x"}},
      // Unanchored: (JsonSchemaStore/airlock-microgateway-3.2.json).
      {"^(?![ \\t\\n]*\\(default(.*)\\))[\\s\\S]*", {"x (default)", "(default", ""}, {"(default x)", "  (default)"}},
      {"a(?=b)", {"ab", "xabx"}, {"a", "ac"}},
  };
  for (const Case& c : cases) {
    const RegexLanguage language = RegexLanguage::of_pattern(c.pattern, RegexMode::kSearch);
    for (const char* text : c.matches) EXPECT_TRUE(language.contains(text)) << c.pattern << " on " << text;
    for (const char* text : c.others) EXPECT_FALSE(language.contains(text)) << c.pattern << " on " << text;
  }
  // regex_to_ebnf writes such a pattern from its automaton.
  const RegexRules rules = regex_to_ebnf("(?!ab)[a-z]{2}", RegexMode::kFullMatch, /*json_escaped=*/false, "l.");
  const Grammar grammar = parse_ebnf(rules.rules, rules.root);
  EXPECT_TRUE(grammar_matches(grammar, "ac"));
  EXPECT_TRUE(grammar_matches(grammar, "ba"));
  EXPECT_FALSE(grammar_matches(grammar, "ab"));
  EXPECT_FALSE(grammar_matches(grammar, "abc"));
}

}  // namespace
}  // namespace basalt
