// Token masks: which tokens of a model's vocabulary a grammar allows next.
//
// TokenVocabulary holds each token's bytes (what it adds to the text in the
// middle of a stream), sorted so that tokens sharing a prefix are walked
// once. TokenMasker computes a matcher's mask: for every stack the matcher
// holds, the tokens that the top rule alone accepts or rejects, whatever
// lies deeper in the stack, are cached per stack top (a state and its
// callers' states) the
// first time that top is met (the idea of XGrammar's adaptive token-mask
// cache; the callers' states are part of the key so that returns into them
// are decided too); only the tokens left undecided, those that return below
// the callers the key knows with bytes to spare, are walked against the
// real stack at each step. The whole vocabulary is walked once per state;
// an entry with one more caller walks only the tokens the shorter one left
// undecided. A walk reads a token's first bytes only where a stack it holds
// reads the rest as a run of one unit family (a string's, a word's or a
// label's characters, UTF-8 included: UnitReach), so that a state is a
// walk of about the vocabulary's distinct beginnings.
//
// Contract: a TokenMasker is shared by every request using the same grammar
// and vocabulary, from any thread (its cache is locked). Special tokens,
// tokens with no bytes and ids past the tokenizer's vocabulary are never
// allowed, except `end_ids` (the model's end-of-sequence tokens), which are
// allowed exactly when the grammar can end. The mask a matcher gets is never
// empty: a trimmed grammar can always be continued or ended.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.h"

namespace basalt {

class Tokenizer;

class TokenVocabulary {
 public:
  // `bytes[id]` is token id's text; `usable[id]` false for tokens a
  // grammar never allows (special, empty). `size` is the model's vocabulary
  // (logits row width), which may exceed bytes.size().
  TokenVocabulary(std::vector<std::string> bytes, std::vector<bool> usable, int32_t size,
                  std::vector<int32_t> end_ids);
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tokenizer, int32_t model_vocab_size,
                                                               std::vector<int32_t> end_ids);

  int32_t size() const { return size_; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_end(int32_t id) const;
  // Whether the id is an ordinary token with bytes (one a mask may allow).
  bool usable(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < usable_.size() && usable_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  // Usable ids in byte order; lcp(i): bytes shared by sorted(i - 1) and sorted(i).
  const std::vector<int32_t>& sorted() const { return sorted_; }
  int32_t lcp(size_t i) const { return lcp_[i]; }
  // The bytes of sorted()[i], from one buffer laid out in sorted order: a
  // whole-vocabulary walk reads it front to back instead of chasing 128k
  // strings scattered by id (which cost the walk more than the grammar did).
  std::string_view sorted_bytes(size_t i) const {
    return {sorted_text_.data() + sorted_offsets_[i], sorted_offsets_[i + 1] - sorted_offsets_[i]};
  }
  // The first sorted position after i whose token does not begin with the
  // first `depth` + 1 bytes of sorted()[i] (depth < its length): where a
  // walk that failed on byte `depth` of token i goes on.
  size_t skip(size_t i, size_t depth) const;
  // Usable ids, ascending, whose bytes hold a `"` / one of `"` `,` `]` `}`:
  // the tokens that can end an element of JSON (grammar/distinct_json.h).
  const std::vector<int32_t>& with_quote() const { return with_quote_; }
  const std::vector<int32_t>& with_closer() const { return with_closer_; }
  // Whether sorted()[i]'s bytes are all plain text (is_plain_byte:
  // printable ASCII but `"` and `\`), what most of a string's tokens are.
  bool plain(size_t i) const { return plain_[i]; }
  static bool is_plain_byte(uint8_t b) { return b >= 0x20 && b < 0x7F && b != '"' && b != '\\'; }
  // Families of text units a state may read alike, one unit after
  // another: plain bytes (a string's characters), plain bytes but the space
  // (a word's, as \S+ reads them inside a string), ASCII letters and digits
  // (a hostname label's), and text: plain bytes and UTF-8 characters (a
  // string's characters, whatever their script; a token's last character
  // may be cut short). family_tail(f, i): where the tail of sorted()[i]
  // that is all units of family f begins (its length when the last byte is
  // none); family_units(f, i, d): how many units its bytes from d on are,
  // or npos when d is before the tail or inside a character. A walk that
  // holds, at such a d, one stack reading any units of the family as far
  // as the token goes accepts it without reading them.
  enum UnitFamily : int { kPlainFamily = 0, kWordFamily = 1, kAlnumFamily = 2, kTextFamily = 3, kUnitFamilies = 4 };
  // Whether `b` is a unit of byte family f (not kTextFamily).
  static bool in_family(int family, uint8_t b) {
    if (family == kAlnumFamily) return (b >= '0' && b <= '9') || ((b | 0x20) >= 'a' && (b | 0x20) <= 'z');
    return is_plain_byte(b) && (family == kPlainFamily || b != ' ');
  }
  // The byte length of the UTF-8 character of two bytes or more that
  // begins at bytes[at] (cut short by the end of `bytes`, its bytes so far
  // valid), 0 when none begins there.
  static size_t utf8_character(std::string_view bytes, size_t at);
  size_t family_tail(int family, size_t i) const { return family_tail_[static_cast<size_t>(family)][i]; }
  size_t family_units(int family, size_t i, size_t from) const {
    if (from < family_tail(family, i)) return std::string_view::npos;
    return family == kTextFamily ? text_units(i, from) : sorted_bytes(i).size() - from;
  }
  // Positions in sorted(), longest bytes first (grammar/bounded_string.h).
  const std::vector<int32_t>& longest_first() const { return longest_first_; }
  // The usable ids whose bytes are exactly `bytes`.
  std::span<const int32_t> spelled(std::string_view bytes) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> usable_;
  int32_t size_;
  std::vector<int32_t> end_ids_;
  size_t text_units(size_t i, size_t from) const;  // family_units(kTextFamily, ...)

  std::vector<int32_t> sorted_;
  std::vector<int32_t> lcp_;
  std::string sorted_text_;
  std::vector<uint32_t> sorted_offsets_;  // sorted_.size() + 1 of them
  std::vector<int32_t> with_quote_, with_closer_;
  std::vector<int32_t> longest_first_;
  std::vector<bool> plain_;  // per sorted position
  std::vector<uint32_t> family_tail_[kUnitFamilies];  // per sorted position
  // Per sorted position: bit k set where a text unit of its tail begins at
  // byte k (k < 64), for family_units().
  std::vector<uint64_t> text_starts_;
};

// Per grammar state and unit family (TokenVocabulary::UnitFamily): how
// many units of the family in a row a stack in that state reads alike by
// its own edges (the walks' TrieWalker::family_reach), -1 until a walk
// asks. Shared by a masker's walks on any thread: a value is the same
// whichever walk stores it.
class UnitReach {
 public:
  static constexpr size_t kMax = 1 << 12;  // a loop, or that many or more
  explicit UnitReach(size_t states);
  int32_t get(int family, int32_t state) const {
    return reach_[family][static_cast<size_t>(state)].load(std::memory_order_relaxed);
  }
  void set(int family, int32_t state, int32_t units) {
    reach_[family][static_cast<size_t>(state)].store(units, std::memory_order_relaxed);
  }

 private:
  std::unique_ptr<std::atomic<int32_t>[]> reach_[TokenVocabulary::kUnitFamilies];
};

class TokenMasker {
 public:
  TokenMasker(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary);

  const std::shared_ptr<const CompiledGrammar>& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }

  // Sets in `words` (ceil(size / 32) of them, zeroed here first) the tokens
  // the matcher may take next.
  void fill(GrammarMatcher& matcher, std::span<uint32_t> words) const;

  // Cache entries so far (benchmarks, tests).
  size_t cached_entries() const;

 private:
  struct Entry {
    std::vector<uint32_t> accepted;  // bitmask over token ids
    std::vector<int32_t> undecided;  // positions in vocabulary().sorted()
  };
  // A cache key is a stack's top: its state, then the states its callers
  // continue in (up to kContextDepth of them), and whether the real stack
  // ends there (`bottom`) or goes on unknown. Each entry is computed from
  // the key one caller shorter, walking only the tokens that one left
  // undecided; the shortest (a state alone) walks the whole vocabulary.
  static constexpr size_t kContextDepth = 4;
  const Entry& entry(const std::vector<int32_t>& chain, bool bottom) const;
  Entry compute(const std::vector<int32_t>& chain, bool bottom) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::unique_ptr<UnitReach> reach_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::unique_ptr<Entry>> cache_;
};

}  // namespace basalt
