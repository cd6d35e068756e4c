// Turns a CPU away before any of the binary's own code runs on it: a build
// compiled for extensions this machine lacks (-march=native on a newer CPU,
// or BASALT_MARCH) would otherwise die of SIGILL at its first vector
// instruction, with nothing said. Built for the x86-64 baseline
// (app/CMakeLists.txt), and run as a constructor of priority 101, ahead of
// every default-priority static initializer.
#include <cstdio>
#include <cstdlib>

#include "core/cpu_isa.h"

namespace {

__attribute__((constructor(101))) void refuse_a_cpu_without_the_builds_extensions() {
  char names[256];
  if (basalt::missing_isa(basalt::kCompiledIsa, basalt::machine_isa(), names, sizeof names) == 0) return;
  std::fprintf(stderr,
               "basalt: this binary was compiled for CPU extensions this machine lacks: %s. Build it here "
               "(scripts/build.sh), or for older CPUs with -DBASALT_NATIVE=OFF -DBASALT_MARCH=x86-64-v3 "
               "(or x86-64-v2).\n",
               names);
  std::_Exit(1);
}

}  // namespace
