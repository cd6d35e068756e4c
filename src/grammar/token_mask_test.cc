// Token masks against brute force: at every step of random walks through
// several grammars, the cached mask equals trying every token's bytes on the
// matcher itself; rollback restores the masks of earlier steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/ebnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

constexpr int32_t kEnd = 1;  // the end-of-sequence id of the synthetic vocabulary

// Every byte, the pieces a JSON or nested text is made of, and random
// strings over them: tokens that end inside a rule, cross several rules or
// return through several callers.
std::shared_ptr<const TokenVocabulary> synthetic_vocabulary(uint32_t seed) {
  std::vector<std::string> bytes = {"<unk>", "</s>"};
  std::vector<bool> usable = {false, false};
  for (int b = 0; b < 256; ++b) {
    bytes.emplace_back(1, static_cast<char>(b));
    usable.push_back(true);
  }
  const std::vector<std::string> pieces = {
      "{\"", "\":", "\",", "\"}", "\"]", "\":\"", "\"},", "}]", "]}", "}}", "]]", ",\"", "[{", "[[", "true",
      "null", "false", "12", "345", "0.", ".5", "e+", "-1", "abc", "name", "value", "\\\"", "\\n", "\\u00", " \"",
      "  ", "\n", "\xC3\xA9", "\xE4\xB8", "\x80", "aab", "bba", "bbb", "ccc", "cb", "(((", ")))", ")(", "a)",
      "\"a", "x\"", "\"}}", "\"]}", "1,", "2]", "3}",
      // Tails a walk reads unwalked: words, labels, UTF-8 characters
      // (whole, cut short, and \s ones: U+00A0, U+2028).
      " word", " a", "b c", "ab12", "a-b", "db-1", "a.b", "\xC3\xA9t\xC3\xA9", "caf\xC3\xA9", " \xC3\xA9",
      "\xF0\x9F\x98\x80", "\xF0\x9F", "\xC2\xA0", "\xE2\x80\xA8", "x\xE2\x80\xA8y"};
  std::mt19937 rng(seed);
  std::vector<std::string> all = pieces;
  for (int i = 0; i < 300; ++i) {
    std::string t = pieces[rng() % pieces.size()];
    const int extra = static_cast<int>(rng() % 3);
    for (int j = 0; j < extra; ++j) t += pieces[rng() % pieces.size()];
    all.push_back(t);
  }
  for (std::string& t : all) {
    bytes.push_back(std::move(t));
    usable.push_back(true);
  }
  bytes.emplace_back("");  // never allowed
  usable.push_back(true);
  const auto n = static_cast<int32_t>(bytes.size());
  return std::make_shared<TokenVocabulary>(std::move(bytes), std::move(usable), n + 7, std::vector<int32_t>{kEnd});
}

std::vector<uint32_t> brute_force_mask(GrammarMatcher& m, const TokenVocabulary& v) {
  std::vector<uint32_t> words(static_cast<size_t>((v.size() + 31) / 32), 0u);
  for (int32_t id : v.sorted()) {
    if (m.accept_bytes(v.bytes(id))) {
      words[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
      m.rollback(1);
    }
  }
  if (m.can_end())
    for (int32_t id : v.end_ids()) words[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  return words;
}

std::vector<int32_t> allowed_ids(const std::vector<uint32_t>& words) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < words.size() * 32; ++i)
    if ((words[i / 32] >> (i % 32)) & 1u) ids.push_back(static_cast<int32_t>(i));
  return ids;
}

// Random walks: every mask equals brute force; a rollback returns the mask
// of that step.
void check_walks(const std::string& ebnf, int walks, int max_steps, uint32_t seed) {
  const auto vocab = synthetic_vocabulary(seed);
  const auto grammar = compile_grammar(parse_ebnf(ebnf));
  const TokenMasker masker(grammar, vocab);
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(static_cast<size_t>((vocab->size() + 31) / 32));
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(grammar);
    std::vector<std::vector<uint32_t>> earlier;
    for (int step = 0; step < max_steps; ++step) {
      masker.fill(m, mask);
      const std::vector<uint32_t> expected = brute_force_mask(m, *vocab);
      ASSERT_EQ(allowed_ids(mask), allowed_ids(expected)) << "walk " << w << " step " << step;
      const std::vector<int32_t> ids = allowed_ids(mask);
      ASSERT_FALSE(ids.empty()) << "walk " << w << " step " << step << ": an empty mask";
      earlier.resize(static_cast<size_t>(m.history()));
      earlier.push_back(mask);  // earlier[h]: the mask after h tokens
      if (m.history() > 0 && rng() % 5 == 0) {
        const int back = 1 + static_cast<int>(rng() % static_cast<uint32_t>(std::min(3, m.history())));
        m.rollback(back);
        masker.fill(m, mask);
        ASSERT_EQ(allowed_ids(mask), allowed_ids(earlier[static_cast<size_t>(m.history())]))
            << "walk " << w << " after rolling back " << back;
        continue;
      }
      const int32_t pick = ids[rng() % ids.size()];
      if (pick == kEnd) break;
      ASSERT_TRUE(m.accept_bytes(vocab->bytes(pick)));
    }
  }
}

const char* kJsonLike = R"(
  root   ::= object
  value  ::= object | array | string | number | "true" | "false" | "null"
  object ::= "{" ( string ":" value ( "," string ":" value )* )? "}"
  array  ::= "[" ( value ( "," value )* )? "]"
  string ::= "\"" ( [^"\\] | "\\" ["\\nu] )* "\""
  number ::= "-"? [0-9]+ ( "." [0-9]+ )? ( [eE] [+-]? [0-9]+ )?
)";

TEST(TokenMask, EqualsBruteForceOnAJsonGrammar) { check_walks(kJsonLike, 12, 40, 1); }

TEST(TokenMask, EqualsBruteForceThroughDeepReturns) {
  // Tokens like ")))" or "bbb" return through several callers at once.
  check_walks("root ::= \"(\" root \")\" | \"a\" root \"b\" | [a-c]", 20, 30, 2);
  check_walks("root ::= x+\nx ::= \"(\" y \")\" | \"a\"\ny ::= x* | \"c\"", 20, 30, 3);
}

TEST(TokenMask, EqualsBruteForceOnAmbiguousAndNullableRules) {
  check_walks("root ::= a a \"!\"\na ::= [ab]* | \"bba\"", 20, 20, 4);
  check_walks("root ::= (item \",\"?)* \"}\"\nitem ::= \"\\\"\"? [a-c]* \"\\\"\"?", 20, 25, 5);
}

// Nested rules that read the same text: the stacks share their tops
// through joins, which end the cached contexts early.
TEST(TokenMask, EqualsBruteForceWhereStacksJoin) {
  check_walks("root ::= a | b\na ::= \"(\" (a | b)? \")\" \"a\"?\nb ::= \"(\" (a | b)? \")\" \"b\"", 20, 40, 7);
  check_walks("root ::= x | y\nx ::= \"{\" [ab]* (x | y)? \"}\"\ny ::= \"{\" [bc]* (x | y)? \"}\" \"c\"?", 20, 40, 8);
}

// Strings whose characters compile inline (a small rule repeated), walked
// as single stacks without a node per byte; bounded ones in runs that end
// by calling the next run, as the JSON Schema translation writes them.
TEST(TokenMask, EqualsBruteForceInsideInlinedCharacters) {
  check_walks("root ::= \"{\" (s \":\" s (\",\" s)*)? \"}\"\ns ::= \"\\\"\" c* \"\\\"\"\n"
              "c ::= [^\"\\\\] | \"\\\\\" [\"n]",
              20, 40, 9);
  check_walks("root ::= \"[\" s \"]\"\ns ::= \"\\\"\" r\nr ::= c{0,3} \"\\\"\" | c{4} r2\n"
              "r2 ::= c{0,3} \"\\\"\" | c{4} r3\nr3 ::= c{0,2} \"\\\"\"\nc ::= [^\"\\\\] | \"\\\\\" [\"nu]",
              20, 30, 10);
}

// A regex written as rules: each automaton state a rule, each move to
// another state a call in tail position, characters called where they are
// not repeated. A walk through one stack steps without a closure where the
// byte is its top's alone; a rule's end stands for its caller, a tail call
// for the callee's start.
TEST(TokenMask, EqualsBruteForceThroughTailCallsAndCalledCharacters) {
  check_walks("root ::= \"(\" a \")\" \"!\"?\na ::= c b\nb ::= c* (\" \" a | \"\")\n"
              "c ::= [a-c] | \"\\\\\" [n\"]",
              20, 40, 11);
  const nlohmann::ordered_json words = {{"type", "string"}, {"pattern", "^(?:\\S+\\s+){0,3}\\S+$"}};
  check_walks(json_schema_to_ebnf(words), 20, 40, 12);
  const nlohmann::ordered_json list = {{"type", "array"}, {"items", words}, {"maxItems", 3}};
  check_walks(json_schema_to_ebnf(list), 20, 40, 13);
}

// Strings whose states read a family of units alike (TrieWalker's tail
// reach): loops and counted runs of plain bytes, words, alphanumerics and
// UTF-8 characters, and patterns that tell some characters apart.
TEST(TokenMask, EqualsBruteForceWhereTailsAreReadUnwalked) {
  const std::vector<nlohmann::ordered_json> schemas = {
      {{"type", "string"}},
      {{"type", "string"}, {"maxLength", 6}},
      {{"type", "string"}, {"format", "hostname"}},
      {{"type", "string"}, {"pattern", "^\\p{L}+( \\p{L}+)*$"}},
      {{"type", "string"}, {"pattern", "^[^ ]{0,3}( [^ ]+)*$"}},
      // All plain bytes alike, some characters not: \u00e9, and U+2028 for `.`.
      {{"type", "string"}, {"pattern", "^[^\\u00e9]*$"}},
      {{"type", "string"}, {"pattern", "^.{0,5}$"}},
      {{"type", "array"}, {"items", {{"type", "string"}, {"maxLength", 4}}}, {"maxItems", 3}},
  };
  uint32_t seed = 20;
  for (const auto& schema : schemas) check_walks(json_schema_to_ebnf(schema), 12, 30, seed++);
}

TEST(TokenMask, UnitFamiliesOfATokensTail) {
  const TokenVocabulary v({"<s>", "\"ab", " caf\xC3\xA9", "x\xF0\x9F", "\x80" "ab", "a b"}, {false, true, true, true, true, true}, 6,
                          {0});
  const auto at = [&](std::string_view bytes) {
    const auto ids = v.spelled(bytes);
    EXPECT_EQ(ids.size(), 1u) << bytes;
    const auto& sorted = v.sorted();
    return static_cast<size_t>(std::find(sorted.begin(), sorted.end(), ids[0]) - sorted.begin());
  };
  using V = TokenVocabulary;
  constexpr size_t kNone = std::string_view::npos;
  // `"ab`: the quote is no unit of any family.
  EXPECT_EQ(v.family_tail(V::kPlainFamily, at("\"ab")), 1u);
  EXPECT_EQ(v.family_tail(V::kTextFamily, at("\"ab")), 1u);
  EXPECT_EQ(v.family_units(V::kAlnumFamily, at("\"ab"), 1), 2u);
  EXPECT_EQ(v.family_units(V::kAlnumFamily, at("\"ab"), 0), kNone);
  // ` café`: text reads it all, four characters from byte 1; plain bytes stop at the é.
  EXPECT_EQ(v.family_tail(V::kTextFamily, at(" caf\xC3\xA9")), 0u);
  EXPECT_EQ(v.family_units(V::kTextFamily, at(" caf\xC3\xA9"), 1), 4u);
  EXPECT_EQ(v.family_units(V::kTextFamily, at(" caf\xC3\xA9"), 5), kNone);  // inside the é
  EXPECT_EQ(v.family_tail(V::kPlainFamily, at(" caf\xC3\xA9")), 6u);
  EXPECT_EQ(v.family_tail(V::kWordFamily, at(" caf\xC3\xA9")), 6u);
  // A character cut short at the token's end is one unit.
  EXPECT_EQ(v.family_units(V::kTextFamily, at("x\xF0\x9F"), 0), 2u);
  // A continuation byte first begins nothing; the tail starts after it.
  EXPECT_EQ(v.family_tail(V::kTextFamily, at("\x80" "ab")), 1u);
  // The word family stops at the space.
  EXPECT_EQ(v.family_tail(V::kWordFamily, at("a b")), 2u);
  EXPECT_EQ(v.family_tail(V::kPlainFamily, at("a b")), 0u);
  EXPECT_EQ(TokenVocabulary::utf8_character("\xE0\x9F\x80", 0), 0u);  // overlong
  EXPECT_EQ(TokenVocabulary::utf8_character("\xED\xA0\x80", 0), 0u);  // a surrogate
  EXPECT_EQ(TokenVocabulary::utf8_character("\xF4\x8F\xBF\xBF", 0), 4u);
  EXPECT_EQ(TokenVocabulary::utf8_character("\xF4\x90", 0), 0u);  // past U+10FFFF
}

TEST(TokenMask, EndIdsOnlyWhereTheGrammarCanEnd) {
  const auto vocab = synthetic_vocabulary(6);
  const auto grammar = compile_grammar(parse_ebnf(R"(root ::= "ab" | "abc")"));
  const TokenMasker masker(grammar, vocab);
  GrammarMatcher m(grammar);
  std::vector<uint32_t> mask(static_cast<size_t>((vocab->size() + 31) / 32));
  auto allowed = [&](int32_t id) { return (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u; };
  masker.fill(m, mask);
  EXPECT_FALSE(allowed(kEnd));
  ASSERT_TRUE(m.accept_bytes("ab"));
  masker.fill(m, mask);
  EXPECT_TRUE(allowed(kEnd));
  ASSERT_TRUE(m.accept_bytes("c"));
  masker.fill(m, mask);
  EXPECT_EQ(allowed_ids(mask), std::vector<int32_t>{kEnd});  // must end: only the end id
  // Unusable entries are never allowed (id 0, the empty token, ids past the
  // tokens), nor a lone continuation byte; a token that starts a multi-byte
  // character is.
  const auto any = compile_grammar(parse_ebnf("root ::= [\\x00-\\U0010FFFF]*"));
  const TokenMasker any_masker(any, vocab);
  GrammarMatcher a(any);
  any_masker.fill(a, mask);
  const int32_t tokens = static_cast<int32_t>(vocab->sorted().size()) + 3;  // with <unk>, </s> and ""
  EXPECT_FALSE(allowed(0));
  EXPECT_TRUE(allowed(kEnd));
  EXPECT_FALSE(allowed(tokens - 1));
  for (int32_t id = tokens; id < vocab->size(); ++id) EXPECT_FALSE(allowed(id)) << id;
  EXPECT_TRUE(allowed(2 + 'a'));
  EXPECT_FALSE(allowed(2 + 0x80));
  EXPECT_FALSE(allowed(2 + 0xFF));
  EXPECT_TRUE(allowed(2 + 0xE4));
}

}  // namespace
}  // namespace basalt
