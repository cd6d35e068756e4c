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
    : masker_(std::move(masker)), tokenizer_(jump_forward), matcher_(masker_->grammar()) {
  if (matcher_.has_distinct_rules()) distinct_.emplace();
  if (matcher_.has_bounded_rules()) bounded_.emplace();
}

void GrammarConstraint::fill_allowed(std::span<uint32_t> words) {
  masker_->fill(matcher_, words);
  if (distinct_) distinct_->filter(matcher_, masker_->vocabulary(), words);
  if (bounded_) bounded_->filter(masker_->vocabulary(), words);
}

bool GrammarConstraint::take(std::string_view bytes) {
  if (!distinct_ && !bounded_) {
    if (!matcher_.accept_bytes(bytes)) return false;
    pieces_.push_back(1);
    return true;
  }
  // In pieces that end where a container or a bounded string may open, so
  // that the matcher tells whether one did.
  const auto cuts_after = [&](char b) { return (distinct_ && (b == '[' || b == '{')) || (bounded_ && b == '"'); };
  int pieces = 0;
  size_t begin = 0;
  struct Opened {
    size_t at;
    DistinctJson::Distinct distinct;
    const BoundedRegion* bounded;
  };
  std::vector<Opened> opened;
  for (size_t i = 0; i <= bytes.size(); ++i) {
    const bool cut = i < bytes.size() && cuts_after(bytes[i]);
    if (!cut && i < bytes.size()) continue;
    const size_t end = cut ? i + 1 : i;
    if (end > begin || pieces == 0) {
      bool accepted = false;
      try {
        accepted = matcher_.accept_bytes(bytes.substr(begin, end - begin));
      } catch (...) {  // past the matcher's stack limit: undo the pieces before
        matcher_.rollback(pieces);
        throw;
      }
      if (!accepted) {
        matcher_.rollback(pieces);
        return false;
      }
      ++pieces;
      if (cut) {
        opened.push_back({i, distinct_ ? matcher_.opened_distinct() : DistinctJson::Distinct::kNo,
                          bounded_ ? matcher_.opened_bounded() : nullptr});
      }
    }
    begin = end;
  }
  if (distinct_) text_sizes_.push_back(distinct_->size());
  if (bounded_) bounded_before_.push_back(bounded_->snapshot());
  size_t next = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    const Opened* here = next < opened.size() && opened[next].at == i ? &opened[next++] : nullptr;
    if (distinct_) {
      const auto what = here != nullptr ? here->distinct : DistinctJson::Distinct::kNo;
      distinct_->accept(b, distinct_->wants_opener(b) ? what : DistinctJson::Distinct::kNo);
    }
    if (bounded_) {
      if (bounded_->active()) {
        bounded_->accept(b);
      } else if (here != nullptr && here->bounded != nullptr) {
        bounded_->begin(*here->bounded);
      }
    }
  }
  pieces_.push_back(pieces);
  return true;
}

void GrammarConstraint::accept(int32_t token) {
  const TokenVocabulary& v = masker_->vocabulary();
  BASALT_CHECK(token >= 0 && token < v.size(), "structured output: token {} outside the vocabulary", token);
  // An end id adds no text; it is kept in the history so that rollback
  // counts tokens.
  const bool ok = v.is_end(token) ? matcher_.can_end() && take({}) : take(v.bytes(token));
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
       token, shown, allowed ? "allows" : "refuses", pieces_.size());
}

void GrammarConstraint::rollback(int n) {
  BASALT_CHECK(n >= 0 && static_cast<size_t>(n) <= pieces_.size(), "structured output: cannot roll back {} of {} tokens",
               n, pieces_.size());
  if (n == 0) return;
  int accepts = 0;
  for (size_t i = pieces_.size() - static_cast<size_t>(n); i < pieces_.size(); ++i) accepts += pieces_[i];
  matcher_.rollback(accepts);
  pieces_.resize(pieces_.size() - static_cast<size_t>(n));
  if (distinct_) {
    distinct_->rewind(text_sizes_[text_sizes_.size() - static_cast<size_t>(n)]);
    text_sizes_.resize(text_sizes_.size() - static_cast<size_t>(n));
  }
  if (bounded_) {
    bounded_->restore(bounded_before_[bounded_before_.size() - static_cast<size_t>(n)]);
    bounded_before_.resize(bounded_before_.size() - static_cast<size_t>(n));
  }
}

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
  for (int32_t id : ids) BASALT_ASSERT(take(v.bytes(id)));
  return ids;
}

}  // namespace basalt
