// The integer-weight kernel built for one instruction set at a time: this
// file and int_linear.cc are compiled into one test per target (CMake gives
// each its flags: AVX2 without AVX-512 or VNNI, so the maddubs path runs;
// AVX2 with AVX-VNNI, the 256-bit dpbusd path; without AVX2, the scalar
// path; and the build's own flags, where AMX and the 512-bit path are
// compiled), whatever the machine's own -march. Each must give the bits of
// core/int_weights.h's definition, with the AMX kernel allowed and not, and
// with the rows interleaved and not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/int_linear.h"
#include "core/cpu_isa.h"
#include "core/dtype.h"

namespace basalt::cpu {
namespace {

struct Shape3 {
  int64_t tokens, outs, in, group;
};

// What this file was compiled for that the machine lacks ("" when none).
std::string missing_here() {
  IsaFeatures compiled;
#if defined(__AVX2__)
  compiled.avx2 = compiled.fma = true;
#endif
#if defined(__AVXVNNI__)
  compiled.avxvnni = true;
#endif
#if defined(__AVX512F__)
  compiled.avx512f = true;
#endif
#if defined(__AVX512VNNI__)
  compiled.avx512vnni = compiled.avx512bw = compiled.avx512dq = true;
#endif
  char names[256];
  return missing_isa(compiled, machine_isa(), names, sizeof names) == 0 ? "" : names;
}

TEST(IntLinearIsa, GivesTheDefinitionsBits) {
  if (const std::string missing = missing_here(); !missing.empty())
    GTEST_SKIP() << "this machine lacks " << missing;
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool pool(2);
  for (const bool amx : {true, false}) {
    linear_int_allow_amx(amx);
    for (int bits : {8, 4}) {
      // Partial row groups and token tiles, groups of one block and of the
      // whole row, more blocks than one pass over a group takes (2080 and
      // 4128 columns), 17 and 33 token rows for AMX's groups of 16.
      for (const Shape3 s : {Shape3{1, 33, 300, 64}, Shape3{7, 40, 256, 32}, Shape3{5, 17, 100, 100},
                             Shape3{9, 64, 1024, 128}, Shape3{3, 21, 160, 32}, Shape3{2, 50, 2080, 32},
                             Shape3{17, 24, 4128, 32}, Shape3{33, 16, 96, 96}, Shape3{4, 8, 32, 32}}) {
        const IntWeightLayout l{bits, s.group, s.in};
        std::vector<uint8_t> codes(static_cast<size_t>(s.outs * l.code_columns()));
        std::vector<uint16_t> scales(static_cast<size_t>(s.outs * l.scale_columns()));
        std::vector<float> row(static_cast<size_t>(s.in)), x(static_cast<size_t>(s.tokens * s.in)),
            bias(static_cast<size_t>(s.outs));
        for (int64_t n = 0; n < s.outs; ++n) {
          for (float& v : row) v = normal(rng) * 0.05f;
          quantize_int_row(l, row.data(), codes.data() + n * l.code_columns(), scales.data() + n * l.scale_columns());
        }
        for (float& v : x) v = normal(rng);
        for (float& v : bias) v = normal(rng);
        std::vector<float> out(static_cast<size_t>(s.tokens * s.outs));
        linear_int_f32(pool, x.data(), s.tokens, l, codes.data(), scales.data(), s.outs, bias.data(), out.data());
        // The same weights interleaved (whole groups of 8 rows, then the rest
        // row by row) must give the same bits.
        IntWeightLayout li = l;
        li.rows_interleaved = true;
        std::vector<uint8_t> interleaved(codes.size());
        std::vector<uint16_t> interleaved_scales(scales.size());
        interleave_int_weight(pool, l, s.outs, codes.data(), scales.data(), interleaved.data(),
                              interleaved_scales.data());
        std::vector<float> out_il(out.size());
        linear_int_f32(pool, x.data(), s.tokens, li, interleaved.data(), interleaved_scales.data(), s.outs,
                       bias.data(), out_il.data());
        int64_t differing_il = 0;
        for (size_t i = 0; i < out.size(); ++i) differing_il += std::memcmp(&out[i], &out_il[i], sizeof(float)) != 0;
        EXPECT_EQ(differing_il, 0) << "interleaved int" << bits << " tokens " << s.tokens << " outs " << s.outs
                                   << " in " << s.in;
        std::vector<int8_t> xc(static_cast<size_t>(l.blocks() * kIntBlock));
        std::vector<float> xs(static_cast<size_t>(l.blocks()));
        int64_t differing = 0;
        for (int64_t t = 0; t < s.tokens; ++t) {
          quantize_int_activations(x.data() + t * s.in, s.in, xc.data(), xs.data());
          for (int64_t n = 0; n < s.outs; ++n) {
            const float want = int_dot_reference(l, xc.data(), xs.data(), codes.data() + n * l.code_columns(),
                                                 scales.data() + n * l.scale_columns()) +
                               bias[n];
            differing += out[t * s.outs + n] != want;
          }
        }
        EXPECT_EQ(differing, 0) << "int" << bits << " tokens " << s.tokens << " outs " << s.outs << " in " << s.in
                                << " group " << s.group << (amx ? "" : ", AMX not allowed");
      }
    }
  }
  linear_int_allow_amx(true);
}

}  // namespace
}  // namespace basalt::cpu
