// The simulator's requests, made by the same code `basalt bench` sends
// (loadgen/workload.h for the conversations, loadgen/schedule.h for the
// arrivals), so a simulated run and a real one replay the same trace.
//
// Contract:
//  * requests_from(pool, arrivals, seed): request k arrives at arrivals[k]
//    and has the lengths of pool[k] while the trace is no longer than the
//    pool (the order `basalt bench` sends them in); a longer trace draws
//    each request's conversation uniformly from the pool (seeded), so it
//    reuses a few thousand generated conversations without repeating their
//    order in lockstep with a round-robin over replicas. Prompt = the
//    leading messages' tokens + the question's, output = max_tokens (what
//    `--ignore-eos` makes the server produce). Conversations with the same
//    leading text form one shared-prefix group (its tokens the prefix).
//    A multi-turn conversation, an empty pool with arrivals, or a
//    conversation without a turn is a basalt::Error.
//  * trace_arrivals(shape, count, duration_s): arrival_times of `count`
//    requests, or, with duration_s > 0 (count then ignored), the arrivals
//    of the shape's process up to duration_s.
#pragma once

#include <cstdint>
#include <vector>

#include "loadgen/schedule.h"
#include "loadgen/workload.h"
#include "sim/fleet.h"

namespace basalt::sim {

std::vector<SimRequest> requests_from(const std::vector<loadgen::Conversation>& pool,
                                      const std::vector<double>& arrivals, uint64_t seed);

std::vector<double> trace_arrivals(const loadgen::LoadShape& shape, int64_t count, double duration_s);

}  // namespace basalt::sim
