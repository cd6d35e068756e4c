// The grammar language of structured output: an EBNF dialect that reads
// llama.cpp's GBNF and XGrammar's EBNF, parsed into a Grammar of rules.
//
// Syntax (one rule or more; `#` starts a comment to the end of the line):
//
//   rule     ::= NAME "::=" choice          NAME: [A-Za-z0-9_.-]+ ("root" starts)
//   choice   ::= sequence ("|" sequence)*   an empty sequence matches ""
//   sequence ::= (item)*                    juxtaposition; newlines end a rule
//                                           only where the next line starts
//                                           with "NAME ::="
//   item     ::= primary ("*" | "+" | "?" | "{" M "}" | "{" M "," "}" | "{" M "," N "}")?
//   primary  ::= "\"" chars "\""            a literal (its UTF-8 bytes)
//              | "[" "^"? ranges "]"        a code point class (UTF-8 encoded)
//              | "."                        any code point
//              | NAME                       a rule reference
//              | "(" choice ")"
//
// Inside literals and classes: \n \r \t \\ \" \' \[ \] \- \^ \/ \xHH
// \uHHHH \UHHHHHHHH (code points; surrogates and values past U+10FFFF are
// errors). Classes take single code points and ranges a-b; `^` negates over
// all Unicode scalar values. Text is matched as UTF-8 bytes, so a grammar
// never produces a broken code point unless it is written byte by byte with
// \xHH above 0x7F inside a literal (then those bytes are taken as written).
//
// A rule whose name contains kDistinctRulePrefix ("distinct..", at its start
// or after a prefix that translations put before every rule) writes a
// JSON array or object starting with its first byte, whose items (an
// array's) or member names (an object's) must all differ: JSON Schema's
// uniqueItems, which no context-free grammar can say. The grammar alone
// allows repeats; GrammarConstraint checks them at run time
// (grammar/distinct_json.h). Such rules are never compiled inline, so the
// matcher can tell where one was opened (GrammarMatcher::opened_distinct).
// One whose name contains kOpenDistinctRulePrefix ("distinct..open..") also promises
// that a new element can always follow (its items' values outnumber what
// the array may hold), which spares the check a search at each comma.
//
// A rule whose name contains kBoundedRulePrefix followed by a count and
// "..", as in "bounded..200..title", writes a JSON string (its opening
// quote, JSON-escaped text, its closing quote) that may hold at most that
// many code points once decoded: JSON Schema's maxLength where the
// string's pattern or format is an automaton too large to count lengths in
// (grammar/bounded_string.h). The rule's text must be a regular language;
// the grammar alone allows longer strings, and GrammarConstraint keeps the
// bound at run time. Such rules are never compiled inline either.
//
// Contract: parse_ebnf() throws basalt::Error naming line:column and what is
// wrong (unknown rule, a rule defined twice, bad escape, unbalanced
// bracket, a repetition bound past kMaxRepetition, no root rule). Rules
// that nothing reaches from the root are kept (and compiled) but harmless.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace basalt {

// An expression tree node of a rule's body.
struct GrammarExpr {
  enum class Kind : uint8_t {
    kBytes,     // `bytes`, matched exactly
    kClass,     // one code point in `ranges` (inclusive pairs), or not in them when negated
    kRuleRef,   // the rule `rule`
    kSequence,  // children in order
    kChoice,    // one of the children
    kRepeat,    // children[0] between min and max times (max < 0: unbounded)
  };
  Kind kind = Kind::kSequence;
  std::string bytes;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  bool negated = false;
  int32_t rule = -1;
  int32_t min = 0, max = -1;
  std::vector<GrammarExpr> children;
};

struct GrammarRule {
  std::string name;
  GrammarExpr body;
};

struct Grammar {
  std::vector<GrammarRule> rules;
  int32_t root = 0;

  // The rule's index, -1 when there is none.
  int32_t find(std::string_view name) const;
};

inline constexpr std::string_view kDistinctRulePrefix = "distinct..";
inline constexpr std::string_view kOpenDistinctRulePrefix = "distinct..open..";
inline bool is_distinct_rule(std::string_view name) { return name.find(kDistinctRulePrefix) != std::string_view::npos; }
inline bool is_open_distinct_rule(std::string_view name) {
  return name.find(kOpenDistinctRulePrefix) != std::string_view::npos;
}

inline constexpr std::string_view kBoundedRulePrefix = "bounded..";
// The bound a bounded rule's name gives, none for other names.
std::optional<int64_t> bounded_rule_limit(std::string_view name);

// The largest repetition bound {m,n} the compiler unrolls.
inline constexpr int32_t kMaxRepetition = 10000;

// `root_name` names the start rule.
Grammar parse_ebnf(std::string_view text, std::string_view root_name = "root");

// The text of `value` as an EBNF literal ("...", escaped), for generators.
std::string ebnf_literal(std::string_view value);

}  // namespace basalt
