#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace basalt {
namespace {

constexpr double kPi = 3.14159265358979323846;

// base^(2i/dim) in f32, as torch computes `base ** (arange(0, dim, 2).float() / dim)`.
std::vector<float> base_powers(double theta, int64_t dim) {
  std::vector<float> p(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    p[static_cast<size_t>(i)] = std::pow(static_cast<float>(theta), exponent);
  }
  return p;
}

}  // namespace

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

RopeFrequencies rope_frequencies(const RopeScaling& s, double theta, int64_t dim,
                                 int64_t max_position_embeddings) {
  BASALT_CHECK(dim > 0 && dim % 2 == 0, "rope: rotary dimension {} must be positive and even", dim);
  const std::vector<float> powers = base_powers(theta, dim);
  RopeFrequencies out;
  out.inv_freq.resize(powers.size());
  for (size_t i = 0; i < powers.size(); ++i) out.inv_freq[i] = 1.0f / powers[i];

  if (s.type == "default") return out;
  const float factor = static_cast<float>(s.factor);
  if (s.type == "linear") {
    for (float& f : out.inv_freq) f /= factor;
    return out;
  }
  if (s.type == "llama3") {
    const float old_context = static_cast<float>(s.original_max_position_embeddings);
    const float low_wavelen = old_context / static_cast<float>(s.low_freq_factor);
    const float high_wavelen = old_context / static_cast<float>(s.high_freq_factor);
    for (float& f : out.inv_freq) {
      const float wavelen = 2.0f * static_cast<float>(kPi) / f;
      float scaled = wavelen > low_wavelen ? f / factor : f;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const float smooth = (old_context / wavelen - static_cast<float>(s.low_freq_factor)) /
                             static_cast<float>(s.high_freq_factor - s.low_freq_factor);
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      f = scaled;
    }
    return out;
  }
  if (s.type == "yarn") {
    const double original = static_cast<double>(
        s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings
                                               : max_position_embeddings);
    if (s.attention_factor) {
      out.attention_scaling = static_cast<float>(*s.attention_factor);
    } else if (s.mscale != 0.0 && s.mscale_all_dim != 0.0) {
      out.attention_scaling = static_cast<float>(yarn_get_mscale(s.factor, s.mscale) /
                                                 yarn_get_mscale(s.factor, s.mscale_all_dim));
    } else {
      out.attention_scaling = static_cast<float>(yarn_get_mscale(s.factor, 1.0));
    }
    auto correction_dim = [&](double rotations) {
      return (static_cast<double>(dim) * std::log(original / (rotations * 2.0 * kPi))) /
             (2.0 * std::log(theta));
    };
    double low = correction_dim(s.beta_fast);
    double high = correction_dim(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    for (size_t i = 0; i < powers.size(); ++i) {
      const float ramp = std::clamp(static_cast<float>((static_cast<double>(i) - low) / (high - low)),
                                    0.0f, 1.0f);
      const float extrapolation_weight = 1.0f - ramp;
      const float extrapolation = 1.0f / powers[i];
      const float interpolation = 1.0f / (factor * powers[i]);
      out.inv_freq[i] =
          interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
    }
    return out;
  }
  fail("rope: scaling type '{}' is not supported", s.type);
}

}  // namespace basalt
