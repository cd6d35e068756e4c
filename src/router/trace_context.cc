#include "router/trace_context.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

namespace basalt::router {
namespace {

bool lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool all_zeros(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == '0'; });
}

// `digits` random lower-case hex digits, not all zeros.
std::string random_hex(size_t digits) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  while (out.empty() || all_zeros(out)) {
    out.clear();
    while (out.size() < digits) out += fmt::format("{:016x}", rng());
    out.resize(digits);
  }
  return out;
}

}  // namespace

bool valid_traceparent(std::string_view t) {
  // version "-" trace-id "-" parent-id "-" flags
  if (t.size() < 55 || t[2] != '-' || t[35] != '-' || t[52] != '-') return false;
  const std::string_view version = t.substr(0, 2), trace_id = t.substr(3, 32),
                         parent_id = t.substr(36, 16), flags = t.substr(53, 2);
  if (!lower_hex(version) || version == "ff" || !lower_hex(trace_id) || !lower_hex(parent_id) ||
      !lower_hex(flags) || all_zeros(trace_id) || all_zeros(parent_id))
    return false;
  // Version 00 has nothing after the flags; a later one may, after a '-'.
  if (version == "00") return t.size() == 55;
  return t.size() == 55 || t[55] == '-';
}

TraceContext trace_of(std::optional<std::string_view> traceparent,
                      std::optional<std::string_view> tracestate) {
  TraceContext trace;
  if (traceparent && valid_traceparent(*traceparent)) {
    trace.trace_id = std::string(traceparent->substr(3, 32));
    trace.flags = std::string(traceparent->substr(53, 2));
    trace.from_client = true;
    if (tracestate && tracestate->size() <= 512) trace.tracestate = std::string(*tracestate);
    return trace;
  }
  trace.trace_id = random_hex(32);
  trace.flags = "00";
  return trace;
}

std::string attempt_traceparent(const TraceContext& trace) {
  return "00-" + trace.trace_id + "-" + random_hex(16) + "-" + trace.flags;
}

}  // namespace basalt::router
