// machine_isa and missing_isa (core/cpu_isa.h). Built for the x86-64
// baseline whatever the build's flags (core/CMakeLists.txt), and with C's
// string functions only, so it runs on the CPUs it has to turn away.
#include "core/cpu_isa.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace basalt {

// From CPUID itself rather than __builtin_cpu_supports, whose names differ
// between compilers (clang 14 knows neither "f16c" nor "avx512fp16"). An
// extension counts only where the OS saves its registers (XCR0): the YMM
// state for AVX and AVX2, the opmask and ZMM states for AVX-512.
IsaFeatures machine_isa() {
  IsaFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
  uint64_t xcr0 = 0;
  if ((c & (1u << 27)) != 0) {  // OSXSAVE: XGETBV is there
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool ymm = (xcr0 & 0x6) == 0x6;           // SSE and AVX state
  const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM0-15's upper halves, ZMM16-31
  const auto bit = [](unsigned reg, int n) { return (reg & (1u << n)) != 0; };
  f.fma = ymm && bit(c, 12);
  f.avx = ymm && bit(c, 28);
  f.f16c = ymm && bit(c, 29);
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned leaf7_subleaves = a;
  f.avx2 = ymm && bit(b, 5);
  f.bmi2 = bit(b, 8);
  f.avx512f = zmm && bit(b, 16);
  f.avx512dq = zmm && bit(b, 17);
  f.avx512cd = zmm && bit(b, 28);
  f.avx512bw = zmm && bit(b, 30);
  f.avx512vl = zmm && bit(b, 31);
  f.avx512vnni = zmm && bit(c, 11);
  f.avx512fp16 = zmm && bit(d, 23);
  if (leaf7_subleaves >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avxvnni = ymm && bit(a, 4);
    f.avx512bf16 = zmm && bit(a, 5);
  }
#endif
  return f;
}

int missing_isa(const IsaFeatures& required, const IsaFeatures& present, char* out, size_t size) {
  int missing = 0;
  size_t used = 0;
  if (size > 0) out[0] = '\0';
  const auto append = [&](const char* text) {
    const size_t n = std::strlen(text);
    if (size == 0 || used + n >= size) {
      used = size;  // cut: nothing more fits
      return;
    }
    std::memcpy(out + used, text, n + 1);
    used += n;
  };
#define BASALT_ISA_COMPARE(field, name) \
  if (required.field && !present.field) {  \
    if (missing++ > 0) append(", ");       \
    append(name);                          \
  }
  BASALT_ISA_FEATURES(BASALT_ISA_COMPARE)
#undef BASALT_ISA_COMPARE
  return missing;
}

}  // namespace basalt
