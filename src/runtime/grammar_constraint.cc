#include "runtime/grammar_constraint.h"

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace basalt {
namespace {

// The length of the longest prefix of `s` that ends on a whole UTF-8
// sequence (encode() takes text; a forced cut character waits).
size_t whole_characters(std::string_view s) {
  size_t end = s.size();
  for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
    const auto c = static_cast<uint8_t>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    if (need > back) end = s.size() - back;
    break;
  }
  return end;
}

}  // namespace

GrammarConstraint::GrammarConstraint(std::shared_ptr<const TokenMasker> masker, const Tokenizer* jump_forward)
    : masker_(std::move(masker)), tokenizer_(jump_forward), matcher_(masker_->grammar()) {}

void GrammarConstraint::fill_allowed(std::span<uint32_t> words) { masker_->fill(matcher_, words); }

void GrammarConstraint::accept(int32_t token) {
  const TokenVocabulary& v = masker_->vocabulary();
  BASALT_CHECK(token >= 0 && token < v.size(), "structured output: token {} outside the vocabulary", token);
  // An end id adds no text; it is kept in the history so that rollback
  // counts tokens.
  const bool ok = v.is_end(token) ? matcher_.can_end() && matcher_.accept_bytes({})
                                  : matcher_.accept_bytes(v.bytes(token));
  if (ok) return;
  // Only a bug gets here: say whether the mask itself let the token through
  // (the masker and the matcher disagree) or the sampler took a refused one.
  std::vector<uint32_t> words(static_cast<size_t>(token_mask_words(v.size())), ~uint32_t{0});
  masker_->fill(matcher_, words);
  const bool allowed = (words[static_cast<size_t>(token) / 32] >> (token % 32)) & 1u;
  std::string shown;
  for (const char c : v.bytes(token))
    shown += c >= 0x20 && c < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", static_cast<uint8_t>(c));
  fail("structured output: token {} (\"{}\") was sampled outside the grammar's mask (the mask {} it; {} tokens "
       "accepted before)",
       token, shown, allowed ? "allows" : "refuses", matcher_.history());
}

void GrammarConstraint::rollback(int n) { matcher_.rollback(n); }

std::shared_ptr<TokenConstraint> GrammarConstraint::fresh_copy() const {
  return std::make_shared<GrammarConstraint>(masker_, tokenizer_);
}

std::vector<int32_t> GrammarConstraint::forced_tokens() {
  if (tokenizer_ == nullptr) return {};
  std::string text = matcher_.forced_bytes(kMaxJumpBytes);
  text.resize(whole_characters(text));
  // encode() takes text: a grammar written byte by byte may force bytes
  // that are no UTF-8, and those are sampled instead.
  if (text.empty() || unicode::find_invalid_utf8(text) != std::string::npos) return {};
  std::vector<int32_t> ids = tokenizer_->encode(text, /*add_special_tokens=*/false);
  const TokenVocabulary& v = masker_->vocabulary();
  std::string spelled;
  for (int32_t id : ids) {
    if (!v.usable(id)) return {};
    spelled += v.bytes(id);
  }
  if (spelled != text) return {};
  for (int32_t id : ids) BASALT_ASSERT(matcher_.accept_bytes(v.bytes(id)));
  return ids;
}

}  // namespace basalt
