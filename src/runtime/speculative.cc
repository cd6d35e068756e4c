#include "runtime/speculative.h"

#include <algorithm>

#include "core/error.h"

namespace basalt {

SpeculativeAlgorithm parse_speculative_algorithm(std::string_view name) {
  if (name == "none") return SpeculativeAlgorithm::kNone;
  if (name == "ngram" || name == "prompt_lookup") return SpeculativeAlgorithm::kNgram;
  if (name == "mtp" || name == "deepseek_mtp") return SpeculativeAlgorithm::kMtp;
  if (name == "eagle") return SpeculativeAlgorithm::kEagle;
  if (name == "draft" || name == "draft_model" || name == "standalone") return SpeculativeAlgorithm::kDraft;
  throw Error(fmt::format("unknown speculative algorithm \"{}\" (known: mtp, eagle, ngram, draft, none)", name));
}

std::string_view to_string(SpeculativeAlgorithm algorithm) {
  switch (algorithm) {
    case SpeculativeAlgorithm::kNone: return "none";
    case SpeculativeAlgorithm::kNgram: return "ngram";
    case SpeculativeAlgorithm::kMtp: return "mtp";
    case SpeculativeAlgorithm::kEagle: return "eagle";
    case SpeculativeAlgorithm::kDraft: return "draft";
  }
  return "?";
}

void SpeculativeOptions::validate() const {
  BASALT_CHECK(num_draft_tokens >= 0 && num_draft_tokens <= kMaxDrafts,
               "speculative decoding: the number of draft tokens must be 0 to {}, not {}", kMaxDrafts,
               num_draft_tokens);
  BASALT_CHECK(adaptive_from_batch >= 0 && disable_from_batch >= 0,
               "speculative decoding: batch thresholds must be >= 0 (0: never), not {} and {}", adaptive_from_batch,
               disable_from_batch);
  BASALT_CHECK(ngram_min >= 1 && ngram_max >= ngram_min && ngram_max <= 32,
               "speculative decoding: n-gram sizes must satisfy 1 <= min <= max <= 32, not {}..{}", ngram_min,
               ngram_max);
}

SpeculativeOptions speculative_options(std::string_view algorithm, int num_draft_tokens) {
  SpeculativeOptions o;
  o.algorithm = parse_speculative_algorithm(algorithm);
  o.num_draft_tokens = num_draft_tokens;
  o.validate();
  return o;
}

size_t accepted_drafts(std::span<const int32_t> sampled, std::span<const int32_t> drafts) {
  size_t take = 0;
  while (take < drafts.size() && take < sampled.size() && sampled[take] == drafts[take]) ++take;
  return take;
}

std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int k, int min_n, int max_n) {
  const auto size = static_cast<int64_t>(tokens.size());
  if (k <= 0) return {};
  for (int n = std::min<int64_t>(max_n, size - 1); n >= min_n; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(size - n));
    // The latest earlier occurrence: its end is before the suffix's own end.
    for (int64_t end = size - 1; end >= n; --end) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + (end - n))) continue;
      const int64_t take = std::min<int64_t>(k, size - end);
      return std::vector<int32_t>(tokens.begin() + end, tokens.begin() + end + take);
    }
  }
  return {};
}

std::vector<int32_t> PredictionLookup::propose(std::span<const int32_t> output, int k) {
  constexpr size_t npos = static_cast<size_t>(-1);
  if (output.size() < seen_ || (seen_ > 0 && output[seen_ - 1] != last_seen_)) {
    cursor_ = last_good_ = seen_ = 0;  // not the output walked so far: start again
  }
  bool lost = cursor_ == npos;
  for (; seen_ < output.size(); ++seen_) {
    if (!lost && cursor_ < prediction_.size() && prediction_[cursor_] == output[seen_]) {
      ++cursor_;
      continue;
    }
    if (!lost) last_good_ = cursor_;
    lost = true;
  }
  if (!output.empty()) last_seen_ = output.back();
  cursor_ = lost ? npos : cursor_;
  if (lost) realign(output);
  if (cursor_ == npos || k <= 0) return {};
  const size_t take = std::min(prediction_.size() - cursor_, static_cast<size_t>(k));
  return std::vector<int32_t>(prediction_.begin() + static_cast<std::ptrdiff_t>(cursor_),
                              prediction_.begin() + static_cast<std::ptrdiff_t>(cursor_ + take));
}

void PredictionLookup::realign(std::span<const int32_t> output) {
  if (output.empty()) return;
  if (where_.empty())
    for (size_t i = 0; i < prediction_.size(); ++i) where_[prediction_[i]].push_back(i);
  const auto places = where_.find(output.back());
  if (places == where_.end()) return;
  const std::vector<size_t>& ends = places->second;  // where a suffix's last token can sit
  const size_t longest = std::min<size_t>(kPredictionMaxMatch, output.size());
  for (size_t n = longest; n >= 1; --n) {
    const std::span<const int32_t> suffix = output.subspan(output.size() - n);
    // The first place, among at most kRealignCandidates from `from` on,
    // where the suffix ends at or after from + n - 1.
    const auto find_from = [&](size_t from) -> size_t {
      auto it = std::lower_bound(ends.begin(), ends.end(), from + n - 1);
      for (size_t tried = 0; it != ends.end() && tried < kRealignCandidates; ++it, ++tried) {
        const size_t begin = *it + 1 - n;
        if (std::equal(suffix.begin(), suffix.end(), prediction_.begin() + static_cast<std::ptrdiff_t>(begin)))
          return *it + 1;
      }
      return static_cast<size_t>(-1);
    };
    size_t found = find_from(last_good_ >= n ? last_good_ - n : 0);
    if (found == static_cast<size_t>(-1)) found = find_from(0);
    if (found != static_cast<size_t>(-1)) {
      cursor_ = last_good_ = found;
      return;
    }
  }
}

}  // namespace basalt
