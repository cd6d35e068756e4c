// TokenConstraint: restricts which tokens a request may sample next (the
// grammar of structured output, a forced choice), as a whole-vocabulary
// bitmask the model runner applies on the device before sampling.
//
// Contract: the model runner owns the calls, on its own thread and in step
// order: for each step that samples for the request it calls
// fill_allowed() (while the forward pass runs on the device), samples under
// the mask, then accept() with the sampled token. A constraint must allow at
// least one token at every step (the runner fails the step otherwise: an
// empty mask is a bug in the constraint, not a request to stop).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace basalt {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Marks the tokens allowed next: token t may be sampled when bit t % 32 of
  // words[t / 32] is set. words holds ceil(vocab_size / 32) entries, all bits
  // set on entry (everything allowed).
  virtual void fill_allowed(std::span<uint32_t> words) = 0;
  // The token sampled under the last mask.
  virtual void accept(int32_t token) = 0;
  // Forgets the last n accepted tokens (rejected draft tokens).
  virtual void rollback(int n) = 0;
  // A constraint of the same kind in its initial state, for another sample
  // of the same request (EngineClient::submit_n).
  virtual std::shared_ptr<TokenConstraint> fresh_copy() const = 0;
  // Jump-forward: tokens spelling text the constraint alone decides must
  // come next, already accepted (so rollback(size) gives them back). The
  // engine gives them back at once and drafts them: a step verifies them
  // all, so they cost one step, not one each, where the model agrees.
  // Empty: nothing is forced (the default).
  virtual std::vector<int32_t> forced_tokens() { return {}; }
};

// Words of a vocabulary's bitmask row.
inline int64_t token_mask_words(int64_t vocab_size) { return (vocab_size + 31) / 32; }

}  // namespace basalt
