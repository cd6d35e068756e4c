#include "core/dtype.h"

#include <array>

namespace basalt {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF8E4M3: return "f8_e4m3";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "I8") return DType::kI8;
  if (name == "U8") return DType::kU8;
  return std::nullopt;
}

bool is_floating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 ||
         dtype == DType::kF8E4M3;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t value = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (value & 1u))) ++value;
    return static_cast<uint16_t>(sign | value);
  }
  uint32_t value = abs - 0x38000000u;  // rebias exponent 127 -> 15
  value += 0xfffu + ((value >> 13) & 1u);
  return static_cast<uint16_t>(sign | (value >> 13));
}

float fp8e4m3_to_f32(uint8_t v) {
  const float sign = (v & 0x80u) ? -1.0f : 1.0f;
  const int exponent = (v >> 3) & 0xf;
  const int mantissa = v & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::nanf("");
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to the largest finite value
  // Exhaustive nearest search over the 127 non-negative finite codes, ties to
  // even code; fast enough for reference and quantisation-time use.
  static const std::array<float, 127> table = [] {
    std::array<float, 127> t{};
    for (int i = 0; i < 127; ++i) t[i] = fp8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  int lo = 0, hi = 126;
  while (lo < hi) {  // first code whose value >= a
    int mid = (lo + hi) / 2;
    if (table[mid] < a) lo = mid + 1; else hi = mid;
  }
  int code = lo;
  if (code > 0) {
    const float below = table[code - 1], above = table[code];
    if (a - below < above - a || (a - below == above - a && ((code - 1) & 1) == 0)) code -= 1;
  }
  return static_cast<uint8_t>(sign | code);
}

}  // namespace basalt
