// libFuzzer target: arbitrary bytes as a replica's /metrics answer. The
// gateway reads what replicas send (router/prometheus_reader.h); the reader
// must return, with no crash and no sanitizer report, and what it returns
// must hold: every sample a valid metric name, every line either a sample,
// skipped or counted bad, never more samples than lines.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "router/prometheus_reader.h"

namespace {

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const basalt::router::PrometheusRead read = basalt::router::read_prometheus_text(text);
  size_t lines = 1;
  for (const char c : text) lines += c == '\n';
  if (read.samples.size() + read.bad_lines > lines) __builtin_trap();
  for (const basalt::router::PrometheusSample& s : read.samples) {
    if (!valid_name(s.name)) __builtin_trap();
    for (const auto& [label, value] : s.labels)
      if (!valid_name(label) || label.find(':') != std::string_view::npos) __builtin_trap();
  }
  if (basalt::router::read_prometheus_text(text, 1).samples.size() > 1) __builtin_trap();
  return 0;
}
