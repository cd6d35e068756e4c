#include "core/bf16_product.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"

namespace basalt {

uint16_t round_activation_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  // Below the smallest normal: a zero of the same sign.
  return (bits & 0x7f800000u) == 0 ? static_cast<uint16_t>((bits >> 16) & 0x8000u) : f32_to_bf16(x);
}

void round_activations_bf16(const float* x, int64_t k, uint16_t* out) {
  for (int64_t i = 0; i < k; ++i) out[i] = round_activation_bf16(x[i]);
  std::fill(out + k, out + bf16_padded_columns(k), uint16_t{0});
}

float bf16_dot_reference(const uint16_t* x, const uint16_t* w, int64_t k) {
  const auto weight = [&](int64_t c) { return c < k ? bf16_to_f32(w[c]) : 0.0f; };
  float acc[16] = {};
  for (int64_t c = 0; c < bf16_padded_columns(k); c += kBf16Chunk) {
    for (int j = 0; j < 16; ++j) {
      const int64_t o = c + 2 * j + 1, e = c + 2 * j;
      acc[j] = acc[j] + bf16_to_f32(x[o]) * weight(o);
      acc[j] = acc[j] + bf16_to_f32(x[e]) * weight(e);
    }
  }
  float v[8], u[4];
  for (int j = 0; j < 8; ++j) v[j] = acc[j] + acc[j + 8];
  for (int j = 0; j < 4; ++j) u[j] = v[j] + v[j + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

}  // namespace basalt
