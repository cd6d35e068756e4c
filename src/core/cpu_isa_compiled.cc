// kCompiledIsa (core/cpu_isa.h): compiled with the build's own flags, so
// the compiler's macros say what the rest of the build may use.
#include "core/cpu_isa.h"

namespace basalt {
namespace {

constexpr IsaFeatures compiled_isa() {
  IsaFeatures f;
#if defined(__AVX__)
  f.avx = true;
#endif
#if defined(__AVX2__)
  f.avx2 = true;
#endif
#if defined(__FMA__)
  f.fma = true;
#endif
#if defined(__F16C__)
  f.f16c = true;
#endif
#if defined(__BMI2__)
  f.bmi2 = true;
#endif
#if defined(__AVX512F__)
  f.avx512f = true;
#endif
#if defined(__AVX512BW__)
  f.avx512bw = true;
#endif
#if defined(__AVX512DQ__)
  f.avx512dq = true;
#endif
#if defined(__AVX512VL__)
  f.avx512vl = true;
#endif
#if defined(__AVX512CD__)
  f.avx512cd = true;
#endif
#if defined(__AVX512VNNI__)
  f.avx512vnni = true;
#endif
#if defined(__AVX512BF16__)
  f.avx512bf16 = true;
#endif
#if defined(__AVX512FP16__)
  f.avx512fp16 = true;
#endif
#if defined(__AVXVNNI__)
  f.avxvnni = true;
#endif
  return f;
}

}  // namespace

constinit const IsaFeatures kCompiledIsa = compiled_isa();

}  // namespace basalt
