// Bounded strings: a JSON string whose length (in code points, as JSON
// Schema's maxLength counts them) a grammar does not bound, kept within
// its bound at run time.
//
// Why: a length bound is a counter, and a pattern or format is an
// automaton; written as one grammar they are their product. A uri
// (hundreds of states) up to 255 code points, or "at most 20 words"
// (`^(?:\S+\s+){0,19}\S+$`) up to 200, is tens of thousands of states,
// past what a request may compile. So the grammar writes the string
// unbounded, in a rule named with kBoundedRulePrefix and the bound
// (grammar/ebnf.h), and the bound is kept here, over the text the matcher
// accepts, by taking from each mask the tokens that would leave the string
// unable to close within it.
//
// BoundedText is such a rule, compiled once with the grammar: its text as
// a deterministic automaton over code points (RegexLanguage::of_rule, the
// quotes included), and for every state the fewest code points the
// decoded string still needs before its closing quote. The string's text is
// JSON-escaped, as the grammar writes it: `\n` and `\u000a` are one code
// point each, so the count follows the escapes (an escape's phase is kept
// beside the automaton's state).
//
// BoundedStrings keeps one request's place. After the matcher accepts an
// opening quote, GrammarMatcher::opened_bounded() says which bounded rule
// (if any) it opened; begin() starts counting there, accept() takes every
// byte after it, and the string ends at its closing quote. filter() clears
// the tokens after which the string could not close in time: a token fits
// when the code points it adds, and the fewest the state it leaves still
// needs, stay within the bound (a token that closes the string fits when
// its code points before the quote do). A token of n bytes adds at most n
// code points, so only tokens longer than the room left, less the most
// the states a few code points on need, are walked: none until the string
// nears its bound, and then those the mask allows, in byte order, each from
// the bytes it shares with the one before.
//
// Contract: the mask is never emptied. Each token kept leaves a way to
// close in time (the fewest-code-points path from its state), and a byte
// of that path is a token of the vocabulary wherever the grammar's own
// masks are never empty. Where a parse other than the bounded rule's also
// reads the string (an anyOf of strings) the bound still holds: tokens
// must keep the bounded rule's text alive, unless its automaton has died
// (the text left its language), when the other parse alone goes on
// unfiltered. One instance per matcher, used by one thread; snapshot()
// and restore() take it back to an earlier token.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "grammar/regex.h"

namespace basalt {

struct Grammar;
class TokenVocabulary;

class BoundedText {
 public:
  // Rule `rule` of `grammar`, whose text is a JSON string of at most
  // `max_length` code points once decoded (the rule may begin otherwise
  // too; only its strings are counted). Throws basalt::Error when the rule
  // is not a regular language (RegexLanguage::of_rule) or its strings
  // cannot close within the bound.
  BoundedText(const Grammar& grammar, int32_t rule, int64_t max_length);

  // Where the string stands: the automaton's state, the escape phase, a
  // code point whose UTF-8 bytes are still coming, and the code points
  // counted so far (a pending one included).
  struct Cursor {
    uint32_t state = 0;
    uint8_t phase = 0;     // kPlain, or how far into an escape
    uint8_t need = 0;      // continuation bytes still to come
    uint8_t length = 0;    // the pending code point's UTF-8 length
    uint32_t partial = 0;  // the pending code point's bits so far
    int64_t count = 0;
    bool closed = false;   // the closing quote was read
  };
  Cursor start() const;
  // Takes one byte; false when the rule's text cannot (the cursor is then
  // unspecified).
  bool advance(Cursor& c, uint8_t byte) const;
  // Whether the string can still close within its bound from `c`.
  bool fits(const Cursor& c) const;

  int64_t max_length() const { return max_length_; }
  // Tokens of at most kNear bytes are judged without a walk: they fit when
  // their length, plus the most any state within kNear code points of the
  // cursor's needs, is within the room left.
  static constexpr int kNear = 16;
  // The most any state that can close needs.
  int64_t most_needed() const { return most_needed_; }
  int64_t most_needed_near(const Cursor& c) const {
    return most_near_[static_cast<size_t>(c.state) * kPhases + (c.need > 0 ? kPlain : c.phase)];
  }

 private:
  // Escape phases: plain text, after `\`, and after `\u` with 0-3 hex digits.
  static constexpr uint8_t kPlain = 0, kBackslash = 1, kHex0 = 2, kHex3 = 5, kPhases = 6;
  static constexpr int64_t kNever = INT64_MAX;
  bool take(Cursor& c, uint32_t code_point) const;
  int64_t needed(uint32_t state, uint8_t phase) const {
    return needed_[static_cast<size_t>(state) * kPhases + phase];
  }

  RegexLanguage text_;
  std::vector<uint32_t> ascii_next_;  // per state * 0x80 + an ASCII code point: text_.next()
  int64_t max_length_;
  uint32_t start_ = 0;           // the state after the opening quote
  std::vector<int64_t> needed_;  // per state * kPhases + phase; kNever when it cannot close
  // Per state * kPhases + phase: the most `needed_` of a state that can
  // still close, over those kNear code points or fewer on.
  std::vector<int64_t> most_near_;
  int64_t most_needed_ = 0;
};

// A bounded rule of a compiled grammar: the automaton state its opening
// quote leads to, and its text.
struct BoundedRegion {
  int32_t opener = -1;
  std::shared_ptr<const BoundedText> text;
};

class BoundedStrings {
 public:
  // The string opened by a quote of region `region`'s rule begins.
  void begin(const BoundedRegion& region);
  bool active() const { return text_ != nullptr; }
  // A byte accepted after begin(); the string ends at its closing quote, or
  // stops being followed where its automaton dies (another parse's text).
  void accept(uint8_t byte);
  void filter(const TokenVocabulary& vocabulary, std::span<uint32_t> words) const;

  struct Snapshot {
    const BoundedText* text = nullptr;
    BoundedText::Cursor cursor;
  };
  Snapshot snapshot() const { return {text_, cursor_}; }
  void restore(const Snapshot& s) {
    text_ = s.text;
    cursor_ = s.cursor;
  }

 private:
  const BoundedText* text_ = nullptr;  // owned by the compiled grammar
  BoundedText::Cursor cursor_;
};

}  // namespace basalt
