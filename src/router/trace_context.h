// W3C Trace Context (https://www.w3.org/TR/trace-context/) at the gateway:
// every forwarded request belongs to a trace, and each attempt on a replica
// is a span of its own under it.
//
// Contract:
//  * trace_of() reads the client's `traceparent`: version 00 exactly as the
//    recommendation writes it (55 characters, lower-case hex, neither id all
//    zeros), or a later version by its first four fields (version ff is
//    invalid). A valid one gives the trace its id and flags, and the
//    client's `tracestate` (at most 512 bytes) is kept as it came; an absent
//    or invalid one starts a new trace (random id, flags 00: the gateway
//    samples nothing) and its tracestate is dropped, as the recommendation
//    asks of a traceparent that cannot be parsed.
//  * attempt_traceparent() is the header one upstream attempt carries: the
//    trace's id and flags under a new random, non-zero parent-id.
//  * Pure apart from the random ids; safe from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace basalt::router {

struct TraceContext {
  std::string trace_id;    // 32 lower-case hex digits
  std::string flags;       // 2 hex digits
  std::string tracestate;  // empty: none
  bool from_client = false;
};

bool valid_traceparent(std::string_view traceparent);
TraceContext trace_of(std::optional<std::string_view> traceparent,
                      std::optional<std::string_view> tracestate);
std::string attempt_traceparent(const TraceContext& trace);

}  // namespace basalt::router
