// Test helpers for GrammarConstraint (runtime/grammar_constraint.h): a
// vocabulary of every byte plus chosen pieces, and a walk that writes text
// through the constraint's masks or samples from them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/ebnf.h"
#include "grammar/matcher.h"
#include "grammar/structured_output.h"
#include "grammar/token_mask.h"
#include "runtime/grammar_constraint.h"

namespace basalt::testing {

inline constexpr int32_t kWalkEnd = 0;  // the end-of-sequence id

// Id 0 is the end token; then every byte 1-255 as a token, then `pieces`.
inline std::shared_ptr<const TokenVocabulary> byte_vocabulary(std::initializer_list<const char*> pieces) {
  std::vector<std::string> bytes = {"</s>"};
  for (int b = 1; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  for (const char* piece : pieces) bytes.emplace_back(piece);
  std::vector<bool> usable(bytes.size(), true);
  usable[0] = false;
  const auto n = static_cast<int32_t>(bytes.size());
  return std::make_shared<TokenVocabulary>(std::move(bytes), std::move(usable), n, std::vector<int32_t>{kWalkEnd});
}

inline std::shared_ptr<const TokenMasker> masker_of(const std::string& ebnf,
                                                     std::shared_ptr<const TokenVocabulary> vocabulary) {
  return std::make_shared<TokenMasker>(compile_grammar(parse_ebnf(ebnf)), std::move(vocabulary));
}

struct ConstraintWalk {
  explicit ConstraintWalk(std::shared_ptr<const TokenMasker> m) : masker(std::move(m)), c(masker) {}

  std::vector<uint32_t> mask() {
    std::vector<uint32_t> words(static_cast<size_t>(token_mask_words(masker->vocabulary().size())), ~uint32_t{0});
    c.fill_allowed(words);
    return words;
  }
  static bool has(const std::vector<uint32_t>& words, int32_t id) {
    return (words[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
  }
  bool allows(std::string_view bytes) {
    const std::vector<uint32_t> words = mask();
    for (int32_t id : masker->vocabulary().spelled(bytes))
      if (has(words, id)) return true;
    return false;
  }
  // Takes the token spelled `bytes`, checked against the mask.
  void take(std::string_view bytes) {
    ASSERT_TRUE(allows(bytes)) << "refused '" << bytes << "' after " << written;
    c.accept(masker->vocabulary().spelled(bytes)[0]);
    written += bytes;
  }
  // Takes `text` one byte token at a time.
  void write(std::string_view text) {
    for (const char& ch : text) take(std::string_view(&ch, 1));
  }
  // Samples to the end, uniformly among the allowed tokens (the end
  // token, when allowed, half the time).
  std::string sample(std::mt19937& rng, int max_steps = 400) {
    for (int step = 0; step < max_steps; ++step) {
      const std::vector<uint32_t> words = mask();
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < masker->vocabulary().size(); ++id)
        if (has(words, id)) ids.push_back(id);
      EXPECT_FALSE(ids.empty()) << "empty mask after " << written;
      if (ids.empty()) break;
      const bool can_end = std::find(ids.begin(), ids.end(), kWalkEnd) != ids.end();
      if (can_end && rng() % 2 == 0) return written;
      int32_t id;
      do {
        id = ids[rng() % ids.size()];
      } while (id == kWalkEnd && ids.size() > 1);
      if (id == kWalkEnd) return written;
      c.accept(id);
      written += masker->vocabulary().bytes(id);
    }
    ADD_FAILURE() << "no end in " << max_steps << " steps: " << written;
    return written;
  }

  std::shared_ptr<const TokenMasker> masker;
  GrammarConstraint c;
  std::string written;
};

}  // namespace basalt::testing
