// Element types and their scalar conversions.
//
// DType names every element type a tensor may hold. The conversion helpers are
// the reference definitions (round-to-nearest-even into bf16/f16/fp8) that
// every backend must agree with; vectorised kernels may reimplement them but
// must produce the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace basalt {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kF8E4M3,  // OCP e4m3fn: no infinities, max 448, one NaN pattern per sign
  kI32,
  kI64,
  kI8,  // integer weight codes (core/int_weights.h)
  kU8,  // packed 4-bit weight codes (core/int_weights.h)
};

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// Parses the dtype names safetensors uses ("F32", "BF16", "F16", "F8_E4M3",
// "I32", "I64", "I8", "U8"). Returns nothing for any other name.
std::optional<DType> dtype_from_safetensors(std::string_view name);
bool is_floating(DType dtype);

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float f);
float fp8e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8e4m3(float f);  // saturates to +-448, NaN stays NaN

}  // namespace basalt
