// GrammarConstraint: structured output as a TokenConstraint — the tokens a
// grammar (grammar/token_mask.h) allows next, for one request's sample.
//
// Contract: as TokenConstraint's. fill_allowed() sets the bits of the tokens
// whose bytes continue a sentence of the grammar, and the model's end ids
// where the text may end; accept() advances the matcher by the token's
// bytes (an end id adds none) and throws basalt::Error for a token outside
// the last mask, which only a bug can produce; rollback(n) undoes the last
// n accepts. The masker (and its cache) is shared with every other request
// using the same grammar.
//
// Jump-forward (given a tokenizer): forced_tokens() takes the text the
// grammar leaves no choice about (a property name, `":`, closing brackets)
// and encodes it as the tokenizer would. The model may spell it otherwise
// (or merge its last token with what follows): the engine verifies these
// tokens as drafts, so a different spelling costs a rejected draft, never a
// different output. Nothing is forced where the encoding does not spell the
// text back exactly (a normalizing tokenizer).
//
// Distinct items and names (grammar/distinct_json.h): where the grammar has
// distinct rules, the text is also kept by a DistinctJson, which takes from
// each mask the tokens that would repeat an element. A token is then
// accepted in pieces, each ending at a `[` or `{`, so that the matcher can
// say whether that byte opened a distinct container.
//
// Bounded strings (grammar/bounded_string.h): where the grammar has bounded
// rules, a BoundedStrings follows the string such a rule opened (tokens are
// cut after each `"` too) and takes from each mask the tokens after which
// it could not close within its bound.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "grammar/bounded_string.h"
#include "grammar/distinct_json.h"
#include "grammar/token_mask.h"
#include "runtime/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace basalt {

class GrammarConstraint : public TokenConstraint {
 public:
  // `jump_forward`: the tokenizer for forced text (null: no jump-forward);
  // it must outlive the constraint.
  explicit GrammarConstraint(std::shared_ptr<const TokenMasker> masker, const Tokenizer* jump_forward = nullptr);

  void fill_allowed(std::span<uint32_t> words) override;
  void accept(int32_t token) override;
  void rollback(int n) override;
  std::shared_ptr<TokenConstraint> fresh_copy() const override;
  std::vector<int32_t> forced_tokens() override;

  const GrammarMatcher& matcher() const { return matcher_; }

  // The longest forced text taken at once.
  static constexpr size_t kMaxJumpBytes = 256;

 private:
  std::shared_ptr<const TokenMasker> masker_;
  // Accepts `bytes` on the matcher (and the distinct tracker); false, with
  // nothing changed, when the grammar refuses them.
  bool take(std::string_view bytes);

  const Tokenizer* tokenizer_;
  GrammarMatcher matcher_;
  std::optional<DistinctJson> distinct_;
  std::optional<BoundedStrings> bounded_;
  // Per accepted token: the matcher accepts it took, and the distinct
  // text's size and the bounded string's place before it (for rollback).
  std::vector<int> pieces_;
  std::vector<size_t> text_sizes_;
  std::vector<BoundedStrings::Snapshot> bounded_before_;
};

}  // namespace basalt
