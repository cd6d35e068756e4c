// DistinctJson: what a grammar cannot say about JSON — that an array's items
// differ from each other (JSON Schema's uniqueItems), or an object's member
// names do — kept over the text a GrammarMatcher accepts, and taken out of
// its token masks.
//
// Which arrays and objects: those opened by the first byte of a distinct
// rule (grammar/ebnf.h); GrammarMatcher::opened_distinct() tells, right
// after that byte, so the text around them need not be JSON (a tool call's
// tags). Inside one the text is JSON, and an element (an item; a member
// name) is compared once complete with the ones before it as a JSON value:
// 1 and 1.0 are one number, "\u0041" and "A" one string, and objects are
// equal whatever the order of their members.
//
// filter() clears from a mask the tokens that would
//   1. complete an element equal to an earlier one, or
//   2. leave an element that can only end equal to an earlier one: a
//      finite domain running out (an enum's values, a bounded integer, a
//      short pattern). A depth-first search of the grammar's continuations
//      after the token looks for a new value. It runs only where the
//      element's text so far is empty (a new element) or begins an earlier
//      element's text: elsewhere the text already differs. It skips
//      whitespace between JSON tokens (a JSON grammar never needs it) and
//      gives up after kSearchBudget bytes, keeping the token.
// If that would leave no token, the mask is left as the grammar made it:
// the schema's arrays cannot be unique (minItems past what its items can
// be), and the grammar's own guarantee — a mask is never empty — wins.
//
// JSON Schema's translation uses distinct rules for uniqueItems arrays
// only. Objects with additionalProperties (and json_object) would keep a
// model from writing a member name twice, but the filter's scan of the
// vocabulary's quote-holding tokens then runs at every step inside such
// objects: on Llama 3's vocabulary it took the grammar bench's cache-filled
// masks from p50 1.7 to 3.4-7 us and p90 4.8 to 39-60 us, so it waits for a
// cheaper way to find the tokens that can close a name.
//
// Contract: accept() takes every byte the matcher accepted, in order, with
// whether it opened a distinct container (ask the matcher after each byte
// for which wants_opener() was true); rewind(n) goes back to the first n
// bytes. filter() leaves the matcher and this as it found them. One
// instance per matcher, used by one thread.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/matcher.h"

namespace basalt {

class TokenVocabulary;

class DistinctJson {
 public:
  static constexpr int kSearchBudget = 4096;

  // Whether `byte`, accepted next, could open a container: the caller asks
  // the matcher whether it did.
  bool wants_opener(uint8_t byte) const {
    return (byte == '[' || byte == '{') && !(in_string_ && !frames_.empty());
  }
  using Distinct = GrammarMatcher::Distinct;
  void accept(uint8_t byte, Distinct opened) { push(byte, opened); }
  size_t size() const { return text_.size(); }
  void rewind(size_t n);

  void filter(GrammarMatcher& matcher, const TokenVocabulary& vocabulary, std::span<uint32_t> words);

  // Open containers, the innermost last (tests).
  size_t depth() const { return frames_.size(); }

 private:
  struct Frame {
    bool array = true;
    bool distinct = false;
    bool open = false;      // a new element can always follow (kOpen)
    bool key_next = false;  // an object's next string is a member name
    int64_t start = -1;     // where the current element's text began; -1: not yet
    std::multiset<std::string> texts;  // the earlier elements' texts (distinct frames)
    std::vector<nlohmann::json> values;  // and their values, in order
  };
  // What one byte did: completed an element of frame `frame`, new or a repeat.
  struct Outcome {
    enum Kind : uint8_t { kNothing, kNew, kRepeat } kind = kNothing;
    size_t frame = 0;
  };
  struct Undo {
    enum Kind : uint8_t { kScalars, kAdded, kPushed, kPopped };
    Undo(Kind k, size_t before) : kind(k), at(before) {}
    Kind kind;
    size_t at;  // the text's size before the byte
    bool in_string = false, escaped = false, key_string = false, key_next = false;
    int64_t start = -1;
    std::string text;              // kAdded: the element's text
    std::unique_ptr<Frame> frame;  // kPopped
  };

  Outcome push(uint8_t byte, Distinct opened);
  Outcome complete(Frame& f, size_t end);
  void push_frame(bool array, Distinct opened, size_t at);
  // The outermost frame whose current element could still be forced to
  // repeat an earlier one (see the header comment), if any.
  std::optional<size_t> risky_frame() const;
  bool search(GrammarMatcher& matcher, size_t frame, int& budget, int depth);
  // Whether `witness_` (the bytes the last search succeeded with) also ends
  // frame `frame`'s element as a new value from here: most candidates of a
  // mask (`",` `.",` `!",`) leave the same state, which the same bytes
  // continue, so one search serves them all.
  bool witness_holds(GrammarMatcher& matcher, size_t frame);

  std::string text_;
  std::vector<Frame> frames_;
  bool in_string_ = false, escaped_ = false, key_string_ = false;
  std::vector<Undo> undo_;
  std::string path_;     // the bytes of the search's current path
  std::string witness_;  // see witness_holds()
};

}  // namespace basalt
