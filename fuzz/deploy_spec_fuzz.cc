// libFuzzer target: arbitrary bytes as a deployment spec (basalt.yaml). The
// operator's file goes through deploy/spec.h before anything is rendered; the
// parser must return with no crash and no sanitizer report, and what it
// returns must hold: a spec without errors has its required fields and
// replicas.min <= replicas.max, and every error has a message.
#include <cstddef>
#include <cstdint>
#include <string>

#include "deploy/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const basalt::deploy::SpecResult r = basalt::deploy::parse_deployment_spec(text);
  for (const basalt::deploy::SpecError& e : r.errors)
    if (e.message.empty() || e.line < 0) __builtin_trap();
  if (r.errors.empty()) {
    const basalt::deploy::DeploymentSpec& s = r.spec;
    if (s.name.empty() || s.image.empty() || s.model.path.empty() || s.model.path[0] != '/') __builtin_trap();
    if (s.replicas.min > s.replicas.max || s.replicas.max < 1) __builtin_trap();
    if (!(s.autoscaling.target > 0)) __builtin_trap();
  }
  return 0;
}
