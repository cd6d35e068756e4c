// The EBNF parser and the matcher: which texts a grammar accepts, byte by
// byte, with rollback; and the grammars the compiler refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/automaton.h"
#include "grammar/ebnf.h"
#include "grammar/matcher.h"

namespace basalt {
namespace {

bool matches(const std::string& ebnf, const std::string& text) { return grammar_matches(parse_ebnf(ebnf), text); }

std::string error_of(const std::string& ebnf) {
  try {
    compile_grammar(parse_ebnf(ebnf));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Ebnf, LiteralsClassesAndRepetition) {
  EXPECT_TRUE(matches(R"(root ::= "ab" "c")", "abc"));
  EXPECT_FALSE(matches(R"(root ::= "ab" "c")", "ab"));
  EXPECT_FALSE(matches(R"(root ::= "ab" "c")", "abcd"));
  EXPECT_TRUE(matches(R"(root ::= [a-c]+ [0-9]?)", "abcabc7"));
  EXPECT_FALSE(matches(R"(root ::= [a-c]+ [0-9]?)", "abd"));
  EXPECT_FALSE(matches(R"(root ::= [a-c]+)", ""));
  EXPECT_TRUE(matches(R"(root ::= [^"\\]*)", "plain text, no quote"));
  EXPECT_FALSE(matches(R"(root ::= [^"\\]*)", "a\"b"));
  EXPECT_TRUE(matches(R"(root ::= "x"{2,3})", "xx"));
  EXPECT_TRUE(matches(R"(root ::= "x"{2,3})", "xxx"));
  EXPECT_FALSE(matches(R"(root ::= "x"{2,3})", "x"));
  EXPECT_FALSE(matches(R"(root ::= "x"{2,3})", "xxxx"));
  EXPECT_TRUE(matches(R"(root ::= "x"{2,})", "xxxxxxx"));
  EXPECT_TRUE(matches(R"(root ::= "x"{0})", ""));
  EXPECT_TRUE(matches(R"(root ::= ("a" | "b" "c")* "d")", "abcad"));
  EXPECT_FALSE(matches(R"(root ::= ("a" | "b" "c")* "d")", "abd"));
  EXPECT_TRUE(matches(R"(root ::= )", ""));
  EXPECT_TRUE(matches("root ::= \"\\n\\t\\\\\\\"\" # a comment\n", "\n\t\\\""));
}

TEST(Ebnf, UnicodeIsMatchedAsUtf8) {
  // Classes of code points of every UTF-8 length, and a negated class that
  // must take whole multi-byte characters.
  const std::string g = R"(root ::= [a\u00e9\u4e00-\u9fff\U0001F600-\U0001F64F]+)";
  EXPECT_TRUE(matches(g, "a\xC3\xA9\xE4\xB8\x80\xE9\xBE\xA5\xF0\x9F\x98\x80"));
  EXPECT_FALSE(matches(g, "\xC3\xA8"));          // è
  EXPECT_FALSE(matches(g, "\xF0\x9F\x99\x90"));  // U+1F650, past the range
  EXPECT_TRUE(matches(R"(root ::= [^a]+)", "\xE2\x82\xAC\xF0\x9F\x98\x80z"));
  EXPECT_FALSE(matches(R"(root ::= [^a]+)", "\xE2\x82"));  // a cut character
  EXPECT_FALSE(matches(R"(root ::= [^a]+)", "\xED\xA0\x80"));  // a surrogate
  EXPECT_TRUE(matches(R"(root ::= .)", "\xF4\x8F\xBF\xBF"));
  EXPECT_TRUE(matches("root ::= \"\xC3\xA9t\xC3\xA9\"", "\xC3\xA9t\xC3\xA9"));
  // Classes given as raw UTF-8 text.
  EXPECT_TRUE(matches("root ::= [\xC3\xA0-\xC3\xBF]", "\xC3\xA9"));
}

TEST(Ebnf, RulesCallEachOtherAndRecurse) {
  const std::string nested = R"g(
    root  ::= value
    value ::= "(" value* ")" | atom
    atom  ::= [a-z]+
  )g";
  EXPECT_TRUE(matches(nested, "(ab(c)((d)))"));
  EXPECT_TRUE(matches(nested, "abc"));
  EXPECT_FALSE(matches(nested, "(ab(c)"));
  EXPECT_FALSE(matches(nested, "(ab))"));
  // Nullable rules in loops terminate (the stack does not grow).
  EXPECT_TRUE(matches("root ::= item* \"!\"\nitem ::= \"a\"?", "aaa!"));
  EXPECT_TRUE(matches("root ::= item* \"!\"\nitem ::= \"a\"?", "!"));
  // Right recursion is fine at any depth.
  std::string deep(5000, 'a');
  EXPECT_TRUE(matches("root ::= \"a\" root | \"\"", deep));
  // GBNF rule separation: a rule ends where the next "name ::=" begins.
  EXPECT_TRUE(matches("root ::= a\n  b\na ::= \"x\"\nb ::= \"y\"", "xy"));
}

TEST(Ebnf, SmallRulesRepeatedInARuleCompileInline) {
  // `item` (and `esc` through it) is repeated in root: its bytes are copied
  // into root's automaton. `mark` is called once but reads one character
  // and calls nothing: copied too. `tail` is called once and is larger,
  // `value` is recursive: both stay calls.
  const std::string text = R"g(
    root  ::= "[" item* "]" mark tail value*
    item  ::= [a-c] | esc
    esc   ::= "\\" [nt]
    mark  ::= [!?]
    tail  ::= "and after the mark, a tail longer than one character's worth of bytes" ("." | "!")
    value ::= "(" value* ")"
  )g";
  const Grammar grammar = parse_ebnf(text);
  const auto compiled = compile_grammar(grammar);
  std::vector<std::string> called;
  for (size_t s = 0; s < compiled->states.size(); ++s) {
    const AutomatonState& state = compiled->states[s];
    if (state.rule != grammar.root) continue;
    for (uint32_t c = state.calls_begin; c < state.calls_end; ++c)
      called.push_back(compiled->rule_names[static_cast<size_t>(compiled->calls[c].rule)]);
  }
  std::sort(called.begin(), called.end());
  called.erase(std::unique(called.begin(), called.end()), called.end());
  EXPECT_EQ(called, (std::vector<std::string>{"tail", "value"}));
  const std::string tail = "and after the mark, a tail longer than one character's worth of bytes.";
  EXPECT_TRUE(matches(text, "[ab\\nc\\t]!" + tail + "(())()"));
  EXPECT_TRUE(matches(text, "[]?" + tail));
  EXPECT_FALSE(matches(text, "[a\\x]!" + tail));
  EXPECT_FALSE(matches(text, "[a]" + tail));
  EXPECT_FALSE(matches(text, "[ad]!"));
}

TEST(Ebnf, InliningIntoOneRuleIsBounded) {
  // A thousand repeated sites of a character rule: past the rule's inline
  // budget the sites stay calls, so the automaton stays small.
  std::string text = "root ::= ";
  for (int i = 0; i < 1000; ++i) text += (i ? " | \"k" : "\"k") + std::to_string(i) + "\" c* \"!\"";
  text += "\nc ::= [a-z\\u00e0-\\u00ff] | \"%\" [0-9a-f] [0-9a-f] | \"%u\" [0-9a-f]{4}\n";
  const auto compiled = compile_grammar(parse_ebnf(text));
  EXPECT_LT(compiled->states.size(), 6000u);  // 10,013 when every site is inlined
  EXPECT_TRUE(matches(text, "k17ab%0f\xC3\xA9!"));
  EXPECT_TRUE(matches(text, "k999%u00ffz!"));
  EXPECT_FALSE(matches(text, "k1000!"));
}

// A pattern written as rules, one per state, each reading a character
// class (a rule) then calling the next state. A few states copy the
// classes in; thousands of them (a schema with several "at most 200
// words" patterns) keep the calls, so the automaton stays within bounds.
TEST(Ebnf, OneCharacterRulesCalledOnceCompileInlineWithinAGrammarBudget) {
  const auto chain = [](int states) {
    std::string text = "root ::= \"[\" q0 \"]\"\n";
    for (int i = 0; i < states; ++i) {
      const std::string next = i + 1 < states ? " q" + std::to_string(i + 1) : "";
      text += "q" + std::to_string(i) + " ::= w+" + (next.empty() ? "" : " (s" + next + " | \"\")") + "\n";
    }
    text += "w ::= [^ \\u00a0\\u2000-\\u200a\\]] | \"\\\\\" [n\"]\n";
    text += "s ::= [ \\u00a0\\u2000-\\u200a] | \"\\\\t\" | \"\\\\u0020\" | \"\\\\u00a0\"\n";
    return text;
  };
  const auto calls_of = [](const std::string& text, const std::string& rule) {
    const Grammar grammar = parse_ebnf(text);
    const auto compiled = compile_grammar(grammar);
    int calls = 0;
    for (size_t c = 0; c < compiled->calls.size(); ++c)
      if (compiled->rule_names[static_cast<size_t>(compiled->calls[c].rule)] == rule) ++calls;
    return std::make_pair(calls, compiled->states.size());
  };
  const std::string few = chain(20);
  EXPECT_EQ(calls_of(few, "s").first, 0);
  EXPECT_TRUE(matches(few, "[ab c\xE2\x80\x82" "d\\n\\te]"));
  EXPECT_FALSE(matches(few, "[ab  c]"));
  const std::string many = chain(2000);
  const auto [calls, states] = calls_of(many, "s");
  EXPECT_GT(calls, 0);
  EXPECT_LT(states, 200000u);
  EXPECT_TRUE(matches(many, "[a b\xC2\xA0" "c]"));
}

TEST(Ebnf, ALongChainOfRulesCompiles) {
  // Fifty thousand rules, each calling the next (in a repetition, so that
  // the inliner weighs them): neither the inliner (a depth cap), the search
  // for recursive rules (an explicit stack), nor the productive / nullable
  // analyses (a worklist; a pass per rule of the chain took minutes) recurse
  // or loop along the chain.
  constexpr int kRules = 50000;
  std::string text = "root ::= (r0 \"!\")*\n";
  for (int i = 0; i < kRules; ++i)
    text += "r" + std::to_string(i) + " ::= \"a\" " + (i + 1 < kRules ? "r" + std::to_string(i + 1) : "\"\"") + "\n";
  const auto compiled = compile_grammar(parse_ebnf(text));
  EXPECT_GT(compiled->states.size(), static_cast<size_t>(kRules));
  EXPECT_TRUE(matches(text, std::string(kRules, 'a') + "!"));
  EXPECT_FALSE(matches(text, std::string(kRules - 1, 'a') + "!"));

  // Each rule calling the next before any byte: the search for left
  // recursion walks the chain without recursing.
  std::string left = "root ::= l0\n";
  for (int i = 0; i < kRules; ++i)
    left += "l" + std::to_string(i) + " ::= " + (i + 1 < kRules ? "l" + std::to_string(i + 1) + " " : "") + "\"b\"\n";
  EXPECT_EQ(error_of(left), "");
  // The same chain closed into a cycle: left-recursive, and said so.
  std::string cycle = left;
  cycle.replace(cycle.rfind("\"b\""), 3, "l0 \"b\" | \"b\"");
  EXPECT_NE(error_of(cycle).find("is left-recursive"), std::string::npos);
}

TEST(Ebnf, ParseErrorsNameThePlace) {
  auto parse_error = [](const std::string& text) -> std::string {
    try {
      parse_ebnf(text);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(parse_error("root ::= \"abc").find("1:10: unterminated literal"), std::string::npos);
  EXPECT_NE(parse_error("root ::= foo").find("\"foo\" is referenced but not defined"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"\nroot ::= \"b\"").find("2:1: rule \"root\" is defined twice"),
            std::string::npos);
  EXPECT_NE(parse_error("start ::= \"a\"").find("no rule named \"root\""), std::string::npos);
  EXPECT_NE(parse_error("root ::= [z-a]").find("is empty"), std::string::npos);
  EXPECT_NE(parse_error("root ::= (\"a\"").find("unbalanced ("), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\")").find("unbalanced )"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"{3,2}").find("below its minimum"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"{99999}").find("past the limit"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(parse_error("root ::= [\\uD800]").find("not a Unicode scalar value"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\" @").find("unexpected character '@'"), std::string::npos);
  EXPECT_NE(parse_error("").find("no rules"), std::string::npos);
  // Groups and quantifiers nest the parse and the compile: both are bounded.
  EXPECT_EQ(parse_error("root ::= " + std::string(1000, '(') + "\"a\"" + std::string(1000, ')')), "");
  EXPECT_NE(parse_error("root ::= " + std::string(100000, '(') + "\"a\"" + std::string(100000, ')'))
                .find("groups nested deeper than 1000"),
            std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"" + std::string(100000, '?')).find("more than 1000 quantifiers in a row"),
            std::string::npos);
}

TEST(Ebnf, CompilerRefusesLeftRecursionAndEmptyLanguages) {
  EXPECT_NE(error_of("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= x\nx ::= e y\ny ::= x \"a\" | \"b\"\ne ::= \"\"?").find("left-recursive"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= loop\nloop ::= \"a\" loop").find("matches no text"), std::string::npos);
  // An unproductive branch is dropped, the rest stays.
  EXPECT_EQ(error_of("root ::= \"a\" | never\nnever ::= \"b\" never"), "");
  EXPECT_TRUE(matches("root ::= \"a\" | never\nnever ::= \"b\" never", "a"));
  EXPECT_FALSE(matches("root ::= \"a\" | never\nnever ::= \"b\" never", "b"));
}

TEST(GrammarMatcher, AcceptsPieceByPieceAndRollsBack) {
  GrammarMatcher m(compile_grammar(parse_ebnf(R"(root ::= "{" ("\"k\":" [0-9]+) "}")")));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_bytes("{\"k"));
  EXPECT_FALSE(m.accept_bytes("x"));  // refused: nothing changes
  EXPECT_TRUE(m.accept_bytes("\":1"));
  EXPECT_TRUE(m.accept_bytes("2"));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_bytes("}"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.must_end());
  EXPECT_EQ(m.history(), 4);
  m.rollback(2);
  EXPECT_EQ(m.history(), 2);
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.must_end());
  EXPECT_TRUE(m.accept_bytes("34}"));
  EXPECT_TRUE(m.can_end());
  m.rollback(3);
  EXPECT_EQ(m.history(), 0);
  EXPECT_TRUE(m.accept_bytes("{\"k\":5}"));
  EXPECT_TRUE(m.can_end());
  EXPECT_THROW(m.rollback(2), Error);
}

TEST(GrammarMatcher, CanEndAndContinue) {
  GrammarMatcher m(compile_grammar(parse_ebnf(R"(root ::= [0-9]+ ("." [0-9]+)?)")));
  EXPECT_TRUE(m.accept_bytes("12"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.must_end());
  EXPECT_TRUE(m.accept_bytes("."));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_bytes("5"));
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarMatcher, ForcedBytesAreWhatEveryContinuationStartsWith) {
  GrammarMatcher m(compile_grammar(parse_ebnf(R"(root ::= "{\"key\": " ("true" | "tree" | [0-9]+) "}")")));
  EXPECT_EQ(m.forced_bytes(100), "{\"key\": ");
  EXPECT_EQ(m.forced_bytes(3), "{\"k");
  EXPECT_EQ(m.history(), 0);  // nothing was accepted
  ASSERT_TRUE(m.accept_bytes("{\"key\": t"));
  EXPECT_EQ(m.forced_bytes(100), "r");  // then "ue" or "ee"
  ASSERT_TRUE(m.accept_bytes("re"));
  EXPECT_EQ(m.forced_bytes(100), "e}");
  ASSERT_TRUE(m.accept_bytes("e}"));
  EXPECT_EQ(m.forced_bytes(100), "");  // complete
  // Where the text may end, nothing is forced, even if only one byte could follow.
  GrammarMatcher optional(compile_grammar(parse_ebnf(R"(root ::= "a" "b"?)")));
  ASSERT_TRUE(optional.accept_bytes("a"));
  EXPECT_EQ(optional.forced_bytes(100), "");
}

// Two rules that read the same text and nest inside each other (JSON
// Schema's anyOf of two object types that both start with the same member):
// each level doubles the ways to parse, so stacks kept one per way would be
// 2^depth. Joins keep one stack per top state: depth 60 is quick, and the
// language is still exactly right (the closing letters say which rule each
// level was).
TEST(GrammarMatcher, NestedAmbiguityStaysLinear) {
  const std::string ebnf = R"(
    root ::= a | b
    a ::= "{" (a | b)? "}" "x"?
    b ::= "{" (a | b)? "}" "y"
  )";
  const auto grammar = compile_grammar(parse_ebnf(ebnf));
  std::string text(60, '{');
  for (int i = 0; i < 60; ++i) text += i % 3 == 0 ? "}y" : i % 3 == 1 ? "}x" : "}";
  GrammarMatcher m(grammar);
  for (char c : text) ASSERT_TRUE(m.accept_bytes(std::string(1, c)));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(matches(ebnf, "{{}y}"));
  EXPECT_FALSE(matches(ebnf, "{{}yy}"));
  EXPECT_FALSE(matches(ebnf, "{{}}}"));
  GrammarMatcher deep(grammar);
  ASSERT_TRUE(deep.accept_bytes(std::string(60, '{')));
  EXPECT_FALSE(deep.accept_bytes("}z"));
  EXPECT_TRUE(deep.accept_bytes("}y}x}"));
  deep.rollback(1);
  EXPECT_TRUE(deep.accept_bytes("}}"));
}

TEST(Ebnf, LiteralHelperRoundTrips) {
  const std::string value = "a\"b\\c\nd\te\x01\xC3\xA9";
  EXPECT_TRUE(matches("root ::= " + ebnf_literal(value), value));
  EXPECT_FALSE(matches("root ::= " + ebnf_literal(value), "a\"b"));
}

}  // namespace
}  // namespace basalt
