#include "core/int_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace basalt {

std::string int_layout_error(const IntWeightLayout& l) {
  if (l.bits != 8 && l.bits != 4) return "bits must be 8 or 4, got " + std::to_string(l.bits);
  if (l.in_features < 1) return "in_features must be at least 1, got " + std::to_string(l.in_features);
  if (l.group != l.in_features && (l.group < kIntBlock || l.group % kIntBlock != 0))
    return "the group size must be a multiple of 32 or the whole row (" + std::to_string(l.in_features) +
           "), got " + std::to_string(l.group);
  return {};
}

namespace {

// Round to nearest, ties to even (the default floating-point environment).
float rne(float v) { return std::nearbyint(v); }

}  // namespace

void quantize_int_row(const IntWeightLayout& l, const float* w, void* codes, uint16_t* scales) {
  const int64_t K = l.in_features, G = l.group;
  auto* c8 = static_cast<int8_t*>(codes);
  auto* c4 = static_cast<uint8_t*>(codes);
  std::memset(codes, l.bits == 4 ? 0x88 : 0, static_cast<size_t>(l.code_columns()));
  for (int64_t g = 0; g * G < K; ++g) {
    const int64_t begin = g * G, end = std::min(K, begin + G);
    float amax = 0, extreme = 0;
    for (int64_t k = begin; k < end; ++k) {
      BASALT_CHECK(std::isfinite(w[k]), "quantize: weight column {} is {}", k, w[k]);
      if (std::fabs(w[k]) > amax) {
        amax = std::fabs(w[k]);
        extreme = w[k];
      }
    }
    const float raw = l.bits == 8 ? amax / 127.0f : extreme / -8.0f;
    const uint16_t bits = f32_to_f16(raw);
    const float scale = f16_to_f32(bits);
    BASALT_CHECK(std::isfinite(scale), "quantize: columns [{}, {}) reach {}, beyond what an f16 scale holds",
                 begin, end, amax);
    scales[g] = bits;
    if (scale == 0) {  // an all-zero group, or one below f16's range: zero codes
      scales[g] = 0;
      continue;
    }
    const float lo = l.bits == 8 ? -127.0f : -8.0f, hi = l.bits == 8 ? 127.0f : 7.0f;
    for (int64_t k = begin; k < end; ++k) {
      const int code = static_cast<int>(std::fmin(hi, std::fmax(lo, rne(w[k] / scale))));
      if (l.bits == 8) {
        c8[k] = static_cast<int8_t>(code);
      } else {
        const int64_t block = k / kIntBlock, i = k % kIntBlock;
        uint8_t& byte = c4[block * (kIntBlock / 2) + (i % 16)];
        const auto nibble = static_cast<uint8_t>(code + 8);
        byte = i < 16 ? static_cast<uint8_t>((byte & 0xf0) | nibble)
                      : static_cast<uint8_t>((byte & 0x0f) | (nibble << 4));
      }
    }
  }
}

int int_code(const IntWeightLayout& l, const void* codes, int64_t k) {
  if (l.bits == 8) return static_cast<const int8_t*>(codes)[k];
  const int64_t block = k / kIntBlock, i = k % kIntBlock;
  const uint8_t byte = static_cast<const uint8_t*>(codes)[block * (kIntBlock / 2) + (i % 16)];
  return (i < 16 ? (byte & 0x0f) : (byte >> 4)) - 8;
}

float dequantize_int(const IntWeightLayout& l, const void* codes, const uint16_t* scales, int64_t k) {
  return static_cast<float>(int_code(l, codes, k)) * f16_to_f32(scales[k / l.group]);
}

namespace {

// Byte offset of byte `byte` of row n's codes in an interleaved tensor.
int64_t interleaved_code_offset(const IntWeightLayout& l, int64_t rows, int64_t n, int64_t byte) {
  const int64_t cols = l.code_columns(), full = rows / kIntInterleaveRows * kIntInterleaveRows;
  if (n >= full) return n * cols + byte;
  const int64_t block_bytes = cols / l.blocks(), b = byte / block_bytes, in_block = byte % block_bytes;
  return (n - n % kIntInterleaveRows) * cols + b * kIntInterleaveRows * block_bytes + (in_block / 4) * 32 +
         (n % kIntInterleaveRows) * 4 + in_block % 4;
}

// Index of row n's scale column c in an interleaved tensor.
int64_t interleaved_scale_index(const IntWeightLayout& l, int64_t rows, int64_t n, int64_t c) {
  const int64_t cols = l.scale_columns(), full = rows / kIntInterleaveRows * kIntInterleaveRows;
  if (n >= full) return n * cols + c;
  return (n - n % kIntInterleaveRows) * cols + c * kIntInterleaveRows + n % kIntInterleaveRows;
}

}  // namespace

void interleave_int_rows(const IntWeightLayout& l, int64_t rows, const void* codes, const uint16_t* scales,
                         void* codes_out, uint16_t* scales_out) {
  const int64_t cols = l.code_columns(), blocks = l.blocks(), block_bytes = cols / blocks;
  const int64_t scale_cols = l.scale_columns();
  const int64_t full = rows / kIntInterleaveRows * kIntInterleaveRows;
  const auto* src = static_cast<const uint8_t*>(codes);
  auto* dst = static_cast<uint8_t*>(codes_out);
  for (int64_t n0 = 0; n0 < full; n0 += kIntInterleaveRows) {
    uint8_t* group = dst + n0 * cols;
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t q = 0; q < block_bytes / 4; ++q)
        for (int64_t i = 0; i < kIntInterleaveRows; ++i)
          std::memcpy(group + b * kIntInterleaveRows * block_bytes + q * 32 + i * 4,
                      src + (n0 + i) * cols + b * block_bytes + q * 4, 4);
    for (int64_t c = 0; c < scale_cols; ++c)
      for (int64_t i = 0; i < kIntInterleaveRows; ++i)
        scales_out[n0 * scale_cols + c * kIntInterleaveRows + i] = scales[(n0 + i) * scale_cols + c];
  }
  std::memcpy(dst + full * cols, src + full * cols, static_cast<size_t>((rows - full) * cols));
  std::memcpy(scales_out + full * scale_cols, scales + full * scale_cols,
              static_cast<size_t>((rows - full) * scale_cols) * sizeof(uint16_t));
}

void int_row(const IntWeightLayout& l, int64_t rows, const void* codes, const uint16_t* scales, int64_t n,
             void* codes_out, uint16_t* scales_out) {
  const int64_t cols = l.code_columns(), scale_cols = l.scale_columns();
  const auto* src = static_cast<const uint8_t*>(codes);
  auto* dst = static_cast<uint8_t*>(codes_out);
  if (!l.rows_interleaved) {
    std::memcpy(dst, src + n * cols, static_cast<size_t>(cols));
    std::memcpy(scales_out, scales + n * scale_cols, static_cast<size_t>(scale_cols) * sizeof(uint16_t));
    return;
  }
  for (int64_t byte = 0; byte < cols; byte += 4)  // block bytes (32 or 16) are whole words
    std::memcpy(dst + byte, src + interleaved_code_offset(l, rows, n, byte), 4);
  for (int64_t c = 0; c < scale_cols; ++c) scales_out[c] = scales[interleaved_scale_index(l, rows, n, c)];
}

void quantize_int_activations(const float* x, int64_t K, int8_t* codes, float* block_scales) {
  const int64_t blocks = (K + kIntBlock - 1) / kIntBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kIntBlock, end = std::min(K, begin + kIntBlock);
    float amax = 0;
    for (int64_t k = begin; k < end; ++k) {
      const float a = std::fabs(x[k]);
      amax = a > amax ? a : amax;  // NaN never wins
    }
    int8_t* out = codes + begin;
    if (amax == 0) {
      std::memset(out, 0, kIntBlock);
      block_scales[b] = 0;
      continue;
    }
    const float inv = 127.0f / amax;
    for (int64_t k = begin; k < begin + kIntBlock; ++k) {
      float v = k < end ? x[k] * inv : 0.0f;
      v = v > -127.0f ? v : -127.0f;  // NaN becomes -127, as a vector max does
      v = v < 127.0f ? v : 127.0f;
      out[k - begin] = static_cast<int8_t>(rne(v));
    }
    block_scales[b] = amax / 127.0f;
  }
}

float int_dot_reference(const IntWeightLayout& l, const int8_t* x_codes, const float* x_scales, const void* w_codes,
                        const uint16_t* w_scales) {
  float acc = 0;
  for (int64_t b = 0; b < l.blocks(); ++b) {
    const float s = x_scales[b] * f16_to_f32(w_scales[(b * kIntBlock) / l.group]);
    int32_t p = 0;
    for (int64_t k = b * kIntBlock; k < (b + 1) * kIntBlock; ++k) {
      // Padding columns hold zero codes on both sides.
      const int w = k < l.in_features ? int_code(l, w_codes, k) : 0;
      p += static_cast<int32_t>(x_codes[k]) * w;
    }
    acc = std::fma(static_cast<float>(p), s, acc);
  }
  return acc;
}

}  // namespace basalt
