#include "runtime/allowed_tokens.h"

#include <algorithm>

namespace basalt {

AllowedTokensConstraint::AllowedTokensConstraint(std::span<const int32_t> ids, int32_t vocab_size) {
  auto mask = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(token_mask_words(std::max(vocab_size, 0))),
                                                      0u);
  for (int32_t id : ids)
    if (id >= 0 && id < vocab_size) (*mask)[static_cast<size_t>(id / 32)] |= 1u << (id % 32);
  mask_ = std::move(mask);
}

void AllowedTokensConstraint::fill_allowed(std::span<uint32_t> words) {
  const size_t n = std::min(words.size(), mask_->size());
  for (size_t i = 0; i < n; ++i) words[i] &= (*mask_)[i];
  for (size_t i = n; i < words.size(); ++i) words[i] = 0;
}

std::shared_ptr<TokenConstraint> AllowedTokensConstraint::fresh_copy() const {
  return std::make_shared<AllowedTokensConstraint>(*this);
}

}  // namespace basalt
