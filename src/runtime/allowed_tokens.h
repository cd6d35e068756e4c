// AllowedTokensConstraint: vLLM's allowed_token_ids as a TokenConstraint:
// every step may sample only the listed ids.
//
// Contract: as TokenConstraint's. The mask is built once from the ids that
// lie in [0, vocab_size) (the scheduler refuses a request with any other id
// before it runs, SamplingParams::validate); fill_allowed() clears every
// other bit. It keeps no state between tokens, so accept() and rollback()
// do nothing and fresh_copy() shares the mask. A constraint with no id in
// the vocabulary would allow nothing: the scheduler never runs one (the
// server refuses an empty list, and validation any id outside).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/token_constraint.h"

namespace basalt {

class AllowedTokensConstraint : public TokenConstraint {
 public:
  AllowedTokensConstraint(std::span<const int32_t> ids, int32_t vocab_size);

  void fill_allowed(std::span<uint32_t> words) override;
  void accept(int32_t) override {}
  void rollback(int) override {}
  std::shared_ptr<TokenConstraint> fresh_copy() const override;

 private:
  std::shared_ptr<const std::vector<uint32_t>> mask_;  // token_mask_words(vocab_size) words
};

}  // namespace basalt
