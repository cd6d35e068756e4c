// The x86 instruction-set extensions a build's code was compiled for, the
// ones this machine's CPU has, and the difference, so that a binary built
// with -march=native or BASALT_MARCH and run on an older CPU says what it
// lacks instead of dying of SIGILL at its first vector instruction.
//
// Contract:
//  * kCompiledIsa holds the extensions the compiler was allowed to use in
//    this build (its __AVX2__-style macros); it is constant-initialized
//    data, readable before any code compiled for them runs.
//  * machine_isa() and missing_isa() are compiled for the x86-64 baseline
//    (core/CMakeLists.txt), use no inline C++ library code (whose one copy
//    in the binary may come from a file built for the newer CPU), and so
//    run on any x86-64 CPU.
//  * missing_isa writes the names of the extensions `required` has and
//    `present` lacks, comma-separated, NUL-terminated and cut to `size`
//    bytes, and returns how many there are (0: nothing is missing).
//  * On other architectures nothing is tracked: every field stays false.
#pragma once

#include <cstddef>

namespace basalt {

// X(field, name): name is what GCC's __builtin_cpu_supports and users call it.
#define BASALT_ISA_FEATURES(X)                                                                       \
  X(avx, "avx") X(avx2, "avx2") X(fma, "fma") X(f16c, "f16c") X(bmi2, "bmi2") X(avx512f, "avx512f") \
  X(avx512bw, "avx512bw") X(avx512dq, "avx512dq") X(avx512vl, "avx512vl") X(avx512cd, "avx512cd")   \
  X(avx512vnni, "avx512vnni") X(avx512bf16, "avx512bf16") X(avx512fp16, "avx512fp16") X(avxvnni, "avxvnni")

struct IsaFeatures {
#define BASALT_ISA_FIELD(field, name) bool field = false;
  BASALT_ISA_FEATURES(BASALT_ISA_FIELD)
#undef BASALT_ISA_FIELD
};

extern const IsaFeatures kCompiledIsa;

IsaFeatures machine_isa();

int missing_isa(const IsaFeatures& required, const IsaFeatures& present, char* out, size_t size);

}  // namespace basalt
