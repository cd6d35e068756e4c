#include "backend/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/simd.h"
#include "backend/sampling_rng.h"
#include "core/error.h"

namespace basalt::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int32_t argmax_scalar(const float* row, int64_t begin, int64_t n, int64_t best) {
  for (int64_t i = begin; i < n; ++i) {
    if (std::isnan(row[i])) continue;
    if (best < 0 || row[i] > row[best]) best = i;
  }
  return static_cast<int32_t>(best < 0 ? 0 : best);
}

// One row's state while its filters run.
class RowSampler {
 public:
  RowSampler(const float* logits, int64_t n, const SamplingRow& c)
      : n_(n), c_(c), scaled_(static_cast<size_t>(n)) {
    max_ = kNegInf;
    for (int64_t i = 0; i < n; ++i) {
      const float s = std::isnan(logits[i]) ? kNegInf : logits[i] / c.temperature;
      scaled_[i] = s;
      max_ = std::max(max_, s);
    }
  }

  int32_t draw() {
    const bool top_k = c_.top_k > 0 && c_.top_k < n_;
    const bool top_p = c_.top_p < 1.0f;
    if (top_k) {
      select_top_k();
      if (top_p) cut_top_p(total_in_index_order(head_));
      return draw_from(head_);
    }
    if (top_p) {
      std::vector<float> w(static_cast<size_t>(n_));
      double total = 0.0;
      for (int64_t i = 0; i < n_; ++i) {
        w[i] = weight(i);
        total += w[i];
      }
      // Every token of weight >= threshold is a prefix of the rank order, so
      // if the cut falls inside it, it is the same cut a full sort finds.
      for (const float threshold : {0x1p-12f, 0x1p-24f, 0.0f}) {
        head_.clear();
        for (int64_t i = 0; i < n_; ++i) {
          if (w[i] >= threshold) head_.push_back(static_cast<int32_t>(i));
        }
        std::sort(head_.begin(), head_.end(), [&](int32_t a, int32_t b) { return before(a, b); });
        if (cut_top_p(total) || threshold == 0.0f) return draw_from(head_);
      }
    }
    return draw_from_all();
  }

 private:
  // The rank order: larger scaled logit first, lower index on ties.
  bool before(int64_t a, int64_t b) const {
    return scaled_[a] > scaled_[b] || (scaled_[a] == scaled_[b] && a < b);
  }
  float weight(int64_t i) const {
    return scaled_[i] == max_ ? 1.0f : std::exp(scaled_[i] - max_);
  }
  // min-p can only keep tokens with exp(s - max) >= min_p; one unit of slack
  // in the exponent keeps every token whose rounded weight could qualify.
  bool may_pass_min_p(int64_t i) const {
    return c_.min_p <= 0.0f || scaled_[i] == max_ || scaled_[i] - max_ >= min_p_log_ - 1.0f;
  }

  // head_ = the first top_k tokens in rank order, in rank order.
  void select_top_k() {
    const size_t k = static_cast<size_t>(c_.top_k);
    const auto later_last = [&](int32_t a, int32_t b) { return before(a, b); };
    head_.clear();
    for (int64_t i = 0; i < n_; ++i) {
      if (head_.size() < k) {
        head_.push_back(static_cast<int32_t>(i));
        std::push_heap(head_.begin(), head_.end(), later_last);
      } else if (before(i, head_.front())) {
        std::pop_heap(head_.begin(), head_.end(), later_last);
        head_.back() = static_cast<int32_t>(i);
        std::push_heap(head_.begin(), head_.end(), later_last);
      }
    }
    std::sort(head_.begin(), head_.end(), later_last);
  }

  double total_in_index_order(std::vector<int32_t> tokens) const {
    std::sort(tokens.begin(), tokens.end());
    double total = 0.0;
    for (int32_t i : tokens) total += weight(i);
    return total;
  }

  // Truncates head_ (in rank order) at the top-p cut; false if the cut lies
  // past its end, which means head_ was too short to decide.
  bool cut_top_p(double total) {
    double mass_before = 0.0;
    for (size_t r = 0; r < head_.size(); ++r) {
      if (r > 0 && !(mass_before < c_.top_p * total)) {
        head_.resize(r);
        return true;
      }
      mass_before += weight(head_[r]);
    }
    return false;
  }

  // Draws among `tokens` (kept after top-k/top-p), applying min-p.
  int32_t draw_from(std::vector<int32_t>& tokens) {
    std::sort(tokens.begin(), tokens.end());
    weights_.clear();
    for (int32_t i : tokens) {
      const float w = weight(i);
      weights_.push_back(c_.min_p > 0.0f && w < c_.min_p ? -1.0f : w);  // -1: filtered
    }
    double total = 0.0;
    for (float w : weights_) {
      if (w >= 0.0f) total += w;
    }
    const double target = static_cast<double>(sampling_uniform(c_.seed, c_.step)) * total;
    double running = 0.0;
    int32_t last_positive = -1;
    for (size_t j = 0; j < tokens.size(); ++j) {
      if (weights_[j] < 0.0f) continue;
      running += weights_[j];
      if (running > target) return tokens[j];
      if (weights_[j] > 0.0f) last_positive = tokens[j];
    }
    BASALT_ASSERT(last_positive >= 0);
    return last_positive;
  }

  int32_t draw_from_all() {
    min_p_log_ = c_.min_p > 0.0f ? std::log(c_.min_p) : 0.0f;
    std::vector<int32_t> kept;
    for (int64_t i = 0; i < n_; ++i) {
      if (may_pass_min_p(i)) kept.push_back(static_cast<int32_t>(i));
    }
    return draw_from(kept);
  }

  int64_t n_;
  const SamplingRow& c_;
  std::vector<float> scaled_;
  float max_;
  float min_p_log_ = 0.0f;
  std::vector<int32_t> head_;
  std::vector<float> weights_;
};

}  // namespace

int32_t argmax_row(const float* row, int64_t n) {
#if defined(__AVX512F__)
  if (n >= 16) {
    // Per lane, the first maximum of its column (strict >, NaN never wins);
    // then the lowest index among the lanes holding the overall maximum.
    __m512 best = _mm512_set1_ps(kNegInf);
    __m512i best_index = _mm512_setzero_si512();
    __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_loadu_ps(row + i);
      const __mmask16 greater = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
      best = _mm512_mask_mov_ps(best, greater, v);
      best_index = _mm512_mask_mov_epi32(best_index, greater, index);
      index = _mm512_add_epi32(index, step);
    }
    const float max_value = _mm512_reduce_max_ps(best);
    // A maximum of -inf (or an all-NaN prefix) needs the exact scalar rule.
    if (max_value > kNegInf) {
      const __mmask16 at_max = _mm512_cmp_ps_mask(best, _mm512_set1_ps(max_value), _CMP_EQ_OQ);
      const int64_t first = _mm512_mask_reduce_min_epi32(at_max, best_index);
      return argmax_scalar(row, i, n, first);
    }
  }
#endif
  return argmax_scalar(row, 0, n, -1);
}

int32_t sample_row(const float* logits, int64_t n, const SamplingRow& controls) {
  if (controls.temperature == 0.0f) return argmax_row(logits, n);
  RowSampler sampler(logits, n, controls);
  return sampler.draw();
}

}  // namespace basalt::cpu
