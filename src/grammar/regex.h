// Regular expressions (the ECMAScript syntax JSON Schema's `pattern` and
// vLLM's guided_regex use) translated into EBNF rules (grammar/ebnf.h).
//
// The pattern is UTF-8 and read as code points, with the meaning the `u`
// flag gives (`.` and classes take one code point, \u{...} is one code
// point, and so is the surrogate pair \uD83D\uDE00).
//
// Supported: literals and escapes (\n \r \t \f \v \0 \xHH \uHHHH \u{H...}
// \cX, and escaped ASCII punctuation such as \. \/ \- \"), `.` (any code
// point but LF, CR, U+2028, U+2029), classes [...] and [^...] with ranges
// and the escapes \d \D \w \W \s \S inside and outside them ([\b] is
// backspace), Unicode general categories \p{L} \P{Nd} (short or long
// names, gc= optional; the tokenizer's Unicode tables), alternation, groups (capturing, (?:...), named (?<n>...); the
// names are not checked for duplicates, nothing refers to them),
// quantifiers * + ? {m} {m,} {m,n} and their lazy forms (the same language),
// and the anchors ^ and $ at the start and end of the pattern or of a
// top-level alternative (`^a|b$`), a non-capturing or capturing group that
// is a whole top-level alternative counting as its alternatives
// (`^$|(^a+$)`), and lookaheads (?=...) and (?!...) anywhere but inside
// another or under a quantifier, whose alternatives may end with `$`.
// A lookahead constrains all the text after it, so a pattern that has one
// is written from its automaton (RegexLanguage: a product of the pattern
// and each lookahead's language, within its state limit).
//
// Refused with basalt::Error naming the construct and its byte offset:
// backreferences (\1-\9, \k<n>), lookbehind, \b \B, anchors
// anywhere else (inside a group too), flags and modifier groups (?i),
// other Unicode properties (scripts, binary ones), octal escapes,
// lone surrogates, escaped letters without a meaning above (\a, \z, ...),
// a `{` that does not start a quantifier (Annex B reads it as a literal,
// other dialects read {,n} as a quantifier) and a lone `]` or `}` (write
// \{ \] \} for the characters), quantifiers with nothing to repeat,
// classes with a range out of order ([z-a]) or with \d-like bounds
// ([\d-z]), classes that match nothing ([], [^\s\S]), bounds with m > n or
// past kMaxRepetition, unbalanced brackets, groups nested past 200, and a
// pattern that is not UTF-8.
//
// Contract: the rules describe exactly the strings the regex accepts under
// `mode`, as UTF-8. Rule names all begin with `prefix` (which must be made
// of EBNF name characters) so that several translations can share one
// grammar: the root is prefix + "root", helper rules prefix + a number.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace basalt {

struct Grammar;

struct RegexRules {
  std::string rules;  // EBNF text: one or more rules
  std::string root;   // the rule that matches the whole language
};

enum class RegexMode : uint8_t {
  // The whole text must match (vLLM's guided_regex): ^ and $ are implied.
  kFullMatch,
  // JSON Schema's `pattern`: the regex may match anywhere in the text, so an
  // unanchored side accepts any code points around the match.
  kSearch,
};

// `json_escaped`: the rules produce the text as it appears inside a JSON
// string literal, in the form nlohmann::json::dump() writes it: `"` and `\`
// escaped, U+0000-U+001F as \b \f \n \r \t or \u00XX (lowercase hex), all
// else raw UTF-8. So a pattern's class [^a] never lets a bare `"` end the
// string.
RegexRules regex_to_ebnf(std::string_view pattern, RegexMode mode, bool json_escaped, std::string_view prefix);

// The language of regular expressions as a minimal deterministic automaton
// over Unicode scalar values, closed under intersection and complement.
// JSON Schema needs it where patterns meet: a member name of an object with
// patternProperties takes the schema of every pattern it matches and
// additionalProperties' only when it matches none, so the grammar writes one
// member form per combination of patterns, and each combination's names are
// an intersection of patterns and complements (less the listed names).
//
// Contract: every value describes a set of strings exactly, by a total
// automaton whose states are all reachable; automata up to kMinimizeLimit
// states (and kMinimizeCells) are minimal; one past kMaxStates states (a
// pattern such as (a|b)*a(a|b){20}, or a product that blows up) throws
// basalt::Error, as do the patterns regex_to_ebnf refuses.
class RegexLanguage {
 public:
  static constexpr size_t kMaxStates = 4096;
  // Automata up to this many states are minimized; larger ones only have
  // their dead states merged (see minimized()) ...
  static constexpr size_t kMinimizeLimit = 4096;
  // ... and when their states times the code point intervals their edges
  // tell apart are at most this many (the minimization's tables).
  static constexpr size_t kMinimizeCells = size_t{1} << 20;

  // The strings `pattern` matches under `mode`.
  static RegexLanguage of_pattern(std::string_view pattern, RegexMode mode);
  // Exactly `texts` (UTF-8; text that is not valid UTF-8 is left out).
  static RegexLanguage of_strings(const std::vector<std::string>& texts);
  // Every string.
  static RegexLanguage all();
  // The strings of `min` to `max` code points (no upper bound when max < 0).
  static RegexLanguage of_length(int64_t min, int64_t max);
  // The text rule `rule` of `grammar` (grammar/ebnf.h) writes, as code
  // points. A reference in tail position (nothing follows it in its rule)
  // continues where the referring rule would end, so rules that call each
  // other last (right-linear ones, as to_ebnf() writes) are loops; any
  // other reference is built afresh where it stands. Throws basalt::Error
  // where that never ends (a rule that reaches itself through a reference
  // something follows: not a regular language), for bytes that are not
  // UTF-8, and past kMaxStates.
  static RegexLanguage of_rule(const Grammar& grammar, int32_t rule);

  RegexLanguage intersect(const RegexLanguage& other) const;
  RegexLanguage complement() const;
  RegexLanguage minus(const RegexLanguage& other) const { return intersect(other.complement()); }

  bool empty() const;
  bool is_all() const;
  bool contains(std::string_view utf8) const;
  size_t state_count() const { return states_.size(); }
  // The fewest code points of a string in the language; none when empty.
  std::optional<int64_t> shortest() const;

  // The automaton itself, for walks that step it one code point at a time
  // (grammar/bounded_string.h). State 0 is the start; every state's edges
  // are sorted and cover every scalar value once.
  struct Edge {
    uint32_t lo = 0, hi = 0;  // inclusive code points
    uint32_t target = 0;
  };
  bool accepting(uint32_t state) const { return states_[state].accepting; }
  std::span<const Edge> edges(uint32_t state) const { return states_[state].edges; }
  // Where code point `c` (a scalar value) leads from `state`.
  uint32_t next(uint32_t state, uint32_t c) const;

  // EBNF rules for the language (which must not be empty), as
  // regex_to_ebnf writes them: raw UTF-8 or JSON-escaped string content,
  // every rule name beginning with `prefix`, the root prefix + "root".
  RegexRules to_ebnf(bool json_escaped, std::string_view prefix) const;

 private:
  struct State {
    bool accepting = false;
    // Sorted; together they cover every scalar value once (a rejecting
    // sink stands for "no way on").
    std::vector<Edge> edges;
  };
  explicit RegexLanguage(std::vector<State> states) : states_(std::move(states)) {}
  // The same language, reachable states only, minimal up to kMinimizeLimit
  // states (state 0 the start).
  static RegexLanguage minimized(std::vector<State> states);
  static std::vector<bool> live_states(const std::vector<State>& states);
  std::vector<State> states_;  // state 0 is the start
};

}  // namespace basalt
