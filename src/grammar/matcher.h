// GrammarMatcher: where a text stands in a grammar (grammar/ebnf.h), byte by
// byte: which bytes may come next, whether the text may end here, and going
// back over what was accepted.
//
// The grammar is compiled (CompiledGrammar) into one automaton per rule over
// byte ranges and rule references (XGrammar's shape): each rule's body
// becomes a deterministic automaton whose edges either consume a byte range
// or call another rule; a matcher's state is the set of stacks of such
// automaton states that the text so far can leave the parser in (a
// pushdown automaton run breadth-first; stacks share their bottoms as a tree
// and their tops through joins, see grammar/automaton.h).
//
// Contract: compile_grammar() throws basalt::Error for a left-recursive
// grammar (a rule that can reach itself without consuming a byte; the
// breadth-first run would not terminate) and for one past the size limits.
// A CompiledGrammar is immutable and shared by any number of matchers on any
// threads; a GrammarMatcher is used by one thread at a time.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/ebnf.h"

namespace basalt {

class CompiledGrammar;
struct BoundedRegion;

std::shared_ptr<const CompiledGrammar> compile_grammar(const Grammar& grammar);

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Consumes `bytes` if the grammar allows them here; otherwise returns
  // false and the state is unchanged. Throws basalt::Error (the state
  // unchanged) where the text would leave more than kMaxLiveStacks parses.
  bool accept_bytes(std::string_view bytes);
  // Whether the text accepted so far is a whole sentence of the grammar.
  bool can_end() const;
  // Whether nothing can follow (the text is complete and no byte extends it).
  bool must_end() const;
  // The bytes every continuation of the text starts with, up to max_bytes:
  // those the grammar leaves no choice about (it cannot end before them).
  std::string forced_bytes(size_t max_bytes);
  // Sets in `out` the bytes the grammar allows next.
  void next_bytes(std::bitset<256>& out) const;
  // Whether the last byte accepted opened a distinct rule's array or object
  // (grammar/ebnf.h) on some parse of the text, and whether every such
  // parse opened one whose new elements cannot run out (kOpen).
  enum class Distinct : uint8_t { kNo, kYes, kOpen };
  Distinct opened_distinct() const;
  bool has_distinct_rules() const;
  // The bounded rule (grammar/ebnf.h) whose string the last byte accepted
  // opened on some parse of the text (the first, where several did), or
  // null.
  const BoundedRegion* opened_bounded() const;
  bool has_bounded_rules() const;
  // Forgets the last n successful accept_bytes() calls (n <= history()).
  void rollback(int n);
  int history() const;

 private:
  friend class TokenMasker;
  std::string finish_forced(std::string forced);  // undoes the trial accepts
  struct State;
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<State> state_;
};

// Whether the whole of `text` is a sentence of `grammar` (tests, validation).
bool grammar_matches(const Grammar& grammar, std::string_view text);

}  // namespace basalt
