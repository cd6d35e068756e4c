// Rotary-embedding frequency tables for every scaling scheme a config may name.
//
// Contract: rope_frequencies(config) returns the f32 inverse frequencies
// (rotary_dim / 2 values) and the factor that multiplies cos and sin, computed
// as Hugging Face transformers computes them (modeling_rope_utils): default,
// linear, llama3 (smooth interpolation between scaled and unscaled bands) and
// YaRN (ramp between interpolation and extrapolation, attention factor from
// mscale). The backend's rope op consumes both.
#pragma once

#include <vector>

#include "model/config.h"

namespace basalt {

struct RopeFrequencies {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};

RopeFrequencies rope_frequencies(const RopeScaling& scaling, double theta, int64_t rotary_dim,
                                 int64_t max_position_embeddings);

// YaRN's magnitude correction: 0.1 * mscale * ln(scale) + 1 for scale > 1.
double yarn_get_mscale(double scale, double mscale);

}  // namespace basalt
