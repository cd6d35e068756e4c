// maxLength kept at run time (grammar/bounded_string.h) through
// GrammarConstraint: a string whose pattern or format is too large an
// automaton to count lengths in is written unbounded by its grammar, and
// the masks close it within its bound; escapes and UTF-8 count one code
// point each; rollback restores the count; the masks never run dry.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "core/error.h"
#include "grammar/bounded_string.h"
#include "grammar/ebnf.h"
#include "grammar/regex.h"
#include "grammar/structured_output.h"
#include "runtime/grammar_constraint.h"
#include "testing/constraint_walk_test_util.h"
#include "testing/error_test_util.h"
#include "tokenizer/unicode.h"

namespace basalt {
namespace {

using testing::ConstraintWalk;

std::shared_ptr<const TokenVocabulary> vocabulary() {
  static const auto v = testing::byte_vocabulary(
      {"ab", "abc", "abcd", "ab\"", "abc\"", "\"}", "\xC3\xA9", "\xC3\xA9\xC3\xA9", "http", "://", "example",
       ".com", "/path", "?q=", "word ", "words ", "\\n", "\\u001f", " a", "\xC3"});
  return v;
}

std::shared_ptr<const TokenMasker> grammar(const std::string& ebnf) { return testing::masker_of(ebnf, vocabulary()); }

size_t code_points(const std::string& text) {
  size_t n = 0;
  for (const char c : text) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

TEST(BoundedStrings, AProductTooLargeIsWrittenUnboundedWithABoundedRule) {
  // 20 words in 200 code points: the counter times the word automaton is
  // past what a pattern may compile to.
  const char* text = R"({"type": "string", "pattern": "^(?:\\S+\\s+){0,19}\\S+$", "maxLength": 200})";
  const std::string ebnf = to_ebnf({StructuredOutputSpec::Kind::kJsonSchema, text});
  EXPECT_NE(ebnf.find(std::string(kBoundedRulePrefix) + "200.."), std::string::npos) << ebnf;
  // The grammar alone takes a longer string; a small bound stays in it.
  EXPECT_TRUE(grammar_matches(parse_ebnf(ebnf), "\"" + std::string(300, 'x') + "\""));
  const std::string small = to_ebnf({StructuredOutputSpec::Kind::kJsonSchema,
                                     R"({"type": "string", "pattern": "^(?:\\S+\\s+){0,2}\\S+$", "maxLength": 10})"});
  EXPECT_EQ(small.find(kBoundedRulePrefix), std::string::npos) << small;
  EXPECT_FALSE(grammar_matches(parse_ebnf(small), "\"" + std::string(11, 'x') + "\""));
}

TEST(BoundedStrings, TheMasksCloseTheStringInTime) {
  ConstraintWalk w(grammar("root ::= bounded..5..s\nbounded..5..s ::= \"\\\"\" [a-z]+ (\"@\" [a-z]+)? \"\\\"\"\n"));
  w.write("\"ab");
  EXPECT_TRUE(w.allows("abc\""));   // 5, then the quote
  EXPECT_FALSE(w.allows("abcd"));   // 6
  EXPECT_TRUE(w.allows("@"));       // "ab@c" fits
  w.write("cd");
  EXPECT_FALSE(w.allows("@"));  // "abcd@x" would be 6
  EXPECT_TRUE(w.allows("e"));
  EXPECT_TRUE(w.allows("\""));
  w.write("e");
  EXPECT_FALSE(w.allows("a"));
  w.write("\"");
  EXPECT_TRUE(w.c.matcher().can_end());
}

TEST(BoundedStrings, EscapesAndUtf8CountOneCodePointEach) {
  ConstraintWalk w(grammar(
      "root ::= bounded..4..s\nbounded..4..s ::= \"\\\"\" ([a-z] | \"\\\\n\" | \"\\\\u00\" [0-1] [0-9a-f] | \"\xC3\xA9\")* "
      "\"\\\"\"\n"));
  w.take("\"");
  w.take("\\n");
  w.take("\\u001f");
  EXPECT_TRUE(w.allows("\xC3\xA9\xC3\xA9"));  // 4 code points in all, 8 bytes of them
  EXPECT_FALSE(w.allows("abc"));
  w.take("\xC3");  // half a code point: it counts, and its end must fit
  EXPECT_TRUE(w.allows("\xA9"));
  w.write("\xA9");
  EXPECT_TRUE(w.allows("a"));
  EXPECT_TRUE(w.allows("\\n"));
  EXPECT_FALSE(w.allows("ab"));
  w.take("a");
  EXPECT_FALSE(w.allows("\\"));
  EXPECT_FALSE(w.allows("\xC3"));
  EXPECT_TRUE(w.allows("\""));
}

TEST(BoundedStrings, RollbackRestoresTheCount) {
  ConstraintWalk w(grammar("root ::= \"[\" bounded..3..s (\",\" bounded..3..s)* \"]\"\n"
                           "bounded..3..s ::= \"\\\"\" [a-z]* \"\\\"\"\n"));
  w.write("[\"ab");
  EXPECT_FALSE(w.allows("ab"));
  w.c.rollback(2);  // back to `["`
  w.written = "[\"";
  EXPECT_TRUE(w.allows("abc\""));
  w.take("abc\"");
  w.write(",\"");  // a new string counts from nothing
  EXPECT_TRUE(w.allows("abc"));
  w.take("abc");
  EXPECT_FALSE(w.allows("a"));
  w.c.rollback(3);  // back to `["abc"`: the first string closed
  w.written = "[\"abc\"";
  EXPECT_TRUE(w.allows(","));
  w.c.rollback(1);  // and before it closed
  w.written = "[\"";
  EXPECT_FALSE(w.allows("abcd"));
  EXPECT_TRUE(w.allows("abc\""));
}

TEST(BoundedStrings, SampledDocumentsKeepTheBoundAndThePattern) {
  struct Case {
    const char* schema;
    const char* unbounded;  // the same without maxLength
    size_t max_length;
  };
  const Case cases[] = {
      {R"({"type": "string", "format": "uri", "maxLength": 24})", R"({"type": "string", "format": "uri"})", 24},
      {R"({"type": "string", "pattern": "^(?:\\S+\\s+){0,19}\\S+$", "maxLength": 120})",
       R"({"type": "string", "pattern": "^(?:\\S+\\s+){0,19}\\S+$"})", 120},
      {R"({"type": "string", "format": "email", "minLength": 8, "maxLength": 30})",
       R"({"type": "string", "format": "email", "minLength": 8})", 30},
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    const std::string ebnf = to_ebnf({StructuredOutputSpec::Kind::kJsonSchema, c.schema});
    ASSERT_NE(ebnf.find(kBoundedRulePrefix), std::string::npos) << c.schema;
    const Grammar unbounded = parse_ebnf(to_ebnf({StructuredOutputSpec::Kind::kJsonSchema, c.unbounded}));
    const auto masker = grammar(ebnf);
    size_t longest = 0;
    for (int run = 0; run < 60; ++run) {
      ConstraintWalk w(masker);
      const std::string doc = w.sample(rng, 600);
      ASSERT_TRUE(w.c.matcher().can_end()) << doc;
      const std::string value = nlohmann::json::parse(doc).get<std::string>();
      EXPECT_LE(code_points(value), c.max_length) << c.schema << ": " << doc;
      EXPECT_TRUE(grammar_matches(unbounded, doc)) << c.schema << ": " << doc;
      longest = std::max(longest, code_points(value));
    }
    // Sampling runs on until the bound stops it, most of the time.
    EXPECT_GE(longest + 3, c.max_length) << c.schema;
  }
}

TEST(BoundedStrings, BoundsNoStringCanMeetAreRefused) {
  // (a|b)*a(a|b){10}: 2048 states, whose shortest string has 11 code
  // points; times a counter to 3 it is past the limit, and 3 is too few.
  EXPECT_CONTAINS(testing::error_of([] {
                    to_ebnf({StructuredOutputSpec::Kind::kJsonSchema,
                             R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|b)*a(a|b){10}$",
                                 "maxLength": 3}}, "required": ["s"]})"});
                  }),
                  "no string at #/properties/s meets its pattern");
  EXPECT_CONTAINS(testing::error_of([] { compile_grammar(parse_ebnf("root ::= bounded..2..s\nbounded..2..s ::= \"\\\"\" "
                                                                     "\"abc\" \"\\\"\"\n")); }),
                  "needs 3 code points, above its bound 2");
  EXPECT_CONTAINS(testing::error_of([] { compile_grammar(parse_ebnf("root ::= bounded..2..s\nbounded..2..s ::= \"\\\"\" "
                                                                     "x \"\\\"\"\nx ::= \"(\" x \")\" | \"\"\n")); }),
                  "not a regular language");
  EXPECT_CONTAINS(testing::error_of([] { compile_grammar(parse_ebnf("root ::= bounded..2..s\nbounded..2..s ::= \"a\"\n")); }),
                  "must begin with a quote");
}

}  // namespace
}  // namespace basalt
