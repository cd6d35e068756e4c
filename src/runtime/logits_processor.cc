#include "runtime/logits_processor.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace basalt {

LogitsProcessor::LogitsProcessor(const SamplingParams& params, int32_t vocab_size,
                                 std::span<const int32_t> eos_ids,
                                 std::span<const int32_t> prompt)
    : vocab_size_(vocab_size),
      min_tokens_(params.min_tokens),
      repetition_penalty_(params.repetition_penalty),
      frequency_penalty_(params.frequency_penalty),
      presence_penalty_(params.presence_penalty),
      bias_(params.logit_bias.begin(), params.logit_bias.end()),
      bad_words_(params.bad_words_ids) {
  BASALT_CHECK(vocab_size > 0, "the vocabulary is empty");
  // The logprobs limit is the caller's policy, not this class's concern.
  params.validate(vocab_size, std::max(params.logprobs, kDefaultMaxLogprobs));
  for (int32_t id : eos_ids)
    BASALT_CHECK(id >= 0 && id < vocab_size, "eos token id {} is outside the vocabulary (0..{})",
                 id, vocab_size - 1);
  if (min_tokens_ > 0) {
    if (!params.ignore_eos) suppressed_.assign(eos_ids.begin(), eos_ids.end());
    suppressed_.insert(suppressed_.end(), params.stop_token_ids.begin(),
                       params.stop_token_ids.end());
    std::sort(suppressed_.begin(), suppressed_.end());
    suppressed_.erase(std::unique(suppressed_.begin(), suppressed_.end()), suppressed_.end());
  }
  if (repetition_penalty_ != 1.0f) {
    seen_.assign(static_cast<size_t>(vocab_size), 0);
    for (int32_t id : prompt) {
      BASALT_CHECK(id >= 0 && id < vocab_size,
                   "prompt token id {} is outside the vocabulary (0..{})", id, vocab_size - 1);
      if (!seen_[static_cast<size_t>(id)]) {
        seen_[static_cast<size_t>(id)] = 1;
        seen_ids_.push_back(id);
      }
    }
  }
  if (frequency_penalty_ != 0.0f || presence_penalty_ != 0.0f)
    counts_.assign(static_cast<size_t>(vocab_size), 0);
}

bool LogitsProcessor::active() const {
  return (num_output_ < min_tokens_ && !suppressed_.empty()) || !bias_.empty() ||
         (repetition_penalty_ != 1.0f && !seen_ids_.empty()) || !output_ids_.empty() || !bad_words_.empty();
}

void LogitsProcessor::apply(std::span<float> logits) const {
  BASALT_CHECK(static_cast<int64_t>(logits.size()) == vocab_size_,
               "logits row has {} entries, the vocabulary {}", logits.size(), vocab_size_);
  std::vector<LogitEdit> row_edits;
  edits(0, row_edits);
  for (const LogitEdit& e : row_edits) {
    float& x = logits[static_cast<size_t>(e.token)];
    x = apply_logit_edit(x, e);
  }
}

void LogitsProcessor::edits(int32_t row, std::vector<LogitEdit>& out) const {
  const size_t first = out.size();
  // One partial edit per step and token, then merged per token: each step
  // sets a different field, so merging loses nothing.
  for (const std::vector<int32_t>& word : bad_words_) {
    const size_t prefix = word.size() - 1;
    if (prefix > appended_.size()) continue;
    bool matches = true;
    for (size_t i = 0; i < prefix && matches; ++i)
      matches = appended_[appended_.size() - prefix + i].id == word[i];
    if (matches) out.push_back({.row = row, .token = word.back(), .suppress = true});
  }
  if (num_output_ < min_tokens_)
    for (int32_t id : suppressed_) out.push_back({.row = row, .token = id, .suppress = true});
  for (const auto& [id, bias] : bias_) out.push_back({.row = row, .token = id, .bias = bias});
  if (repetition_penalty_ != 1.0f)
    for (int32_t id : seen_ids_)
      out.push_back({.row = row, .token = id, .repetition = repetition_penalty_});
  for (int32_t id : output_ids_) {
    const int32_t count = counts_[static_cast<size_t>(id)];
    out.push_back({.row = row,
                   .token = id,
                   .subtract = frequency_penalty_ * static_cast<float>(count) + presence_penalty_});
  }
  const auto begin = out.begin() + static_cast<ptrdiff_t>(first);
  std::stable_sort(begin, out.end(),
                   [](const LogitEdit& a, const LogitEdit& b) { return a.token < b.token; });
  auto merged = begin;
  for (auto it = begin; it != out.end(); ++it) {
    if (it != begin && merged->token == it->token) {
      merged->suppress |= it->suppress;
      if (it->bias != 0.0f) merged->bias = it->bias;
      if (it->repetition != 1.0f) merged->repetition = it->repetition;
      if (it->subtract != 0.0f) merged->subtract = it->subtract;
    } else {
      if (it != begin) ++merged;
      *merged = *it;
    }
  }
  if (begin != out.end()) out.erase(merged + 1, out.end());
}

void LogitsProcessor::append(int32_t id) {
  BASALT_CHECK(id >= 0 && id < vocab_size_, "output token id {} is outside the vocabulary (0..{})",
               id, vocab_size_ - 1);
  ++num_output_;
  Appended a{id, false, false};
  if (!seen_.empty() && !seen_[static_cast<size_t>(id)]) {
    seen_[static_cast<size_t>(id)] = 1;
    seen_ids_.push_back(id);
    a.first_seen = true;
  }
  if (!counts_.empty() && counts_[static_cast<size_t>(id)]++ == 0) {
    output_ids_.push_back(id);
    a.first_counted = true;
  }
  appended_.push_back(a);
}

void LogitsProcessor::rollback(int n) {
  BASALT_CHECK(n >= 0 && static_cast<size_t>(n) <= appended_.size(), "logits processor: cannot roll back {} of {} tokens",
               n, appended_.size());
  // Last in, first out: a token first seen or counted by its append is the
  // last entry of those lists when it is undone.
  for (int i = 0; i < n; ++i) {
    const Appended a = appended_.back();
    appended_.pop_back();
    --num_output_;
    if (a.first_seen) {
      seen_[static_cast<size_t>(a.id)] = 0;
      seen_ids_.pop_back();
    }
    if (!counts_.empty()) --counts_[static_cast<size_t>(a.id)];
    if (a.first_counted) output_ids_.pop_back();
  }
}

}  // namespace basalt
