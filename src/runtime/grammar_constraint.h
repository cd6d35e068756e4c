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
#pragma once

#include <memory>

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
  const Tokenizer* tokenizer_;
  GrammarMatcher matcher_;
};

}  // namespace basalt
