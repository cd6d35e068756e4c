// machine_isa and missing_isa (core/cpu_isa.h). Built for the x86-64
// baseline whatever the build's flags (core/CMakeLists.txt), and with C's
// string functions only, so it runs on the CPUs it has to turn away.
#include "core/cpu_isa.h"

#include <cstring>

namespace basalt {

IsaFeatures machine_isa() {
  IsaFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
#define BASALT_ISA_DETECT(field, name) f.field = __builtin_cpu_supports(name) != 0;
  BASALT_ISA_FEATURES(BASALT_ISA_DETECT)
#undef BASALT_ISA_DETECT
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
