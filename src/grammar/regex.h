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
// backspace), alternation, groups (capturing, (?:...), named (?<n>...); the
// names are not checked for duplicates, nothing refers to them),
// quantifiers * + ? {m} {m,} {m,n} and their lazy forms (the same language),
// and the anchors ^ and $ at the start and end of the pattern or of a
// top-level alternative (`^a|b$`).
//
// Refused with basalt::Error naming the construct and its byte offset:
// backreferences (\1-\9, \k<n>), lookahead and lookbehind, \b \B, anchors
// anywhere else (inside a group too), flags and modifier groups (?i),
// Unicode property escapes \p{..} \P{..} (no tables here), octal escapes,
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
#include <string>
#include <string_view>

namespace basalt {

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

}  // namespace basalt
