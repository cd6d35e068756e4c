#include "core/cpu_isa.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace basalt {
namespace {

std::string missing(const IsaFeatures& required, const IsaFeatures& present, int* count, size_t size = 256) {
  std::string out(size, '#');
  *count = missing_isa(required, present, out.data(), size);
  return out.substr(0, std::strlen(out.c_str()));
}

TEST(CpuIsa, NamesWhatIsRequiredAndNotPresent) {
  IsaFeatures required, present;
  int count = -1;
  EXPECT_EQ(missing(required, present, &count), "");
  EXPECT_EQ(count, 0);

  required.avx2 = required.fma = required.avx512bf16 = true;
  present.avx2 = true;
  present.avx512f = true;  // present but not required: not named
  EXPECT_EQ(missing(required, present, &count), "fma, avx512bf16");
  EXPECT_EQ(count, 2);

  present.fma = present.avx512bf16 = true;
  EXPECT_EQ(missing(required, present, &count), "");
  EXPECT_EQ(count, 0);
}

TEST(CpuIsa, CutsTheNamesToTheBufferAndStillCountsThem) {
  IsaFeatures required;
  required.avx = required.avx2 = required.avx512vnni = true;
  int count = -1;
  const std::string cut = missing(required, IsaFeatures{}, &count, 8);
  EXPECT_EQ(count, 3);
  EXPECT_LT(cut.size(), 8u);
  EXPECT_EQ(cut, std::string("avx, avx2").substr(0, cut.size()));
  char none[1] = {'#'};
  EXPECT_EQ(missing_isa(required, IsaFeatures{}, none, 0), 3);  // no room: nothing written
  EXPECT_EQ(none[0], '#');
}

// The machine that runs the tests is the one they were built for (or a
// newer one), so it has everything the build was compiled for; a detection
// that misnamed or missed an extension the compiler used fails here.
TEST(CpuIsa, ThisMachineHasWhatTheBuildWasCompiledFor) {
  int count = -1;
  EXPECT_EQ(missing(kCompiledIsa, machine_isa(), &count), "");
  EXPECT_EQ(count, 0);
#if defined(__AVX2__)
  EXPECT_TRUE(kCompiledIsa.avx2);
  EXPECT_TRUE(machine_isa().avx2);
#endif
}

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
// machine_isa reads CPUID itself; GCC's own detection must agree with it on
// every extension, so a wrong bit or register fails here on any machine.
TEST(CpuIsa, AgreesWithTheCompilersDetection) {
  const IsaFeatures f = machine_isa();
  __builtin_cpu_init();
#define BASALT_ISA_AGREES(field, name) EXPECT_EQ(f.field, __builtin_cpu_supports(name) != 0) << name;
  BASALT_ISA_FEATURES(BASALT_ISA_AGREES)
#undef BASALT_ISA_AGREES
}
#endif

}  // namespace
}  // namespace basalt
